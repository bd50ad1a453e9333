//! Criterion's profiler hook: `cargo bench --bench NAME -- --profile-time 10`
//! writes `target/criterion/<bench>/profile/flamegraph.svg` per benchmark.
//! (pprof's own criterion integration targets an older criterion.)

use criterion::profiler::Profiler;
use criterion::Criterion;
use std::path::Path;

pub struct Flamegraph {
    frequency: i32,
    active: Option<pprof::ProfilerGuard<'static>>,
}

impl Profiler for Flamegraph {
    fn start_profiling(&mut self, _benchmark_id: &str, _benchmark_dir: &Path) {
        self.active = pprof::ProfilerGuard::new(self.frequency).ok();
    }

    fn stop_profiling(&mut self, benchmark_id: &str, benchmark_dir: &Path) {
        let Some(guard) = self.active.take() else {
            return;
        };
        let written = std::fs::create_dir_all(benchmark_dir)
            .map_err(|e| e.to_string())
            .and_then(|()| guard.report().build().map_err(|e| e.to_string()))
            .and_then(|report| {
                let file = std::fs::File::create(benchmark_dir.join("flamegraph.svg"))
                    .map_err(|e| e.to_string())?;
                report.flamegraph(file).map_err(|e| e.to_string())
            });
        if let Err(err) = written {
            eprintln!("flamegraph for {benchmark_id}: {err}");
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
