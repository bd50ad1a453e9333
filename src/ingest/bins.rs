//! A pane's bins, out of the receiver and back: what N receivers write to a
//! store (the lab's ClickHouse cluster, `experiments/cluster/`) and how their
//! rows merge into the answer one receiver gives.
//!
//! A pane's sketch is its bins — per sign, bin key → count, the keys those of
//! [`sketches_ddsketch::Config::key`] — plus the count of values too small to
//! key (`|v| <= min_value`, the zero bin), the exact min and max. The bins of
//! one pane fed every sample are the bins of N panes each fed a part, added
//! key by key ([`PaneBins::merge`]: a sum of counts, the zero counts summed,
//! the min of the mins and the max of the maxes — what `GROUP BY … sum(count)`,
//! `min(min)`, `max(max)` compute in SQL); integer sums and min/max do not
//! depend on the order they are taken in. A sketch rebuilt from merged bins
//! ([`PaneBins::to_sketch`]) adds each key's count as one add of that many,
//! which leaves the same store as the adds of one pane fed everything (the
//! store ends the same for any order of adds: `sketch.rs`), so every quantile
//! is that pane's, bit for bit. The exception is that of the lanes
//! ([`super::lanes`]): of two equal extremes `0.0` and `-0.0`, the one kept as
//! min or max (q = 0 or 1) may differ in sign.

use super::plan::Aggregation;
use super::seams::SketchUpdate;
use super::sketch::{BulkSketch, PaneSketch};
use super::window::{Accumulator, Budget, Capacity, Stats};
use std::collections::BTreeMap;

/// One pane's bins (see the module doc). Keys ascend in each store; no count is 0.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PaneBins {
    /// Values above `min_value`: (key, count).
    pub positive: Vec<(i32, u64)>,
    /// Values below `-min_value`, keyed by their magnitude: (key, count).
    pub negative: Vec<(i32, u64)>,
    /// Values with `|v| <= min_value`.
    pub zero_count: u64,
    /// The exact extremes (`+inf` and `-inf` when empty).
    pub min: f64,
    pub max: f64,
}

impl PaneBins {
    /// Every value counted.
    pub fn count(&self) -> u64 {
        let sum = |bins: &[(i32, u64)]| bins.iter().map(|&(_, n)| n).sum::<u64>();
        sum(&self.positive) + sum(&self.negative) + self.zero_count
    }

    /// Adds `other`'s bins, as the cluster's SQL adds rows of one group.
    pub fn merge(&mut self, other: &PaneBins) {
        merge_store(&mut self.positive, &other.positive);
        merge_store(&mut self.negative, &other.negative);
        self.zero_count += other.zero_count;
        if other.min < self.min {
            self.min = other.min;
        }
        if self.max < other.max {
            self.max = other.max;
        }
    }

    /// The sketch these bins are, for queries (the `bulk-sketch` seam's, whose
    /// quantiles are the reference's bit for bit).
    pub fn to_sketch(&self, config: sketches_ddsketch::Config) -> PaneSketch {
        PaneSketch::Bulk(BulkSketch::from_bins(config, self))
    }
}

fn merge_store(into: &mut Vec<(i32, u64)>, other: &[(i32, u64)]) {
    let mut sum: BTreeMap<i32, u64> = into.iter().copied().collect();
    for &(key, n) in other {
        *sum.entry(key).or_default() += n;
    }
    *into = sum.into_iter().filter(|&(_, n)| n > 0).collect();
}

impl PaneSketch {
    /// This pane's bins.
    pub fn bins(&self) -> PaneBins {
        match self {
            PaneSketch::Bulk(s) => s.bins(),
            PaneSketch::Reference(s) => reference_bins(s),
        }
    }
}

/// The bins of the crate's sketch, read from its own Java-compatible
/// encoding (its stores are private; every count there is exact below 2^53).
fn reference_bins(sketch: &sketches_ddsketch::DDSketch) -> PaneBins {
    let mut bins = PaneBins {
        min: sketch.min().unwrap_or(f64::INFINITY),
        max: sketch.max().unwrap_or(f64::NEG_INFINITY),
        ..PaneBins::default()
    };
    java::read_bins(&sketch.to_java_bytes(), &mut bins)
        .expect("the crate's own encoding of a sketch reads back");
    bins
}

/// What [`reference_bins`] needs of the format `DDSketch::to_java_bytes`
/// writes (DataDog's sketches-java layout): a run of entries, each a flag
/// byte (low 2 bits: what it is; high 6 bits: how it is laid out) and its
/// payload. Summary entries (count, min, max, sum: 8 bytes or a var-double)
/// are skipped: the crate's own accessors give those.
mod java {
    use super::PaneBins;

    const FEATURES: u8 = 0;
    const POSITIVE: u8 = 1;
    const MAPPING: u8 = 2;
    const NEGATIVE: u8 = 3;
    /// The features' subflags: the zero count and the count are var-doubles; sum, min, max 8 bytes.
    const ZERO_COUNT: u8 = 1;
    const COUNT: u8 = 0x28;
    /// A store's layout the crate writes: the number of bins, then per bin the
    /// key's delta from the previous (zigzag varint) and the count (var-double).
    const DELTAS_AND_COUNTS: u8 = 1;

    pub fn read_bins(mut input: &[u8], bins: &mut PaneBins) -> Option<()> {
        let input = &mut input;
        while let Some(flag) = byte(input) {
            let (kind, sub) = (flag & 3, flag >> 2);
            match kind {
                FEATURES if sub == ZERO_COUNT => bins.zero_count = var_double(input)? as u64,
                FEATURES if sub == COUNT => {
                    var_double(input)?;
                }
                FEATURES => skip(input, 8)?,
                MAPPING => skip(input, 16)?,
                POSITIVE | NEGATIVE if sub == DELTAS_AND_COUNTS => {
                    let n = varint(input)?;
                    let mut key = 0i64;
                    let store = if kind == POSITIVE {
                        &mut bins.positive
                    } else {
                        &mut bins.negative
                    };
                    for _ in 0..n {
                        let zigzag = varint(input)?;
                        key += (zigzag >> 1) as i64 ^ -((zigzag & 1) as i64);
                        store.push((i32::try_from(key).ok()?, var_double(input)? as u64));
                    }
                }
                _ => return None,
            }
        }
        Some(())
    }

    fn byte(input: &mut &[u8]) -> Option<u8> {
        let (&b, rest) = input.split_first()?;
        *input = rest;
        Some(b)
    }

    fn skip(input: &mut &[u8], n: usize) -> Option<()> {
        *input = input.get(n..)?;
        Some(())
    }

    /// Unsigned LEB128, at most 9 bytes (the 9th taken whole).
    fn varint(input: &mut &[u8]) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..=56).step_by(7) {
            let b = byte(input)?;
            if b < 0x80 || shift == 56 {
                return Some(value | (u64::from(b) << shift));
            }
            value |= u64::from(b & 0x7f) << shift;
        }
        None
    }

    /// A var-double: the bits of `v + 1` minus those of `1.0`, rotated left
    /// by 6, sent 7 bits at a time from the top (at most 9 bytes, the 9th whole).
    fn var_double(input: &mut &[u8]) -> Option<f64> {
        let mut bits = 0u64;
        let mut shift = 57i32;
        loop {
            let b = byte(input)?;
            if shift == 1 {
                bits |= u64::from(b);
                break;
            }
            if b < 0x80 {
                bits |= u64::from(b) << shift;
                break;
            }
            bits |= u64::from(b & 0x7f) << shift;
            shift -= 7;
        }
        let one = 1.0f64.to_bits();
        Some(f64::from_bits(bits.rotate_right(6).wrapping_add(one)) - 1.0)
    }
}

/// The answer one receiver gives to `GET /api/v1/quantiles?agg=ID&window=START`
/// for a window whose groups' panes have these bins (group key as the
/// receiver writes it → bins): the same bytes, made by the same encoder.
pub fn encode_answer(
    aggregation: &Aggregation,
    start: i64,
    groups: impl IntoIterator<Item = (Vec<u8>, PaneBins)>,
    out: &mut Vec<u8>,
) {
    let config = aggregation.sketch_config();
    let mut acc = Accumulator::new(aggregation.clone(), 1, SketchUpdate::Runs);
    let (mut next, mut budget, mut stats) = (0, Budget::new(Capacity::UNBOUNDED), Stats::default());
    for (key, bins) in groups {
        if bins.count() == 0 {
            continue;
        }
        let gid = acc.intern(&key, &mut next, &mut budget);
        acc.absorb(start, gid, &bins.to_sketch(config), &mut stats, &mut budget);
    }
    acc.query_json(Some(start), out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sketches_ddsketch::Config;

    fn value() -> impl Strategy<Value = f64> {
        prop_oneof![
            4 => 1e-12f64..1e12,
            2 => -1e6f64..-1e-6,
            1 => Just(0.0),
            1 => -1e-9f64..1e-9,
            1 => prop::num::f64::NORMAL,
        ]
    }

    fn fed(config: Config, seam: SketchUpdate, values: &[f64]) -> PaneSketch {
        let mut pane = PaneSketch::new(config, seam);
        pane.add_slice(values);
        pane
    }

    /// Equal bins, the extremes by value (of `0.0` and `-0.0` either may be kept).
    fn same_bins(a: &PaneBins, b: &PaneBins) -> bool {
        a.positive == b.positive
            && a.negative == b.negative
            && a.zero_count == b.zero_count
            && a.min == b.min
            && a.max == b.max
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Item 4 of issue 25: any split of a pane's samples over N receivers,
        /// each pane's bins written as rows and summed as the SQL sums them,
        /// rebuilt, is the pane one receiver makes of every sample: the same
        /// bins, every quantile bit for bit (q = 0 and 1 by value), for both
        /// sketch seams and through the lowest bins' collapse.
        #[test]
        fn any_split_merged_as_the_sql_merges_is_the_single_pane(
            values in prop::collection::vec(value(), 0..300),
            receiver_of in prop::collection::vec(0usize..4, 300),
            receivers in 1usize..=4,
            limit in prop_oneof![Just(2048u32), 1u32..300],
        ) {
            let config = Config::new(0.02, limit, 1e-9);
            for seam in [SketchUpdate::PerSample, SketchUpdate::Runs] {
                let single = fed(config, seam, &values);
                let mut parts = vec![Vec::new(); receivers];
                for (v, r) in values.iter().zip(&receiver_of) {
                    parts[r % receivers].push(*v);
                }
                let mut merged = PaneBins { min: f64::INFINITY, max: f64::NEG_INFINITY, ..PaneBins::default() };
                for part in &parts {
                    merged.merge(&fed(config, seam, part).bins());
                }
                prop_assert_eq!(merged.count(), single.count());
                let rebuilt = merged.to_sketch(config);
                prop_assert!(same_bins(&rebuilt.bins(), &single.bins()), "{:?} vs {:?}", rebuilt.bins(), single.bins());
                for i in 1..100 {
                    let q = i as f64 / 100.0;
                    prop_assert_eq!(rebuilt.quantile(q).map(f64::to_bits), single.quantile(q).map(f64::to_bits), "q = {}", q);
                }
                prop_assert_eq!(rebuilt.quantile(0.0), single.quantile(0.0));
                prop_assert_eq!(rebuilt.quantile(1.0), single.quantile(1.0));
            }
        }

        /// The crate's sketch read through its encoding has the bulk seam's bins.
        #[test]
        fn reference_bins_are_the_bulk_seams(values in prop::collection::vec(value(), 0..300), limit in prop_oneof![Just(2048u32), 1u32..300]) {
            let config = Config::new(0.01, limit, 1e-9);
            let reference = fed(config, SketchUpdate::PerSample, &values).bins();
            let bulk = fed(config, SketchUpdate::Runs, &values).bins();
            prop_assert!(same_bins(&reference, &bulk), "{:?} vs {:?}", reference, bulk);
        }
    }

    /// The answer made from a window's bins, whole or split over three
    /// ingesters by series, is the bytes the ingester itself answers.
    #[test]
    fn encoded_answer_is_the_receivers_bytes() {
        use crate::ingest::feed::FeedWorkload;
        use crate::ingest::pipeline::Ingester;
        use crate::ingest::plan::Plan;
        use crate::strategy::StrategySet;
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
            let starts: Vec<i64> = single.accumulators()[0].closed_starts().collect();
            assert_eq!(starts.len(), 3);
            for &start in &starts {
                let mut want = Vec::new();
                assert!(single.query_json("data", Some(start), &mut want));
                let mut groups: BTreeMap<Vec<u8>, PaneBins> = BTreeMap::new();
                for ingester in &split {
                    for (key, pane) in ingester.accumulators()[0].closed_panes(start).unwrap() {
                        groups
                            .entry(key.to_vec())
                            .or_insert_with(|| PaneBins {
                                min: f64::INFINITY,
                                max: f64::NEG_INFINITY,
                                ..PaneBins::default()
                            })
                            .merge(&pane.bins());
                    }
                }
                let mut got = Vec::new();
                encode_answer(agg, start, groups, &mut got);
                assert_eq!(
                    String::from_utf8(got).unwrap(),
                    String::from_utf8(want).unwrap()
                );
            }
            // A window nobody holds answers as the receiver answers it.
            let (mut got, mut want) = (Vec::new(), Vec::new());
            encode_answer(agg, 0, Vec::new(), &mut got);
            assert!(single.query_json("data", Some(0), &mut want));
            assert_eq!(got, want);
        }
    }
}
