//! The aggregation plan: which series feed which per-group DDSketch windows.
//!
//! ```toml
//! lateness_secs = 5        # how far behind the newest timestamp a window may still take samples
//! keep_windows = 10        # closed windows kept per aggregation
//!
//! [[aggregation]]
//! id = "data"
//! metric = "data"
//! group_by = ["label_0"]
//! window_secs = 60         # tumbling
//! relative_accuracy = 0.01
//! quantiles = [0.5, 0.9, 0.99]
//! match = { job = "feeder" }   # optional equality matchers
//! ```
//!
//! Without a file the plan is the seed's: metric `data` grouped by `label_0`.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::Path;

/// One aggregation: a metric, label matchers, group-by labels, and its sketch windows.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Aggregation {
    pub id: String,
    pub metric: String,
    /// Equality matchers on other labels (a missing label matches `""`).
    #[serde(default, rename = "match")]
    pub matchers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub group_by: Vec<String>,
    #[serde(default = "default_window_secs")]
    pub window_secs: u64,
    #[serde(default = "default_alpha")]
    pub relative_accuracy: f64,
    #[serde(default = "default_quantiles")]
    pub quantiles: Vec<f64>,
}

fn default_window_secs() -> u64 {
    60
}
fn default_alpha() -> f64 {
    0.01
}
fn default_quantiles() -> Vec<f64> {
    vec![0.5, 0.9, 0.99]
}
fn default_lateness_secs() -> u64 {
    5
}
fn default_keep_windows() -> usize {
    10
}

/// What [`Plan::validate`] accepts.
pub const WINDOW_SECS: std::ops::RangeInclusive<u64> = 1..=7 * 86_400;
pub const LATENESS_SECS: std::ops::RangeInclusive<u64> = 0..=86_400;
pub const KEEP_WINDOWS: std::ops::RangeInclusive<usize> = 1..=100_000;
pub const RELATIVE_ACCURACY: std::ops::RangeInclusive<f64> = 1e-4..=0.5;
pub const MAX_AGGREGATIONS: usize = 1_000;
pub const MAX_QUANTILES: usize = 32;
pub const MAX_GROUP_BY: usize = 32;
pub const MAX_ID_BYTES: usize = 256;

/// Seconds as milliseconds, saturating (a plan built in code skips validation).
fn secs_to_ms(secs: u64) -> i64 {
    i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX)
}

impl Aggregation {
    /// The window length in ms, at least 1 whatever the plan says.
    pub fn window_ms(&self) -> i64 {
        secs_to_ms(self.window_secs).max(1)
    }

    /// The DDSketch configuration of this aggregation's panes: this
    /// aggregation's accuracy, no collapse over the normal range, `±0` and
    /// subnormals as zeros ([`super::bins::sketch_config`]).
    pub fn sketch_config(&self) -> sketches_ddsketch::Config {
        super::bins::sketch_config(self.relative_accuracy)
    }
}

impl Aggregation {
    fn validate(&self) -> Result<()> {
        let id = &self.id;
        let id_ok = !id.is_empty()
            && id.len() <= MAX_ID_BYTES
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_:./-".contains(&b));
        if !id_ok {
            bail!(
                "aggregation id {:?}: expected 1 to {MAX_ID_BYTES} of A-Z a-z 0-9 _ : . / -",
                id
            );
        }
        if !crate::format::registry::is_metric_name(self.metric.as_bytes()) {
            bail!(
                "aggregation `{id}`: metric = {:?} is not a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)",
                self.metric
            );
        }
        if !WINDOW_SECS.contains(&self.window_secs) {
            bail!(
                "aggregation `{id}`: window_secs = {} is out of range ({} to {})",
                self.window_secs,
                WINDOW_SECS.start(),
                WINDOW_SECS.end()
            );
        }
        if !RELATIVE_ACCURACY.contains(&self.relative_accuracy) {
            bail!(
                "aggregation `{id}`: relative_accuracy = {:?} is out of range ({:?} to {:?})",
                self.relative_accuracy,
                RELATIVE_ACCURACY.start(),
                RELATIVE_ACCURACY.end()
            );
        }
        if self.quantiles.is_empty() || self.quantiles.len() > MAX_QUANTILES {
            bail!(
                "aggregation `{id}`: {} quantiles: expected 1 to {MAX_QUANTILES}",
                self.quantiles.len()
            );
        }
        for (i, q) in self.quantiles.iter().enumerate() {
            // 0 and 1 are the exact minimum and maximum.
            if !(0.0..=1.0).contains(q) {
                bail!("aggregation `{id}`: quantiles[{i}] = {q:?} is outside [0, 1]");
            }
            if self.quantiles[..i].contains(q) {
                bail!("aggregation `{id}`: quantiles name {q:?} twice");
            }
        }
        if self.group_by.len() > MAX_GROUP_BY {
            bail!(
                "aggregation `{id}`: {} group_by labels: at most {MAX_GROUP_BY}",
                self.group_by.len()
            );
        }
        for (i, g) in self.group_by.iter().enumerate() {
            if !crate::format::registry::is_label_name(g.as_bytes()) {
                bail!("aggregation `{id}`: group_by[{i}] = {g:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)");
            }
            if self.group_by[..i].contains(g) {
                bail!("aggregation `{id}`: group_by names `{g}` twice");
            }
        }
        if let Some(name) = self
            .matchers
            .keys()
            .find(|n| !crate::format::registry::is_label_name(n.as_bytes()))
        {
            bail!("aggregation `{id}`: match names {name:?}, not a label name ([a-zA-Z_][a-zA-Z0-9_]*)");
        }
        Ok(())
    }
}

/// The whole plan.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    #[serde(default = "default_lateness_secs")]
    pub lateness_secs: u64,
    #[serde(default = "default_keep_windows")]
    pub keep_windows: usize,
    #[serde(default, rename = "aggregation")]
    pub aggregations: Vec<Aggregation>,
}

impl Default for Plan {
    /// The seed's plan: `data` grouped by `label_0`, 60 s windows, α = 0.01, p50/p90/p99.
    fn default() -> Self {
        Plan {
            lateness_secs: default_lateness_secs(),
            keep_windows: default_keep_windows(),
            aggregations: vec![Aggregation {
                id: "data".into(),
                metric: "data".into(),
                matchers: Default::default(),
                group_by: vec!["label_0".into()],
                window_secs: default_window_secs(),
                relative_accuracy: default_alpha(),
                quantiles: default_quantiles(),
            }],
        }
    }
}

impl Plan {
    pub fn parse(text: &str) -> Result<Plan> {
        let plan: Plan = toml::from_str(text).context("parsing the plan")?;
        plan.validate()?;
        Ok(plan)
    }

    /// Reads and validates a plan file: a regular file of at most
    /// [`crate::shared::config_file::MAX_BYTES`], opened without blocking (see
    /// [`crate::shared::config_file::read`]).
    pub fn load(path: &Path) -> Result<Plan> {
        let text =
            crate::shared::config_file::read(path, "plan", crate::shared::config_file::MAX_BYTES)?;
        Plan::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// `path` if given, else the default plan.
    pub fn load_or_default(path: Option<&Path>) -> Result<Plan> {
        path.map_or_else(|| Ok(Plan::default()), Plan::load)
    }

    pub fn lateness_ms(&self) -> i64 {
        secs_to_ms(self.lateness_secs)
    }

    /// Every field in range, every name valid; the error names the field and its value.
    pub fn validate(&self) -> Result<()> {
        if !LATENESS_SECS.contains(&self.lateness_secs) {
            bail!(
                "lateness_secs = {} is out of range ({} to {})",
                self.lateness_secs,
                LATENESS_SECS.start(),
                LATENESS_SECS.end()
            );
        }
        if !KEEP_WINDOWS.contains(&self.keep_windows) {
            bail!(
                "keep_windows = {} is out of range ({} to {})",
                self.keep_windows,
                KEEP_WINDOWS.start(),
                KEEP_WINDOWS.end()
            );
        }
        if self.aggregations.len() > MAX_AGGREGATIONS {
            bail!(
                "{} aggregations: at most {MAX_AGGREGATIONS}",
                self.aggregations.len()
            );
        }
        let mut ids = std::collections::HashSet::new();
        for a in &self.aggregations {
            a.validate()?;
            if !ids.insert(&a.id) {
                bail!("aggregation id `{}` appears twice", a.id);
            }
        }
        Ok(())
    }
}

/// A plan in force, numbered: every reload bumps the generation, which
/// invalidates anything derived from the previous plan (the series cache).
#[derive(Clone, Debug)]
pub struct PlanGeneration {
    pub plan: Plan,
    pub generation: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_defaults() {
        let plan = Plan::parse(
            r#"
            [[aggregation]]
            id = "a"
            metric = "m"
            group_by = ["x", "y"]
            match = { job = "j" }
            [[aggregation]]
            id = "b"
            metric = "m"
            window_secs = 10
            quantiles = [0.1]
            "#,
        )
        .unwrap();
        assert_eq!(plan.lateness_secs, 5);
        assert_eq!(plan.aggregations[0].window_secs, 60);
        assert_eq!(plan.aggregations[0].matchers["job"], "j");
        assert_eq!(plan.aggregations[1].quantiles, vec![0.1]);
        assert!(Plan::parse("[[aggregation]]\nid='a'\nmetric='m'\nquantiles=[2.0]").is_err());
        assert!(Plan::parse("bogus = 1").is_err());
        assert_eq!(Plan::default().aggregations[0].group_by, vec!["label_0"]);
        Plan::default().validate().unwrap();
    }

    /// Every field out of range, or a name that is not one, is an error naming
    /// the field and the value (a `window_secs = 2^61` let through would make
    /// every write divide by zero).
    #[test]
    fn rejects_every_field_out_of_range() {
        let agg = |extra: &str| format!("[[aggregation]]\nid = 'a'\nmetric = 'm'\n{extra}\n");
        let cases = [
            (
                agg("window_secs = 2305843009213693952"),
                "window_secs = 2305843009213693952",
            ),
            (agg("window_secs = 0"), "window_secs = 0"),
            (agg("window_secs = 604801"), "window_secs = 604801"),
            (agg("relative_accuracy = 0.0"), "relative_accuracy = 0.0 "),
            (agg("relative_accuracy = 1.0"), "relative_accuracy = 1.0 "),
            (agg("relative_accuracy = nan"), "relative_accuracy = NaN"),
            (
                agg("relative_accuracy = 1e-300"),
                "relative_accuracy = 1e-300",
            ),
            (agg("quantiles = []"), "0 quantiles"),
            (agg("quantiles = [1.5]"), "quantiles[0] = 1.5"),
            (agg("quantiles = [0.5, nan]"), "quantiles[1] = NaN"),
            (agg("quantiles = [0.5, 0.5]"), "0.5 twice"),
            (agg("group_by = ['a-b']"), "group_by[0] = \"a-b\""),
            (agg("group_by = ['']"), "group_by[0] = \"\""),
            (agg("group_by = ['x', 'x']"), "`x` twice"),
            (agg("match = { 'a b' = 'x' }"), "\"a b\""),
            (
                "[[aggregation]]\nid = 'a'\nmetric = 'm-1'\n".into(),
                "metric = \"m-1\"",
            ),
            (
                "[[aggregation]]\nid = ''\nmetric = 'm'\n".into(),
                "aggregation id \"\"",
            ),
            (
                "[[aggregation]]\nid = \"a\\n\"\nmetric = 'm'\n".into(),
                "aggregation id \"a\\n\"",
            ),
            ("keep_windows = 0".into(), "keep_windows = 0"),
            (
                "keep_windows = 18446744073709551615".into(),
                "keep_windows = 18446744073709551615",
            ),
            (
                "lateness_secs = 18446744073709551615".into(),
                "lateness_secs = 18446744073709551615",
            ),
            (format!("{}{}", agg(""), agg("")), "appears twice"),
        ];
        for (text, want) in cases {
            let err = format!("{:#}", Plan::parse(&text).unwrap_err());
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    /// A plan built in code is not validated: its window arithmetic saturates, never panics.
    #[test]
    fn window_arithmetic_saturates() {
        let mut agg = Plan::default().aggregations[0].clone();
        for secs in [0, 1 << 61, u64::MAX] {
            agg.window_secs = secs;
            assert!(agg.window_ms() >= 1, "{secs}");
        }
        let plan = Plan {
            lateness_secs: u64::MAX,
            ..Plan::default()
        };
        assert_eq!(plan.lateness_ms(), i64::MAX);
    }
}
