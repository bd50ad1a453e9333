//! The research harness: scenarios as data, verified before they are timed.
//!
//! A scenario (`experiments/scenarios/*.toml`) names its generator and the
//! generator's typed parameters ([`Generator`], which also decides the stage)
//! at two sizes (`quick` for CI and the default run, `full` for the real
//! figures), each with the SHA-256 of the output every strategy combination
//! must produce — the way rebar's definitions carry their expected answer.
//! [`ablate`] then
//! 1. **verifies** every combination of the stage's strategies against that
//!    digest, stopping with the combination and the first differing line;
//! 2. **measures** the arms ([`arms`]: baseline, each strategy alone, all but
//!    one, all) interleaved round by round (A B C … A B C …) so drift hits
//!    every arm alike, checking what every timed run returned, and reports
//!    medians, spread and the speed-up over the baseline;
//! 3. **reports** a terminal table and a CSV per scenario plus `machine.txt`.

mod arms;
pub mod clones;
mod compare;
pub mod dossier;
mod expected;
pub mod floor;
mod format;
pub mod peers;
pub mod profiles;
pub mod report;
pub mod rss;
pub mod scale;
mod scenario;
mod summary;
mod timing;
pub mod workloads;

use anyhow::{bail, Context, Result};
use promlab::shared::strategy::{Stage, StrategySet};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

pub use arms::{
    all_arms, arms, bench_id, configured, run_arm, run_once, ArmKind, Input, Output, Workload,
    FLOOR,
};
pub use expected::expected_answer;
pub use scenario::{load_scenario, load_scenarios, Generator, Scenario, Size, BUILT_IN};
pub use timing::{measure, process_cpu, quantile, ArmResult, MIN_SAMPLE, WARM_RUN_BELOW};
pub use workloads::query;

pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

pub use promlab::reference::first_difference::first_difference;

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
    /// `--peak-rss`: the `promlab` binary to run each arm once in, as a child
    /// process, for its peak resident memory ([`rss`]).
    pub peak_rss: Option<PathBuf>,
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
    /// The other arms whose first run was verified too (other inputs, other
    /// paths to the answer, the fold).
    pub others_verified: usize,
    pub arms: Vec<ArmResult>,
    /// Peer arms (`--peers`), measured after ours.
    pub peers: Vec<peers::PeerResult>,
    /// Peers that had an arm here but did not run, with the reason.
    pub peers_skipped: Vec<String>,
}

/// Verifies, then measures, one scenario.
pub fn run_scenario(scenario: &Scenario, options: &AblateOptions) -> Result<ScenarioResult> {
    let stage = scenario.stage();
    let size = scenario.size(options.quick);
    let mut workload = workloads::build(&size.params)
        .with_context(|| format!("cannot build scenario {}", scenario.name))?;
    let set = options
        .only
        .unwrap_or_else(StrategySet::all)
        .restrict(stage);
    workload.prepare_arms(set)?;
    let expected = if options.print_digests {
        let answer = digest(&expected_answer(&size.params)?);
        println!(
            "{} ({}): expected = \"{answer}\"",
            scenario.name,
            if options.quick { "quick" } else { "full" }
        );
        answer
    } else {
        size.expected.clone()
    };

    // 1. Verify the first run of every combination of the stage's strategies.
    let combinations = StrategySet::combinations(stage);
    let progress = report::Progress::new(
        options.progress,
        &scenario.name,
        combinations.len() as u64,
        "verify",
    );
    let mut baseline_output: Option<Vec<u8>> = None;
    for strategies in &combinations {
        let output = workload.run(*strategies)?.to_vec()?;
        if digest(&output) != expected {
            bail!(mismatch_report(
                &scenario.name,
                *strategies,
                &output,
                baseline_output.as_deref(),
                &expected
            ));
        }
        if baseline_output.is_none() {
            baseline_output = Some(output);
        }
        progress.inc();
    }
    progress.finish();
    let verified = baseline_output.unwrap_or_default();
    let arms = all_arms(stage, set, workload.as_ref());
    // The arms that are not a combination (another input, another path, the
    // fold): the first run of each, its answer the scenario's too.
    let mut others_verified = 0;
    for arm @ (name, _, kind) in &arms {
        if matches!(kind, ArmKind::Extra | ArmKind::Upkeep) {
            let output = run_once(workload.as_mut(), arm)?.to_vec()?;
            if digest(&output) != expected {
                bail!(
                    "scenario {}: arm `{name}` produced digest {} but {expected} was expected {}",
                    scenario.name,
                    digest(&output),
                    first_difference(&verified, &output, "verified", name)
                );
            }
            others_verified += 1;
        }
    }
    let mut result = ScenarioResult {
        scenario: scenario.name.clone(),
        stage,
        size: if options.quick { "quick" } else { "full" },
        units: workload.units(),
        digest: digest(&verified),
        combinations_verified: combinations.len(),
        others_verified,
        arms: Vec::new(),
        peers: Vec::new(),
        peers_skipped: Vec::new(),
    };
    if options.print_digests {
        return Ok(result);
    }

    // 2. Measure the arms, interleaved; what every timed run returned is checked
    //    (the floor's too: its bytes, or the units it handled).
    let repeats = options.repeats.unwrap_or(size.repeats).max(1);
    let results = measure(
        &scenario.name,
        workload.as_mut(),
        &arms,
        repeats,
        &verified,
        options.progress,
    )?;
    result.arms = results;

    // 3. Peak memory, each arm once in a child of its own (`--peak-rss`).
    if let Some(exe) = &options.peak_rss {
        for arm in &mut result.arms {
            arm.peak_rss_bytes = Some(rss::probe(exe, &scenario.name, options.quick, &arm.arm)?);
        }
    }

    // 4. The peers, after ours.
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
    let built_in: Vec<&str> = BUILT_IN.iter().map(|(n, _)| *n).collect();
    let scenarios = scenario::load_scenarios(names, &built_in)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The write stage's warm writers: verified on their first run, then
    /// compared after the same number of timed runs.
    #[test]
    fn ablate_verifies_the_warm_writers_it_times() {
        let mut scenario = load_scenario("write-long-label").unwrap();
        scenario.quick.params = Generator::LongLabel { steps: 200 };
        scenario.quick.expected = digest(&expected_answer(&scenario.quick.params).unwrap());
        let options = AblateOptions {
            quick: true,
            only: None,
            out: None,
            repeats: Some(2),
            print_digests: false,
            progress: false,
            peers: false,
            with_clickhouse: false,
            peak_rss: None,
        };
        let result = run_scenario(&scenario, &options).unwrap();
        // Fourteen strategy arms (baseline, six alone, six left out, all) and the floor.
        assert_eq!(result.arms.len(), 15);
        assert_eq!(result.arms[14].kind, ArmKind::Floor);
        assert!(result.arms.iter().all(|a| a.samples.len() == 2));
        assert_eq!(result.digest, scenario.quick.expected);
        // A wrong digest stops the run, naming the strategies.
        scenario.quick.expected = "0".repeat(64);
        let err = run_scenario(&scenario, &options).unwrap_err();
        assert!(err.to_string().contains("strategies `none`"), "{err}");
    }

    #[test]
    fn ingest_runs_return_their_verified_answer() {
        let scenario = load_scenario("prometheus-captures").unwrap();
        let params = Generator::PrometheusCaptures { passes: 1 };
        let mut workload = workloads::build(&params).unwrap();
        let first = workload.run(StrategySet::NONE).unwrap().to_vec().unwrap();
        assert!(first.starts_with(b"[") && first.ends_with(b"\n"));
        let all = StrategySet::all();
        assert_eq!(&*workload.run(all).unwrap().bytes().unwrap(), &first[..]);
        // At its quick size the answer is the scenario's digest.
        let mut quick = workloads::build(&scenario.quick.params).unwrap();
        let got = digest(&quick.run(all).unwrap().bytes().unwrap());
        assert_eq!(got, scenario.quick.expected);
    }
}
