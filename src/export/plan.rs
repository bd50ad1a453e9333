//! A long-lived exporter's scrape of a store whose shape stayed put: the
//! export floor's loop, with the checks that make it a scrape.
//!
//! After a clean scrape in which every file was read whole from a mapping
//! kept without its lock (its writers have all exited) and every key was
//! found through `RawKeys` (so each file's layout was recorded, [`FileKeys`]),
//! the exporter writes the scrape down as a [`ScrapePlan`]: per file, where
//! each entry's length and padded key stand and which series' aggregate its
//! value folds into; and the exposition it printed, cut around its values,
//! with where each value comes from (a series' aggregate, a histogram's
//! cumulative bucket or total, a summary's missing sum or count).
//!
//! The next scrape runs the plan instead while the listing is what it was
//! ([`FileSet::generation`]) and the reader has changed no kept file (each
//! is still the same inode and mapping with no writer,
//! [`FileReader::changes`]); in each file, its `used` must be where it was,
//! and every entry's length and padded key the bytes they were, where they
//! were — what [`FilePass::replay`] checks, so the plan reads what a walk
//! would. It
//! folds each value into its series' aggregate in file order (the scrape's
//! fold), works out the printed values as `Scrape::fold_histograms` does,
//! and writes the text around them. Which series, groups and lines the
//! exposition has, and in which order, follows from the keys and the order of
//! the files' entries, which is what was checked; only values can differ.
//! Anything else (a file grown, rewritten or gone, a writer back, the
//! scrape's deadline) and the plan is dropped and the scrape is done the
//! usual way, which may write a new one.
//!
//! A plan is kept only if it prints what the scrape that wrote it printed:
//! it is run once on the files as they are and compared, byte for byte.
//!
//! [`FileKeys`]: super::FileKeys
//! [`FilePass::replay`]: super::FilePass::replay
//! [`FileSet::generation`]: crate::export::fileset::FileSet::generation
//! [`FileReader::changes`]: super::FileReader::changes

use super::{Aggregate, Exporter, FileReader, SlotRole};
use crate::format::registry::{MetricType, ProcessAggregation};
use crate::format::storefile::check_used;
use crate::shared::mapguard;
use std::collections::HashMap;
use std::sync::Arc;

pub(super) struct ScrapePlan {
    /// The file set's generation the plan was written at.
    generation: u64,
    /// The reader's count of kept-file changes then ([`FileReader::changes`]).
    reader_changes: u64,
    /// The planned files' mappings, held so that they stay mapped while the
    /// plan reads them at the addresses it noted.
    _maps: Vec<Arc<memmap2::Mmap>>,
    /// Every file of the scrape, metric after metric, each metric's in order.
    files: Vec<PlannedFile>,
    entries: Vec<PlannedEntry>,
    /// Each distinct entry head (its length field and padded key), back to back.
    heads: Vec<u8>,
    /// One per series of the scrape: metric after metric, each metric's in
    /// order of first appearance.
    aggregates: Vec<Aggregate>,
    /// The printed values, in the exposition's order.
    values: Vec<PrintedValue>,
    /// The exposition without its values: the text before value `i` ends at
    /// `ends[i]`; the rest follows the last value.
    text: Vec<u8>,
    ends: Vec<u32>,
    /// The metrics with a file a process may write again (not a fold file),
    /// whose exited files are probed again in turn.
    reprobed: Vec<usize>,
}

struct PlannedFile {
    /// Its kept mapping's address and length, held in
    /// [`ScrapePlan::_maps`]. A scrape reads the file from here, not through
    /// the reader's record of it: that record, one small allocation per
    /// metric, was a cache miss per file on a cold scrape, before the file's
    /// own. (A file kept without a mapping, shorter than a header, has no
    /// entries and is not planned.)
    at: usize,
    len: usize,
    /// Its `used`.
    used: usize,
    entries: std::ops::Range<usize>,
    mode: ProcessAggregation,
}

struct PlannedEntry {
    /// Where its length field is.
    at: u32,
    /// Its head in [`ScrapePlan::heads`].
    head: u32,
    head_len: u32,
    aggregate: u32,
    /// The first value of its series in the scrape (the fold starts from it).
    first: bool,
}

/// Where a printed value comes from, packed in a word: the scrape's write
/// loop reads one per line, and a word is one load and one test where an
/// enum of a kind, an optional aggregate and a flag took 12 bytes and two.
///
/// Bits 31–30 the kind, bit 29 whether the value starts a group (a
/// histogram's running total starts at 0), bits 28–0 an index into
/// [`ScrapePlan::aggregates`]. A missing series (a summary's sum or count, a
/// histogram's bucket or `+Inf`) is the plan's last aggregate, which no entry
/// folds into and so always holds 0: `0 + total` is `total`, because the
/// running total starts at +0 and so is never -0.
#[derive(Clone, Copy, Debug, PartialEq)]
struct PrintedValue(u32);

/// A series' aggregate as it is.
const SERIES: u32 = 0;
/// A histogram's declared bucket: its own series plus the group's buckets
/// before it, which it adds to the running total.
const BUCKET: u32 = 1;
/// A histogram's `+Inf` bucket and `_count`: its `+Inf` series plus every
/// declared bucket of the group.
const TOTAL: u32 = 2;
const KIND_SHIFT: u32 = 30;
const STARTS_GROUP: u32 = 1 << 29;
/// Aggregates a plan can index (a larger scrape is read the usual way).
const MAX_AGGREGATES: usize = 1 << 29;

impl PrintedValue {
    fn new(kind: u32, aggregate: u32, starts_group: bool) -> PrintedValue {
        debug_assert!((aggregate as usize) < MAX_AGGREGATES);
        PrintedValue((kind << KIND_SHIFT) | ((starts_group as u32) * STARTS_GROUP) | aggregate)
    }

    fn kind(self) -> u32 {
        self.0 >> KIND_SHIFT
    }

    fn starts_group(self) -> bool {
        self.0 & STARTS_GROUP != 0
    }

    fn aggregate(self) -> usize {
        (self.0 & (STARTS_GROUP - 1)) as usize
    }
}

/// Where a printed value comes from, as a plan is built (then packed into
/// a [`PrintedValue`]).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Source {
    /// A series' aggregate.
    Series(u32),
    /// A summary group without its sum or count series.
    Zero,
    /// A histogram's declared bucket: its own series (0 if none) plus the
    /// group's buckets before it.
    Bucket(Option<u32>),
    /// A histogram's `+Inf` bucket and `_count`: its `+Inf` series (if any)
    /// plus every declared bucket of the group.
    Total(Option<u32>),
}

impl Source {
    /// Packed, with `zero` the aggregate that stands for a missing series.
    fn packed(self, starts_group: bool, zero: u32) -> PrintedValue {
        let (kind, aggregate) = match self {
            Source::Series(a) => (SERIES, a),
            Source::Zero => (SERIES, zero),
            Source::Bucket(a) => (BUCKET, a.unwrap_or(zero)),
            Source::Total(a) => (TOTAL, a.unwrap_or(zero)),
        };
        PrintedValue::new(kind, aggregate, starts_group)
    }
}

impl ScrapePlan {
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// The metrics whose exited files are probed again after a scrape by
    /// the plan (`FileReader::reprobe_exited` passes over fold files).
    pub(super) fn reprobed(&self) -> &[usize] {
        &self.reprobed
    }

    /// Writes the plan of the scrape `exporter` just did, which printed
    /// `out`; `None` where that scrape cannot be replayed as a whole.
    pub(super) fn build(exporter: &Exporter, out: &[u8]) -> Option<ScrapePlan> {
        if !exporter.report.is_clean() || !Self::replayable(exporter) {
            return None;
        }
        let mut plan = ScrapePlan {
            generation: exporter.files.generation(),
            reader_changes: exporter.reader.changes(),
            _maps: Vec::new(),
            files: Vec::new(),
            entries: Vec::new(),
            heads: Vec::new(),
            aggregates: Vec::new(),
            values: Vec::new(),
            text: Vec::new(),
            ends: Vec::new(),
            reprobed: Vec::new(),
        };
        let mut sources: Vec<(Source, bool)> = Vec::new();
        for (metric, state) in exporter.metrics.iter().enumerate() {
            let def = &exporter.registry.metrics[metric];
            let (catalogue, scrape) = (&state.catalogue, &state.scrape);
            let base = plan.aggregates.len() as u32;
            let mut aggregate_of = vec![u32::MAX; catalogue.series.len()];
            for (k, &series) in scrape.series_order.iter().enumerate() {
                aggregate_of[series] = base + k as u32;
            }
            plan.aggregates
                .extend(scrape.series_order.iter().map(|_| Aggregate {
                    value: 0.0,
                    timestamp: 0.0,
                }));
            let mut met = vec![false; scrape.series_order.len()];
            let mut heads: HashMap<usize, (u32, u32)> = HashMap::new();
            let (files, excluded) = exporter.files.view(metric);
            if !excluded.is_empty() {
                return None;
            }
            if files.iter().any(|file| !file.fold) {
                plan.reprobed.push(metric);
            }
            for file in files {
                let layout = catalogue.raw.layout(file.slot)?;
                let map = exporter.reader.exited(metric, file.slot, file.ino)?;
                // A file kept without a mapping is shorter than a header.
                let Some(map) = map else {
                    if !layout.ids.is_empty() {
                        return None;
                    }
                    continue;
                };
                plan._maps.push(Arc::clone(map));
                let start = plan.entries.len();
                for (&id, &at) in layout.ids.iter().zip(&layout.starts) {
                    let aggregate = *aggregate_of.get(catalogue.raw.spans[id].series)?;
                    let seen = met.get_mut((aggregate.checked_sub(base)?) as usize)?;
                    let (head, head_len) = *heads.entry(id).or_insert_with(|| {
                        let padded = catalogue.raw.padded(id);
                        let start = plan.heads.len() as u32;
                        plan.heads
                            .extend_from_slice(&(padded.len() as u32).to_le_bytes());
                        plan.heads.extend_from_slice(padded);
                        (start, plan.heads.len() as u32 - start)
                    });
                    plan.entries.push(PlannedEntry {
                        at,
                        head,
                        head_len,
                        aggregate,
                        first: !std::mem::replace(seen, true),
                    });
                }
                plan.files.push(PlannedFile {
                    at: map.as_ptr() as usize,
                    len: map.len(),
                    used: layout.end? as usize,
                    entries: start..plan.entries.len(),
                    mode: def.aggregation(),
                });
            }
            if met.contains(&false) {
                return None;
            }
            let aggregate = |series: usize| aggregate_of[series];
            let mut value = |source, starts_group| sources.push((source, starts_group));
            match def.kind {
                MetricType::Counter | MetricType::Gauge => {
                    for &series in &scrape.series_order {
                        value(Source::Series(aggregate(series)), true);
                    }
                }
                MetricType::Summary => {
                    for members in &scrape.group_members {
                        let last = |role| {
                            scrape.members[members.clone()]
                                .iter()
                                .rfind(|&&s| catalogue.places[s].role == role)
                                .map_or(Source::Zero, |&s| Source::Series(aggregate(s)))
                        };
                        value(last(SlotRole::Sum), true);
                        value(last(SlotRole::Count), false);
                    }
                }
                MetricType::Histogram => {
                    // As `Scrape::fold_histograms` folds a group, and
                    // `render::write_family` prints it.
                    for members in &scrape.group_members {
                        let members = &scrape.members[members.clone()];
                        let mut buckets = vec![None; def.buckets.len()];
                        let (mut sum, mut inf) = (None, None::<(usize, u32)>);
                        let mut others: Vec<(&[u8], u32)> = Vec::new();
                        for &series in members {
                            let a = aggregate(series);
                            match catalogue.places[series].role {
                                SlotRole::Bucket(i) => buckets[i as usize] = Some(a),
                                SlotRole::Sum => sum = Some(a),
                                SlotRole::Inf => {
                                    inf = Some((inf.map_or(others.len(), |(at, _)| at), a))
                                }
                                SlotRole::Count | SlotRole::Other => {
                                    let le = catalogue.series[series].le();
                                    match others.iter_mut().find(|(other, _)| *other == le) {
                                        Some(other) => other.1 = a,
                                        None => others.push((le, a)),
                                    }
                                }
                            }
                        }
                        let mut first = true;
                        let mut value = |source| {
                            value(source, std::mem::replace(&mut first, false));
                        };
                        for bucket in buckets {
                            value(Source::Bucket(bucket));
                        }
                        let inf_at = inf.map_or(others.len(), |(at, _)| at);
                        let total = Source::Total(inf.map(|(_, a)| a));
                        for (i, &(_, a)) in others.iter().enumerate() {
                            if i == inf_at {
                                value(total);
                            }
                            value(Source::Series(a));
                        }
                        if inf_at >= others.len() {
                            value(total);
                        }
                        if let Some(sum) = sum {
                            value(Source::Series(sum));
                        }
                        value(total);
                    }
                }
            }
        }
        // The aggregate that stands for a missing series: never folded into.
        if plan.aggregates.len() >= MAX_AGGREGATES {
            return None;
        }
        let zero = plan.aggregates.len() as u32;
        plan.aggregates.push(Aggregate {
            value: 0.0,
            timestamp: 0.0,
        });
        plan.values = sources
            .into_iter()
            .map(|(source, starts_group)| source.packed(starts_group, zero))
            .collect();
        plan.cut(out)?;
        let mut again = Vec::with_capacity(out.len());
        (plan.run(&exporter.reader, &mut again) && again == out).then_some(plan)
    }

    /// Whether every listed file of the scrape just done can be replayed (its
    /// layout recorded, its writers exited) and none is left out: checked
    /// file by file before anything is built, so a store with a live writer
    /// (a sidecar's usual store) pays a look at its files up to the first
    /// such, not a plan built up to it, every scrape.
    fn replayable(exporter: &Exporter) -> bool {
        exporter.metrics.iter().enumerate().all(|(metric, state)| {
            let (files, excluded) = exporter.files.view(metric);
            excluded.is_empty()
                && files.iter().all(|file| {
                    state.catalogue.raw.layout(file.slot).is_some()
                        && exporter
                            .reader
                            .exited(metric, file.slot, file.ino)
                            .is_some()
                })
        })
    }

    /// Cuts `out` around its values (each sample line's last word) into
    /// `text` and `ends`; `None` if it has not one value per printed value.
    fn cut(&mut self, out: &[u8]) -> Option<()> {
        let mut from = 0;
        let mut at = 0;
        for line in out.split_inclusive(|&b| b == b'\n') {
            let end = at + line.len();
            if !line.starts_with(b"#") {
                let body = line.strip_suffix(b"\n")?;
                let value = at + body.iter().rposition(|&b| b == b' ')? + 1;
                self.text.extend_from_slice(&out[from..value]);
                self.ends.push(u32::try_from(self.text.len()).ok()?);
                from = at + body.len();
            }
            at = end;
        }
        self.text.extend_from_slice(&out[from..]);
        (self.ends.len() == self.values.len()).then_some(())
    }

    /// One scrape by the plan into `out`: `false` (and `out` garbage) if the
    /// files are not what the plan expects, or the deadline passed.
    pub(super) fn run(&mut self, reader: &FileReader, out: &mut Vec<u8>) -> bool {
        // Every planned file is still the inode, mapping and (exited)
        // writers' state it was: the reader has changed no kept file since.
        if reader.changes() != self.reader_changes {
            return false;
        }
        let mut guarded = mapguard::GuardedReads::default();
        for file in &self.files {
            if reader.deadline_passed() {
                return false;
            }
            // SAFETY: `_maps` holds this mapping, which covers these bytes.
            let map = unsafe { std::slice::from_raw_parts(file.at as *const u8, file.len) };
            let used = file.used;
            let entries = &self.entries[file.entries.clone()];
            let (heads, aggregates) = (&self.heads, &mut self.aggregates);
            let read = guarded.read(map, |map| {
                let header = map.get(..4).and_then(|h| h.try_into().ok());
                if header.and_then(|h| check_used(h, map.len() as u64).ok()) != Some(used) {
                    return false;
                }
                for entry in entries {
                    // In bounds: the entries ended within `used` when planned.
                    let at = entry.at as usize;
                    let value_at = at + entry.head_len as usize;
                    let head = &heads[entry.head as usize..][..entry.head_len as usize];
                    if map[at..value_at] != *head {
                        return false;
                    }
                    let word = |at: usize| f64::from_le_bytes(map[at..at + 8].try_into().unwrap());
                    let (value, timestamp) = (word(value_at), word(value_at + 8));
                    let aggregate = &mut aggregates[entry.aggregate as usize];
                    if entry.first {
                        *aggregate = Aggregate { value, timestamp };
                    } else {
                        aggregate.fold(file.mode, value, timestamp);
                    }
                }
                true
            });
            if read != Ok(true) {
                return false;
            }
        }
        self.write(out);
        true
    }

    /// The exposition: the text, with each value worked out and printed.
    fn write(&self, out: &mut Vec<u8>) {
        out.clear();
        out.reserve(self.text.len() + 8 * self.values.len());
        let (aggregates, mut from, mut total) = (&self.aggregates, 0, 0.0);
        for (&value, &end) in self.values.iter().zip(&self.ends) {
            out.extend_from_slice(&self.text[from..end as usize]);
            from = end as usize;
            if value.starts_group() {
                total = 0.0;
            }
            let own = aggregates[value.aggregate()].value;
            let printed = match value.kind() {
                SERIES => own,
                BUCKET => {
                    total += own;
                    total
                }
                _ => own + total,
            };
            crate::format::rubyfloat::write(out, printed);
        }
        out.extend_from_slice(&self.text[from..]);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{export, Exporter};
    use crate::format::registry::Registry;
    use crate::format::storefile::{check_used, entries};
    use crate::shared::event_probe::counted;
    use crate::shared::strategy::{Stage, StrategySet};
    use crate::write::{Client, ClientConfig};
    use std::os::unix::fs::FileExt;
    use std::path::Path;

    /// Every kind and aggregation, and a histogram bucket the reading
    /// registry does not declare (`le="5"`: printed as written, in order
    /// of appearance).
    const METRICS: &str = r#"
        {"name": "c_total", "type": "counter", "help": "h", "labels": ["a"]},
        {"name": "g_max", "type": "gauge", "help": "h", "labels": ["a"], "aggregation": "max"},
        {"name": "g_min", "type": "gauge", "help": "h", "labels": ["a"], "aggregation": "min"},
        {"name": "g_recent", "type": "gauge", "help": "h", "labels": ["a"], "aggregation": "most_recent"},
        {"name": "g_all", "type": "gauge", "help": "h", "labels": ["a"]},
        {"name": "s", "type": "summary", "help": "h", "labels": ["a"]},"#;

    fn registry(buckets: &str) -> Registry {
        Registry::from_json(&format!(
            r#"{{"metrics": [{METRICS}
            {{"name": "h", "type": "histogram", "help": "h", "labels": ["a"], "buckets": [{buckets}]}}]}}"#
        ))
        .unwrap()
    }

    /// Three exited processes' files, written with buckets 1, 5 and 10.
    fn store() -> tempfile::TempDir {
        let registry = registry(r#""1", "5", "10""#);
        let dir = tempfile::tempdir().unwrap();
        for pid in 1..=3 {
            let config = ClientConfig {
                pid_override: Some(pid),
                ..ClientConfig::default()
            };
            let mut client = Client::new(dir.path(), &registry, config).unwrap();
            for (i, label) in ["x", "y", "z"]
                .into_iter()
                .enumerate()
                .skip(pid as usize - 1)
            {
                let by = (pid as usize * 10 + i) as f64;
                let labels = [("a", label)];
                client
                    .increment(client.metric("c_total").unwrap(), &labels, by)
                    .unwrap();
                for gauge in ["g_max", "g_min", "g_recent", "g_all"] {
                    client
                        .set(client.metric(gauge).unwrap(), &labels, by)
                        .unwrap();
                }
                // Into every bucket, the undeclared one and `+Inf`.
                for observed in [0.5, 3.0, 7.0, 20.0].into_iter().skip(i) {
                    client
                        .observe(client.metric("s").unwrap(), &labels, observed)
                        .unwrap();
                    client
                        .observe(client.metric("h").unwrap(), &labels, observed)
                        .unwrap();
                }
            }
        }
        dir
    }

    /// Rewrites every entry's value and timestamp in place, from `seed`.
    fn rewrite_values(dir: &Path, seed: u64) {
        const VALUES: [f64; 9] = [0.0, -0.0, 1.5, 1e20, f64::NAN, -3.0, 0.1, 7.0, 1e-5];
        let mut state = seed;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        for file in std::fs::read_dir(dir).unwrap() {
            let path = file.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let used = check_used(bytes[..4].try_into().unwrap(), bytes.len() as u64).unwrap();
            let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            for entry in entries(&bytes, used) {
                let at = entry.unwrap().value_offset as u64;
                let value = VALUES[next() % VALUES.len()];
                let timestamp = (next() % 4) as f64;
                file.write_all_at(&value.to_le_bytes(), at).unwrap();
                file.write_all_at(&timestamp.to_le_bytes(), at + 8).unwrap();
            }
        }
    }

    /// A long-lived exporter with every export strategy plans its first
    /// scrape and scrapes by the plan after; the plan reads values rewritten
    /// in place (run as it is, whatever the listing says) and prints what a
    /// fresh baseline export prints: every aggregation, a histogram's
    /// cumulative buckets, undeclared bucket, `+Inf` and `_count`, a summary's
    /// sum and count, NaN, -0.0 and Ruby's exponent forms.
    #[test]
    fn a_plan_prints_what_a_scrape_prints_whatever_the_values() {
        let dir = store();
        let registry = registry(r#""1", "10""#);
        let all = StrategySet::all().restrict(Stage::Export);
        let mut exporter = Exporter::new(dir.path(), registry.clone(), all);
        let expected = || export(dir.path(), &registry, StrategySet::NONE).unwrap();
        let mut out = Vec::new();
        let planned = |exporter: &mut Exporter, out: &mut Vec<u8>| {
            let (result, counts) = counted(|| exporter.export_into(out));
            result.unwrap();
            counts.get("export.scrape_planned")
        };
        assert_eq!(
            planned(&mut exporter, &mut out),
            0,
            "the first scrape reads"
        );
        assert!(exporter.plan.is_some(), "and writes its plan");
        assert_eq!(planned(&mut exporter, &mut out), 1);
        assert_eq!(out, expected());
        let text = String::from_utf8(expected()).unwrap();
        assert!(text.contains(r#"h_bucket{a="x",le="5"}"#), "{text}");
        for seed in 0..40 {
            rewrite_values(dir.path(), seed);
            let plan = exporter.plan.as_mut().unwrap();
            assert!(plan.run(&exporter.reader, &mut out), "seed {seed}");
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&expected()),
                "seed {seed}"
            );
        }
        // The rewrites closed files written to: the watch saw it, so the
        // next scrape reads and plans afresh, and the one after is planned.
        assert_eq!(planned(&mut exporter, &mut out), 0);
        assert_eq!(out, expected());
        assert_eq!(planned(&mut exporter, &mut out), 1);
        assert_eq!(out, expected());
    }

    /// What the plan checks, changed without the listing knowing: a key
    /// rewritten in place (same length), a `used` moved. The plan is
    /// dropped, and the scrape reads the files as they are.
    #[test]
    fn a_plan_refuses_files_that_changed_shape() {
        let dir = store();
        let registry = registry(r#""1", "5", "10""#);
        let all = StrategySet::all().restrict(Stage::Export);
        let path = crate::format::storefile::file_path(dir.path(), "c_total", 1);
        let bytes = std::fs::read(&path).unwrap();
        let used = check_used(bytes[..4].try_into().unwrap(), bytes.len() as u64).unwrap();
        let first = entries(&bytes, used).next().unwrap().unwrap();
        let key_at = (first.value_offset - first.padded_key.len()) as u64;
        let changes: [(&str, u64, Vec<u8>); 2] = [
            (
                "a key",
                key_at,
                first
                    .padded_key
                    .iter()
                    .map(|&b| if b == b'x' { b'q' } else { b })
                    .collect(),
            ),
            ("used", 0, ((used - 20) as u32).to_le_bytes().to_vec()),
        ];
        for (what, at, bytes) in changes {
            let mut exporter = Exporter::new(dir.path(), registry.clone(), all);
            let mut out = Vec::new();
            exporter.export_into(&mut out).unwrap();
            let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            file.write_all_at(&bytes, at).unwrap();
            drop(file);
            let plan = exporter.plan.as_mut().unwrap();
            assert!(!plan.run(&exporter.reader, &mut out), "{what}");
            exporter.export_into(&mut out).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&export(dir.path(), &registry, StrategySet::NONE).unwrap()),
                "{what}"
            );
        }
    }
}
