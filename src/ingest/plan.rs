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

impl Aggregation {
    pub fn window_ms(&self) -> i64 {
        self.window_secs as i64 * 1000
    }

    /// The DDSketch configuration of this aggregation's panes (the crate's default
    /// bin limit and minimum value, this aggregation's accuracy).
    pub fn sketch_config(&self) -> sketches_ddsketch::Config {
        sketches_ddsketch::Config::new(self.relative_accuracy, 2048, 1.0e-9)
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

    pub fn load(path: &Path) -> Result<Plan> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Plan::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// `path` if given, else the default plan.
    pub fn load_or_default(path: Option<&Path>) -> Result<Plan> {
        path.map_or_else(|| Ok(Plan::default()), Plan::load)
    }

    pub fn lateness_ms(&self) -> i64 {
        self.lateness_secs as i64 * 1000
    }

    pub fn validate(&self) -> Result<()> {
        // Windows and lateness are i64 milliseconds: a larger count of seconds
        // would wrap (2^61 s wraps to a zero-length window, a division by zero).
        const MAX_SECS: u64 = (i64::MAX / 1000) as u64;
        if self.lateness_secs > MAX_SECS {
            bail!("lateness_secs must be at most {MAX_SECS}");
        }
        if self.keep_windows == 0 {
            bail!("keep_windows must be at least 1");
        }
        if self.aggregations.len() > u16::MAX as usize {
            bail!("too many aggregations");
        }
        let mut ids = std::collections::HashSet::new();
        for a in &self.aggregations {
            if !ids.insert(&a.id) {
                bail!("aggregation id `{}` appears twice", a.id);
            }
            if a.window_secs == 0 {
                bail!("aggregation `{}`: window_secs must be positive", a.id);
            }
            if a.window_secs > MAX_SECS {
                bail!(
                    "aggregation `{}`: window_secs must be at most {MAX_SECS}",
                    a.id
                );
            }
            if !(a.relative_accuracy > 0.0 && a.relative_accuracy < 1.0) {
                bail!(
                    "aggregation `{}`: relative_accuracy must be in (0, 1)",
                    a.id
                );
            }
            if let Some(q) = a.quantiles.iter().find(|q| !(0.0..=1.0).contains(*q)) {
                bail!("aggregation `{}`: quantile {q} is outside [0, 1]", a.id);
            }
            let mut seen = std::collections::HashSet::new();
            if let Some(g) = a.group_by.iter().find(|g| !seen.insert(*g)) {
                bail!("aggregation `{}`: group_by names `{g}` twice", a.id);
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
    }
}
