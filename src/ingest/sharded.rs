//! Across cores: one ingester's groups split over N shards, applied in parallel.
//!
//! Every (aggregation, group) belongs to one shard, chosen by a hash of the
//! group key, so no sketch is ever merged: a pane's samples arrive in the
//! order one [`Ingester`](super::pipeline::Ingester) would add them, and its
//! bins, count and quantiles are the same, bit for bit.
//!
//! A request is decoded once (snappy and the protobuf walk, by a [`Decoder`],
//! on whichever thread calls: the receiver decodes outside its lock, so
//! requests from several connections decode at once), then
//! [`ShardedIngester::apply`] hands the decoded batch to every shard at once
//! on a persistent thread pool (the caller runs shard 0). Each shard walks the
//! whole batch with its own series cache (raw labels → its own destinations),
//! routes and adds only its groups' samples, and shard 0 also counts what one
//! ingester counts per sample (stale, rejected, too far ahead, unrouted) and
//! finds the newest routed timestamp. The watermark is one, global: it
//! advances after every shard has applied the request, as in one ingester.
//!
//! Canonicalize and route are always the `series-cache` and `batch-routing`
//! ones (a shard needs each series' destinations once, not per sample); the
//! decode and sketch-update seams follow the strategies.
//!
//! Limits: a shard holds `1/N` of every [`Capacity`] bound and of the series
//! cache's bytes, so the whole stays within the one ingester's [`Limits`];
//! the request-size and clock limits are checked once, globally. Below its
//! bounds the outcome is the one ingester's; at them, a shard whose groups
//! are many may drop a sample one ingester would have kept.

use super::pipeline::{
    classify, takes, BaselineSeries, CacheStats, Groups, IngestError, Limits, RouteScratch,
    SeriesCache, DEFAULT_CACHE_CAPACITY, ROUTED_ELSEWHERE,
};
use super::plan::{Plan, PlanGeneration};
use super::seams::{Decode, Seams, SketchUpdate};
use super::window::{Accumulator, Budget, Capacity, Held, PaneReport, QueryResult, Stats};
use super::wire::{self, Batch, WriteRequest};
use crate::strategy::StrategySet;
use std::collections::HashMap;

/// Most shards one ingester is split into.
pub const MAX_SHARDS: usize = 64;

/// Snappy and protobuf for one request at a time, its buffers kept between requests.
#[derive(Default)]
pub struct Decoder {
    decompressed: Vec<u8>,
    spare: Batch<'static>,
}

impl Decoder {
    /// Decodes `body` (a snappy block of at most `max_decoded` bytes once
    /// decoded) with the decode seam `decode`, and gives the batch to `f`.
    pub fn decode<R>(
        &mut self,
        decode: Decode,
        max_decoded: usize,
        body: &[u8],
        f: impl FnOnce(&Batch<'_>) -> R,
    ) -> Result<R, IngestError> {
        let raw = wire::decompress_reusing(body, max_decoded, &mut self.decompressed)?;
        let mut holder = WriteRequest::default();
        let mut batch = std::mem::take(&mut self.spare).recycle();
        let result = decode
            .decode_into(raw, &mut holder, &mut batch)
            .map(|()| f(&batch));
        self.spare = batch.recycle();
        Ok(result?)
    }
}

/// One shard's groups, windows, budget and series cache.
struct Shard {
    index: usize,
    count: usize,
    accumulators: Vec<Accumulator>,
    /// Destination id → (aggregation, group id), this shard's.
    dests: Vec<(u16, u32)>,
    budget: Budget,
    cache: SeriesCache,
    /// Per series of the request being applied: its cache entry.
    ids: Vec<u32>,
    scratch: RouteScratch,
    /// What applying the last request gave (stats, newest routed timestamp).
    outcome: Option<Result<(Stats, Option<i64>), IngestError>>,
}

/// Which shard holds an aggregation's group (the same in every run: fixed seeds).
fn shard_of(agg: u16, group_key: &[u8], count: usize) -> usize {
    if count <= 1 {
        return 0;
    }
    let hasher = ahash::RandomState::with_seeds(0x5a4d, 0x0c0e, 0x1234, 0x9876);
    (hasher.hash_one((agg, group_key)) % count as u64) as usize
}

/// `1/n` of a bound, rounded down so the parts stay within it (unbounded stays unbounded).
fn part(total: usize, n: usize) -> usize {
    if total == usize::MAX {
        total
    } else {
        total / n
    }
}

impl Shard {
    fn intern(&mut self, agg: u16, group_key: &[u8]) -> u32 {
        let mut next = self.dests.len() as u32;
        let acc = &mut self.accumulators[agg as usize];
        let gid = acc.intern(group_key, &mut next, &mut self.budget);
        if next as usize > self.dests.len() {
            self.dests.push((agg, gid));
        }
        acc.dest_of(gid)
    }

    /// Every series of the request, validated, each to its cache entry (as
    /// [`Ingester`](super::pipeline::Ingester)'s cached resolve, keeping only this shard's groups).
    fn resolve(&mut self, batch: &Batch<'_>, plan: &PlanGeneration) -> Result<(), IngestError> {
        self.cache.check_generation(plan.generation);
        self.ids.clear();
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
                    let series = BaselineSeries::canonicalize(labels, &plan.plan)?;
                    let mut dests = Vec::new();
                    for &agg in &series.aggs {
                        let group_by = &plan.plan.aggregations[agg as usize].group_by;
                        let group_key = series.group_key(group_by);
                        if shard_of(agg, group_key.as_bytes(), self.count) == self.index {
                            let dest = self.intern(agg, group_key.as_bytes());
                            dests.push((dest, agg, group_key.into_boxed_str()));
                        }
                    }
                    // The series key is read by the per-sample router only: not kept.
                    self.cache
                        .insert_routed(raw, Box::default(), dests, !series.aggs.is_empty())
                }
            };
            self.ids.push(id);
        }
        Ok(())
    }

    /// Resolves and applies one request's samples to this shard's groups.
    fn apply(&mut self, batch: &Batch<'_>, plan: &PlanGeneration, latest: i64, watermark: i64) {
        let outcome = self.resolve(batch, plan).map(|()| {
            let mut stats = Stats::default();
            let newest = self.route(batch, latest, watermark, &mut stats);
            self.cache.evict_if_full();
            (stats, newest)
        });
        self.outcome = Some(outcome);
    }

    /// `batch-routing` over this shard's destinations (see the one ingester's
    /// `route_batched`). Shard 0 also counts the per-sample outcomes and finds
    /// the newest routed timestamp, over every series.
    fn route(
        &mut self,
        batch: &Batch<'_>,
        latest: i64,
        watermark: i64,
        stats: &mut Stats,
    ) -> Option<i64> {
        let counts = self.index == 0;
        let mut sc = std::mem::take(&mut self.scratch);
        sc.dest_ranges.clear();
        let entries = &self.cache.entries;
        sc.dest_ranges.extend(self.ids.iter().map(|&id| {
            let (first, n) = entries[id as usize].dests;
            (first, first + n)
        }));
        let dest_ids = &self.cache.dest_ids;
        let mut newest: Option<i64> = None;
        sc.routed.clear();
        for (i, span) in batch.series.iter().enumerate() {
            let (d0, d1) = sc.dest_ranges[i];
            let samples = batch.series_samples(span);
            if d0 == d1 {
                if !counts {
                    continue;
                }
                if d0 == ROUTED_ELSEWHERE {
                    for sample in samples {
                        if classify(sample, latest, stats) {
                            newest = newest.max(Some(sample.timestamp));
                        }
                    }
                } else {
                    for sample in samples {
                        if classify(sample, latest, stats) {
                            stats.unrouted += 1;
                        }
                    }
                }
                continue;
            }
            let mut valid = 0u32;
            for sample in samples {
                let taken = match counts {
                    true => classify(sample, latest, stats),
                    false => takes(sample, latest),
                };
                if taken {
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
        sc.scatter_and_add(
            batch,
            dest_ids,
            latest,
            Groups {
                dests: &self.dests,
                accumulators: &mut self.accumulators,
                budget: &mut self.budget,
            },
            watermark,
            stats,
        );
        sc.reset();
        self.scratch = sc;
        newest
    }

    /// As [`Ingester::set_plan`](super::pipeline::Ingester::set_plan), for this shard.
    fn set_plan(&mut self, plan: &Plan, keep_all: bool, sketch: SketchUpdate) {
        let mut old: HashMap<String, Accumulator> = self
            .accumulators
            .drain(..)
            .map(|a| (a.agg.id.clone(), a))
            .collect();
        self.accumulators = plan
            .aggregations
            .iter()
            .map(|agg| match old.remove(&agg.id) {
                Some(acc) if acc.agg == *agg && keep_all => acc,
                _ => Accumulator::new(agg.clone(), plan.keep_windows, sketch),
            })
            .collect();
        self.budget.recount(&self.accumulators);
        self.dests.clear();
        let mut next = 0u32;
        for (a, acc) in self.accumulators.iter_mut().enumerate() {
            next = acc.renumber(a as u16, next, &mut self.dests);
        }
    }
}

/// One ingester's groups over N shards, applied on N threads (see the module doc).
pub struct ShardedIngester {
    strategies: StrategySet,
    seams: Seams,
    plan: PlanGeneration,
    shards: Vec<Shard>,
    /// Threads for shards 1.. (the caller runs shard 0); `None` with one shard,
    /// or when the threads could not be started (then the shards take turns).
    pool: Option<rayon_core::ThreadPool>,
    watermark: i64,
    totals: Stats,
    limits: Limits,
    max_decoded: usize,
    decoder: Decoder,
}

impl ShardedIngester {
    /// `shards` is clamped to `1..=MAX_SHARDS`.
    pub fn new(plan: Plan, strategies: StrategySet, shards: usize) -> Self {
        let count = shards.clamp(1, MAX_SHARDS);
        let pool = (count > 1)
            .then(|| {
                rayon_core::ThreadPoolBuilder::new()
                    .num_threads(count - 1)
                    .thread_name(|i| format!("promlab-shard-{}", i + 1))
                    .build()
                    .ok()
            })
            .flatten();
        let shards = (0..count)
            .map(|index| Shard {
                index,
                count,
                accumulators: Vec::new(),
                dests: Vec::new(),
                budget: Budget::new(Capacity::UNBOUNDED),
                cache: SeriesCache::new(DEFAULT_CACHE_CAPACITY),
                ids: Vec::new(),
                scratch: RouteScratch::default(),
                outcome: None,
            })
            .collect();
        let mut ingester = ShardedIngester {
            strategies,
            seams: Seams::new(strategies),
            plan: PlanGeneration {
                plan: Plan {
                    aggregations: vec![],
                    ..plan.clone()
                },
                generation: 0,
            },
            shards,
            pool,
            watermark: i64::MIN,
            totals: Stats::default(),
            limits: Limits::UNBOUNDED,
            max_decoded: 32 << 20,
            decoder: Decoder::default(),
        };
        ingester.set_plan(plan);
        ingester
    }

    pub fn with_max_decoded(mut self, bytes: usize) -> Self {
        self.max_decoded = bytes;
        self
    }

    /// Every shard's series cache holds up to `entries` (each caches every series).
    pub fn with_cache_capacity(mut self, entries: usize) -> Self {
        for shard in &mut self.shards {
            shard.cache.capacity = entries;
        }
        self
    }

    /// Bounds what the ingester takes and holds: each shard gets `1/N` of the
    /// capacity and of the cache's bytes (see the module doc).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        let n = self.shards.len();
        let c = limits.capacity;
        for shard in &mut self.shards {
            shard.budget.capacity = Capacity {
                groups: part(c.groups, n),
                group_bytes: part(c.group_bytes, n),
                pane_slots: part(c.pane_slots, n),
                bins: part(c.bins, n),
            };
            shard.cache.max_bytes = part(limits.max_cache_bytes, n);
        }
        self
    }

    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn strategies(&self) -> StrategySet {
        self.strategies
    }

    /// The decode seam, for decoding on the caller's thread ([`Decoder::decode`]).
    pub fn decode_seam(&self) -> Decode {
        self.seams.decode
    }

    pub fn max_decoded(&self) -> usize {
        self.max_decoded
    }

    pub fn plan(&self) -> &PlanGeneration {
        &self.plan
    }

    /// Installs a plan and bumps the generation, as [`Ingester::set_plan`](super::pipeline::Ingester::set_plan).
    pub fn set_plan(&mut self, plan: Plan) {
        let keep_all = plan.keep_windows == self.plan.plan.keep_windows;
        for shard in &mut self.shards {
            shard.set_plan(&plan, keep_all, self.seams.sketch);
        }
        self.plan = PlanGeneration {
            plan,
            generation: self.plan.generation + 1,
        };
    }

    /// One request body as sent (snappy block).
    pub fn handle(&mut self, body: &[u8]) -> Result<Stats, IngestError> {
        let mut decoder = std::mem::take(&mut self.decoder);
        let result = decoder.decode(self.seams.decode, self.max_decoded, body, |batch| {
            self.apply(batch)
        });
        self.decoder = decoder;
        result?
    }

    /// One decoded request: every shard at once, then the watermark.
    pub fn apply(&mut self, batch: &Batch<'_>) -> Result<Stats, IngestError> {
        let size = batch.samples.len().max(batch.series.len());
        if size > self.limits.max_samples_per_request {
            return Err(IngestError::TooManySamples {
                samples: size,
                limit: self.limits.max_samples_per_request,
            });
        }
        let now = self.limits.max_ahead_ms.map(|_| (self.limits.clock)());
        let latest = match (now, self.limits.max_ahead_ms) {
            (Some(now), Some(ahead)) => now.saturating_add(ahead),
            _ => i64::MAX,
        };
        let (plan, watermark) = (&self.plan, self.watermark);
        match &self.pool {
            Some(pool) => {
                let (first, rest) = self.shards.split_first_mut().expect("one shard at least");
                pool.in_place_scope(|scope| {
                    for shard in rest {
                        scope.spawn(move |_| shard.apply(batch, plan, latest, watermark));
                    }
                    first.apply(batch, plan, latest, watermark);
                });
            }
            None => {
                for shard in &mut self.shards {
                    shard.apply(batch, plan, latest, watermark);
                }
            }
        }
        let mut stats = Stats {
            requests: 1,
            series: batch.series.len() as u64,
            samples: batch.samples.len() as u64,
            metadata: batch.metadata as u64,
            ..Stats::default()
        };
        let mut newest = None;
        let mut failed = None;
        for shard in &mut self.shards {
            // Validation does not depend on the shard: all fail, or none.
            match shard.outcome.take().expect("every shard ran") {
                Ok((part, shard_newest)) => {
                    stats.merge(&part);
                    if shard.index == 0 {
                        newest = shard_newest;
                    }
                }
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if let Some(newest) = newest {
            let lateness = self.plan.plan.lateness_ms();
            let newest = now.map_or(newest, |now| newest.min(now));
            self.advance(newest.saturating_sub(lateness));
        }
        self.totals.merge(&stats);
        Ok(stats)
    }

    fn advance(&mut self, watermark: i64) {
        if watermark <= self.watermark {
            return;
        }
        self.watermark = watermark;
        for shard in &mut self.shards {
            for acc in &mut shard.accumulators {
                acc.close_through(watermark, &mut shard.budget);
            }
        }
        // One ingester keeps the last `keep_windows` closed windows of all its
        // groups; a shard without panes in the newest ones would keep older ones.
        let keep = self.plan.plan.keep_windows;
        for a in 0..self.plan.plan.aggregations.len() {
            let mut starts: Vec<i64> = self
                .shards
                .iter()
                .flat_map(|s| s.accumulators[a].closed_starts())
                .collect();
            starts.sort_unstable();
            starts.dedup();
            if starts.len() > keep {
                let oldest_kept = starts.get(starts.len() - keep).copied().unwrap_or(i64::MAX);
                for shard in &mut self.shards {
                    shard.accumulators[a].drop_closed_before(oldest_kept, &mut shard.budget);
                }
            }
        }
    }

    /// Closes every open window, as if the stream had ended.
    pub fn flush(&mut self) {
        self.advance(i64::MAX);
    }

    pub fn watermark(&self) -> Option<i64> {
        (self.watermark != i64::MIN).then_some(self.watermark)
    }

    pub fn totals(&self) -> Stats {
        self.totals
    }

    /// Summed over the shards (each shard caches every series it has seen).
    pub fn cache_stats(&self) -> CacheStats {
        let mut sum = CacheStats::default();
        for s in &self.shards {
            let c = &s.cache;
            sum.entries += c.entries.len() as u64;
            sum.capacity += c.capacity as u64;
            sum.hits += c.hits;
            sum.misses += c.misses;
            sum.evicted += c.evicted;
            sum.invalidated += c.invalidated;
        }
        sum
    }

    /// What the shards hold of what the limits bound, summed.
    pub fn held(&self) -> Held {
        let mut held = Held::default();
        for s in &self.shards {
            held.merge(&s.budget.held);
        }
        held
    }

    /// Panes and bins held (open + closed), summed over the shards.
    pub fn footprint(&self) -> (usize, usize) {
        self.shards
            .iter()
            .flat_map(|s| &s.accumulators)
            .map(Accumulator::footprint)
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// One aggregation's quantiles for its last closed window (or `window`):
    /// each shard's groups, in label order, as one ingester answers.
    pub fn query(&self, aggregation: &str, window: Option<i64>) -> Option<QueryResult> {
        let a = self
            .plan
            .plan
            .aggregations
            .iter()
            .position(|agg| agg.id == aggregation)?;
        let window = window.or_else(|| {
            self.shards
                .iter()
                .filter_map(|s| s.accumulators[a].last_closed())
                .max()
        });
        let mut merged: Option<QueryResult> = None;
        for shard in &self.shards {
            let part = shard.accumulators[a].query(window);
            match &mut merged {
                None => merged = Some(part),
                Some(m) => {
                    m.window_start_ms = m.window_start_ms.or(part.window_start_ms);
                    m.groups.extend(part.groups);
                }
            }
        }
        let mut merged = merged.expect("one shard at least");
        merged.groups.sort_by(|a, b| a.labels.cmp(&b.labels));
        Some(merged)
    }

    /// [`ShardedIngester::query`]'s answer as JSON (the bytes `serde_json`
    /// makes of it), appended to `out`; `false` when there is no such aggregation.
    pub fn query_json(&self, aggregation: &str, window: Option<i64>, out: &mut Vec<u8>) -> bool {
        match self.query(aggregation, window) {
            Some(result) => {
                serde_json::to_writer(out, &result).expect("a query result serializes");
                true
            }
            None => false,
        }
    }

    /// Every aggregation's last closed window, in plan order.
    pub fn query_all(&self) -> Vec<QueryResult> {
        self.plan
            .plan
            .aggregations
            .iter()
            .filter_map(|a| self.query(&a.id, None))
            .collect()
    }

    /// Every pane (open and closed) of every shard, sorted: the exact outcome.
    pub fn snapshot(&self) -> Vec<PaneReport> {
        let mut panes: Vec<PaneReport> = self
            .shards
            .iter()
            .flat_map(|s| &s.accumulators)
            .flat_map(Accumulator::panes)
            .collect();
        panes.sort();
        panes
    }
}
