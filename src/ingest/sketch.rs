//! The sketch-update seam: one pane of one (aggregation, group, window).
//!
//! The reference is `sketches_ddsketch::DDSketch`, fed one `add` per sample.
//! The `bulk-sketch` strategy is [`BulkSketch`] ([`super::bulk_sketch`]): it
//! takes a slice of values and keeps the same bins the crate would.
//!
//! What a pane costs is counted in bins ([`PaneSketch::bins_len`]); an add
//! that needs more bins asks first ([`PaneSketch::add_within`]): a value
//! whose bins are refused is left out, and counted by the caller.

use super::bins::PaneBins;
use super::bulk_sketch::BulkSketch;
use super::prefetch::prefetch_read;
use crate::shared::seams::SketchUpdate;
use sketches_ddsketch::{Config, DDSketch};

/// A pane's sketch: the crate's (reference) or ours (`bulk-sketch`). Both
/// boxed: a window holds a slot per group id, and an empty slot costs 16
/// bytes rather than a sketch's 150.
#[derive(Clone)]
pub enum PaneSketch {
    Reference(Box<ReferenceSketch>),
    Bulk(Box<BulkSketch>),
}

/// The crate's sketch, with the key span of each of its stores, so that what
/// an add may grow it by is known before the add (the crate does not say).
#[derive(Clone)]
pub struct ReferenceSketch {
    sketch: DDSketch,
    config: Config,
    /// Positive, negative: the magnitudes added and their keys.
    spans: [KeySpan; 2],
}

/// The smallest and largest magnitude of one sign added, and their keys.
#[derive(Clone, Copy)]
struct KeySpan {
    min: f64,
    max: f64,
    lo: i32,
    hi: i32,
}

impl KeySpan {
    const EMPTY: KeySpan = KeySpan {
        min: f64::INFINITY,
        max: f64::NEG_INFINITY,
        lo: 0,
        hi: -1,
    };

    /// Keys from the lowest to the highest (0 when empty).
    fn keys(&self) -> i64 {
        (i64::from(self.hi) - i64::from(self.lo) + 1).max(0)
    }

    fn merge(&mut self, o: &KeySpan) {
        if o.min > o.max {
            return;
        }
        if self.min > self.max {
            *self = *o;
            return;
        }
        *self = KeySpan {
            min: self.min.min(o.min),
            max: self.max.max(o.max),
            lo: self.lo.min(o.lo),
            hi: self.hi.max(o.hi),
        };
    }
}

/// The crate's store grows to a multiple of this many bins.
const CRATE_CHUNK: i64 = 128;

/// Bins (8 bytes each) an open pane is counted beyond its stores' bins: its
/// own structure, boxed (at most 300 bytes for either seam), and the start of
/// each sign's bins — at least what its [`PaneBins`] will cost beyond theirs
/// ([`super::bins::CLOSED_PANE_BINS`]), so closing never needs more.
pub const PANE_BINS: usize = 40;

impl ReferenceSketch {
    fn new(config: Config) -> Self {
        ReferenceSketch {
            sketch: DDSketch::new(config),
            config,
            spans: [KeySpan::EMPTY; 2],
        }
    }

    /// Adds `v` unless it needs bins `afford` refuses (it is given an upper
    /// bound of the growth); false when refused.
    #[inline]
    fn add_within(&mut self, v: f64, afford: &mut impl FnMut(usize) -> bool) -> bool {
        let min_possible = self.config.min_possible();
        let sign = if v > min_possible {
            0
        } else if v < -min_possible {
            1
        } else {
            self.sketch.add(v);
            return true;
        };
        let magnitude = v.abs();
        let span = self.spans[sign];
        // A magnitude within those added has a key within theirs: no growth.
        if !(span.min..=span.max).contains(&magnitude) {
            let key = self.config.key(magnitude);
            let grown = if span.min > span.max {
                KeySpan {
                    min: magnitude,
                    max: magnitude,
                    lo: key,
                    hi: key,
                }
            } else {
                KeySpan {
                    min: span.min.min(magnitude),
                    max: span.max.max(magnitude),
                    lo: span.lo.min(key),
                    hi: span.hi.max(key),
                }
            };
            if grown.keys() > span.keys() {
                // The store grows to whole chunks of its new key span (never
                // past its limit), from at least the keys it held.
                let chunks = (grown.keys() + CRATE_CHUNK - 1) / CRATE_CHUNK * CRATE_CHUNK;
                let length = chunks.min(i64::from(self.config.max_num_bins));
                if !afford((length - span.keys()).max(0) as usize) {
                    return false;
                }
            }
            self.spans[sign] = grown;
        }
        self.sketch.add(v);
        true
    }

    fn merge(&mut self, other: &ReferenceSketch) {
        self.sketch
            .merge(&other.sketch)
            .expect("panes of one aggregation share their sketch config");
        for (mine, theirs) in self.spans.iter_mut().zip(&other.spans) {
            mine.merge(theirs);
        }
    }

    fn quantile(&self, q: f64) -> Option<f64> {
        // Only the topmost bin's value can pass ±f64::MAX (see `bin_value`).
        self.sketch
            .quantile(q)
            .ok()
            .flatten()
            .map(|v| v.clamp(-f64::MAX, f64::MAX))
    }
}

impl PaneSketch {
    pub fn new(config: Config, sketch: SketchUpdate) -> Self {
        match sketch {
            SketchUpdate::Runs => PaneSketch::Bulk(Box::new(BulkSketch::new(config))),
            SketchUpdate::PerSample => {
                PaneSketch::Reference(Box::new(ReferenceSketch::new(config)))
            }
        }
    }

    /// Asks the CPU to bring this pane's own structure into cache ahead of
    /// an add: a boxed sketch is a pointer away from its window's slot.
    #[inline]
    pub fn prefetch(&self) {
        match self {
            PaneSketch::Reference(s) => prefetch_read(&**s),
            PaneSketch::Bulk(s) => prefetch_read(&**s),
        }
    }

    /// Asks the CPU for the bins an add of `values` values to this pane will
    /// touch, once its structure is in cache (see [`PaneSketch::prefetch`]):
    /// every line of its positive store's bins (where positive values go),
    /// if the values are enough to touch a good part of them (for a value or
    /// two, asking for every line costs more than the misses it saves).
    #[inline]
    pub fn prefetch_bins(&self, values: usize) {
        if let PaneSketch::Bulk(s) = self {
            let bins = s.positive.bins.as_slice();
            if std::mem::size_of_val(bins) <= values * 4 * 64 {
                prefetch_read(bins);
            }
        }
    }

    /// Asks the CPU for what closing this pane reads besides its structure
    /// (see [`PaneSketch::prefetch`]): its stores' counts, dense or paired.
    #[inline]
    pub fn prefetch_stores(&self) {
        if let PaneSketch::Bulk(s) = self {
            for store in [&s.positive, &s.negative] {
                prefetch_read(store.bins.as_slice());
                prefetch_read(store.few.as_slice());
            }
        }
    }

    /// One value (the reference path), whatever bins it needs.
    #[inline]
    pub fn add(&mut self, v: f64) {
        self.add_within(std::slice::from_ref(&v), &mut |_| true);
    }

    /// A run of values, in order, whatever bins they need.
    pub fn add_slice(&mut self, values: &[f64]) {
        self.add_within(values, &mut |_| true);
    }

    /// A run of values, in order; before a value makes the pane grow,
    /// `afford(growth)` is asked (with the growth in bins, or an upper bound
    /// of it) and a `false` leaves that value out. Returns the values left out.
    #[inline]
    pub fn add_within(&mut self, values: &[f64], afford: &mut impl FnMut(usize) -> bool) -> u64 {
        match self {
            PaneSketch::Reference(s) => values
                .iter()
                .map(|&v| u64::from(!s.add_within(v, afford)))
                .sum(),
            PaneSketch::Bulk(s) => s.add_within(values, afford),
        }
    }

    pub fn count(&self) -> u64 {
        match self {
            PaneSketch::Reference(s) => s.sketch.count() as u64,
            PaneSketch::Bulk(s) => s.count(),
        }
    }

    /// The quantile `q` in [0, 1]; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        match self {
            PaneSketch::Reference(s) => s.quantile(q),
            PaneSketch::Bulk(s) => s.quantile(q),
        }
    }

    /// The quantiles `qs`, in order, onto `out`: what [`PaneSketch::quantile`]
    /// gives for each (NaN when empty), bit for bit — `bulk-sketch` finds them
    /// in one resumable scan of the bins ([`BulkSketch::quantiles_into`]).
    pub fn quantiles_into(&self, qs: &[f64], out: &mut Vec<f64>) {
        match self {
            PaneSketch::Reference(s) => {
                out.extend(qs.iter().map(|&q| s.quantile(q).unwrap_or(f64::NAN)))
            }
            PaneSketch::Bulk(s) => s.quantiles_into(qs, out),
        }
    }

    /// Adds `other`'s values, as if they had been added here (two panes of
    /// one sketch seam). Bins, counts, min and max are those of one sketch fed
    /// both streams, so every quantile is, bit for bit — except that of two
    /// equal extremes (`0.0` and `-0.0`) the one kept as min or max is this
    /// pane's, where one sketch keeps the first it was fed. (The receiver
    /// merges lanes' panes as [`PaneBins`], whose merge never grows.)
    pub fn merge(&mut self, other: &PaneSketch) {
        match (self, other) {
            (PaneSketch::Reference(a), PaneSketch::Reference(b)) => a.merge(b),
            (PaneSketch::Bulk(a), PaneSketch::Bulk(b)) => a.merge(b),
            _ => unreachable!("panes of one aggregation share their sketch seam"),
        }
    }

    /// The pane's content as a closed window keeps it: the same for both
    /// seams given the same values ([`super::bins`]).
    pub fn to_bins(&self) -> PaneBins {
        match self {
            PaneSketch::Reference(s) => PaneBins::of_ddsketch(&s.sketch),
            PaneSketch::Bulk(s) => s.to_bins(),
        }
    }

    /// Bins (8 bytes each) the pane is counted: its stores' bins and
    /// [`PANE_BINS`] for itself.
    pub fn bins_len(&self) -> usize {
        PANE_BINS
            + match self {
                PaneSketch::Reference(s) => s.sketch.length(),
                PaneSketch::Bulk(s) => s.positive.len() + s.negative.len(),
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    /// An empty pane slot is a pointer and a tag (windows hold one per group
    /// id), and a pane's own structure is within what it is counted.
    #[test]
    fn an_empty_slot_is_small_and_a_pane_within_its_count() {
        use std::mem::size_of;
        assert!(size_of::<Option<PaneSketch>>() <= 16);
        // The box, and a malloc header for it and for each store.
        let malloc = 16;
        for own in [size_of::<ReferenceSketch>(), size_of::<BulkSketch>()] {
            assert!(own + 3 * malloc <= PANE_BINS * 8, "{own}");
        }
        let closed = size_of::<(u32, PaneBins)>() + 4 * malloc;
        assert!(
            closed <= crate::ingest::bins::CLOSED_PANE_BINS * 8,
            "{closed}"
        );
    }

    /// Values over the whole f64 range: normal magnitudes from the smallest to
    /// the largest, both extremes, subnormals, zeros, and ordinary values.
    fn any_value() -> impl Strategy<Value = f64> {
        let normal =
            (-307.65f64..308.25).prop_map(|e| 10f64.powf(e).clamp(f64::MIN_POSITIVE, f64::MAX));
        prop_oneof![
            4 => 1.0f64..100.0,
            3 => normal.clone(),
            2 => normal.prop_map(|v| -v),
            1 => Just(f64::MAX),
            1 => Just(-f64::MAX),
            1 => Just(f64::MIN_POSITIVE),
            1 => Just(-f64::MIN_POSITIVE),
            1 => prop::num::f64::SUBNORMAL,
            1 => Just(0.0),
            1 => Just(-0.0),
            1 => prop::num::f64::NORMAL,
        ]
    }

    fn pane(seam: SketchUpdate, alpha: f64, values: &[f64]) -> PaneSketch {
        let mut pane = PaneSketch::new(crate::ingest::bins::sketch_config(alpha), seam);
        for chunk in values.chunks(5) {
            pane.add_slice(chunk);
        }
        pane
    }

    /// The DDSketch guarantee over the whole range the receiver accepts: for
    /// both seams and for the bins a closed window keeps, every quantile is
    /// within α of the exact value at its rank (0 for a zero or subnormal).
    fn check_within_alpha(
        values: &[f64],
        alpha: f64,
        answer: impl Fn(f64) -> Option<f64>,
    ) -> Result<(), TestCaseError> {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        for i in 0..=200 {
            let q = i as f64 / 200.0;
            let got = answer(q).expect("not empty");
            let exact = crate::reference::quantile::exact(&sorted, q).unwrap();
            if i == 0 || i == 200 {
                prop_assert_eq!(got, exact, "q = {}", q);
            } else if exact.abs() <= crate::ingest::bins::ZERO_THRESHOLD {
                prop_assert_eq!(got, 0.0, "q = {}: exact {:e}", q, exact);
            } else {
                prop_assert!(got.is_finite(), "q = {}: {}", q, got);
                let bound = alpha * exact.abs() * (1.0 + 1e-9);
                prop_assert!(
                    (got - exact).abs() <= bound,
                    "q = {}: {:e} for exact {:e} (alpha {})",
                    q,
                    got,
                    exact,
                    alpha
                );
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn within_alpha_over_the_whole_range(values in prop::collection::vec(any_value(), 1..300), alpha in prop_oneof![Just(0.01), 1e-4f64..0.5]) {
            let config = crate::ingest::bins::sketch_config(alpha);
            for seam in [SketchUpdate::PerSample, SketchUpdate::Runs] {
                let pane = pane(seam, alpha, &values);
                check_within_alpha(&values, alpha, |q| pane.quantile(q))?;
                let bins = pane.to_bins();
                check_within_alpha(&values, alpha, |q| bins.quantile(&config, q))?;
            }
        }

        /// One value of 1e20 (or 1e300, 1e-300) among 1..100: the answers
        /// stay within α (the crate's 2,048-bin store answered 165.7 for p50).
        #[test]
        fn one_outlier_does_not_move_the_others(outlier in prop::sample::select(vec![1e20, 1e300, 1e-300, -1e300, f64::MAX]), at in 0usize..101) {
            let mut values: Vec<f64> = (1..=100).map(f64::from).collect();
            values.insert(at, outlier);
            for seam in [SketchUpdate::PerSample, SketchUpdate::Runs] {
                let pane = pane(seam, 0.01, &values);
                check_within_alpha(&values, 0.01, |q| pane.quantile(q))?;
            }
        }

        /// Both seams hand out the same bins for the same values, the bins
        /// answer every quantile as the pane does, bit for bit, and cost no
        /// more than the pane was counted.
        #[test]
        fn both_seams_hand_out_the_same_bins(values in prop::collection::vec(any_value(), 0..300), alpha in prop_oneof![Just(0.01), 1e-3f64..0.2]) {
            let config = crate::ingest::bins::sketch_config(alpha);
            let reference = pane(SketchUpdate::PerSample, alpha, &values);
            let bulk = pane(SketchUpdate::Runs, alpha, &values);
            let bins = reference.to_bins();
            prop_assert_eq!(&bins, &bulk.to_bins());
            prop_assert_eq!(bins.count(), values.len() as u64);
            for p in [&reference, &bulk] {
                prop_assert!(p.to_bins().cost() <= p.bins_len(), "{} > {}", p.to_bins().cost(), p.bins_len());
            }
            let qs: Vec<f64> = (0..=100).map(|i| i as f64 / 100.0).collect();
            let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
            reference.quantiles_into(&qs, &mut a);
            bulk.quantiles_into(&qs, &mut b);
            bins.quantiles_into(&config, &qs, &mut c);
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&a), bits(&b));
            prop_assert_eq!(bits(&a), bits(&c));
        }

        /// Bins merged from two panes are the bins of one pane fed both, and
        /// cost no more than the two.
        #[test]
        fn merged_bins_are_one_panes(values in prop::collection::vec(any_value(), 0..300), split in 0usize..300) {
            let split = split.min(values.len());
            let one = pane(SketchUpdate::Runs, 0.01, &values).to_bins();
            let mut merged = pane(SketchUpdate::PerSample, 0.01, &values[..split]).to_bins();
            let other = pane(SketchUpdate::Runs, 0.01, &values[split..]).to_bins();
            let cost = merged.cost() + other.cost();
            merged.merge(&other);
            prop_assert!(merged.cost() <= cost);
            prop_assert_eq!(merged.count(), one.count());
            prop_assert_eq!(&merged.positive, &one.positive);
            prop_assert_eq!(&merged.negative, &one.negative);
            prop_assert_eq!(merged.zero_count, one.zero_count);
            // Extremes by value (of 0.0 and -0.0 each keeps its first).
            prop_assert!(merged.min == one.min && merged.max == one.max);
        }

        /// A value whose bins `afford` refuses is left out: the pane is the
        /// pane of the values taken, and grows by no more than was afforded.
        #[test]
        fn refused_values_are_left_out(values in prop::collection::vec(any_value(), 0..200), budget in 0usize..3000) {
            for seam in [SketchUpdate::PerSample, SketchUpdate::Runs] {
                let config = crate::ingest::bins::sketch_config(0.01);
                let mut pane = PaneSketch::new(config, seam);
                let mut taken = Vec::new();
                let mut granted = 0;
                let mut refused = 0;
                for &v in &values {
                    let mut asked = None;
                    let left_out = pane.add_within(&[v], &mut |growth| {
                        asked = Some(growth);
                        granted + growth <= budget
                    });
                    match (left_out, asked) {
                        (0, Some(g)) => granted += g,
                        (0, None) => {}
                        _ => refused += 1,
                    }
                    if left_out == 0 {
                        taken.push(v);
                    }
                }
                prop_assert!(pane.bins_len() <= granted + PANE_BINS, "{:?}: {} bins, {} granted", seam, pane.bins_len(), granted);
                prop_assert_eq!(taken.len() + refused, values.len());
                let fed = PaneSketch::new(config, seam);
                let mut fed = fed;
                fed.add_slice(&taken);
                prop_assert_eq!(pane.to_bins(), fed.to_bins());
            }
        }
    }
}
