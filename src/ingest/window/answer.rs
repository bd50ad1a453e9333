//! A window's answer: the groups in answer order, a window and its panes as
//! a query reads them, the JSON a query answers with, and the answer's types.

use super::{OpenWindow, WindowBins};
use crate::ingest::bins::PaneBins;
use crate::ingest::groups::AggGroups;
use crate::ingest::plan::Aggregation;
use crate::ingest::sketch::PaneSketch;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use sketches_ddsketch::Config;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// How many groups ahead of its answer a queried pane's bins are prefetched.
const ANSWER_PREFETCH_AHEAD: usize = 4;

/// Every group in the order a query answers them (by their labels as a map),
/// each with the start of its JSON object up to its count; rebuilt when the
/// groups changed since.
#[derive(Default)]
pub(super) struct QueryOrder {
    /// The groups' version this was built at (`None`: never built).
    version: Option<u64>,
    /// Group ids in answer order.
    sorted: Vec<u32>,
    /// Per group id, back to back: `{"labels":{…},"count":`.
    heads: Vec<u8>,
    /// Where each group id's head ends in `heads`.
    head_ends: Vec<usize>,
}

impl QueryOrder {
    /// Group `gid`'s `{"labels":{…},"count":`.
    fn head(&self, gid: u32) -> &[u8] {
        let gid = gid as usize;
        let start = if gid == 0 { 0 } else { self.head_ends[gid - 1] };
        &self.heads[start..self.head_ends[gid]]
    }
}

/// A window as a query reads it.
#[derive(Clone, Copy)]
pub(super) enum View<'a> {
    /// One lane's open window.
    Open(&'a OpenWindow),
    /// A closed window, or lanes' open windows merged.
    Bins(&'a WindowBins),
}

/// A pane as a query reads it.
pub(super) enum PaneRef<'a> {
    /// An open pane and its refused samples.
    Sketch(&'a PaneSketch, u64),
    Bins(&'a PaneBins),
}

impl PaneRef<'_> {
    pub(super) fn count(&self) -> u64 {
        match self {
            PaneRef::Sketch(p, _) => p.count(),
            PaneRef::Bins(b) => b.count(),
        }
    }

    pub(super) fn dropped(&self) -> u64 {
        match self {
            PaneRef::Sketch(_, d) => *d,
            PaneRef::Bins(b) => b.dropped,
        }
    }

    pub(super) fn quantiles_into(&self, config: &Config, qs: &[f64], out: &mut Vec<f64>) {
        match self {
            PaneRef::Sketch(p, _) => p.quantiles_into(qs, out),
            PaneRef::Bins(b) => b.quantiles_into(config, qs, out),
        }
    }
}

impl<'a> View<'a> {
    pub(super) fn dropped(self) -> u64 {
        match self {
            View::Open(w) => w.dropped,
            View::Bins(w) => w.dropped,
        }
    }

    pub(super) fn pane(self, gid: u32) -> Option<PaneRef<'a>> {
        match self {
            View::Open(w) => {
                let pane = w.panes.get(gid as usize)?.as_ref()?;
                Some(PaneRef::Sketch(
                    pane,
                    w.group_dropped.get(&gid).copied().unwrap_or(0),
                ))
            }
            View::Bins(w) => w.pane(gid).map(PaneRef::Bins),
        }
    }

    /// Every pane with its group id, ascending (nothing collected: the
    /// query floor's scan walks them).
    pub(super) fn panes(self) -> impl Iterator<Item = (u32, PaneRef<'a>)> + 'a {
        let (open, bins) = match self {
            View::Open(w) => (Some(w), None),
            View::Bins(w) => (None, Some(w)),
        };
        let open = open.into_iter().flat_map(|w| {
            (0..w.panes.len() as u32).filter_map(move |gid| Some((gid, View::Open(w).pane(gid)?)))
        });
        let bins = bins
            .into_iter()
            .flat_map(|w| w.panes.iter().map(|(gid, p)| (*gid, PaneRef::Bins(p))));
        open.chain(bins)
    }
}

/// How an accumulator's answers are made: from its aggregation (id and
/// quantiles), its panes' sketch configuration, and its groups' answer order.
pub(super) struct Answers<'a> {
    pub(super) agg: &'a Aggregation,
    pub(super) config: &'a Config,
    pub(super) order: &'a Mutex<QueryOrder>,
}

impl Answers<'_> {
    /// The query's JSON (no `QueryResult`, no owned labels, the quantiles in
    /// one scan per pane; the group order and each group's labels as JSON
    /// are kept across queries), appended to `out`.
    pub(super) fn encode(
        &self,
        start: Option<i64>,
        view: Option<View<'_>>,
        groups: &AggGroups,
        out: &mut Vec<u8>,
    ) {
        out.extend_from_slice(b"{\"aggregation\":");
        json_string(out, &self.agg.id);
        out.extend_from_slice(b",\"window_start_ms\":");
        match start {
            Some(s) => out.extend_from_slice(itoa::Buffer::new().format(s).as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"groups\":[");
        let mut ints = itoa::Buffer::new();
        if let Some(view) = view {
            let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
            if order.version != Some(groups.version) {
                *order = query_order_now(groups);
            }
            // Each quantile's key, as `Quantiles` writes it, once, with what
            // comes before its value (the object's opening before the first,
            // a comma before the others, a colon after each): a group's
            // answer is then its head, its count and a piece per quantile.
            const OPENING: &[u8] = b",\"quantiles\":{";
            let keys: Vec<Vec<u8>> = self
                .agg
                .quantiles
                .iter()
                .enumerate()
                .map(|(j, q)| {
                    let mut key = if j == 0 { OPENING.to_vec() } else { vec![b','] };
                    json_string(&mut key, &q.to_string());
                    key.push(b':');
                    key
                })
                .collect();
            let mut values = Vec::with_capacity(keys.len());
            let mut first = true;
            for (i, &gid) in order.sorted.iter().enumerate() {
                // A closed window's bins a few groups on are asked for now,
                // so that their cache misses overlap the answers before them.
                if let View::Bins(w) = view {
                    if let Some(pane) = order
                        .sorted
                        .get(i + ANSWER_PREFETCH_AHEAD)
                        .and_then(|&ahead| w.pane(ahead))
                    {
                        pane.prefetch();
                    }
                }
                let Some(pane) = view.pane(gid) else {
                    continue;
                };
                if !first {
                    out.push(b',');
                }
                first = false;
                out.extend_from_slice(order.head(gid));
                out.extend_from_slice(ints.format(pane.count()).as_bytes());
                if pane.dropped() > 0 {
                    out.extend_from_slice(b",\"dropped\":");
                    out.extend_from_slice(ints.format(pane.dropped()).as_bytes());
                }
                if keys.is_empty() {
                    out.extend_from_slice(OPENING);
                }
                values.clear();
                pane.quantiles_into(self.config, &self.agg.quantiles, &mut values);
                for (key, v) in keys.iter().zip(&values) {
                    out.extend_from_slice(key);
                    // serde_json's own float form (`null` when not finite).
                    serde_json::to_writer(&mut *out, v).expect("a float serializes into a Vec");
                }
                out.extend_from_slice(b"}}");
            }
        }
        out.push(b']');
        if let Some(dropped) = view.map(View::dropped).filter(|&d| d > 0) {
            out.extend_from_slice(b",\"dropped\":");
            out.extend_from_slice(ints.format(dropped).as_bytes());
        }
        out.push(b'}');
    }

    /// The [`QueryResult`] of a window (`view`) starting at `start`.
    pub(super) fn result(
        &self,
        start: Option<i64>,
        view: Option<View<'_>>,
        groups: &AggGroups,
    ) -> QueryResult {
        let mut results = Vec::new();
        for (gid, pane) in view.into_iter().flat_map(View::panes) {
            let mut values = Vec::new();
            pane.quantiles_into(self.config, &self.agg.quantiles, &mut values);
            results.push(GroupResult {
                labels: groups.labels(gid).into_iter().collect(),
                count: pane.count(),
                dropped: pane.dropped(),
                quantiles: Quantiles(self.agg.quantiles.iter().copied().zip(values).collect()),
            });
        }
        results.sort_by(|a, b| a.labels.cmp(&b.labels));
        QueryResult {
            aggregation: self.agg.id.clone(),
            window_start_ms: start,
            groups: results,
            dropped: view.map_or(0, View::dropped),
        }
    }

    /// Each pane's [`PaneReport`] of a window (`view`) starting at `start`, onto `out`.
    pub(super) fn reports(
        &self,
        view: View<'_>,
        start: i64,
        closed: bool,
        groups: &AggGroups,
        out: &mut Vec<PaneReport>,
    ) {
        for (gid, pane) in view.panes() {
            let mut values = Vec::new();
            pane.quantiles_into(self.config, &self.agg.quantiles, &mut values);
            out.push(PaneReport {
                aggregation: self.agg.id.clone(),
                group: groups.labels(gid),
                window_start_ms: start,
                closed,
                count: pane.count(),
                dropped: pane.dropped(),
                quantile_bits: values
                    .iter()
                    .map(|v| (!v.is_nan()).then_some(v.to_bits()))
                    .collect(),
            });
        }
    }
}

/// Every group's answer order and JSON head, computed afresh: every group's
/// label pairs sorted by name in one buffer (no map or head allocated per
/// group: an answer may hold a million groups), their values read from the
/// groups' keys into one buffer too.
fn query_order_now(groups: &AggGroups) -> QueryOrder {
    let bound = groups.id_bound();
    // (name, where the value is in `values`).
    let mut spans: Vec<(&str, std::ops::Range<usize>)> = Vec::new();
    let mut values = String::new();
    let mut pair_ends: Vec<usize> = Vec::with_capacity(bound);
    for gid in 0..bound as u32 {
        let start = spans.len();
        groups.for_each_label(gid, |name, value| {
            let at = values.len();
            // (Lossy as a group's labels always were; validated labels are UTF-8.)
            values.push_str(&String::from_utf8_lossy(value));
            spans.push((name, at..values.len()));
        });
        // By name, as a map of them orders them (names are distinct).
        spans[start..].sort_unstable_by(|a, b| a.0.cmp(b.0));
        pair_ends.push(spans.len());
    }
    let pairs: Vec<(&str, &str)> = spans
        .iter()
        .map(|(name, range)| (*name, &values[range.clone()]))
        .collect();
    let labels = |gid: u32| {
        let gid = gid as usize;
        let start = if gid == 0 { 0 } else { pair_ends[gid - 1] };
        &pairs[start..pair_ends[gid]]
    };
    let mut sorted: Vec<u32> = (0..bound as u32)
        .filter(|&gid| groups.get(gid).is_some())
        .collect();
    // Stable, as `query`'s sort of the present groups in id order; slices of
    // name-sorted pairs compare as the maps of them do.
    sorted.sort_by(|&a, &b| labels(a).cmp(labels(b)));
    let (mut heads, mut head_ends) = (Vec::new(), Vec::with_capacity(bound));
    for gid in 0..bound as u32 {
        heads.extend_from_slice(b"{\"labels\":{");
        for (j, (k, v)) in labels(gid).iter().enumerate() {
            if j > 0 {
                heads.push(b',');
            }
            json_string(&mut heads, k);
            heads.push(b':');
            json_string(&mut heads, v);
        }
        heads.extend_from_slice(b"},\"count\":");
        head_ends.push(heads.len());
    }
    QueryOrder {
        version: Some(groups.version),
        sorted,
        heads,
        head_ends,
    }
}

/// `s` as a JSON string, as `serde_json` writes it. Most label names and
/// values need no escape (`serde_json` escapes `"`, `\` and bytes below
/// 0x20, nothing else): those are quoted as they are, without its writer.
fn json_string(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    serde_json::to_writer(out, s).expect("a string serializes into a Vec");
}

/// One pane's outcome, exactly (quantiles as bits).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PaneReport {
    pub aggregation: String,
    pub group: Vec<(String, String)>,
    pub window_start_ms: i64,
    pub closed: bool,
    pub count: u64,
    /// Samples of the group refused past a limit while it had this pane.
    pub dropped: u64,
    pub quantile_bits: Vec<Option<u64>>,
}

/// The answer to `/api/v1/quantiles`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueryResult {
    pub aggregation: String,
    pub window_start_ms: Option<i64>,
    pub groups: Vec<GroupResult>,
    /// Samples of this window refused past a limit for groups not listed
    /// (they got no pane); in the JSON only when not 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub dropped: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GroupResult {
    pub labels: BTreeMap<String, String>,
    /// Values in the group's pane.
    pub count: u64,
    /// The group's samples of this window refused past a limit (not in
    /// `count`, nor in the quantiles); in the JSON only when not 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub dropped: u64,
    pub quantiles: Quantiles,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Quantile → value, serialized as a JSON object in plan order (`{"0.5": …}`).
#[derive(Clone, Debug, PartialEq)]
pub struct Quantiles(pub Vec<(f64, f64)>);

impl Serialize for Quantiles {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (q, v) in &self.0 {
            map.serialize_entry(&q.to_string(), v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A string quoted as it is, or escaped, is what `serde_json` writes.
        #[test]
        fn json_strings_are_serde_jsons(chars in proptest::collection::vec(prop_oneof![
            Just('"'), Just('\\'), Just('\n'), Just('\u{1}'), Just('\u{1f}'), Just('\u{7f}'),
            Just('é'), any::<char>()], 0..40)) {
            let s: String = chars.into_iter().collect();
            let mut ours = Vec::new();
            json_string(&mut ours, &s);
            prop_assert_eq!(ours, serde_json::to_vec(&s).unwrap());
        }
    }
}
