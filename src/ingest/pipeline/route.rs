//! The route seam: a request's samples to their destinations. Two routers:
//! per sample, string keys into a `HashMap` of vectors (upstream's shape), and
//! batched (`batch-routing`), destinations once per series and a counting
//! sort. Both read the canonicalize seam's [`Resolved`].

use super::canonical::{group_key_of, parse_series_key, Resolved};
use super::intern;
use super::series_cache::SeriesCache;
use crate::ingest::budget::Budget;
use crate::ingest::groups::Shared;
use crate::ingest::plan::Plan;
use crate::ingest::sketch::PaneSketch;
use crate::ingest::window::{Accumulator, Stats, STALE_NAN_BITS};
use crate::ingest::wire::{Batch, Sample};
use std::collections::hash_map::{Entry, HashMap};

/// What a request's samples are routed by and added to: the ingester's
/// plan, series cache, destinations and accumulators, borrowed for one
/// request, and its watermark.
pub(super) struct Router<'a> {
    pub(super) plan: &'a Plan,
    pub(super) cache: &'a SeriesCache,
    /// The ingester's copy of the group table's destinations (see [`intern`]).
    pub(super) dests: &'a mut Vec<(u16, u32)>,
    /// The group table and the budget.
    pub(super) shared: &'a Shared,
    pub(super) accumulators: &'a mut [Accumulator],
    pub(super) watermark: i64,
    /// The batched router's scratch space, reused across requests.
    pub(super) scratch: &'a mut RouteScratch,
}

impl Router<'_> {
    /// Reference route: per sample and aggregation, string keys into a `HashMap`
    /// of per-destination vectors; then each vector goes to the sketch seam.
    #[inline(never)] // one call per request; kept apart so profiles show the seam
    pub(super) fn route_per_sample(
        &mut self,
        batch: &Batch<'_>,
        resolved: &Resolved,
        latest: i64,
        stats: &mut Stats,
    ) -> Option<i64> {
        let mut routed: HashMap<(u16, String), Vec<RoutedSample>> = HashMap::new();
        // The keys in the order they first came: the groups are created in
        // that order, not in the map's (its seed is random, and which groups
        // a full group limit lets in must not depend on it).
        let mut first_seen: Vec<(u16, String)> = Vec::new();
        let mut newest: Option<i64> = None;
        for (i, span) in batch.series.iter().enumerate() {
            for sample in batch.series_samples(span) {
                if !classify(sample, latest, stats) {
                    continue;
                }
                let mut matched = false;
                resolved.for_each_routed_key(i, self.plan, self.cache, |agg, group, series| {
                    matched = true;
                    let sample = RoutedSample {
                        series,
                        timestamp: sample.timestamp,
                        value: sample.value,
                    };
                    match routed.entry((agg, group)) {
                        Entry::Occupied(samples) => samples.into_mut().push(sample),
                        Entry::Vacant(new) => {
                            first_seen.push(new.key().clone());
                            new.insert(vec![sample]);
                        }
                    }
                });
                if matched {
                    newest = newest.max(Some(sample.timestamp));
                } else {
                    stats.unrouted += 1;
                }
            }
        }
        let watermark = self.watermark;
        let (mut ts, mut values) = (Vec::new(), Vec::new());
        for key in first_seen {
            let samples = routed.remove(&key).expect("every key first seen is routed");
            let (agg, group) = key;
            let (gid, _) = intern(self.shared, self.dests, agg, group.as_bytes());
            ts.clear();
            values.clear();
            for s in &samples {
                debug_assert!(!s.series.is_empty());
                ts.push(s.timestamp);
                values.push(s.value);
            }
            self.accumulators[agg as usize].add(
                gid,
                &ts,
                &values,
                watermark,
                stats,
                &self.shared.budget,
            );
        }
        newest
    }

    /// `batch-routing`: destinations once per series, then a stable counting sort
    /// of the routed series' samples into one contiguous run per destination.
    ///
    /// Real senders put one sample per series in a request and most series feed
    /// no aggregation, so the scatter walks only the series that were routed.
    #[inline(never)] // one call per request; kept apart so profiles show the seam
    pub(super) fn route_batched(
        &mut self,
        batch: &Batch<'_>,
        resolved: &Resolved,
        latest: i64,
        stats: &mut Stats,
    ) -> Option<i64> {
        let sc = &mut *self.scratch;
        // Per series its range of destination ids in `dest_ids`: a slice of the
        // series cache, or (without it) ids re-derived once per series here.
        let mut derived = std::mem::take(&mut sc.series_dests);
        derived.clear();
        sc.dest_ranges.clear();
        let (dest_ids, cached): (&[u32], Option<&[u32]>) = match resolved {
            Resolved::PerRequest(all) => {
                for s in all {
                    let d0 = derived.len() as u32;
                    if !s.aggs.is_empty() {
                        let labels = parse_series_key(&s.series_key);
                        for &agg in &s.aggs {
                            let group_by = &self.plan.aggregations[agg as usize].group_by;
                            let (_, dest) = intern(
                                self.shared,
                                self.dests,
                                agg,
                                group_key_of(&labels, group_by).as_bytes(),
                            );
                            derived.push(dest);
                        }
                    }
                    sc.dest_ranges.push((d0, derived.len() as u32));
                }
                (&derived, None)
            }
            Resolved::Cached(ids) => (&self.cache.dest_ids, Some(ids)),
        };
        // Classify every sample; count the valid ones per destination of
        // routed series. A cached series' range is read here, in the same
        // pass, and kept only for the series that are routed.
        let entries = &self.cache.entries;
        let mut newest: Option<i64> = None;
        sc.routed.clear();
        // Consecutive series of one destination (a sender sends a group's
        // series together) are counted as one run: the destination's count
        // is read and written once a run, not once a series. Its first touch
        // is still the run's first series, so destinations are added in the
        // order they were first touched.
        let mut run = SingleDestRun::NONE;
        for (i, span) in batch.series.iter().enumerate() {
            let (d0, d1) = match cached {
                Some(ids) => {
                    let (first, n) = entries[ids[i] as usize].dests;
                    (first, first + n)
                }
                None => sc.dest_ranges[i],
            };
            let samples = batch.series_samples(span);
            if d0 == d1 {
                for sample in samples {
                    if classify(sample, latest, stats) {
                        stats.unrouted += 1;
                    }
                }
                continue;
            }
            let mut valid = 0u32;
            for sample in samples {
                if classify(sample, latest, stats) {
                    valid += 1;
                    newest = newest.max(Some(sample.timestamp));
                }
            }
            if valid > 0 {
                let dests = &dest_ids[d0 as usize..d1 as usize];
                match *dests {
                    [d] if d == run.dest => run.n += valid,
                    [d] => {
                        run.count_into(sc);
                        run = SingleDestRun { dest: d, n: valid };
                    }
                    _ => {
                        run.count_into(sc);
                        run = SingleDestRun::NONE;
                        for &d in dests {
                            sc.count(d, valid);
                        }
                    }
                }
                sc.routed.push(Routed {
                    series: i as u32,
                    dests: (d0, d1),
                });
            }
        }
        run.count_into(sc);
        let watermark = self.watermark;
        sc.scatter_and_add(
            batch,
            dest_ids,
            latest,
            Groups {
                dests: self.dests,
                accumulators: self.accumulators,
                budget: &self.shared.budget,
            },
            watermark,
            stats,
        );
        sc.reset();
        sc.series_dests = derived;
        newest
    }
}

/// `false` for samples that go nowhere: stale markers (skipped), other NaN/±Inf
/// (rejected), and samples stamped after `latest` (too far ahead).
#[inline]
fn classify(sample: &Sample, latest: i64, stats: &mut Stats) -> bool {
    if takes(sample, latest) {
        return true;
    }
    if !sample.value.is_finite() {
        if sample.value.to_bits() == STALE_NAN_BITS {
            stats.stale += 1;
        } else {
            stats.rejected += 1;
        }
    } else {
        stats.too_far_ahead += 1;
    }
    false
}

/// What [`classify`] lets through, without counting.
#[inline]
fn takes(sample: &Sample, latest: i64) -> bool {
    sample.value.is_finite() && sample.timestamp <= latest
}

/// A sample on its way to an accumulator, as upstream carries it.
struct RoutedSample {
    series: String,
    timestamp: i64,
    value: f64,
}

/// Where [`RouteScratch::scatter_and_add`] adds: an ingester's
/// destinations, accumulators and budget.
pub(super) struct Groups<'a> {
    pub(super) dests: &'a [(u16, u32)],
    pub(super) accumulators: &'a mut [Accumulator],
    pub(super) budget: &'a Budget,
}

/// The samples counted so far for the destination of the last routed
/// series, while consecutive series have it as their only destination.
#[derive(Clone, Copy)]
struct SingleDestRun {
    dest: u32,
    n: u32,
}

impl SingleDestRun {
    const NONE: SingleDestRun = SingleDestRun {
        dest: u32::MAX,
        n: 0,
    };

    #[inline]
    fn count_into(self, sc: &mut RouteScratch) {
        if self.n > 0 {
            sc.count(self.dest, self.n);
        }
    }
}

/// A series the scatter walks: its index in the request and its range of
/// destination ids.
pub(super) struct Routed {
    series: u32,
    dests: (u32, u32),
}

/// How many destinations ahead of its add a pane is prefetched.
const PREFETCH_AHEAD: usize = 8;

/// Scratch space of the batched router, reused across requests.
#[derive(Default)]
pub(super) struct RouteScratch {
    /// Destination ids re-derived per request (without the series cache).
    pub(super) series_dests: Vec<u32>,
    /// Per series, its range of destination ids (without the series cache).
    pub(super) dest_ranges: Vec<(u32, u32)>,
    /// The series with a destination and a valid sample, in request order.
    pub(super) routed: Vec<Routed>,
    pub(super) counts: Vec<u32>,
    pub(super) start: Vec<u32>,
    pub(super) cursor: Vec<u32>,
    pub(super) touched: Vec<u32>,
    pub(super) ts: Vec<i64>,
    pub(super) values: Vec<f64>,
}

impl RouteScratch {
    #[inline]
    pub(super) fn count(&mut self, dest: u32, n: u32) {
        let d = dest as usize;
        if d >= self.counts.len() {
            self.counts.resize(d + 1, 0);
            self.start.resize(d + 1, 0);
            self.cursor.resize(d + 1, 0);
        }
        if self.counts[d] == 0 {
            self.touched.push(dest);
        }
        self.counts[d] += n;
    }

    /// Scatters the valid samples of the `routed` series (counted per
    /// destination with [`count`](Self::count)) into one contiguous run per
    /// destination, in first-touch order, and adds each run to its group.
    #[inline]
    pub(super) fn scatter_and_add(
        &mut self,
        batch: &Batch<'_>,
        dest_ids: &[u32],
        latest: i64,
        into: Groups<'_>,
        watermark: i64,
        stats: &mut Stats,
    ) {
        if self.routed.is_empty() {
            return;
        }
        let total = self.offsets_from_counts();
        // Every slot below `total` is written by the scatter before it is
        // read, so the arrays only grow (no zeroing per request).
        if self.ts.len() < total {
            self.ts.resize(total, 0);
            self.values.resize(total, 0.0);
        }
        // The cursor of the last single destination, also held here while
        // consecutive series write to it: the next series of a run starts
        // from the register, not from a load of what was just stored.
        let mut held: Option<(u32, usize)> = None;
        for routed in &self.routed {
            let (d0, d1) = routed.dests;
            let dests = &dest_ids[d0 as usize..d1 as usize];
            let samples = batch.series_samples(&batch.series[routed.series as usize]);
            if let &[d] = dests {
                let mut at = match held {
                    Some((h, at)) if h == d => at,
                    _ => self.cursor[d as usize] as usize,
                };
                for sample in samples {
                    if takes(sample, latest) {
                        self.ts[at] = sample.timestamp;
                        self.values[at] = sample.value;
                        at += 1;
                    }
                }
                self.cursor[d as usize] = at as u32;
                held = Some((d, at));
                continue;
            }
            held = None;
            for sample in samples {
                if !takes(sample, latest) {
                    continue;
                }
                for &d in dests {
                    let at = self.cursor[d as usize] as usize;
                    self.ts[at] = sample.timestamp;
                    self.values[at] = sample.value;
                    self.cursor[d as usize] += 1;
                }
            }
        }
        for (k, &d) in self.touched.iter().enumerate() {
            // The pane a few destinations on is asked for now (its structure,
            // then its bins), so that its cache misses overlap the adds
            // before it.
            if let Some(pane) = self
                .touched
                .get(k + PREFETCH_AHEAD)
                .and_then(|&n| self.pane_of(n, &into))
            {
                pane.prefetch();
            }
            if let Some(&next) = self.touched.get(k + PREFETCH_AHEAD / 2) {
                // One value touches one line: its miss is not worth a lookup.
                let values = self.counts[next as usize] as usize;
                if let Some(pane) = (values > 1).then(|| self.pane_of(next, &into)).flatten() {
                    pane.prefetch_bins(values);
                }
            }
            let (agg, gid) = into.dests[d as usize];
            let (a, b) = (
                self.start[d as usize] as usize,
                self.cursor[d as usize] as usize,
            );
            into.accumulators[agg as usize].add(
                gid,
                &self.ts[a..b],
                &self.values[a..b],
                watermark,
                stats,
                into.budget,
            );
        }
    }

    /// The pane destination `d`'s add will reach, if its window is open
    /// (for a prefetch ahead of the add).
    #[inline]
    fn pane_of<'g>(&self, d: u32, into: &'g Groups<'_>) -> Option<&'g PaneSketch> {
        let (agg, gid) = into.dests[d as usize];
        let first_ts = self.ts[self.start[d as usize] as usize];
        into.accumulators[agg as usize].newest_open_pane(gid, first_ts)
    }

    pub(super) fn offsets_from_counts(&mut self) -> usize {
        let mut at = 0u32;
        for &d in &self.touched {
            self.start[d as usize] = at;
            self.cursor[d as usize] = at;
            at += self.counts[d as usize];
        }
        at as usize
    }

    pub(super) fn reset(&mut self) {
        for &d in &self.touched {
            self.counts[d as usize] = 0;
        }
        self.touched.clear();
    }
}
