//! Per-aggregation accumulators: tumbling windows and their panes.
//!
//! Windows are `[start, start + window)` on sample timestamps, `start` a multiple
//! of the window length. A window closes when the watermark (the newest routed
//! timestamp minus the allowed lateness) reaches its end; a sample whose window
//! has closed is counted late and dropped. The watermark advances *between*
//! requests, never inside one, so what a request does cannot depend on the order
//! of its samples — which lets strategies regroup them. The last `keep_windows`
//! closed windows of each aggregation are kept for queries.
//!
//! An open window holds a pane ([`PaneSketch`]) per group id that has
//! samples there, in one lane; a closed window holds each group's
//! [`PaneBins`](super::bins::PaneBins) (every lane's pane of it merged,
//! exactly: [`super::bins`]).
//! Samples refused past a limit are counted per request (`Stats`), per
//! group and per window, and an answer that misses some says so: `"dropped"`
//! on the group (its samples refused while it had a pane there) and on the
//! window (samples of groups that got no pane there, past the group, pane or
//! bin limit). The groups themselves, and the budget every limit counts
//! against, are the ingester's ([`super::groups`]), shared by its lanes.
//!
//! Here: the [`Accumulator`] (adding, closing, answering). What closing
//! makes of a window, [`WindowBins`], is in `close.rs`; how an answer is
//! encoded, and its types, in `answer.rs`.

mod answer;
mod close;

pub use answer::{GroupResult, PaneReport, Quantiles, QueryResult};
pub use close::WindowBins;

use answer::{Answers, QueryOrder, View};
use close::{windows_as_bins, ClosedWindow};

use super::budget::{Budget, Held};
use super::groups::{AggGroups, OVERFLOW};
use super::plan::Aggregation;
use super::sketch::{PaneSketch, PANE_BINS};
use crate::shared::seams::SketchUpdate;
use serde::Serialize;
use sketches_ddsketch::Config;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Bumped whenever any accumulator in the process is created or its closed
/// windows change (one closes, one is dropped). An answer about the last
/// closed window, taken under its ingester's lock while this read `g`, is
/// still the answer while this reads `g`: a server can keep it outside that
/// lock and serve it without waiting behind ingest. Process-wide, so that no
/// handle needs threading through; another ingester's change only costs a
/// server one recomputed answer.
static CLOSED_WINDOWS_GENERATION: AtomicU64 = AtomicU64::new(0);

/// The current [`CLOSED_WINDOWS_GENERATION`].
pub fn closed_windows_generation() -> u64 {
    CLOSED_WINDOWS_GENERATION.load(Ordering::Acquire)
}

fn closed_windows_changed() {
    CLOSED_WINDOWS_GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Counts of what happened to a request's samples. `accepted` and `late` count
/// (sample, aggregation) pairs; the others count samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    pub requests: u64,
    pub series: u64,
    pub samples: u64,
    pub accepted: u64,
    pub late: u64,
    /// Prometheus stale markers (NaN with bits `0x7ff0000000000002`), skipped.
    pub stale: u64,
    /// Other NaN and ±Inf values, rejected.
    pub rejected: u64,
    /// Finite samples of series no aggregation matches.
    pub unrouted: u64,
    pub metadata: u64,
    /// Samples stamped further ahead of the ingester's clock than its limits allow, dropped.
    pub too_far_ahead: u64,
    /// (Sample, aggregation) pairs of a new group past the group limit, dropped.
    pub over_group_limit: u64,
    /// (Sample, aggregation) pairs that needed a pane past the pane limit, dropped.
    pub over_pane_limit: u64,
    /// (Sample, aggregation) pairs that arrived with the sketch bins at their limit, dropped.
    pub over_bin_limit: u64,
}

impl Stats {
    pub fn merge(&mut self, o: &Stats) {
        self.requests += o.requests;
        self.series += o.series;
        self.samples += o.samples;
        self.accepted += o.accepted;
        self.late += o.late;
        self.stale += o.stale;
        self.rejected += o.rejected;
        self.unrouted += o.unrouted;
        self.metadata += o.metadata;
        self.too_far_ahead += o.too_far_ahead;
        self.over_group_limit += o.over_group_limit;
        self.over_pane_limit += o.over_pane_limit;
        self.over_bin_limit += o.over_bin_limit;
    }
}

/// The stale marker Prometheus writes when a series disappears.
pub const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

/// One aggregation's windows, in one lane (the home lane also keeps the closed ones).
pub struct Accumulator {
    pub agg: Aggregation,
    window_ms: i64,
    config: Config,
    keep: usize,
    /// The sketch-update seam: per sample into `DDSketch`es, or (`bulk-sketch`)
    /// per run into [`super::bulk_sketch::BulkSketch`]es.
    sketch: SketchUpdate,
    /// Open windows by start.
    open: BTreeMap<i64, OpenWindow>,
    /// Closed windows, oldest first.
    closed: VecDeque<ClosedWindow>,
    /// The groups in answer order with their labels' JSON, for queries.
    query_order: Mutex<QueryOrder>,
}

/// An open window in one lane.
#[derive(Default)]
struct OpenWindow {
    /// A pane per group id (`None` until a sample arrives).
    panes: Vec<Option<PaneSketch>>,
    /// Samples refused past a limit for groups without a pane here.
    dropped: u64,
    /// Per group with a pane here: its samples refused past a limit.
    group_dropped: HashMap<u32, u64>,
}

impl OpenWindow {
    fn bins_len(&self) -> usize {
        self.panes.iter().flatten().map(PaneSketch::bins_len).sum()
    }

    /// The window as bins (what closing keeps, or a merged view of lanes).
    fn to_bins(&self, start: i64) -> WindowBins {
        // Sized first, so that filling it copies nothing.
        let mut panes = Vec::with_capacity(self.panes.iter().flatten().count());
        let ahead = |gid: usize| self.panes.get(gid).and_then(Option::as_ref);
        panes.extend(self.panes.iter().enumerate().filter_map(|(gid, pane)| {
            // A pane a few slots on is asked for now (its structure, then its
            // counts), so that its cache misses overlap the conversions
            // before it, as the router's adds do.
            if let Some(pane) = ahead(gid + CLOSE_PREFETCH_AHEAD) {
                pane.prefetch();
            }
            if let Some(pane) = ahead(gid + CLOSE_PREFETCH_AHEAD / 2) {
                pane.prefetch_stores();
            }
            let mut bins = pane.as_ref()?.to_bins();
            bins.dropped = self.group_dropped.get(&(gid as u32)).copied().unwrap_or(0);
            Some((gid as u32, bins))
        }));
        WindowBins {
            start,
            panes,
            dropped: self.dropped,
        }
    }
}

/// How many pane slots ahead of its conversion a closing pane is prefetched.
const CLOSE_PREFETCH_AHEAD: usize = 8;

impl Accumulator {
    pub fn new(agg: Aggregation, keep: usize, sketch: SketchUpdate) -> Self {
        // A new aggregation (a plan change) answers differently from one it replaces.
        closed_windows_changed();
        Accumulator {
            window_ms: agg.window_ms(),
            config: agg.sketch_config(),
            agg,
            keep,
            sketch,
            open: BTreeMap::new(),
            closed: VecDeque::new(),
            query_order: Mutex::new(QueryOrder::default()),
        }
    }

    /// The pane slots and bins this lane's windows of this aggregation hold.
    pub fn held(&self) -> Held {
        let mut held = Held::default();
        for w in self.open.values() {
            held.pane_slots += w.panes.len();
            held.bins += w.bins_len();
        }
        for w in &self.closed {
            held.pane_slots += w.bins.panes.len();
            held.bins += w.bins.cost();
        }
        held
    }

    /// The start of `ts`'s window (`window_ms` is at least 1; the arithmetic saturates).
    #[inline]
    fn window_start(&self, ts: i64) -> i64 {
        ts.div_euclid(self.window_ms).saturating_mul(self.window_ms)
    }

    #[inline]
    fn is_closed(&self, start: i64, watermark: i64) -> bool {
        start.saturating_add(self.window_ms) <= watermark
    }

    /// The sketch-update seam: one group's samples (finite values), in order.
    #[inline(never)] // one call per (group, request); kept apart so profiles show the seam
    pub fn add(
        &mut self,
        gid: u32,
        ts: &[i64],
        values: &[f64],
        watermark: i64,
        stats: &mut Stats,
        budget: &Budget,
    ) {
        match self.sketch {
            SketchUpdate::Runs => self.add_runs(gid, ts, values, watermark, stats, budget),
            SketchUpdate::PerSample => self.add_each(gid, ts, values, watermark, stats, budget),
        }
    }

    /// Group `gid`'s pane in the newest open window, if `ts` falls in that
    /// window (where nearly every sample goes), for a prefetch ahead of an
    /// add (see [`PaneSketch::prefetch`]): found without the division of
    /// `window_start`, as a hint needs nothing more (it runs once per
    /// destination of a request).
    #[inline]
    pub fn newest_open_pane(&self, gid: u32, ts: i64) -> Option<&PaneSketch> {
        let (&start, window) = self.open.last_key_value()?;
        if ts < start || ts.saturating_sub(start) >= self.window_ms {
            return None;
        }
        window.panes.get(gid as usize)?.as_ref()
    }

    /// Adds `values` to group `gid`'s pane of window `start`, within the
    /// budget: a new pane needs its slots and the bins under their limit
    /// (closed windows are dropped first, the oldest first), and a value
    /// that would grow a pane's bins past the limit that applies is refused.
    /// What is refused is counted and remembered in the window.
    #[inline]
    fn add_to_pane(
        &mut self,
        start: i64,
        gid: u32,
        values: &[f64],
        stats: &mut Stats,
        budget: &Budget,
    ) {
        let n = values.len() as u64;
        let Accumulator {
            open,
            closed,
            config,
            sketch,
            ..
        } = self;
        if gid == OVERFLOW {
            stats.over_group_limit += n;
            refused_without_pane(start, n, open, closed, budget);
            return;
        }
        let soft = budget.capacity.bins;
        let has_pane = open
            .get(&start)
            .and_then(|w| w.panes.get(gid as usize))
            .is_some_and(Option::is_some);
        let mut granted = 0;
        if !has_pane {
            // A new pane's own bins, below the limit (history goes first).
            while !budget.try_take_bins(PANE_BINS, soft) {
                if !drop_oldest(closed, budget) {
                    stats.over_bin_limit += n;
                    refused_without_pane(start, n, open, closed, budget);
                    return;
                }
            }
            if !make_room(open, closed, start, gid as usize, budget) {
                budget.give_bins(PANE_BINS);
                stats.over_pane_limit += n;
                refused_without_pane(start, n, open, closed, budget);
                return;
            }
            granted = PANE_BINS;
        }
        let window = open
            .get_mut(&start)
            .expect("the window has room for the pane");
        let pane =
            window.panes[gid as usize].get_or_insert_with(|| PaneSketch::new(*config, *sketch));
        let limit = if has_pane {
            soft.saturating_mul(2)
        } else {
            soft
        };
        let before = if has_pane { pane.bins_len() } else { 0 };
        let refused = pane.add_within(values, &mut |growth| loop {
            if budget.try_take_bins(growth, limit) {
                granted += growth;
                return true;
            }
            if !drop_oldest(closed, budget) {
                return false;
            }
        });
        // What was granted is an upper bound of the growth (exact for `bulk-sketch`).
        let grown = pane.bins_len().saturating_sub(before);
        budget.give_bins(granted.saturating_sub(grown));
        stats.accepted += n - refused;
        if refused > 0 {
            stats.over_bin_limit += refused;
            *window.group_dropped.entry(gid).or_default() += refused;
        }
    }

    /// Reference: per sample, find the window's pane and `DDSketch::add`.
    fn add_each(
        &mut self,
        gid: u32,
        ts: &[i64],
        values: &[f64],
        watermark: i64,
        stats: &mut Stats,
        budget: &Budget,
    ) {
        for (&t, &v) in ts.iter().zip(values) {
            let start = self.window_start(t);
            if self.is_closed(start, watermark) {
                stats.late += 1;
                continue;
            }
            self.add_to_pane(start, gid, std::slice::from_ref(&v), stats, budget);
        }
    }

    /// `bulk-sketch`: one pane lookup and one slice add per run of samples in the same window.
    fn add_runs(
        &mut self,
        gid: u32,
        ts: &[i64],
        values: &[f64],
        watermark: i64,
        stats: &mut Stats,
        budget: &Budget,
    ) {
        let mut i = 0;
        while i < ts.len() {
            let start = self.window_start(ts[i]);
            let end = start.saturating_add(self.window_ms);
            let run = ts[i..]
                .iter()
                .take_while(|&&t| t >= start && t < end)
                .count()
                .max(1);
            if self.is_closed(start, watermark) {
                stats.late += run as u64;
            } else {
                self.add_to_pane(start, gid, &values[i..i + run], stats, budget);
            }
            i += run;
        }
    }

    /// Closes every open window whose end the watermark has reached, here and
    /// in `others` (the other lanes' accumulators of this aggregation): each
    /// group's panes merged as bins ([`WindowBins::merge`], never more bins
    /// than the panes held, so it needs nothing from the budget), kept here;
    /// closed windows past `keep` are dropped, their slots and bins given back.
    pub fn close_from(&mut self, others: &mut [&mut Accumulator], watermark: i64, budget: &Budget) {
        let mut starts = BTreeSet::new();
        for acc in std::iter::once(&*self).chain(others.iter().map(|o| &**o)) {
            starts.extend(
                acc.open
                    .keys()
                    .take_while(|&&s| acc.is_closed(s, watermark))
                    .copied(),
            );
        }
        for start in starts {
            let windows: Vec<OpenWindow> = std::iter::once(&mut self.open)
                .chain(others.iter_mut().map(|o| &mut o.open))
                .filter_map(|open| take_open(open, start, budget))
                .collect();
            let mut lanes_bins = windows_as_bins(start, windows).into_iter();
            let mut bins = lanes_bins.next().unwrap_or(WindowBins {
                start,
                ..WindowBins::default()
            });
            for theirs in lanes_bins {
                bins.merge(theirs);
            }
            budget.take_slots(bins.panes.len());
            budget.take_bins(bins.cost());
            self.closed.push_back(ClosedWindow {
                bins,
                answer: OnceLock::new(),
            });
            if self.closed.len() > self.keep {
                drop_oldest(&mut self.closed, budget);
            }
            closed_windows_changed();
        }
    }

    /// Marks in `live` (by group id) every group with a pane in a window here.
    pub fn mark_live(&self, live: &mut Vec<bool>) {
        let mut mark = |gid: usize| {
            if live.len() <= gid {
                live.resize(gid + 1, false);
            }
            live[gid] = true;
        };
        for w in self.open.values() {
            for (gid, pane) in w.panes.iter().enumerate() {
                if pane.is_some() {
                    mark(gid);
                }
            }
        }
        for w in &self.closed {
            for (gid, _) in &w.bins.panes {
                mark(*gid as usize);
            }
        }
    }

    /// Drops closed windows (the oldest first) while the budget's bins or
    /// pane slots are at their limits: what another lane, which cannot drop
    /// this lane's history itself, asks after it had to refuse samples.
    pub fn relieve(&mut self, budget: &Budget) {
        while (budget.bins() >= budget.capacity.bins
            || budget.slots() >= budget.capacity.pane_slots)
            && drop_oldest(&mut self.closed, budget)
        {}
    }

    /// Copies of the open windows (only window `start`'s when given) as bins,
    /// for a query that merges lanes.
    pub fn open_bins(&self, start: Option<i64>) -> Vec<WindowBins> {
        self.open
            .iter()
            .filter(|(s, _)| start.is_none_or(|start| **s == start))
            .map(|(&s, w)| w.to_bins(s))
            .collect()
    }

    /// The closed windows kept, oldest first: each group's bins (by group
    /// id; labels in the groups) and the samples refused for groups without
    /// a pane — what a closed window hands out ([`super::bins`]).
    pub fn closed_windows(&self) -> impl Iterator<Item = &WindowBins> + '_ {
        self.closed.iter().map(|w| &w.bins)
    }

    /// The last closed window's start.
    pub fn last_closed(&self) -> Option<i64> {
        self.closed.back().map(|w| w.bins.start)
    }

    /// The starts of the closed windows kept, oldest first.
    pub fn closed_starts(&self) -> impl Iterator<Item = i64> + '_ {
        self.closed.iter().map(|w| w.bins.start)
    }

    fn view(&self, start: i64) -> Option<View<'_>> {
        if let Some(w) = self.closed.iter().find(|w| w.bins.start == start) {
            return Some(View::Bins(&w.bins));
        }
        self.open.get(&start).map(View::Open)
    }

    /// The window a query asks for (`None`: the last closed one), if it exists.
    fn query_start(&self, window: Option<i64>) -> Option<i64> {
        window
            .or_else(|| self.last_closed())
            .filter(|&s| self.view(s).is_some())
    }

    /// The answer [`Accumulator::query_json`] keeps for the closed window a
    /// query asks for (`None`: the last closed one), once a query has encoded
    /// it; `None` before that, or when the window is not a closed one.
    pub fn kept_answer(&self, window: Option<i64>) -> Option<&Arc<[u8]>> {
        let start = self.query_start(window)?;
        let closed = self.closed.iter().find(|w| w.bins.start == start)?;
        closed.answer.get()
    }

    /// [`Accumulator::query`] as the JSON `serde_json` makes of it, appended to
    /// `out`. A closed window's answer is encoded on its first query and kept.
    pub fn query_json(&self, window: Option<i64>, groups: &AggGroups, out: &mut Vec<u8>) {
        let start = self.query_start(window);
        match start.and_then(|s| self.closed.iter().find(|w| w.bins.start == s)) {
            Some(closed) => {
                // The first query encodes into `out` and keeps a copy: one
                // copy of the answer, not three (a vector of its own, grown
                // as it went, an `Arc` of it, then `out`).
                let mut encoded = false;
                let answer = closed.answer.get_or_init(|| {
                    let at = out.len();
                    self.answers()
                        .encode(start, Some(View::Bins(&closed.bins)), groups, out);
                    encoded = true;
                    Arc::from(&out[at..])
                });
                if !encoded {
                    out.extend_from_slice(answer);
                }
            }
            None => self.encode_query(window, groups, out),
        }
    }

    /// [`Accumulator::query`]'s JSON, encoded afresh, appended to `out`.
    pub fn encode_query(&self, window: Option<i64>, groups: &AggGroups, out: &mut Vec<u8>) {
        let start = self.query_start(window);
        self.answers()
            .encode(start, start.and_then(|s| self.view(s)), groups, out);
    }

    /// The answer for lanes' open windows merged (`bins`; `None`: no lane has the window).
    pub fn encode_bins(&self, bins: Option<&WindowBins>, groups: &AggGroups, out: &mut Vec<u8>) {
        self.answers()
            .encode(bins.map(|b| b.start), bins.map(View::Bins), groups, out);
    }

    /// The quantile scan alone (what the query's floor scans): every present
    /// pane's quantiles of one window (`None`: the last closed one), in
    /// group-id order, each pane's handed to `f` as they are computed;
    /// returns the panes scanned.
    pub fn quantile_scan(&self, window: Option<i64>, f: &mut dyn FnMut(&[f64])) -> usize {
        let Some(view) = self.query_start(window).and_then(|s| self.view(s)) else {
            return 0;
        };
        let mut values = Vec::with_capacity(self.agg.quantiles.len());
        let mut scanned = 0;
        for (_, pane) in view.panes() {
            values.clear();
            pane.quantiles_into(&self.config, &self.agg.quantiles, &mut values);
            f(&values);
            scanned += 1;
        }
        scanned
    }

    /// Per group, the quantiles of one window (`None`: the last closed one).
    /// Without such a window the result has no start and no groups.
    pub fn query(&self, window: Option<i64>, groups: &AggGroups) -> QueryResult {
        let start = self.query_start(window);
        self.answers()
            .result(start, start.and_then(|s| self.view(s)), groups)
    }

    /// [`Accumulator::query`] for lanes' open windows merged.
    pub fn query_bins(&self, bins: Option<&WindowBins>, groups: &AggGroups) -> QueryResult {
        self.answers()
            .result(bins.map(|b| b.start), bins.map(View::Bins), groups)
    }

    /// Every pane, open and closed, for equivalence checks.
    pub fn panes(&self, groups: &AggGroups) -> Vec<PaneReport> {
        let mut out = Vec::new();
        for w in &self.closed {
            self.answers()
                .reports(View::Bins(&w.bins), w.bins.start, true, groups, &mut out);
        }
        for (&start, w) in &self.open {
            self.answers()
                .reports(View::Open(w), start, false, groups, &mut out);
        }
        out
    }

    /// The panes of lanes' open windows merged.
    pub fn bins_panes(&self, bins: &WindowBins, groups: &AggGroups) -> Vec<PaneReport> {
        let mut out = Vec::new();
        self.answers()
            .reports(View::Bins(bins), bins.start, false, groups, &mut out);
        out
    }

    /// What this accumulator's answers are made from.
    fn answers(&self) -> Answers<'_> {
        Answers {
            agg: &self.agg,
            config: &self.config,
            order: &self.query_order,
        }
    }

    /// Open and closed panes, and their bins (for self-metrics).
    pub fn footprint(&self) -> (usize, usize) {
        let mut panes = 0;
        let mut bins = 0;
        for w in self.open.values() {
            panes += w.panes.iter().flatten().count();
            bins += w.bins_len();
        }
        for w in &self.closed {
            panes += w.bins.panes.len();
            bins += w.bins.cost();
        }
        (panes, bins)
    }
}

/// Samples of window `start` refused for a group without a pane there. A
/// window where every sample is refused is made too, with one pane slot
/// from the budget and no pane: it closes and is kept like any other, so the
/// windows before it age out of `keep_windows` on time (a flood's groups with
/// them) and its answer says what it refused. Without even that slot, the
/// count is only the request's.
fn refused_without_pane(
    start: i64,
    n: u64,
    open: &mut BTreeMap<i64, OpenWindow>,
    closed: &mut VecDeque<ClosedWindow>,
    budget: &Budget,
) {
    if open.contains_key(&start) || make_room(open, closed, start, 0, budget) {
        open.get_mut(&start).expect("made").dropped += n;
    }
}

/// Makes window `start` (if new) and its pane slots up to `gid`, taking the
/// slots from the budget (closed windows dropped first, the oldest first);
/// false when even that is not enough (no window is made then).
fn make_room(
    open: &mut BTreeMap<i64, OpenWindow>,
    closed: &mut VecDeque<ClosedWindow>,
    start: i64,
    gid: usize,
    budget: &Budget,
) -> bool {
    let have = open.get(&start).map(|w| w.panes.len());
    if have.is_some_and(|len| len > gid) {
        return true;
    }
    if !afford_slots(closed, budget, gid + 1 - have.unwrap_or(0)) {
        return false;
    }
    open.entry(start)
        .or_default()
        .panes
        .resize_with(gid + 1, || None);
    true
}

/// Removes open window `start`, giving its slots and bins back.
fn take_open(
    open: &mut BTreeMap<i64, OpenWindow>,
    start: i64,
    budget: &Budget,
) -> Option<OpenWindow> {
    let window = open.remove(&start)?;
    budget.give_slots(window.panes.len());
    budget.give_bins(window.bins_len());
    Some(window)
}

/// Drops the oldest closed window, giving its slots and bins back to the
/// budget; false when there is none. Past `keep`, or when the budget runs out:
/// under memory pressure, history goes before new samples.
fn drop_oldest(closed: &mut VecDeque<ClosedWindow>, budget: &Budget) -> bool {
    let Some(dropped) = closed.pop_front() else {
        return false;
    };
    closed_windows_changed();
    budget.give_slots(dropped.bins.panes.len());
    budget.give_bins(dropped.bins.cost());
    true
}

/// Takes `grow` pane slots from the budget, dropping closed windows (oldest
/// first) while they are short; false when even that is not enough.
fn afford_slots(closed: &mut VecDeque<ClosedWindow>, budget: &Budget, grow: usize) -> bool {
    loop {
        if budget.try_take_slots(grow) {
            return true;
        }
        if !drop_oldest(closed, budget) {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::budget::Capacity;
    use super::super::groups::GroupTable;
    use super::super::plan::Plan;
    use super::*;

    #[test]
    fn windows_close_and_late_samples_drop() {
        let plan = Plan::default();
        let mut acc = Accumulator::new(plan.aggregations[0].clone(), 2, SketchUpdate::PerSample);
        let budget = Budget::new(Capacity::UNBOUNDED);
        let mut table = GroupTable::default();
        table.set_plan(1, &plan.aggregations, &[None], &budget);
        let (g, _) = table.intern(0, b"\"g0\"", &budget);
        let mut stats = Stats::default();
        acc.add(
            g,
            &[1_000, 59_999, 60_000],
            &[1.0, 2.0, 3.0],
            i64::MIN,
            &mut stats,
            &budget,
        );
        acc.close_from(&mut [], 60_000, &budget);
        assert_eq!(acc.last_closed(), Some(0));
        acc.add(g, &[30_000], &[9.0], 60_000, &mut stats, &budget);
        assert_eq!((stats.accepted, stats.late), (3, 1));
        let q = acc.query(None, table.agg(0));
        assert_eq!(q.groups[0].count, 2);
        assert_eq!(q.groups[0].labels["label_0"], "g0");
        assert_eq!(budget.held().pane_slots, acc.held().pane_slots);
        assert_eq!(budget.bins(), acc.held().bins);
    }
}
