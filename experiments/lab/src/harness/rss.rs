//! Peak resident memory per arm (`promlab ablate --peak-rss`). Each arm runs
//! once in a child process of its own (`promlab arm-rss`), so no arm's
//! allocations or caches count against another's. The child builds the
//! workload, resets its peak (`5` into `/proc/self/clear_refs`), notes its
//! resident set, runs the arm once, checks the output like a timed run, and
//! reports `VmHWM` less that resident set: the run's own peak, without the
//! input the harness built and holds (request bodies, a store on disk).

use super::{all_arms, digest, load_scenario, run_arm, workloads, ArmKind, Generator, Output};
use crate::machine::ProcessStats;
use anyhow::{bail, Context, Result};
use promlab::shared::strategy::StrategySet;
use std::path::Path;
use std::process::Command;

/// Runs `arm` of `scenario` in a child (`exe arm-rss`) and returns its peak, in bytes.
pub fn probe(exe: &Path, scenario: &str, quick: bool, arm: &str) -> Result<u64> {
    let mut command = Command::new(exe);
    command.args(["arm-rss", scenario, "--arm", arm]);
    if quick {
        command.arg("--quick");
    }
    run_probe(command, scenario, arm)
}

/// Runs `arm` of the workload `params` describes (a scaling point) in a
/// child, its output checked against the digest `expected`; its peak, in bytes.
pub fn probe_params(exe: &Path, params: &Generator, expected: &str, arm: &str) -> Result<u64> {
    let mut command = Command::new(exe);
    command.args(["arm-rss", "--params", &serde_json::to_string(params)?]);
    command.args(["--expected", expected, "--arm", arm]);
    run_probe(command, &format!("{params:?}"), arm)
}

fn run_probe(mut command: Command, what: &str, arm: &str) -> Result<u64> {
    let output = command
        .output()
        .with_context(|| format!("cannot run {:?}", command.get_program()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "arm-rss {what} --arm {arm} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("peak_rss_bytes=")?.trim().parse().ok())
        .with_context(|| format!("arm-rss {what} --arm {arm} printed no peak: {stdout}"))
}

/// The child's side: the arm's own peak resident memory, in bytes, and the
/// resident set before the run (the process with its input), in bytes.
pub fn measure(scenario: &str, quick: bool, arm: &str) -> Result<(u64, u64)> {
    let scenario = load_scenario(scenario)?;
    let size = scenario.size(quick);
    measure_params(&size.params, &size.expected, arm)
        .with_context(|| format!("scenario {}", scenario.name))
}

/// [`measure`] for the workload `params` describes, checked against `expected`.
pub fn measure_params(params: &Generator, expected: &str, arm: &str) -> Result<(u64, u64)> {
    let stage = params.stage();
    let mut workload = workloads::build(params)?;
    let arms = all_arms(stage, StrategySet::all().restrict(stage), workload.as_ref());
    let all = StrategySet::all().restrict(stage);
    // `all` of a one-strategy stage is that strategy's arm (as `promlab scale` names it).
    let Some((name, set, kind)) = arms.into_iter().find(|(name, set, kind)| {
        name == arm
            || (arm == "all" && *kind == ArmKind::Strategies && *set == all && !all.is_empty())
    }) else {
        bail!("no arm `{arm}`")
    };
    // An upkeep arm's set-up (the fold's fresh copy) is no part of its run.
    if kind == ArmKind::Upkeep {
        workload.set_up(&name)?;
    }
    std::fs::write("/proc/self/clear_refs", "5")
        .context("cannot reset the peak resident set (/proc/self/clear_refs)")?;
    let before = ProcessStats::of_self()?
        .rss_kib
        .context("no VmRSS in /proc/self/status")?;
    let output = run_arm(workload.as_mut(), kind, &name, set)?;
    let peak = ProcessStats::of_self()?
        .peak_rss_kib
        .context("no VmHWM in /proc/self/status")?;
    // The arm's first run produces the scenario's answer (a floor, its units;
    // a render workload counts its lines once it has rendered).
    let got = match output {
        Output::Units(n) => Err(n),
        output => Ok(digest(&output.bytes()?)),
    };
    let units = workload.units().0;
    match got {
        Err(n) if n != units => bail!("`{name}` handled {n} units, not {units}"),
        Ok(got) if got != expected => {
            bail!("`{name}` produced digest {got}, {expected} expected")
        }
        _ => {}
    }
    Ok((peak.saturating_sub(before) * 1024, before * 1024))
}
