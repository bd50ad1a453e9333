//! Peer arms: the systems users would pick instead of promlab, run on the same
//! workload, on the same machine, in the same `promlab ablate --peers` run,
//! after promlab's own arms. Each peer is installed by name from a package
//! registry (`experiments/peers/install.sh`), never vendored; one that is not
//! installed is skipped with the reason, not failed.
//!
//! A peer reports its own timings and units, because its unit of work may
//! differ from ours (a paced feed, a different file format); the report
//! compares per unit: `ratio_to_all` = the peer's time per unit ÷ promlab-all's.

pub mod client_ruby;
pub mod crates_render;
pub mod python_export;
// ingest peers
pub mod chdb;
pub mod prometheus;
pub mod remote_write;
pub mod victoriametrics;

use super::{Scenario, Size};
use anyhow::Result;
use std::path::PathBuf;
use std::time::Duration;

/// What a peer's samples measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// Wall time of one run.
    Wall,
    /// CPU time (user + system) of the peer's process over one run.
    Cpu,
}

impl Measure {
    pub fn name(self) -> &'static str {
        match self {
            Measure::Wall => "wall",
            Measure::Cpu => "cpu",
        }
    }
}

/// One peer's measurement of a scenario.
#[derive(Clone, Debug)]
pub struct PeerResult {
    /// `peer:<name>`, as the CSV and the table show it.
    pub arm: String,
    pub measure: Measure,
    /// One sample per timed run.
    pub samples: Vec<Duration>,
    /// How much one run does, and of what (`lines`, `samples`, `steps`).
    pub units: (u64, String),
    /// Resident set size of the peer's process (peak, or sampled at the end), if measured.
    /// Read the peak from `VmHWM` (`/proc/<pid>/status`), not `ru_maxrss`: Linux
    /// carries `ru_maxrss` across `execve`, so a child of promlab starts at promlab's peak.
    pub rss_kib: Option<u64>,
    /// What the peer does differently, in a few words (file format, exact
    /// quantiles, stores raw samples, …); printed under the table.
    pub note: String,
}

impl PeerResult {
    pub fn median(&self) -> Duration {
        let mut sorted = self.samples.clone();
        sorted.sort();
        sorted[(sorted.len() - 1) / 2]
    }

    pub fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.samples.clone();
        sorted.sort();
        sorted[((sorted.len() - 1) as f64 * q).round() as usize]
    }

    pub fn ns_per_unit(&self) -> f64 {
        self.median().as_nanos() as f64 / self.units.0.max(1) as f64
    }
}

/// Whether a peer ran.
#[derive(Debug)]
pub enum PeerOutcome {
    Measured(PeerResult),
    /// Not installed or not asked for (`--with-clickhouse`): the reason.
    Skipped(String),
}

/// What a peer gets to run with.
pub struct PeerContext<'a> {
    pub scenario: &'a Scenario,
    pub size: &'a Size,
    pub quick: bool,
    /// Timed runs to do (the scenario's rounds, or `--repeats`).
    pub repeats: usize,
    /// The running promlab binary (for `promlab feed`, `promlab replay`, …).
    pub promlab: PathBuf,
    /// A scratch directory, removed after the peer's run.
    pub workdir: PathBuf,
    /// `--with-clickhouse`: run the optional chdb arm (an ~800 MB install).
    pub with_clickhouse: bool,
}

/// A system that does one of promlab's jobs.
pub trait Peer {
    /// `peer:<name>`.
    fn arm(&self) -> &'static str;
    /// Whether it has an arm for this scenario.
    fn runs(&self, scenario: &str) -> bool;
    /// Measures it; `Skipped` when it is not installed. Must leave nothing
    /// running, whatever happens.
    fn run(&self, cx: &PeerContext<'_>) -> Result<PeerOutcome>;
}

/// Every peer promlab knows, in the order their rows appear.
pub fn all() -> Vec<Box<dyn Peer>> {
    let [ruby_4, ruby_5] = client_ruby::peers();
    vec![
        Box::new(python_export::PythonPrometheusClient),
        Box::new(ruby_4),
        Box::new(ruby_5),
        Box::new(crates_render::PrometheusClientCrate),
        Box::new(crates_render::PrometheusCrate),
        // ingest peers
        Box::new(prometheus::peer(None)),
        Box::new(victoriametrics::peer(None)),
        Box::new(chdb::Chdb::default()),
    ]
}

/// Runs every peer that has an arm for `scenario`: the measured ones, and
/// `"<arm>: <reason>"` for each one skipped. A peer that fails is reported and
/// skipped: our own figures stand without it.
pub fn run_for(
    scenario: &Scenario,
    size: &Size,
    quick: bool,
    repeats: usize,
    with_clickhouse: bool,
) -> (Vec<PeerResult>, Vec<String>) {
    let promlab = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("promlab"));
    let (mut measured, mut skipped) = (Vec::new(), Vec::new());
    for peer in all().into_iter().filter(|p| p.runs(&scenario.name)) {
        let outcome = tempfile::Builder::new()
            .prefix("promlab-peer-")
            .tempdir()
            .map_err(anyhow::Error::from)
            .and_then(|dir| {
                peer.run(&PeerContext {
                    scenario,
                    size,
                    quick,
                    repeats,
                    promlab: promlab.clone(),
                    workdir: dir.path().to_path_buf(),
                    with_clickhouse,
                })
            });
        match outcome {
            Ok(PeerOutcome::Measured(result)) => measured.push(result),
            Ok(PeerOutcome::Skipped(reason)) => skipped.push(format!("{}: {reason}", peer.arm())),
            Err(e) => skipped.push(format!("{}: failed: {e:#}", peer.arm())),
        }
    }
    (measured, skipped)
}

/// Whether `program` runs with `args` and exits 0, its output discarded: how
/// a peer's installation is checked.
fn runs_cleanly(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> bool {
    use std::process::{Command, Stdio};
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs a peer's script to completion in a process group of its own (so a
/// timeout ends whatever it started too), its stdout and stderr into `dir`'s
/// `stdout.json` and `stderr.txt`; kills the group past `timeout`; reads the
/// JSON report it printed. `name` names the script in errors.
fn run_script<T: serde::de::DeserializeOwned>(
    mut command: std::process::Command,
    name: &str,
    dir: &std::path::Path,
    timeout: std::time::Duration,
) -> Result<T> {
    use anyhow::{bail, Context};
    use std::os::unix::process::CommandExt;
    let (out_path, err_path) = (dir.join("stdout.json"), dir.join("stderr.txt"));
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {name}"))?;
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > timeout {
            // SAFETY: signals only the process group this function started.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            bail!("{name} ran past {timeout:?} and was killed");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    if !status.success() {
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        let tail: Vec<&str> = stderr.lines().rev().take(12).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!("{name} {status}:\n{}", tail.join("\n"));
    }
    let stdout = std::fs::read_to_string(&out_path)?;
    serde_json::from_str(stdout.trim()).with_context(|| format!("{name} printed no report"))
}
