//! The naive ingest stage: remote-write requests, decoded, and a plan in; per
//! (aggregation, group, window) the raw values that landed there, sorted, out
//! (so every exact quantile). The window rules written out plainly:
//!
//! - a series feeds every aggregation whose `metric` is its `__name__` and whose
//!   matchers all hold (a missing label matches `""`);
//! - only finite values count (stale markers, NaN and ±Inf go nowhere);
//! - its group is the group-by labels it has with a non-empty value, in
//!   group-by order; its window starts at `ts − ts mod window` (floored);
//! - a sample whose window ends at or before the watermark is late and dropped;
//!   the watermark only moves between requests: after each, to the newest
//!   routed timestamp minus the lateness, if that is higher.
//!
//! Every window is kept (the reference has no `keep_windows` limit; compare
//! with a plan whose limit exceeds the windows the input spans).

use crate::ingest::plan::Plan;
use std::collections::BTreeMap;

/// One series of a decoded request: its labels (names and values) and samples (ms, value).
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub labels: Vec<(String, String)>,
    pub samples: Vec<(i64, f64)>,
}

/// (aggregation id, group labels, window start in ms).
pub type PaneKey = (String, Vec<(String, String)>, i64);

/// Every pane's values, sorted ascending (`f64::total_cmp`).
pub fn panes(requests: &[Vec<Series>], plan: &Plan) -> BTreeMap<PaneKey, Vec<f64>> {
    let mut panes: BTreeMap<PaneKey, Vec<f64>> = BTreeMap::new();
    let mut watermark = i64::MIN;
    for request in requests {
        let mut newest: Option<i64> = None;
        for series in request {
            let label = |name: &str| {
                series
                    .labels
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or("", |(_, v)| v.as_str())
            };
            for agg in &plan.aggregations {
                if label("__name__") != agg.metric
                    || !agg.matchers.iter().all(|(k, v)| label(k) == v)
                {
                    continue;
                }
                let group: Vec<(String, String)> = agg
                    .group_by
                    .iter()
                    .filter(|g| !label(g).is_empty())
                    .map(|g| (g.clone(), label(g).to_string()))
                    .collect();
                let width = agg.window_secs as i64 * 1000;
                for &(ts, v) in &series.samples {
                    if !v.is_finite() {
                        continue;
                    }
                    newest = newest.max(Some(ts));
                    let start = ts.div_euclid(width) * width;
                    if start + width <= watermark {
                        continue;
                    }
                    panes
                        .entry((agg.id.clone(), group.clone(), start))
                        .or_default()
                        .push(v);
                }
            }
        }
        if let Some(n) = newest {
            watermark = watermark.max(n - plan.lateness_secs as i64 * 1000);
        }
    }
    for values in panes.values_mut() {
        values.sort_by(f64::total_cmp);
    }
    panes
}
