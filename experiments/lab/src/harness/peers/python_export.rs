//! Export peer: Python's `prometheus_client` in multiprocess mode, the client
//! most multi-process Prometheus exporters run (gunicorn, celery workers).
//!
//! promlab hands the peer the scenario's workload as data — its registry, one
//! op log per writer process (the same processes, label sets and observations
//! our generator gives our writer) and our exposition — in the peer's scratch
//! directory; `experiments/peers/python_export.py` replays each op log in its
//! own process through prometheus_client's metrics (its own `.db` files), then
//! times `MultiProcessCollector` + `generate_latest` in one process and checks
//! every sample against ours. See `experiments/peers/README.md`.

use super::{Measure, Peer, PeerContext, PeerOutcome, PeerResult};
use anyhow::{bail, Context, Result};
use promlab::scenarios::store_workloads::StoreWorkload;
use promlab::shared::strategy::StrategySet;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The script, carried in the binary so a copied `promlab` still runs it.
const SCRIPT: &str = include_str!("../../../../peers/python_export.py");

/// Longest the script may take (writers, exports, check) before it is killed.
const TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// What the script prints.
#[derive(Deserialize)]
struct ScriptReport {
    prometheus_client: String,
    python: String,
    samples_ns: Vec<u64>,
    lines: u64,
    samples: u64,
    processes: u64,
    db_files: u64,
    store_bytes: u64,
    rss_kib: u64,
    rss_first_kib: u64,
}

/// `python3` of `experiments/peers/.venv` (what `install.sh` creates) when it
/// exists, else the one on `PATH`.
pub fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../peers/.venv/bin/python3");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// Whether that python can import prometheus_client.
pub fn prometheus_client_installed() -> bool {
    super::runs_cleanly(python(), &["-c", "import prometheus_client"])
}

/// The scenario's workload, as our export arms have it.
fn store_workload(cx: &PeerContext<'_>) -> Result<StoreWorkload> {
    crate::harness::workloads::generated_store(&cx.size.params).with_context(|| {
        format!(
            "generator {:?} has no mapping to prometheus_client",
            cx.size.params
        )
    })
}

/// Writes what the script reads into `dir`: registry, op logs, our exposition.
fn write_inputs(dir: &Path, work: &StoreWorkload) -> Result<()> {
    std::fs::write(dir.join("registry.json"), work.registry.to_json())?;
    let ops = dir.join("ops");
    std::fs::create_dir_all(&ops)?;
    for log in &work.logs {
        std::fs::write(ops.join(format!("ops-{}.jsonl", log.pid)), log.to_jsonl())?;
    }
    let store = dir.join("promlab-store");
    std::fs::create_dir_all(&store)?;
    work.write(&store, StrategySet::NONE)?;
    let ours = promlab::export::export(&store, &work.registry, StrategySet::NONE)?;
    std::fs::remove_dir_all(&store)?;
    std::fs::write(dir.join("promlab.prom"), ours)?;
    std::fs::write(dir.join("python_export.py"), SCRIPT)?;
    Ok(())
}

/// Runs the script to completion, or kills its process group (the writers
/// too) at [`TIMEOUT`].
fn run_script(dir: &Path, repeats: usize) -> Result<ScriptReport> {
    let mut command = Command::new(python());
    command
        .arg(dir.join("python_export.py"))
        .arg(dir)
        .arg(repeats.to_string());
    super::run_script(command, "python_export.py", dir, TIMEOUT)
}

/// `prometheus_client` (Python), multiprocess mode.
pub struct PythonPrometheusClient;

impl Peer for PythonPrometheusClient {
    fn arm(&self) -> &'static str {
        "peer:python-prometheus-client"
    }

    fn runs(&self, scenario: &str) -> bool {
        matches!(scenario, "seed-repro" | "large")
    }

    fn run(&self, cx: &PeerContext<'_>) -> Result<PeerOutcome> {
        if !prometheus_client_installed() {
            return Ok(PeerOutcome::Skipped(
                "prometheus_client not installed: run experiments/peers/install.sh".into(),
            ));
        }
        let work = store_workload(cx)?;
        write_inputs(&cx.workdir, &work)?;
        let report = run_script(&cx.workdir, cx.repeats)?;
        if report.samples_ns.is_empty() {
            bail!("python_export.py timed no export");
        }
        Ok(PeerOutcome::Measured(PeerResult {
            arm: self.arm().to_string(),
            measure: Measure::Wall,
            samples: report
                .samples_ns
                .iter()
                .map(|&ns| Duration::from_nanos(ns))
                .collect(),
            units: (report.lines, "lines".to_string()),
            rss_kib: Some(report.rss_kib),
            note: format!(
                "prometheus_client {} (Python {}), multiprocess mode: {} writer processes, its own format ({} .db files, {:.1} MiB: one mmap'd file per metric type per process, JSON keys, value + timestamp per entry); all {} samples checked equal to ours; peak RSS {:.1} MiB after the first export",
                report.prometheus_client,
                report.python,
                report.processes,
                report.db_files,
                report.store_bytes as f64 / (1024.0 * 1024.0),
                report.samples,
                report.rss_first_kib as f64 / 1024.0,
            ),
        }))
    }
}
