//! Across cores: whole requests on N lanes at once.
//!
//! A lane is a whole [`Ingester`] (its own series cache, groups and open
//! windows) behind its own lock; a request takes whichever lane is free and
//! goes through every seam there, so N requests ingest on N cores with nothing
//! shared but a watermark. Lane 0 is the home: when the watermark closes a
//! window, every lane's panes of it are merged into the home's, which closes
//! it, keeps it and answers queries of it.
//!
//! Why the quantiles are one ingester's, bit for bit:
//! - A pane's sketch does not depend on the order it was fed: its bins,
//!   count, min and max are those of the multiset of values
//!   ([`PaneSketch::merge`](super::sketch::PaneSketch::merge), property-tested
//!   through collapses for both sketch seams). So a group's pane merged from
//!   the lanes is the pane one ingester makes of the same samples.
//! - Which samples a pane takes depends on the watermark only through which
//!   windows it has closed. Every lane applies a request against the windows
//!   closed so far; a request whose watermark closes a window, before it is
//!   answered, waits for the requests in flight and closes the window on every
//!   lane at once. Requests applied one after another (on any lanes) are
//!   therefore one ingester's run; requests applied at the same time are each
//!   judged against the windows closed before either, as if they were one
//!   request.
//! - The exception: of the extremes `0.0` and `-0.0` (equal values), one
//!   ingester keeps the first it saw as min or max (q = 0 or 1) and a merge
//!   keeps the home's.
//!
//! Limits: each lane holds up to its [`Limits`](super::pipeline::Limits);
//! lanes past the home hold only open windows and their series cache, so N
//! lanes hold at most N times the limits. Below them the outcome is one
//! ingester's; at them, a lane may drop a sample one ingester would have kept.

use super::pipeline::{CacheStats, IngestError, Ingester, Limits};
use super::plan::Plan;
use super::window::{Accumulator, Budget, Capacity, Held, PaneReport, QueryResult, Stats};
use crate::strategy::StrategySet;
use parking_lot::{Mutex, MutexGuard};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

thread_local! {
    /// The lane this thread took last.
    static LAST_LANE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Most lanes one ingester has.
pub const MAX_LANES: usize = 64;

/// N lanes of one ingester (see the module doc).
pub struct LanedIngester {
    lanes: Box<[Mutex<Ingester>]>,
    /// The watermark every lane was last advanced to (changed with every lane locked).
    closed_through: AtomicI64,
    /// The latest watermark a request advanced to (at least `closed_through`).
    watermark: AtomicI64,
    /// Where the next request starts looking for a free lane.
    next: AtomicUsize,
    /// One closer at a time (taken before the lanes' locks).
    closing: Mutex<()>,
}

impl LanedIngester {
    /// `lanes` lanes (clamped to `1..=MAX_LANES`), each made by `make` (all alike).
    pub fn new(lanes: usize, mut make: impl FnMut() -> Ingester) -> Self {
        let lanes = (0..lanes.clamp(1, MAX_LANES))
            .map(|_| Mutex::new(make()))
            .collect();
        LanedIngester {
            lanes,
            closed_through: AtomicI64::new(i64::MIN),
            watermark: AtomicI64::new(i64::MIN),
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
    /// for that thread's arena (requests on 2 lanes and 2 cores went 1.1×
    /// where 2 processes went 1.95×).
    fn free_lane(&self) -> MutexGuard<'_, Ingester> {
        let n = self.lanes.len();
        let start = match LAST_LANE.get() {
            last if last < n => last,
            _ => self.next.fetch_add(1, Ordering::Relaxed) % n,
        };
        for i in (start..n).chain(0..start) {
            if let Some(lane) = self.lanes[i].try_lock() {
                LAST_LANE.set(i);
                return lane;
            }
        }
        self.lock(start)
    }

    /// One request body as sent (snappy block), on a free lane.
    pub fn handle(&self, body: &[u8]) -> Result<Stats, IngestError> {
        let mut lane = self.free_lane();
        let applied = lane.handle_deferred(body);
        self.finish(lane, applied)
    }

    /// One decompressed `WriteRequest`, on a free lane.
    pub fn handle_decoded(&self, raw: &[u8]) -> Result<Stats, IngestError> {
        let mut lane = self.free_lane();
        let applied = lane.handle_decoded_deferred(raw);
        self.finish(lane, applied)
    }

    /// One request body on lane `lane` (modulo the lanes): for runs that
    /// choose which lane takes which request.
    pub fn handle_on(&self, lane: usize, body: &[u8]) -> Result<Stats, IngestError> {
        let mut lane = self.lock(lane % self.lanes.len());
        let applied = lane.handle_deferred(body);
        self.finish(lane, applied)
    }

    /// Records the request's watermark; if it closes a window of any
    /// aggregation, closes it on every lane before the request is answered.
    fn finish(
        &self,
        lane: MutexGuard<'_, Ingester>,
        applied: Result<(Stats, i64), IngestError>,
    ) -> Result<Stats, IngestError> {
        let (stats, watermark) = applied?;
        let closed = self.closed_through.load(Ordering::Acquire);
        // Windows end on multiples of their length; one ends in (closed, watermark].
        let closes = watermark > closed
            && lane.plan().plan.aggregations.iter().any(|agg| {
                let ms = agg.window_ms();
                watermark.div_euclid(ms) > closed.div_euclid(ms)
            });
        self.watermark.fetch_max(watermark, Ordering::AcqRel);
        drop(lane);
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
        for lane in rest.iter_mut() {
            lane.hand_over_closing(home, watermark);
        }
        for lane in &mut lanes {
            lane.advance_to(watermark);
        }
        self.closed_through.store(watermark, Ordering::Release);
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

    pub fn limits(&self) -> Limits {
        *self.lock(0).limits()
    }

    pub fn strategies(&self) -> StrategySet {
        self.lock(0).strategies()
    }

    /// Summed over the lanes (the home's includes what its limits refused of merged panes).
    pub fn totals(&self) -> Stats {
        let mut sum = Stats::default();
        for i in 0..self.lanes.len() {
            sum.merge(&self.lock(i).totals());
        }
        sum
    }

    /// Summed over the lanes (each caches the series it has seen).
    pub fn cache_stats(&self) -> CacheStats {
        let mut sum = CacheStats::default();
        for i in 0..self.lanes.len() {
            let c = self.lock(i).cache_stats();
            sum.entries += c.entries;
            sum.capacity += c.capacity;
            sum.hits += c.hits;
            sum.misses += c.misses;
            sum.evicted += c.evicted;
            sum.invalidated += c.invalidated;
        }
        sum
    }

    /// What the lanes hold of what the limits bound, summed.
    pub fn held(&self) -> Held {
        let mut held = Held::default();
        for i in 0..self.lanes.len() {
            held.merge(&self.lock(i).held());
        }
        held
    }

    /// Panes and bins held (open + closed), summed over the lanes.
    pub fn footprint(&self) -> (usize, usize) {
        (0..self.lanes.len())
            .map(|i| self.lock(i).footprint())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// One aggregation's quantiles for its last closed window (or `window`),
    /// as one ingester answers: a closed window from the home, an open one
    /// merged from every lane.
    pub fn query(&self, aggregation: &str, window: Option<i64>) -> Option<QueryResult> {
        let home = self.lock(0);
        if self.lanes.len() == 1 || home_has(&home, aggregation, window) {
            return home.query(aggregation, window);
        }
        let a = position(&home, aggregation)?;
        let mut lanes = vec![home];
        lanes.extend((1..self.lanes.len()).map(|i| self.lock(i)));
        Some(merged_open(&lanes, a, window).query(window))
    }

    /// [`LanedIngester::query`]'s answer as JSON (the bytes `serde_json` makes
    /// of it), appended to `out`; `false` when there is no such aggregation.
    pub fn query_json(&self, aggregation: &str, window: Option<i64>, out: &mut Vec<u8>) -> bool {
        let home = self.lock(0);
        if self.lanes.len() == 1 || home_has(&home, aggregation, window) {
            return home.query_json(aggregation, window, out);
        }
        let Some(a) = position(&home, aggregation) else {
            return false;
        };
        let mut lanes = vec![home];
        lanes.extend((1..self.lanes.len()).map(|i| self.lock(i)));
        merged_open(&lanes, a, window).query_json(window, out);
        true
    }

    /// Every aggregation's last closed window, in plan order.
    pub fn query_all(&self) -> Vec<QueryResult> {
        self.lock(0).query_all()
    }

    /// Every pane (open and closed), sorted: the exact outcome, as one ingester's.
    pub fn snapshot(&self) -> Vec<PaneReport> {
        let lanes = self.lock_all();
        let mut panes: Vec<PaneReport> = lanes[0]
            .snapshot()
            .into_iter()
            .filter(|p| p.closed)
            .collect();
        for a in 0..lanes[0].accumulators().len() {
            panes.extend(merged_open(&lanes, a, None).panes());
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

fn position(lane: &Ingester, aggregation: &str) -> Option<usize> {
    lane.accumulators()
        .iter()
        .position(|a| a.agg.id == aggregation)
}

/// Whether the home alone answers: the last closed window, or a closed one
/// (an aggregation that does not exist answers nothing there either).
fn home_has(home: &Ingester, aggregation: &str, window: Option<i64>) -> bool {
    let Some(a) = position(home, aggregation) else {
        return true;
    };
    match window {
        None => true,
        Some(start) => home.accumulators()[a].closed_starts().any(|s| s == start),
    }
}

/// Aggregation `a`'s open windows (only `window`, when given) over every
/// lane, merged into one accumulator of its own.
fn merged_open(lanes: &[MutexGuard<'_, Ingester>], a: usize, window: Option<i64>) -> Accumulator {
    let home = &lanes[0];
    let plan = &home.plan().plan;
    let mut merged = Accumulator::new(
        plan.aggregations[a].clone(),
        plan.keep_windows,
        home.seams().sketch_update,
    );
    let (mut next, mut budget, mut stats) = (0, Budget::new(Capacity::UNBOUNDED), Stats::default());
    for lane in lanes {
        for open in lane.accumulators()[a].open_panes(window) {
            for (key, pane) in &open.panes {
                let gid = merged.intern(key, &mut next, &mut budget);
                merged.absorb(open.start, gid, pane, &mut stats, &mut budget);
            }
        }
    }
    merged
}
