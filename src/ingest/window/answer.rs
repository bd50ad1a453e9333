//! A window's answer: the groups in answer order, a window and its panes as
//! a query reads them, the JSON a query answers with, and the answer's types.

use super::{OpenWindow, WindowBins};
use crate::ingest::bins::PaneBins;
use crate::ingest::groups::AggGroups;
use crate::ingest::sketch::PaneSketch;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use sketches_ddsketch::Config;
use std::collections::BTreeMap;

/// How many groups ahead of its answer a queried pane's bins are prefetched.
pub(super) const ANSWER_PREFETCH_AHEAD: usize = 4;

/// Every group in the order a query answers them (by their labels as a map),
/// each with the start of its JSON object up to its count; rebuilt when the
/// groups changed since.
#[derive(Default)]
pub(super) struct QueryOrder {
    /// The groups' version this was built at (`None`: never built).
    pub(super) version: Option<u64>,
    /// Group ids in answer order.
    pub(super) sorted: Vec<u32>,
    /// Per group id, back to back: `{"labels":{…},"count":`.
    heads: Vec<u8>,
    /// Where each group id's head ends in `heads`.
    head_ends: Vec<usize>,
}

impl QueryOrder {
    /// Group `gid`'s `{"labels":{…},"count":`.
    pub(super) fn head(&self, gid: u32) -> &[u8] {
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

/// Every group's answer order and JSON head, computed afresh: every group's
/// label pairs sorted by name in one buffer (a map per group and a head
/// allocated per group took 1.3 s at a million groups), their values read
/// from the groups' keys into one buffer too.
pub(super) fn query_order_now(groups: &AggGroups) -> QueryOrder {
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
pub(super) fn json_string(out: &mut Vec<u8>, s: &str) {
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
