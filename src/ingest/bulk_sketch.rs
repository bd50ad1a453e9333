//! The `bulk-sketch` strategy's sketch: [`BulkSketch`] takes a slice of
//! values and keeps the same bins the crate's `DDSketch` would (a pane's
//! sketch is either, [`PaneSketch`](super::sketch::PaneSketch)). Bin values come from the crate's own
//! `Config::value` (capped at `±f64::MAX`, [`bin_value`]); keys from
//! `BulkSketch::key`, the operations of the crate's `Config::key` with the
//! floor done inline (the `key_equals_the_crates` property test holds it to
//! the crate's for any positive value). It mirrors the crate's
//! `CollapsingLowestDenseStore`: with a bin limit `L`, keys are exact while
//! `max_key - min_key + 1 <= L`; beyond that every key below `max_key - L + 1`
//! is counted in that lowest bin (which is what the crate's store ends with for
//! any order of adds). The receiver's panes never get there: their bin limit
//! is the whole normal range's key span ([`super::bins::sketch_config`]). The
//! quantile is the crate's: rank `floor(q * (n - 1))` (0-based) into the
//! key-ordered bins, negative values first, then zeros (`|v| <= min_value`),
//! then positive; `q = 0` and `q = 1` give the exact min and max.

use super::bins::{bin_value, Bins, PaneBins, FEW_KEYS};
use sketches_ddsketch::Config;

/// The `bulk-sketch` strategy's sketch: same bins as `DDSketch`, filled from slices.
#[derive(Clone, Debug)]
pub struct BulkSketch {
    config: Config,
    /// `ln(gamma)`, computed as the crate computes it.
    gamma_ln: f64,
    pub(super) positive: BulkStore,
    pub(super) negative: BulkStore,
    zero_count: u64,
    min: f64,
    max: f64,
}

impl BulkSketch {
    pub fn new(config: Config) -> Self {
        let limit = i32::try_from(config.max_num_bins).unwrap_or(i32::MAX);
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
        self.add_within(values, &mut |_| true);
    }

    /// [`BulkSketch::add_slice`], asking `afford(growth)` before a value
    /// grows a store (see
    /// [`PaneSketch::add_within`](super::sketch::PaneSketch::add_within));
    /// returns the values left out.
    #[inline]
    pub fn add_within(&mut self, values: &[f64], afford: &mut impl FnMut(usize) -> bool) -> u64 {
        let min_possible = self.config.min_possible();
        let (mut min, mut max) = (self.min, self.max);
        let mut refused = 0;
        for &v in values {
            let taken = if v > min_possible {
                let key = self.key(v);
                add_key(&mut self.positive, key, afford)
            } else if v < -min_possible {
                let key = self.key(-v);
                add_key(&mut self.negative, key, afford)
            } else {
                self.zero_count += 1;
                true
            };
            if !taken {
                refused += 1;
                continue;
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
        refused
    }

    /// See [`PaneSketch::merge`](super::sketch::PaneSketch::merge).
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

    /// The pane's content (see
    /// [`PaneSketch::to_bins`](super::sketch::PaneSketch::to_bins)).
    pub fn to_bins(&self) -> PaneBins {
        PaneBins {
            positive: self.positive.to_bins(),
            negative: self.negative.to_bins(),
            zero_count: self.zero_count,
            min: self.min,
            max: self.max,
            dropped: 0,
        }
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
            -bin_value(&self.config, self.negative.key_at_rank(negative - rank - 1))
        } else if rank < self.zero_count + negative {
            0.0
        } else {
            bin_value(
                &self.config,
                self.positive.key_at_rank(rank - self.zero_count - negative),
            )
        })
    }

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
                    -bin_value(&self.config, self.negative.key_at_rank(negative - rank - 1))
                } else if rank < self.zero_count + negative {
                    0.0
                } else {
                    let rank = rank - self.zero_count - negative;
                    bin_value(
                        &self.config,
                        self.positive.key_at_rank_from(rank, &mut cursor),
                    )
                }
            };
            out.push(value);
        }
    }
}

/// Adds `key` to `store`; a key outside its bins asks `afford` first.
#[inline(always)]
fn add_key(store: &mut BulkStore, key: i32, afford: &mut impl FnMut(usize) -> bool) -> bool {
    let idx = key.wrapping_sub(store.lo) as u32 as usize;
    if idx < store.bins.len() {
        store.bins[idx] += 1;
        store.count += 1;
        return true;
    }
    if store.covers(key) {
        store.add_n(key, 1);
        return true;
    }
    if !afford(store.growth_for(key)) {
        return false;
    }
    store.add_outside(key, 1);
    true
}

/// Dense bins over `[lo, lo + bins.len())`, collapsing the lowest keys beyond
/// `limit`; until it holds more than [`FEW_KEYS`] keys, the keys alone.
///
/// Why the few keys: a pane of a handful of values spread over a few hundred
/// keys (one series per group, five values each) would hold a dense vector
/// of those hundreds of bins, grown a value at a time, and its close would
/// read them all to find the five. As pairs it is the five. The store
/// is the same either way: its span (`lo..=hi`, what the budget counts), its
/// keys and counts, its collapses (a key that would pass the limit makes it
/// dense first, then collapses as a dense store does).
#[derive(Clone, Debug)]
pub(super) struct BulkStore {
    pub(super) bins: Vec<u64>,
    /// The key of `bins[0]`; after a collapse also the floor every lower key
    /// lands in. With `few` keys, the lowest of them.
    lo: i32,
    /// While `bins` is empty: the keys held and their counts, keys ascending.
    pub(super) few: Vec<(i32, u64)>,
    count: u64,
    limit: i32,
}

impl BulkStore {
    fn new(limit: i32) -> Self {
        BulkStore {
            bins: Vec::new(),
            lo: 0,
            few: Vec::new(),
            count: 0,
            limit,
        }
    }

    /// The bins of its span, as a dense store holds them (what the budget counts).
    pub(super) fn len(&self) -> usize {
        match (self.few.first(), self.few.last()) {
            (Some(&(lo, _)), Some(&(hi, _))) => (hi - lo) as usize + 1,
            _ => self.bins.len(),
        }
    }

    /// Whether `key` is inside its span (adding it grows nothing).
    #[inline]
    fn covers(&self, key: i32) -> bool {
        (key.wrapping_sub(self.lo) as u32 as usize) < self.len()
    }

    /// `n` adds of `key`.
    #[inline]
    fn add_n(&mut self, key: i32, n: u64) {
        let idx = key.wrapping_sub(self.lo) as u32 as usize;
        if idx < self.bins.len() {
            self.bins[idx] += n;
            self.count += n;
        } else {
            self.add_outside(key, n);
        }
    }

    /// Bins that adding `key` (outside its span) adds.
    fn growth_for(&self, key: i32) -> usize {
        let len = self.len();
        if len == 0 {
            return 1;
        }
        let hi = i64::from(self.lo) + len as i64 - 1;
        let span = hi.max(i64::from(key)) - i64::from(self.lo).min(i64::from(key)) + 1;
        (span.min(i64::from(self.limit)) as usize).saturating_sub(len)
    }

    /// Every key `other` counts, as if added here: the store ends the same for
    /// any order of adds, so this is the store of both streams, exactly.
    fn merge(&mut self, other: &BulkStore) {
        for &(key, n) in &other.few {
            self.add_n(key, n);
        }
        for (i, &n) in other.bins.iter().enumerate() {
            if n > 0 {
                self.add_n(other.lo + i as i32, n);
            }
        }
    }

    fn to_bins(&self) -> Bins {
        if self.few.is_empty() {
            Bins::from_dense(self.lo, &self.bins)
        } else {
            Bins::from_pairs(&self.few)
        }
    }

    /// `n` adds of a key outside the dense bins: with few keys, the pair's
    /// count or a new pair; else grow, collapsing the lowest keys if the
    /// range passes the limit.
    #[inline(never)]
    fn add_outside(&mut self, key: i32, n: u64) {
        if self.bins.is_empty() {
            if self.add_few(key, n) {
                return;
            }
            // A key the pairs cannot take: dense from here on (the pairs are
            // not empty, since an empty store always takes a pair).
            self.make_dense();
            return self.add_n(key, n);
        }
        self.count += n;
        let hi = self.lo + self.bins.len() as i32 - 1;
        let (new_lo, new_hi) = (key.min(self.lo), key.max(hi));
        if i64::from(new_hi) - i64::from(new_lo) < i64::from(self.limit) {
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

    /// `n` adds of `key` as a pair, if the store has few keys and the key
    /// neither makes them too many nor passes the limit.
    fn add_few(&mut self, key: i32, n: u64) -> bool {
        let at = self.few.binary_search_by_key(&key, |&(k, _)| k);
        if let Ok(i) = at {
            self.few[i].1 += n;
        } else if self.few.is_empty() {
            self.few.reserve_exact(FEW_KEYS);
            self.few.push((key, n));
        } else {
            let (lo, hi) = (self.few[0].0, self.few[self.few.len() - 1].0);
            let span = i64::from(hi.max(key)) - i64::from(lo.min(key)) + 1;
            if self.few.len() == FEW_KEYS || span > i64::from(self.limit) {
                return false;
            }
            self.few.insert(at.unwrap_err(), (key, n));
        }
        self.lo = self.few[0].0;
        self.count += n;
        true
    }

    /// The few keys laid out as dense bins over their span.
    #[cold]
    fn make_dense(&mut self) {
        if let (Some(&(lo, _)), Some(&(hi, _))) = (self.few.first(), self.few.last()) {
            self.bins = vec![0; (hi - lo) as usize + 1];
            for &(key, n) in &self.few {
                self.bins[(key - lo) as usize] = n;
            }
            self.lo = lo;
        }
        self.few = Vec::new();
        debug_assert!(!self.bins.is_empty(), "made dense from no pairs");
    }

    fn key_at_rank(&self, rank: u64) -> i32 {
        self.key_at_rank_from(rank, &mut (0, 0))
    }

    /// The key of the bin holding the `rank`-th value (0-based), or the
    /// highest key if none does: from `cursor` = (a bin's or pair's index,
    /// the count below it) when the rank is not below that count, else from
    /// the start; leaves the cursor at the bin found.
    fn key_at_rank_from(&self, rank: u64, cursor: &mut (usize, u64)) -> i32 {
        let (mut i, mut below) = if cursor.1 <= rank { *cursor } else { (0, 0) };
        if let Some(&(hi, _)) = self.few.last() {
            // The cursor is a pair's index.
            while let Some(&(key, c)) = self.few.get(i) {
                if below + c > rank {
                    *cursor = (i, below);
                    return key;
                }
                below += c;
                i += 1;
            }
            *cursor = (0, 0);
            return hi;
        }
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
    use crate::ingest::sketch::PaneSketch;
    use crate::shared::seams::SketchUpdate;
    use proptest::prelude::*;
    use sketches_ddsketch::DDSketch;

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
            let mut pane = PaneSketch::new(Config::new(0.01, limit, 1e-9), SketchUpdate::PerSample);
            pane.add_slice(&values);
            pane.quantiles_into(&qs, &mut from_reference);
            prop_assert_eq!(pane.count(), reference.count() as u64);
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A store counts its span whether it holds its keys as pairs or
        /// dense (the budget counts it), and turns dense past `FEW_KEYS`
        /// keys or when a key would pass its limit.
        #[test]
        fn a_store_is_as_long_as_its_span(values in prop::collection::vec(value(), 0..60), limit in 1u32..400) {
            let (reference, bulk) = both(Config::new(0.01, limit, 1e-9), &values);
            assert_same(&reference, &bulk);
            for store in [&bulk.positive, &bulk.negative] {
                let keys: Vec<i32> = store.to_bins().iter().map(|(k, _)| k).collect();
                let span = match (keys.first(), keys.last()) {
                    (Some(lo), Some(hi)) => (hi - lo) as usize + 1,
                    _ => 0,
                };
                prop_assert_eq!(store.len(), span);
                prop_assert!(store.len() <= limit as usize);
                prop_assert!(store.few.is_empty() || store.bins.is_empty());
                prop_assert!(store.few.len() <= FEW_KEYS);
                if keys.len() > FEW_KEYS {
                    prop_assert!(store.few.is_empty());
                }
            }
        }
    }
}
