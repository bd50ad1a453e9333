//! How arms are timed: interleaved rounds of samples, every run checked.

use super::{
    digest, first_difference, report, run_arm, ArmKind, Input, Output, StrategySet, Workload,
};
use anyhow::{bail, Result};
use std::time::{Duration, Instant};

/// Checks what one run of the arm `name` returned: bytes (or a store's
/// exposition) must be the verified answer, a floor's units the workload's.
/// A store written is compared after the rounds.
fn check_output(
    scenario: &str,
    round: usize,
    name: &str,
    verified: &[u8],
    units: u64,
    output: &Output<'_>,
) -> Result<()> {
    match output {
        Output::Bytes(bytes) if *bytes != verified => bail!(
            "scenario {scenario}: run {round} of `{name}` differs from its verified output {}",
            first_difference(verified, bytes, "verified", name)
        ),
        Output::Units(n) if *n != units => bail!(
            "scenario {scenario}: run {round} of `{name}` handled {n} units, not the workload's {units}"
        ),
        Output::StoreRead(..) => {
            let bytes = output.bytes()?;
            if *bytes != *verified {
                bail!(
                    "scenario {scenario}: run {round} of `{name}` left a store whose exposition differs from the verified output {}",
                    first_difference(verified, &bytes, "verified", name)
                );
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Timings of one arm.
#[derive(Clone, Debug)]
pub struct ArmResult {
    pub arm: String,
    pub strategies: StrategySet,
    pub kind: ArmKind,
    /// The floor arm this arm is held to ([`Workload::floor_of`]; a floor's own name).
    pub floor: String,
    /// What it reads ([`Workload::input_of`]).
    pub input: Input,
    /// How much one run does ([`Workload::units_of`]).
    pub units: (u64, &'static str),
    /// Wall time of one run, per sample ([`measure`]: a sample's runs' sum
    /// over their count).
    pub samples: Vec<Duration>,
    /// CPU time of this process (every thread) of one run, per sample (an
    /// upkeep arm's set-up left out).
    pub cpu: Vec<Duration>,
    /// How many back-to-back runs each sample timed ([`MIN_SAMPLE`]).
    pub runs_per_sample: u32,
    /// Whether the arm's runs write a store (then it runs once per sample).
    pub writes_store: bool,
    /// The fastest of its warm-up runs (see [`warmed_up`]).
    pub typical: Duration,
    /// `--peak-rss`: the run's own peak resident memory, in bytes (`harness::rss`).
    pub peak_rss_bytes: Option<u64>,
}

impl ArmResult {
    /// Whether each sample follows an untimed run ([`WARM_RUN_BELOW`]):
    /// known once its warm-up ([`measure`]'s round 0) has run.
    pub fn warm_run(&self) -> bool {
        !self.writes_store && self.typical < WARM_RUN_BELOW
    }

    pub fn quantile(&self, q: f64) -> Duration {
        quantile(&self.samples, q)
    }

    pub fn median(&self) -> Duration {
        self.quantile(0.5)
    }

    /// The median CPU time of a run.
    pub fn cpu_median(&self) -> Duration {
        quantile(&self.cpu, 0.5)
    }
}

/// The `q` quantile of `samples` (nearest rank); zero when there are none.
pub fn quantile(samples: &[Duration], q: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    match sorted.len() {
        0 => Duration::ZERO,
        n => sorted[((n - 1) as f64 * q).round() as usize],
    }
}

/// This process's CPU time so far, every thread (`CLOCK_PROCESS_CPUTIME_ID`).
pub fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Seeds [`measure`]'s round orders: the same orders in every run.
const ROUND_ORDER_SEED: u64 = 0x5eed_0fa7;

/// The least wall time of one [`measure`] sample: 5 ms, thousands of times
/// the clock's cost, and long enough that an arm and its floor of about a
/// millisecond each run several times a sample, not one and two.
pub const MIN_SAMPLE: Duration = Duration::from_millis(5);

/// At most this many runs make one sample (a run of under 5 µs).
const MAX_RUNS_PER_SAMPLE: u32 = 1000;

/// An arm whose runs take less than this has one untimed run before each
/// sample: the first run after another arm's starts cold, and for a run of a
/// few hundred microseconds that cold start is a third of it or more, so
/// samples of different run counts (an arm and its floor, sized apart) would
/// hold different shares of it. Longer runs are timed from cold: there the
/// refill is a few percent, and a second run would double the rounds' time.
pub const WARM_RUN_BELOW: Duration = Duration::from_millis(10);

/// Whether an arm's warm-up (round 0, untimed) has run enough to size its
/// samples: one run of a store writer (every arm writes as often) or of an
/// arm that took ten [`MIN_SAMPLE`]s or more; else runs until two have
/// passed, at least three runs, whose fastest sizes the samples. The fastest,
/// because the first run after another arm's is cold and on a shared host
/// one run in a few is slow: sized from a slow one (even the median of
/// three), an arm runs fewer, colder runs a sample than its floor beside it.
fn warmed_up(runs: &[Duration], writes_store: bool) -> bool {
    let elapsed: Duration = runs.iter().sum();
    writes_store
        || runs
            .iter()
            .min()
            .is_some_and(|&fastest| fastest >= 10 * MIN_SAMPLE)
        || (runs.len() >= 3 && elapsed >= 2 * MIN_SAMPLE)
        || runs.len() >= MAX_RUNS_PER_SAMPLE as usize
}

/// How many back-to-back runs make a sample of an arm whose warm-up runs
/// took `typical` at their fastest: enough for [`MIN_SAMPLE`]; one for an arm that
/// writes a store.
fn runs_per_sample(typical: Duration, writes_store: bool) -> u32 {
    if writes_store || typical >= MIN_SAMPLE {
        return 1;
    }
    let per_run = typical.as_nanos().max(1);
    (MIN_SAMPLE.as_nanos().div_ceil(per_run) as u32).clamp(1, MAX_RUNS_PER_SAMPLE)
}

/// A floor and the arms within 2× of it run as many runs a sample, the most
/// any of them needs: on a memory-bound scrape a sample's later runs are
/// faster than its first, so an arm and its floor timed with different run
/// counts differ by that alone. Arms further from their floor keep their own
/// count (raised to a microsecond floor's, a slow arm's rounds would take
/// minutes), as do arms timed from cold (10 ms or more a run).
fn share_runs_per_sample(results: &mut [ArmResult]) {
    let near = |arm: &ArmResult, floor: &ArmResult| {
        arm.warm_run() && floor.warm_run() && arm.typical < 2 * floor.typical
    };
    let shared: Vec<u32> = results
        .iter()
        .map(|arm| {
            let Some(floor) = results.iter().find(|f| f.arm == arm.floor) else {
                return arm.runs_per_sample;
            };
            if !near(arm, floor) {
                return arm.runs_per_sample;
            }
            results
                .iter()
                .filter(|other| other.floor == floor.arm && near(other, floor))
                .map(|other| other.runs_per_sample)
                .max()
                .unwrap_or(arm.runs_per_sample)
        })
        .collect();
    for (arm, runs) in results.iter_mut().zip(shared) {
        arm.runs_per_sample = runs;
    }
}

/// Measures `arms` of `workload`: one untimed warm-up round, then `repeats`
/// rounds, each running every arm once in an order of its own (shuffled, from
/// a fixed seed), so drift on a shared machine hits every arm alike and no arm
/// always runs after the same one (after an arm that sweeps the caches, an
/// arm would run cold every round). What every run returned is checked:
/// bytes (or a store's exposition) against `verified`, a floor's units
/// against the workload's; stores written are compared after the last round.
///
/// A sample is [`MIN_SAMPLE`] or more of one arm's back-to-back runs (the
/// count sized by its warm-up runs, [`warmed_up`]), each timed on its own: a
/// single run of a few microseconds measures mostly how much of its working
/// set the arm before evicted. The sample is their sum over their count. An
/// arm of under [`WARM_RUN_BELOW`] a run has an untimed run before each
/// sample. An arm that writes a store runs once per sample, with none before:
/// its store's state grows with every run, and every arm must run as often.
/// An upkeep arm's set-up runs before each of its runs, outside the wall
/// clock's window, and its CPU time is left out of the arm's.
pub fn measure(
    label: &str,
    workload: &mut dyn Workload,
    arms: &[(String, StrategySet, ArmKind)],
    repeats: usize,
    verified: &[u8],
    progress: bool,
) -> Result<Vec<ArmResult>> {
    let mut results: Vec<ArmResult> = arms
        .iter()
        .map(|(arm, s, kind)| ArmResult {
            arm: arm.clone(),
            strategies: *s,
            kind: *kind,
            floor: match kind {
                ArmKind::Floor => arm.clone(),
                _ => workload.floor_of(arm, *s).to_string(),
            },
            input: workload.input_of(arm, *s),
            units: workload.units_of(arm),
            samples: Vec::new(),
            cpu: Vec::new(),
            runs_per_sample: 1,
            writes_store: false,
            typical: Duration::ZERO,
            peak_rss_bytes: None,
        })
        .collect();
    keep_freed_memory();
    let progress = report::Progress::new(progress, label, (repeats * arms.len()) as u64, "measure");
    let units = workload.units().0;
    // Digests of the last round's stores: every arm has run as often by then.
    let mut last_stores: Vec<Option<String>> = vec![None; arms.len()];
    let mut rng = fastrand::Rng::with_seed(ROUND_ORDER_SEED);
    let mut order: Vec<usize> = (0..arms.len()).collect();
    for round in 0..=repeats {
        rng.shuffle(&mut order);
        for &i in &order {
            let (name, set, kind) = &arms[i];
            let sampled = round > 0;
            let upkeep = *kind == ArmKind::Upkeep;
            if sampled && results[i].warm_run() {
                if upkeep {
                    workload.set_up(name)?;
                }
                let output = run_arm(workload, *kind, name, *set)?;
                check_output(label, round, name, verified, units, &output)?;
            }
            let mut runs = 0;
            let mut elapsed = Duration::ZERO;
            let mut warm_up = Vec::new();
            // The CPU clock is a syscall (microseconds on a cold cache here):
            // read outside the wall-clock windows, which hold the arm alone.
            let start_cpu = process_cpu();
            let mut set_up_cpu = Duration::ZERO;
            loop {
                if upkeep {
                    let before = process_cpu();
                    workload.set_up(name)?;
                    set_up_cpu += process_cpu() - before;
                }
                let start = Instant::now();
                let output = run_arm(workload, *kind, name, *set)?;
                let run = start.elapsed();
                (elapsed, runs) = (elapsed + run, runs + 1);
                check_output(label, round, name, verified, units, &output)?;
                if let store @ Output::Store(_) = output {
                    if round == repeats {
                        last_stores[i] = Some(digest(&store.bytes()?));
                    }
                    results[i].writes_store = true;
                }
                let done = if sampled {
                    runs == results[i].runs_per_sample
                } else {
                    warm_up.push(run);
                    warmed_up(&warm_up, results[i].writes_store)
                };
                if done {
                    break;
                }
            }
            let cpu = process_cpu() - start_cpu - set_up_cpu;
            if sampled {
                results[i].samples.push(elapsed / runs);
                results[i].cpu.push(cpu / runs);
                progress.inc();
            } else {
                let typical = *warm_up.iter().min().expect("a warm-up runs once or more");
                results[i].typical = typical;
                results[i].runs_per_sample = runs_per_sample(typical, results[i].writes_store);
            }
        }
        if round == 0 {
            share_runs_per_sample(&mut results);
        }
    }
    if let Some((i, _)) = last_stores
        .iter()
        .enumerate()
        .find(|(_, d)| d.is_some() && **d != last_stores[0])
    {
        bail!(
            "scenario {label}: after {} runs each, `{}` left a store different from the baseline's",
            repeats + 2,
            arms[i].1
        );
    }
    progress.finish();
    Ok(results)
}

/// Keeps the memory an arm frees in this process for the next run (glibc:
/// no trimming of the heap's top, blocks under 32 MiB from the heap), for
/// every arm alike. A run that builds its state afresh (the ingest
/// workload's new ingester) otherwise meets the kernel's zeroed pages again
/// whenever glibc has handed its last run's memory back, and which arm pays
/// those page faults is the allocator's accident. A long-lived receiver
/// keeps its memory; what is timed is the work, not glibc's trimming
/// thresholds. Peak RSS is measured in child processes of their own
/// (`harness::rss`), without this.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: `mallopt` only sets the allocator's thresholds; it is
            // called once, before the timed runs, with documented parameters.
            // (The largest threshold glibc takes for M_MMAP_THRESHOLD on
            // 64-bit is 32 MiB; a trim threshold this large never trims.)
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An arm near its floor runs as many runs a sample as the floor (the
    /// most either needs); an arm far from it, or timed from cold, keeps its own.
    #[test]
    fn an_arm_near_its_floor_shares_its_runs_per_sample() {
        let arm = |name: &str, floor: &str, micros: u64, runs: u32| ArmResult {
            arm: name.to_string(),
            strategies: StrategySet::NONE,
            kind: ArmKind::Strategies,
            floor: floor.to_string(),
            input: Input::One,
            units: (1, "lines"),
            samples: Vec::new(),
            cpu: Vec::new(),
            runs_per_sample: runs,
            writes_store: false,
            typical: Duration::from_micros(micros),
            peak_rss_bytes: None,
        };
        let mut results = vec![
            arm("all", "floor", 1_700, 3),
            arm("baseline", "floor", 300_000, 1),
            arm("slow", "floor", 4_000, 2),
            arm("floor", "floor", 1_900, 1),
            arm("other", "other-floor", 10, 500),
        ];
        share_runs_per_sample(&mut results);
        let runs: Vec<u32> = results.iter().map(|r| r.runs_per_sample).collect();
        assert_eq!(runs, [3, 1, 2, 3, 500]);
    }
}
