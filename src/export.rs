//! Stage 2, export: read every process's files of every metric, decode the
//! keys, aggregate across processes, and hand the values to the renderer.
//!
//! This follows client_ruby's `MetricStore#all_values` and `Metric#values`:
//! files are found with the glob `metric_<name>___*` and visited in sorted path
//! order; each entry's key is decoded into a label set; values of one label set
//! are aggregated in file order (`sum` folds left from the first value, `max`
//! and `min` keep the first of equals, `all` keeps the first, `most_recent` the
//! newest timestamp); series keep the order of first appearance.
//!
//! Three seams carry the export-side strategies:
//! - **read** ([`Strategy::SingleRead`]): the baseline makes two buffered
//!   passes of per-entry reads per file (positions, then values, as
//!   `FileMappedDict` does); `single-read` reads the used region once.
//! - **decode** ([`Strategy::DecodeOnce`]): the baseline decodes every entry's
//!   key; `decode-once` decodes each distinct raw key once per export. Raw keys
//!   of 4.2.5 and 5.x differ in `~`/`*` but decode to the same label set, so
//!   series are still looked up by their decoded labels.
//! - **unescape** ([`Strategy::FastUnescape`]): which key decoder runs
//!   ([`formenc::decode_key_reference`] or the borrowing [`formenc::decode_key_fast`]).

use crate::formenc::{self, Label};
use crate::registry::{Aggregation, MetricDef, MetricType, Registry};
use crate::render;
use crate::strategy::{Strategy, StrategySet};
use ahash::AHashMap;
use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::hash::{BuildHasher, Hash, Hasher};
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------
// The entry layout, shared with the writer.

/// One entry of a store file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Entry<'a> {
    /// The form-encoded key, padding removed.
    pub key: &'a [u8],
    pub value: f64,
    pub timestamp: f64,
    /// File offset of the value.
    pub value_offset: usize,
}

/// Why an entry could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryError {
    BadLength {
        at: usize,
        len: i32,
    },
    Truncated {
        at: usize,
        needs: usize,
        used: usize,
    },
}

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryError::BadLength { at, len } => {
                write!(f, "entry at offset {at} has key length {len}")
            }
            EntryError::Truncated { at, needs, used } => {
                write!(
                    f,
                    "entry at offset {at} needs {needs} bytes but used ends at {used}"
                )
            }
        }
    }
}

impl std::error::Error for EntryError {}

/// client_ruby's `unpack("A*")`: the key without trailing spaces and NULs.
fn strip_padding(padded: &[u8]) -> &[u8] {
    let end = padded
        .iter()
        .rposition(|&b| b != b' ' && b != 0)
        .map_or(0, |i| i + 1);
    &padded[..end]
}

/// Walks the entries of a file's bytes from offset 8 up to `used`.
pub fn entries(region: &[u8], used: usize) -> impl Iterator<Item = Result<Entry<'_>, EntryError>> {
    let mut pos = crate::store::HEADER_SIZE;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || pos >= used {
            return None;
        }
        let at = pos;
        let result = entry_at(region, at, used);
        match &result {
            Ok((_, next)) => pos = *next,
            Err(_) => failed = true,
        }
        Some(result.map(|(entry, _)| entry))
    })
}

fn entry_at(region: &[u8], at: usize, used: usize) -> Result<(Entry<'_>, usize), EntryError> {
    let truncated = |needs| EntryError::Truncated { at, needs, used };
    let len_bytes = region
        .get(at..at + 4)
        .filter(|_| at + 4 <= used)
        .ok_or(truncated(4))?;
    let len = i32::from_le_bytes(len_bytes.try_into().expect("4 bytes"));
    if len < 0 {
        return Err(EntryError::BadLength { at, len });
    }
    let needs = 4 + len as usize + 16;
    if at + needs > used || at + needs > region.len() {
        return Err(truncated(needs));
    }
    let key = strip_padding(&region[at + 4..at + 4 + len as usize]);
    let value_offset = at + 4 + len as usize;
    let value = f64::from_le_bytes(
        region[value_offset..value_offset + 8]
            .try_into()
            .expect("8 bytes"),
    );
    let timestamp = f64::from_le_bytes(
        region[value_offset + 8..value_offset + 16]
            .try_into()
            .expect("8 bytes"),
    );
    Ok((
        Entry {
            key,
            value,
            timestamp,
            value_offset,
        },
        at + needs,
    ))
}

// ---------------------------------------------------------------------------
// The read seam: how one file's entries are read.

/// Reusable buffers for reading files.
#[derive(Default)]
struct ReadBuffers {
    region: Vec<u8>,
    key: Vec<u8>,
}

/// Reads one store file under `flock` and hands each entry to `visit`.
fn read_file(
    path: &Path,
    single_read: bool,
    buffers: &mut ReadBuffers,
    visit: &mut dyn FnMut(Entry<'_>) -> Result<()>,
) -> Result<()> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let fd = file.as_raw_fd();
    crate::store::flock(fd, libc::LOCK_EX)
        .with_context(|| format!("cannot lock {}", path.display()))?;
    let result = if single_read {
        read_whole(&file, buffers, visit)
    } else {
        read_entry_by_entry(&file, buffers, visit)
    };
    crate::store::flock(fd, libc::LOCK_UN)?;
    result.with_context(|| format!("corrupt store file {}", path.display()))
}

/// Reads `used` from the header: at least 8, at most the file's size.
fn check_used(header: [u8; 4], file_len: u64) -> Result<usize> {
    let used = i32::from_le_bytes(header);
    if used == 0 {
        // A file created but never written (client_ruby reads it as empty).
        return Ok(crate::store::HEADER_SIZE);
    }
    if used < crate::store::HEADER_SIZE as i32 || used as u64 > file_len {
        bail!("bad used = {used} (file is {file_len} bytes)");
    }
    Ok(used as usize)
}

/// `single-read`: one read of the used region, then a walk over it.
fn read_whole(
    file: &File,
    buffers: &mut ReadBuffers,
    visit: &mut dyn FnMut(Entry<'_>) -> Result<()>,
) -> Result<()> {
    let mut reader = file;
    let mut header = [0u8; 4];
    if file.metadata()?.len() < 4 {
        // Being created by its writer: client_ruby reads it as empty.
        return Ok(());
    }
    reader.read_exact(&mut header)?;
    let used = check_used(header, file.metadata()?.len())?;
    // Grow (and zero) the reused buffer only when a file is larger than any before.
    if buffers.region.len() < used {
        buffers.region.resize(used, 0);
    }
    let region = &mut buffers.region[..used];
    region[..4].copy_from_slice(&header);
    reader.read_exact(&mut region[4..])?;
    for entry in entries(region, used) {
        visit(entry?)?;
    }
    Ok(())
}

/// Baseline: as `FileMappedDict` does, one buffered pass to learn the entries'
/// positions, then a second pass that seeks back and reads every entry again.
fn read_entry_by_entry(
    file: &File,
    buffers: &mut ReadBuffers,
    visit: &mut dyn FnMut(Entry<'_>) -> Result<()>,
) -> Result<()> {
    let file_len = file.metadata()?.len();
    if file_len < 4 {
        // Being created by its writer: client_ruby reads it as empty.
        return Ok(());
    }
    // Ruby's IO buffer is 8 KiB.
    let mut reader = BufReader::with_capacity(8192, file);
    let mut header = [0u8; 4];
    reader.read_exact(&mut header)?;
    let used = check_used(header, file_len)?;
    let mut positions: AHashMap<Vec<u8>, usize> = AHashMap::new();
    for pass in 0..2 {
        reader.seek(SeekFrom::Start(crate::store::HEADER_SIZE as u64))?;
        let mut pos = crate::store::HEADER_SIZE;
        while pos < used {
            let at = pos;
            let mut len_bytes = [0u8; 4];
            if at + 4 > used {
                return Err(EntryError::Truncated { at, needs: 4, used }.into());
            }
            reader.read_exact(&mut len_bytes)?;
            let len = i32::from_le_bytes(len_bytes);
            if len < 0 {
                return Err(EntryError::BadLength { at, len }.into());
            }
            let needs = 4 + len as usize + 16;
            if at + needs > used {
                return Err(EntryError::Truncated { at, needs, used }.into());
            }
            buffers.key.resize(len as usize, 0);
            reader.read_exact(&mut buffers.key)?;
            let mut value_bytes = [0u8; 16];
            reader.read_exact(&mut value_bytes)?;
            let value_offset = at + 4 + len as usize;
            let key = strip_padding(&buffers.key);
            if pass == 0 {
                positions.insert(key.to_vec(), value_offset);
            } else {
                visit(Entry {
                    key,
                    value: f64::from_le_bytes(value_bytes[..8].try_into().expect("8 bytes")),
                    timestamp: f64::from_le_bytes(value_bytes[8..].try_into().expect("8 bytes")),
                    value_offset,
                })?;
            }
            pos = at + needs;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Series: decoded label sets and their aggregated values.

/// A decoded label set, in key order.
pub type LabelSet = Vec<(Box<[u8]>, Box<[u8]>)>;

/// Values of one label set, folded as they arrive in file order.
#[derive(Clone, Copy, Debug)]
struct Aggregate {
    value: f64,
    timestamp: f64,
}

impl Aggregate {
    fn fold(&mut self, mode: Aggregation, value: f64, timestamp: f64) {
        match mode {
            Aggregation::Sum => self.value += value,
            // Ruby keeps the first of equal values; NaN never wins (Ruby raises).
            Aggregation::Max if value > self.value => self.value = value,
            Aggregation::Min if value < self.value => self.value = value,
            Aggregation::MostRecent if timestamp > self.timestamp => {
                self.value = value;
                self.timestamp = timestamp;
            }
            _ => {}
        }
    }
}

/// The series of one metric in order of first appearance, found by decoded labels.
struct SeriesTable {
    labels: Vec<LabelSet>,
    values: Vec<Aggregate>,
    by_hash: AHashMap<u64, Vec<usize>>,
    /// `decode-once`: raw key → series. foldhash is markedly faster than
    /// ahash's portable fallback on keys of hundreds of bytes.
    by_raw_key: HashMap<Box<[u8]>, usize, foldhash::fast::FixedState>,
    /// `decode-once`: raw component → decoded, for raw keys not seen before.
    components: formenc::ComponentCache,
    hasher: ahash::RandomState,
}

impl SeriesTable {
    fn new() -> Self {
        SeriesTable {
            labels: Vec::new(),
            values: Vec::new(),
            by_hash: AHashMap::new(),
            by_raw_key: HashMap::default(),
            components: formenc::ComponentCache::default(),
            hasher: ahash::RandomState::with_seeds(1, 2, 3, 4),
        }
    }

    fn add(&mut self, entry: Entry<'_>, mode: Aggregation, s: StrategySet) -> Result<()> {
        let index = if s.contains(Strategy::DecodeOnce) {
            match self.by_raw_key.get(entry.key) {
                Some(&index) => index,
                None => {
                    let index = self.find_or_insert(entry.key, s)?;
                    self.by_raw_key.insert(entry.key.into(), index);
                    index
                }
            }
        } else {
            self.find_or_insert(entry.key, s)?
        };
        if index == self.values.len() {
            self.values.push(Aggregate {
                value: entry.value,
                timestamp: entry.timestamp,
            });
        } else {
            self.values[index].fold(mode, entry.value, entry.timestamp);
        }
        Ok(())
    }

    /// Decodes `raw` and finds its series; a new series gets index `len`
    /// (its value is pushed by the caller).
    fn find_or_insert(&mut self, raw: &[u8], s: StrategySet) -> Result<usize> {
        let fast = s.contains(Strategy::FastUnescape);
        let decoded = if s.contains(Strategy::DecodeOnce) {
            formenc::decode_key_cached(raw, fast, &mut self.components)
        } else if fast {
            formenc::decode_key_fast(raw)
        } else {
            formenc::decode_key_reference(raw)
        };
        let decoded =
            decoded.map_err(|e| anyhow!("key {:?}: {e}", String::from_utf8_lossy(raw)))?;
        let hash = self.hash(&decoded);
        if let Some(candidates) = self.by_hash.get(&hash) {
            for &index in candidates {
                if same_labels(&self.labels[index], &decoded) {
                    return Ok(index);
                }
            }
        }
        let index = self.labels.len();
        self.labels.push(
            decoded
                .into_iter()
                .map(|(n, v)| (n.into_owned().into(), v.into_owned().into()))
                .collect(),
        );
        self.by_hash.entry(hash).or_default().push(index);
        Ok(index)
    }

    fn hash(&self, labels: &[Label<'_>]) -> u64 {
        let mut h = self.hasher.build_hasher();
        for (name, value) in labels {
            name.as_ref().hash(&mut h);
            value.as_ref().hash(&mut h);
        }
        h.finish()
    }
}

fn same_labels(stored: &LabelSet, decoded: &[Label<'_>]) -> bool {
    stored.len() == decoded.len()
        && stored
            .iter()
            .zip(decoded)
            .all(|((n, v), (n2, v2))| **n == **n2 && **v == **v2)
}

// ---------------------------------------------------------------------------
// What the renderer gets: client_ruby's `Metric#values`.

/// The exported values of one metric, as client_ruby's `Metric#values` returns them.
#[derive(Clone, Debug, PartialEq)]
pub enum MetricValues {
    /// Counters and gauges: one value per label set.
    Scalar(Vec<(LabelSet, f64)>),
    /// One entry per label set without `le`.
    Histogram(Vec<HistogramValue>),
    /// One entry per label set without `quantile`.
    Summary(Vec<SummaryValue>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct HistogramValue {
    pub labels: LabelSet,
    /// Cumulative counts of the declared buckets, in declared order.
    pub buckets: Vec<f64>,
    /// `le` values not declared (a changed registry), and `+Inf`, in Ruby's hash
    /// order: in order of first appearance, `+Inf` last if it never appeared.
    pub others: Vec<(Box<[u8]>, f64)>,
    /// `None` if no `le="sum"` entry exists (Ruby prints an empty value).
    pub sum: Option<f64>,
    /// The `+Inf` count.
    pub count: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SummaryValue {
    pub labels: LabelSet,
    pub sum: f64,
    pub count: f64,
}

/// A label set without one label, and that label's value with the series value
/// for each series of the group.
type Group<'t> = (LabelSet, Vec<(Option<&'t [u8]>, f64)>);

/// Groups aggregated series by their label set without `label`, in order of
/// first appearance: each group's labels and its `(label value, value)` slots.
/// Label sets are compared borrowed; only a new group's labels are copied.
fn group_by_base<'t>(table: &'t SeriesTable, label: &[u8]) -> Vec<Group<'t>> {
    type Base<'t> = Vec<(&'t [u8], &'t [u8])>;
    let mut groups: Vec<Group<'t>> = Vec::new();
    let mut index: AHashMap<Base<'t>, usize> = AHashMap::new();
    for (labels, aggregate) in table.labels.iter().zip(&table.values) {
        let mut slot = None;
        let mut base: Base<'t> = Vec::with_capacity(labels.len());
        for (n, v) in labels {
            if &**n == label {
                slot = Some(&**v);
            } else {
                base.push((n, v));
            }
        }
        let i = match index.get(&base) {
            Some(&i) => i,
            None => {
                groups.push((
                    base.iter()
                        .map(|(n, v)| (Box::from(*n), Box::from(*v)))
                        .collect(),
                    Vec::new(),
                ));
                index.insert(base, groups.len() - 1);
                groups.len() - 1
            }
        };
        groups[i].1.push((slot, aggregate.value));
    }
    groups
}

fn histogram_values(def: &MetricDef, table: &SeriesTable) -> Vec<HistogramValue> {
    group_by_base(table, b"le")
        .into_iter()
        .map(|(labels, slots)| {
            let mut buckets = vec![0.0; def.buckets.len()];
            let mut others: Vec<(Box<[u8]>, f64)> = Vec::new();
            let mut sum = None;
            for (le, value) in slots {
                // Ruby: `label_set[:le].to_s`, so a missing `le` is the bucket "".
                let le = le.unwrap_or_default();
                if le == b"sum" {
                    sum = Some(value);
                } else if let Some(i) = def.buckets.iter().position(|b| b.as_bytes() == le) {
                    buckets[i] = value;
                } else if let Some(slot) = others.iter_mut().find(|(name, _)| **name == *le) {
                    slot.1 = value;
                } else {
                    others.push((Box::from(le), value));
                }
            }
            // client_ruby's accumulate_buckets.
            let mut acc = 0.0;
            for bucket in &mut buckets {
                let own = *bucket;
                *bucket += acc;
                acc += own;
            }
            let count = match others.iter_mut().find(|(name, _)| &**name == b"+Inf") {
                Some(inf) => {
                    inf.1 += acc;
                    inf.1
                }
                None => {
                    others.push((Box::from(&b"+Inf"[..]), acc));
                    acc
                }
            };
            HistogramValue {
                labels,
                buckets,
                others,
                sum,
                count,
            }
        })
        .collect()
}

fn summary_values(table: &SeriesTable) -> Vec<SummaryValue> {
    group_by_base(table, b"quantile")
        .into_iter()
        .map(|(labels, slots)| {
            let mut value = SummaryValue {
                labels,
                sum: 0.0,
                count: 0.0,
            };
            for (quantile, v) in slots {
                match quantile {
                    Some(b"sum") => value.sum = v,
                    Some(b"count") => value.count = v,
                    _ => {}
                }
            }
            value
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The exporter.

/// Files of one metric: the glob `metric_<name>___*`, sorted by path.
pub fn metric_files(dir: &Path, metric: &str) -> Result<Vec<PathBuf>> {
    let prefix = format!("metric_{metric}___");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)
        .with_context(|| format!("cannot read store directory {}", dir.display()))?
    {
        let entry = entry?;
        if entry
            .file_name()
            .as_encoded_bytes()
            .starts_with(prefix.as_bytes())
        {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// Exports a store directory. Long-lived: a server keeps one across scrapes.
pub struct Exporter {
    dir: PathBuf,
    registry: Registry,
    strategies: StrategySet,
    buffers: ReadBuffers,
}

impl Exporter {
    pub fn new(dir: &Path, registry: Registry, strategies: StrategySet) -> Exporter {
        Exporter {
            dir: dir.to_path_buf(),
            registry,
            strategies,
            buffers: ReadBuffers::default(),
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Reads, decodes and aggregates one metric.
    pub fn values(&mut self, def_index: usize) -> Result<MetricValues> {
        let def = &self.registry.metrics[def_index];
        let s = self.strategies;
        let mode = def.aggregation();
        let mut table = SeriesTable::new();
        for path in metric_files(&self.dir, &def.name)? {
            read_file(
                &path,
                s.contains(Strategy::SingleRead),
                &mut self.buffers,
                &mut |entry| {
                    table.add(entry, mode, s).with_context(|| {
                        format!("entry at offset {}", entry.value_offset - entry.key.len())
                    })
                },
            )
            .with_context(|| format!("metric {}", def.name))?;
        }
        Ok(match def.kind {
            MetricType::Counter | MetricType::Gauge => MetricValues::Scalar(
                table
                    .labels
                    .into_iter()
                    .zip(table.values)
                    .map(|(l, a)| (l, a.value))
                    .collect(),
            ),
            MetricType::Histogram => MetricValues::Histogram(histogram_values(def, &table)),
            MetricType::Summary => MetricValues::Summary(summary_values(&table)),
        })
    }

    /// Clears `out` and writes the whole exposition into it.
    pub fn export_into(&mut self, out: &mut Vec<u8>) -> Result<()> {
        if !self.dir.is_dir() {
            bail!("store directory {} does not exist", self.dir.display());
        }
        out.clear();
        for i in 0..self.registry.metrics.len() {
            let values = self.values(i)?;
            render::write_family(out, &self.registry.metrics[i], &values);
        }
        Ok(())
    }
}

/// Exports a store directory once.
pub fn export(dir: &Path, registry: &Registry, strategies: StrategySet) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    Exporter::new(dir, registry.clone(), strategies).export_into(&mut out)?;
    Ok(out)
}
