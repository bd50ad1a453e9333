//! Across cores: whole requests on N lanes at once.
//!
//! A lane is a whole [`Ingester`] (its own series cache and open windows)
//! behind its own lock; a request takes whichever lane is free and goes
//! through every seam there, so N requests ingest on N cores sharing only the
//! watermark, the budget and the group table ([`super::groups`]: a group has
//! one id in every lane; the table's lock is taken when a lane meets a group
//! key it has not resolved yet). Lane 0 is the home: when the watermark closes
//! a window, every lane's panes of it are merged into the home's as bins,
//! group by group, and the home keeps it and answers queries of it.
//!
//! Why the quantiles are one ingester's, bit for bit:
//! - A pane's sketch does not depend on the order it was fed: its bins,
//!   count, min and max are those of the multiset of values, and merging
//!   bins adds them ([`PaneBins::merge`](super::bins::PaneBins::merge),
//!   property-tested for both sketch seams). So a group's pane merged from
//!   the lanes is the pane one ingester makes of the same samples.
//! - Which samples a pane takes depends on the watermark only through which
//!   windows it has closed. Every lane applies a request against the windows
//!   closed so far; a request whose watermark closes a window, before it is
//!   answered, waits for the requests in flight and closes the window on every
//!   lane at once. Requests applied one after another (on any lanes) are
//!   therefore one ingester's run; requests applied at the same time are each
//!   judged against the windows closed before either, as if they were one
//!   request. The clock closes a window as a request with no samples would
//!   ([`LanedIngester::advance_with_clock`]).
//! - The exception: of the extremes `0.0` and `-0.0` (equal values), one
//!   ingester keeps the first it saw as min or max (q = 0 or 1) and a merge
//!   keeps the home's.
//!
//! Limits are the ingester's, not a lane's: groups, pane slots and bins are
//! taken from one budget before any lane holds them, so all lanes together
//! stay within the [`Limits`](super::pipeline::Limits) (merging a window's
//! panes at its close needs no more bins or slots than they held). Every
//! (sample, aggregation) pair a lane takes is accepted, late, or dropped past
//! a limit, once: a merge never refuses. Below the limits the outcome is one
//! ingester's; at them, a lane may drop a sample one ingester would have kept
//! (only the home holds closed windows, which go first under pressure: a
//! lane that had to refuse asks the home to drop them before the next request).

use super::budget::Held;
use super::groups::Shared;
use super::pipeline::{CacheStats, ClosedBins, IngestError, Ingester, Limits};
use super::plan::Plan;
use super::window::{PaneReport, QueryResult, Stats, WindowBins};
use crate::shared::strategy::StrategySet;
use parking_lot::{Mutex, MutexGuard};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;

thread_local! {
    /// The lane this thread took last.
    static LAST_LANE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Most lanes one ingester has.
pub const MAX_LANES: usize = 64;

/// N lanes of one ingester (see the module doc).
pub struct LanedIngester {
    lanes: Box<[Mutex<Ingester>]>,
    /// The lanes' budget and groups.
    shared: Arc<Shared>,
    /// The watermark every lane was last advanced to (changed with every lane locked).
    closed_through: AtomicI64,
    /// The latest watermark a request (or the clock) advanced to (at least `closed_through`).
    watermark: AtomicI64,
    /// The newest sample timestamp any lane took.
    newest_sample: AtomicI64,
    /// Where the next request starts looking for a free lane.
    next: AtomicUsize,
    /// One closer at a time (taken before the lanes' locks).
    closing: Mutex<()>,
}

/// The counters a `/metrics` scrape reads, summed over the lanes
/// ([`LanedIngester::counters`]).
#[derive(Clone, Debug)]
pub struct LaneCounters {
    pub totals: Stats,
    pub cache: CacheStats,
    /// Panes and bins held (open + closed).
    pub footprint: (usize, usize),
    pub generation: u64,
    pub limits: Limits,
}

impl LanedIngester {
    /// `lanes` lanes (clamped to `1..=MAX_LANES`), each made by `make` (all
    /// alike, before any request), sharing the first one's budget and groups.
    pub fn new(lanes: usize, mut make: impl FnMut() -> Ingester) -> Self {
        let mut made: Vec<Ingester> = (0..lanes.clamp(1, MAX_LANES)).map(|_| make()).collect();
        let shared = made[0].shared().clone();
        for lane in &mut made[1..] {
            lane.share(&shared);
        }
        let lanes = made.into_iter().map(Mutex::new).collect();
        LanedIngester {
            lanes,
            shared,
            closed_through: AtomicI64::new(i64::MIN),
            watermark: AtomicI64::new(i64::MIN),
            newest_sample: AtomicI64::new(i64::MIN),
            next: AtomicUsize::new(0),
            closing: Mutex::new(()),
        }
    }

    /// `lanes` lanes of `Ingester::new(plan, strategies)`.
    pub fn with_plan(lanes: usize, plan: &Plan, strategies: StrategySet) -> Self {
        Self::new(lanes, || Ingester::new(plan.clone(), strategies))
    }

    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    fn lock(&self, lane: usize) -> MutexGuard<'_, Ingester> {
        self.lanes[lane].lock()
    }

    fn lock_all(&self) -> Vec<MutexGuard<'_, Ingester>> {
        (0..self.lanes.len()).map(|i| self.lock(i)).collect()
    }

    /// The first free lane from the one this thread used last (a new thread:
    /// from a rotating start), else that one (waiting). Staying on one lane
    /// keeps a lane's memory with one thread: with glibc's malloc, growing a
    /// sketch's bins on another thread than the one that allocated them waits
    /// for that thread's arena; and a sender's series stay learned in one
    /// lane's series cache. While a close holds the lanes, a thread waits for
    /// its own: the closer releases them one by one, and a thread that took
    /// the first one released, another's, would make both lanes learn each
    /// other's senders again (a new series costs several known ones).
    fn free_lane(&self) -> (usize, MutexGuard<'_, Ingester>) {
        let n = self.lanes.len();
        let start = match LAST_LANE.get() {
            last if last < n => last,
            _ => self.next.fetch_add(1, Ordering::Relaxed) % n,
        };
        if self.closing.is_locked() {
            LAST_LANE.set(start);
            return (start, self.lock(start));
        }
        for i in (start..n).chain(0..start) {
            if let Some(lane) = self.lanes[i].try_lock() {
                LAST_LANE.set(i);
                return (i, lane);
            }
        }
        (start, self.lock(start))
    }

    /// One request body as sent (snappy block), on a free lane.
    pub fn handle(&self, body: &[u8]) -> Result<Stats, IngestError> {
        let (i, mut lane) = self.free_lane();
        let applied = lane.handle_deferred(body);
        self.finish(i, lane, applied)
    }

    /// One decompressed `WriteRequest`, on a free lane.
    pub fn handle_decoded(&self, raw: &[u8]) -> Result<Stats, IngestError> {
        let (i, mut lane) = self.free_lane();
        let applied = lane.handle_decoded_deferred(raw);
        self.finish(i, lane, applied)
    }

    /// One request body on lane `lane` (modulo the lanes): for runs that
    /// choose which lane takes which request.
    pub fn handle_on(&self, lane: usize, body: &[u8]) -> Result<Stats, IngestError> {
        let i = lane % self.lanes.len();
        let mut lane = self.lock(i);
        let applied = lane.handle_deferred(body);
        self.finish(i, lane, applied)
    }

    /// Records the request's watermark; if it closes a window of any
    /// aggregation, closes it on every lane before the request is answered.
    /// A lane other than the home that had to refuse samples past the bins
    /// or pane slots has the home drop closed windows, as one ingester would
    /// have before refusing.
    fn finish(
        &self,
        i: usize,
        lane: MutexGuard<'_, Ingester>,
        applied: Result<(Stats, i64), IngestError>,
    ) -> Result<Stats, IngestError> {
        let (stats, watermark) = applied?;
        let closed = self.closed_through.load(Ordering::Acquire);
        let closes = ends_a_window(&lane.plan().plan, closed, watermark);
        // Read first: most requests do not move them, and a write would take
        // the cache line from the other lanes' cores.
        if watermark > self.watermark.load(Ordering::Acquire) {
            self.watermark.fetch_max(watermark, Ordering::AcqRel);
        }
        if let Some(newest) = lane.newest_sample() {
            if newest > self.newest_sample.load(Ordering::Relaxed) {
                self.newest_sample.fetch_max(newest, Ordering::Relaxed);
            }
        }
        drop(lane);
        if i != 0 && stats.over_bin_limit + stats.over_pane_limit > 0 {
            self.lock(0).relieve();
        }
        if closes {
            self.close();
        }
        Ok(stats)
    }

    /// Waits for the requests in flight, then merges every lane's panes of the
    /// windows the watermark closes into the home's, and advances every lane.
    fn close(&self) {
        let _closer = self.closing.lock();
        let mut lanes = self.lock_all();
        let watermark = self.watermark.load(Ordering::Acquire);
        if watermark <= self.closed_through.load(Ordering::Acquire) {
            return; // another request's close got here first
        }
        let (home, rest) = lanes.split_first_mut().expect("one lane at least");
        let mut rest: Vec<&mut Ingester> = rest.iter_mut().map(|l| &mut **l).collect();
        home.close_with(&mut rest, watermark);
        self.closed_through.store(watermark, Ordering::Release);
    }

    /// Moves the watermark on as the clock passes samples that came stamped
    /// ahead of it (the watermark, held behind the clock, stopped short of
    /// them when they came), closing the windows that ends, as a request
    /// with no samples would. Without it a window whose last samples came
    /// early stays open until the next request. For a timer to call.
    pub fn advance_with_clock(&self) {
        let newest = self.newest_sample.load(Ordering::Relaxed);
        if newest == i64::MIN {
            return;
        }
        let watermark = {
            let home = self.lock(0);
            let Some(watermark) = home.watermark_by_clock(newest) else {
                return;
            };
            let closed = self.closed_through.load(Ordering::Acquire);
            if !ends_a_window(&home.plan().plan, closed, watermark) {
                return;
            }
            watermark
        };
        self.watermark.fetch_max(watermark, Ordering::AcqRel);
        self.close();
    }

    /// Closes every open window, as if the stream had ended.
    pub fn flush(&self) {
        self.watermark.store(i64::MAX, Ordering::Release);
        self.close();
    }

    /// Installs a plan on every lane (bumping the generation), as [`Ingester::set_plan`].
    pub fn set_plan(&self, plan: Plan) {
        let _closer = self.closing.lock();
        for mut lane in self.lock_all() {
            lane.set_plan(plan.clone());
        }
    }

    /// The plan's generation (every lane's).
    pub fn generation(&self) -> u64 {
        self.lock(0).plan().generation
    }

    pub fn plan(&self) -> Plan {
        self.lock(0).plan().plan.clone()
    }

    pub fn watermark(&self) -> Option<i64> {
        let w = self.watermark.load(Ordering::Acquire);
        (w != i64::MIN).then_some(w)
    }

    /// Every window that ends at or before this has been closed on every
    /// lane, its panes merged into the home's (`None` before the first close).
    pub fn closed_through(&self) -> Option<i64> {
        let w = self.closed_through.load(Ordering::Acquire);
        (w != i64::MIN).then_some(w)
    }

    /// `f` of the home lane, which holds every closed window, and
    /// [`LanedIngester::closed_through`] as it stands while `f` runs (a
    /// close changes both with every lane locked).
    pub fn with_home<R>(&self, f: impl FnOnce(&Ingester, Option<i64>) -> R) -> R {
        let home = self.lock(0);
        f(&home, self.closed_through())
    }

    pub fn limits(&self) -> Limits {
        *self.lock(0).limits()
    }

    pub fn strategies(&self) -> StrategySet {
        self.lock(0).strategies()
    }

    /// Summed over the lanes: every (sample, aggregation) pair once.
    pub fn totals(&self) -> Stats {
        let mut sum = Stats::default();
        for i in 0..self.lanes.len() {
            sum.merge(&self.lock(i).totals());
        }
        sum
    }

    /// [`LanedIngester::totals`], the series caches' counters, the panes and
    /// bins held (open + closed), the plan's generation and the limits, in
    /// one pass that takes each lane's lock once: what a `/metrics` scrape
    /// reads. Under a full ingest queue each lock waits for the request the
    /// lane is applying; five separate reads waited for five of them.
    pub fn counters(&self) -> LaneCounters {
        let mut c: Option<LaneCounters> = None;
        for i in 0..self.lanes.len() {
            let lane = self.lock(i);
            let c = c.get_or_insert_with(|| LaneCounters {
                totals: Stats::default(),
                cache: CacheStats::default(),
                footprint: (0, 0),
                generation: lane.plan().generation,
                limits: *lane.limits(),
            });
            c.totals.merge(&lane.totals());
            c.cache.add(&lane.cache_stats());
            let (panes, bins) = lane.footprint();
            c.footprint.0 += panes;
            c.footprint.1 += bins;
        }
        c.expect("a laned ingester has a lane")
    }

    /// What the lanes hold together of what the limits bound (no lane's lock taken).
    pub fn held(&self) -> Held {
        self.shared.budget.held()
    }

    /// Groups reclaimed since start.
    pub fn groups_reclaimed(&self) -> u64 {
        self.shared.budget.reclaimed()
    }

    /// One aggregation's quantiles for its last closed window (or `window`),
    /// as one ingester answers: a closed window from the home, an open one
    /// merged from every lane.
    pub fn query(&self, aggregation: &str, window: Option<i64>) -> Option<QueryResult> {
        let home = self.lock(0);
        if self.lanes.len() == 1 || home_has(&home, aggregation, window) {
            return home.query(aggregation, window);
        }
        let a = home.position(aggregation)?;
        let mut lanes = vec![home];
        lanes.extend((1..self.lanes.len()).map(|i| self.lock(i)));
        let merged = merged_open(&lanes, a, window);
        let table = lanes[0].shared().groups.lock();
        Some(lanes[0].accumulators()[a].query_bins(merged.values().next(), table.agg(a)))
    }

    /// [`LanedIngester::query`]'s answer as JSON (the bytes `serde_json` makes
    /// of it), appended to `out`; `false` when there is no such aggregation.
    pub fn query_json(&self, aggregation: &str, window: Option<i64>, out: &mut Vec<u8>) -> bool {
        let home = self.lock(0);
        if self.lanes.len() == 1 || home_has(&home, aggregation, window) {
            return home.query_json(aggregation, window, out);
        }
        let Some(a) = home.position(aggregation) else {
            return false;
        };
        let mut lanes = vec![home];
        lanes.extend((1..self.lanes.len()).map(|i| self.lock(i)));
        let merged = merged_open(&lanes, a, window);
        let table = lanes[0].shared().groups.lock();
        lanes[0].accumulators()[a].encode_bins(merged.values().next(), table.agg(a), out);
        true
    }

    /// An aggregation's closed windows as they are handed out (the home keeps them):
    /// see [`Ingester::closed_bins`].
    pub fn closed_bins(&self, aggregation: &str) -> Option<Vec<ClosedBins>> {
        self.lock(0).closed_bins(aggregation)
    }

    /// Every aggregation's last closed window, in plan order.
    pub fn query_all(&self) -> Vec<QueryResult> {
        self.lock(0).query_all()
    }

    /// [`LanedIngester::query_all`]'s JSON, as [`Ingester::query_all_json`]
    /// writes it (no `QueryResult` built).
    pub fn query_all_json(&self, out: &mut Vec<u8>) {
        self.lock(0).query_all_json(out)
    }

    /// Every pane (open and closed), sorted: the exact outcome, as one ingester's.
    pub fn snapshot(&self) -> Vec<PaneReport> {
        let lanes = self.lock_all();
        let mut panes: Vec<PaneReport> = lanes[0]
            .snapshot()
            .into_iter()
            .filter(|p| p.closed)
            .collect();
        let table = lanes[0].shared().groups.lock();
        for a in 0..lanes[0].accumulators().len() {
            for bins in merged_open(&lanes, a, None).values() {
                panes.extend(lanes[0].accumulators()[a].bins_panes(bins, table.agg(a)));
            }
        }
        panes.sort();
        panes
    }
}

/// One lane: one ingester, as it is.
impl From<Ingester> for LanedIngester {
    fn from(ingester: Ingester) -> Self {
        let mut only = Some(ingester);
        Self::new(1, || only.take().expect("one lane"))
    }
}

/// Whether moving the watermark from `closed` to `watermark` ends a window
/// of `plan` (windows end on multiples of their length).
fn ends_a_window(plan: &Plan, closed: i64, watermark: i64) -> bool {
    watermark > closed
        && plan.aggregations.iter().any(|agg| {
            let ms = agg.window_ms();
            watermark.div_euclid(ms) > closed.div_euclid(ms)
        })
}

/// Whether the home alone answers: the last closed window, or a closed one
/// (an aggregation that does not exist answers nothing there either).
fn home_has(home: &Ingester, aggregation: &str, window: Option<i64>) -> bool {
    let Some(a) = home.position(aggregation) else {
        return true;
    };
    match window {
        None => true,
        Some(start) => home.accumulators()[a].closed_starts().any(|s| s == start),
    }
}

/// Aggregation `a`'s open windows (only `window`, when given) over every
/// lane, merged as bins (group by group id), by start.
fn merged_open(
    lanes: &[MutexGuard<'_, Ingester>],
    a: usize,
    window: Option<i64>,
) -> BTreeMap<i64, WindowBins> {
    let mut merged: BTreeMap<i64, WindowBins> = BTreeMap::new();
    for lane in lanes {
        for bins in lane.accumulators()[a].open_bins(window) {
            match merged.get_mut(&bins.start) {
                Some(into) => into.merge(bins),
                None => {
                    merged.insert(bins.start, bins);
                }
            }
        }
    }
    merged
}
