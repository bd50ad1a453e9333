//! The bin semantics: what a pane's sketch holds, what a closed window keeps
//! of it per group, and what it hands out (to a query, to another receiver's
//! merge, to a distributed store).
//!
//! **Bins.** For relative accuracy α, `γ = (1 + α) / (1 − α)`. A value `v`
//! with `|v|` a normal f64 (`|v| ≥ 2.2250738585072014e-308`) is counted in bin
//! `k = floor(ln|v| / ln γ)` of its sign's store (positive or negative), which
//! holds `[γ^k, γ^(k+1))`; the keys are `sketches_ddsketch::Config::key`'s.
//! Values with `|v| ≤` [`ZERO_THRESHOLD`] — `±0` and the subnormals — are
//! counted as zeros. NaN and ±∞ are never added (the ingester rejects them,
//! counted; Prometheus stale markers are skipped, counted).
//!
//! **No collapse.** A store may hold every key of the normal range
//! ([`sketch_config`]: `max_num_bins` is that range's key span, 70,907 for
//! α = 0.01), so neither the crate's store nor ours ever merges its lowest
//! bins: every quantile of every value the receiver accepts is within α
//! (below). What bounds memory is the receiver's bin budget (`--max-bins`),
//! which refuses — counted, and flagged in the answer — a value whose bins it
//! cannot afford; it never folds bins together.
//!
//! **Quantile** (the crate's definition, step for step): for `n` values and
//! `0 < q < 1`, rank `floor(q · (n − 1))` (0-based) over the negative bins
//! from the largest magnitude down, then the zeros, then the positive bins
//! upwards; the answer is the bin's value `γ^k · (1 + α)` (`Config::value`),
//! negated for a negative bin, `0.0` for a zero — capped at `±f64::MAX`, which
//! only the topmost bin's value can pass and which is then nearer the exact
//! value than `γ^k · (1 + α)`. `q = 0` and `q = 1` answer the exact minimum and
//! maximum. **Guarantee:** for the value `x` at that rank, `|answer − x| ≤
//! α·|x|` when `|x|` is normal, and `answer = 0` when `|x| ≤ ZERO_THRESHOLD`
//! (an absolute error under 2.3e-308: no relative guarantee is possible
//! there, a subnormal has fewer significant bits than α needs).
//!
//! **What a closed window keeps per group: [`PaneBins`]** — the non-empty bins
//! of each sign as (key → count), the zero count, the count, the exact min and
//! max, and `dropped`: the group's samples of that window the receiver refused
//! past a limit (they are in no bin; an answer with `dropped > 0` says so).
//! Both sketch seams (the crate's `DDSketch` and `bulk-sketch`'s
//! [`BulkSketch`](super::bulk_sketch::BulkSketch)) hand out the same `PaneBins`
//! for the same values, in any order (property-tested), and
//! [`PaneBins::quantile`] answers what either sketch answers, bit for bit.
//!
//! **Merging is exact:** [`PaneBins::merge`] adds counts key by key and zero
//! counts, and keeps the smaller min and the larger max — the `PaneBins` of one
//! sketch fed both streams, so N receivers (or lanes) each holding part of a
//! group's samples answer exactly as one. The one exception is which of two
//! equal extremes is kept (`0.0` and `-0.0`): the merged-into pane's, where
//! one sketch keeps the first it was fed.
//!
//! **Cost** ([`PaneBins::cost`], in bins of 8 bytes, what the budget counts):
//! the counts stored plus one per run of keys (a run is a stretch of keys
//! stored with its start; single empty keys inside a run are stored as zeros,
//! longer gaps start a new run), plus [`CLOSED_PANE_BINS`] for the structure
//! itself. A merge costs at most what its two inputs did, and a pane's bins
//! cost at most what its open sketch was counted
//! ([`PaneSketch::bins_len`](super::sketch::PaneSketch::bins_len): its dense
//! stores plus [`PANE_BINS`](super::sketch::PANE_BINS)), so closing a window
//! and merging lanes never needs more of the budget than it frees.

use super::prefetch::prefetch_read;
use sketches_ddsketch::{Config, DDSketch};

/// Bins (8 bytes each) a [`PaneBins`] is counted beyond its bins and runs: its
/// own structure where a closed window keeps it, and a malloc header for each
/// of its vectors. At most [`PANE_BINS`](super::sketch::PANE_BINS) − 2 (a
/// dense store's bins become at most one run more), so closing never grows.
pub const CLOSED_PANE_BINS: usize = 36;

/// The largest subnormal f64: values with `|v|` at most this count as zeros.
pub const ZERO_THRESHOLD: f64 = f64::from_bits(0x000f_ffff_ffff_ffff);

/// The key span of the normal range at accuracy `alpha`: the bins a store
/// needs to hold every key from `f64::MIN_POSITIVE` to `f64::MAX`.
pub fn normal_range_bins(alpha: f64) -> u32 {
    let config = Config::new(alpha, 1, ZERO_THRESHOLD);
    let span = i64::from(config.key(f64::MAX)) - i64::from(config.key(f64::MIN_POSITIVE)) + 1;
    u32::try_from(span).unwrap_or(u32::MAX)
}

/// The sketch configuration of a pane at accuracy `alpha`: the zero bucket
/// holds `±0` and the subnormals, and the bin limit is the normal range's key
/// span, so a store never collapses.
pub fn sketch_config(alpha: f64) -> Config {
    Config::new(alpha, normal_range_bins(alpha), ZERO_THRESHOLD)
}

/// The value a quantile in bin `key` answers (magnitude): `Config::value`,
/// capped at `f64::MAX` (only the topmost bin's value can pass it).
#[inline]
pub fn bin_value(config: &Config, key: i32) -> f64 {
    config.value(key).min(f64::MAX)
}

/// The most keys a store ([`BulkSketch`](super::bulk_sketch::BulkSketch)'s)
/// holds as pairs before it turns dense, and so the most pairs
/// [`Bins::from_pairs`] lays out on the stack.
pub(super) const FEW_KEYS: usize = 8;

/// The longest store whose runs are found from a mask of its non-zero
/// counts, held on the stack (longer ones are walked count by count).
const MASKED_COUNTS: usize = 4096;

/// The runs of dense counts as [`Bins::push`] makes them, as index ranges:
/// each from a non-zero count to the last non-zero count before two zeros in
/// a row (or the end).
///
/// Found from a mask of the non-zero counts, single zeros between two of
/// them filled in: each run is then a stretch of ones, found with a bit
/// scan at each end. Walked count by count ([`for_each_dense_run_by_count`]),
/// every change from zeros to counts and back is a mispredicted branch.
#[cfg(test)]
fn for_each_dense_run(counts: &[u64], run: impl FnMut(std::ops::Range<usize>)) {
    if counts.len() > MASKED_COUNTS {
        return for_each_dense_run_by_count(counts, run);
    }
    let mut mask = [0u64; MASKED_COUNTS / 64];
    let mask = run_mask(counts, &mut mask);
    for_each_masked_run(mask, counts.len(), run);
}

/// The mask of the counts runs hold (at most [`MASKED_COUNTS`] of them),
/// in the first words of `mask`: a bit per non-zero count, and one per zero
/// with a non-zero count on each side (it joins their runs).
fn run_mask<'m>(counts: &[u64], mask: &'m mut [u64; MASKED_COUNTS / 64]) -> &'m mut [u64] {
    let mask = &mut mask[..counts.len().div_ceil(64)];
    for (word, chunk) in mask.iter_mut().zip(counts.chunks(64)) {
        *word = chunk
            .iter()
            .enumerate()
            .fold(0, |word, (j, &c)| word | (u64::from(c != 0) << j));
    }
    // A zero with a non-zero count on each side joins their runs.
    let mut top_below = 0;
    for w in 0..mask.len() {
        let word = mask[w];
        let low_above = mask.get(w + 1).map_or(0, |above| above & 1);
        let left = (word << 1) | top_below;
        let right = (word >> 1) | (low_above << 63);
        top_below = word >> 63;
        mask[w] = word | (left & right);
    }
    mask
}

/// The words a dense store's bins take, from its runs' mask: a count per
/// set bit, a head per run (a set bit whose lower neighbour is clear).
fn masked_words(mask: &[u64]) -> usize {
    let (mut words, mut top_below) = (0, 0);
    for &word in mask {
        words += (word.count_ones() + (word & !((word << 1) | top_below)).count_ones()) as usize;
        top_below = word >> 63;
    }
    words
}

/// Each run of a mask over `len` counts, as an index range, in order.
fn for_each_masked_run(mask: &[u64], len: usize, mut run: impl FnMut(std::ops::Range<usize>)) {
    let mut at = 0;
    while let Some(start) = next_bit(mask, at, true) {
        let end = next_bit(mask, start, false).map_or(len, |end| end.min(len));
        run(start..end);
        at = end;
    }
}

/// The first bit at or after `from` that is set (`set`) or clear in `mask`.
fn next_bit(mask: &[u64], from: usize, set: bool) -> Option<usize> {
    let flip = if set { 0 } else { u64::MAX };
    let mut w = from / 64;
    let mut word = (mask.get(w)? ^ flip) & (u64::MAX << (from % 64));
    while word == 0 {
        w += 1;
        word = mask.get(w)? ^ flip;
    }
    Some(w * 64 + word.trailing_zeros() as usize)
}

/// [`for_each_dense_run`], count by count: stores past [`MASKED_COUNTS`],
/// and the reference the masked walk is tested against.
fn for_each_dense_run_by_count(counts: &[u64], mut run: impl FnMut(std::ops::Range<usize>)) {
    let nonzero = |i: usize| counts.get(i).is_some_and(|&c| c != 0);
    let mut i = 0;
    while i < counts.len() {
        if counts[i] == 0 {
            i += 1;
            continue;
        }
        let start = i;
        // `i` is one past the run's last non-zero count.
        i += 1;
        loop {
            if nonzero(i) {
                i += 1;
            } else if nonzero(i + 1) {
                i += 2;
            } else {
                break;
            }
        }
        run(start..i);
    }
}

/// One sign's bins: keys ascending with their counts, stored as runs of
/// consecutive keys (see the module doc's cost).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bins {
    /// Each run as a head word ([`run_head`]: its first key and number of
    /// keys) and then the counts of its keys (zero for a key inside a run
    /// that holds none); runs ascending and apart by two or more. One vector,
    /// not one for the runs and one for the counts: a closed pane's bins are
    /// one allocation, and a window of 100k one-series groups closed and was
    /// dropped with 100k fewer `malloc` and `free` calls.
    words: Vec<u64>,
    /// Where the last run's head is (0 when there is none).
    last_run: usize,
    total: u64,
}

/// A run's head word: its first key (low 32 bits) and number of keys.
fn run_head(start: i32, len: u32) -> u64 {
    u64::from(start as u32) | (u64::from(len) << 32)
}

/// A head word's first key and number of keys.
fn run_of(head: u64) -> (i32, u32) {
    (head as u32 as i32, (head >> 32) as u32)
}

/// Whether `key` (above every key held) joins the run whose head is `head`:
/// `Some((zero, head))` if it does — `zero` when one empty key is between,
/// stored as a zero (it costs what a new run would), and the run's new head
/// — and `None` when it starts a run of its own.
fn extend_run(head: u64, key: i32) -> Option<(bool, u64)> {
    let (start, len) = run_of(head);
    let end = i64::from(start) + i64::from(len);
    debug_assert!(i64::from(key) >= end, "keys ascending");
    match i64::from(key) - end {
        0 => Some((false, run_head(start, len + 1))),
        1 => Some((true, run_head(start, len + 2))),
        _ => None,
    }
}

impl Bins {
    /// Bins of (key, count) pairs given with strictly ascending keys; zero counts are skipped.
    pub fn from_sorted(pairs: impl IntoIterator<Item = (i32, u64)>) -> Bins {
        let mut bins = Bins::default();
        for (key, count) in pairs {
            bins.push(key, count);
        }
        bins
    }

    /// The bins of a dense store: `counts[i]` at key `lo + i` (zeros skipped),
    /// as [`Bins::from_sorted`] makes them, each vector allocated once at its
    /// size (a window's close converts every pane it holds).
    ///
    /// A run's counts are a stretch of the dense counts as they stand (single
    /// zeros kept), so each is copied whole. The vector is sized from the
    /// runs' mask (a count per set bit, a head per run), and the total summed
    /// in one pass.
    pub fn from_dense(lo: i32, counts: &[u64]) -> Bins {
        if counts.len() > MASKED_COUNTS {
            return Bins::from_dense_by_count(lo, counts);
        }
        let mut mask = [0u64; MASKED_COUNTS / 64];
        let mask = run_mask(counts, &mut mask);
        let mut bins = Bins {
            words: Vec::with_capacity(masked_words(mask)),
            last_run: 0,
            total: counts.iter().sum(),
        };
        for_each_masked_run(mask, counts.len(), |run| bins.push_run(lo, counts, run));
        bins
    }

    /// [`Bins::from_dense`] of a store past [`MASKED_COUNTS`]: its runs
    /// found count by count, collected to size the vector.
    fn from_dense_by_count(lo: i32, counts: &[u64]) -> Bins {
        let mut runs = Vec::new();
        for_each_dense_run_by_count(counts, |run| runs.push(run));
        let stored: usize = runs.iter().map(|run| run.len()).sum();
        let mut bins = Bins {
            words: Vec::with_capacity(runs.len() + stored),
            last_run: 0,
            total: counts.iter().sum(),
        };
        for run in runs {
            bins.push_run(lo, counts, run);
        }
        bins
    }

    /// Appends the run of `counts[run]` (keys from `lo + run.start`).
    #[inline]
    fn push_run(&mut self, lo: i32, counts: &[u64], run: std::ops::Range<usize>) {
        let len = u32::try_from(run.len()).expect("a store's span fits in u32");
        self.last_run = self.words.len();
        self.words.push(run_head(lo + run.start as i32, len));
        self.words.extend_from_slice(&counts[run]);
    }

    /// The bins of (key, count) pairs, keys strictly ascending (zeros
    /// skipped), each vector allocated once at its size.
    ///
    /// A few pairs (a store's, closing: at most [`FEW_KEYS`], what a store
    /// holds as pairs before it turns dense) are laid out as [`Bins::push`]
    /// would lay them, on the stack, and copied once into a vector of their
    /// size, without [`Bins::from_ascending`]'s walk to size the vector: the
    /// close of one-series groups converts a small pane per group.
    pub fn from_pairs(pairs: &[(i32, u64)]) -> Bins {
        if pairs.len() > FEW_KEYS {
            return Bins::from_ascending(pairs.iter().copied());
        }
        // A pair adds at most two words: a head and its count, or a zero
        // (one empty key between) and its count.
        let mut words = [0u64; 2 * FEW_KEYS];
        let (mut len, mut last_run, mut total) = (0, 0, 0);
        for &(key, count) in pairs {
            if count == 0 {
                continue;
            }
            total += count;
            let last = (len > 0).then(|| words[last_run]);
            if let Some((zero, head)) = last.and_then(|head| extend_run(head, key)) {
                if zero {
                    words[len] = 0;
                    len += 1;
                }
                words[len] = count;
                len += 1;
                words[last_run] = head;
                continue;
            }
            last_run = len;
            words[len] = run_head(key, 1);
            words[len + 1] = count;
            len += 2;
        }
        Bins {
            words: words[..len].to_vec(),
            last_run,
            total,
        }
    }

    /// (key, count) pairs, keys strictly ascending, walked twice: to size
    /// the vectors ([`stored_sizes`]), then to fill them.
    fn from_ascending(pairs: impl Iterator<Item = (i32, u64)> + Clone) -> Bins {
        let (runs, stored) = stored_sizes(pairs.clone());
        let mut bins = Bins {
            words: Vec::with_capacity(runs + stored),
            last_run: 0,
            total: 0,
        };
        for (key, count) in pairs {
            bins.push(key, count);
        }
        debug_assert_eq!(bins.words.len(), runs + stored);
        bins
    }

    /// Appends `count` at `key`, above every key held.
    fn push(&mut self, key: i32, count: u64) {
        if count == 0 {
            return;
        }
        self.total += count;
        let last = self.words.get(self.last_run);
        if let Some((zero, head)) = last.and_then(|&head| extend_run(head, key)) {
            if zero {
                self.words.push(0);
            }
            self.words.push(count);
            self.words[self.last_run] = head;
            return;
        }
        self.last_run = self.words.len();
        self.words.push(run_head(key, 1));
        self.words.push(count);
    }

    /// Each run's first key and counts, keys ascending.
    fn runs(&self) -> impl Iterator<Item = (i32, &[u64])> + '_ {
        let mut at = 0;
        std::iter::from_fn(move || {
            let (start, len) = run_of(*self.words.get(at)?);
            let counts = &self.words[at + 1..at + 1 + len as usize];
            at += 1 + len as usize;
            Some((start, counts))
        })
    }

    /// The (key, count) of every non-empty bin, keys ascending.
    pub fn iter(&self) -> impl Iterator<Item = (i32, u64)> + '_ {
        self.runs().flat_map(move |(start, counts)| {
            counts
                .iter()
                .enumerate()
                .filter(|(_, &c)| c > 0)
                .map(move |(i, &c)| (start + i as i32, c))
        })
    }

    /// Values counted.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Asks the CPU for these bins' words ahead of a walk of them.
    #[inline]
    pub fn prefetch(&self) {
        prefetch_read(self.words.as_slice());
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Bins (8 bytes each) held: the counts and one per run.
    pub fn cost(&self) -> usize {
        self.words.len()
    }

    /// The bins of both, counts added key by key.
    pub fn merged(&self, other: &Bins) -> Bins {
        let (mut a, mut b) = (self.iter().peekable(), other.iter().peekable());
        let mut out = Bins::default();
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(&(ka, ca)), Some(&(kb, cb))) => {
                    if ka < kb {
                        a.next();
                        (ka, ca)
                    } else if kb < ka {
                        b.next();
                        (kb, cb)
                    } else {
                        a.next();
                        b.next();
                        (ka, ca + cb)
                    }
                }
                (Some(_), None) => a.next().expect("peeked"),
                (None, Some(_)) => b.next().expect("peeked"),
                (None, None) => break,
            };
            out.push(next.0, next.1);
        }
        out
    }

    /// The key of the value at 0-based `rank` in key order (`rank < count`).
    #[cfg(test)]
    fn key_at_rank(&self, rank: u64) -> i32 {
        self.key_at_rank_from(rank, &mut RankCursor::default())
    }

    /// [`Bins::key_at_rank`], walking from `cursor` when `rank` is not below
    /// the values before the run it holds (else from the first run), and
    /// leaving it at the run found: a pane's quantiles, ranks ascending, take
    /// one walk of its runs, not one from the start each (as `bulk-sketch`'s
    /// open panes answer).
    fn key_at_rank_from(&self, rank: u64, cursor: &mut RankCursor) -> i32 {
        if cursor.below > rank {
            *cursor = RankCursor::default();
        }
        let RankCursor { mut at, mut below } = *cursor;
        while let Some(&head) = self.words.get(at) {
            let (start, len) = run_of(head);
            let counts = &self.words[at + 1..at + 1 + len as usize];
            let run_total: u64 = counts.iter().sum();
            if below + run_total <= rank {
                below += run_total;
                at += 1 + len as usize;
                continue;
            }
            *cursor = RankCursor { at, below };
            for (i, &c) in counts.iter().enumerate() {
                below += c;
                if below > rank {
                    return start + i as i32;
                }
            }
        }
        // Unreachable for rank < count; the crate answers its top key there.
        self.words.get(self.last_run).map_or(0, |&head| {
            let (start, len) = run_of(head);
            start + len as i32 - 1
        })
    }
}

/// Where [`Bins::key_at_rank_from`] left off: a run's head, and how many
/// values the runs before it hold.
#[derive(Clone, Copy, Default)]
struct RankCursor {
    at: usize,
    below: u64,
}

/// A pane's content, exactly (see the module doc): what a closed window keeps
/// per group and hands out.
#[derive(Clone, Debug)]
pub struct PaneBins {
    /// Bins of the positive values, by key.
    pub positive: Bins,
    /// Bins of the negative values, by the key of their magnitude.
    pub negative: Bins,
    /// `±0` and subnormal values.
    pub zero_count: u64,
    /// The exact extremes (`+∞` and `−∞` while the pane holds nothing).
    pub min: f64,
    pub max: f64,
    /// Samples of this pane refused past a receiver limit (in no bin).
    pub dropped: u64,
}

impl Default for PaneBins {
    fn default() -> Self {
        PaneBins {
            positive: Bins::default(),
            negative: Bins::default(),
            zero_count: 0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            dropped: 0,
        }
    }
}

/// Equal bins, counts and dropped samples, and extremes equal bit for bit.
impl PartialEq for PaneBins {
    fn eq(&self, o: &Self) -> bool {
        self.positive == o.positive
            && self.negative == o.negative
            && self.zero_count == o.zero_count
            && self.min.to_bits() == o.min.to_bits()
            && self.max.to_bits() == o.max.to_bits()
            && self.dropped == o.dropped
    }
}

impl PaneBins {
    /// Asks the CPU for the bins a query walks (its positive values' and
    /// negative values'), ahead of the walk.
    #[inline]
    pub fn prefetch(&self) {
        self.positive.prefetch();
        self.negative.prefetch();
    }

    /// Values counted (not the dropped ones).
    pub fn count(&self) -> u64 {
        self.positive.count() + self.negative.count() + self.zero_count
    }

    /// Bins (8 bytes each) held, the structure itself included.
    pub fn cost(&self) -> usize {
        CLOSED_PANE_BINS + self.positive.cost() + self.negative.cost()
    }

    /// Adds `other`'s values (and dropped samples), as if they had been added
    /// here: see the module doc.
    pub fn merge(&mut self, other: &PaneBins) {
        if !other.positive.is_empty() {
            self.positive = self.positive.merged(&other.positive);
        }
        if !other.negative.is_empty() {
            self.negative = self.negative.merged(&other.negative);
        }
        self.zero_count += other.zero_count;
        if other.min < self.min {
            self.min = other.min;
        }
        if self.max < other.max {
            self.max = other.max;
        }
        self.dropped += other.dropped;
    }

    /// The quantile `q` in [0, 1] (see the module doc); `None` when empty or `q` is outside.
    pub fn quantile(&self, config: &Config, q: f64) -> Option<f64> {
        self.quantile_from(config, q, &mut [RankCursor::default(); 2])
    }

    /// [`PaneBins::quantile`], each sign's walk resumed from its cursor
    /// (positive, negative: see [`Bins::key_at_rank_from`]).
    fn quantile_from(&self, config: &Config, q: f64, cursors: &mut [RankCursor; 2]) -> Option<f64> {
        let count = self.count();
        if !(0.0..=1.0).contains(&q) || count == 0 {
            return None;
        }
        if q == 0.0 {
            return Some(self.min);
        } else if q == 1.0 {
            return Some(self.max);
        }
        let rank = (q * (count as f64 - 1.0)) as u64;
        let negative = self.negative.count();
        let [positive_at, negative_at] = cursors;
        Some(if rank < negative {
            let key = self
                .negative
                .key_at_rank_from(negative - rank - 1, negative_at);
            -bin_value(config, key)
        } else if rank < self.zero_count + negative {
            0.0
        } else {
            let key = self
                .positive
                .key_at_rank_from(rank - self.zero_count - negative, positive_at);
            bin_value(config, key)
        })
    }

    /// [`PaneBins::quantile`] of each of `qs` (NaN where `None`), onto `out`:
    /// for ascending `qs`, one walk of the positive bins.
    pub fn quantiles_into(&self, config: &Config, qs: &[f64], out: &mut Vec<f64>) {
        let mut cursors = [RankCursor::default(); 2];
        out.extend(qs.iter().map(|&q| {
            self.quantile_from(config, q, &mut cursors)
                .unwrap_or(f64::NAN)
        }));
    }

    /// The bins of the crate's sketch, read from its own encoding (DataDog's
    /// DDSketch binary format, which lists every non-empty bin).
    pub fn of_ddsketch(sketch: &DDSketch) -> PaneBins {
        datadog_format::decode(&sketch.to_java_bytes())
            .expect("the crate's own encoding of a sketch decodes")
    }
}

/// The parts of DataDog's DDSketch binary format (`DDSketchWithExactSummaryStatistics`)
/// that `DDSketch::to_java_bytes` writes: flag bytes (a 2-bit type, a 6-bit
/// subflag), var-length integers (7 bits a byte, least significant first,
/// the 9th byte whole), var-length doubles (the bits of `v + 1` minus those
/// of `1`, rotated left by 6, 7 bits a byte from the top, the 9th byte whole)
/// and stores of (index delta, count) pairs.
mod datadog_format {
    use super::{Bins, PaneBins};

    const COUNT: u8 = 0xa0;
    const SUM: u8 = 0x84;
    const MIN: u8 = 0x88;
    const MAX: u8 = 0x8c;
    const ZERO_COUNT: u8 = 0x04;
    const INDEX_MAPPING_LOG: u8 = 0x02;
    /// Store flags: type 1 (positive) or 3 (negative), subflag 1 (index deltas and counts).
    const POSITIVE_STORE: u8 = (1 << 2) | 1;
    const NEGATIVE_STORE: u8 = (1 << 2) | 3;

    struct Reader<'a>(&'a [u8]);

    impl Reader<'_> {
        fn byte(&mut self) -> Result<u8, String> {
            let (&b, rest) = self.0.split_first().ok_or("truncated")?;
            self.0 = rest;
            Ok(b)
        }

        fn f64_le(&mut self) -> Result<f64, String> {
            let mut bytes = [0u8; 8];
            for b in &mut bytes {
                *b = self.byte()?;
            }
            Ok(f64::from_le_bytes(bytes))
        }

        fn var_u64(&mut self) -> Result<u64, String> {
            let mut value = 0u64;
            for shift in (0..=56).step_by(7) {
                let b = self.byte()?;
                if shift == 56 {
                    return Ok(value | (u64::from(b) << 56));
                }
                value |= u64::from(b & 0x7f) << shift;
                if b < 0x80 {
                    return Ok(value);
                }
            }
            unreachable!("the 9th byte returns")
        }

        fn var_i64(&mut self) -> Result<i64, String> {
            let zigzag = self.var_u64()?;
            Ok((zigzag >> 1) as i64 ^ -((zigzag & 1) as i64))
        }

        fn var_f64(&mut self) -> Result<f64, String> {
            let mut bits = 0u64;
            let mut shift = 57i32;
            loop {
                let b = self.byte()?;
                if shift == 1 {
                    bits |= u64::from(b);
                    break;
                }
                bits |= u64::from(b & 0x7f) << shift;
                if b < 0x80 {
                    break;
                }
                shift -= 7;
            }
            let one = 1.0f64.to_bits();
            Ok(f64::from_bits(bits.rotate_right(6).wrapping_add(one)) - 1.0)
        }

        fn count(&mut self) -> Result<u64, String> {
            let c = self.var_f64()?;
            if c < 0.0 || c.fract() != 0.0 || c > (1u64 << 53) as f64 {
                return Err(format!("count {c} is not a whole number"));
            }
            Ok(c as u64)
        }

        fn store(&mut self) -> Result<Bins, String> {
            let n = self.var_u64()?;
            let mut key = 0i64;
            let mut bins = Bins::default();
            for _ in 0..n {
                key += self.var_i64()?;
                let key = i32::try_from(key).map_err(|_| format!("key {key} out of range"))?;
                bins.push(key, self.count()?);
            }
            Ok(bins)
        }
    }

    pub(super) fn decode(bytes: &[u8]) -> Result<PaneBins, String> {
        let mut input = Reader(bytes);
        let mut pane = PaneBins::default();
        while !input.0.is_empty() {
            match input.byte()? {
                COUNT => {
                    input.var_f64()?;
                }
                SUM => {
                    input.f64_le()?;
                }
                MIN => pane.min = input.f64_le()?,
                MAX => pane.max = input.f64_le()?,
                INDEX_MAPPING_LOG => {
                    input.f64_le()?; // gamma
                    input.f64_le()?; // index offset
                }
                ZERO_COUNT => pane.zero_count = input.count()?,
                POSITIVE_STORE => pane.positive = input.store()?,
                NEGATIVE_STORE => pane.negative = input.store()?,
                other => return Err(format!("unexpected flag byte {other:#04x}")),
            }
        }
        Ok(pane)
    }
}

/// What [`Bins::push`] stores for (key, count) pairs, keys ascending: (runs,
/// counts) — a run per gap of two keys or more, a count per key held and per
/// single empty key inside a run.
fn stored_sizes(pairs: impl Iterator<Item = (i32, u64)>) -> (usize, usize) {
    let (mut runs, mut stored) = (0, 0);
    let mut end: Option<i64> = None;
    for (key, count) in pairs {
        if count == 0 {
            continue;
        }
        let key = i64::from(key);
        match end {
            Some(end) if key <= end + 1 => stored += (key - end + 1) as usize,
            _ => (runs, stored) = (runs + 1, stored + 1),
        }
        end = Some(key + 1);
    }
    (runs, stored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_normal_range_fits_in_the_bin_limit() {
        assert_eq!(normal_range_bins(0.01), 70_907);
        for alpha in [1e-4, 0.001, 0.01, 0.05, 0.5] {
            let config = sketch_config(alpha);
            let span = config.key(f64::MAX) - config.key(f64::MIN_POSITIVE) + 1;
            assert_eq!(span as u32, config.max_num_bins, "{alpha}");
            assert!(config.min_possible() < f64::MIN_POSITIVE);
            assert!(bin_value(&config, config.key(f64::MAX)).is_finite());
        }
    }

    proptest! {
        /// A dense store's bins are the pairs' bins, and each vector is
        /// allocated at its size; stores from all zeros to none, up to 300
        /// keys.
        #[test]
        fn dense_bins_are_sorted_pairs_bins(
            lo in -80_000i32..80_000,
            zeros in 0u32..=100,
            draws in prop::collection::vec((0u32..100, 1u64..5), 0..300),
        ) {
            let counts: Vec<u64> =
                draws.iter().map(|&(r, c)| if r < zeros { 0 } else { c }).collect();
            let dense = Bins::from_dense(lo, &counts);
            let pairs = counts.iter().enumerate().map(|(i, &c)| (lo + i as i32, c));
            prop_assert_eq!(&dense, &Bins::from_sorted(pairs));
            prop_assert_eq!(dense.words.capacity(), dense.words.len());
        }
    }

    proptest! {
        /// Bins from pairs, few (laid out on the stack) or more, are the
        /// bins pushed pair by pair, each vector allocated at its size:
        /// keys in runs, one key apart and further, zero counts among them.
        #[test]
        fn pairs_bins_are_sorted_pairs_bins(
            lo in -80_000i32..80_000,
            draws in prop::collection::vec((1i32..4, 0u64..5), 0..12),
        ) {
            let mut key = lo;
            let pairs: Vec<(i32, u64)> = draws
                .iter()
                .map(|&(step, count)| {
                    key += step;
                    (key, count)
                })
                .collect();
            let bins = Bins::from_pairs(&pairs);
            prop_assert_eq!(&bins, &Bins::from_sorted(pairs.iter().copied()));
            prop_assert_eq!(bins.words.capacity(), bins.words.len());
        }
    }

    proptest! {
        /// The runs found from the mask are the runs found count by count,
        /// for stores of up to 300 keys, sparse or dense (runs across a
        /// mask word's edges included).
        #[test]
        fn masked_runs_are_the_runs_counted_one_by_one(
            draws in prop::collection::vec((0u32..100, 1u64..5), 0..300),
            zeros in 0u32..=100,
        ) {
            let counts: Vec<u64> =
                draws.iter().map(|&(r, c)| if r < zeros { 0 } else { c }).collect();
            let (mut masked, mut counted) = (Vec::new(), Vec::new());
            for_each_dense_run(&counts, |run| masked.push(run));
            for_each_dense_run_by_count(&counts, |run| counted.push(run));
            prop_assert_eq!(masked, counted);
        }
    }

    /// Runs and single-zero gaps on each side of mask words' edges.
    #[test]
    fn masked_runs_join_across_word_edges() {
        for len in [63, 64, 65, 127, 128, 129, 200] {
            for pattern in 0u32..64 {
                let counts: Vec<u64> = (0..len)
                    .map(|i| u64::from((pattern >> (i % 6)) & 1 == 1 || i % 64 == 63))
                    .collect();
                let (mut masked, mut counted) = (Vec::new(), Vec::new());
                for_each_dense_run(&counts, |run| masked.push(run));
                for_each_dense_run_by_count(&counts, |run| counted.push(run));
                assert_eq!(masked, counted, "len {len}, pattern {pattern:06b}");
            }
        }
    }

    proptest! {
        /// A walk resumed from a cursor finds each rank's key as the pairs
        /// counted from the first do, for ranks in any order (ascending, as
        /// a pane's quantiles ask, or not: a lower rank starts again).
        #[test]
        fn a_resumed_walk_finds_each_ranks_key(
            pairs in prop::collection::btree_map(-300i32..300, 0u64..4, 0..60),
            ranks in prop::collection::vec(0u64..1_000, 1..12),
            ascending in any::<bool>(),
        ) {
            let bins = Bins::from_sorted(pairs.iter().map(|(&k, &c)| (k, c)));
            prop_assume!(bins.count() > 0);
            let mut ranks: Vec<u64> = ranks.iter().map(|r| r % bins.count()).collect();
            if ascending {
                ranks.sort_unstable();
            }
            let naive = |rank: u64| {
                let mut below = 0;
                bins.iter()
                    .find(|&(_, c)| {
                        below += c;
                        below > rank
                    })
                    .map(|(key, _)| key)
            };
            let mut cursor = RankCursor::default();
            for rank in ranks {
                prop_assert_eq!(Some(bins.key_at_rank_from(rank, &mut cursor)), naive(rank));
            }
        }
    }

    /// A store of many runs (a count every third key: 100 runs of one), and
    /// one past [`MASKED_COUNTS`] (its runs found count by count), to their
    /// pairs' bins.
    #[test]
    fn a_dense_store_of_many_runs_is_its_pairs_bins() {
        let long: Vec<u64> = (0..MASKED_COUNTS as u64 + 10)
            .map(|i| u64::from(i % 5 < 2) * (i + 1))
            .collect();
        let dense = Bins::from_dense(7, &long);
        let pairs = long.iter().enumerate().map(|(i, &c)| (i as i32 + 7, c));
        assert_eq!(dense, Bins::from_sorted(pairs));
        assert_eq!(dense.words.capacity(), dense.words.len());
        let counts: Vec<u64> = (0..300).map(|i| u64::from(i % 3 == 0) * (i + 1)).collect();
        let dense = Bins::from_dense(-40, &counts);
        assert_eq!(dense.runs().count(), 100);
        let pairs = counts.iter().enumerate().map(|(i, &c)| (i as i32 - 40, c));
        assert_eq!(dense, Bins::from_sorted(pairs));
        assert_eq!(dense.words.capacity(), dense.words.len());
    }

    #[test]
    fn runs_store_single_gaps_as_zeros() {
        const _: () = assert!(CLOSED_PANE_BINS + 2 <= crate::ingest::sketch::PANE_BINS);
        let bins = Bins::from_sorted([(1, 2), (2, 1), (4, 5), (9, 1), (10, 0)]);
        assert_eq!(
            bins.runs().collect::<Vec<_>>(),
            vec![(1, &[2, 1, 0, 5][..]), (9, &[1][..])]
        );
        assert_eq!(
            bins.words,
            vec![run_head(1, 4), 2, 1, 0, 5, run_head(9, 1), 1]
        );
        assert_eq!(bins.cost(), 7);
        assert_eq!(bins.count(), 9);
        assert_eq!(
            bins.iter().collect::<Vec<_>>(),
            vec![(1, 2), (2, 1), (4, 5), (9, 1)]
        );
        assert_eq!(
            (0..9).map(|r| bins.key_at_rank(r)).collect::<Vec<_>>(),
            vec![1, 1, 2, 4, 4, 4, 4, 4, 9]
        );
    }

    fn pairs() -> impl Strategy<Value = Vec<(i32, u64)>> {
        prop::collection::btree_map(-40i32..40, 0u64..4, 0..30)
            .prop_map(|m| m.into_iter().collect())
    }

    proptest! {
        /// Merging adds counts key by key and never costs more than its inputs.
        #[test]
        fn merged_bins_add_and_cost_no_more(a in pairs(), b in pairs()) {
            let (x, y) = (Bins::from_sorted(a.clone()), Bins::from_sorted(b.clone()));
            let merged = x.merged(&y);
            let mut want = std::collections::BTreeMap::new();
            for (k, c) in a.into_iter().chain(b) {
                *want.entry(k).or_insert(0) += c;
            }
            want.retain(|_, c| *c > 0);
            prop_assert_eq!(merged.iter().collect::<Vec<_>>(), want.into_iter().collect::<Vec<_>>());
            prop_assert!(merged.cost() <= x.cost() + y.cost());
            prop_assert_eq!(merged.count(), x.count() + y.count());
        }
    }
}
