//! Per-aggregation accumulators: groups, tumbling windows, panes.
//!
//! Windows are `[start, start + window)` on sample timestamps, `start` a multiple
//! of the window length. A window closes when the watermark (the newest routed
//! timestamp minus the allowed lateness) reaches its end; a sample whose window
//! has closed is counted late and dropped. The watermark advances *between*
//! requests, never inside one, so what a request does cannot depend on the order
//! of its samples — which lets strategies regroup them. The last `keep_windows`
//! closed windows of each aggregation are kept for queries.

use super::plan::Aggregation;
use super::sketch::PaneSketch;
use crate::seams::SketchUpdate;
use crate::text::{write_escaped, Escape};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

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

/// A group's identity: its group-by label values, each quoted and escaped,
/// joined by `,` (a missing label is `""`, as Prometheus treats absent and empty alike).
pub fn write_group_key(out: &mut Vec<u8>, values: impl IntoIterator<Item = impl AsRef<[u8]>>) {
    for (i, v) in values.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'"');
        write_escaped(out, v.as_ref(), Escape::LabelValue);
        out.push(b'"');
    }
}

/// The values of a group key written by [`write_group_key`].
pub fn parse_group_key(key: &[u8]) -> Vec<Vec<u8>> {
    let mut values = Vec::new();
    let mut i = 0;
    while i < key.len() {
        // Skip the opening quote (and a separating comma).
        i += if key[i] == b',' { 2 } else { 1 };
        let mut v = Vec::new();
        while i < key.len() && key[i] != b'"' {
            if key[i] == b'\\' && i + 1 < key.len() {
                i += 1;
                v.push(if key[i] == b'n' { b'\n' } else { key[i] });
            } else {
                v.push(key[i]);
            }
            i += 1;
        }
        i += 1;
        values.push(v);
    }
    values
}

/// How much of each bounded resource an ingester may hold, across its aggregations.
/// Per ingester: an ingester split across threads gives each part its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Groups (distinct group-by value tuples), over all aggregations.
    pub groups: usize,
    /// Bytes of the group keys (each held twice: as key and as labels).
    pub group_bytes: usize,
    /// Pane slots: per window, one per group id up to the highest that has a pane there.
    pub pane_slots: usize,
    /// Sketch bins (8 bytes each), over every pane. Past this, no new pane
    /// gets a sketch, but panes that exist still take samples, up to twice
    /// this: a flood of new groups cannot starve the groups already there.
    pub bins: usize,
}

impl Capacity {
    pub const UNBOUNDED: Capacity = Capacity {
        groups: usize::MAX,
        group_bytes: usize::MAX,
        pane_slots: usize::MAX,
        bins: usize::MAX,
    };
}

/// What an ingester holds of what [`Capacity`] bounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub groups: usize,
    pub group_bytes: usize,
    pub pane_slots: usize,
    pub bins: usize,
}

impl Held {
    pub fn merge(&mut self, o: &Held) {
        self.groups += o.groups;
        self.group_bytes += o.group_bytes;
        self.pane_slots += o.pane_slots;
        self.bins += o.bins;
    }
}

/// The capacity and what is held of it, threaded through every accumulator of an ingester.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub capacity: Capacity,
    pub held: Held,
}

impl Budget {
    pub fn new(capacity: Capacity) -> Self {
        Budget {
            capacity,
            held: Held::default(),
        }
    }

    /// Recounts what `accumulators` hold (after a plan change).
    pub fn recount<'a>(&mut self, accumulators: impl IntoIterator<Item = &'a Accumulator>) {
        let mut held = Held::default();
        for acc in accumulators {
            held.merge(&acc.held());
        }
        self.held = held;
    }
}

/// One aggregation's groups and windows.
pub struct Accumulator {
    pub agg: Aggregation,
    window_ms: i64,
    config: sketches_ddsketch::Config,
    keep: usize,
    /// The sketch-update seam: per sample into `DDSketch`es, or (`bulk-sketch`)
    /// per run into [`super::sketch::BulkSketch`]es.
    sketch: SketchUpdate,
    /// Per group id: its labels (present ones, group-by order) and global destination id.
    groups: Vec<(Vec<(String, String)>, u32)>,
    group_ids: HashMap<Box<[u8]>, u32>,
    /// The group id every new group key gets once the group limit is reached:
    /// its samples are counted and dropped, and it never has a pane.
    overflow: Option<u32>,
    /// Open windows by start; each holds a pane per group id (None until a sample arrives).
    open: BTreeMap<i64, Panes>,
    /// Closed windows, oldest first.
    closed: VecDeque<ClosedWindow>,
    /// The groups in answer order with their labels' JSON, for queries.
    query_order: Mutex<QueryOrder>,
}

/// Every group in the order a query answers them (by their labels as a map),
/// each with the start of its JSON object up to its count; rebuilt when groups
/// were added since. A group's labels never change.
#[derive(Default)]
struct QueryOrder {
    /// How many groups (ids `0..covered`) this covers.
    covered: usize,
    /// Group ids in answer order.
    sorted: Vec<u32>,
    /// Per group id: `{"labels":{…},"count":`.
    heads: Vec<Box<[u8]>>,
}

/// A closed window: its panes never change again, so its query answer is
/// encoded once, on the first query, and kept.
struct ClosedWindow {
    start: i64,
    panes: Vec<Option<PaneSketch>>,
    answer: OnceLock<Box<[u8]>>,
}

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
            groups: Vec::new(),
            group_ids: HashMap::new(),
            overflow: None,
            open: BTreeMap::new(),
            closed: VecDeque::new(),
            query_order: Mutex::new(QueryOrder::default()),
        }
    }

    /// The group id of a group key, creating the group (with global destination
    /// id `*next_dest`, then bumped) on first sight; past the budget's group
    /// limit, the overflow group's id.
    pub fn intern(&mut self, key: &[u8], next_dest: &mut u32, budget: &mut Budget) -> u32 {
        if let Some(&gid) = self.group_ids.get(key) {
            return gid;
        }
        let (held, capacity) = (&mut budget.held, &budget.capacity);
        let bytes = 2 * key.len();
        if held.groups >= capacity.groups
            || held.group_bytes.saturating_add(bytes) > capacity.group_bytes
        {
            return *self.overflow.get_or_insert_with(|| {
                let gid = self.groups.len() as u32;
                self.groups.push((Vec::new(), *next_dest));
                *next_dest += 1;
                gid
            });
        }
        held.groups += 1;
        held.group_bytes += bytes;
        let gid = self.groups.len() as u32;
        let labels = self
            .agg
            .group_by
            .iter()
            .zip(parse_group_key(key))
            .filter(|(_, v)| !v.is_empty())
            .map(|(n, v)| (n.clone(), String::from_utf8_lossy(&v).into_owned()))
            .collect();
        self.groups.push((labels, *next_dest));
        *next_dest += 1;
        self.group_ids.insert(key.into(), gid);
        gid
    }

    /// Gives every group a fresh global destination id from `next` on (after a
    /// plan change), recording (aggregation, group) per id in `dests`.
    pub fn renumber(&mut self, agg: u16, mut next: u32, dests: &mut Vec<(u16, u32)>) -> u32 {
        for (gid, group) in self.groups.iter_mut().enumerate() {
            group.1 = next;
            dests.push((agg, gid as u32));
            next += 1;
        }
        next
    }

    pub fn dest_of(&self, gid: u32) -> u32 {
        self.groups[gid as usize].1
    }

    /// What this aggregation holds of what [`Capacity`] bounds.
    pub fn held(&self) -> Held {
        let windows = self
            .closed
            .iter()
            .map(|w| &w.panes)
            .chain(self.open.values());
        let mut held = Held {
            groups: self.group_ids.len(),
            group_bytes: self.group_ids.keys().map(|k| 2 * k.len()).sum(),
            ..Held::default()
        };
        for panes in windows {
            held.pane_slots += panes.len();
            held.bins += panes
                .iter()
                .flatten()
                .map(PaneSketch::bins_len)
                .sum::<usize>();
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

    /// The pane of (window, group), created on first use; `None` when that
    /// needs more pane slots than the budget has left, even after dropping
    /// this aggregation's closed windows (the oldest first).
    fn pane(&mut self, start: i64, gid: u32, budget: &mut Budget) -> Option<&mut PaneSketch> {
        use std::collections::btree_map::Entry;
        let gid = gid as usize;
        // No window is created for a refused pane.
        let panes = match self.open.entry(start) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                if !afford_slots(&mut self.closed, budget, gid + 1) {
                    return None;
                }
                v.insert(Vec::new())
            }
        };
        if panes.len() <= gid {
            // A new window's slots were paid for above (its length is still 0).
            if !panes.is_empty() && !afford_slots(&mut self.closed, budget, gid + 1 - panes.len()) {
                return None;
            }
            panes.resize_with(gid + 1, || None);
        }
        let (config, sketch) = (self.config, self.sketch);
        Some(panes[gid].get_or_insert_with(|| PaneSketch::new(config, sketch)))
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
        budget: &mut Budget,
    ) {
        if self.overflow == Some(gid) {
            stats.over_group_limit += ts.len() as u64;
            return;
        }
        match self.sketch {
            SketchUpdate::Runs => self.add_runs(gid, ts, values, watermark, stats, budget),
            SketchUpdate::PerSample => self.add_each(gid, ts, values, watermark, stats, budget),
        }
    }

    /// Adds `values` to one pane, keeping the budget's bin count; false when
    /// the bins are at their limit or a pane slot is not to be had.
    #[inline]
    fn add_to_pane(
        &mut self,
        start: i64,
        gid: u32,
        values: &[f64],
        stats: &mut Stats,
        budget: &mut Budget,
    ) {
        let n = values.len() as u64;
        while budget.held.bins >= budget.capacity.bins && drop_oldest(&mut self.closed, budget) {}
        if budget.held.bins >= budget.capacity.bins {
            // Only panes that already have a sketch may grow past the limit, to twice it.
            let has_sketch = self
                .open
                .get(&start)
                .and_then(|panes| panes.get(gid as usize))
                .is_some_and(Option::is_some);
            if !has_sketch || budget.held.bins >= budget.capacity.bins.saturating_mul(2) {
                stats.over_bin_limit += n;
                return;
            }
        }
        let Some(pane) = self.pane(start, gid, budget) else {
            stats.over_pane_limit += n;
            return;
        };
        let before = pane.bins_len();
        match values {
            [v] => pane.add(*v),
            _ => pane.add_slice(values),
        }
        budget.held.bins = (budget.held.bins + pane.bins_len()).saturating_sub(before);
        stats.accepted += n;
    }

    /// Reference: per sample, find the window's pane and `DDSketch::add`.
    fn add_each(
        &mut self,
        gid: u32,
        ts: &[i64],
        values: &[f64],
        watermark: i64,
        stats: &mut Stats,
        budget: &mut Budget,
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
        budget: &mut Budget,
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

    /// Closes every open window whose end the watermark has reached, and gives
    /// the budget back what the windows dropped past `keep` held.
    pub fn close_through(&mut self, watermark: i64, budget: &mut Budget) {
        while let Some((&start, _)) = self.open.first_key_value() {
            if !self.is_closed(start, watermark) {
                break;
            }
            let panes = self.open.remove(&start).expect("first key");
            self.closed.push_back(ClosedWindow {
                start,
                panes,
                answer: OnceLock::new(),
            });
            if self.closed.len() > self.keep {
                drop_oldest(&mut self.closed, budget);
            }
            closed_windows_changed();
        }
    }

    /// Moves out the open windows `watermark` closes, each pane with its
    /// group key, giving the budget back their slots and bins: for another
    /// lane's accumulator to [`Accumulator::absorb`] before it closes them.
    pub fn take_closing(&mut self, watermark: i64, budget: &mut Budget) -> Vec<WindowPanes> {
        let mut taken = Vec::new();
        while let Some((&start, _)) = self.open.first_key_value() {
            if !self.is_closed(start, watermark) {
                break;
            }
            let panes = self.open.remove(&start).expect("first key");
            budget.held.pane_slots = budget.held.pane_slots.saturating_sub(panes.len());
            let bins: usize = panes.iter().flatten().map(PaneSketch::bins_len).sum();
            budget.held.bins = budget.held.bins.saturating_sub(bins);
            taken.push(self.keyed(start, panes.into_iter()));
        }
        taken
    }

    /// Copies of the open windows' panes (only window `start`'s when given), each with its group key.
    pub fn open_panes(&self, start: Option<i64>) -> Vec<WindowPanes> {
        self.open
            .iter()
            .filter(|(s, _)| start.is_none_or(|start| **s == start))
            .map(|(&s, panes)| self.keyed(s, panes.iter().cloned()))
            .collect()
    }

    fn keyed(&self, start: i64, panes: impl Iterator<Item = Option<PaneSketch>>) -> WindowPanes {
        let mut keys: Vec<&[u8]> = vec![&[]; self.groups.len()];
        for (key, &gid) in &self.group_ids {
            keys[gid as usize] = key;
        }
        let panes = panes
            .enumerate()
            .filter_map(|(gid, pane)| Some((Box::from(keys[gid]), pane?)))
            .collect();
        WindowPanes { start, panes }
    }

    /// Merges `pane` into group `gid`'s pane of the open window `start` (made
    /// when missing), as if its samples had been added here; past the pane
    /// limit (or in the overflow group) its samples are counted and dropped.
    pub fn absorb(
        &mut self,
        start: i64,
        gid: u32,
        pane: &PaneSketch,
        stats: &mut Stats,
        budget: &mut Budget,
    ) {
        if self.overflow == Some(gid) {
            stats.over_group_limit += pane.count();
            return;
        }
        let Some(into) = self.pane(start, gid, budget) else {
            stats.over_pane_limit += pane.count();
            return;
        };
        let before = into.bins_len();
        into.merge(pane);
        budget.held.bins = (budget.held.bins + into.bins_len()).saturating_sub(before);
    }

    /// The last closed window's start.
    pub fn last_closed(&self) -> Option<i64> {
        self.closed.back().map(|w| w.start)
    }

    /// The starts of the closed windows kept, oldest first.
    pub fn closed_starts(&self) -> impl Iterator<Item = i64> + '_ {
        self.closed.iter().map(|w| w.start)
    }

    fn window(&self, start: i64) -> Option<(&Vec<Option<PaneSketch>>, bool)> {
        if let Some(w) = self.closed.iter().find(|w| w.start == start) {
            return Some((&w.panes, true));
        }
        self.open.get(&start).map(|p| (p, false))
    }

    /// The window a query asks for (`None`: the last closed one), if it exists.
    fn query_start(&self, window: Option<i64>) -> Option<i64> {
        window
            .or_else(|| self.last_closed())
            .filter(|&s| self.window(s).is_some())
    }

    /// [`Accumulator::query`] as the JSON `serde_json` makes of it, appended to
    /// `out`. A closed window's answer is encoded on its first query and kept.
    pub fn query_json(&self, window: Option<i64>, out: &mut Vec<u8>) {
        let start = self.query_start(window);
        match start.and_then(|s| self.closed.iter().find(|w| w.start == s)) {
            Some(closed) => {
                let answer = closed.answer.get_or_init(|| {
                    let mut answer = Vec::new();
                    self.encode_query(start, &mut answer);
                    answer.into_boxed_slice()
                });
                out.extend_from_slice(answer);
            }
            None => self.encode_query(window, out),
        }
    }

    /// [`Accumulator::query`]'s JSON, encoded afresh (no `QueryResult`, no
    /// owned labels, the quantiles in one scan per pane; the group order and
    /// each group's labels as JSON are kept across queries), appended to `out`.
    pub fn encode_query(&self, window: Option<i64>, out: &mut Vec<u8>) {
        let start = self.query_start(window);
        out.extend_from_slice(b"{\"aggregation\":");
        json_string(out, &self.agg.id);
        out.extend_from_slice(b",\"window_start_ms\":");
        match start {
            Some(s) => out.extend_from_slice(itoa::Buffer::new().format(s).as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"groups\":[");
        if let Some((panes, _)) = start.and_then(|s| self.window(s)) {
            let mut order = self.query_order.lock().unwrap_or_else(|p| p.into_inner());
            if order.covered != self.groups.len() {
                *order = self.query_order_now();
            }
            // Each quantile's key, as `Quantiles` writes it, once.
            let keys: Vec<Vec<u8>> = self
                .agg
                .quantiles
                .iter()
                .map(|q| {
                    let mut key = Vec::new();
                    json_string(&mut key, &q.to_string());
                    key
                })
                .collect();
            let mut values = Vec::with_capacity(keys.len());
            let mut ints = itoa::Buffer::new();
            let mut first = true;
            for &gid in &order.sorted {
                let Some(Some(pane)) = panes.get(gid as usize) else {
                    continue;
                };
                if !first {
                    out.push(b',');
                }
                first = false;
                out.extend_from_slice(&order.heads[gid as usize]);
                out.extend_from_slice(ints.format(pane.count()).as_bytes());
                out.extend_from_slice(b",\"quantiles\":{");
                values.clear();
                pane.quantiles_into(&self.agg.quantiles, &mut values);
                for (j, (key, v)) in keys.iter().zip(&values).enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(key);
                    out.push(b':');
                    // serde_json's own float form (`null` when not finite).
                    serde_json::to_writer(&mut *out, v).expect("a float serializes into a Vec");
                }
                out.extend_from_slice(b"}}");
            }
        }
        out.extend_from_slice(b"]}");
    }

    /// Every group's answer order and JSON head, computed afresh.
    fn query_order_now(&self) -> QueryOrder {
        let labels: Vec<BTreeMap<&str, &str>> = self
            .groups
            .iter()
            .map(|(labels, _)| {
                labels
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect()
            })
            .collect();
        let mut sorted: Vec<u32> = (0..labels.len() as u32).collect();
        // Stable, as `query`'s sort of the present groups in id order.
        sorted.sort_by(|&a, &b| labels[a as usize].cmp(&labels[b as usize]));
        let heads = labels
            .iter()
            .map(|labels| {
                let mut head = b"{\"labels\":{".to_vec();
                for (j, (k, v)) in labels.iter().enumerate() {
                    if j > 0 {
                        head.push(b',');
                    }
                    json_string(&mut head, k);
                    head.push(b':');
                    json_string(&mut head, v);
                }
                head.extend_from_slice(b"},\"count\":");
                head.into_boxed_slice()
            })
            .collect();
        QueryOrder {
            covered: self.groups.len(),
            sorted,
            heads,
        }
    }

    /// The quantile scan alone (the query's floor): every present pane's
    /// quantiles of one window (`None`: the last closed one) onto `out`, in
    /// group-id order; returns the panes scanned.
    pub fn quantile_scan(&self, window: Option<i64>, out: &mut Vec<f64>) -> usize {
        out.clear();
        let Some((panes, _)) = self.query_start(window).and_then(|s| self.window(s)) else {
            return 0;
        };
        let mut scanned = 0;
        for pane in panes.iter().flatten() {
            pane.quantiles_into(&self.agg.quantiles, out);
            scanned += 1;
        }
        scanned
    }

    /// Per group, the quantiles of one window (`None`: the last closed one).
    /// Without such a window the result has no start and no groups.
    pub fn query(&self, window: Option<i64>) -> QueryResult {
        let start = self.query_start(window);
        let mut groups = Vec::new();
        if let Some((panes, _)) = start.and_then(|s| self.window(s)) {
            for (gid, pane) in panes.iter().enumerate() {
                let Some(pane) = pane else { continue };
                groups.push(GroupResult {
                    labels: self.groups[gid].0.iter().cloned().collect(),
                    count: pane.count(),
                    quantiles: Quantiles(
                        self.agg
                            .quantiles
                            .iter()
                            .map(|&q| (q, pane.quantile(q).unwrap_or(f64::NAN)))
                            .collect(),
                    ),
                });
            }
        }
        groups.sort_by(|a, b| a.labels.cmp(&b.labels));
        QueryResult {
            aggregation: self.agg.id.clone(),
            window_start_ms: start,
            groups,
        }
    }

    /// Every pane, open and closed, for equivalence checks.
    pub fn panes(&self) -> Vec<PaneReport> {
        let windows = self
            .closed
            .iter()
            .map(|w| (w.start, &w.panes, true))
            .chain(self.open.iter().map(|(s, p)| (*s, p, false)));
        let mut out = Vec::new();
        for (start, panes, closed) in windows {
            for (gid, pane) in panes.iter().enumerate() {
                let Some(pane) = pane else { continue };
                out.push(PaneReport {
                    aggregation: self.agg.id.clone(),
                    group: self.groups[gid].0.clone(),
                    window_start_ms: start,
                    closed,
                    count: pane.count(),
                    quantile_bits: self
                        .agg
                        .quantiles
                        .iter()
                        .map(|&q| pane.quantile(q).map(f64::to_bits))
                        .collect(),
                });
            }
        }
        out
    }

    /// Open and closed panes, and their bins (for self-metrics).
    pub fn footprint(&self) -> (usize, usize) {
        let all = self
            .closed
            .iter()
            .map(|w| &w.panes)
            .chain(self.open.values());
        let mut panes = 0;
        let mut bins = 0;
        for p in all.flatten().flatten() {
            panes += 1;
            bins += p.bins_len();
        }
        (panes, bins)
    }
}

/// Panes of one window, by group id.
type Panes = Vec<Option<PaneSketch>>;

/// One window's panes by group key, moved or copied out of an accumulator.
pub struct WindowPanes {
    pub start: i64,
    pub panes: Vec<(Box<[u8]>, PaneSketch)>,
}

/// Drops the oldest closed window, giving its slots and bins back to the
/// budget; false when there is none. Past `keep`, or when the budget runs out:
/// under memory pressure, history goes before new samples.
fn drop_oldest(closed: &mut VecDeque<ClosedWindow>, budget: &mut Budget) -> bool {
    let Some(ClosedWindow { panes: dropped, .. }) = closed.pop_front() else {
        return false;
    };
    closed_windows_changed();
    let bins: usize = dropped.iter().flatten().map(PaneSketch::bins_len).sum();
    budget.held.pane_slots = budget.held.pane_slots.saturating_sub(dropped.len());
    budget.held.bins = budget.held.bins.saturating_sub(bins);
    true
}

/// Takes `grow` pane slots from the budget, dropping closed windows (oldest
/// first) while they are short; false when even that is not enough.
fn afford_slots(closed: &mut VecDeque<ClosedWindow>, budget: &mut Budget, grow: usize) -> bool {
    loop {
        if budget.held.pane_slots.saturating_add(grow) <= budget.capacity.pane_slots {
            budget.held.pane_slots += grow;
            return true;
        }
        if !drop_oldest(closed, budget) {
            return false;
        }
    }
}

/// `s` as a JSON string, as `serde_json` writes it (it escapes).
fn json_string(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(out, s).expect("a string serializes into a Vec");
}

/// One pane's outcome, exactly (quantiles as bits).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PaneReport {
    pub aggregation: String,
    pub group: Vec<(String, String)>,
    pub window_start_ms: i64,
    pub closed: bool,
    pub count: u64,
    pub quantile_bits: Vec<Option<u64>>,
}

/// The answer to `/api/v1/quantiles`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueryResult {
    pub aggregation: String,
    pub window_start_ms: Option<i64>,
    pub groups: Vec<GroupResult>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GroupResult {
    pub labels: BTreeMap<String, String>,
    pub count: u64,
    pub quantiles: Quantiles,
}

/// Quantile → value, serialized as a JSON object in plan order (`{"0.5": …}`).
#[derive(Clone, Debug, PartialEq)]
pub struct Quantiles(pub Vec<(f64, f64)>);

impl Serialize for Quantiles {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (q, v) in &self.0 {
            map.serialize_entry(&q.to_string(), v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_keys_round_trip() {
        let values: [&[u8]; 4] = [b"g0", b"", b"a\"b,c\\d\ne", b"caf\xc3\xa9"];
        let mut key = Vec::new();
        write_group_key(&mut key, values);
        assert_eq!(
            parse_group_key(&key),
            values.iter().map(|v| v.to_vec()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn windows_close_and_late_samples_drop() {
        let mut acc = Accumulator::new(
            super::super::plan::Plan::default().aggregations[0].clone(),
            2,
            SketchUpdate::PerSample,
        );
        let mut next = 0;
        let mut budget = Budget::new(Capacity::UNBOUNDED);
        let g = acc.intern(b"\"g0\"", &mut next, &mut budget);
        let mut stats = Stats::default();
        acc.add(
            g,
            &[1_000, 59_999, 60_000],
            &[1.0, 2.0, 3.0],
            i64::MIN,
            &mut stats,
            &mut budget,
        );
        acc.close_through(60_000, &mut budget);
        assert_eq!(acc.last_closed(), Some(0));
        acc.add(g, &[30_000], &[9.0], 60_000, &mut stats, &mut budget);
        assert_eq!((stats.accepted, stats.late), (3, 1));
        let q = acc.query(None);
        assert_eq!(q.groups[0].count, 2);
        assert_eq!(q.groups[0].labels["label_0"], "g0");
    }
}
