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
//!
//! [`run`] also counts what happened to the samples ([`Counts`], the
//! receiver's counters), and [`answer`] gives the query's JSON answer from
//! the panes' values through the `sketches-ddsketch` crate itself: the real
//! software whose sketch the ingester's panes hold, bit for bit.

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

/// What the reference makes of a request sequence.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Every pane's values in the order they arrived (request, series, sample).
    pub arrived: BTreeMap<PaneKey, Vec<f64>>,
    /// The watermark after the last request (`i64::MIN` before any routed sample).
    pub watermark: i64,
    pub counts: Counts,
}

/// What happened to the samples, as the receiver counts it: `accepted` and
/// `late` count (sample, aggregation) pairs, the others samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub accepted: u64,
    pub late: u64,
    /// Prometheus's stale markers: NaN with the bits `0x7ff0000000000002`.
    pub stale: u64,
    /// Other NaN and ±Inf values.
    pub rejected: u64,
    /// Finite samples of series no aggregation takes.
    pub unrouted: u64,
}

/// Prometheus's stale marker (`value.StaleNaN` in its `model/value`).
const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

/// Runs the window rules over `requests`, in order.
pub fn run(requests: &[Vec<Series>], plan: &Plan) -> Outcome {
    let mut run = Run::new(plan);
    requests.iter().for_each(|r| run.request(r));
    run.outcome
}

/// [`run`] one request at a time (for streams too long to hold decoded).
pub struct Run<'p> {
    plan: &'p Plan,
    pub outcome: Outcome,
}

impl<'p> Run<'p> {
    pub fn new(plan: &'p Plan) -> Self {
        Run {
            plan,
            outcome: Outcome {
                watermark: i64::MIN,
                ..Outcome::default()
            },
        }
    }

    /// One request, against the windows closed before it; then the watermark moves.
    pub fn request(&mut self, request: &[Series]) {
        let out = &mut self.outcome;
        let mut newest: Option<i64> = None;
        for series in request {
            let label = |name: &str| {
                series
                    .labels
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or("", |(_, v)| v.as_str())
            };
            let takers: Vec<_> = self
                .plan
                .aggregations
                .iter()
                .filter(|agg| {
                    label("__name__") == agg.metric
                        && agg.matchers.iter().all(|(k, v)| label(k) == v)
                })
                .collect();
            for &(ts, v) in &series.samples {
                if !v.is_finite() {
                    if v.to_bits() == STALE_NAN_BITS {
                        out.counts.stale += 1;
                    } else {
                        out.counts.rejected += 1;
                    }
                    continue;
                }
                if takers.is_empty() {
                    out.counts.unrouted += 1;
                    continue;
                }
                newest = newest.max(Some(ts));
                for agg in &takers {
                    let group: Vec<(String, String)> = agg
                        .group_by
                        .iter()
                        .filter(|g| !label(g).is_empty())
                        .map(|g| (g.clone(), label(g).to_string()))
                        .collect();
                    let width = agg.window_secs as i64 * 1000;
                    let start = ts.div_euclid(width) * width;
                    if start + width <= out.watermark {
                        out.counts.late += 1;
                        continue;
                    }
                    out.counts.accepted += 1;
                    out.arrived
                        .entry((agg.id.clone(), group, start))
                        .or_default()
                        .push(v);
                }
            }
        }
        if let Some(n) = newest {
            out.watermark = out.watermark.max(n - self.plan.lateness_secs as i64 * 1000);
        }
    }
}

impl Outcome {
    /// Every pane's values, sorted ascending (`f64::total_cmp`): the exact quantiles.
    pub fn sorted(&self) -> BTreeMap<PaneKey, Vec<f64>> {
        let mut panes = self.arrived.clone();
        for values in panes.values_mut() {
            values.sort_by(f64::total_cmp);
        }
        panes
    }
}

/// Every pane's values, sorted ascending (`f64::total_cmp`).
pub fn panes(requests: &[Vec<Series>], plan: &Plan) -> BTreeMap<PaneKey, Vec<f64>> {
    run(requests, plan).sorted()
}

/// A remote-write request body as sent (snappy block, then protobuf),
/// decoded for [`run`] by the real software: the `snap` crate and `prost` on
/// the protocol's messages.
pub fn decode_body(body: &[u8]) -> anyhow::Result<Vec<Series>> {
    use prost::Message;
    let raw = snap::raw::Decoder::new().decompress_vec(body)?;
    let request = crate::ingest::wire::WriteRequest::decode(&raw[..])?;
    Ok(request
        .timeseries
        .into_iter()
        .map(|ts| Series {
            labels: ts.labels.into_iter().map(|l| (l.name, l.value)).collect(),
            samples: ts.samples.iter().map(|s| (s.timestamp, s.value)).collect(),
        })
        .collect())
}

/// The answer to `/api/v1/quantiles?agg=ID` for aggregation `agg` of the
/// plan, as JSON: its last closed window (the newest whose end the watermark
/// reached; every window once `flushed`), each group's labels, count and
/// quantiles — those of a `sketches_ddsketch::DDSketch` (the crate, not the
/// pipeline's sketches) fed the pane's values as they arrived, with the
/// aggregation's α, room for every key of the normal f64 range (so it never
/// collapses its lowest bins: the receiver's promise) and a zero
/// bucket of `±0` and the subnormals. Groups are ordered by their labels as a
/// sorted map.
pub fn answer(outcome: &Outcome, plan: &Plan, agg: usize, flushed: bool) -> serde_json::Value {
    use serde_json::{json, Map, Value};
    let agg = &plan.aggregations[agg];
    let width = agg.window_secs as i64 * 1000;
    let closed = |start: i64| flushed || start + width <= outcome.watermark;
    let window = outcome
        .arrived
        .keys()
        .filter(|(id, _, start)| *id == agg.id && closed(*start))
        .map(|(_, _, start)| *start)
        .max();
    let mut groups: Vec<(BTreeMap<&str, &str>, &Vec<f64>)> = outcome
        .arrived
        .iter()
        .filter(|((id, _, start), _)| *id == agg.id && Some(*start) == window)
        .map(|((_, group, _), values)| {
            let labels = group
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            (labels, values)
        })
        .collect();
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(labels, values)| {
            let mut sketch = sketches_ddsketch::DDSketch::new(uncollapsed(agg.relative_accuracy));
            values.iter().for_each(|&v| sketch.add(v));
            let quantiles: Map<String, Value> = agg
                .quantiles
                .iter()
                .map(|&q| {
                    let v = sketch.quantile(q).ok().flatten().unwrap_or(f64::NAN);
                    (q.to_string(), json!(v))
                })
                .collect();
            json!({"labels": labels, "count": values.len(), "quantiles": quantiles})
        })
        .collect();
    json!({"aggregation": agg.id, "window_start_ms": window, "groups": groups})
}

/// The crate's configuration at accuracy `alpha` with no bin limit in reach:
/// `max_num_bins` is the key span from the smallest normal f64 to the largest,
/// computed here from the crate's own key function, and values up to the
/// largest subnormal count as zeros.
fn uncollapsed(alpha: f64) -> sketches_ddsketch::Config {
    let largest_subnormal = f64::from_bits((1 << 52) - 1);
    let keys = sketches_ddsketch::Config::new(alpha, 1, largest_subnormal);
    let span = i64::from(keys.key(f64::MAX)) - i64::from(keys.key(f64::MIN_POSITIVE)) + 1;
    sketches_ddsketch::Config::new(alpha, span as u32, largest_subnormal)
}

/// [`answer`] for every aggregation, in plan order (what `query_all` gives).
pub fn answers(outcome: &Outcome, plan: &Plan, flushed: bool) -> serde_json::Value {
    (0..plan.aggregations.len())
        .map(|a| answer(outcome, plan, a, flushed))
        .collect()
}
