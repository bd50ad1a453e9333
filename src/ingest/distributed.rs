//! N receivers, one answer: what each hands to a shared store (the lab's
//! ClickHouse cluster, `experiments/cluster/`), and the answer made from what
//! they all wrote.
//!
//! Each receiver holds some of a group's series (Prometheus's `hashmod`
//! spreads series, not groups), so each closes its own part of a window's
//! pane, hands it out as [`PaneBins`] ([`super::bins`]) and writes it as one
//! row ([`PaneRows`]): per sign its bins' keys and counts as two arrays, the
//! zero count, min, max and samples refused. The receivers' rows of a group
//! are merged key by key — counts summed per (sign, key), zero counts
//! summed, the least min and the greatest max, integer sums that no order
//! changes — which is [`PaneBins::merge`] of every receiver's part
//! ([`merge_as_rows`] does exactly that, the cluster's query calls it, and
//! the property test holds it to the single pane). The answer is then encoded by the
//! receiver's own encoder ([`encode_answer`]): the bytes of one receiver fed
//! every sample, except which of two equal extremes `0.0` and `-0.0` is kept
//! as min or max (as across lanes).

use super::bins::{Bins, PaneBins};
use super::budget::{Budget, Capacity};
use super::group_key::write_group_key;
use super::groups::GroupTable;
use super::plan::Aggregation;
use super::window::{Accumulator, WindowBins};
use crate::shared::seams::SketchUpdate;
use std::collections::BTreeMap;

/// A group's key (as the receiver interns it) from its labels as an answer
/// names them: the group-by labels' values in order, a missing one `""`.
pub fn group_key(aggregation: &Aggregation, labels: &BTreeMap<String, String>) -> Vec<u8> {
    let mut key = Vec::new();
    write_group_key(
        &mut key,
        aggregation
            .group_by
            .iter()
            .map(|name| labels.get(name).map_or("", String::as_str)),
    );
    key
}

/// One receiver's part of a group's pane as the row it writes: per sign,
/// (key, count) of each non-empty bin, keys ascending; the zero count, min,
/// max, and samples refused.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PaneRows {
    pub positive: Vec<(i32, u64)>,
    pub negative: Vec<(i32, u64)>,
    pub zero_count: u64,
    pub min: f64,
    pub max: f64,
    pub dropped: u64,
}

impl PaneRows {
    pub fn of(bins: &PaneBins) -> PaneRows {
        PaneRows {
            positive: bins.positive.iter().collect(),
            negative: bins.negative.iter().collect(),
            zero_count: bins.zero_count,
            min: bins.min,
            max: bins.max,
            dropped: bins.dropped,
        }
    }
}

/// The pane of every receiver's row of one group: the counts summed per
/// (sign, key), zero counts and refused samples summed, the least min and
/// the greatest max.
pub fn merge_as_rows<'a>(parts: impl IntoIterator<Item = &'a PaneRows>) -> PaneBins {
    let mut sums: BTreeMap<(i8, i32), u64> = BTreeMap::new();
    let mut merged = PaneBins::default();
    for part in parts {
        for (sign, bins) in [(1, &part.positive), (-1, &part.negative)] {
            for &(key, n) in bins {
                *sums.entry((sign, key)).or_default() += n;
            }
        }
        merged.zero_count += part.zero_count;
        merged.dropped += part.dropped;
        merged.min = merged.min.min(part.min);
        merged.max = merged.max.max(part.max);
    }
    let of_sign = |s: i8| {
        Bins::from_sorted(
            sums.range((s, i32::MIN)..=(s, i32::MAX))
                .map(|(&(_, k), &n)| (k, n)),
        )
    };
    merged.positive = of_sign(1);
    merged.negative = of_sign(-1);
    merged
}

/// The answer one receiver gives to `GET /api/v1/quantiles?agg=ID&window=START`
/// for window `start` whose groups (by key, as [`group_key`] writes it) have
/// these bins, `dropped` samples refused for groups with no pane: the same
/// bytes, made by the same encoder. No group and nothing dropped: the answer
/// for a window the receiver does not have (`"window_start_ms":null`).
pub fn encode_answer(
    aggregation: &Aggregation,
    start: i64,
    groups: impl IntoIterator<Item = (Vec<u8>, PaneBins)>,
    dropped: u64,
    out: &mut Vec<u8>,
) {
    let budget = Budget::new(Capacity::UNBOUNDED);
    let mut table = GroupTable::default();
    table.set_plan(1, std::slice::from_ref(aggregation), &[None], &budget);
    let mut panes: Vec<(u32, PaneBins)> = groups
        .into_iter()
        .filter(|(_, bins)| bins.count() > 0 || bins.dropped > 0)
        .map(|(key, bins)| (table.intern(0, &key, &budget).0, bins))
        .collect();
    panes.sort_by_key(|(gid, _)| *gid);
    let window = WindowBins {
        start,
        panes,
        dropped,
    };
    let acc = Accumulator::new(aggregation.clone(), 1, SketchUpdate::Runs);
    let has = !window.panes.is_empty() || dropped > 0;
    acc.encode_bins(has.then_some(&window), table.agg(0), out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::bins::sketch_config;
    use crate::ingest::sketch::PaneSketch;
    use proptest::prelude::*;

    fn value() -> impl Strategy<Value = f64> {
        prop_oneof![
            4 => 1e-12f64..1e12,
            2 => -1e6f64..-1e-6,
            1 => Just(0.0),
            1 => -1e-300f64..1e-300,
            1 => prop::num::f64::NORMAL,
        ]
    }

    fn fed(alpha: f64, seam: SketchUpdate, values: &[f64]) -> PaneBins {
        let mut pane = PaneSketch::new(sketch_config(alpha), seam);
        pane.add_slice(values);
        pane.to_bins()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any split of a group's samples over N receivers, each part
        /// written as its row and the rows merged as the cluster's query
        /// merges them, is the single pane's bins — counts, zero count, every
        /// quantile bit for bit (the extremes by value: of `0.0` and `-0.0`
        /// either may be kept), for both sketch seams, over the whole f64 range.
        #[test]
        fn any_split_merged_as_the_query_merges_is_the_single_pane(
            values in prop::collection::vec(value(), 0..300),
            receiver_of in prop::collection::vec(0usize..8, 300),
            receivers in 1usize..=8,
            alpha in prop_oneof![Just(0.01), 0.001f64..0.2],
        ) {
            for seam in [SketchUpdate::PerSample, SketchUpdate::Runs] {
                let single = fed(alpha, seam, &values);
                let mut parts = vec![Vec::new(); receivers];
                for (v, r) in values.iter().zip(&receiver_of) {
                    parts[r % receivers].push(*v);
                }
                let rows: Vec<PaneRows> = parts.iter().map(|p| PaneRows::of(&fed(alpha, seam, p))).collect();
                let merged = merge_as_rows(&rows);
                prop_assert_eq!(&merged.positive, &single.positive);
                prop_assert_eq!(&merged.negative, &single.negative);
                prop_assert_eq!(merged.zero_count, single.zero_count);
                prop_assert_eq!(merged.min, single.min);
                prop_assert_eq!(merged.max, single.max);
                let config = sketch_config(alpha);
                for i in 0..=100 {
                    let q = i as f64 / 100.0;
                    let (a, b) = (merged.quantile(&config, q), single.quantile(&config, q));
                    if i == 0 || i == 100 {
                        prop_assert_eq!(a, b);
                    } else {
                        prop_assert_eq!(a.map(f64::to_bits), b.map(f64::to_bits), "q = {}", q);
                    }
                }
            }
        }
    }

    /// The answer made from a window's bins, whole or split over three
    /// ingesters by request, is the bytes the ingester itself answers.
    #[test]
    fn encoded_answer_is_the_receivers_bytes() {
        use crate::ingest::feed::FeedWorkload;
        use crate::ingest::pipeline::Ingester;
        use crate::ingest::plan::Plan;
        use crate::shared::strategy::StrategySet;
        let workload = FeedWorkload {
            groups: 7,
            series_per_group: 5,
            samples_per_sec: 3,
            batch_rows: 11,
            ..FeedWorkload::seed(1_700_000_040_000)
        };
        let generator = workload.generator();
        let plan = Plan::default();
        let agg = &plan.aggregations[0];
        for strategies in [StrategySet::NONE, StrategySet::all()] {
            let mut single = Ingester::new(plan.clone(), strategies);
            let mut split: Vec<Ingester> = (0..3)
                .map(|_| Ingester::new(plan.clone(), strategies))
                .collect();
            for t in 0..150 {
                for (r, raw) in generator.tick_raw(t).iter().enumerate() {
                    single.handle_decoded(raw).unwrap();
                    split[r % 3].handle_decoded(raw).unwrap();
                }
            }
            single.flush();
            split.iter_mut().for_each(Ingester::flush);
            let windows = single.closed_bins("data").unwrap();
            assert_eq!(windows.len(), 3);
            for window in &windows {
                let mut want = Vec::new();
                assert!(single.query_json("data", Some(window.start), &mut want));
                let mut rows: BTreeMap<Vec<u8>, Vec<PaneRows>> = BTreeMap::new();
                let mut dropped = 0;
                for ingester in &split {
                    let part = ingester
                        .closed_bins("data")
                        .unwrap()
                        .into_iter()
                        .find(|w| w.start == window.start)
                        .unwrap();
                    dropped += part.dropped;
                    for (labels, bins) in &part.groups {
                        rows.entry(group_key(agg, labels))
                            .or_default()
                            .push(PaneRows::of(bins));
                    }
                }
                let groups = rows
                    .into_iter()
                    .map(|(key, parts)| (key, merge_as_rows(&parts)));
                let mut got = Vec::new();
                encode_answer(agg, window.start, groups, dropped, &mut got);
                assert_eq!(
                    String::from_utf8(got).unwrap(),
                    String::from_utf8(want).unwrap()
                );
            }
            // A window nobody holds answers as the receiver answers it.
            let (mut got, mut want) = (Vec::new(), Vec::new());
            encode_answer(agg, 0, Vec::new(), 0, &mut got);
            assert!(single.query_json("data", Some(0), &mut want));
            assert_eq!(got, want);
        }
    }
}
