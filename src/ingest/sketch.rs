//! The sketch-update seam: one pane of one (aggregation, group, window).
//!
//! The reference is `sketches_ddsketch::DDSketch`, fed one `add` per sample.
//! The `bulk-sketch` strategy is [`BulkSketch`]: it takes a slice of values and
//! keeps the same bins the crate would. Bin values come from the crate's own
//! `Config::value`; keys from `BulkSketch::key`, the operations of the crate's
//! `Config::key` with the floor done inline (the `key_equals_the_crates`
//! property test holds it to the crate's for any positive value). It mirrors the
//! crate's `CollapsingLowestDenseStore`: with a bin limit
//! `L`, keys are exact while `max_key - min_key + 1 <= L`; beyond that every key
//! below `max_key - L + 1` is counted in that lowest bin (which is what the
//! crate's store ends with for any order of adds). The quantile is the crate's:
//! rank `floor(q * (n - 1))` (0-based) into the key-ordered bins, negative
//! values first, then zeros (`|v| <= min_value`), then positive; `q = 0` and
//! `q = 1` give the exact min and max.

use crate::seams::SketchUpdate;
use sketches_ddsketch::{Config, DDSketch};

/// A pane's sketch: the crate's (reference) or ours (`bulk-sketch`).
#[derive(Clone)]
pub enum PaneSketch {
    Reference(Box<DDSketch>),
    Bulk(BulkSketch),
}

impl PaneSketch {
    pub fn new(config: Config, sketch: SketchUpdate) -> Self {
        match sketch {
            SketchUpdate::Runs => PaneSketch::Bulk(BulkSketch::new(config)),
            SketchUpdate::PerSample => PaneSketch::Reference(Box::new(DDSketch::new(config))),
        }
    }

    /// One value (the reference path).
    #[inline]
    pub fn add(&mut self, v: f64) {
        match self {
            PaneSketch::Reference(s) => s.add(v),
            PaneSketch::Bulk(s) => s.add_slice(std::slice::from_ref(&v)),
        }
    }

    /// A run of values, in order.
    pub fn add_slice(&mut self, values: &[f64]) {
        match self {
            PaneSketch::Reference(s) => values.iter().for_each(|&v| s.add(v)),
            PaneSketch::Bulk(s) => s.add_slice(values),
        }
    }

    pub fn count(&self) -> u64 {
        match self {
            PaneSketch::Reference(s) => s.count() as u64,
            PaneSketch::Bulk(s) => s.count(),
        }
    }

    /// The quantile `q` in [0, 1]; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        match self {
            PaneSketch::Reference(s) => s.quantile(q).ok().flatten(),
            PaneSketch::Bulk(s) => s.quantile(q),
        }
    }

    /// The quantiles `qs`, in order, onto `out`: what [`PaneSketch::quantile`]
    /// gives for each (NaN when empty), bit for bit — `bulk-sketch` finds them
    /// in one resumable scan of the bins ([`BulkSketch::quantiles_into`]).
    pub fn quantiles_into(&self, qs: &[f64], out: &mut Vec<f64>) {
        match self {
            PaneSketch::Reference(s) => out.extend(
                qs.iter()
                    .map(|&q| s.quantile(q).ok().flatten().unwrap_or(f64::NAN)),
            ),
            PaneSketch::Bulk(s) => s.quantiles_into(qs, out),
        }
    }

    /// Adds `other`'s values, as if they had been added here (two panes of
    /// one sketch seam). Bins, counts, min and max are those of one sketch fed
    /// both streams, so every quantile is, bit for bit — except that of two
    /// equal extremes (`0.0` and `-0.0`) the one kept as min or max is this
    /// pane's, where one sketch keeps the first it was fed.
    pub fn merge(&mut self, other: &PaneSketch) {
        match (self, other) {
            (PaneSketch::Reference(a), PaneSketch::Reference(b)) => a
                .merge(b)
                .expect("panes of one aggregation share their sketch config"),
            (PaneSketch::Bulk(a), PaneSketch::Bulk(b)) => a.merge(b),
            _ => unreachable!("panes of one aggregation share their sketch seam"),
        }
    }

    /// Bytes held by the bins (for the RSS estimate in self-metrics).
    pub fn bins_len(&self) -> usize {
        match self {
            PaneSketch::Reference(s) => s.length(),
            PaneSketch::Bulk(s) => s.positive.bins.len() + s.negative.bins.len(),
        }
    }
}

/// The `bulk-sketch` strategy's sketch: same bins as `DDSketch`, filled from slices.
#[derive(Clone, Debug)]
pub struct BulkSketch {
    config: Config,
    /// `ln(gamma)`, computed as the crate computes it.
    gamma_ln: f64,
    positive: BulkStore,
    negative: BulkStore,
    zero_count: u64,
    min: f64,
    max: f64,
}

impl BulkSketch {
    pub fn new(config: Config) -> Self {
        let limit = config.max_num_bins as i32;
        BulkSketch {
            config,
            gamma_ln: config.gamma.ln(),
            positive: BulkStore::new(limit),
            negative: BulkStore::new(limit),
            zero_count: 0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }

    /// Adds every value, in order (min/max keep the first of equal values, as the crate).
    pub fn add_slice(&mut self, values: &[f64]) {
        let min_possible = self.config.min_possible();
        let (mut min, mut max) = (self.min, self.max);
        for &v in values {
            if v > min_possible {
                self.positive.add(self.key(v));
            } else if v < -min_possible {
                self.negative.add(self.key(-v));
            } else {
                self.zero_count += 1;
            }
            if v < min {
                min = v;
            }
            if max < v {
                max = v;
            }
        }
        self.min = min;
        self.max = max;
    }

    /// See [`PaneSketch::merge`].
    pub fn merge(&mut self, other: &BulkSketch) {
        self.positive.merge(&other.positive);
        self.negative.merge(&other.negative);
        self.zero_count += other.zero_count;
        if other.min < self.min {
            self.min = other.min;
        }
        if self.max < other.max {
            self.max = other.max;
        }
    }

    /// `Config::key`, the same operations (`ln(v) / ln(gamma)`, floor, saturating
    /// cast), with the floor inline: `f64::floor` is a libm call on baseline x86-64.
    #[inline]
    fn key(&self, v: f64) -> i32 {
        let x = v.ln() / self.gamma_ln;
        let t = x as i32;
        if (t as f64) > x {
            t.saturating_sub(1)
        } else {
            t
        }
    }

    pub fn count(&self) -> u64 {
        self.positive.count + self.negative.count + self.zero_count
    }

    /// The crate's quantile, step for step.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if !(0.0..=1.0).contains(&q) || self.count() == 0 {
            return None;
        }
        if q == 0.0 {
            return Some(self.min);
        } else if q == 1.0 {
            return Some(self.max);
        }
        let rank = (q * (self.count() as f64 - 1.0)) as u64;
        let negative = self.negative.count;
        Some(if rank < negative {
            -self
                .config
                .value(self.negative.key_at_rank(negative - rank - 1))
        } else if rank < self.zero_count + negative {
            0.0
        } else {
            self.config
                .value(self.positive.key_at_rank(rank - self.zero_count - negative))
        })
    }
}

impl BulkSketch {
    /// [`BulkSketch::quantile`] of each of `qs` (NaN where `None`), onto `out`:
    /// the same rank and the same bin, found by one scan that resumes where
    /// the previous quantile stopped (ascending `qs` walk the bins once) and
    /// sums eight bins at a time until the rank is within them.
    pub fn quantiles_into(&self, qs: &[f64], out: &mut Vec<f64>) {
        let mut cursor = (0, 0);
        for &q in qs {
            let value = if !(0.0..=1.0).contains(&q) || self.count() == 0 {
                f64::NAN
            } else if q == 0.0 {
                self.min
            } else if q == 1.0 {
                self.max
            } else {
                let rank = (q * (self.count() as f64 - 1.0)) as u64;
                let negative = self.negative.count;
                if rank < negative {
                    -self
                        .config
                        .value(self.negative.key_at_rank(negative - rank - 1))
                } else if rank < self.zero_count + negative {
                    0.0
                } else {
                    let rank = rank - self.zero_count - negative;
                    self.config
                        .value(self.positive.key_at_rank_from(rank, &mut cursor))
                }
            };
            out.push(value);
        }
    }
}

/// Dense bins over `[lo, lo + bins.len())`, collapsing the lowest keys beyond `limit`.
#[derive(Clone, Debug)]
struct BulkStore {
    bins: Vec<u64>,
    /// The key of `bins[0]`; after a collapse also the floor every lower key lands in.
    lo: i32,
    count: u64,
    limit: i32,
}

impl BulkStore {
    fn new(limit: i32) -> Self {
        BulkStore {
            bins: Vec::new(),
            lo: 0,
            count: 0,
            limit,
        }
    }

    #[inline]
    fn add(&mut self, key: i32) {
        let idx = key.wrapping_sub(self.lo) as u32 as usize;
        if idx < self.bins.len() {
            self.bins[idx] += 1;
            self.count += 1;
        } else {
            self.add_outside(key, 1);
        }
    }

    /// `n` adds of `key`.
    fn add_n(&mut self, key: i32, n: u64) {
        let idx = key.wrapping_sub(self.lo) as u32 as usize;
        if idx < self.bins.len() {
            self.bins[idx] += n;
            self.count += n;
        } else {
            self.add_outside(key, n);
        }
    }

    /// Every key `other` counts, as if added here: the store ends the same for
    /// any order of adds, so this is the store of both streams, exactly.
    fn merge(&mut self, other: &BulkStore) {
        for (i, &n) in other.bins.iter().enumerate() {
            if n > 0 {
                self.add_n(other.lo + i as i32, n);
            }
        }
    }

    /// `n` adds of a key outside the bins: grow, collapsing the lowest keys if
    /// the range passes the limit.
    #[cold]
    fn add_outside(&mut self, key: i32, n: u64) {
        self.count += n;
        if self.bins.is_empty() {
            self.lo = key;
            self.bins.push(n);
            return;
        }
        let hi = self.lo + self.bins.len() as i32 - 1;
        let (new_lo, new_hi) = (key.min(self.lo), key.max(hi));
        if new_hi - new_lo < self.limit {
            if key < self.lo {
                let grow = (self.lo - key) as usize;
                self.bins.splice(0..0, std::iter::repeat_n(0, grow));
                self.lo = key;
                self.bins[0] += n;
            } else {
                self.bins.resize((key - self.lo) as usize + 1, 0);
                *self.bins.last_mut().expect("non-empty") += n;
            }
            return;
        }
        // Collapse: everything below `floor` is counted in `floor`.
        let floor = new_hi - self.limit + 1;
        if key > hi {
            self.bins.resize((key - self.lo) as usize + 1, 0);
        }
        if floor > self.lo {
            let cut = (floor - self.lo) as usize;
            let folded: u64 = self.bins.drain(..cut).sum();
            self.bins[0] += folded;
        } else {
            // A low key past the limit: the crate's lowest bin becomes `floor`.
            let grow = (self.lo - floor) as usize;
            self.bins.splice(0..0, std::iter::repeat_n(0, grow));
        }
        self.lo = floor;
        let idx = (key.max(self.lo) - self.lo) as usize;
        self.bins[idx] += n;
    }

    fn key_at_rank(&self, rank: u64) -> i32 {
        let mut n = 0;
        for (i, &c) in self.bins.iter().enumerate() {
            n += c;
            if n > rank {
                return self.lo + i as i32;
            }
        }
        self.lo + self.bins.len() as i32 - 1
    }

    /// [`BulkStore::key_at_rank`] from `cursor` = (a bin index, the count
    /// below it) when the rank is not below that count, else from the start;
    /// leaves the cursor at the bin found.
    fn key_at_rank_from(&self, rank: u64, cursor: &mut (usize, u64)) -> i32 {
        let (mut i, mut below) = if cursor.1 <= rank { *cursor } else { (0, 0) };
        while let Some(chunk) = self.bins.get(i..i + 8) {
            let sum: u64 = chunk.iter().sum();
            if below + sum > rank {
                break;
            }
            below += sum;
            i += 8;
        }
        while let Some(&c) = self.bins.get(i) {
            if below + c > rank {
                *cursor = (i, below);
                return self.lo + i as i32;
            }
            below += c;
            i += 1;
        }
        *cursor = (0, 0);
        self.lo + self.bins.len() as i32 - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn both(config: Config, values: &[f64]) -> (DDSketch, BulkSketch) {
        let mut reference = DDSketch::new(config);
        values.iter().for_each(|&v| reference.add(v));
        let mut bulk = BulkSketch::new(config);
        // Split into uneven slices, as batches arrive.
        for chunk in values.chunks(7) {
            bulk.add_slice(chunk);
        }
        (reference, bulk)
    }

    fn assert_same(reference: &DDSketch, bulk: &BulkSketch) {
        assert_eq!(reference.count() as u64, bulk.count());
        for i in 0..=200 {
            let q = i as f64 / 200.0;
            let a = reference.quantile(q).unwrap();
            let b = bulk.quantile(q);
            assert_eq!(
                a.map(f64::to_bits),
                b.map(f64::to_bits),
                "q = {q}: {a:?} vs {b:?}"
            );
        }
    }

    fn value() -> impl Strategy<Value = f64> {
        prop_oneof![
            4 => 1e-12f64..1e12,
            2 => -1e6f64..-1e-6,
            1 => Just(0.0),
            1 => Just(-0.0),
            1 => Just(1e-9),
            1 => -1e-9f64..1e-9,
            1 => prop::num::f64::NORMAL,
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn bulk_equals_one_at_a_time(values in prop::collection::vec(value(), 0..400), alpha in 0.001f64..0.2) {
            let (reference, bulk) = both(Config::new(alpha, 2048, 1e-9), &values);
            assert_same(&reference, &bulk);
        }

        /// A small bin limit and wide ranges force collapses in every order.
        #[test]
        fn key_equals_the_crates(v in prop::num::f64::POSITIVE, alpha in 1e-6f64..0.5) {
            let config = Config::new(alpha, 2048, 1e-9);
            prop_assert_eq!(BulkSketch::new(config).key(v), config.key(v));
        }

        /// The one-scan quantiles are the one-at-a-time ones, bit for bit, in any order of `qs`.
        #[test]
        fn quantiles_into_equals_quantile(values in prop::collection::vec(value(), 0..400), limit in 1u32..2048, qs in prop::collection::vec(prop_oneof![0.0f64..=1.0, Just(0.5), Just(0.99), Just(1.0), Just(0.0), Just(-0.5)], 0..8)) {
            let (reference, bulk) = both(Config::new(0.01, limit, 1e-9), &values);
            let mut got = Vec::new();
            bulk.quantiles_into(&qs, &mut got);
            let mut from_reference = Vec::new();
            PaneSketch::Reference(Box::new(reference)).quantiles_into(&qs, &mut from_reference);
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let one_at_a_time: Vec<f64> = qs.iter().map(|&q| bulk.quantile(q).unwrap_or(f64::NAN)).collect();
            prop_assert_eq!(bits(&got), bits(&one_at_a_time));
            prop_assert_eq!(bits(&got), bits(&from_reference));
        }

        /// Two panes merged are one pane fed both streams, for either seam and
        /// through collapses: counts and every quantile bit for bit, but the
        /// extremes only by value (of `0.0` and `-0.0`, each keeps its first).
        #[test]
        fn merged_panes_equal_one_fed_both(values in prop::collection::vec(value(), 0..300), split in 0usize..300, limit in 1u32..300) {
            let config = Config::new(0.05, limit, 1e-9);
            let split = split.min(values.len());
            for seam in [SketchUpdate::PerSample, SketchUpdate::Runs] {
                let fed = |vs: &[f64]| {
                    let mut p = PaneSketch::new(config, seam);
                    p.add_slice(vs);
                    p
                };
                let one = fed(&values);
                let mut merged = fed(&values[split..]);
                merged.merge(&fed(&values[..split]));
                prop_assert_eq!(merged.count(), one.count());
                for i in 0..=100 {
                    let q = i as f64 / 100.0;
                    let (a, b) = (merged.quantile(q), one.quantile(q));
                    if i == 0 || i == 100 {
                        prop_assert_eq!(a, b);
                    } else {
                        prop_assert_eq!(a.map(f64::to_bits), b.map(f64::to_bits), "q = {}", q);
                    }
                }
            }
        }

        #[test]
        fn bulk_equals_one_at_a_time_through_collapses(values in prop::collection::vec(value(), 0..300), limit in 1u32..300) {
            let (reference, bulk) = both(Config::new(0.05, limit, 1e-9), &values);
            assert_same(&reference, &bulk);
        }
    }
}
