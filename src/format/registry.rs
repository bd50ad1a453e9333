//! The registry: which metrics exist, as client_ruby had them registered.
//!
//! Read from the `registry.json` format of the fixtures: name, type, help,
//! declared labels, aggregation, and for histograms the bucket bounds exactly
//! as Ruby prints them in `le`.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Summary,
}

impl MetricType {
    pub fn name(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
            MetricType::Summary => "summary",
        }
    }
}

/// How values of one label set are combined across processes (client_ruby's
/// store `aggregation` setting).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessAggregation {
    Sum,
    Max,
    Min,
    /// One series per process, told apart by a `pid` label.
    All,
    /// The value with the newest timestamp (gauges only).
    MostRecent,
}

/// One registered metric.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct MetricDef {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: MetricType,
    #[serde(default)]
    pub help: String,
    #[serde(default)]
    pub labels: Vec<String>,
    /// Defaults as client_ruby's DirectFileStore: `all` for gauges, else `sum`.
    pub aggregation: Option<ProcessAggregation>,
    /// Histogram bucket bounds as Ruby prints them (`"1"`, `"25000.0"`).
    #[serde(default)]
    pub buckets: Vec<String>,
}

/// client_ruby's default histogram buckets, as Ruby prints them.
pub const DEFAULT_BUCKETS: [&str; 11] = [
    "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10",
];

impl MetricDef {
    pub fn aggregation(&self) -> ProcessAggregation {
        self.aggregation.unwrap_or(match self.kind {
            MetricType::Gauge => ProcessAggregation::All,
            _ => ProcessAggregation::Sum,
        })
    }

    /// Bucket bounds parsed as numbers, in declared order.
    pub fn bucket_bounds(&self) -> Vec<f64> {
        self.buckets
            .iter()
            .map(|b| b.parse().expect("validated on load"))
            .collect()
    }

    fn validate(&mut self) -> Result<()> {
        if !is_metric_name(self.name.as_bytes()) {
            bail!("invalid metric name {:?}", self.name);
        }
        let reserved: &[&str] = match self.kind {
            MetricType::Histogram => &["pid", "le"],
            MetricType::Summary => &["pid", "quantile"],
            _ => &["pid"],
        };
        for label in &self.labels {
            validate_label_name(label, reserved)
                .with_context(|| format!("metric {}", self.name))?;
        }
        let agg = self.aggregation();
        if agg == ProcessAggregation::MostRecent && self.kind != MetricType::Gauge {
            bail!(
                "metric {}: most_recent aggregation is only for gauges",
                self.name
            );
        }
        if self.kind == MetricType::Histogram {
            if self.buckets.is_empty() {
                self.buckets = DEFAULT_BUCKETS.iter().map(|s| s.to_string()).collect();
            }
            let mut previous = f64::NEG_INFINITY;
            for b in &self.buckets {
                let bound: f64 = b
                    .parse()
                    .ok()
                    .filter(|v: &f64| v.is_finite())
                    .with_context(|| {
                        format!("metric {}: bucket {b:?} is not a finite number", self.name)
                    })?;
                if bound < previous {
                    bail!("metric {}: buckets are not sorted", self.name);
                }
                previous = bound;
            }
        } else if !self.buckets.is_empty() {
            bail!("metric {}: only histograms have buckets", self.name);
        }
        Ok(())
    }
}

/// Prometheus metric names: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub fn is_metric_name(name: &[u8]) -> bool {
    match name.split_first() {
        Some((first, rest)) => {
            (first.is_ascii_alphabetic() || matches!(first, b'_' | b':'))
                && rest
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b':'))
        }
        None => false,
    }
}

/// Prometheus label names: `[a-zA-Z_][a-zA-Z0-9_]*`.
pub fn is_label_name(name: &[u8]) -> bool {
    match name.split_first() {
        Some((first, rest)) => {
            (first.is_ascii_alphabetic() || *first == b'_')
                && rest.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_')
        }
        None => false,
    }
}

/// A label name a client may declare (client_ruby's rule): a Prometheus label
/// name, not `__`-prefixed, not one of `reserved`.
pub fn validate_label_name(name: &str, reserved: &[&str]) -> Result<()> {
    if !is_label_name(name.as_bytes()) {
        bail!("label name {name:?} does not match [a-zA-Z_][a-zA-Z0-9_]*");
    }
    if name.starts_with("__") {
        bail!("label name {name:?} starts with __, which is reserved");
    }
    if reserved.contains(&name) {
        bail!("label name {name:?} is reserved");
    }
    Ok(())
}

/// Every registered metric, in registration order.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Registry {
    pub metrics: Vec<MetricDef>,
}

impl Registry {
    pub fn from_json(text: &str) -> Result<Registry> {
        let mut registry: Registry =
            serde_json::from_str(text).context("registry does not parse")?;
        registry.validate()?;
        Ok(registry)
    }

    /// Reads and validates a registry file: a regular file of at most
    /// [`crate::shared::config_file::MAX_BYTES`], opened without blocking (a FIFO is
    /// an error, not a wait: see [`crate::shared::config_file::read`]).
    pub fn load(path: &Path) -> Result<Registry> {
        let text = crate::shared::config_file::read(
            path,
            "registry",
            crate::shared::config_file::MAX_BYTES,
        )?;
        Registry::from_json(&text).with_context(|| format!("registry {}", path.display()))
    }

    pub fn validate(&mut self) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for m in &mut self.metrics {
            m.validate()?;
            if !seen.insert(m.name.clone()) {
                bail!("metric {} is registered twice", m.name);
            }
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&MetricDef> {
        self.metrics.iter().find(|m| m.name == name)
    }

    pub fn to_json(&self) -> String {
        let metrics: Vec<serde_json::Value> = self
            .metrics
            .iter()
            .map(|m| {
                let mut v = serde_json::json!({
                    "name": m.name, "type": m.kind.name(), "help": m.help,
                    "labels": m.labels, "aggregation": agg_name(m.aggregation()),
                });
                if m.kind == MetricType::Histogram {
                    v["buckets"] = serde_json::json!(m.buckets);
                }
                v
            })
            .collect();
        serde_json::to_string_pretty(&serde_json::json!({ "metrics": metrics })).expect("json")
    }
}

fn agg_name(a: ProcessAggregation) -> &'static str {
    match a {
        ProcessAggregation::Sum => "sum",
        ProcessAggregation::Max => "max",
        ProcessAggregation::Min => "min",
        ProcessAggregation::All => "all",
        ProcessAggregation::MostRecent => "most_recent",
    }
}
