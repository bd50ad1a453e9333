//! Criterion's profiler hook: `cargo bench --bench NAME -- --profile-time 10`
//! writes `target/criterion/<group>/<arm>/profile/flamegraph.svg` and the
//! folded stacks beside it (`flamegraph.folded`) per benchmark, with the
//! sampler of `promlab flamegraph` (`promlab_lab::profile`): perf's
//! `cpu-clock` at the asked rate where the kernel allows it, pprof's timer
//! otherwise. Stacks start at the workload's run where they pass through it.

use criterion::profiler::Profiler;
use criterion::Criterion;
use promlab_lab::profile::{self, draw, SamplerChoice};
use std::path::Path;

pub struct Flamegraph {
    frequency: u32,
    active: Option<profile::Profiler>,
}

impl Profiler for Flamegraph {
    fn start_profiling(&mut self, benchmark_id: &str, _benchmark_dir: &Path) {
        let started = profile::choose(SamplerChoice::Auto, self.frequency)
            .and_then(|sampler| {
                eprintln!("profiling {benchmark_id}: {}", sampler.describe());
                profile::Profiler::start(sampler, 1)
            })
            .and_then(|mut profiler| profiler.begin(0).map(|()| profiler));
        match started {
            Ok(profiler) => self.active = Some(profiler),
            Err(err) => eprintln!("flamegraph for {benchmark_id}: {err:#}"),
        }
    }

    fn stop_profiling(&mut self, benchmark_id: &str, benchmark_dir: &Path) {
        let Some(profiler) = self.active.take() else {
            return;
        };
        let written = profiler.finish().and_then(|profiles| {
            let arm = &profiles.arms[0];
            let (folded, _) = arm.folded.rooted_at(profile::RUN_FRAME);
            eprintln!(
                "{benchmark_id}: {} samples in {:.2} s of CPU ({:.0} Hz of {} asked, {})",
                arm.samples(),
                arm.cpu.as_secs_f64(),
                arm.rate_hz(),
                profiles.sampler.frequency_hz,
                profiles.sampler.kind.name()
            );
            for warning in &profiles.warnings {
                eprintln!("  warning: {warning}");
            }
            let title = format!("{benchmark_id} ({})", profiles.sampler.kind.name());
            let svg = draw::svg(
                &folded,
                &draw::Style {
                    title: &title,
                    subtitle: "",
                    min_width_px: draw::MIN_WIDTH_PX,
                },
            )?;
            std::fs::create_dir_all(benchmark_dir)?;
            std::fs::write(benchmark_dir.join("flamegraph.svg"), svg)?;
            std::fs::write(benchmark_dir.join("flamegraph.folded"), folded.to_text())?;
            Ok(())
        });
        if let Err(err) = written {
            eprintln!("flamegraph for {benchmark_id}: {err:#}");
        }
    }
}

/// Criterion with the flamegraph profiler (active only under `--profile-time`).
pub fn criterion() -> Criterion {
    Criterion::default().with_profiler(Flamegraph {
        frequency: 997,
        active: None,
    })
}
