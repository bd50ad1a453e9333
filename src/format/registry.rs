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
        for (i, label) in self.labels.iter().enumerate() {
            validate_label_name(label, reserved)
                .with_context(|| format!("metric {}", self.name))?;
            // Prometheus's parser refuses a series naming a label twice.
            if self.labels[..i].contains(label) {
                bail!("metric {}: label {label} is declared twice", self.name);
            }
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
                // An equal bound would print two series with one `le`.
                if bound <= previous {
                    bail!(
                        "metric {}: buckets are not strictly increasing (at {b:?})",
                        self.name
                    );
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

/// The suffixes past a metric's name that parsers read as the metric's own
/// series: `_count`, `_sum`, `_bucket` of a histogram or summary (Prometheus's
/// text parser takes a family `x_count` after histogram `x` for `x`'s count,
/// and fails the scrape on a second `TYPE` line for `x`), and for any metric
/// the OpenMetrics names `_total`, `_created` and `_info`.
pub fn clash_suffixes(kind: MetricType) -> &'static [&'static str] {
    const ANY: &[&str] = &["_total", "_created", "_info"];
    const SERIES: &[&str] = &["_total", "_created", "_info", "_count", "_sum", "_bucket"];
    match kind {
        MetricType::Histogram | MetricType::Summary => SERIES,
        MetricType::Counter | MetricType::Gauge => ANY,
    }
}

/// Whether two metrics may not share an exposition: equal names, or one named
/// as the other's series ([`clash_suffixes`]). The error names both.
pub fn name_clash(a: &str, a_kind: MetricType, b: &str, b_kind: MetricType) -> Result<()> {
    if a == b {
        bail!("metric {a} is registered twice");
    }
    for (x, x_kind, y, y_kind) in [(a, a_kind, b, b_kind), (b, b_kind, a, a_kind)] {
        if let Some(suffix) = y.strip_prefix(x) {
            if clash_suffixes(x_kind).contains(&suffix) {
                bail!("{}", clash_message(x, x_kind, y, y_kind, suffix));
            }
        }
    }
    Ok(())
}

fn clash_message(
    base: &str,
    base_kind: MetricType,
    other: &str,
    other_kind: MetricType,
    suffix: &str,
) -> String {
    format!(
        "metrics {base} ({}) and {other} ({}) clash: {other} is {base} with the suffix \
         {suffix}, which exposition parsers read as one of {base}'s own series",
        base_kind.name(),
        other_kind.name()
    )
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

    /// Each metric on its own, then every pair: no name twice, and no name
    /// that another metric's series would also claim ([`name_clash`]).
    pub fn validate(&mut self) -> Result<()> {
        let mut kinds = std::collections::HashMap::new();
        for m in &mut self.metrics {
            m.validate()?;
            if kinds.insert(m.name.clone(), m.kind).is_some() {
                bail!("metric {} is registered twice", m.name);
            }
        }
        for m in &self.metrics {
            for suffix in clash_suffixes(m.kind) {
                let claimed = format!("{}{suffix}", m.name);
                if let Some(&kind) = kinds.get(&claimed) {
                    bail!("{}", clash_message(&m.name, m.kind, &claimed, kind, suffix));
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn load(metrics: &str) -> Result<Registry> {
        Registry::from_json(&format!(r#"{{"metrics": [{metrics}]}}"#))
    }

    fn refused(metrics: &str) -> String {
        format!("{:#}", load(metrics).expect_err(metrics))
    }

    #[test]
    fn a_series_name_of_another_metric_is_refused_naming_both() {
        // (name, type) pairs: the second is a series name of the first.
        for pair in [
            "x histogram x_count counter",
            "x histogram x_sum gauge",
            "x histogram x_bucket histogram",
            "x summary x_count gauge",
            "x summary x_sum summary",
            "x summary x_bucket counter",
            "x gauge x_total counter",
            "x counter x_created gauge",
            "x gauge x_info gauge",
            "x histogram x_created gauge",
        ] {
            let w: Vec<&str> = pair.split(' ').collect();
            let metric = |n: usize| format!(r#""{}", "type": "{}""#, w[n], w[n + 1]);
            let (first, second) = (metric(0), metric(2));
            // Either order: the parser fails on both.
            for (a, b) in [(&first, &second), (&second, &first)] {
                let err = refused(&format!(r#"{{"name": {a}}}, {{"name": {b}}}"#));
                let (na, nb) = (a.split('"').nth(1).unwrap(), b.split('"').nth(1).unwrap());
                assert!(
                    err.contains(&format!("metrics {na} ")) || err.contains(&format!(" and {na} ")),
                    "{err}"
                );
                assert!(err.contains(nb) && err.contains("clash"), "{err}");
            }
        }
    }

    #[test]
    fn suffixes_that_are_no_series_of_the_other_are_kept() {
        // A counter's `_count` or a gauge's `_sum` is no series of theirs.
        load(r#"{"name": "x", "type": "counter"}, {"name": "x_count", "type": "counter"}"#)
            .unwrap();
        load(r#"{"name": "x", "type": "gauge"}, {"name": "x_sum", "type": "gauge"}"#).unwrap();
        load(r#"{"name": "x", "type": "histogram"}, {"name": "x_counts", "type": "gauge"}"#)
            .unwrap();
        load(r#"{"name": "x_total", "type": "counter"}, {"name": "y_total", "type": "counter"}"#)
            .unwrap();
    }

    #[test]
    fn what_the_parser_refuses_within_one_metric_is_refused() {
        let err = refused(r#"{"name": "x", "type": "counter"}, {"name": "x", "type": "gauge"}"#);
        assert!(err.contains("x is registered twice"), "{err}");
        let err = refused(r#"{"name": "x", "type": "counter", "labels": ["a", "b", "a"]}"#);
        assert!(err.contains("label a is declared twice"), "{err}");
        let err = refused(r#"{"name": "x", "type": "histogram", "buckets": ["1", "1.0"]}"#);
        assert!(err.contains("strictly increasing"), "{err}");
        let err = refused(r#"{"name": "x", "type": "histogram", "labels": ["le"]}"#);
        assert!(err.contains("reserved"), "{err}");
        let err = refused(r#"{"name": "x", "type": "summary", "labels": ["quantile"]}"#);
        assert!(err.contains("reserved"), "{err}");
    }

    #[test]
    fn name_clash_is_symmetric() {
        use MetricType::*;
        assert!(name_clash("x", Histogram, "x_count", Counter).is_err());
        assert!(name_clash("x_count", Counter, "x", Histogram).is_err());
        assert!(name_clash("x", Counter, "x", Gauge).is_err());
        assert!(name_clash("x", Counter, "x_count", Counter).is_ok());
        assert!(name_clash("x", Counter, "xy_total", Counter).is_ok());
    }
}
