//! `promlab flamegraph`: where one scenario's time goes under one strategy set.
//!
//! The scenario's workload is built and warmed first, so the profile shows the
//! steady state the ablation times (`Workload::run`), not setup. Sampling is
//! pprof's `SIGPROF` timer (CPU time of the process), which works where perf's
//! hardware counters are unavailable, e.g. in this VM.

use anyhow::{bail, Context, Result};
use promlab::strategy::StrategySet;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Samples per second: a prime, so sampling does not lock step with a periodic loop.
const FREQUENCY_HZ: i32 = 997;

/// `promlab flamegraph`: profile a scenario's runs and write an SVG flamegraph.
#[derive(clap::Args, Debug)]
pub struct FlamegraphArgs {
    /// A built-in scenario name or a scenario .toml path.
    pub scenario: String,
    /// Strategies to run: a comma-separated list, `none`, `all`, or `default`.
    #[arg(long, default_value = "default")]
    pub strategies: StrategySet,
    /// The scenario's quick size (default: its full size).
    #[arg(long)]
    pub quick: bool,
    /// How long to keep running the workload under the profiler.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Where the SVG goes.
    #[arg(long)]
    pub out: PathBuf,
}

pub fn flamegraph(args: FlamegraphArgs) -> Result<()> {
    if !(args.seconds.is_finite() && args.seconds > 0.0 && args.seconds <= 86_400.0) {
        bail!(
            "--seconds must be a positive number of seconds (at most a day), not {}",
            args.seconds
        );
    }
    let duration = Duration::from_secs_f64(args.seconds);
    let scenario = crate::harness::load_scenario(&args.scenario)?;
    let stage = scenario.stage();
    // Only the scenario's own stage has strategies that change its runs.
    let strategies = args.strategies.restrict(stage);
    if strategies.is_empty() && !args.strategies.is_empty() {
        eprintln!(
            "note: none of `{}` belongs to the {stage} stage of {}; profiling the baseline",
            args.strategies, scenario.name
        );
    }
    // Open the output before the long part, so a bad path fails at once; a
    // failure after that removes it rather than leave an empty file behind.
    let mut file = std::fs::File::create(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let profiled = profile(&scenario, &args, strategies, duration).and_then(|(svg, summary)| {
        file.write_all(&svg)
            .and_then(|()| file.flush())
            .with_context(|| format!("cannot write {}", args.out.display()))?;
        Ok(summary)
    });
    match profiled {
        Ok(summary) => {
            println!("{}: {summary}", args.out.display());
            Ok(())
        }
        Err(err) => {
            drop(file);
            let _ = std::fs::remove_file(&args.out);
            Err(err)
        }
    }
}

/// Builds, warms and profiles the workload; returns the SVG and a one-line summary.
fn profile(
    scenario: &crate::harness::Scenario,
    args: &FlamegraphArgs,
    strategies: StrategySet,
    duration: Duration,
) -> Result<(Vec<u8>, String)> {
    let stage = scenario.stage();
    let size = scenario.size(args.quick);
    let mut workload = crate::harness::workloads::build(&size.params)
        .with_context(|| format!("cannot build scenario {}", scenario.name))?;
    workload.run(strategies)?;

    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY_HZ)
        // Unwinding through these from a signal handler can deadlock (pprof's advice).
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
        .context("cannot start the profiler")?;
    let start = Instant::now();
    let mut runs = 0u64;
    while runs == 0 || start.elapsed() < duration {
        workload.run(strategies)?;
        runs += 1;
    }
    let elapsed = start.elapsed();
    let report = guard
        .report()
        .build()
        .context("cannot build the profile report")?;
    drop(guard);
    if report.data.is_empty() {
        bail!(
            "the profiler took no samples in {:.2} s ({runs} runs); try a longer --seconds",
            elapsed.as_secs_f64()
        );
    }

    let mut options = pprof::flamegraph::Options::default();
    options.title = format!(
        "promlab {} ({}, {}), strategies: {}",
        scenario.name,
        stage,
        if args.quick { "quick" } else { "full" },
        strategies
    );
    // Rendered in memory first: a half-written SVG is worse than none.
    let mut svg = Vec::new();
    report
        .flamegraph_with_options(&mut svg, &mut options)
        .context("cannot render the flamegraph")?;
    let samples: isize = report.data.values().sum();
    let summary = format!(
        "{runs} runs of {} in {:.2} s, {samples} samples: {:.0} Hz measured ({FREQUENCY_HZ} Hz asked; \
         the kernel's timer may deliver fewer)",
        scenario.name,
        elapsed.as_secs_f64(),
        samples as f64 / elapsed.as_secs_f64().max(1e-9)
    );
    Ok((svg, summary))
}
