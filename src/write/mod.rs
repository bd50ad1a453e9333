//! Stage 1, write: an instrumentation client whose multi-process store is
//! byte-compatible with client_ruby's `DirectFileStore` (the file format is
//! [`crate::format::storefile`]'s).
//!
//! # Seams
//!
//! [`Client::new`] takes its [`WriteSeams`] from [`Seams::resolve`] (the
//! table of seams is in [`crate::shared::seams`]); nothing below it asks which
//! strategies are on. The bytes on disk are the same under every combination.

use crate::format::formenc::{self, Dialect};
use crate::format::registry::{MetricDef, MetricType, ProcessAggregation, Registry};
use crate::format::storefile::{
    self, entries, file_path, flock, process_file_path, HEADER_SIZE, INITIAL_FILE_SIZE,
};
use crate::shared::event_probe::probe;
use crate::shared::mapguard;
use crate::shared::seams::{
    ClockReads, ClockSource, KeySource, Lookups, PidSource, Seams, StoreIo, WriteSeams,
};
use crate::shared::strategy::StrategySet;
use anyhow::{anyhow, bail, Context, Result};
use memmap2::MmapMut;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::hash::BuildHasher;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Once;

mod file;
mod keys;

pub use file::*;
use keys::*;

// ---------------------------------------------------------------------------
// What the seams' variants do here.

impl PidSource {
    fn pid(self) -> u32 {
        match self {
            PidSource::AskOs => os_pid(),
            PidSource::Cached => cached_pid(),
        }
    }
}

impl ClockSource {
    /// The clock of a metric aggregated across processes by `aggregation`.
    pub fn for_aggregation(self, aggregation: ProcessAggregation) -> Clock {
        match (self, aggregation) {
            (ClockSource::CoarseUnlessCompared, ProcessAggregation::MostRecent) => Clock::Monotonic,
            (ClockSource::CoarseUnlessCompared, _) => Clock::MonotonicCoarse,
            (ClockSource::Monotonic, _) => Clock::Monotonic,
        }
    }
}

/// One metric's timestamp clock ([`ClockSource::for_aggregation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    Monotonic,
    MonotonicCoarse,
}

impl Clock {
    /// Seconds of the monotonic clock, as Ruby's `Process.clock_gettime`
    /// gives them: `tv_sec + tv_nsec * 1e-9`.
    pub fn seconds(self) -> f64 {
        let id = match self {
            Clock::Monotonic => {
                probe!("write.clock.monotonic");
                libc::CLOCK_MONOTONIC
            }
            Clock::MonotonicCoarse => {
                probe!("write.clock.coarse");
                libc::CLOCK_MONOTONIC_COARSE
            }
        };
        let now = clock_reading(id);
        now.as_secs() as f64 + now.subsec_nanos() as f64 * 1e-9
    }
}

/// `clock_gettime(id)`: the clock's time since its epoch (the export's
/// deadline checks read the coarse clock through it too).
pub(crate) fn clock_reading(id: libc::clockid_t) -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into; the clocks asked for
    // exist on every Linux.
    unsafe { libc::clock_gettime(id, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

// ---------------------------------------------------------------------------
// Process id.

static CACHED_PID: AtomicU32 = AtomicU32::new(0);
static ATFORK: Once = Once::new();

extern "C" fn forget_pid_in_child() {
    CACHED_PID.store(0, Ordering::Relaxed);
}

fn os_pid() -> u32 {
    probe!("write.getpid");
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

fn cached_pid() -> u32 {
    let pid = CACHED_PID.load(Ordering::Relaxed);
    if pid != 0 {
        return pid;
    }
    ATFORK.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(forget_pid_in_child)) };
    });
    let pid = os_pid();
    CACHED_PID.store(pid, Ordering::Relaxed);
    pid
}

// ---------------------------------------------------------------------------
// One metric's store in this process (client_ruby's `MetricStore`).

/// What a metric store holds for the process that opened it.
struct ProcessState {
    pid: u32,
    /// The metric's own file; `None` in [`Layout::PerProcess`], where every
    /// metric writes to the client's [`ProcessFile`].
    file: Option<StoreFile>,
    keys: KeyCache,
}

/// How a store's files are cut.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// client_ruby's: one file per metric per process, `metric_<name>___<pid>.bin`.
    #[default]
    PerMetric,
    /// client_ruby's `poc_file_per_process` branch's: one file per process,
    /// `metrics___<pid>.bin`, every key naming its metric in a
    /// `___metric_name` label sorted in among the others.
    PerProcess,
}

/// The one file of this process in [`Layout::PerProcess`].
struct ProcessFile {
    pid: u32,
    file: StoreFile,
}

struct MetricStore {
    def: MetricDef,
    aggregation: ProcessAggregation,
    bucket_bounds: Vec<f64>,
    /// The clock of its timestamps.
    stamps: Clock,
    state: Option<ProcessState>,
}

/// Settings of a [`Client`].
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub dialect: Dialect,
    pub strategies: StrategySet,
    /// Name files with this pid instead of the process's own (op-log replay).
    pub pid_override: Option<u32>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            dialect: Dialect::Uri,
            strategies: StrategySet::compiled_default(),
            pid_override: None,
        }
    }
}

/// A handle to a registered metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricId(usize);

/// The instrumentation client: counters, gauges, histograms and summaries
/// written to a client_ruby-compatible store directory.
pub struct Client {
    dir: PathBuf,
    config: ClientConfig,
    seams: WriteSeams,
    metrics: Vec<MetricStore>,
    layout: Layout,
    /// In [`Layout::PerProcess`], once a metric was written.
    process_file: Option<ProcessFile>,
}

impl Client {
    /// Registers every metric of `registry` against the store in `dir`.
    /// Writes nothing yet; see [`Client::init_unlabeled`].
    pub fn new(dir: &Path, registry: &Registry, config: ClientConfig) -> Result<Client> {
        Client::new_in_layout(dir, registry, config, Layout::PerMetric)
    }

    /// [`Client::new`], writing the store in `layout`.
    pub fn new_in_layout(
        dir: &Path,
        registry: &Registry,
        config: ClientConfig,
        layout: Layout,
    ) -> Result<Client> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create store directory {}", dir.display()))?;
        let seams = Seams::resolve(config.strategies).write;
        let metrics = registry
            .metrics
            .iter()
            .map(|def| MetricStore {
                def: def.clone(),
                aggregation: def.aggregation(),
                bucket_bounds: def.bucket_bounds(),
                stamps: seams.clock_source.for_aggregation(def.aggregation()),
                state: None,
            })
            .collect();
        Ok(Client {
            dir: dir.to_path_buf(),
            seams,
            config,
            metrics,
            layout,
            process_file: None,
        })
    }

    pub fn metric(&self, name: &str) -> Result<MetricId> {
        self.metrics
            .iter()
            .position(|m| m.def.name == name)
            .map(MetricId)
            .ok_or_else(|| anyhow!("metric {name:?} is not registered"))
    }

    /// Writes the zero series of every unlabeled metric, as registering does in client_ruby.
    pub fn init_unlabeled(&mut self) -> Result<()> {
        for i in 0..self.metrics.len() {
            if self.metrics[i].def.labels.is_empty() {
                self.init(MetricId(i), &[])?;
            }
        }
        Ok(())
    }

    /// Writes the zero-valued series of one label set (client_ruby's `init_label_set`).
    pub fn init(&mut self, id: MetricId, labels: &[(&str, &str)]) -> Result<()> {
        let def = &self.metrics[id.0].def;
        let series = series_count(def);
        let kind = def.kind;
        let mut call = self.call(id, labels)?;
        match kind {
            MetricType::Counter | MetricType::Gauge => call.set(0, 0.0),
            // Every bucket, `+Inf`, `sum` / `count`, `sum`, in that order.
            MetricType::Histogram | MetricType::Summary => {
                call.locked(|call| (0..series).try_for_each(|i| call.set(i, 0.0)))
            }
        }
    }

    /// Counter `increment` (by ≥ 0) or gauge `increment`/`decrement`.
    pub fn increment(&mut self, id: MetricId, labels: &[(&str, &str)], by: f64) -> Result<()> {
        let def = &self.metrics[id.0].def;
        match def.kind {
            MetricType::Counter if by < 0.0 => {
                bail!("{}: increment must be a non-negative number", def.name)
            }
            MetricType::Counter | MetricType::Gauge => {}
            _ => bail!("{}: a {} has no increment", def.name, def.kind.name()),
        }
        if self.metrics[id.0].aggregation == ProcessAggregation::MostRecent {
            bail!(
                "{}: the most_recent aggregation does not support increment/decrement",
                def.name
            );
        }
        self.call(id, labels)?.increment(0, by)
    }

    /// Gauge `set`.
    pub fn set(&mut self, id: MetricId, labels: &[(&str, &str)], value: f64) -> Result<()> {
        let def = &self.metrics[id.0].def;
        if def.kind != MetricType::Gauge {
            bail!("{}: only gauges can be set", def.name);
        }
        self.call(id, labels)?.set(0, value)
    }

    /// Histogram or summary `observe`, under the file lock as client_ruby does.
    pub fn observe(&mut self, id: MetricId, labels: &[(&str, &str)], value: f64) -> Result<()> {
        let metric = &self.metrics[id.0];
        let (first, second) = match metric.def.kind {
            // The first bound >= value (client_ruby's bsearch), else +Inf; then `sum`.
            MetricType::Histogram => (
                bucket_of(&metric.bucket_bounds, value),
                metric.def.buckets.len() + 1,
            ),
            // Series `count`, then `sum`.
            MetricType::Summary => (0, 1),
            kind => bail!("{}: a {} cannot observe", metric.def.name, kind.name()),
        };
        self.call(id, labels)?.locked(|call| {
            call.increment(first, 1.0)?;
            call.increment(second, value)
        })
    }

    fn pid(&self) -> u32 {
        let pid = self.seams.pid_source.pid();
        self.config.pid_override.unwrap_or(pid)
    }

    /// One call's view of a metric: this process's state for it, (re)opened
    /// when the pid changed (after fork), and the caller's labels.
    #[inline(always)]
    fn call<'c>(&'c mut self, id: MetricId, labels: &'c [(&'c str, &'c str)]) -> Result<Call<'c>> {
        let pid = self.pid();
        match &self.metrics[id.0].state {
            Some(state) if state.pid == pid => {}
            _ => self.open_state(id, pid)?,
        }
        let WriteSeams {
            key_source,
            lookups,
            clock_reads,
            ..
        } = self.seams;
        let dialect = self.config.dialect;
        let MetricStore {
            def,
            aggregation,
            stamps,
            state,
            ..
        } = &mut self.metrics[id.0];
        let ProcessState { file, keys, .. } = state.as_mut().expect("opened above");
        let file = match file {
            Some(file) => file,
            None => &mut self.process_file.as_mut().expect("opened above").file,
        };
        Ok(Call {
            file,
            series: SeriesKeys {
                def,
                metric_label: (self.layout == Layout::PerProcess).then_some(&def.name),
                pid_label: (*aggregation == ProcessAggregation::All).then_some(pid),
                dialect,
                key_source,
                keys,
                labels,
                set: None,
            },
            lookups,
            timestamp: Timestamp {
                reads: clock_reads,
                clock: *stamps,
                taken: None,
            },
        })
    }

    #[inline(never)]
    fn open_state(&mut self, id: MetricId, pid: u32) -> Result<()> {
        let metric = &mut self.metrics[id.0];
        let file = match self.layout {
            Layout::PerMetric => {
                let path = file_path(&self.dir, &metric.def.name, pid);
                Some(StoreFile::open(&path, self.seams.store_io)?)
            }
            Layout::PerProcess => {
                if self.process_file.as_ref().is_none_or(|f| f.pid != pid) {
                    // Closed before this pid's is opened, as a forked child
                    // drops its parent's.
                    self.process_file = None;
                    let path = process_file_path(&self.dir, &pid.to_string());
                    let file = StoreFile::open(&path, self.seams.store_io)?;
                    self.process_file = Some(ProcessFile { pid, file });
                }
                None
            }
        };
        metric.state = Some(ProcessState {
            pid,
            file,
            keys: KeyCache::default(),
        });
        Ok(())
    }
}

/// One public call (an observe, increment, set or init) on one metric in
/// this process: its file, the store keys of the caller's label set and the
/// call's timestamp. An observe writes two series through one `Call`, so the
/// pid is checked once, the label set found once (`key-cache`) and, with
/// `ClockReads::PerOp`, the clock read once.
struct Call<'c> {
    file: &'c mut StoreFile,
    series: SeriesKeys<'c>,
    lookups: Lookups,
    timestamp: Timestamp,
}

impl Call<'_> {
    /// Runs `f` holding this process's `flock` on the metric's file.
    #[inline]
    fn locked(&mut self, f: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        let fd = self.file.file.as_raw_fd();
        flock(fd, libc::LOCK_EX).context("flock")?;
        let result = f(self);
        flock(fd, libc::LOCK_UN).context("flock")?;
        result
    }

    /// client_ruby's `write_value`: look the key up, write.
    #[inline]
    fn set(&mut self, series: usize, value: f64) -> Result<()> {
        match self.series.remembered(series) {
            Some(pos) => {
                probe!("write.lookup");
                self.file.write_at(pos, value, self.timestamp.get())
            }
            None => self.set_by_key(series, value),
        }
    }

    #[inline(never)]
    fn set_by_key(&mut self, series: usize, value: f64) -> Result<()> {
        let mut key = self.series.key(series)?;
        let pos = key.position(self.file)?;
        self.file.write_at(pos, value, self.timestamp.get())
    }

    /// client_ruby's `increment_value` (one lookup, `Lookups::Once`) or
    /// `read_value` + `write_value` (two). A remembered offset (`key-cache`)
    /// is looked up by reading it, inline; the other lookups stay out of line.
    #[inline(always)]
    fn increment(&mut self, series: usize, by: f64) -> Result<()> {
        let Some(pos) = self.series.remembered(series) else {
            return self.increment_by_key(series, by);
        };
        probe!("write.lookup");
        match self.lookups {
            Lookups::Once => self.file.add_at(pos, by, self.timestamp.get()),
            Lookups::ReadThenWrite => {
                let value = self.file.read_at(pos)?;
                let pos = self.series.remembered(series).expect("remembered above");
                probe!("write.lookup");
                self.file.write_at(pos, value + by, self.timestamp.get())
            }
        }
    }

    #[inline(never)]
    fn increment_by_key(&mut self, series: usize, by: f64) -> Result<()> {
        let mut key = self.series.key(series)?;
        match self.lookups {
            Lookups::Once => {
                let pos = key.position(self.file)?;
                let value = self.file.read_at(pos)?;
                self.file.write_at(pos, value + by, self.timestamp.get())
            }
            Lookups::ReadThenWrite => {
                let read_pos = key.position(self.file)?;
                let value = self.file.read_at(read_pos)?;
                let write_pos = key.position(self.file)?;
                self.file
                    .write_at(write_pos, value + by, self.timestamp.get())
            }
        }
    }
}

/// The store keys of one call's label set, one per series of the metric.
struct SeriesKeys<'c> {
    def: &'c MetricDef,
    /// The `___metric_name` label of [`Layout::PerProcess`] keys.
    metric_label: Option<&'c str>,
    /// The `pid` label of `all`-mode keys.
    pid_label: Option<u32>,
    dialect: Dialect,
    key_source: KeySource,
    keys: &'c mut KeyCache,
    labels: &'c [(&'c str, &'c str)],
    /// With `key-cache`: the label set's place in `keys`, once found.
    set: Option<usize>,
}

impl SeriesKeys<'_> {
    /// The value offset of one series of the label set when it is already
    /// known: the label set is the cache's last one (`key-cache`; it was
    /// validated when cached) and the series' key was looked up before.
    /// Without `key-cache` nothing is cached, so nothing is remembered.
    #[inline]
    fn remembered(&mut self, series: usize) -> Option<usize> {
        let index = match self.set {
            Some(index) => index,
            None => {
                let index = self.keys.last_if_same(self.labels)?;
                self.set = Some(index);
                index
            }
        };
        self.keys.sets[index].series.get(series)?.as_ref()?.position
    }

    /// The store key of one series of the label set (validated). With
    /// `key-cache` it is encoded once per process and borrowed after, and
    /// the label set is looked up once per call.
    fn key(&mut self, series: usize) -> Result<Key<'_>> {
        let SeriesKeys {
            def,
            metric_label,
            pid_label,
            dialect,
            keys,
            labels,
            ..
        } = self;
        let added = Added {
            extra: series_extra(def, series),
            metric: *metric_label,
            pid: *pid_label,
        };
        let encode = || encode_key(labels, added, *dialect);
        if self.key_source == KeySource::EncodePerCall {
            validate_labels(&def.name, &def.labels, labels)?;
            return Ok(Key::Encoded(encode()));
        }
        let index = match self.set {
            Some(index) => index,
            None => {
                let index = keys.label_set(labels, series_count(def), || {
                    validate_labels(&def.name, &def.labels, labels)
                })?;
                self.set = Some(index);
                index
            }
        };
        let key = keys.sets[index].series[series].get_or_insert_with(|| CachedKey {
            bytes: encode().into(),
            position: None,
        });
        Ok(Key::Cached(key))
    }
}

/// The timestamps of one call's writes: which clock, how often it is read.
struct Timestamp {
    reads: ClockReads,
    clock: Clock,
    /// With `ClockReads::PerOp`: the call's reading, once taken.
    taken: Option<f64>,
}

impl Timestamp {
    /// The timestamp of a value this call writes.
    fn get(&mut self) -> f64 {
        match self.reads {
            ClockReads::PerWrite => self.clock.seconds(),
            ClockReads::PerOp => *self.taken.get_or_insert_with(|| self.clock.seconds()),
        }
    }
}

/// The index of the first bound >= `value` in sorted `bounds`, `bounds.len()`
/// (+Inf) when there is none — client_ruby's `bsearch`. Up to 32 bounds it
/// counts the bounds below `value`, the same index for sorted bounds: a
/// compare per bound, none waiting for the one before, where a binary
/// search is a chain of dependent loads and compares.
/// No bound is >= NaN, so NaN counts in +Inf, as in Ruby.
#[inline]
fn bucket_of(bounds: &[f64], value: f64) -> usize {
    if value.is_nan() {
        bounds.len()
    } else if bounds.len() <= 32 {
        bounds.iter().map(|&bound| usize::from(bound < value)).sum()
    } else {
        bounds.partition_point(|&bound| bound < value)
    }
}

/// client_ruby's label validation: the label set has exactly the declared names.
fn validate_labels(metric: &str, declared: &[String], labels: &[(&str, &str)]) -> Result<()> {
    let same_names = labels.len() == declared.len()
        && declared
            .iter()
            .all(|d| labels.iter().filter(|(k, _)| k == d).count() == 1);
    if !same_names {
        let given: Vec<&str> = labels.iter().map(|(k, _)| *k).collect();
        bail!("{metric}: labels {given:?} do not match the declared labels {declared:?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
