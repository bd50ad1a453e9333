//! The ingester: one remote-write request in, windows and sketches updated.
//!
//! A request goes through four seams, each resolved once, when the ingester is
//! built, from its [`StrategySet`] into a [`Seams`] value (the table of
//! variants is in [`super::seams`]):
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

use super::bins::PaneBins;
use super::groups::{Budget, Shared};
use super::plan::{Plan, PlanGeneration};
use super::seams::{Canonicalize, Route, Seams};
use super::window::{
    write_group_key, Accumulator, Capacity, Held, PaneReport, QueryResult, Stats, STALE_NAN_BITS,
};
use super::wire::Sample;
use super::wire::{self, Batch, WireError, WriteRequest};
use crate::strategy::StrategySet;
use crate::text::{write_escaped, Escape};
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

/// Default bound of the series cache (entries; about 200 bytes each).
pub const DEFAULT_CACHE_CAPACITY: usize = 1 << 18;

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
    /// (`too_far_ahead`) and dropped, and the watermark never passes
    /// `clock() - lateness`, so no sender can close a window before its time.
    pub max_ahead_ms: Option<i64>,
    /// Now, in ms since the epoch (only read when `max_ahead_ms` is set).
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
        clock: system_clock_ms,
    };

    /// The receiver's defaults, chosen for a 1 GiB budget: under the cardinality
    /// attack of `experiments/lab/tests/receiver_hostile.rs` the receiver peaks
    /// at 744 MiB (baseline) and 412 MiB (every strategy); panes that exist may
    /// grow to twice `bins` (see [`Capacity::bins`]).
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
            clock: system_clock_ms,
        }
    }
}

pub struct Ingester {
    /// What it was built with: reported, never consulted (the seams are).
    strategies: StrategySet,
    seams: Seams,
    plan: PlanGeneration,
    accumulators: Vec<Accumulator>,
    /// Destination id → (aggregation, group id), for the destinations this
    /// ingester interned (the group table's, copied so that routing takes no lock).
    dests: Vec<(u16, u32)>,
    watermark: i64,
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
}

impl Ingester {
    pub fn new(plan: Plan, strategies: StrategySet) -> Self {
        let mut ingester = Ingester {
            strategies,
            seams: Seams::new(strategies),
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
            totals: Stats::default(),
            limits: Limits::UNBOUNDED,
            shared: Arc::new(Shared::new(Capacity::UNBOUNDED)),
            cache: SeriesCache::new(DEFAULT_CACHE_CAPACITY),
            max_decoded: 32 << 20,
            decompressed: Vec::new(),
            scratch: RouteScratch::default(),
            spare_batch: Batch::default(),
            spare_ids: Vec::new(),
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
    pub fn seams(&self) -> Seams {
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
                        self.seams.sketch,
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
        self.dests.clear();
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
        self.seams.decode.decode_into(raw, holder, batch)?;
        let size = batch.samples.len().max(batch.series.len());
        if size > self.limits.max_samples_per_request {
            return Err(IngestError::TooManySamples {
                samples: size,
                limit: self.limits.max_samples_per_request,
            });
        }
        let resolved = self.resolve(batch)?;
        let mut stats = Stats {
            requests: 1,
            series: batch.series.len() as u64,
            samples: batch.samples.len() as u64,
            metadata: batch.metadata as u64,
            ..Stats::default()
        };
        // Samples stamped after `latest` are too far ahead of the clock; the
        // watermark stays `lateness` behind both the newest sample and the clock.
        let now = self.limits.max_ahead_ms.map(|_| (self.limits.clock)());
        let latest = match (now, self.limits.max_ahead_ms) {
            (Some(now), Some(ahead)) => now.saturating_add(ahead),
            _ => i64::MAX,
        };
        let newest = match self.seams.route {
            Route::Batched => self.route_batched(batch, &resolved, latest, &mut stats),
            Route::PerSample => self.route_per_sample(batch, &resolved, latest, &mut stats),
        };
        if let Resolved::Cached(ids) = resolved {
            self.spare_ids = ids;
            self.cache.evict_if_full();
        }
        let watermark = match newest {
            Some(newest) => {
                let lateness = self.plan.plan.lateness_ms();
                let newest = now.map_or(newest, |now| newest.min(now));
                newest.saturating_sub(lateness)
            }
            None => i64::MIN,
        };
        self.totals.merge(&stats);
        Ok((stats, watermark))
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
                lane.dests.clear();
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
        self.accumulators[a].query_json(window, self.shared.groups.lock().agg(a), out);
        true
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
                            let labels = groups.get(*gid).map_or(&[][..], |g| &g.labels);
                            (labels.iter().cloned().collect(), bins.clone())
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

    /// The quantile scan alone, every pane of the window (the query's floor);
    /// the number of panes, or `None` when there is no such aggregation.
    pub fn quantile_scan(
        &self,
        aggregation: &str,
        window: Option<i64>,
        out: &mut Vec<f64>,
    ) -> Option<usize> {
        self.accumulator(aggregation)
            .map(|a| a.quantile_scan(window, out))
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

    /// Canonicalize seam: every series of the request, validated, before anything is applied.
    #[inline(never)] // one call per request; kept apart so profiles show the seam
    fn resolve(&mut self, batch: &Batch<'_>) -> Result<Resolved, IngestError> {
        if self.seams.canonicalize == Canonicalize::PerRequest {
            let series = batch
                .series
                .iter()
                .map(|s| BaselineSeries::canonicalize(batch.series_labels(s), &self.plan.plan))
                .collect::<Result<_, _>>()?;
            return Ok(Resolved::PerRequest(series));
        }
        self.cache.check_generation(self.plan.generation);
        let mut ids = std::mem::take(&mut self.spare_ids);
        ids.clear();
        let mut key = Vec::new();
        let mut deferred = Vec::new();
        for span in &batch.series {
            let mut labels = batch.series_labels(span);
            let raw = match span.raw_labels {
                Some(raw) => raw,
                None => {
                    key.clear();
                    for (n, v) in labels {
                        wire::put_label(&mut key, n, v);
                    }
                    &key[..]
                }
            };
            let id = match self.cache.lookup(raw) {
                Some(id) => id,
                None => {
                    if let (true, Some(span_raw)) = (span.labels_deferred, span.raw_labels) {
                        deferred.clear();
                        wire::parse_label_fields(span_raw, &mut deferred)?;
                        labels = &deferred;
                    }
                    let series = BaselineSeries::canonicalize(labels, &self.plan.plan)?;
                    let mut dests = Vec::with_capacity(series.aggs.len());
                    for &agg in &series.aggs {
                        let group_by = &self.plan.plan.aggregations[agg as usize].group_by;
                        let group_key = series.group_key(group_by);
                        let (_, dest) = self.intern(agg, group_key.as_bytes());
                        dests.push((dest, agg, group_key.into_boxed_str()));
                    }
                    self.cache
                        .insert(raw, series.series_key.into_boxed_str(), dests)
                }
            };
            ids.push(id);
        }
        Ok(Resolved::Cached(ids))
    }

    /// The (group id, destination id) of a group key, from the shared group
    /// table (a new group if the budget has room, else the overflow group).
    fn intern(&mut self, agg: u16, group_key: &[u8]) -> (u32, u32) {
        let (gid, dest) = self
            .shared
            .groups
            .lock()
            .intern(agg, group_key, &self.shared.budget);
        let d = dest as usize;
        if self.dests.len() <= d {
            self.dests.resize(d + 1, (u16::MAX, 0));
        }
        self.dests[d] = (agg, gid);
        (gid, dest)
    }

    /// Reference route: per sample and aggregation, string keys into a `HashMap`
    /// of per-destination vectors; then each vector goes to the sketch seam.
    #[inline(never)] // one call per request; kept apart so profiles show the seam
    fn route_per_sample(
        &mut self,
        batch: &Batch<'_>,
        resolved: &Resolved,
        latest: i64,
        stats: &mut Stats,
    ) -> Option<i64> {
        let mut routed: HashMap<(u16, String), Vec<RoutedSample>> = HashMap::new();
        let mut newest: Option<i64> = None;
        for (i, span) in batch.series.iter().enumerate() {
            for sample in batch.series_samples(span) {
                if !classify(sample, latest, stats) {
                    continue;
                }
                let mut matched = false;
                resolved.for_each_routed_key(
                    i,
                    &self.plan.plan,
                    &self.cache,
                    |agg, group, series| {
                        matched = true;
                        routed.entry((agg, group)).or_default().push(RoutedSample {
                            series,
                            timestamp: sample.timestamp,
                            value: sample.value,
                        });
                    },
                );
                if matched {
                    newest = newest.max(Some(sample.timestamp));
                } else {
                    stats.unrouted += 1;
                }
            }
        }
        let watermark = self.watermark;
        let (mut ts, mut values) = (Vec::new(), Vec::new());
        for ((agg, group), samples) in routed {
            let (gid, _) = self.intern(agg, group.as_bytes());
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
    fn route_batched(
        &mut self,
        batch: &Batch<'_>,
        resolved: &Resolved,
        latest: i64,
        stats: &mut Stats,
    ) -> Option<i64> {
        let mut sc = std::mem::take(&mut self.scratch);
        // Per series its range of destination ids in `dest_ids`: a slice of the
        // series cache, or (without it) ids re-derived once per series here.
        let mut derived = std::mem::take(&mut sc.series_dests);
        derived.clear();
        sc.dest_ranges.clear();
        let dest_ids: &[u32] = match resolved {
            Resolved::PerRequest(all) => {
                for s in all {
                    let d0 = derived.len() as u32;
                    if !s.aggs.is_empty() {
                        let labels = parse_series_key(&s.series_key);
                        for &agg in &s.aggs {
                            let group_by = &self.plan.plan.aggregations[agg as usize].group_by;
                            let (_, dest) =
                                self.intern(agg, group_key_of(&labels, group_by).as_bytes());
                            derived.push(dest);
                        }
                    }
                    sc.dest_ranges.push((d0, derived.len() as u32));
                }
                &derived
            }
            Resolved::Cached(ids) => {
                sc.dest_ranges.extend(ids.iter().map(|&id| {
                    let (first, n) = self.cache.entries[id as usize].dests;
                    (first, first + n)
                }));
                &self.cache.dest_ids
            }
        };
        // Classify every sample; count the valid ones per destination of routed series.
        let mut newest: Option<i64> = None;
        sc.routed.clear();
        for (i, span) in batch.series.iter().enumerate() {
            let (d0, d1) = sc.dest_ranges[i];
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
                for &d in &dest_ids[d0 as usize..d1 as usize] {
                    sc.count(d, valid);
                }
                sc.routed.push(i as u32);
            }
        }
        let watermark = self.watermark;
        sc.scatter_and_add(
            batch,
            dest_ids,
            latest,
            Groups {
                dests: &self.dests,
                accumulators: &mut self.accumulators,
                budget: &self.shared.budget,
            },
            watermark,
            stats,
        );
        sc.reset();
        sc.series_dests = derived;
        self.scratch = sc;
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

/// What the canonicalize seam produced for a request's series, read by either
/// router: the per-sample one through [`Resolved::for_each_routed_key`], the
/// batched one through the series' destination ids.
enum Resolved {
    /// Reference: per series, computed for this request.
    PerRequest(Vec<BaselineSeries>),
    /// `series-cache`: per series, an entry id in the cache.
    Cached(Vec<u32>),
}

impl Resolved {
    /// Series `i`'s (aggregation, group key, series key) per destination, built
    /// as upstream builds them for every routed sample.
    #[inline(always)]
    fn for_each_routed_key(
        &self,
        i: usize,
        plan: &Plan,
        cache: &SeriesCache,
        mut f: impl FnMut(u16, String, String),
    ) {
        match self {
            Resolved::PerRequest(all) => {
                let s = &all[i];
                for &agg in &s.aggs {
                    let group_by = &plan.aggregations[agg as usize].group_by;
                    let labels = parse_series_key(&s.series_key);
                    f(
                        agg,
                        group_key_of(&labels, group_by),
                        s.series_key.to_string(),
                    );
                }
            }
            Resolved::Cached(ids) => {
                let entry = &cache.entries[ids[i] as usize];
                for (agg, group_key) in cache.dest_keys(entry) {
                    f(*agg, group_key.to_string(), entry.series_key.to_string());
                }
            }
        }
    }
}

/// The reference canonical form of a series, rebuilt for every request.
pub struct BaselineSeries {
    /// `name{k="v",…}`, values escaped, labels sorted.
    pub series_key: String,
    /// Indexes of the aggregations this series feeds.
    pub aggs: Vec<u16>,
    /// `k=v;` joined — upstream's attribute fingerprint. Nothing here reads it;
    /// it is built because upstream builds it per series per request.
    pub fingerprint: String,
    /// The label set as a JSON object — upstream's population key (same note).
    pub population: String,
}

impl BaselineSeries {
    /// Validates a series and computes its canonical form, upstream-style.
    pub fn canonicalize(
        labels: &[(&[u8], &[u8])],
        plan: &Plan,
    ) -> Result<BaselineSeries, IngestError> {
        let mut map: HashMap<String, String> = HashMap::new();
        let mut previous: Option<&[u8]> = None;
        for &(name, value) in labels {
            let name_str =
                std::str::from_utf8(name).map_err(|_| invalid("a label name is not UTF-8"))?;
            let value_str = std::str::from_utf8(value)
                .map_err(|_| invalid(format!("the value of label `{name_str}` is not UTF-8")))?;
            if !crate::registry::is_label_name(name) {
                return Err(invalid(format!(
                    "invalid label name `{}`",
                    name_str.escape_debug()
                )));
            }
            if let Some(prev) = previous {
                if prev == name {
                    return Err(invalid(format!("duplicate label name `{name_str}`")));
                }
                if prev > name {
                    return Err(invalid(format!(
                        "label names are not sorted: `{name_str}` after `{}`",
                        String::from_utf8_lossy(prev)
                    )));
                }
            }
            previous = Some(name);
            map.insert(name_str.to_owned(), value_str.to_owned());
        }
        let metric = match map.get("__name__") {
            Some(n) if !n.is_empty() => n.clone(),
            _ => return Err(invalid("a series has no `__name__` label")),
        };
        let mut sorted: Vec<(String, String)> = map.clone().into_iter().collect();
        sorted.sort();
        let mut series_key = metric.clone();
        series_key.push('{');
        let mut first = true;
        for (k, v) in sorted.iter().filter(|(k, _)| k != "__name__") {
            if !first {
                series_key.push(',');
            }
            first = false;
            series_key.push_str(&format!("{k}=\"{}\"", escape_value(v)));
        }
        series_key.push('}');
        let fingerprint: String = sorted.iter().map(|(k, v)| format!("{k}={v};")).collect();
        let population_map: BTreeMap<&str, &str> = sorted
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let population =
            serde_json::to_string(&population_map).expect("a map of strings serializes");
        let aggs = plan
            .aggregations
            .iter()
            .enumerate()
            .filter(|(_, a)| {
                a.metric == metric
                    && a.matchers
                        .iter()
                        .all(|(k, v)| map.get(k).map_or("", String::as_str) == v)
            })
            .map(|(i, _)| i as u16)
            .collect();
        Ok(BaselineSeries {
            series_key,
            aggs,
            fingerprint: std::hint::black_box(fingerprint),
            population: std::hint::black_box(population),
        })
    }

    /// The group key for one aggregation (re-parsing the series key, upstream-style).
    pub fn group_key(&self, group_by: &[String]) -> String {
        group_key_of(&parse_series_key(&self.series_key), group_by)
    }
}

fn escape_value(v: &str) -> String {
    let mut out = Vec::with_capacity(v.len());
    write_escaped(&mut out, v.as_bytes(), Escape::LabelValue);
    String::from_utf8(out).expect("escaping keeps UTF-8")
}

/// Parses `name{k="v",…}` back into a map (with `__name__`), unescaping values.
fn parse_series_key(key: &str) -> HashMap<String, String> {
    let mut map = HashMap::new();
    let (name, rest) = key.split_once('{').unwrap_or((key, "}"));
    map.insert("__name__".to_string(), name.to_string());
    let mut chars = rest.chars().peekable();
    loop {
        let label: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if label.is_empty() || label == "}" {
            break;
        }
        chars.next(); // opening quote
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        map.insert(label, value);
        if chars.next() != Some(',') {
            break;
        }
    }
    map
}

/// The group key (see [`write_group_key`]) from a label map, as a new `String`.
fn group_key_of(labels: &HashMap<String, String>, group_by: &[String]) -> String {
    let mut out = Vec::new();
    write_group_key(
        &mut out,
        group_by
            .iter()
            .map(|g| labels.get(g).map_or(&b""[..], |v| v.as_bytes())),
    );
    String::from_utf8(out).expect("group keys of UTF-8 values are UTF-8")
}

/// Where [`RouteScratch::scatter_and_add`] adds: an ingester's
/// destinations, accumulators and budget.
pub(super) struct Groups<'a> {
    pub(super) dests: &'a [(u16, u32)],
    pub(super) accumulators: &'a mut [Accumulator],
    pub(super) budget: &'a Budget,
}

/// Scratch space of the batched router, reused across requests.
#[derive(Default)]
pub(super) struct RouteScratch {
    /// Destination ids re-derived per request (without the series cache).
    pub(super) series_dests: Vec<u32>,
    /// Per series, its range of destination ids.
    pub(super) dest_ranges: Vec<(u32, u32)>,
    /// The series with a destination and a valid sample, in request order.
    pub(super) routed: Vec<u32>,
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
        for &i in &self.routed {
            let (d0, d1) = self.dest_ranges[i as usize];
            let dests = &dest_ids[d0 as usize..d1 as usize];
            for sample in batch.series_samples(&batch.series[i as usize]) {
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
        for &d in &self.touched {
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

/// `series-cache`: a series' raw label bytes → its canonical key and destinations.
///
/// Entries are numbered in insertion order. Senders repeat their series in the
/// same order request after request, so the entry after the last one found is
/// tried first (one sequential compare); the hash index is the fallback.
pub(super) struct SeriesCache {
    hasher: ahash::RandomState,
    /// (hash of the raw label bytes, entry id).
    index: hashbrown::HashTable<(u64, u32)>,
    pub(super) entries: Vec<CacheEntry>,
    /// The raw label bytes of every entry, back to back.
    arena: Vec<u8>,
    /// Destination ids of every entry, back to back (the hot part).
    pub(super) dest_ids: Vec<u32>,
    /// Per destination: its aggregation and group key (for the per-sample router).
    dest_keys: Vec<(u16, Box<str>)>,
    /// The entry tried first by the next lookup.
    next_guess: u32,
    pub(super) capacity: usize,
    /// Bytes held by the entries (raw labels, keys), and their bound.
    bytes: usize,
    pub(super) max_bytes: usize,
    generation: u64,
    pub(super) hits: u64,
    pub(super) misses: u64,
    pub(super) evicted: u64,
    pub(super) invalidated: u64,
}

/// Bytes of an entry besides its keys (the entry, its index slot, a destination).
const CACHE_ENTRY_OVERHEAD: usize = 64;

pub(super) struct CacheEntry {
    raw: (u32, u32),
    pub(super) dests: (u32, u32),
    series_key: Box<str>,
}

impl SeriesCache {
    pub(super) fn new(capacity: usize) -> Self {
        SeriesCache {
            hasher: ahash::RandomState::with_seeds(0x5eed, 0x1e55, 0xcafe, 0xf00d),
            index: hashbrown::HashTable::new(),
            entries: Vec::new(),
            arena: Vec::new(),
            dest_ids: Vec::new(),
            dest_keys: Vec::new(),
            next_guess: 0,
            capacity,
            bytes: 0,
            max_bytes: usize::MAX,
            generation: 0,
            hits: 0,
            misses: 0,
            evicted: 0,
            invalidated: 0,
        }
    }

    /// Drops every entry, counted as invalidated (their destination ids may be reused).
    pub(super) fn invalidate(&mut self) {
        self.invalidated += self.entries.len() as u64;
        self.clear();
    }

    fn clear(&mut self) {
        self.index.clear();
        self.entries.clear();
        self.arena.clear();
        self.dest_ids.clear();
        self.dest_keys.clear();
        self.next_guess = 0;
        self.bytes = 0;
    }

    pub(super) fn check_generation(&mut self, generation: u64) {
        if self.generation != generation {
            self.invalidated += self.entries.len() as u64;
            self.clear();
            self.generation = generation;
        }
    }

    /// Dropping everything at once keeps the bound simple; it happens between
    /// requests only, so entry ids stay valid while a request is routed.
    pub(super) fn evict_if_full(&mut self) {
        if self.entries.len() > self.capacity || self.bytes > self.max_bytes {
            self.evicted += self.entries.len() as u64;
            self.clear();
        }
    }

    #[inline]
    fn raw_of(&self, id: u32) -> &[u8] {
        let (at, len) = self.entries[id as usize].raw;
        &self.arena[at as usize..(at + len) as usize]
    }

    fn dest_keys(&self, entry: &CacheEntry) -> &[(u16, Box<str>)] {
        &self.dest_keys[entry.dests.0 as usize..(entry.dests.0 + entry.dests.1) as usize]
    }

    #[inline]
    pub(super) fn lookup(&mut self, raw: &[u8]) -> Option<u32> {
        let guess = self.next_guess;
        let id = if (guess as usize) < self.entries.len() && self.raw_of(guess) == raw {
            guess
        } else {
            self.find(raw)?
        };
        self.hits += 1;
        self.next_guess = id + 1;
        Some(id)
    }

    /// The hash index, for when the sender's order changed (out of line: the guess is the hot path).
    #[inline(never)]
    fn find(&self, raw: &[u8]) -> Option<u32> {
        let hash = self.hasher.hash_one(raw);
        let &(_, id) = self
            .index
            .find(hash, |&(h, id)| h == hash && self.raw_of(id) == raw)?;
        Some(id)
    }

    fn insert(
        &mut self,
        raw: &[u8],
        series_key: Box<str>,
        dests: Vec<(u32, u16, Box<str>)>,
    ) -> u32 {
        self.misses += 1;
        let id = self.entries.len() as u32;
        let at = self.arena.len() as u32;
        self.arena.extend_from_slice(raw);
        let first_dest = self.dest_ids.len() as u32;
        self.bytes += CACHE_ENTRY_OVERHEAD + raw.len() + series_key.len();
        for (dest, agg, group_key) in dests {
            self.bytes += group_key.len() + 32;
            self.dest_ids.push(dest);
            self.dest_keys.push((agg, group_key));
        }
        self.entries.push(CacheEntry {
            raw: (at, raw.len() as u32),
            dests: (first_dest, self.dest_ids.len() as u32 - first_dest),
            series_key,
        });
        let hash = self.hasher.hash_one(raw);
        self.index.insert_unique(hash, (hash, id), |&(h, _)| h);
        self.next_guess = id + 1;
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_keys_round_trip() {
        let labels: [(&[u8], &[u8]); 3] =
            [(b"__name__", b"m"), (b"a", b"x\"y\\z\n,}"), (b"b", b"")];
        let s = BaselineSeries::canonicalize(&labels, &Plan::default()).unwrap();
        assert_eq!(s.series_key, "m{a=\"x\\\"y\\\\z\\n,}\",b=\"\"}");
        let map = parse_series_key(&s.series_key);
        assert_eq!(map["a"], "x\"y\\z\n,}");
        assert_eq!(map["b"], "");
        assert_eq!(map["__name__"], "m");
        assert_eq!(s.population, r#"{"__name__":"m","a":"x\"y\\z\n,}","b":""}"#);
    }

    #[test]
    fn validation() {
        let plan = Plan::default();
        let check =
            |labels: &[(&[u8], &[u8])]| BaselineSeries::canonicalize(labels, &plan).map(|_| ());
        assert!(check(&[(b"__name__", b"m")]).is_ok());
        assert!(check(&[]).is_err());
        assert!(check(&[(b"a", b"1")]).is_err());
        assert!(check(&[(b"__name__", b"m"), (b"a", b"1"), (b"a", b"2")])
            .unwrap_err()
            .to_string()
            .contains("duplicate"));
        assert!(check(&[(b"__name__", b"m"), (b"b", b"1"), (b"a", b"2")])
            .unwrap_err()
            .to_string()
            .contains("sorted"));
        assert!(check(&[(b"__name__", b"m"), (b"a-b", b"1")]).is_err());
        assert!(check(&[(b"__name__", b"m"), (b"a", b"\xff")]).is_err());
    }
}
