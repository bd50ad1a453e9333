//! The research harness: scenarios as data, verified before they are timed.
//!
//! A scenario (`experiments/scenarios/*.toml`) names its stage, its generator
//! and the generator's parameters at two sizes (`quick` for CI and the default
//! run, `full` for the real figures), each with the SHA-256 of the output every
//! strategy combination must produce — the way rebar's definitions carry their
//! expected answer. [`ablate`] then
//! 1. **verifies** every combination of the stage's strategies against that
//!    digest, stopping with the combination and the first differing line;
//! 2. **measures** the arms — baseline, each strategy alone, all but one, all —
//!    interleaved round by round (A B C … A B C …) so drift hits every arm
//!    alike, and reports medians, spread and the speed-up over the baseline;
//! 3. **reports** a terminal table and a CSV per scenario plus `machine.txt`.

pub mod dossier;
pub mod peers;
pub mod report;
pub mod workloads;

use anyhow::{bail, Context, Result};
use promlab::strategy::{Stage, Strategy, StrategySet};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One workload, as a scenario file describes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub stage: String,
    pub description: String,
    /// Which generator builds the workload (see [`workloads::build`]).
    pub generator: String,
    pub quick: Size,
    pub full: Size,
}

/// The generator's parameters at one size, and the answer to expect.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Size {
    /// Generator parameters (numbers and strings).
    #[serde(default)]
    pub params: toml::Table,
    /// How many timed rounds (each runs every arm once).
    pub repeats: usize,
    /// SHA-256 (hex) of the output every strategy combination must produce.
    pub expected: String,
}

impl Scenario {
    pub fn stage(&self) -> Result<Stage> {
        self.stage.parse().map_err(anyhow::Error::msg)
    }

    pub fn size(&self, quick: bool) -> &Size {
        if quick {
            &self.quick
        } else {
            &self.full
        }
    }
}

/// The scenarios that ship with promlab (`experiments/scenarios/`), in run order.
pub const BUILT_IN: [(&str, &str); 7] = [
    (
        "write-long-label",
        include_str!("../../../scenarios/write-long-label.toml"),
    ),
    (
        "seed-repro",
        include_str!("../../../scenarios/seed-repro.toml"),
    ),
    ("large", include_str!("../../../scenarios/large.toml")),
    (
        "large-ruby",
        include_str!("../../../scenarios/large-ruby.toml"),
    ),
    (
        "rabbitmq-per-object",
        include_str!("../../../scenarios/rabbitmq-per-object.toml"),
    ),
    ("asap-1e5", include_str!("../../../scenarios/asap-1e5.toml")),
    (
        "prometheus-captures",
        include_str!("../../../scenarios/prometheus-captures.toml"),
    ),
];

/// A built-in scenario by name, or a scenario file by path.
pub fn load_scenario(name_or_path: &str) -> Result<Scenario> {
    let text = match BUILT_IN.iter().find(|(name, _)| *name == name_or_path) {
        Some((_, text)) => text.to_string(),
        None if Path::new(name_or_path).exists() => std::fs::read_to_string(name_or_path)?,
        None => {
            let names: Vec<&str> = BUILT_IN.iter().map(|(n, _)| *n).collect();
            bail!(
                "unknown scenario `{name_or_path}` (built in: {}; or a path to a .toml file)",
                names.join(", ")
            )
        }
    };
    toml::from_str(&text).with_context(|| format!("scenario {name_or_path} does not parse"))
}

/// A workload ready to run: built once, run many times.
pub trait Workload {
    /// The bytes every strategy combination must agree on (exposition, store
    /// bytes with timestamps zeroed, or quantile JSON).
    fn output(&mut self, strategies: StrategySet) -> Result<Vec<u8>>;
    /// One timed run.
    fn run(&mut self, strategies: StrategySet) -> Result<()>;
    /// How much one run does, and of what (`lines`, `samples`, `ops`).
    fn units(&self) -> (u64, &'static str);
}

pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// The arms of an ablation over a stage's strategies (restricted to `only`
/// when given): baseline, each alone, all but one, all — without repeats.
pub fn arms(stage: Stage, only: Option<StrategySet>) -> Vec<(String, StrategySet)> {
    let strategies: Vec<Strategy> = stage
        .strategies()
        .filter(|s| only.is_none_or(|set| set.contains(*s)))
        .collect();
    let all: StrategySet = strategies.iter().copied().collect();
    let mut arms = vec![("baseline".to_string(), StrategySet::NONE)];
    for s in &strategies {
        arms.push((s.name().to_string(), StrategySet::NONE.with(*s)));
    }
    if strategies.len() > 2 {
        for s in &strategies {
            arms.push((format!("all-{}", s.name()), all.without(*s)));
        }
    }
    if strategies.len() > 1 {
        arms.push(("all".to_string(), all));
    }
    arms
}

/// The arms a criterion bench shows side by side: the baseline, each of the
/// stage's strategies alone, and the configured set — the build's features
/// (`cargo bench --features decode-once,single-read`), or all of the stage's
/// strategies when no feature is on.
pub fn bench_arms(stage: Stage) -> Vec<(String, StrategySet)> {
    let mut arms = vec![("baseline".to_string(), StrategySet::NONE)];
    for s in stage.strategies() {
        arms.push((s.name().to_string(), StrategySet::NONE.with(s)));
    }
    let configured = StrategySet::compiled_default().restrict(stage);
    let (name, set) = if configured.is_empty() {
        ("all".to_string(), StrategySet::all().restrict(stage))
    } else {
        (format!("configured({configured})"), configured)
    };
    if !arms.iter().any(|(_, s)| *s == set) {
        arms.push((name, set));
    }
    arms
}

pub use promlab::compare::first_difference;

/// A combination's output did not match.
fn mismatch_report(
    scenario: &str,
    strategies: StrategySet,
    got: &[u8],
    baseline: Option<&[u8]>,
    expected: &str,
) -> String {
    let mut report = format!(
        "scenario {scenario}: strategies `{strategies}` produced digest {} but {expected} was expected",
        digest(got)
    );
    if let Some(base) = baseline {
        if base != got {
            report.push_str("\nfirst difference from the baseline ");
            report.push_str(&first_difference(
                base,
                got,
                "baseline",
                &strategies.to_string(),
            ));
        } else {
            report.push_str("\n(the baseline produces the same bytes: the expected digest is stale or the generator changed)");
        }
    }
    report
}

/// Options of one ablation run.
#[derive(Clone, Debug)]
pub struct AblateOptions {
    pub quick: bool,
    /// Restrict the arms to these strategies (per stage).
    pub only: Option<StrategySet>,
    pub out: Option<PathBuf>,
    /// Override the scenario's number of rounds.
    pub repeats: Option<usize>,
    /// Print the digests instead of checking them (to bless a changed generator).
    pub print_digests: bool,
    pub progress: bool,
    /// Run the peer arms after ours (`--peers`).
    pub peers: bool,
    /// Include the optional embedded-ClickHouse peer (`--with-clickhouse`).
    pub with_clickhouse: bool,
}

/// Timings of one arm.
#[derive(Clone, Debug)]
pub struct ArmResult {
    pub arm: String,
    pub strategies: StrategySet,
    pub samples: Vec<Duration>,
}

impl ArmResult {
    pub fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.samples.clone();
        sorted.sort();
        let index = ((sorted.len() - 1) as f64 * q).round() as usize;
        sorted[index]
    }

    pub fn median(&self) -> Duration {
        self.quantile(0.5)
    }
}

/// The outcome of one scenario.
#[derive(Clone, Debug)]
pub struct ScenarioResult {
    pub scenario: String,
    pub stage: Stage,
    pub size: &'static str,
    pub units: (u64, &'static str),
    pub digest: String,
    pub combinations_verified: usize,
    pub arms: Vec<ArmResult>,
    /// Peer arms (`--peers`), measured after ours.
    pub peers: Vec<peers::PeerResult>,
    /// Peers that had an arm here but did not run, with the reason.
    pub peers_skipped: Vec<String>,
}

/// Verifies, then measures, one scenario.
pub fn run_scenario(scenario: &Scenario, options: &AblateOptions) -> Result<ScenarioResult> {
    let stage = scenario.stage()?;
    let size = scenario.size(options.quick);
    let mut workload = workloads::build(scenario, size, stage)
        .with_context(|| format!("cannot build scenario {}", scenario.name))?;

    // 1. Verify every combination of the stage's strategies.
    let combinations = StrategySet::combinations(stage);
    let progress = report::Progress::new(
        options.progress,
        &scenario.name,
        combinations.len() as u64,
        "verify",
    );
    let mut baseline_output = None;
    for strategies in &combinations {
        let output = workload.output(*strategies)?;
        let got = digest(&output);
        if options.print_digests {
            if strategies.is_empty() {
                println!(
                    "{} ({}): expected = \"{got}\"",
                    scenario.name,
                    if options.quick { "quick" } else { "full" }
                );
            }
        } else if got != size.expected {
            bail!(mismatch_report(
                &scenario.name,
                *strategies,
                &output,
                baseline_output.as_deref(),
                &size.expected
            ));
        }
        if strategies.is_empty() {
            baseline_output = Some(output);
        } else if Some(&output) != baseline_output.as_ref() {
            bail!(mismatch_report(
                &scenario.name,
                *strategies,
                &output,
                baseline_output.as_deref(),
                &digest(baseline_output.as_deref().unwrap_or_default())
            ));
        }
        progress.inc();
    }
    progress.finish();
    let digest = digest(baseline_output.as_deref().unwrap_or_default());
    let arms = arms(stage, options.only.map(|s| s.restrict(stage)));
    let mut result = ScenarioResult {
        scenario: scenario.name.clone(),
        stage,
        size: if options.quick { "quick" } else { "full" },
        units: workload.units(),
        digest,
        combinations_verified: combinations.len(),
        arms: Vec::new(),
        peers: Vec::new(),
        peers_skipped: Vec::new(),
    };
    if options.print_digests {
        return Ok(result);
    }

    // 2. Measure the arms, interleaved.
    let repeats = options.repeats.unwrap_or(size.repeats).max(1);
    let mut results: Vec<ArmResult> = arms
        .iter()
        .map(|(arm, s)| ArmResult {
            arm: arm.clone(),
            strategies: *s,
            samples: Vec::new(),
        })
        .collect();
    let progress = report::Progress::new(
        options.progress,
        &scenario.name,
        (repeats * arms.len()) as u64,
        "measure",
    );
    // One untimed warm-up round.
    for (_, s) in &arms {
        workload.run(*s)?;
    }
    for round in 0..repeats {
        // Rotate the starting arm each round so no arm always runs first.
        for k in 0..arms.len() {
            let i = (k + round) % arms.len();
            let start = Instant::now();
            workload.run(arms[i].1)?;
            results[i].samples.push(start.elapsed());
            progress.inc();
        }
    }
    progress.finish();
    result.arms = results;

    // 3. The peers, after ours.
    if options.peers {
        (result.peers, result.peers_skipped) = peers::run_for(
            scenario,
            size,
            options.quick,
            repeats,
            options.with_clickhouse,
        );
    }
    Ok(result)
}

/// Runs the named scenarios (all built-ins when empty) and reports.
pub fn ablate(names: &[String], options: &AblateOptions) -> Result<Vec<ScenarioResult>> {
    let load_at_start = report::run_started();
    let names: Vec<String> = if names.is_empty() {
        BUILT_IN.iter().map(|(n, _)| n.to_string()).collect()
    } else {
        names.to_vec()
    };
    let scenarios: Vec<Scenario> = names
        .iter()
        .map(|n| load_scenario(n))
        .collect::<Result<_>>()?;
    let out_dir = match &options.out {
        Some(dir) => dir.clone(),
        None => report::default_results_dir(),
    };
    let mut results = Vec::new();
    for scenario in &scenarios {
        let result = run_scenario(scenario, options)?;
        if !options.print_digests {
            println!("{}", report::table(&result));
            report::write_csv(&out_dir, &result)?;
        }
        results.push(result);
    }
    if !options.print_digests {
        report::write_machine(&out_dir, options, load_at_start)?;
        println!("results: {}", out_dir.display());
    }
    Ok(results)
}
