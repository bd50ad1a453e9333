//! What an ablation run leaves behind: a terminal table, a CSV per scenario and
//! `machine.txt`. The columns are documented in `experiments/README.md`.

use super::{AblateOptions, ArmResult, ScenarioResult};
use anyhow::{Context, Result};
use promlab::strategy::StrategySet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A progress bar on stderr, or nothing.
pub struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    pub fn new(enabled: bool, scenario: &str, total: u64, phase: &str) -> Progress {
        if !enabled {
            return Progress(None);
        }
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix:>22} {msg:8} [{bar:30}] {pos}/{len} {elapsed}",
            )
            .expect("template")
            .progress_chars("=> "),
        );
        bar.set_prefix(scenario.to_string());
        bar.set_message(phase.to_string());
        Progress(Some(bar))
    }

    pub fn inc(&self) {
        if let Some(bar) = &self.0 {
            bar.inc(1);
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// `experiments/results/<date>-<host>/`.
pub fn default_results_dir() -> PathBuf {
    let date = command_output("date", &["-u", "+%Y-%m-%d"]).unwrap_or_else(|| "undated".into());
    let host = command_output("hostname", &[]).unwrap_or_else(|| "host".into());
    PathBuf::from("experiments/results").join(format!("{date}-{host}"))
}

fn command_output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn human(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

fn baseline(result: &ScenarioResult) -> &ArmResult {
    result
        .arms
        .iter()
        .find(|a| a.strategies == StrategySet::NONE)
        .expect("every ablation has a baseline arm")
}

/// The terminal table of one scenario.
pub fn table(result: &ScenarioResult) -> String {
    let base = baseline(result).median().as_secs_f64();
    let (units, unit) = result.units;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{} ({}, {} size): {} {unit} per run; {} combinations verified, digest {}…",
        result.scenario,
        result.stage,
        result.size,
        units,
        result.combinations_verified,
        &result.digest[..12]
    );
    let _ = writeln!(
        out,
        "  {:<34} {:>11} {:>11} {:>11} {:>13} {:>9}",
        "arm",
        "median",
        "min",
        "max",
        &format!("ns/{}", unit.trim_end_matches('s')),
        "speed-up"
    );
    for arm in &result.arms {
        let median = arm.median();
        let per_unit = median.as_nanos() as f64 / units.max(1) as f64;
        let _ = writeln!(
            out,
            "  {:<34} {:>11} {:>11} {:>11} {:>13.1} {:>8.2}×",
            if arm.arm == "all" || arm.arm == "baseline" || arm.arm.starts_with("all-") {
                arm.arm.clone()
            } else {
                format!("{} alone", arm.arm)
            },
            human(median),
            human(arm.quantile(0.0)),
            human(arm.quantile(1.0)),
            per_unit,
            base / median.as_secs_f64()
        );
    }
    if !result.peers.is_empty() || !result.peers_skipped.is_empty() {
        let base_per_unit = base * 1e9 / units.max(1) as f64;
        let all_per_unit = all(result).median().as_nanos() as f64 / units.max(1) as f64;
        // Peers count their own units; compare per unit.
        let _ = writeln!(out, "  peers (speed-up and ratios per unit):");
        for peer in &result.peers {
            let per_unit = peer.ns_per_unit();
            let _ = writeln!(
                out,
                "  {:<34} {:>11} {:>11} {:>11} {:>13.1} {:>8.2}×  ({} time, {} {}/run{}; promlab-all {:.1}× faster, baseline {:.2}×)",
                peer.arm,
                human(peer.median()),
                human(peer.quantile(0.0)),
                human(peer.quantile(1.0)),
                per_unit,
                base_per_unit / per_unit,
                peer.measure.name(),
                peer.units.0,
                peer.units.1,
                peer.rss_kib.map_or(String::new(), |k| format!(", RSS {:.1} MiB", k as f64 / 1024.0)),
                per_unit / all_per_unit,
                per_unit / base_per_unit,
            );
            let _ = writeln!(out, "  {:<34} {}", "", peer.note);
        }
        for skipped in &result.peers_skipped {
            let _ = writeln!(out, "  skipped {skipped}");
        }
    }
    out
}

/// promlab's arm with every strategy of the run on (the last arm).
fn all(result: &ScenarioResult) -> &ArmResult {
    result
        .arms
        .iter()
        .max_by_key(|a| a.strategies.iter().count())
        .expect("every ablation has arms")
}

/// The CSV header; see `experiments/README.md`.
pub const CSV_HEADER: &str = "scenario,stage,size,arm,strategies,repeats,median_ns,min_ns,p25_ns,p75_ns,max_ns,units,unit,ns_per_unit,speedup_vs_baseline,digest,measure,rss_kib,ratio_to_all";

/// Writes `<dir>/<scenario>.csv`.
pub fn write_csv(dir: &Path, result: &ScenarioResult) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let base = baseline(result).median().as_nanos() as f64;
    let units = result.units.0.max(1) as f64;
    let all_per_unit = all(result).median().as_nanos() as f64 / units;
    let mut csv = String::from(CSV_HEADER);
    csv.push('\n');
    for arm in &result.arms {
        let median = arm.median().as_nanos();
        let _ = writeln!(
            csv,
            "{},{},{},{},\"{}\",{},{},{},{},{},{},{},{},{:.3},{:.4},{},wall,,{:.4}",
            result.scenario,
            result.stage,
            result.size,
            arm.arm,
            arm.strategies,
            arm.samples.len(),
            median,
            arm.quantile(0.0).as_nanos(),
            arm.quantile(0.25).as_nanos(),
            arm.quantile(0.75).as_nanos(),
            arm.quantile(1.0).as_nanos(),
            result.units.0,
            result.units.1,
            median as f64 / result.units.0.max(1) as f64,
            base / median as f64,
            result.digest,
            median as f64 / units / all_per_unit,
        );
    }
    // Peer rows: per-unit ratios, since a peer counts its own units; no digest,
    // since a peer's output is another format (each peer checks its answers).
    for peer in &result.peers {
        let per_unit = peer.ns_per_unit();
        let _ = writeln!(
            csv,
            "{},{},{},{},\"peer\",{},{},{},{},{},{},{},{},{:.3},{:.4},,{},{},{:.4}",
            result.scenario,
            result.stage,
            result.size,
            peer.arm,
            peer.samples.len(),
            peer.median().as_nanos(),
            peer.quantile(0.0).as_nanos(),
            peer.quantile(0.25).as_nanos(),
            peer.quantile(0.75).as_nanos(),
            peer.quantile(1.0).as_nanos(),
            peer.units.0,
            peer.units.1,
            per_unit,
            base / units / per_unit,
            peer.measure.name(),
            peer.rss_kib.map_or(String::new(), |k| k.to_string()),
            per_unit / all_per_unit,
        );
    }
    let path = dir.join(format!("{}.csv", result.scenario));
    std::fs::write(&path, csv).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes `<dir>/machine.txt`: what the figures were measured on.
pub fn write_machine(dir: &Path, options: &AblateOptions) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown", |(_, v)| v.trim());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let features: Vec<&str> = promlab::strategy::Strategy::ALL
        .iter()
        .filter(|s| s.on_by_default())
        .map(|s| s.name())
        .collect();
    let text = format!(
        "cpu: {cpu}\ncores: {cores}\nmemory: {}\nrustc: {}\nprofile: {}\ncompiled features: {}\nstrategy set: {}\nsize: {}\ngit revision: {}\ndate: {}\nhost: {}\n",
        command_output("sh", &["-c", "grep MemTotal /proc/meminfo | tr -s ' '"]).unwrap_or_default(),
        command_output("rustc", &["--version"]).unwrap_or_else(|| "unknown".into()),
        if cfg!(debug_assertions) { "debug" } else { "release" },
        if features.is_empty() { "none".to_string() } else { features.join(",") },
        options.only.map_or("all of each stage".to_string(), |s| s.to_string()),
        if options.quick { "quick" } else { "full" },
        env!("PROMLAB_GIT_REVISION"),
        command_output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]).unwrap_or_default(),
        command_output("hostname", &[]).unwrap_or_default(),
    );
    std::fs::write(dir.join("machine.txt"), text)?;
    Ok(())
}
