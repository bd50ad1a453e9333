//! Embedded ClickHouse (PyPI `chdb`), optional (`--with-clickhouse`; an
//! ~800 MB install): the feed's minute of samples as RowBinary batches of
//! 100,000 rows into a `Null` table whose materialized view keeps
//! `quantilesDDState(0.01, 0.5, 0.9, 0.99)` per (group, minute) —
//! `experiments/peers/chdb_ingest.py`. Not paced: it ingests as fast as it
//! can, and the CPU time of its process is read around each batch.

use super::remote_write::{
    fed_answers, promlab_answers, run_within, FeedPlan, GroupAnswer, QUANTILES, WINDOW_MS,
};
use super::{Measure, Peer, PeerContext, PeerOutcome, PeerResult};
use anyhow::{bail, Context, Result};
use promlab::ingest::feed::FeedWorkload;
use promlab::ingest::plan::Plan;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const ROWS_PER_BATCH: usize = 100_000;
/// A minute boundary (2027-01-15T08:00:00Z): no pacing, so any fixed minute does.
const MINUTE_MS: i64 = 1_800_000_000_000;

/// `peer:chdb`; `plan` overrides the groups chosen by size.
#[derive(Default)]
pub struct Chdb {
    pub plan: Option<FeedPlan>,
}

pub const ARM: &str = "peer:chdb";
const INSTALL: &str = "experiments/peers/install.sh --with-clickhouse";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../peers/chdb_ingest.py")
}

#[derive(Deserialize)]
struct Answer {
    batch_cpu_ns: Vec<u64>,
    max_rss_kib: u64,
    groups: BTreeMap<String, GroupAnswerJson>,
}

#[derive(Deserialize)]
struct GroupAnswerJson {
    count: u64,
    quantiles: Vec<f64>,
}

/// The minute's samples in feed order (tick, then series) as RowBinary files
/// of `label_0 String, instance String, ts DateTime64(3), value Float64` rows.
fn write_batches(workload: &FeedWorkload, ticks: &[u64], dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut rows = 0;
    let mut out = Vec::new();
    let string = |out: &mut Vec<u8>, s: &str| {
        // RowBinary strings: LEB128 length, then the bytes.
        let mut n = s.len();
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            out.push(if n == 0 { byte } else { byte | 0x80 });
            if n == 0 {
                break;
            }
        }
        out.extend_from_slice(s.as_bytes());
    };
    let flush = |out: &mut Vec<u8>, files: &mut Vec<PathBuf>| -> Result<()> {
        let path = dir.join(format!("batch-{:05}.bin", files.len()));
        std::fs::File::create(&path)?.write_all(out)?;
        out.clear();
        files.push(path);
        Ok(())
    };
    for &t in ticks {
        for n in 0..workload.series() {
            let (g, i) = (n / workload.series_per_group, n % workload.series_per_group);
            string(&mut out, &format!("g{g}"));
            string(&mut out, &format!("i{i}"));
            out.extend_from_slice(&workload.timestamp(t, 0).to_le_bytes());
            out.extend_from_slice(&workload.value(n, t).to_le_bytes());
            rows += 1;
            if rows == ROWS_PER_BATCH {
                flush(&mut out, &mut files)?;
                rows = 0;
            }
        }
    }
    if rows > 0 {
        flush(&mut out, &mut files)?;
    }
    Ok(files)
}

impl Peer for Chdb {
    fn arm(&self) -> &'static str {
        ARM
    }

    fn runs(&self, scenario: &str) -> bool {
        scenario == "asap-1e5"
    }

    fn run(&self, cx: &PeerContext<'_>) -> Result<PeerOutcome> {
        if !cx.with_clickhouse {
            return Ok(PeerOutcome::Skipped("needs --with-clickhouse".into()));
        }
        // The peers' venv if `install.sh` made one, else the system's python3.
        let python = super::python_export::python();
        let probe = Command::new(&python)
            .args(["-c", "import chdb"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if !probe.is_ok_and(|s| s.success()) {
            return Ok(PeerOutcome::Skipped(format!(
                "chdb is not installed for {} ({INSTALL}, ~800 MB)",
                python.display()
            )));
        }
        let plan = self
            .plan
            .unwrap_or_else(|| FeedPlan::for_size(cx.quick, cx.repeats));
        let workload = FeedWorkload {
            groups: plan.groups,
            series_per_group: super::remote_write::SERIES_PER_GROUP,
            ..FeedWorkload::seed(MINUTE_MS)
        };
        // One minute: ticks 0..60 from a minute boundary.
        let ticks: Vec<u64> = (0..(WINDOW_MS / 1000) as u64).collect();
        let files = write_batches(&workload, &ticks, &cx.workdir)?;
        let answer_path = cx.workdir.join("answer.json");
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg("exec \"$PYTHON\" \"$@\" > \"$ANSWER\"")
            .arg("chdb_ingest")
            .arg(script())
            .arg("--session")
            .arg(cx.workdir.join("chdb"))
            .args(["--minute-ms", &MINUTE_MS.to_string()])
            .args(&files)
            .env("ANSWER", &answer_path)
            .env("PYTHON", &python);
        // Seconds at the full size; ten minutes means something is wrong.
        let (status, stderr) = run_within(&mut command, &cx.workdir, Duration::from_secs(600))
            .context("running python3 chdb_ingest.py")?;
        if !status.success() {
            let from = stderr
                .char_indices()
                .map(|(i, _)| i)
                .find(|&i| i + 1500 >= stderr.len())
                .unwrap_or(0);
            let tail = &stderr[from..];
            bail!("chdb_ingest.py failed ({status}): {tail}");
        }
        let answer: Answer = serde_json::from_slice(&std::fs::read(&answer_path)?)
            .context("chdb_ingest.py's JSON answer")?;

        let fed = fed_answers(&workload, &ticks);
        let ours = promlab_answers(&workload, &ticks, MINUTE_MS)?;
        let alpha = Plan::default().aggregations[0].relative_accuracy;
        let (mut worst_theirs, mut worst_between) = (0.0f64, 0.0f64);
        for (g, (fed, ours)) in fed.iter().zip(&ours).enumerate() {
            let theirs = answer.groups.get(&format!("g{g}")).map(|a| GroupAnswer {
                count: a.count,
                quantiles: a.quantiles.clone(),
            });
            let Some(theirs) = theirs.filter(|t| t.count == fed.count) else {
                bail!(
                    "chdb's count for g{g} differs from the {} samples fed",
                    fed.count
                );
            };
            for (i, q) in QUANTILES.iter().enumerate() {
                let truth = fed.quantiles[i];
                let relative = (theirs.quantiles[i] - truth).abs() / truth.abs();
                if relative > alpha * (1.0 + 1e-9) {
                    bail!(
                        "chdb's quantilesDD p{} of g{g} is {}, beyond α = {alpha} of the exact {truth}",
                        q * 100.0,
                        theirs.quantiles[i]
                    );
                }
                worst_theirs = worst_theirs.max(relative);
                let between = (theirs.quantiles[i] - ours.quantiles[i]).abs() / truth.abs();
                worst_between = worst_between.max(between);
            }
        }

        // The first batch also pays for the first parts and caches: a warm-up.
        let samples: Vec<Duration> = answer
            .batch_cpu_ns
            .iter()
            .skip(if answer.batch_cpu_ns.len() > 1 { 1 } else { 0 })
            .map(|&ns| Duration::from_nanos(ns))
            .collect();
        Ok(PeerOutcome::Measured(PeerResult {
            arm: ARM.to_string(),
            measure: Measure::Cpu,
            samples,
            units: (ROWS_PER_BATCH as u64, "rows".to_string()),
            rss_kib: Some(answer.max_rss_kib),
            note: format!(
                "chDB (embedded ClickHouse): one minute of {} groups × 100 series as RowBinary batches of {ROWS_PER_BATCH} rows into a Null table, a materialized view keeps quantilesDDState(0.01, …) and a count per (group, minute); not paced; CPU of its process per batch, the first batch a warm-up; its p50/p90/p99 within α = {alpha} of the exact ones (largest {worst_theirs:.5}), largest difference from promlab's {worst_between:.1e} (relative to exact)",
                plan.groups
            ),
        }))
    }
}
