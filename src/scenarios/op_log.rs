//! Op logs: every call one writer process made (`ops-<pid>.jsonl`), so a store
//! can be rebuilt and compared byte for byte.
//!
//! One JSON object per line: `pid`, `metric`, `op` (`inc`, `dec`, `set`,
//! `observe`, `init`), `value` (a number, or `"Infinity"`, `"-Infinity"`,
//! `"NaN"`), `labels` (an object of strings).

use crate::write::Client;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    Inc,
    Dec,
    Set,
    Observe,
    Init,
}

/// A value as JSON carries it: a number, or Ruby's name of a non-finite float.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OpValue {
    Number(f64),
    Named(NonFinite),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NonFinite {
    Infinity,
    #[serde(rename = "-Infinity")]
    NegInfinity,
    NaN,
}

impl OpValue {
    pub fn get(self) -> f64 {
        match self {
            OpValue::Number(v) => v,
            OpValue::Named(NonFinite::Infinity) => f64::INFINITY,
            OpValue::Named(NonFinite::NegInfinity) => f64::NEG_INFINITY,
            OpValue::Named(NonFinite::NaN) => f64::NAN,
        }
    }

    pub fn new(v: f64) -> OpValue {
        if v.is_nan() {
            OpValue::Named(NonFinite::NaN)
        } else if v == f64::INFINITY {
            OpValue::Named(NonFinite::Infinity)
        } else if v == f64::NEG_INFINITY {
            OpValue::Named(NonFinite::NegInfinity)
        } else {
            OpValue::Number(v)
        }
    }
}

/// One call of one writer process.
#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    pub pid: u32,
    pub metric: String,
    pub op: OpKind,
    pub value: OpValue,
    pub labels: Vec<(String, String)>,
}

#[derive(Deserialize)]
struct RawOp {
    pid: u32,
    metric: String,
    op: OpKind,
    value: OpValue,
    #[serde(default)]
    labels: serde_json::Map<String, serde_json::Value>,
}

/// The ops of one process.
#[derive(Clone, Debug, PartialEq)]
pub struct OpLog {
    pub pid: u32,
    pub ops: Vec<Op>,
}

impl OpLog {
    pub fn parse(text: &str) -> Result<OpLog> {
        let mut ops = Vec::new();
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let raw: RawOp =
                serde_json::from_str(line).with_context(|| format!("line {}", i + 1))?;
            let labels = raw
                .labels
                .into_iter()
                .map(|(k, v)| match v {
                    serde_json::Value::String(s) => Ok((k, s)),
                    other => Ok((k, other.to_string())),
                })
                .collect::<Result<Vec<_>>>()?;
            ops.push(Op {
                pid: raw.pid,
                metric: raw.metric,
                op: raw.op,
                value: raw.value,
                labels,
            });
        }
        let Some(pid) = ops.first().map(|op| op.pid) else {
            bail!("the op log is empty")
        };
        if let Some(other) = ops.iter().find(|op| op.pid != pid) {
            bail!("the op log mixes pids {pid} and {}", other.pid);
        }
        Ok(OpLog { pid, ops })
    }

    pub fn load(path: &Path) -> Result<OpLog> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        OpLog::parse(&text).with_context(|| format!("op log {}", path.display()))
    }

    /// Runs every op against `client`, in order.
    pub fn replay(&self, client: &mut Client) -> Result<()> {
        for (i, op) in self.ops.iter().enumerate() {
            apply(client, op)
                .with_context(|| format!("op {} ({:?} {})", i + 1, op.op, op.metric))?;
        }
        Ok(())
    }

    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for op in &self.ops {
            let labels: serde_json::Map<String, serde_json::Value> = op
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            let line = serde_json::json!({
                "pid": op.pid, "metric": op.metric, "op": op.op, "value": op.value, "labels": labels,
            });
            out.push_str(&line.to_string());
            out.push('\n');
        }
        out
    }
}

/// Applies one op.
pub fn apply(client: &mut Client, op: &Op) -> Result<()> {
    let id = client.metric(&op.metric)?;
    let labels: Vec<(&str, &str)> = op
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let value = op.value.get();
    match op.op {
        OpKind::Inc => client.increment(id, &labels, value),
        OpKind::Dec => client.increment(id, &labels, -value),
        OpKind::Set => client.set(id, &labels, value),
        OpKind::Observe => client.observe(id, &labels, value),
        OpKind::Init => client.init(id, &labels),
    }
}
