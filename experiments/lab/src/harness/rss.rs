//! Peak resident memory per arm (`promlab ablate --peak-rss`). Each arm runs
//! once in a child process of its own (`promlab arm-rss`), so no arm's
//! allocations or caches count against another's. The child builds the
//! workload, resets its peak (`5` into `/proc/self/clear_refs`), notes its
//! resident set, runs the arm once, checks the output like a timed run, and
//! reports `VmHWM` less that resident set: the run's own peak, without the
//! input the harness built and holds (request bodies, a store on disk).

use super::{all_arms, digest, load_scenario, run_arm, workloads, Output};
use crate::machine::ProcessStats;
use anyhow::{bail, Context, Result};
use promlab::strategy::StrategySet;
use std::path::Path;
use std::process::Command;

/// Runs `arm` of `scenario` in a child (`exe arm-rss`) and returns its peak, in bytes.
pub fn probe(exe: &Path, scenario: &str, quick: bool, arm: &str) -> Result<u64> {
    let mut command = Command::new(exe);
    command.args(["arm-rss", scenario, "--arm", arm]);
    if quick {
        command.arg("--quick");
    }
    let output = command
        .output()
        .with_context(|| format!("cannot run {}", exe.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "arm-rss {scenario} --arm {arm} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("peak_rss_bytes=")?.trim().parse().ok())
        .with_context(|| format!("arm-rss {scenario} --arm {arm} printed no peak: {stdout}"))
}

/// The child's side: the arm's own peak resident memory, in bytes, and the
/// resident set before the run (the process with its input), in bytes.
pub fn measure(scenario: &str, quick: bool, arm: &str) -> Result<(u64, u64)> {
    let scenario = load_scenario(scenario)?;
    let size = scenario.size(quick);
    let stage = scenario.stage();
    let mut workload = workloads::build(&size.params)?;
    let arms = all_arms(stage, StrategySet::all().restrict(stage), workload.as_ref());
    let Some((name, set, kind)) = arms.into_iter().find(|(name, _, _)| name == arm) else {
        bail!("scenario {}: no arm `{arm}`", scenario.name)
    };
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
        Ok(got) if got != size.expected => {
            bail!("`{name}` produced digest {got}, {} expected", size.expected)
        }
        _ => {}
    }
    Ok((peak.saturating_sub(before) * 1024, before * 1024))
}
