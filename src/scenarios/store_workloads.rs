//! Workloads of the first half, generated deterministically so the harness,
//! the benchmarks and the tests all measure the same thing.
//!
//! - [`seed_repro`]: the slow-export report's repro — histogram
//!   `query_seconds{db,statement}`, long SQL statements, every process observing
//!   0.003/0.03/0.3/3 for each statement.
//! - [`large`]: the report's "larger case" shape — a histogram and a counter,
//!   two databases, statements up to thousands of characters.
//! - [`long_label`]: the write-path report — one histogram observe and one
//!   counter increment with a 195-character label value.
//! - [`many_metrics`]: hundreds of counters × ~100 processes, one entry per
//!   file (the probe: 400 × 100 = 40,000 files).

use crate::format::formenc::Dialect;
use crate::format::registry::Registry;
use crate::scenarios::op_log::{Op, OpKind, OpLog, OpValue};
use crate::shared::strategy::StrategySet;
use crate::write::{Client, ClientConfig};
use anyhow::Result;
use std::path::Path;

/// A registry and what each process did.
#[derive(Clone, Debug)]
pub struct StoreWorkload {
    pub registry: Registry,
    pub logs: Vec<OpLog>,
}

impl StoreWorkload {
    /// Writes every process's ops into `dir` (files named by the logs' pids).
    pub fn write(&self, dir: &Path, strategies: StrategySet) -> Result<()> {
        for log in &self.logs {
            let config = ClientConfig {
                dialect: Dialect::Uri,
                strategies,
                pid_override: Some(log.pid),
            };
            let mut client = Client::new(dir, &self.registry, config)?;
            log.replay(&mut client)?;
        }
        Ok(())
    }

    /// Total number of ops.
    pub fn ops(&self) -> usize {
        self.logs.iter().map(|l| l.ops.len()).sum()
    }
}

const HISTOGRAM_REGISTRY: &str = r#"{"metrics": [
  {"name": "query_seconds", "type": "histogram", "help": "q", "labels": ["db", "statement"],
   "aggregation": "sum",
   "buckets": ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10"]}
]}"#;

const LARGE_REGISTRY: &str = r#"{"metrics": [
  {"name": "query_seconds", "type": "histogram", "help": "Query latency by statement",
   "labels": ["db", "statement"], "aggregation": "sum",
   "buckets": ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10"]},
  {"name": "queries_total", "type": "counter", "help": "Queries by statement",
   "labels": ["db", "statement"], "aggregation": "sum"}
]}"#;

/// SQL statement `i` with `placeholders` bind markers (78 characters at 10).
pub fn statement(i: usize, placeholders: usize) -> String {
    let marks = vec!["?"; placeholders].join(", ");
    format!("SELECT a, b, c FROM ks.t{i} WHERE id = ? AND x IN ({marks})")
}

fn labels(db: &str, statement: &str) -> Vec<(String, String)> {
    vec![
        ("db".to_string(), db.to_string()),
        ("statement".to_string(), statement.to_string()),
    ]
}

const SEED_VALUES: [f64; 4] = [0.003, 0.03, 0.3, 3.0];

/// The seed repro: `processes` writers × `statements` label sets of 60–200 characters.
pub fn seed_repro(processes: usize, statements: usize) -> StoreWorkload {
    let registry = Registry::from_json(HISTOGRAM_REGISTRY).expect("built-in registry");
    let texts: Vec<String> = (0..statements)
        .map(|i| statement(i, 10 + i * 30 / statements.max(1)))
        .collect();
    let logs = (0..processes)
        .map(|p| {
            let pid = 20_000 + p as u32;
            let ops = texts
                .iter()
                .flat_map(|s| {
                    SEED_VALUES.iter().map(move |&v| Op {
                        pid,
                        metric: "query_seconds".to_string(),
                        op: OpKind::Observe,
                        value: OpValue::new(v),
                        labels: labels("main", s),
                    })
                })
                .collect();
            OpLog { pid, ops }
        })
        .collect();
    StoreWorkload { registry, logs }
}

/// The larger case: `processes` writers, `statements` statements of up to
/// ~`max_len` characters over two databases, a histogram and a counter.
pub fn large(processes: usize, statements: usize, max_len: usize) -> StoreWorkload {
    let registry = Registry::from_json(LARGE_REGISTRY).expect("built-in registry");
    let max_marks = (max_len.saturating_sub(60)) / 3;
    let texts: Vec<String> = (0..statements)
        .map(|i| statement(i, 10 + (i * 7919) % max_marks.max(1)))
        .collect();
    let logs = (0..processes)
        .map(|p| {
            let pid = 30_000 + p as u32;
            let mut ops = Vec::new();
            for (i, s) in texts.iter().enumerate() {
                let db = if i % 2 == 0 { "main" } else { "replica" };
                for (k, &v) in SEED_VALUES.iter().enumerate() {
                    let v = v * (1.0 + ((p + i + k) % 7) as f64 / 10.0);
                    ops.push(Op {
                        pid,
                        metric: "query_seconds".into(),
                        op: OpKind::Observe,
                        value: OpValue::new(v),
                        labels: labels(db, s),
                    });
                    ops.push(Op {
                        pid,
                        metric: "queries_total".into(),
                        op: OpKind::Inc,
                        value: OpValue::new(1.0),
                        labels: labels(db, s),
                    });
                }
            }
            OpLog { pid, ops }
        })
        .collect();
    StoreWorkload { registry, logs }
}

/// Hundreds of metrics: `metrics` counters (`app_op_<i>_total{result="ok"}`),
/// each incremented once by each of `processes` processes, so every file
/// holds one entry. Process `p` (pid 40,000 + p) adds 1 + (p + i) mod 5.
pub fn many_metrics(metrics: usize, processes: usize) -> StoreWorkload {
    let defs: Vec<serde_json::Value> = (0..metrics)
        .map(|i| {
            serde_json::json!({
                "name": format!("app_op_{i:03}_total"),
                "type": "counter",
                "help": format!("Operations of kind {i}"),
                "labels": ["result"],
                "aggregation": "sum",
            })
        })
        .collect();
    let registry = Registry::from_json(&serde_json::json!({ "metrics": defs }).to_string())
        .expect("generated registry");
    let logs = (0..processes)
        .map(|p| {
            let pid = 40_000 + p as u32;
            let ops = (0..metrics)
                .map(|i| Op {
                    pid,
                    metric: format!("app_op_{i:03}_total"),
                    op: OpKind::Inc,
                    value: OpValue::new((1 + (p + i) % 5) as f64),
                    labels: vec![("result".to_string(), "ok".to_string())],
                })
                .collect();
            OpLog { pid, ops }
        })
        .collect();
    StoreWorkload { registry, logs }
}

/// The write-path report's label: 195 characters.
pub fn long_label_value() -> String {
    let s = statement(7, 49);
    assert_eq!(s.len(), 195);
    s
}

/// A registry with one histogram and one counter labelled by `statement`.
pub fn long_label_registry() -> Registry {
    Registry::from_json(
        r#"{"metrics": [
  {"name": "request_seconds", "type": "histogram", "help": "Request time", "labels": ["statement"],
   "aggregation": "sum"},
  {"name": "requests_total", "type": "counter", "help": "Requests", "labels": ["statement"],
   "aggregation": "sum"}
]}"#,
    )
    .expect("built-in registry")
}

/// What step `i` of the long-label writer observes.
pub fn long_label_step_value(i: usize) -> f64 {
    SEED_VALUES[i % SEED_VALUES.len()]
}

/// The pid whose files the long-label writer writes (fixed, so every run
/// writes the same file names).
pub const LONG_LABEL_PID: u32 = 4242;

/// `steps` steps of [`LongLabelWriter`] as an op log: per step the observe
/// and the increment it makes.
pub fn long_label_log(steps: usize) -> OpLog {
    let label = long_label_value();
    let labels = vec![("statement".to_string(), label)];
    let op = |metric: &str, op, value| Op {
        pid: LONG_LABEL_PID,
        metric: metric.to_string(),
        op,
        value: OpValue::new(value),
        labels: labels.clone(),
    };
    let ops = (0..steps)
        .flat_map(|i| {
            [
                op("request_seconds", OpKind::Observe, long_label_step_value(i)),
                op("requests_total", OpKind::Inc, 1.0),
            ]
        })
        .collect();
    OpLog {
        pid: LONG_LABEL_PID,
        ops,
    }
}

/// A client in `dir` ready for the long-label write loop.
pub struct LongLabelWriter {
    client: Client,
    histogram: crate::write::MetricId,
    counter: crate::write::MetricId,
    label: String,
}

impl LongLabelWriter {
    pub fn new(dir: &Path, strategies: StrategySet) -> Result<LongLabelWriter> {
        // A fixed pid names the files, so the output is the same on every run;
        // the baseline still asks the OS for its pid on every call.
        let config = ClientConfig {
            dialect: Dialect::Uri,
            strategies,
            pid_override: Some(LONG_LABEL_PID),
        };
        let client = Client::new(dir, &long_label_registry(), config)?;
        let histogram = client.metric("request_seconds")?;
        let counter = client.metric("requests_total")?;
        Ok(LongLabelWriter {
            client,
            histogram,
            counter,
            label: long_label_value(),
        })
    }

    /// One histogram observe and one counter increment.
    #[inline]
    pub fn step(&mut self, value: f64) -> Result<()> {
        let labels = [("statement", self.label.as_str())];
        self.client.observe(self.histogram, &labels, value)?;
        self.client.increment(self.counter, &labels, 1.0)
    }
}
