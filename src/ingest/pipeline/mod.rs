//! The ingester: one remote-write request in, windows and sketches updated.
//!
//! A request goes through four seams, each resolved once, when the ingester is
//! built, from its [`StrategySet`] into an [`IngestSeams`] value (the table of
//! variants is in [`crate::shared::seams`]):
//!
//! | seam | reference (the upstream per-sample shape) | strategy |
//! | --- | --- | --- |
//! | decode | prost into owned structs | `borrowed-decode`: walk the buffer, labels as slices |
//! | canonicalize | per series per request: validate, `HashMap<String,String>`, sort, `format!` series key, fingerprint, JSON population key | `series-cache`: all of it once per series, keyed by its raw label bytes |
//! | route | per sample and aggregation: re-parse the series key, group key `String`, `to_string()` the series key, push into `HashMap<(agg, group), Vec<…>>` | `batch-routing`: destinations once per series, a counting sort into one contiguous batch per destination |
//! | sketch update | per sample: find the pane, `DDSketch::add` | `bulk-sketch`: one pane lookup and one slice add per run |
//!
//! A request is all or nothing: it is decoded and every series validated
//! before any sample is applied, so a 400 (or a 413) changes no window. Past
//! the ingester's [`Limits`], single samples are counted and dropped.
//!
//! Here: the ingester (construction, a request's way through the seams,
//! windows, queries) and its limits. Its seams' code, one file each, borrows
//! what it needs of the ingester for one request:
//! - `canonical.rs`: the canonicalize seam, `Canonicalizer` (per request,
//!   upstream's [`BaselineSeries`]; through the series cache) and what it
//!   hands the routers;
//! - `route.rs`: the route seam, `Router` (per sample; batched);
//! - `series_cache.rs`: the map of series the `series-cache` canonicalizer
//!   keeps across requests.
//!
//! The decode seam is [`super::wire`]'s, the sketch-update seam
//! [`super::window`]'s and [`super::sketch`]'s.

mod canonical;
mod route;
mod series_cache;

pub use canonical::BaselineSeries;
use canonical::{Canonicalizer, Resolved};
use route::{RouteScratch, Router};
use series_cache::SeriesCache;

use super::bins::PaneBins;
use super::budget::{Budget, Capacity, Held};
use super::groups::Shared;
use super::plan::{Plan, PlanGeneration};
use super::window::{Accumulator, PaneReport, QueryResult, Stats};
use super::wire::{self, Batch, WireError, WriteRequest};
use crate::shared::seams::{IngestSeams, Route, Seams};
use crate::shared::strategy::StrategySet;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IngestError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("invalid series: {0}")]
    Invalid(String),
    #[error("{samples} samples (or series) in one request exceed the limit of {limit}")]
    TooManySamples { samples: usize, limit: usize },
}

impl IngestError {
    /// The HTTP status the receiver answers with.
    pub fn status(&self) -> u16 {
        match self {
            IngestError::Wire(WireError::TooLarge { .. }) => 413,
            IngestError::TooManySamples { .. } => 413,
            _ => 400,
        }
    }
}

fn invalid(msg: impl Into<String>) -> IngestError {
    IngestError::Invalid(msg.into())
}

/// A closed window as it is handed out (see [`Ingester::closed_bins`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ClosedBins {
    pub start: i64,
    /// Per group: its labels (as the answer names them) and its bins.
    pub groups: Vec<(BTreeMap<String, String>, PaneBins)>,
    /// Samples of the window refused for groups that got no pane there.
    pub dropped: u64,
}

/// Series-cache counters (for `/metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub entries: u64,
    pub capacity: u64,
    pub hits: u64,
    pub misses: u64,
    /// Entries dropped because the cache was full.
    pub evicted: u64,
    /// Entries dropped because the plan changed.
    pub invalidated: u64,
}

impl CacheStats {
    /// Adds another cache's counters (lanes' caches summed).
    pub fn add(&mut self, other: &CacheStats) {
        self.entries += other.entries;
        self.capacity += other.capacity;
        self.hits += other.hits;
        self.misses += other.misses;
        self.evicted += other.evicted;
        self.invalidated += other.invalidated;
    }
}

/// Default bound of the series cache, in entries (a few hundred bytes
/// each): above the active series of a large Prometheus, so that a receiver's
/// bound is its bytes ([`Limits::max_cache_bytes`]). A cache smaller than the
/// series a sender keeps sending is dropped whenever it fills, and then every
/// series misses it.
pub const DEFAULT_CACHE_CAPACITY: usize = 1 << 22;

/// The bounds an ingester keeps (a [laned](super::lanes) one over all its
/// lanes together). [`Limits::UNBOUNDED`], the library's default, takes
/// timestamps as they come, as a replay of recorded data must;
/// [`Limits::serving`] is what `promlab serve` starts from.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// More samples, or more series, than this in one request: the request is
    /// refused (413), nothing applied. What a request costs while it is applied
    /// grows with both (the baseline canonicalizes every series anew).
    pub max_samples_per_request: usize,
    /// Groups, pane slots and sketch bins held: past them, samples that need more are
    /// counted (`over_*_limit`) and dropped; the rest of the request is applied.
    pub capacity: Capacity,
    /// Bytes of the series cache (raw labels and keys); past them it is cleared, as when full.
    pub max_cache_bytes: usize,
    /// `Some(ms)`: a sample stamped later than `clock() + ms` is counted
    /// (`too_far_ahead`) and dropped.
    pub max_ahead_ms: Option<i64>,
    /// The watermark never passes `clock() - lateness`, so no sender can
    /// close a window before its time, whatever `max_ahead_ms` says (without
    /// the drop, a sample ahead of the clock waits in its window until the
    /// clock gets there).
    pub watermark_behind_clock: bool,
    /// Now, in ms since the epoch (read when either of the above is set).
    pub clock: fn() -> i64,
}

/// The system clock in ms since the epoch.
pub fn system_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Limits {
    pub const UNBOUNDED: Limits = Limits {
        max_samples_per_request: usize::MAX,
        capacity: Capacity::UNBOUNDED,
        max_cache_bytes: usize::MAX,
        max_ahead_ms: None,
        watermark_behind_clock: false,
        clock: system_clock_ms,
    };

    /// The receiver's defaults, chosen for a 1 GiB budget: under the cardinality
    /// attack of `experiments/lab/tests/receiver_hostile.rs` the receiver stays
    /// within it, with or without strategies; panes that exist may grow to
    /// twice `bins` (see [`Capacity::bins`]).
    pub fn serving() -> Limits {
        Limits {
            max_samples_per_request: 200_000,
            capacity: Capacity {
                groups: 200_000,
                group_bytes: 64 << 20,
                pane_slots: 4 << 20,
                bins: 12 << 20,
            },
            max_cache_bytes: 128 << 20,
            max_ahead_ms: Some(10 * 60 * 1000),
            watermark_behind_clock: true,
            clock: system_clock_ms,
        }
    }
}

pub struct Ingester {
    /// What it was built with: reported, never consulted (the seams are).
    strategies: StrategySet,
    seams: IngestSeams,
    plan: PlanGeneration,
    accumulators: Vec<Accumulator>,
    /// Destination id → (aggregation, group id), for the destinations this
    /// ingester interned (the group table's, copied so that routing takes no lock).
    dests: Vec<(u16, u32)>,
    watermark: i64,
    /// The newest sample timestamp taken, ahead of the clock or not.
    newest_sample: i64,
    totals: Stats,
    limits: Limits,
    /// The budget and the groups, shared with the other lanes of a laned ingester.
    shared: Arc<Shared>,
    cache: SeriesCache,
    max_decoded: usize,
    decompressed: Vec<u8>,
    scratch: RouteScratch,
    /// A decoded request's buffers, kept between requests.
    spare_batch: Batch<'static>,
    spare_ids: Vec<u32>,
    spare_new_series: canonical::NewSeriesBuffers,
}

impl Ingester {
    pub fn new(plan: Plan, strategies: StrategySet) -> Self {
        let seams = Seams::resolve(strategies).ingest;
        let mut ingester = Ingester {
            strategies,
            seams,
            plan: PlanGeneration {
                plan: Plan {
                    aggregations: vec![],
                    ..plan.clone()
                },
                generation: 0,
            },
            accumulators: Vec::new(),
            dests: Vec::new(),
            watermark: i64::MIN,
            newest_sample: i64::MIN,
            totals: Stats::default(),
            limits: Limits::UNBOUNDED,
            shared: Arc::new(Shared::new(Capacity::UNBOUNDED)),
            cache: SeriesCache::new(DEFAULT_CACHE_CAPACITY, seams.route == Route::PerSample),
            max_decoded: 32 << 20,
            decompressed: Vec::new(),
            scratch: RouteScratch::default(),
            spare_batch: Batch::default(),
            spare_ids: Vec::new(),
            spare_new_series: Default::default(),
        };
        ingester.set_plan(plan);
        ingester
    }

    pub fn with_max_decoded(mut self, bytes: usize) -> Self {
        self.max_decoded = bytes;
        self
    }

    pub fn with_cache_capacity(mut self, entries: usize) -> Self {
        self.cache.capacity = entries;
        self
    }

    /// Bounds what this ingester takes and holds (see [`Limits`]).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        Arc::get_mut(&mut self.shared)
            .expect("limits are set before the ingester is shared")
            .budget
            .capacity = limits.capacity;
        self.cache.max_bytes = limits.max_cache_bytes;
        self
    }

    /// Lanes: holds `shared` (another lane's budget and groups, of the same
    /// plan) instead of its own; before any request.
    pub(super) fn share(&mut self, shared: &Arc<Shared>) {
        debug_assert_eq!(self.budget().held(), Held::default());
        self.shared = Arc::clone(shared);
    }

    /// The budget and groups this ingester holds against (shared by lanes).
    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    fn budget(&self) -> &Budget {
        &self.shared.budget
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// What the ingester holds of what its limits bound (with every lane it shares them with).
    pub fn held(&self) -> Held {
        self.budget().held()
    }

    /// Groups reclaimed since start (with every lane it shares them with).
    pub fn groups_reclaimed(&self) -> u64 {
        self.budget().reclaimed()
    }

    pub fn strategies(&self) -> StrategySet {
        self.strategies
    }

    /// The seams the strategies resolved to.
    pub fn seams(&self) -> IngestSeams {
        self.seams
    }

    pub fn plan(&self) -> &PlanGeneration {
        &self.plan
    }

    /// Installs a plan and bumps the generation. Aggregations whose definition
    /// did not change keep their windows; the others start empty.
    pub fn set_plan(&mut self, plan: Plan) {
        let mut old: HashMap<String, (usize, Accumulator)> = self
            .accumulators
            .drain(..)
            .enumerate()
            .map(|(i, a)| (a.agg.id.clone(), (i, a)))
            .collect();
        let keep_all = plan.keep_windows == self.plan.plan.keep_windows;
        let mut kept = Vec::with_capacity(plan.aggregations.len());
        let mut replaced = Vec::new();
        for agg in &plan.aggregations {
            match old.remove(&agg.id) {
                Some((i, acc)) if acc.agg == *agg && keep_all => {
                    kept.push(Some(i));
                    self.accumulators.push(acc);
                }
                other => {
                    replaced.extend(other.map(|(_, acc)| acc));
                    kept.push(None);
                    self.accumulators.push(Accumulator::new(
                        agg.clone(),
                        plan.keep_windows,
                        self.seams.sketch_update,
                    ));
                }
            }
        }
        // What the aggregations left behind held goes back to the budget.
        let budget = &self.shared.budget;
        for acc in replaced.iter().chain(old.values().map(|(_, acc)| acc)) {
            let held = acc.held();
            budget.give_slots(held.pane_slots);
            budget.give_bins(held.bins);
        }
        let generation = self.plan.generation + 1;
        self.shared
            .groups
            .lock()
            .set_plan(generation, &plan.aggregations, &kept, budget);
        // Destination ids: re-read from the table as series are resolved again.
        self.forget_destinations();
        self.plan = PlanGeneration { plan, generation };
    }

    /// One request body as sent (snappy block): the receiver's and `promlab ingest`'s entry point.
    pub fn handle(&mut self, body: &[u8]) -> Result<Stats, IngestError> {
        let (stats, watermark) = self.handle_deferred(body)?;
        self.advance_to(watermark);
        Ok(stats)
    }

    /// One decompressed `WriteRequest`.
    pub fn handle_decoded(&mut self, raw: &[u8]) -> Result<Stats, IngestError> {
        let (stats, watermark) = self.handle_decoded_deferred(raw)?;
        self.advance_to(watermark);
        Ok(stats)
    }

    /// [`Ingester::handle`] with the watermark left where it is: also gives
    /// the one the request advances it to (for [`Ingester::advance_to`], here
    /// or, for a [lane](super::lanes), on every lane at once).
    pub fn handle_deferred(&mut self, body: &[u8]) -> Result<(Stats, i64), IngestError> {
        let mut buf = std::mem::take(&mut self.decompressed);
        let result = match wire::decompress_reusing(body, self.max_decoded, &mut buf) {
            Ok(raw) => self.handle_decoded_deferred(raw),
            Err(e) => Err(e.into()),
        };
        self.decompressed = buf;
        result
    }

    /// [`Ingester::handle_decoded`] with the watermark left where it is (see [`Ingester::handle_deferred`]).
    pub fn handle_decoded_deferred(&mut self, raw: &[u8]) -> Result<(Stats, i64), IngestError> {
        let mut holder = WriteRequest::default();
        let mut batch = std::mem::take(&mut self.spare_batch).recycle();
        let result = self.handle_batch(raw, &mut holder, &mut batch);
        self.spare_batch = batch.recycle();
        result
    }

    fn handle_batch<'a>(
        &mut self,
        raw: &'a [u8],
        holder: &'a mut WriteRequest,
        batch: &mut Batch<'a>,
    ) -> Result<(Stats, i64), IngestError> {
        self.seams.wire_decode.decode_into(raw, holder, batch)?;
        let size = batch.samples.len().max(batch.series.len());
        if size > self.limits.max_samples_per_request {
            return Err(IngestError::TooManySamples {
                samples: size,
                limit: self.limits.max_samples_per_request,
            });
        }
        let resolved = self.canonicalizer().resolve(batch)?;
        let mut stats = Stats {
            requests: 1,
            series: batch.series.len() as u64,
            samples: batch.samples.len() as u64,
            metadata: batch.metadata as u64,
            ..Stats::default()
        };
        // Samples stamped after `latest` are too far ahead of the clock; the
        // watermark stays `lateness` behind both the newest sample and the clock.
        let now = self.now();
        let latest = match (now, self.limits.max_ahead_ms) {
            (Some(now), Some(ahead)) => now.saturating_add(ahead),
            _ => i64::MAX,
        };
        let newest = match self.seams.route {
            Route::Batched => self
                .router()
                .route_batched(batch, &resolved, latest, &mut stats),
            Route::PerSample => self
                .router()
                .route_per_sample(batch, &resolved, latest, &mut stats),
        };
        if let Resolved::Cached(ids) = resolved {
            self.spare_ids = ids;
            self.cache.evict_if_full();
        }
        let watermark = match newest {
            Some(newest) => {
                self.newest_sample = self.newest_sample.max(newest);
                self.watermark_at(newest, now)
            }
            None => i64::MIN,
        };
        self.totals.merge(&stats);
        Ok((stats, watermark))
    }

    /// The canonicalize seam, borrowing what it needs of this ingester.
    fn canonicalizer(&mut self) -> Canonicalizer<'_> {
        Canonicalizer {
            seam: self.seams.canonicalize,
            plan: &self.plan,
            cache: &mut self.cache,
            spare_ids: &mut self.spare_ids,
            spare_new_series: &mut self.spare_new_series,
            dests: &mut self.dests,
            shared: &self.shared,
        }
    }

    /// The route seam, borrowing what it needs of this ingester.
    fn router(&mut self) -> Router<'_> {
        Router {
            plan: &self.plan.plan,
            cache: &self.cache,
            dests: &mut self.dests,
            shared: &self.shared,
            accumulators: &mut self.accumulators,
            watermark: self.watermark,
            scratch: &mut self.scratch,
        }
    }

    /// Moves the watermark to `watermark` if that is later, closing the windows it passes.
    pub fn advance_to(&mut self, watermark: i64) {
        if watermark > self.watermark {
            self.close_with(&mut [], watermark);
        }
    }

    /// Moves this ingester's watermark and `others'` (the other lanes, all of
    /// one plan and one [`Shared`]) to `watermark`, closing the windows it
    /// passes: every lane's panes of a closing window merged here, exactly
    /// (see [`Accumulator::close_from`]); then reclaims the groups no window
    /// holds any more, if that is worth it (see [`super::groups`]).
    pub fn close_with(&mut self, others: &mut [&mut Ingester], watermark: i64) {
        let shared = Arc::clone(&self.shared);
        for a in 0..self.accumulators.len() {
            let mut theirs: Vec<&mut Accumulator> =
                others.iter_mut().map(|o| &mut o.accumulators[a]).collect();
            self.accumulators[a].close_from(&mut theirs, watermark, &shared.budget);
        }
        self.watermark = self.watermark.max(watermark);
        for other in others.iter_mut() {
            other.watermark = other.watermark.max(watermark);
        }
        let mut table = shared.groups.lock();
        let mut reclaimed = 0;
        for a in 0..self.accumulators.len() {
            let mut live = Vec::new();
            self.accumulators[a].mark_live(&mut live);
            for other in others.iter() {
                other.accumulators[a].mark_live(&mut live);
            }
            let unused = table.unused(a, &live);
            if table.worth_reclaiming(unused, &shared.budget) {
                reclaimed += table.reclaim(a, &live, &shared.budget);
            }
        }
        if reclaimed > 0 {
            // Their ids may be given to other groups: nothing may route by them.
            for lane in std::iter::once(self).chain(others.iter_mut().map(|o| &mut **o)) {
                lane.cache.invalidate();
                lane.forget_destinations();
            }
        }
    }

    /// Lanes: after this lane had to refuse samples past the bins or pane
    /// slots, drops closed windows here (the oldest first) while those are
    /// at their limits, as one ingester would have before refusing.
    pub(super) fn relieve(&mut self) {
        let shared = Arc::clone(&self.shared);
        for acc in &mut self.accumulators {
            acc.relieve(&shared.budget);
        }
    }

    /// The accumulators, in plan order (for a [lane](super::lanes)'s merged view).
    pub(super) fn accumulators(&self) -> &[Accumulator] {
        &self.accumulators
    }

    /// Closes every open window, as if the stream had ended.
    pub fn flush(&mut self) {
        self.advance_to(i64::MAX);
    }

    pub fn watermark(&self) -> Option<i64> {
        (self.watermark != i64::MIN).then_some(self.watermark)
    }

    /// The newest sample timestamp taken, ahead of the clock or not.
    pub fn newest_sample(&self) -> Option<i64> {
        (self.newest_sample != i64::MIN).then_some(self.newest_sample)
    }

    /// Where the clock lets the watermark stand now for samples up to
    /// `newest`, as a request taken now would leave it. A sample stamped
    /// ahead of the clock held it back when it came; as the clock passes
    /// the sample, this moves on. `None` when the limits read no clock
    /// (requests alone move the watermark).
    pub fn watermark_by_clock(&self, newest: i64) -> Option<i64> {
        let now = self.now()?;
        Some(self.watermark_at(newest, Some(now)))
    }

    /// Now, if a limit needs the clock ([`Limits::max_ahead_ms`],
    /// [`Limits::watermark_behind_clock`]).
    fn now(&self) -> Option<i64> {
        let limits = &self.limits;
        (limits.max_ahead_ms.is_some() || limits.watermark_behind_clock).then(|| (limits.clock)())
    }

    /// The watermark samples up to `newest` allow at `now`: `lateness`
    /// behind the newest sample and the clock.
    fn watermark_at(&self, newest: i64, now: Option<i64>) -> i64 {
        let newest = now.map_or(newest, |now| newest.min(now));
        newest.saturating_sub(self.plan.plan.lateness_ms())
    }

    pub fn totals(&self) -> Stats {
        self.totals
    }

    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            entries: self.cache.entries.len() as u64,
            capacity: self.cache.capacity as u64,
            hits: self.cache.hits,
            misses: self.cache.misses,
            evicted: self.cache.evicted,
            invalidated: self.cache.invalidated,
        }
    }

    /// Panes and bins held (open + closed).
    pub fn footprint(&self) -> (usize, usize) {
        self.accumulators
            .iter()
            .map(Accumulator::footprint)
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// One aggregation's quantiles for its last closed window (or `window`).
    pub fn query(&self, aggregation: &str, window: Option<i64>) -> Option<QueryResult> {
        let a = self.position(aggregation)?;
        Some(self.accumulators[a].query(window, self.shared.groups.lock().agg(a)))
    }

    /// [`Ingester::query`]'s answer as JSON (the bytes `serde_json` makes of
    /// it), appended to `out`; `false` when there is no such aggregation. A
    /// closed window's answer is encoded on its first query and kept.
    pub fn query_json(&self, aggregation: &str, window: Option<i64>, out: &mut Vec<u8>) -> bool {
        let Some(a) = self.position(aggregation) else {
            return false;
        };
        // A kept answer needs no group table: no lock taken.
        match self.accumulators[a].kept_answer(window) {
            Some(kept) => out.extend_from_slice(kept),
            None => self.accumulators[a].query_json(window, self.shared.groups.lock().agg(a), out),
        }
        true
    }

    /// The answer [`Ingester::query_json`] keeps for a closed window, once a
    /// query has encoded it: `None` before that, for a window that is not
    /// closed, or for no such aggregation. Shared: a server can send it
    /// without a copy.
    pub fn kept_answer(&self, aggregation: &str, window: Option<i64>) -> Option<&Arc<[u8]>> {
        self.accumulators[self.position(aggregation)?].kept_answer(window)
    }

    /// The closed windows kept of an aggregation, oldest first, as they are
    /// handed out ([`super::bins`]): per group its labels and bins (with the
    /// samples it had refused), and the window's samples refused for groups
    /// without a pane. `None` when there is no such aggregation.
    pub fn closed_bins(&self, aggregation: &str) -> Option<Vec<ClosedBins>> {
        self.closed_bins_after(aggregation, None)
    }

    /// [`Ingester::closed_bins`] of the windows starting after `after` only
    /// (what a distributed store has not been handed yet).
    pub fn closed_bins_after(
        &self,
        aggregation: &str,
        after: Option<i64>,
    ) -> Option<Vec<ClosedBins>> {
        let a = self.position(aggregation)?;
        let table = self.shared.groups.lock();
        let groups = table.agg(a);
        Some(
            self.accumulators[a]
                .closed_windows()
                .filter(|w| after.is_none_or(|after| w.start > after))
                .map(|w| ClosedBins {
                    start: w.start,
                    groups: w
                        .panes
                        .iter()
                        .map(|(gid, bins)| {
                            (groups.labels(*gid).into_iter().collect(), bins.clone())
                        })
                        .collect(),
                    dropped: w.dropped,
                })
                .collect(),
        )
    }

    /// [`Ingester::query_json`] without the kept answers: encoded afresh.
    pub fn encode_query(&self, aggregation: &str, window: Option<i64>, out: &mut Vec<u8>) -> bool {
        let Some(a) = self.position(aggregation) else {
            return false;
        };
        self.accumulators[a].encode_query(window, self.shared.groups.lock().agg(a), out);
        true
    }

    /// The quantile scan alone, every pane of the window (what the query's
    /// floor scans), each pane's quantiles handed to `f` in group-id order;
    /// the number of panes, or `None` when there is no such aggregation.
    pub fn quantile_scan(
        &self,
        aggregation: &str,
        window: Option<i64>,
        f: &mut dyn FnMut(&[f64]),
    ) -> Option<usize> {
        self.accumulator(aggregation)
            .map(|a| a.quantile_scan(window, f))
    }

    fn accumulator(&self, aggregation: &str) -> Option<&Accumulator> {
        self.accumulators.iter().find(|a| a.agg.id == aggregation)
    }

    /// The index of an aggregation in the plan.
    pub(super) fn position(&self, aggregation: &str) -> Option<usize> {
        self.accumulators
            .iter()
            .position(|a| a.agg.id == aggregation)
    }

    /// Every aggregation's last closed window, in plan order.
    pub fn query_all(&self) -> Vec<QueryResult> {
        let table = self.shared.groups.lock();
        self.accumulators
            .iter()
            .enumerate()
            .map(|(a, acc)| acc.query(None, table.agg(a)))
            .collect()
    }

    /// [`Ingester::query_all`]'s JSON (the bytes `serde_json` makes of it),
    /// appended to `out`: each aggregation's [`Ingester::query_json`], as a
    /// receiver serves it, with no `QueryResult` built, serialized and freed
    /// on the way (most of an answer's cost at a million groups).
    pub fn query_all_json(&self, out: &mut Vec<u8>) {
        let table = self.shared.groups.lock();
        out.push(b'[');
        for (a, acc) in self.accumulators.iter().enumerate() {
            if a > 0 {
                out.push(b',');
            }
            acc.query_json(None, table.agg(a), out);
        }
        out.push(b']');
    }

    /// Every pane (open and closed) of every aggregation, sorted: the exact outcome.
    pub fn snapshot(&self) -> Vec<PaneReport> {
        let table = self.shared.groups.lock();
        let mut panes: Vec<PaneReport> = self
            .accumulators
            .iter()
            .enumerate()
            .flat_map(|(a, acc)| acc.panes(table.agg(a)))
            .collect();
        panes.sort();
        panes
    }

    /// Forgets every destination id this ingester copied from the group
    /// table (its own map, and the group the last new series resolved to):
    /// ids may be given to other groups once groups are reclaimed, and a new
    /// plan numbers them afresh.
    fn forget_destinations(&mut self) {
        self.dests.clear();
        self.spare_new_series.forget_groups();
    }
}

/// The (group id, destination id) of a group key, from the shared group
/// table (a new group if the budget has room, else the overflow group),
/// recorded in an ingester's copy of the destinations (`dests`).
fn intern(shared: &Shared, dests: &mut Vec<(u16, u32)>, agg: u16, group_key: &[u8]) -> (u32, u32) {
    let (gid, dest) = shared.groups.lock().intern(agg, group_key, &shared.budget);
    let d = dest as usize;
    if dests.len() <= d {
        dests.resize(d + 1, (u16::MAX, 0));
    }
    dests[d] = (agg, gid);
    (gid, dest)
}
