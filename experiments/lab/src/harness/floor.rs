//! Each stage's floor: the least work its contract allows, run as one more arm
//! of the ablation, interleaved with the others on the same input, so every
//! arm's `ratio_to_floor` says how far it is from the limit on this machine.
//!
//! - write: the `flock` pair client_ruby's protocol holds around every
//!   observe and increment, alone ([`WriteFloor`]);
//! - export: one pass reading every store file's used region through a
//!   mapping (what a sidecar cannot avoid reading), plus writing the
//!   exposition as the render floor writes it: its text copied, each value
//!   formatted ([`ExportFloor`]). Until issue 26 it copied the exposition
//!   whole, values included: a scrape whose values change cannot, so every
//!   exporter's ratio counted formatting as overhead (a quarter of `all`'s
//!   seed-repro scrape). Also until issue 26 it made no syscall, where
//!   every scrape that must see a file created before it began makes one
//!   (`ListingCheck`): on this machine a cold syscall is several
//!   microseconds, and a folded 504-file store's `all` measured 1.97–2.14×
//!   its floor with 64 MiB flushed before each scrape, 1.44–1.48× against
//!   the floor with its read (`cold_scrape`, same process). And until
//!   issue 26 it read its mappings unguarded, where a reader of files other
//!   processes may truncate needs a `SIGBUS` guard to live through one (an
//!   exporter's `mapguard`): 2 ns a file here, so `all` measured 1.19× of
//!   the floor on many-metrics' 400 one-entry files (Zen 4) and 1.04–1.08×
//!   once the floor paid it too;
//! - render: prerendered lines copied, each value formatted (`itoa` for
//!   integers and integral floats, `ryu` for the others) ([`RenderFloor`]);
//! - ingest: snappy decode, a zero-copy protobuf walk, finding each series'
//!   group sketch with no more work than `series-cache` does (one compare of
//!   its label bytes with the series the sender sent next last time; a hash
//!   only when that misses; the labels read only when a series is first
//!   seen) and one sketch add per sample (the request's values of a group
//!   added as one slice) ([`IngestFloor`]). Before issue 15 it hashed every
//!   series of every request, which `series-cache` does not, and `all`
//!   measured below it on a loaded machine (0.94× prometheus-captures, 0.90×
//!   asap-1e5); quiet, before and after side by side: asap-1e5 floor
//!   25.6–25.9 → 23.2–23.9 ms (`all` ÷ floor 1.11–1.12 → 1.23–1.25),
//!   prometheus-captures unchanged (`all` ÷ floor 1.2–1.3 both). Until
//!   issue 26 each new series cost it two allocations and two hashes where
//!   the series cache appends to one buffer and hashes once: `all` measured
//!   0.90× on prometheus-captures (27 requests, most of their series new);
//!   with the floor keeping series as the cache does, 1.04× (same run), and
//!   0.96× once the cache's own miss path stopped building upstream's
//!   by-products (the quiet run of 12:24; within noise of its floor). Also
//!   until issue 26 it visited every group's sketch after every request and
//!   answered nothing: at a million groups it measured slower than `all`'s
//!   ingest alone (2.7 s against 2.3 s), and `all`'s answer (flush, every
//!   group's quantiles, the JSON: 1.9 s) counted as overhead. It now adds the
//!   values of the groups a request has, and answers every group. Also in
//!   issue 26: a sender-shaped series (one-byte lengths, a value and a
//!   timestamp per sample) is walked as `borrowed-decode` walks it, by its
//!   lengths; its series index keeps each series' hash (it rehashed every
//!   series as it grew); a new group's sketch is cloned (a logarithm per
//!   series before). `all` had measured 0.88× of it at 1,000 groups × 1,000
//!   series alone in a process; after, the floor at 1k × 1000, 10k × 100 and
//!   100k × 10 groups × series: 1.12 → 0.78 s, 1.12 → 0.71 s, 1.49 → 1.10 s.
//!   It also zeroed a fresh buffer for every request it decompressed, where
//!   the receiver keeps one at its largest (callgrind at 1k × 1000: 9.32 →
//!   8.60 G instructions). And it checked no series, where the receiver
//!   refuses a request holding one Prometheus would refuse: it now checks
//!   each series once, when first seen (names, UTF-8 values, order, a
//!   `__name__`), in the walk that reads its labels (callgrind,
//!   `floor_probe ingest floor 1 100000 10 5`, a warm-up and a run of 1M
//!   new series each: 17.39 → 18.37 G, about 490 instructions a new series);
//!   and a new series' group is first compared with the group of the series
//!   first seen before it, as the receiver's series cache does since then (a
//!   sender sends a group's series together), before it is looked up by hash;
//! - query: a kept answer copied; one computed afresh, the quantile scan
//!   (`Ingester::quantile_scan`) and the answer written around its values
//!   (`query::AnswerFloor`, in the query workload; until issue 26 the scan
//!   alone).
//!
//! A floor's output is checked like an arm's where it is the stage's answer
//! (export; render when every value's shortest form is the exposition's),
//! otherwise by the units it handled (steps, lines, samples, groups): a lock
//! pair, a window-less sketch per group or bare quantiles are not the answer.

use anyhow::{bail, Context, Result};
use promlab::ingest::bulk_sketch::BulkSketch;
use promlab::ingest::wire;
use promlab::shared::seams::StoreIo;
use promlab::write::StoreFile;
use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::hint::black_box;
use std::path::Path;

/// Write: `steps` lock pairs on a real store file, as `Client::observe` takes them.
pub struct WriteFloor {
    _dir: tempfile::TempDir,
    file: StoreFile,
}

impl WriteFloor {
    pub fn new() -> Result<WriteFloor> {
        let dir = tempfile::tempdir()?;
        let file = StoreFile::open(&dir.path().join("metric_lock___4242.bin"), StoreIo::Mapped)?;
        Ok(WriteFloor { _dir: dir, file })
    }

    /// `steps` × (`flock(LOCK_EX)` + `flock(LOCK_UN)`); returns the pairs taken.
    pub fn run(&mut self, steps: usize) -> Result<u64> {
        for _ in 0..steps {
            self.file.with_lock(|f| Ok(black_box(f).used()))?;
        }
        Ok(steps as u64)
    }
}

/// Export: every store file mapped once (as a long-lived exporter keeps
/// them); a scrape checks every byte the exposition depends on and writes the
/// exposition. Each file's `used` and each entry's length and padded key are
/// compared with a copy of what the store held when the floor was built
/// (every distinct entry's bytes once, as an exporter's catalogue keeps its
/// raw keys), each value is read, and the exposition is written as
/// [`RenderFloor`] writes it (text copied, each value formatted: the values
/// read change between scrapes, so no exporter can keep the text whole).
/// What is left out is all an exporter adds to that: walking the entries by
/// their lengths, finding each key's series, folding values and grouping.
///
/// Before all that, a scrape asks once whether the store's listing changed
/// ([`ListingCheck`]): one read of an inotify watch on the directory, which
/// finds no event. No scrape that must see a file created before it began
/// can learn that with less than one syscall.
///
/// Mappings are a per-process resource (`vm.max_map_count`, 65,530 by
/// default) that the arms' exporters in the same process need too, so the
/// floor maps at most a quarter of it ([`map_budget`]); a store with more
/// files (the 50,400 of `many-processes`) has the rest opened and read
/// (`pread` of the used region) on every scrape, which is what a reader that
/// cannot map them does.
pub struct ExportFloor {
    files: Vec<FloorFile>,
    /// Per file: what the floor checks in it.
    plans: Vec<FilePlan>,
    /// Every file's entries, file after file (one buffer, read front to
    /// back: a vector per file was a cache miss per file on a cold scrape,
    /// which a scrape by promlab's plan, one buffer too, did not pay).
    entries: Vec<FloorEntry>,
    distinct: Vec<u8>,
    exposition: Vec<u8>,
    /// Writes the exposition, each value formatted.
    render: RenderFloor,
    /// The used region of a file read, not mapped.
    read: Vec<u8>,
    /// Whether the directory's listing changed: once per scrape.
    listing: ListingCheck,
    /// The floor's maps, set aside in the exporters' map budget.
    _reserved: promlab::export::MapReservation,
}

/// How the floor reaches a store file's bytes.
enum FloorFile {
    Mapped(memmap2::Mmap),
    /// Past the map budget: opened and its used region read, per scrape.
    Read(std::path::PathBuf),
}

/// How many store files the export floor keeps mapped: a quarter of
/// `vm.max_map_count` (16,382 at Linux's default).
pub fn map_budget() -> usize {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .map_or(16_382, |max| max / 4)
}

/// One store file as the floor built: its header's `used`, and where its
/// entries are in `ExportFloor::entries`.
struct FilePlan {
    used: i32,
    entries: std::ops::Range<usize>,
}

/// One entry: where its length starts in the file, where its bytes (length
/// and padded key) start in `ExportFloor::distinct`, and how many there are.
struct FloorEntry {
    at: u32,
    start: u32,
    len: u32,
}

impl ExportFloor {
    /// The store in `dir` and the exposition it must give (already verified).
    /// The exposition the floor writes.
    pub fn exposition(&self) -> &[u8] {
        &self.exposition
    }

    pub fn new(dir: &Path, exposition: Vec<u8>) -> Result<ExportFloor> {
        let mut paths: Vec<_> = std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        paths.sort();
        let files_to_map = paths.len().min(map_budget());
        // The floor's maps come out of the exporters' budget (the process's
        // map table is one), or the arms' kept maps and these together would
        // exhaust it and the next allocation would fail.
        let reserved = promlab::export::reserve_maps(files_to_map);
        let budget = files_to_map;
        let mut files = Vec::new();
        let mut plans = Vec::new();
        let mut entries = Vec::new();
        let mut distinct = Vec::new();
        let mut starts: HashMap<Vec<u8>, usize> = HashMap::new();
        for path in paths.iter().filter(|p| p.is_file()) {
            let file = std::fs::File::open(path)?;
            // SAFETY: the store is not written while the floor reads it (a
            // benchmark's store is written once, before any arm runs).
            let map = unsafe { memmap2::Mmap::map(&file) }
                .with_context(|| format!("cannot map {}", path.display()))?;
            let used = used_region(&map).len();
            let header = header(&map);
            let first = entries.len();
            for entry in promlab::format::storefile::entries(&map, used) {
                let entry = entry.with_context(|| format!("{}", path.display()))?;
                let at = entry.value_offset - entry.padded_key.len() - 4;
                let bytes = &map[at..entry.value_offset];
                let start = *starts.entry(bytes.to_vec()).or_insert_with(|| {
                    distinct.extend_from_slice(bytes);
                    distinct.len() - bytes.len()
                });
                entries.push(FloorEntry {
                    at: u32::try_from(at)?,
                    start: u32::try_from(start)?,
                    len: u32::try_from(bytes.len())?,
                });
            }
            plans.push(FilePlan {
                used: header,
                entries: first..entries.len(),
            });
            files.push(if files.len() < budget {
                FloorFile::Mapped(map)
            } else {
                FloorFile::Read(path.clone())
            });
        }
        Ok(ExportFloor {
            files,
            plans,
            entries,
            distinct,
            render: RenderFloor::new(&exposition),
            exposition,
            read: Vec::new(),
            listing: ListingCheck::new(dir)?,
            _reserved: reserved,
        })
    }

    /// Bytes of store the floor reads per scrape (the used regions).
    pub fn store_bytes(&self) -> usize {
        self.plans.iter().map(|p| p.used.max(0) as usize).sum()
    }

    /// The exposition's lines.
    pub fn lines(&self) -> u64 {
        self.render.lines()
    }

    /// Whether [`ExportFloor::run`] writes the exposition's bytes (every
    /// value's shortest form is the one it prints; Ruby's `1.0e-05` is not).
    pub fn same_bytes(&self) -> bool {
        self.render.same_bytes
    }

    /// One scrape; fails if the store changed since the floor was built.
    pub fn run(&mut self) -> Result<&[u8]> {
        self.check()?;
        Ok(self.render.run())
    }

    /// Every file's `used` and entries compared, every value read.
    fn check(&mut self) -> Result<()> {
        self.listing.check()?;
        let mut sum = 0.0f64;
        let mut guarded = promlab::shared::mapguard::GuardedReads::default();
        for (file, plan) in self.files.iter().zip(&self.plans) {
            let entries = &self.entries[plan.entries.clone()];
            let checked = match file {
                // A mapping of a file another process may shrink is read
                // under a `SIGBUS` guard, as every exporter's is: without
                // one a truncated file kills the scrape's process.
                FloorFile::Mapped(map) => guarded
                    .read(map, |bytes| {
                        check_file(bytes, plan.used, entries, &self.distinct)
                    })
                    .unwrap_or(Err("a store file shrank under the floor")),
                FloorFile::Read(path) => {
                    use std::os::unix::fs::FileExt;
                    let used = plan.used.max(MIN_USED) as usize;
                    self.read.resize(used, 0);
                    std::fs::File::open(path)?.read_exact_at(&mut self.read, 0)?;
                    check_file(&self.read, plan.used, entries, &self.distinct)
                }
            };
            match checked {
                Ok(values) => sum += values,
                Err(change) => bail!(change),
            }
        }
        black_box(sum);
        Ok(())
    }

    /// [`ExportFloor::run`] into `out` (see [`RenderFloor::run_into`]).
    pub fn run_into(&mut self, out: &mut Vec<u8>) -> Result<()> {
        self.check()?;
        self.render.run_into(out);
        Ok(())
    }
}

/// One store file's `used` and entries compared with the floor's copy: the
/// sum of its values (each value read), or what differs.
#[inline(always)]
fn check_file(
    bytes: &[u8],
    used: i32,
    entries: &[FloorEntry],
    distinct: &[u8],
) -> Result<f64, &'static str> {
    if header(bytes) != used {
        return Err("a store file's used size changed under the floor");
    }
    let mut sum = 0.0;
    for entry in entries {
        let (at, start, len) = (entry.at as usize, entry.start as usize, entry.len as usize);
        if bytes[at..at + len] != distinct[start..start + len] {
            return Err("a store entry changed under the floor");
        }
        let value = &bytes[at + len..at + len + 8];
        sum += f64::from_le_bytes(value.try_into().expect("8 bytes"));
    }
    Ok(sum)
}

/// The one syscall a scrape cannot do without: whether the store's listing
/// changed since the floor was built, asked of the exporters' own inotify
/// watch ([`StoreWatch`]). Until issue 26 the floor made none, so every
/// exporter's ratio counted as overhead the `read` of its watch that tells
/// it no file came or went (a syscall is several microseconds on a cold
/// cache here, a fifth of a folded 504-file store's scrape). Where no watch
/// can be had (inotify's per-user limits, a network filesystem), an `fstat`
/// of the directory stands in: the same one syscall, though a directory's
/// times cannot tell every change.
///
/// [`StoreWatch`]: promlab::export::StoreWatch
enum ListingCheck {
    Watch(promlab::export::StoreWatch),
    Stat(std::fs::File),
}

impl ListingCheck {
    fn new(dir: &Path) -> Result<ListingCheck> {
        if let Ok(watch) = promlab::export::StoreWatch::new(dir) {
            return Ok(ListingCheck::Watch(watch));
        }
        let dir =
            std::fs::File::open(dir).with_context(|| format!("cannot open {}", dir.display()))?;
        Ok(ListingCheck::Stat(dir))
    }

    /// Fails if a file came, went or was written and closed in the store.
    fn check(&mut self) -> Result<()> {
        match self {
            ListingCheck::Watch(watch) => {
                if watch
                    .changed()
                    .context("reading the floor's watch of the store")?
                {
                    bail!("the store's listing changed under the floor");
                }
            }
            ListingCheck::Stat(dir) => {
                black_box(dir.metadata()?);
            }
        }
        Ok(())
    }
}

/// The bytes a file read, not mapped, must have: its header.
const MIN_USED: i32 = 4;

/// A store file's `used` as its first 4 bytes say (0 when it has none).
fn header(map: &[u8]) -> i32 {
    map.get(..4)
        .map_or(0, |b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
}

/// A store file's used region.
fn used_region(map: &[u8]) -> &[u8] {
    &map[..(header(map).max(0) as usize).min(map.len())]
}

/// Render: the scrape's text prerendered around its values; a scrape copies
/// the text and formats each value, nothing else. The text between two values
/// (a line's newline, any comment lines, the next line's `name{labels} `) is
/// one piece, so a line costs one copy and one value: the least a scrape whose
/// values change can do.
pub struct RenderFloor {
    /// The pieces back to back: piece `i` precedes value `i`; the last, after
    /// the last value, ends the text.
    text: Vec<u8>,
    /// The end of each piece in `text` but the last (one per value).
    ends: Vec<u32>,
    values: Vec<f64>,
    lines: u64,
    /// The scrape's buffer, at its largest size (see [`RenderFloor::run`]).
    out: Vec<u8>,
    /// Whether the floor's bytes are the exposition's (every value's shortest
    /// form is the one the exposition prints).
    pub same_bytes: bool,
}

impl RenderFloor {
    /// The lines of an exposition (already verified) and their values.
    pub fn new(exposition: &[u8]) -> RenderFloor {
        let mut text = Vec::new();
        let mut ends = Vec::new();
        let mut values = Vec::new();
        for line in exposition.split_inclusive(|&b| b == b'\n') {
            let body = line.strip_suffix(b"\n").unwrap_or(line);
            let value = match body.iter().rposition(|&b| b == b' ') {
                Some(at) if !body.starts_with(b"#") => std::str::from_utf8(&body[at + 1..])
                    .ok()
                    .and_then(|v| v.parse::<f64>().ok())
                    .map(|v| (at + 1, v)),
                _ => None,
            };
            match value {
                Some((at, value)) => {
                    text.extend_from_slice(&body[..at]);
                    ends.push(u32::try_from(text.len()).expect("a scrape under 4 GiB"));
                    values.push(value);
                    text.extend_from_slice(&line[body.len()..]);
                }
                None => text.extend_from_slice(line),
            }
        }
        let lines = exposition.iter().filter(|&&b| b == b'\n').count() as u64;
        let mut floor = RenderFloor {
            text,
            ends,
            values,
            lines,
            out: Vec::new(),
            same_bytes: false,
        };
        floor.same_bytes = floor.run() == exposition;
        floor
    }

    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// One scrape into the floor's own buffer.
    pub fn run(&mut self) -> &[u8] {
        let mut out = std::mem::take(&mut self.out);
        self.run_into(&mut out);
        self.out = out;
        &self.out
    }

    /// One scrape into `out` (cleared first). The ablation passes the buffer
    /// its arms scrape into, so the floor's writes meet the caches theirs do:
    /// in a buffer of its own, cold after the other arms' runs, the export
    /// floor measured slower than a scrape that did more (seed-repro, issue 26).
    pub fn run_into(&mut self, out: &mut Vec<u8>) {
        out.clear();
        out.reserve(self.text.len() + self.values.len() * MAX_VALUE_LEN);
        let mut start = 0;
        let (mut ints, mut floats) = (itoa::Buffer::new(), ryu::Buffer::new());
        for (&end, &value) in self.ends.iter().zip(&self.values) {
            out.extend_from_slice(&self.text[start..end as usize]);
            start = end as usize;
            // An integral value as an integer and `.0` (what `ryu` prints for
            // it, without its general path; a cast round trip tests that
            // without libm's `trunc`); any other with `ryu`. (-0.0 is not:
            // `ryu` prints its sign.)
            if value.abs() < 1e15
                && (value as i64) as f64 == value
                && value.to_bits() != (-0.0f64).to_bits()
            {
                out.extend_from_slice(ints.format(value as i64).as_bytes());
                out.extend_from_slice(b".0");
            } else {
                out.extend_from_slice(floats.format(value).as_bytes());
            }
        }
        out.extend_from_slice(&self.text[start..]);
    }
}

/// The longest value `RenderFloor` writes: `ryu`'s longest form (24 bytes).
const MAX_VALUE_LEN: usize = 24;

/// Ingest: per request, snappy decode and a zero-copy walk of the protobuf;
/// per series, its sketch found from its label bytes (as they came) as
/// `series-cache` finds them — one compare with the series after the last one
/// found, a hash only when that misses — the labels themselves read only the
/// first time a series is seen, to match the metric name and take the group's
/// label value; per sample, one sketch add (a group's values of a request in
/// one slice, for the groups the request has); then the answer: every group's
/// quantiles from its sketch, written as text with its label value and count.
/// No windows, no validation, no canonical series key: what is left is the
/// decoding, the lookup, the arithmetic and the answer no receiver can skip.
/// Until issue 26 it visited every group's sketch after every request (a
/// million groups: 100 requests × 1M visits, the floor slower than `all` at
/// the same adds) and answered nothing, where every arm answers every group.
pub struct IngestFloor {
    metric: Vec<u8>,
    group_label: Vec<u8>,
    /// A new group's sketch, cloned: `BulkSketch::new` takes a logarithm,
    /// which the compiler hoisted to the top of the per-series walk (one
    /// `ln` per series, where the receiver takes one per pane).
    empty: BulkSketch,
    quantiles: Vec<f64>,
    raw: Vec<u8>,
    /// The last run's answer.
    answer: Vec<u8>,
}

type BytesMap<V> = HashMap<Box<[u8]>, V, foldhash::fast::RandomState>;

/// One run's state: the series seen, in order of first sight, each with its
/// group's sketch (`None`: not the metric); per sketch the request's values,
/// added in one slice per request.
#[derive(Default)]
struct IngestState {
    /// Every series' label bytes, back to back (one buffer, as the series
    /// cache keeps them: no allocation per series).
    labels: Vec<u8>,
    /// Per series: where its label bytes are in `labels`, and its sketch.
    series: Vec<(std::ops::Range<usize>, Option<usize>)>,
    /// Label bytes (by hash) → (hash, index in `series`), for when the
    /// guess misses. The hash is kept, as the series cache keeps it, so the
    /// table grows without hashing every series again (until issue 26 it
    /// rehashed them: the floor measured above `all` at 10k groups × 100
    /// series, a million new series).
    index: hashbrown::HashTable<(u64, usize)>,
    hasher: foldhash::fast::RandomState,
    /// The series tried first: the one after the last found. Senders repeat
    /// their series in the same order, so this is one compare and no hash —
    /// what `series-cache` does, and no receiver needs less.
    next_guess: usize,
    groups: BytesMap<usize>,
    /// Every group's label value, back to back, in sketch order, ending at
    /// `group_ends`.
    group_values: Vec<u8>,
    group_ends: Vec<usize>,
    sketches: Vec<BulkSketch>,
    pending: Vec<Vec<f64>>,
    /// The sketches the request being walked has values for.
    touched: Vec<usize>,
    /// The sketch of the group a series was last first seen in.
    last_group: Option<usize>,
}

impl IngestState {
    /// The sketch of the series with label bytes `key`, if it was seen; else
    /// the key's hash, for [`IngestState::insert`].
    #[inline]
    fn lookup(&mut self, key: &[u8]) -> Result<Option<usize>, u64> {
        let i = match self.series.get(self.next_guess) {
            Some((guess, _)) if self.labels[guess.clone()] == *key => self.next_guess,
            _ => {
                let hash = self.hasher.hash_one(key);
                let (labels, series) = (&self.labels, &self.series);
                self.index
                    .find(hash, |&(h, i)| {
                        h == hash && labels[series[i].0.clone()] == *key
                    })
                    .ok_or(hash)?
                    .1
            }
        };
        self.next_guess = i + 1;
        Ok(self.series[i].1)
    }

    /// A value for sketch `i` (non-finite values are left out, as the
    /// receiver leaves them out), added with the request's others.
    #[inline]
    fn add(&mut self, i: usize, value: f64) {
        if value.is_finite() {
            if self.pending[i].is_empty() {
                self.touched.push(i);
            }
            self.pending[i].push(value);
        }
    }

    /// Sketch `i`'s group label value.
    fn group_value(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.group_ends[i - 1] };
        &self.group_values[start..self.group_ends[i]]
    }

    fn insert(&mut self, key: &[u8], hash: u64, sketch: Option<usize>) {
        let start = self.labels.len();
        self.labels.extend_from_slice(key);
        self.series.push((start..self.labels.len(), sketch));
        self.index
            .insert_unique(hash, (hash, self.series.len() - 1), |&(h, _)| h);
        self.next_guess = self.series.len();
    }
}

/// A sample's value. Senders write `value` (field 1) then `timestamp` (field
/// 2, one varint): that layout is read in place; any other is walked field by
/// field (a repeated field's last value wins, as in protobuf).
#[inline]
fn sample_value(sample: &[u8]) -> Result<f64> {
    if let Some(value) = value_as_sent(sample) {
        return Ok(value);
    }
    let mut value = 0.0;
    let mut fields = Fields::new(sample);
    while let Some((f, b)) = fields.next_field()? {
        if f == 1 && b.len() == 8 {
            value = f64::from_le_bytes(b.try_into().expect("8 bytes"));
        }
    }
    Ok(value)
}

/// The value of a sample laid out as senders write it (a double, then at
/// most one timestamp varint ending the sample); `None` for any other layout.
#[inline]
fn value_as_sent(sample: &[u8]) -> Option<f64> {
    let [0x09, rest @ ..] = sample else {
        return None;
    };
    let (value, after) = rest.split_first_chunk::<8>()?;
    let one_timestamp = match after {
        [] => true,
        [0x10, varint @ .., last] => *last < 0x80 && varint.iter().all(|&b| b >= 0x80),
        _ => false,
    };
    one_timestamp.then(|| f64::from_le_bytes(*value))
}

impl IngestFloor {
    /// For a plan's first aggregation (its metric, its first group-by label).
    pub fn new(plan: &promlab::ingest::plan::Plan) -> Result<IngestFloor> {
        let agg = plan
            .aggregations
            .first()
            .context("the plan has no aggregation")?;
        Ok(IngestFloor {
            metric: agg.metric.as_bytes().to_vec(),
            group_label: agg
                .group_by
                .first()
                .cloned()
                .unwrap_or_default()
                .into_bytes(),
            empty: BulkSketch::new(agg.sketch_config()),
            quantiles: agg.quantiles.clone(),
            raw: Vec::new(),
            answer: Vec::new(),
        })
    }

    /// The last run's answer: per group, its label value, count and quantiles.
    pub fn answer(&self) -> &[u8] {
        &self.answer
    }

    /// Every body through the floor into fresh sketches; returns the samples walked.
    pub fn run(&mut self, bodies: &[Vec<u8>]) -> Result<u64> {
        self.run_bodies(bodies.iter().map(Vec::as_slice))
    }

    /// `bodies` through the floor into fresh sketches: one of N floors
    /// walking its share of a workload on N cores. Returns the samples walked.
    pub fn run_bodies<'b>(&mut self, bodies: impl Iterator<Item = &'b [u8]>) -> Result<u64> {
        let mut state = IngestState::default();
        let mut samples = 0;
        // Decompressed into a buffer kept at its largest, as the receiver
        // does (zeroing it for every request was ~8 % of the floor).
        let mut buf = std::mem::take(&mut self.raw);
        for body in bodies {
            let raw = wire::decompress_reusing(body, 64 << 20, &mut buf)?;
            let mut request = Fields::new(raw);
            while let Some((field, series)) = request.next_field()? {
                if field == 1 {
                    samples += self.series(series, &mut state)?;
                }
            }
            for &i in &state.touched {
                state.sketches[i].add_slice(&state.pending[i]);
                state.pending[i].clear();
            }
            state.touched.clear();
        }
        self.raw = buf;
        self.write_answer(&state);
        Ok(samples)
    }

    /// Every group's label value, count and quantiles, a line each.
    fn write_answer(&mut self, state: &IngestState) {
        let (out, mut values) = (&mut self.answer, Vec::with_capacity(self.quantiles.len()));
        out.clear();
        let mut floats = ryu::Buffer::new();
        let mut start = 0;
        for (sketch, &end) in state.sketches.iter().zip(&state.group_ends) {
            out.extend_from_slice(&state.group_values[start..end]);
            start = end;
            out.push(b' ');
            out.extend_from_slice(itoa::Buffer::new().format(sketch.count()).as_bytes());
            values.clear();
            sketch.quantiles_into(&self.quantiles, &mut values);
            for &v in &values {
                out.push(b' ');
                out.extend_from_slice(floats.format(v).as_bytes());
            }
            out.push(b'\n');
        }
        black_box(&out);
    }

    fn series(&self, series: &[u8], state: &mut IngestState) -> Result<u64> {
        if let Some(samples) = self.series_as_sent(series, state)? {
            return Ok(samples);
        }
        // The labels' bytes: from the first label field to the end of the last.
        let mut labels = (usize::MAX, 0);
        let mut sketch = None;
        let mut samples = 0;
        let mut fields = Fields::new(series);
        loop {
            let at = fields.at;
            let Some((field, bytes)) = fields.next_field()? else {
                break;
            };
            match field {
                1 => labels = (labels.0.min(at), fields.at),
                2 => {
                    if samples == 0 {
                        let key = series.get(labels.0..labels.1).unwrap_or_default();
                        sketch = self.sketch_of(key, state)?;
                    }
                    samples += 1;
                    // A series no aggregation takes: its samples are counted, not read.
                    let Some(i) = sketch else { continue };
                    state.add(i, sample_value(bytes)?);
                }
                _ => {}
            }
        }
        Ok(samples)
    }

    /// A series as senders write it — label fields with one-byte lengths,
    /// then samples of one-byte length each a value and one timestamp — its
    /// labels found by their lengths alone and each value read in place, as
    /// `borrowed-decode` walks it (until issue 26 the floor walked every
    /// field, and `all` measured below it at 1,000 groups of 1,000 series);
    /// `None` for any other shape, which [`IngestFloor::series`] walks.
    #[inline]
    fn series_as_sent(&self, series: &[u8], state: &mut IngestState) -> Result<Option<u64>> {
        let mut pos = 0;
        while series.get(pos) == Some(&0x0a) {
            match series.get(pos + 1) {
                Some(&len) if len < 0x80 => pos += 2 + len as usize,
                _ => return Ok(None),
            }
        }
        let Some(labels) = series.get(..pos) else {
            return Ok(None);
        };
        let sample_at = |at: usize| match (series.get(at), series.get(at + 1)) {
            (Some(0x12), Some(&len)) if len < 0x80 => {
                let sample = series.get(at + 2..at + 2 + len as usize)?;
                value_as_sent(sample).map(|value| (value, at + 2 + len as usize))
            }
            _ => None,
        };
        // The shape first, then the work: nothing is added from a series
        // the full walk then takes.
        let (mut at, mut samples) = (pos, 0);
        while at < series.len() {
            let Some((_, next)) = sample_at(at) else {
                return Ok(None);
            };
            (at, samples) = (next, samples + 1);
        }
        if samples == 0 {
            return Ok(Some(0));
        }
        let Some(i) = self.sketch_of(labels, state)? else {
            return Ok(Some(samples));
        };
        let mut at = pos;
        while let Some((value, next)) = sample_at(at) {
            state.add(i, value);
            at = next;
        }
        Ok(Some(samples))
    }

    /// The sketch of the series with label bytes `key` (`None`: not the
    /// aggregation's metric), found or, the first time, made.
    #[inline]
    fn sketch_of(&self, key: &[u8], state: &mut IngestState) -> Result<Option<usize>> {
        Ok(match state.lookup(key) {
            Ok(found) => found,
            Err(hash) => {
                let found = self.first_sight(key, state)?;
                state.insert(key, hash, found);
                found
            }
        })
    }

    /// A series seen for the first time: its labels read and checked, its
    /// group's sketch found or made (`None` when it is not the aggregation's
    /// metric). The receiver refuses a request holding a series Prometheus
    /// would refuse (a name that is not a label name, a value that is not
    /// UTF-8, names unsorted or repeated, no `__name__`), so each series is
    /// checked once, the first time, in the walk that reads it. Until issue
    /// 26 the floor checked nothing, and counted the check as overhead.
    fn first_sight(&self, labels: &[u8], state: &mut IngestState) -> Result<Option<usize>> {
        let (mut matches, mut named, mut group): (bool, bool, &[u8]) = (false, false, b"");
        let mut previous: Option<&[u8]> = None;
        let mut fields = Fields::new(labels);
        while let Some((_, bytes)) = fields.next_field()? {
            let (mut name, mut value): (&[u8], &[u8]) = (b"", b"");
            let mut label = Fields::new(bytes);
            while let Some((f, b)) = label.next_field()? {
                match f {
                    1 => name = b,
                    2 => value = b,
                    _ => {}
                }
            }
            if !label_is_valid(previous, name, value) {
                bail!(
                    "invalid series: label `{}`",
                    String::from_utf8_lossy(name).escape_debug()
                );
            }
            previous = Some(name);
            if name == b"__name__" {
                named = !value.is_empty();
                matches = value == self.metric.as_slice();
            } else if name == self.group_label.as_slice() {
                group = value;
            }
        }
        if !named {
            bail!("invalid series: no `__name__` label");
        }
        if !matches {
            return Ok(None);
        }
        // The group of the series first seen before, as the receiver's
        // `series-cache` tries it (a sender sends a group's series together):
        // one compare, no hash.
        if let Some(i) = state.last_group.filter(|&i| state.group_value(i) == group) {
            return Ok(Some(i));
        }
        let i = match state.groups.get(group) {
            Some(&i) => i,
            None => {
                state.sketches.push(self.empty.clone());
                state.pending.push(Vec::new());
                state.group_values.extend_from_slice(group);
                state.group_ends.push(state.group_values.len());
                state.groups.insert(group.into(), state.sketches.len() - 1);
                state.sketches.len() - 1
            }
        };
        state.last_group = Some(i);
        Ok(Some(i))
    }
}

/// A label as Prometheus takes it, after the label `previous`: a valid name
/// sorted after the one before, and a UTF-8 value (ASCII, the usual, in one
/// pass).
#[inline]
fn label_is_valid(previous: Option<&[u8]>, name: &[u8], value: &[u8]) -> bool {
    previous.is_none_or(|p| p < name)
        && promlab::format::registry::is_label_name(name)
        && (value.is_ascii() || std::str::from_utf8(value).is_ok())
}

/// A protobuf message's fields: (number, payload) for length-delimited and
/// 64-bit fields, varints and 32-bit fields skipped (payload empty).
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8]) -> Fields<'a> {
        Fields { bytes, at: 0 }
    }

    /// One byte inline (keys, lengths), longer ones out of line — as the
    /// receiver's own reader (`wire`) does.
    #[inline(always)]
    fn varint(&mut self) -> Result<u64> {
        match self.bytes.get(self.at) {
            Some(&b) if b < 0x80 => {
                self.at += 1;
                Ok(u64::from(b))
            }
            _ => self.varint_long(),
        }
    }

    #[inline(never)]
    fn varint_long(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.bytes.get(self.at) else {
                bail!("truncated varint")
            };
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        bail!("varint too long")
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            bail!("truncated field")
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    #[inline]
    fn next_field(&mut self) -> Result<Option<(u64, &'a [u8])>> {
        if self.at >= self.bytes.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let payload = match key & 7 {
            0 => {
                self.varint()?;
                &[][..]
            }
            1 => self.take(8)?,
            2 => {
                let n = self.varint()? as usize;
                self.take(n)?
            }
            5 => {
                self.take(4)?;
                &[][..]
            }
            wire_type => bail!("wire type {wire_type}"),
        };
        Ok(Some((key >> 3, payload)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_value_reads_the_usual_layout_in_place_and_any_other_as_protobuf() {
        use prost::Message;
        let encode = |value: f64, timestamp: i64| {
            promlab::ingest::wire::Sample { value, timestamp }.encode_to_vec()
        };
        for (value, timestamp) in [(1.5, 1_700_000_000_000), (-2.5, 0), (f64::MAX, -1)] {
            let bytes = encode(value, timestamp);
            assert_eq!(sample_value(&bytes).unwrap().to_bits(), value.to_bits());
        }
        // A repeated value field: the last one wins, as in protobuf.
        let mut repeated = encode(1.0, 5);
        repeated.push(0x09);
        repeated.extend_from_slice(&2.0f64.to_le_bytes());
        assert_eq!(sample_value(&repeated).unwrap(), 2.0);
        // No value field: protobuf's default, 0.
        assert_eq!(sample_value(&encode(0.0, 9)).unwrap(), 0.0);
        assert!(sample_value(&[0x09, 1, 2]).is_err());
    }

    #[test]
    fn render_floor_copies_lines_and_formats_values() {
        let text = b"# HELP a x\n# TYPE a gauge\na{q=\"1 2\"} 3.0\nb 0.25\nc 1.0e-05\n";
        let floor = RenderFloor::new(text);
        assert_eq!(floor.lines(), 5);
        // ryu prints 1e-5 where Ruby prints 1.0e-05: not the same bytes.
        assert!(!floor.same_bytes);
        let floor = RenderFloor::new(&text[..text.len() - 10]);
        assert!(floor.same_bytes);
    }

    #[test]
    fn ingest_floor_walks_every_sample_of_the_feeder() {
        let workload = promlab::ingest::feed::FeedWorkload {
            groups: 3,
            series_per_group: 4,
            ..promlab::ingest::feed::FeedWorkload::seed(1_700_000_000_000)
        };
        let generator = workload.generator();
        let bodies: Vec<Vec<u8>> = (0..2).flat_map(|t| generator.tick_bodies(t)).collect();
        let mut floor = IngestFloor::new(&promlab::ingest::plan::Plan::default()).unwrap();
        assert_eq!(floor.run(&bodies).unwrap(), workload.samples_per_tick() * 2);
        assert!(floor.run(&[b"\x05garbage".to_vec()]).is_err());
    }

    #[test]
    fn ingest_floor_refuses_the_series_the_receiver_refuses() {
        let plan = promlab::ingest::plan::Plan::default();
        let agg = &plan.aggregations[0];
        let body = |labels: &[(&[u8], &[u8])]| {
            let mut encoded = Vec::new();
            for &(name, value) in labels {
                wire::put_label(&mut encoded, name, value);
            }
            let mut raw = Vec::new();
            wire::put_series_one_sample(&mut raw, &encoded, 1.5, 1_700_000_000_000);
            wire::compress(&raw)
        };
        let (metric, group) = (agg.metric.as_bytes(), agg.group_by[0].as_bytes());
        let cases: [&[(&[u8], &[u8])]; 8] = [
            &[(b"__name__", metric), (group, b"a")],
            &[(b"__name__", metric), (group, "é".as_bytes())],
            &[(b"__name__", b"other"), (b"job", b"x")],
            &[(b"__name__", metric), (group, b"\xc3x")],
            &[(group, b"a"), (b"__name__", metric)],
            &[(b"__name__", metric), (group, b"a"), (group, b"b")],
            &[(b"__name__", metric), (b"0bad", b"a")],
            &[(group, b"a")],
        ];
        // The first three are valid, the rest each break one rule.
        for (i, labels) in cases.into_iter().enumerate() {
            let body = body(labels);
            let mut receiver = promlab::ingest::pipeline::Ingester::new(
                plan.clone(),
                promlab::shared::strategy::StrategySet::all(),
            );
            let refused = receiver.handle(&body).is_err();
            assert_eq!(refused, i >= 3, "case {i}");
            let mut floor = IngestFloor::new(&plan).unwrap();
            assert_eq!(floor.run(&[body]).is_err(), refused, "case {i}");
        }
    }

    #[test]
    fn export_floor_compares_every_key_and_fails_on_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let entries: [(&[u8], f64); 2] = [(b"a=1", 1.0), (b"a=22", 2.0)];
        let bytes = promlab::format::storefile::file_bytes(entries);
        for pid in [1, 2] {
            std::fs::write(dir.path().join(format!("metric_x___{pid}.bin")), &bytes).unwrap();
        }
        let mut floor = ExportFloor::new(dir.path(), b"x 3.0\n".to_vec()).unwrap();
        assert_eq!(floor.run().unwrap(), b"x 3.0\n");
        // Both files' entries are the same: kept once, without their values.
        assert_eq!(floor.distinct.len(), bytes.len() - 8 - 2 * 16);
        let mut changed = bytes.clone();
        let at = changed.windows(4).position(|w| w == b"a=22").unwrap();
        changed[at + 3] = b'3';
        std::fs::write(dir.path().join("metric_x___2.bin"), &changed).unwrap();
        // The write closed is a change to the listing's watch; that event
        // read, the next scrape finds the bytes changed.
        let listing = floor.run().unwrap_err().to_string();
        assert!(listing.contains("listing changed"), "{listing}");
        let entry = floor.run().unwrap_err().to_string();
        assert!(entry.contains("entry changed"), "{entry}");
        assert_eq!(used_region(&[5, 0, 0, 0, 9, 9, 9]), &[5, 0, 0, 0, 9]);
    }

    #[test]
    fn export_floor_reads_its_watch_once_a_scrape_and_fails_on_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = promlab::format::storefile::file_bytes([(b"a=1".as_slice(), 1.0)]);
        std::fs::write(dir.path().join("metric_x___1.bin"), &bytes).unwrap();
        let mut floor = ExportFloor::new(dir.path(), b"x 1.0\n".to_vec()).unwrap();
        assert!(matches!(floor.listing, ListingCheck::Watch(_)));
        assert_eq!(floor.run().unwrap(), b"x 1.0\n");
        assert_eq!(floor.run().unwrap(), b"x 1.0\n");
        std::fs::File::create(dir.path().join("metric_x___2.bin")).unwrap();
        let err = floor.run().unwrap_err().to_string();
        assert!(err.contains("listing changed"), "{err}");
    }
}
