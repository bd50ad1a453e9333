//! Stage 2, export: read every process's files of every metric, decode the
//! keys, aggregate across processes, and hand the values to the renderer.
//!
//! This follows client_ruby's `MetricStore#all_values` and `Metric#values`:
//! files are found by name, exactly `metric_<name>___<pid>.bin` (client_ruby's
//! glob `metric_<name>___*` also takes metric `<name>___x`'s files; the
//! `01-exact-glob` upstream patch fixes it the same way), and visited in
//! sorted path order; each entry's key is decoded into a label set; values of one label set
//! are aggregated in file order (`sum` folds left from the first value, `max`
//! and `min` keep the first of equals, `all` keeps the first, `most_recent` the
//! newest timestamp); series keep the order of first appearance.
//!
//! # Seams
//!
//! [`Exporter::new`] takes its [`ExportSeams`] from [`Seams::resolve`] (the
//! table of seams, and why two are combined, is in [`crate::shared::seams`]);
//! nothing below it asks which strategies are on.
//!
//! Bad input never fails a scrape (issue #12): a file that vanished, is not
//! a regular file, stays locked, is corrupt, shrinks while mapped (see
//! [`mapguard`]) or cannot be read is left out whole, an entry whose key
//! does not decode or would not be a valid Prometheus label set is left out
//! alone, and [`Exporter::last_report`] says what was. NaN in `min`/`max`
//! loses to any number, so the result does not depend on file order (Ruby's
//! `Array#max` raises on it).
//!
//! No file costs a scrape more than a bounded share of it (issue #22): each
//! file's entries are staged as they are walked and folded into the scrape
//! only once the whole file was read, so a file that fails halfway counts for
//! nothing without reading any other file again; a locked file is waited for
//! [`LOCK_WAIT`], then set aside and tried once more ([`LOCK_RETRY_WAIT`])
//! after the metric's other files, all lock waits of a scrape together
//! bounded by [`LOCK_WAIT_BUDGET`]; the scrape's deadline is checked inside a
//! file's walk too; and a walk stops at the first entry client_ruby could not
//! have written (a zero key length: see [`crate::format::storefile`]), so a sparse
//! file claiming gigabytes of entries costs nothing.
//!
//! With `Keep::Catalogue`, what is gone is dropped when the catalogue
//! outgrows the live series by `CATALOGUE_SLACK`; order of appearance is
//! recomputed every scrape, so output never depends on history.

pub(crate) mod fileset;
pub mod fold;
pub mod liveness;
mod plan;

pub use crate::export::fileset::Watch as StoreWatch;
use crate::export::fileset::{FileSet, Listed};
use crate::export::liveness::Writers;
use crate::format::formenc;
use crate::format::registry::{is_label_name, MetricDef, MetricType, ProcessAggregation, Registry};
use crate::format::storefile::{
    check_used, entries, flock, strip_padding, Entry, EntryError, HEADER_SIZE,
};
use crate::render;
use crate::shared::mapguard;
use crate::shared::probe::probe;
use crate::shared::seams::{ExportSeams, FileRead, Keep, KeyDecode, Listing, Liveness, Seams};
use crate::shared::strategy::StrategySet;
use crate::shared::values::{
    DecodedLabels, Group, HistogramValue, MetricValues, RenderedText, SummaryValue,
};
use ahash::AHashMap;
use anyhow::{anyhow, bail, Result};
use std::fs::File;
use std::hash::{BuildHasher, Hash, Hasher};
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// The read seam: how one file's entries are read.

/// Why a store file was left out of a scrape (the `reason` of
/// `promlab_store_files_skipped_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileSkip {
    /// Listed, then gone before it could be opened (deleted during the scrape).
    Vanished,
    /// Not a regular file (a FIFO, a directory, a device), by that name.
    NotRegular,
    /// Its `flock` stayed held through both of its waits ([`LOCK_WAIT`],
    /// then [`LOCK_RETRY_WAIT`] after the metric's other files), or the
    /// scrape's [`LOCK_WAIT_BUDGET`] was spent.
    Locked,
    /// Its bytes are not a store file: a bad `used`, an entry that runs past
    /// it, or a file that shrank while read.
    Corrupt,
    /// Opening or reading it failed (permissions, out of descriptors, I/O).
    Unreadable,
    /// The scrape's time budget ran out before it was read, or while it was
    /// walked.
    Deadline,
}

impl FileSkip {
    pub const ALL: [FileSkip; 6] = [
        FileSkip::Vanished,
        FileSkip::NotRegular,
        FileSkip::Locked,
        FileSkip::Corrupt,
        FileSkip::Unreadable,
        FileSkip::Deadline,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FileSkip::Vanished => "vanished",
            FileSkip::NotRegular => "not_regular",
            FileSkip::Locked => "locked",
            FileSkip::Corrupt => "corrupt",
            FileSkip::Unreadable => "unreadable",
            FileSkip::Deadline => "deadline",
        }
    }
}

/// Why one entry was left out of a scrape (the `reason` of
/// `promlab_store_entries_skipped_total`): its series would make Prometheus
/// reject the whole exposition (a real Prometheus 2.42 drops every series of
/// the target for one such line), or has no label set at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntrySkip {
    /// The key does not decode (not ASCII, a bad `%`-escape, an empty or
    /// repeated label name), or is padded with more than the eight spaces
    /// client_ruby writes at most.
    BadKey,
    /// A decoded label name outside `[a-zA-Z_][a-zA-Z0-9_]*`.
    InvalidLabelName,
    /// A decoded label name starting with `__` (`__name__` included):
    /// reserved for Prometheus's own use, and never written by client_ruby,
    /// whose label validation refuses them.
    ReservedLabelName,
    /// A decoded label value that is not UTF-8 (`path=%FF%FE`).
    InvalidLabelValue,
}

impl EntrySkip {
    pub const ALL: [EntrySkip; 4] = [
        EntrySkip::BadKey,
        EntrySkip::InvalidLabelName,
        EntrySkip::ReservedLabelName,
        EntrySkip::InvalidLabelValue,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EntrySkip::BadKey => "bad_key",
            EntrySkip::InvalidLabelName => "invalid_label_name",
            EntrySkip::ReservedLabelName => "reserved_label_name",
            EntrySkip::InvalidLabelValue => "invalid_label_value",
        }
    }
}

/// How long a scrape first waits for one file's `flock`. Writers hold it for
/// one operation (microseconds); a file still locked after this is set aside
/// and tried again after the metric's other files.
pub const LOCK_WAIT: Duration = Duration::from_millis(10);

/// How long the second try of a file set aside waits for its `flock`; still
/// locked, it belongs to a stuck or hostile process and is skipped.
pub const LOCK_RETRY_WAIT: Duration = Duration::from_millis(100);

/// The most one scrape waits for locks in all, whatever the number of locked
/// files: past it every lock is tried once, without waiting. Four files a
/// stuck process holds cost a scrape 250 ms, not the scrape.
pub const LOCK_WAIT_BUDGET: Duration = Duration::from_millis(250);

/// How often a walk looks at the clock: every this many entries, and every
/// [`DEADLINE_CHECK_BYTES`] of keys.
const DEADLINE_CHECK_ENTRIES: usize = 4096;
const DEADLINE_CHECK_BYTES: usize = 16 << 20;

/// The clocks one file's read runs against: how long it may wait for the
/// file's lock (and how long it did), and the scrape's deadline, which its
/// walk checks every [`DEADLINE_CHECK_ENTRIES`] entries or
/// [`DEADLINE_CHECK_BYTES`] bytes.
struct ReadClock {
    /// The longest the file's lock may be waited for (the clock is read
    /// only if the lock is busy).
    lock_wait: Duration,
    lock_waited: Duration,
    deadline: Instant,
    entries: usize,
    bytes: usize,
}

impl ReadClock {
    fn new(lock_wait: Duration, deadline: Instant) -> ReadClock {
        ReadClock {
            lock_wait,
            lock_waited: Duration::ZERO,
            deadline,
            entries: 0,
            bytes: 0,
        }
    }

    /// One more entry of `bytes` walked: fails once the deadline has passed.
    #[inline]
    fn tick(&mut self, bytes: usize) -> FileResult<()> {
        self.entries += 1;
        self.bytes += bytes;
        if self.entries < DEADLINE_CHECK_ENTRIES && self.bytes < DEADLINE_CHECK_BYTES {
            return Ok(());
        }
        self.entries = 0;
        self.bytes = 0;
        if Instant::now() >= self.deadline {
            return Err(FileFailure::new(
                FileSkip::Deadline,
                anyhow!("the scrape's time budget ran out while the file was walked"),
            ));
        }
        Ok(())
    }
}

/// A file that could not be read, and why.
struct FileFailure {
    reason: FileSkip,
    error: anyhow::Error,
}

impl FileFailure {
    fn new(reason: FileSkip, error: impl Into<anyhow::Error>) -> FileFailure {
        FileFailure {
            reason,
            error: error.into(),
        }
    }
}

type FileResult<T> = std::result::Result<T, FileFailure>;

/// Reads store files: the read seam, and what it keeps between files and scrapes.
struct FileReader {
    read: FileRead,
    liveness: Liveness,
    /// The baseline's key buffer; `Mapped`'s read buffer.
    key: Vec<u8>,
    /// `KeptMapped`: per metric, per listed file's slot, the file kept mapped.
    kept: Vec<Vec<Option<KeptFile>>>,
    /// Descriptors kept open (of files with a writer, for their lock) at most.
    fd_limit: usize,
    fds: usize,
    /// Counts scrapes.
    scrape: u64,
    /// The scrape's deadline, checked inside each walk.
    deadline: Instant,
    /// The same deadline on the coarse clock ([`coarse_now`]), checked
    /// before each file; `None` when the scrape has no budget.
    coarse_deadline: Option<Duration>,
    /// Time spent waiting for locks since the exporter last took it.
    lock_waited: Duration,
    /// Counts changes to kept files that a scrape plan depends on: a file
    /// forgotten, read the usual way (mapped again, its writers probed), or
    /// its writers' state changed ([`FileReader::changes`]).
    changes: u64,
}

/// The coarse monotonic clock (the kernel's last tick, a few ms old):
/// checked before each file, where the fine clock's read (~30 ns here) was
/// 15 % of a folded store's scrape, which reads one small file per metric.
fn coarse_now() -> Duration {
    crate::write::clock_reading(libc::CLOCK_MONOTONIC_COARSE)
}

/// A store file kept mapped between scrapes, so a scrape of it is a walk of
/// the mapping (plus, while its writer may be live, the `flock` pair), not an
/// open, a map, page faults, an unmap and a close. The descriptor is closed
/// once the file's writer is known to have exited: a mapping outlives its
/// descriptor, so no descriptor limit bounds how many files are kept.
struct KeptFile {
    /// The inode the listing gave for the slot.
    ino: u64,
    /// `None` while the file is shorter than a header. Shared with a
    /// scrape plan that reads it ([`plan`]), which keeps it mapped while it
    /// holds it.
    map: Option<Arc<memmap2::Mmap>>,
    /// Kept while the file's writer may be live (its lock is taken every scrape).
    fd: Option<KeptFd>,
    writers: Writers,
    /// The scrape of the last liveness probe.
    probed: u64,
}

/// A deadline that never comes.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

impl Drop for KeptFile {
    fn drop(&mut self) {
        if self.map.is_some() {
            KEPT_MAPS.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Descriptors kept by every exporter of this process: the open-file limit
/// is the process's, so [`kept_limit`] bounds them together (several
/// exporters in one process, each keeping its own share, ran out of
/// descriptors and skipped files as unreadable).
static KEPT_FDS: AtomicUsize = AtomicUsize::new(0);

/// A descriptor a [`KeptFile`] keeps, counted in [`KEPT_FDS`] while it lives.
struct KeptFd(File);

impl KeptFd {
    fn new(file: File) -> KeptFd {
        KEPT_FDS.fetch_add(1, Ordering::Relaxed);
        KeptFd(file)
    }
}

impl Drop for KeptFd {
    fn drop(&mut self) {
        KEPT_FDS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Mappings kept by every exporter of this process. Each is one entry of the
/// kernel's per-process map table (`vm.max_map_count`, 65,530 by default),
/// shared with everything else the process maps: past [`map_limit`], files
/// are mapped per scrape instead, and an `mmap` refused for lack of entries
/// lowers the limit to what is kept.
static KEPT_MAPS: AtomicUsize = AtomicUsize::new(0);
static MAP_LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Map entries set aside by [`reserve_maps`] for mappings the exporters do
/// not make.
static RESERVED_MAPS: AtomicUsize = AtomicUsize::new(0);

/// `vm.max_map_count` less 8,192 entries (or half of it, if larger) for the
/// rest of the process — thread stacks, libraries, allocator arenas — and
/// less what [`reserve_maps`] set aside.
fn map_limit() -> usize {
    let limit = MAP_LIMIT.load(Ordering::Relaxed);
    if limit != usize::MAX {
        return limit;
    }
    let max = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(65_530);
    let limit = max
        .saturating_sub(8192)
        .max(max / 2)
        .saturating_sub(RESERVED_MAPS.load(Ordering::Relaxed));
    MAP_LIMIT.store(limit, Ordering::Relaxed);
    limit
}

/// Sets aside `n` entries of the process's map table for mappings of its
/// own, beside its exporters' (a benchmark's floor that maps store files
/// itself), until the reservation is dropped: meanwhile the exporters
/// together keep `n` fewer. Take it before those mappings are made; what the
/// exporters keep already stays kept.
#[must_use = "the entries are set aside until the reservation is dropped"]
pub fn reserve_maps(n: usize) -> MapReservation {
    RESERVED_MAPS.fetch_add(n, Ordering::Relaxed);
    let _ = MAP_LIMIT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |limit| {
        (limit != usize::MAX).then(|| limit.saturating_sub(n))
    });
    MapReservation(n)
}

/// Map entries the exporters of this process may still keep: their limit
/// (`vm.max_map_count` less room for the rest) less what they keep now. A benchmark that holds a floor beside an
/// exporter sizes the floor's own mappings from it ([`reserve_maps`]).
pub fn maps_left() -> usize {
    map_limit().saturating_sub(KEPT_MAPS.load(Ordering::Relaxed))
}

/// Map entries set aside by [`reserve_maps`]; given back when dropped.
#[derive(Debug)]
pub struct MapReservation(usize);

impl Drop for MapReservation {
    fn drop(&mut self) {
        RESERVED_MAPS.fetch_sub(self.0, Ordering::Relaxed);
        let _ = MAP_LIMIT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |limit| {
            (limit != usize::MAX).then(|| limit.saturating_add(self.0))
        });
    }
}

/// How often (in scrapes) a kept file whose writer is live is probed again
/// when no inotify event says its writer closed it.
const PROBE_EVERY: u64 = 64;
/// Exited files of a metric probed again per scrape, in turn, in case a new
/// process was given the dead one's pid and opened its file.
const REPROBES_PER_SCRAPE: usize = 4;

/// How many descriptors `KeptMapped` keeps open (files with a live writer,
/// for their lock): the descriptor limit less 2,048 (a server's connections
/// are capped at 512, and per-scrape opens need some), and at least a quarter
/// of it; past it, such files are opened per scrape.
fn kept_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur
    } else {
        1024
    };
    soft.saturating_sub(2048).max(soft / 4).clamp(16, 1 << 20) as usize
}

/// [`kept_limit`] as the process started scraping: the bound on the
/// descriptors all its exporters keep together ([`KEPT_FDS`]).
fn process_kept_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(kept_limit)
}

/// What a walk of a kept mapping found.
enum KeptWalk {
    Done,
    /// `used` is past the mapping: the file grew (it has a writer); map it again.
    Grew,
    /// No guard slot was free: read it under its lock instead.
    Unguarded,
}

impl FileReader {
    fn new(read: FileRead, liveness: Liveness) -> FileReader {
        FileReader {
            read,
            liveness,
            key: Vec::new(),
            kept: Vec::new(),
            fd_limit: kept_limit(),
            fds: 0,
            scrape: 0,
            deadline: far_future(),
            coarse_deadline: None,
            lock_waited: Duration::ZERO,
            changes: 0,
        }
    }

    /// Whether the scrape's budget has run out (its coarse clock's view: a
    /// budget of zero has run out at once).
    fn deadline_passed(&self) -> bool {
        self.coarse_deadline
            .is_some_and(|deadline| coarse_now() >= deadline)
    }

    /// Reads one store file under `flock` (waiting until `deadline` at most;
    /// with `Leases`, a kept file whose writer has exited without it) and
    /// hands each entry to `visit`, checking the scrape's deadline
    /// (`self.deadline`) as it walks. On failure, `visit` may have seen some
    /// of the file's entries.
    fn read(
        &mut self,
        dir: &Path,
        metric: usize,
        file: &Listed,
        lock_wait: Duration,
        visit: &mut impl FnMut(Entry<'_>),
    ) -> FileResult<()> {
        let mut clock = ReadClock::new(lock_wait, self.deadline);
        let result = match self.read {
            FileRead::EntryByEntry => {
                let key = &mut self.key;
                read_locked(&file.path(dir), &mut clock, |f, clock| {
                    read_entry_by_entry(f, key, clock, visit)
                })
            }
            FileRead::KeptMapped => self.read_kept(dir, metric, file, &mut clock, visit),
            FileRead::Mapped => self.read_once(&file.path(dir), &mut clock, visit),
        };
        self.lock_waited += clock.lock_waited;
        result
    }

    /// `Mapped`: opened, locked, read and closed. A file is read with one
    /// `pread` of its first page, and a second for the rest of its used
    /// region when that is longer, up to 64 KiB (a mapping costs an `mmap`,
    /// page faults and an `munmap`: more than copying a few KiB); a larger
    /// one is mapped. client_ruby's files are 1 MiB from the start, mostly
    /// unused: only `used` bytes are read.
    fn read_once(
        &mut self,
        path: &Path,
        clock: &mut ReadClock,
        visit: &mut impl FnMut(Entry<'_>),
    ) -> FileResult<()> {
        const FIRST: usize = 4096;
        const SMALL: usize = 64 * 1024;
        let buf = &mut self.key;
        read_locked(path, clock, |file, clock| {
            let pread = |buf: &mut [u8], at: usize| loop {
                use std::os::unix::fs::FileExt;
                match file.read_at(buf, at as u64) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(FileFailure::new(FileSkip::Unreadable, e)),
                }
            };
            buf.resize(FIRST, 0);
            // A regular file reads short only at its end.
            let mut n = pread(buf, 0)?;
            if n < 4 {
                // Shorter than a header: being created; empty, as in Ruby.
                return Ok(());
            }
            let used = i32::from_le_bytes(buf[..4].try_into().expect("4 bytes"));
            if n == FIRST && used as usize > FIRST {
                if used as usize > SMALL {
                    return walk_mapped(file, map_file(file)?.as_ref(), clock, visit);
                }
                buf.resize(used as usize, 0);
                n += pread(&mut buf[FIRST..], FIRST)?;
            }
            walk(&buf[..n], clock, visit)
        })
    }

    fn start_scrape(&mut self) {
        self.scrape += 1;
    }

    /// Forgets a file the listing no longer has at that slot (deleted or replaced).
    fn forget(&mut self, metric: usize, slot: u32) {
        self.changes += 1;
        let kept = self
            .kept
            .get_mut(metric)
            .and_then(|files| files.get_mut(slot as usize))
            .and_then(Option::take);
        if kept.is_some_and(|kept| kept.fd.is_some()) {
            self.fds -= 1;
        }
    }

    /// A watched store saw the writer of the file at `slot` close it: probe
    /// it at its next read.
    fn writer_closed(&mut self, metric: usize, slot: u32) {
        let kept = self
            .kept
            .get_mut(metric)
            .and_then(|files| files.get_mut(slot as usize));
        if let Some(Some(kept)) = kept {
            if kept.writers != Writers::None {
                kept.writers = Writers::Unknown;
                self.changes += 1;
            }
        }
    }

    /// The kept mapping of a file whose writers have all exited (`Leases`),
    /// which [`FileReader::read_kept`] reads without its lock.
    fn unlocked_map(&self, metric: usize, listed: &Listed) -> Option<&memmap2::Mmap> {
        self.exited(metric, listed.slot, listed.ino)?
            .map(|map| &**map)
    }

    /// The kept file at `slot` of `metric`, if it is still inode `ino` and
    /// its writers have all exited (`Leases`): its mapping, read without its
    /// lock (`None` inside: it exited before writing a header, so it holds
    /// nothing, for ever).
    fn exited(&self, metric: usize, slot: u32, ino: u64) -> Option<Option<&Arc<memmap2::Mmap>>> {
        if self.read != FileRead::KeptMapped || self.liveness != Liveness::Leases {
            return None;
        }
        let kept = self.kept.get(metric)?.get(slot as usize)?.as_ref()?;
        if kept.ino != ino || kept.writers != Writers::None {
            return None;
        }
        Some(kept.map.as_ref())
    }

    /// Changes whenever a kept file may have: while it stays the same, every
    /// kept file is the inode, mapping and writers' state it was.
    fn changes(&self) -> u64 {
        self.changes
    }

    /// `Leases`: a few exited files are probed again each scrape, in turn;
    /// one found with a writer (a new process given the dead one's pid
    /// reopened it) is read under its lock again. Fold files are not: their
    /// ids are never pids ([`storefile::is_fold_id`], marked when listed), so
    /// no writer opens one (a fold replaces them by rename, under the fold
    /// lock), and a folded store's scrape would otherwise
    /// pay a probe (an open, two lease calls, a close) per metric.
    fn reprobe_exited(&mut self, dir: &Path, metric: usize, files: &[Listed], cursor: &mut usize) {
        if self.liveness != Liveness::Leases || files.is_empty() {
            return;
        }
        for _ in 0..REPROBES_PER_SCRAPE.min(files.len()) {
            *cursor = (*cursor + 1) % files.len();
            let listed = &files[*cursor];
            if listed.fold {
                continue;
            }
            let kept = self
                .kept
                .get_mut(metric)
                .and_then(|files| files.get_mut(listed.slot as usize));
            let Some(Some(kept)) = kept else {
                continue;
            };
            if kept.writers != Writers::None || kept.ino != listed.ino {
                continue;
            }
            if let Ok(file) = open_regular(&listed.path(dir)) {
                probe!("export.exited_reprobed");
                kept.writers = liveness::probe(&file);
                kept.probed = self.scrape;
                if kept.writers != Writers::None {
                    self.changes += 1;
                }
            }
        }
    }

    /// [`FileReader::read`] through a [`KeptFile`].
    fn read_kept(
        &mut self,
        dir: &Path,
        metric: usize,
        listed: &Listed,
        clock: &mut ReadClock,
        visit: &mut impl FnMut(Entry<'_>),
    ) -> FileResult<()> {
        // Whatever follows may map the file again or find a writer.
        self.changes += 1;
        let slot = listed.slot as usize;
        if self.kept.len() <= metric {
            self.kept.resize_with(metric + 1, Vec::new);
        }
        if self.kept[metric].len() <= slot {
            self.kept[metric].resize_with(slot + 1, || None);
        }
        let known = self.kept[metric][slot]
            .as_ref()
            .is_some_and(|kept| kept.ino == listed.ino);
        if !known {
            self.forget(metric, listed.slot);
            let path = listed.path(dir);
            if KEPT_MAPS.load(Ordering::Relaxed) >= map_limit() {
                // No map entries to keep one more: read it as `Mapped` does.
                return self.read_once(&path, clock, visit);
            }
            let file = open_regular(&path)?;
            let map = match map_file(&file) {
                Err(failure) if is_out_of_maps(&failure) => {
                    MAP_LIMIT.store(KEPT_MAPS.load(Ordering::Relaxed), Ordering::Relaxed);
                    drop(file);
                    return self.read_once(&path, clock, visit);
                }
                map => map?,
            };
            if map.is_some() {
                KEPT_MAPS.fetch_add(1, Ordering::Relaxed);
            }
            self.fds += 1;
            self.kept[metric][slot] = Some(KeptFile {
                ino: listed.ino,
                map: map.map(Arc::new),
                fd: Some(KeptFd::new(file)),
                writers: Writers::Unknown,
                probed: 0,
            });
        }
        let kept = self.kept[metric][slot].as_mut().expect("kept above");
        let mut result = Ok(());
        let mut locked = true;
        if self.liveness == Liveness::Leases && kept.writers == Writers::None {
            locked = false;
            if let Some(map) = &kept.map {
                match walk_kept(map, clock, visit) {
                    Ok(KeptWalk::Done) => {}
                    Ok(KeptWalk::Grew) => {
                        kept.writers = Writers::Open;
                        locked = true;
                    }
                    Ok(KeptWalk::Unguarded) => locked = true,
                    Err(failure) => result = Err(failure),
                }
            }
            // (No map: it exited before writing a header; nothing, for ever.)
        }
        if locked {
            result = read_kept_locked(
                kept,
                dir,
                listed,
                clock,
                self.liveness,
                self.scrape,
                &mut self.fds,
                visit,
            );
        }
        if result.is_err() {
            // Read it afresh next time (a faulted mapping holds zero pages).
            self.forget(metric, listed.slot);
            return result;
        }
        // Keep the descriptor only while its lock will be taken again, and
        // within the budget.
        let kept = self.kept[metric][slot].as_mut().expect("kept above");
        let wanted = match self.liveness {
            Liveness::AssumeLive => true,
            Liveness::Leases => kept.writers != Writers::None,
        };
        let over =
            self.fds > self.fd_limit || KEPT_FDS.load(Ordering::Relaxed) > process_kept_limit();
        if kept.fd.is_some() && (!wanted || over) {
            kept.fd = None;
            self.fds -= 1;
        }
        Ok(())
    }
}

/// A kept file read under its lock (client_ruby's protocol), mapped again if
/// it grew; with `Leases`, its writers probed when due.
#[allow(clippy::too_many_arguments)] // the reader's fields, borrowed apart from `kept`
fn read_kept_locked(
    kept: &mut KeptFile,
    dir: &Path,
    listed: &Listed,
    clock: &mut ReadClock,
    seam: Liveness,
    scrape: u64,
    fds: &mut usize,
    visit: &mut impl FnMut(Entry<'_>),
) -> FileResult<()> {
    if kept.fd.is_none() {
        // Opened for this read (the caller keeps it if it may). It was a
        // regular file when first kept, and a file put in its place since has
        // another inode, so the listing gave it another slot: no `fstat`.
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(listed.path(dir))
            .map_err(open_failure)?;
        kept.fd = Some(KeptFd::new(file));
        *fds += 1;
    }
    let file = &kept.fd.as_ref().expect("opened above").0;
    let fd = file.as_raw_fd();
    lock_until(fd, clock)?;
    let map = &mut kept.map;
    let result = (|| {
        if map.is_none() {
            *map = map_file(file)?.map(Arc::new);
            if map.is_some() {
                KEPT_MAPS.fetch_add(1, Ordering::Relaxed);
            }
        }
        let Some(mapped) = map.as_ref() else {
            return Ok(());
        };
        match walk_kept(mapped, clock, visit)? {
            KeptWalk::Done => Ok(()),
            KeptWalk::Unguarded => walk_mapped(file, map.as_deref(), clock, visit),
            KeptWalk::Grew => {
                // Writers grow a file by doubling it: map it again, at the
                // size read under the lock.
                *map = None;
                KEPT_MAPS.fetch_sub(1, Ordering::Relaxed);
                *map = map_file(file)?.map(Arc::new);
                if map.is_some() {
                    KEPT_MAPS.fetch_add(1, Ordering::Relaxed);
                }
                walk_mapped(file, map.as_deref(), clock, visit)
            }
        }
    })();
    let _ = flock(fd, libc::LOCK_UN);
    if result.is_ok()
        && seam == Liveness::Leases
        && (kept.writers == Writers::Unknown || scrape >= kept.probed + PROBE_EVERY)
    {
        kept.writers = liveness::probe(file);
        kept.probed = scrape;
    }
    result
}

/// Whether a failed `mmap` ran out of the process's map entries.
fn is_out_of_maps(failure: &FileFailure) -> bool {
    failure
        .error
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::raw_os_error)
        == Some(libc::ENOMEM)
}

/// Walks a kept mapping, guarded against the file shrinking, unless its
/// `used` is past the mapping (the file grew).
fn walk_kept(
    map: &memmap2::Mmap,
    clock: &mut ReadClock,
    visit: &mut impl FnMut(Entry<'_>),
) -> FileResult<KeptWalk> {
    let walked = mapguard::read_guarded(map, |map| {
        let used = i32::from_le_bytes(map[..4].try_into().expect("4 bytes"));
        if used > 0 && used as u64 > map.len() as u64 {
            return Ok(KeptWalk::Grew);
        }
        walk(map, clock, visit).map(|()| KeptWalk::Done)
    });
    match walked {
        Ok(walked) => walked,
        Err(mapguard::Unguarded::Faulted) => Err(FileFailure::new(
            FileSkip::Corrupt,
            anyhow!("the file shrank while it was read"),
        )),
        Err(mapguard::Unguarded::Unavailable) => Ok(KeptWalk::Unguarded),
    }
}

/// The failure of opening or stat-ing a listed file.
fn open_failure(err: std::io::Error) -> FileFailure {
    let reason = if err.kind() == std::io::ErrorKind::NotFound {
        FileSkip::Vanished
    } else {
        FileSkip::Unreadable
    };
    FileFailure::new(reason, err)
}

/// Opens a store file without blocking (a FIFO's `open` would wait for a
/// writer), and only if it is a regular file. Symlinks are followed, as
/// client_ruby's `File.open` follows them; what they point to must be a
/// regular file.
fn open_regular(path: &Path) -> FileResult<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(open_failure)?;
    let meta = file
        .metadata()
        .map_err(|e| FileFailure::new(FileSkip::Unreadable, e))?;
    if !meta.is_file() {
        return Err(FileFailure::new(
            FileSkip::NotRegular,
            anyhow!("not a regular file"),
        ));
    }
    Ok(file)
}

/// Takes `fd`'s exclusive `flock`, waiting until the clock's lock deadline at
/// most (one try if it has passed), and adds the time it waited to the clock.
fn lock_until(fd: std::os::fd::RawFd, clock: &mut ReadClock) -> FileResult<()> {
    let mut pause = Duration::from_micros(50);
    let mut since: Option<Instant> = None;
    let result = loop {
        match flock(fd, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => {
                probe!("export.file_locked");
                break Ok(());
            }
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                let now = Instant::now();
                let lock_deadline = clock
                    .deadline
                    .min(*since.get_or_insert(now) + clock.lock_wait);
                if now >= lock_deadline {
                    break Err(FileFailure::new(
                        FileSkip::Locked,
                        anyhow!("flock still held after waiting"),
                    ));
                }
                std::thread::sleep(pause.min(lock_deadline - now));
                pause = (pause * 2).min(Duration::from_millis(5));
            }
            Err(err) => break Err(FileFailure::new(FileSkip::Unreadable, err)),
        }
    };
    if let Some(since) = since {
        clock.lock_waited += since.elapsed();
    }
    result
}

/// Opens `path` and runs `read` on it under `flock`.
fn read_locked(
    path: &Path,
    clock: &mut ReadClock,
    read: impl FnOnce(&File, &mut ReadClock) -> FileResult<()>,
) -> FileResult<()> {
    let file = open_regular(path)?;
    let fd = file.as_raw_fd();
    lock_until(fd, clock)?;
    let result = read(&file, clock);
    let _ = flock(fd, libc::LOCK_UN);
    result
}

/// `single-read`: the whole file mapped (the Python and GitLab clients'
/// exporters read it so), `None` if it is shorter than a header (being
/// created by its writer: client_ruby reads it as empty). The mapping is only
/// read under `flock`, with its size read under the lock, and through
/// [`mapguard`]: a file shrunk by someone outside the protocol is a failed
/// read, not a `SIGBUS`.
fn map_file(file: &File) -> FileResult<Option<memmap2::Mmap>> {
    let len = file
        .metadata()
        .map_err(|e| FileFailure::new(FileSkip::Unreadable, e))?
        .len();
    if len < 4 {
        return Ok(None);
    }
    // SAFETY: see above; bounds come from the size read under the lock, and
    // every read of the mapping goes through `mapguard::read_guarded`.
    let map = unsafe { memmap2::MmapOptions::new().len(len as usize).map(file) }
        .map_err(|e| FileFailure::new(FileSkip::Unreadable, e))?;
    Ok(Some(map))
}

/// Walks a mapped file's used region, guarded against the file shrinking.
fn walk_mapped(
    file: &File,
    map: Option<&memmap2::Mmap>,
    clock: &mut ReadClock,
    visit: &mut impl FnMut(Entry<'_>),
) -> FileResult<()> {
    let Some(map) = map else {
        return Ok(());
    };
    match mapguard::read_guarded(map, |map| walk(map, clock, visit)) {
        Ok(walked) => walked,
        Err(mapguard::Unguarded::Faulted) => Err(FileFailure::new(
            FileSkip::Corrupt,
            anyhow!("the file shrank while it was read"),
        )),
        // No guard free (more concurrent readers than slots): read a copy,
        // which cannot fault.
        Err(mapguard::Unguarded::Unavailable) => {
            use std::os::unix::fs::FileExt;
            let mut copy = vec![0u8; map.len()];
            file.read_exact_at(&mut copy, 0).map_err(|e| {
                let reason = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    FileSkip::Corrupt
                } else {
                    FileSkip::Unreadable
                };
                FileFailure::new(reason, e)
            })?;
            walk(&copy, clock, visit)
        }
    }
}

/// Walks a file's bytes (mapped or read) up to `used`, minding the deadline.
fn walk(map: &[u8], clock: &mut ReadClock, visit: &mut impl FnMut(Entry<'_>)) -> FileResult<()> {
    let corrupt = |e| FileFailure::new(FileSkip::Corrupt, e);
    let used =
        check_used(map[..4].try_into().expect("4 bytes"), map.len() as u64).map_err(corrupt)?;
    for entry in entries(map, used) {
        let entry = entry.map_err(|e| corrupt(e.into()))?;
        clock.tick(entry.padded_key.len())?;
        visit(entry);
    }
    Ok(())
}

/// Baseline: as `FileMappedDict` does, one buffered pass to learn the entries'
/// positions, then a second pass that seeks back and reads every entry again.
fn read_entry_by_entry(
    file: &File,
    key: &mut Vec<u8>,
    clock: &mut ReadClock,
    visit: &mut dyn FnMut(Entry<'_>),
) -> FileResult<()> {
    let mut late = None;
    read_entry_by_entry_inner(
        file,
        key,
        &mut |bytes| clock.tick(bytes).map_err(|failure| late = Some(failure)),
        visit,
    )
    .map_err(|e| {
        if let Some(failure) = late.take() {
            return failure;
        }
        // A short read is a file that shrank (or lies about `used`).
        let reason = match e.downcast_ref::<std::io::Error>() {
            Some(io) if io.kind() != std::io::ErrorKind::UnexpectedEof => FileSkip::Unreadable,
            _ => FileSkip::Corrupt,
        };
        FileFailure::new(reason, e)
    })
}

/// The deadline passed during a walk (the failure itself is kept aside).
#[derive(Debug)]
struct Late;

impl std::fmt::Display for Late {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the scrape's time budget ran out")
    }
}

impl std::error::Error for Late {}

fn read_entry_by_entry_inner(
    file: &File,
    key: &mut Vec<u8>,
    tick: &mut dyn FnMut(usize) -> std::result::Result<(), ()>,
    visit: &mut dyn FnMut(Entry<'_>),
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
        reader.seek(SeekFrom::Start(HEADER_SIZE as u64))?;
        let mut pos = HEADER_SIZE;
        while pos < used {
            let at = pos;
            let mut len_bytes = [0u8; 4];
            if at + 4 > used {
                return Err(EntryError::Truncated { at, needs: 4, used }.into());
            }
            reader.read_exact(&mut len_bytes)?;
            let len = i32::from_le_bytes(len_bytes);
            if len < 1 {
                return Err(EntryError::BadLength { at, len }.into());
            }
            let needs = 4 + len as usize + 16;
            if at + needs > used {
                return Err(EntryError::Truncated { at, needs, used }.into());
            }
            if tick(len as usize).is_err() {
                return Err(Late.into());
            }
            key.resize(len as usize, 0);
            reader.read_exact(key)?;
            let mut value_bytes = [0u8; 16];
            reader.read_exact(&mut value_bytes)?;
            let value_offset = at + 4 + len as usize;
            if pass == 0 {
                positions.insert(strip_padding(key).to_vec(), value_offset);
            } else {
                visit(Entry {
                    padded_key: key,
                    value_bytes: &value_bytes,
                    value_offset,
                });
            }
            pos = at + needs;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Series: decoded label sets, grouped, and one scrape's aggregated values.

/// Values of one label set, folded as they arrive in file order (the fold,
/// `crate::export::fold`, folds exited processes' files by the same rule).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Aggregate {
    pub(crate) value: f64,
    pub(crate) timestamp: f64,
}

impl Aggregate {
    pub(crate) fn fold(&mut self, mode: ProcessAggregation, value: f64, timestamp: f64) {
        match mode {
            ProcessAggregation::Sum => self.value += value,
            // Ruby keeps the first of equal values. NaN: Ruby's `Array#max`
            // raises (the scrape fails); here a NaN loses to any number, as
            // in PromQL's `max`, so the result does not depend on file order.
            ProcessAggregation::Max if value > self.value || nan_replaced(self.value, value) => {
                self.value = value
            }
            ProcessAggregation::Min if value < self.value || nan_replaced(self.value, value) => {
                self.value = value
            }
            ProcessAggregation::MostRecent if timestamp > self.timestamp => {
                self.value = value;
                self.timestamp = timestamp;
            }
            _ => {}
        }
    }
}

/// Whether `min`/`max` replace `kept` by `value`: a NaN by a number.
fn nan_replaced(kept: f64, value: f64) -> bool {
    kept.is_nan() && !value.is_nan()
}

/// One decoded label set.
struct Series {
    labels: DecodedLabels,
    /// The group label's value, if the set has it (the last one, if repeated).
    slot: Option<Box<[u8]>>,
}

/// Where a series sits, found once when it is met: what a scrape reads of a
/// series to group and fold it. These sit in a vector of their own (four to a
/// cache line) rather than in [`Series`], whose decoded labels a scrape never
/// reads: a cold scrape read a cache line per series for these two fields.
#[derive(Clone, Copy)]
struct SeriesPlace {
    /// Its group: the label set without the metric's group label (`le` for a
    /// histogram, `quantile` for a summary; none for counters and gauges, whose
    /// groups are their series).
    group: usize,
    /// What its group label's value makes it in its group (a scrape reads
    /// this, not the label value: an allocation of its own per series).
    role: SlotRole,
}

/// A series' place in its group, by its group label's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotRole {
    /// A histogram's declared bucket (its index).
    Bucket(u32),
    /// `le="sum"` / `quantile="sum"`.
    Sum,
    /// A summary's `quantile="count"`.
    Count,
    /// A histogram's `le="+Inf"`.
    Inf,
    /// Anything else (a histogram's undeclared `le`, a counter's series).
    Other,
}

impl SlotRole {
    fn of(def: &MetricDef, slot: Option<&[u8]>) -> SlotRole {
        match (def.kind, slot) {
            // `le="sum"` is the sum whatever the buckets say.
            (MetricType::Histogram | MetricType::Summary, Some(b"sum")) => SlotRole::Sum,
            (MetricType::Summary, Some(b"count")) => SlotRole::Count,
            (MetricType::Histogram, Some(le)) => {
                match def.buckets.iter().position(|b| b.as_bytes() == le) {
                    Some(i) => SlotRole::Bucket(i as u32),
                    None if le == b"+Inf" => SlotRole::Inf,
                    None => SlotRole::Other,
                }
            }
            _ => SlotRole::Other,
        }
    }
}

impl Series {
    /// A histogram series' bucket: Ruby's `label_set[:le].to_s`, so a
    /// missing `le` is the bucket "".
    fn le(&self) -> &[u8] {
        self.slot.as_deref().unwrap_or_default()
    }
}

/// `decode-once`: each distinct raw key, decoded once, with its series.
#[derive(Default)]
struct RawKeys {
    /// Every raw key as first found, padding included, back to back in the
    /// order met: a scrape compares against them in about that order, so the
    /// comparisons read two sequential streams.
    bytes: Vec<u8>,
    /// Per raw key: where its padded bytes start in `bytes`, their length,
    /// its length without padding, and its series.
    spans: Vec<RawKey>,
    index: hashbrown::HashTable<usize>,
    /// Raw-key ids by entry ordinal, per file as of its last read, and in the
    /// file being read. The key at an ordinal is usually the one a hint says
    /// (one comparison of padded bytes finds it, without hashing hundreds of
    /// bytes): a file read before only grows, its entries never move; a file
    /// not read before is hinted by the one read just before it, as processes
    /// running the same code often write the same keys in the same order.
    /// Hints are only guesses: every key is compared in full.
    files: Vec<FileKeys>,
    /// The file read last in this scrape.
    last_read: Option<u32>,
    hint: Vec<usize>,
    this_file: Vec<usize>,
    this_starts: Vec<u32>,
}

/// One file's raw keys as of its last read.
#[derive(Default)]
struct FileKeys {
    /// Raw-key ids by entry ordinal.
    ids: Vec<usize>,
    /// Where each entry starts (its length field), ordinal for ordinal.
    starts: Vec<u32>,
    /// Where the last entry ends, if the file was read whole with no entry
    /// skipped: with `ids` and `starts`, what [`FilePass::replay`] checks the
    /// file against.
    end: Option<u32>,
}

struct RawKey {
    start: usize,
    padded_len: usize,
    key_len: usize,
    series: usize,
}

/// foldhash is markedly faster than ahash's portable fallback on keys of
/// hundreds of bytes.
fn hash_raw_key(key: &[u8]) -> u64 {
    use std::hash::BuildHasher as _;
    foldhash::fast::FixedState::with_seed(0x5eed).hash_one(key)
}

impl RawKeys {
    fn start_file(&mut self, slot: u32) {
        let slot = slot as usize;
        if self.files.len() <= slot {
            self.files.resize_with(slot + 1, FileKeys::default);
        }
        // The file's own list of the last read is its hint, and its buffers
        // take this read's ids and starts: a warm scrape moves lists, not copies.
        let file = &mut self.files[slot];
        let own = std::mem::take(&mut file.ids);
        self.this_starts = std::mem::take(&mut file.starts);
        self.this_starts.clear();
        file.end = None;
        let spare = if own.is_empty() {
            // Not read before (or empty): hinted by the file read just before.
            let mut hint = std::mem::take(&mut self.this_file);
            hint.clear();
            if let Some(last) = self.last_read {
                hint.extend_from_slice(&self.files[last as usize].ids);
            }
            std::mem::replace(&mut self.hint, hint)
        } else {
            std::mem::replace(&mut self.hint, own)
        };
        self.this_file = spare;
        self.this_file.clear();
    }

    /// The file at `slot` was read whole; `replayable` if its layout is one
    /// a scrape may replay (no entry skipped, every key found here).
    fn end_file(&mut self, slot: u32, replayable: bool) {
        let end = match (self.this_file.last(), self.this_starts.last()) {
            (Some(&id), Some(&start)) => start as usize + 4 + self.spans[id].padded_len + 16,
            _ => HEADER_SIZE,
        };
        self.files[slot as usize] = FileKeys {
            ids: std::mem::take(&mut self.this_file),
            starts: std::mem::take(&mut self.this_starts),
            end: replayable.then(|| u32::try_from(end).ok()).flatten(),
        };
        self.last_read = Some(slot);
    }

    /// A file's slot was released: its hints and layout go.
    fn forget(&mut self, slot: u32) {
        if let Some(file) = self.files.get_mut(slot as usize) {
            *file = FileKeys::default();
        }
    }

    /// The layout of the file at `slot` as last read, if replayable.
    fn layout(&self, slot: u32) -> Option<&FileKeys> {
        self.files
            .get(slot as usize)
            .filter(|file| file.end.is_some())
    }

    /// Records that entry's key as the raw key `id`, met at the next ordinal.
    #[inline]
    fn met(&mut self, id: usize, entry: &Entry<'_>) {
        self.this_file.push(id);
        self.this_starts.push(entry.offset() as u32);
    }

    fn end_scrape(&mut self) {
        self.last_read = None;
    }

    fn padded(&self, id: usize) -> &[u8] {
        let span = &self.spans[id];
        &self.bytes[span.start..span.start + span.padded_len]
    }

    fn key(&self, id: usize) -> &[u8] {
        &self.padded(id)[..self.spans[id].key_len]
    }

    /// The series of the entry's key, if the hint for its ordinal is its
    /// padded key (one comparison, without finding where the key ends).
    #[inline]
    fn find_hinted(&mut self, entry: &Entry<'_>) -> Option<usize> {
        let id = *self.hint.get(self.this_file.len())?;
        if self.padded(id) != entry.padded_key {
            return None;
        }
        self.met(id, entry);
        Some(self.spans[id].series)
    }

    /// The series of the entry's raw key `key` (unpadded), if met before.
    fn find(&mut self, entry: &Entry<'_>, key: &[u8]) -> Option<usize> {
        let id = *self
            .index
            .find(hash_raw_key(key), |&id| self.key(id) == key)?;
        self.met(id, entry);
        Some(self.spans[id].series)
    }

    /// Records a raw key not met before (after [`RawKeys::find`] said so).
    fn insert(&mut self, entry: &Entry<'_>, key: &[u8], series: usize) {
        let id = self.spans.len();
        self.spans.push(RawKey {
            start: self.bytes.len(),
            padded_len: entry.padded_key.len(),
            key_len: key.len(),
            series,
        });
        self.bytes.extend_from_slice(entry.padded_key);
        let (bytes, spans) = (&self.bytes, &self.spans);
        self.index.insert_unique(hash_raw_key(key), id, |&id| {
            let span = &spans[id];
            hash_raw_key(&bytes[span.start..span.start + span.key_len])
        });
        self.met(id, entry);
    }
}

/// Every label set of one metric met so far, decoded once and grouped. A
/// one-shot export fills it once; with `prerender`, a long-lived exporter
/// keeps it across scrapes, so a scrape of known keys decodes and escapes
/// nothing.
struct Catalogue {
    /// The metric's group label (`le`, `quantile`), if it has one.
    group_label: Option<&'static [u8]>,
    series: Vec<Series>,
    /// Per series, its group and role (beside `series`, index for index).
    places: Vec<SeriesPlace>,
    by_hash: AHashMap<u64, Vec<usize>>,
    groups: Vec<Group>,
    /// `prerender`: every group's rendered text, in the order met.
    rendered: RenderedText,
    /// Group label sets → group; borrowed from `groups` only by hash, so the
    /// map holds indices.
    group_by_hash: AHashMap<u64, Vec<usize>>,
    raw: RawKeys,
    /// `decode-once`: raw component → decoded, for raw keys not seen before.
    components: formenc::ComponentCache,
    hasher: ahash::RandomState,
    decode: KeyDecode,
    keep: Keep,
}

impl Catalogue {
    fn new(def: &MetricDef, seams: ExportSeams) -> Self {
        let kind = def.kind;
        Catalogue {
            group_label: match kind {
                MetricType::Histogram => Some(b"le"),
                MetricType::Summary => Some(b"quantile"),
                MetricType::Counter | MetricType::Gauge => None,
            },
            series: Vec::new(),
            places: Vec::new(),
            by_hash: AHashMap::new(),
            groups: Vec::new(),
            rendered: RenderedText::new(match seams.keep {
                Keep::Nothing => None,
                Keep::Catalogue => Some(render::rendered_header(def)),
            }),
            group_by_hash: AHashMap::new(),
            raw: RawKeys::default(),
            components: formenc::ComponentCache::default(),
            hasher: ahash::RandomState::with_seeds(1, 2, 3, 4),
            decode: seams.key_decode,
            keep: seams.keep,
        }
    }

    /// The series of an entry's key (a key of `def`'s files).
    fn lookup(&mut self, entry: &Entry<'_>, def: &MetricDef) -> Result<usize, BadEntry> {
        match self.decode {
            KeyDecode::EveryEntry(unescape) => {
                probe!("export.key_decoded");
                let raw = checked_key(entry)?;
                self.find_or_insert(raw, unescape.decode_key(raw), def)
            }
            KeyDecode::OncePerRawKey(unescape) => {
                if let Some(series) = self.raw.find_hinted(entry) {
                    return Ok(series);
                }
                let raw = checked_key(entry)?;
                if let Some(series) = self.raw.find(entry, raw) {
                    return Ok(series);
                }
                probe!("export.key_decoded");
                let decoded = formenc::decode_key_cached(raw, unescape, &mut self.components);
                let series = self.find_or_insert(raw, decoded, def)?;
                self.raw.insert(entry, raw, series);
                Ok(series)
            }
        }
    }

    /// Finds the series of `raw`, decoded, adding it (and its group) if new.
    fn find_or_insert(
        &mut self,
        raw: &[u8],
        decoded: Result<Vec<formenc::Label<'_>>, formenc::KeyError>,
        def: &MetricDef,
    ) -> Result<usize, BadEntry> {
        let decoded = decoded.map_err(|e| BadEntry::new(EntrySkip::BadKey, raw, e))?;
        let hash = self.hash(decoded.iter().map(|(n, v)| (&**n, &**v)));
        if let Some(candidates) = self.by_hash.get(&hash) {
            for &index in candidates {
                let pairs = decoded.iter().map(|(n, v)| (&**n, &**v));
                if same_labels(&self.series[index].labels, pairs) {
                    return Ok(index);
                }
            }
        }
        // Checked once per new label set: Prometheus rejects a whole
        // exposition for one bad label.
        for (name, value) in &decoded {
            if let Some((reason, why)) = label_fault(name, value) {
                let name = String::from_utf8_lossy(name);
                return Err(BadEntry::new(reason, raw, format!("label {name:?}: {why}")));
            }
        }
        let labels: DecodedLabels = decoded
            .into_iter()
            .map(|(n, v)| (n.into_owned().into(), v.into_owned().into()))
            .collect();
        let (group, slot) = self.group_of(&labels, def);
        let role = SlotRole::of(def, slot.as_deref());
        let index = self.series.len();
        self.series.push(Series { labels, slot });
        self.places.push(SeriesPlace { group, role });
        self.by_hash.entry(hash).or_default().push(index);
        Ok(index)
    }

    /// The group of a new series, added if new, and the series' group label value.
    fn group_of(&mut self, labels: &DecodedLabels, def: &MetricDef) -> (usize, Option<Box<[u8]>>) {
        let mut slot = None;
        let mut base: Vec<(&[u8], &[u8])> = Vec::with_capacity(labels.len());
        for (n, v) in labels {
            if Some(&**n) == self.group_label {
                slot = Some(&**v);
            } else {
                base.push((n, v));
            }
        }
        let hash = self.hash(base.iter().copied());
        let found = self.group_by_hash.get(&hash).and_then(|candidates| {
            candidates
                .iter()
                .copied()
                .find(|&g| same_labels(&self.groups[g].labels, base.iter().copied()))
        });
        let group = found.unwrap_or_else(|| {
            probe!("export.group_created");
            let rendered = match self.keep {
                Keep::Nothing => None,
                Keep::Catalogue => Some(render::rendered_lines(
                    &mut self.rendered,
                    def,
                    base.iter().copied(),
                )),
            };
            self.groups.push(Group {
                labels: base
                    .iter()
                    .map(|(n, v)| (Box::from(*n), Box::from(*v)))
                    .collect(),
                rendered,
            });
            let g = self.groups.len() - 1;
            self.group_by_hash.entry(hash).or_default().push(g);
            g
        });
        (group, slot.map(Box::from))
    }

    fn hash<'a>(&self, labels: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> u64 {
        let mut h = self.hasher.build_hasher();
        for (name, value) in labels {
            name.hash(&mut h);
            value.hash(&mut h);
        }
        h.finish()
    }
}

/// Why a decoded label would make Prometheus refuse the exposition, if it
/// would: its name is not a Prometheus label name, or a reserved one (`__`
/// and on: `__name__` would name the series twice), or its value is not UTF-8.
fn label_fault(name: &[u8], value: &[u8]) -> Option<(EntrySkip, &'static str)> {
    if !is_label_name(name) {
        Some((EntrySkip::InvalidLabelName, "not a Prometheus label name"))
    } else if name.starts_with(b"__") {
        Some((
            EntrySkip::ReservedLabelName,
            "names starting with __ are reserved",
        ))
    } else if std::str::from_utf8(value).is_err() {
        Some((EntrySkip::InvalidLabelValue, "the value is not UTF-8"))
    } else {
        None
    }
}

/// The entry's key, unpadded, if padded as client_ruby pads
/// ([`Entry::key_checked`]).
fn checked_key<'a>(entry: &Entry<'a>) -> Result<&'a [u8], BadEntry> {
    entry.key_checked().ok_or_else(|| {
        let padded = entry.padded_key;
        BadEntry::new(
            EntrySkip::BadKey,
            &padded[..padded.len().min(80)],
            "padded with more than the eight spaces client_ruby writes",
        )
    })
}

/// An entry left out of a scrape, and why (for the log).
struct BadEntry {
    reason: EntrySkip,
    detail: String,
}

impl BadEntry {
    fn new(reason: EntrySkip, raw: &[u8], why: impl std::fmt::Display) -> BadEntry {
        // The log gets the start of the key; responses never get it.
        let shown = &raw[..raw.len().min(80)];
        let more = if raw.len() > shown.len() { "…" } else { "" };
        BadEntry {
            reason,
            detail: format!("key {:?}{more}: {why}", String::from_utf8_lossy(shown)),
        }
    }
}

/// Whether `stored` holds exactly these pairs, in this order.
fn same_labels<'a>(
    stored: &DecodedLabels,
    pairs: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])>,
) -> bool {
    stored.len() == pairs.len()
        && stored
            .iter()
            .zip(pairs)
            .all(|((n, v), (n2, v2))| **n == *n2 && **v == *v2)
}

/// One scrape of a metric: its series' values folded in file order, and the
/// series and groups in order of first appearance in this scrape.
#[derive(Default)]
struct Scrape {
    /// Counts scrapes; a series or group was seen in this scrape iff its
    /// `seen` entry equals it.
    number: u32,
    series_seen: Vec<u32>,
    values: Vec<Aggregate>,
    series_order: Vec<usize>,
    /// The `series_order` the groups below were laid out from: a scrape that
    /// met the same series in the same order (a store whose files kept their
    /// entries) keeps them.
    grouped: Vec<usize>,
    group_seen: Vec<u32>,
    /// Per group, while grouping: how many series it has, then where its
    /// next one goes in `members`.
    group_start: Vec<u32>,
    /// Every group's series of this scrape, group after group in
    /// `group_order`, each group's in order: one buffer, read front to back
    /// (a vector per group was a cache miss per group on a cold scrape).
    members: Vec<usize>,
    group_order: Vec<usize>,
    /// Per group of `group_order`: where its series are in `members`.
    group_members: Vec<std::ops::Range<usize>>,
    /// A histogram's groups of this scrape, folded ([`Scrape::fold_histograms`]),
    /// in `group_order`; kept from scrape to scrape so a scrape allocates nothing.
    histograms: Vec<HistogramFold>,
    /// Every group's cumulative declared buckets, back to back.
    buckets: Vec<f64>,
    /// Every group's series of undeclared buckets (series, value), back to back.
    others: Vec<(usize, f64)>,
}

/// One histogram group of a scrape, as client_ruby's `Metric#values` folds it.
struct HistogramFold {
    /// Where its declared buckets start in [`Scrape::buckets`].
    start: usize,
    /// Its undeclared buckets in [`Scrape::others`], in order of first appearance.
    others: std::ops::Range<usize>,
    /// Where `+Inf` prints among them (see [`HistogramValue::inf_at`]).
    inf_at: usize,
    sum: Option<f64>,
    /// The `+Inf` count.
    count: f64,
}

impl Scrape {
    fn start(&mut self) {
        self.number = self.number.wrapping_add(1);
        if self.number == 0 {
            // Wrapped: forget every mark rather than trust an old one.
            self.series_seen.fill(0);
            self.group_seen.fill(0);
            self.number = 1;
        }
        self.series_order.clear();
    }

    /// Folds the staged entries of one file, in order.
    fn add_staged(&mut self, mode: ProcessAggregation, staged: &[StagedEntry]) {
        for (series, bytes) in staged {
            let value = f64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
            let timestamp = f64::from_le_bytes(bytes[8..].try_into().expect("8 bytes"));
            self.add(*series as usize, mode, value, timestamp);
        }
    }

    #[inline]
    fn add(&mut self, series: usize, mode: ProcessAggregation, value: f64, timestamp: f64) {
        if series >= self.series_seen.len() {
            self.series_seen.resize(series + 1, 0);
            self.values.resize(
                series + 1,
                Aggregate {
                    value: 0.0,
                    timestamp: 0.0,
                },
            );
        }
        if self.series_seen[series] != self.number {
            self.series_seen[series] = self.number;
            self.values[series] = Aggregate { value, timestamp };
            self.series_order.push(series);
        } else {
            self.values[series].fold(mode, value, timestamp);
        }
    }

    /// Folds each histogram group's series as client_ruby's `Metric#values`
    /// does: declared buckets by index (made cumulative, as
    /// `accumulate_buckets` does), `le="sum"`, `+Inf` (plus every declared
    /// bucket), and any other `le` in order of first appearance.
    fn fold_histograms(&mut self, declared: usize, catalogue: &Catalogue) {
        self.histograms.clear();
        self.buckets.clear();
        self.others.clear();
        for k in 0..self.group_order.len() {
            let start = self.buckets.len();
            self.buckets.resize(start + declared, 0.0);
            let first_other = self.others.len();
            let (mut sum, mut inf) = (None, None::<(usize, f64)>);
            for at in self.group_members[k].clone() {
                let series = self.members[at];
                let value = self.values[series].value;
                match catalogue.places[series].role {
                    SlotRole::Bucket(i) => self.buckets[start + i as usize] = value,
                    SlotRole::Sum => sum = Some(value),
                    SlotRole::Inf => {
                        let at = self.others.len() - first_other;
                        inf = Some((inf.map_or(at, |(at, _)| at), value));
                    }
                    SlotRole::Count | SlotRole::Other => {
                        let le = catalogue.series[series].le();
                        match self.others[first_other..]
                            .iter_mut()
                            .find(|(other, _)| catalogue.series[*other].le() == le)
                        {
                            Some(other) => other.1 = value,
                            None => self.others.push((series, value)),
                        }
                    }
                }
            }
            let mut acc = 0.0;
            for bucket in &mut self.buckets[start..] {
                let own = *bucket;
                *bucket += acc;
                acc += own;
            }
            let (inf_at, count) = match inf {
                Some((at, value)) => (at, value + acc),
                None => (self.others.len() - first_other, acc),
            };
            self.histograms.push(HistogramFold {
                start,
                others: first_other..self.others.len(),
                inf_at,
                sum,
                count,
            });
        }
    }

    /// Groups this scrape's series, in order of first appearance, unless
    /// the last scrape grouped the same series in the same order (a series'
    /// group never changes).
    fn group(&mut self, catalogue: &Catalogue) {
        if self.series_order == self.grouped {
            return;
        }
        self.grouped.clone_from(&self.series_order);
        self.group_order.clear();
        let groups = catalogue.groups.len();
        self.group_seen.resize(groups, 0);
        self.group_start.resize(groups, 0);
        // Count each group's series (in `group_start`), then lay the groups
        // out in order of first appearance, then place each series.
        for &series in &self.series_order {
            let group = catalogue.places[series].group;
            if self.group_seen[group] != self.number {
                self.group_seen[group] = self.number;
                self.group_start[group] = 0;
                self.group_order.push(group);
            }
            self.group_start[group] += 1;
        }
        let mut next = 0;
        self.group_members.clear();
        for &group in &self.group_order {
            let count = self.group_start[group];
            self.group_start[group] = next;
            self.group_members
                .push(next as usize..(next + count) as usize);
            next += count;
        }
        self.members.clear();
        self.members.resize(next as usize, 0);
        for &series in &self.series_order {
            let at = &mut self.group_start[catalogue.places[series].group];
            self.members[*at as usize] = series;
            *at += 1;
        }
    }
}

// ---------------------------------------------------------------------------
// What the renderer gets: client_ruby's `Metric#values`.

/// One scrape's values, grouped as client_ruby's `Metric#values` does, in
/// `buffers`' vectors.
fn metric_values<'t>(
    def: &MetricDef,
    catalogue: &'t Catalogue,
    scrape: &'t Scrape,
    buffers: &mut ValuesBuffers,
) -> MetricValues<'t> {
    match def.kind {
        MetricType::Counter | MetricType::Gauge => {
            let mut series: Vec<(&Group, f64)> = std::mem::take(&mut buffers.scalar);
            series.extend(scrape.series_order.iter().map(|&series| {
                let group = &catalogue.groups[catalogue.places[series].group];
                (group, scrape.values[series].value)
            }));
            MetricValues::Scalar(series)
        }
        MetricType::Histogram => {
            let mut groups: Vec<HistogramValue> = std::mem::take(&mut buffers.histogram);
            groups.extend(
                scrape
                    .group_order
                    .iter()
                    .zip(&scrape.histograms)
                    .map(|(&g, fold)| HistogramValue {
                        labels: &catalogue.groups[g],
                        buckets: &scrape.buckets[fold.start..fold.start + def.buckets.len()],
                        others: scrape.others[fold.others.clone()]
                            .iter()
                            .map(|&(series, value)| (catalogue.series[series].le(), value))
                            .collect(),
                        inf_at: fold.inf_at,
                        sum: fold.sum,
                        count: fold.count,
                    }),
            );
            MetricValues::Histogram(groups)
        }
        MetricType::Summary => {
            let mut groups: Vec<SummaryValue> = std::mem::take(&mut buffers.summary);
            groups.extend(scrape.group_order.iter().zip(&scrape.group_members).map(
                |(&g, members)| {
                    let mut value = SummaryValue {
                        labels: &catalogue.groups[g],
                        sum: 0.0,
                        count: 0.0,
                    };
                    for &series in &scrape.members[members.clone()] {
                        let v = scrape.values[series].value;
                        match catalogue.places[series].role {
                            SlotRole::Sum => value.sum = v,
                            SlotRole::Count => value.count = v,
                            _ => {}
                        }
                    }
                    value
                },
            ));
            MetricValues::Summary(groups)
        }
    }
}

/// The vectors [`metric_values`] builds in, kept empty between metrics: a
/// vector allocated and freed per metric was a sixth of a scrape of many
/// small metrics (200 one-series metrics: two `malloc`s and two `free`s of
/// some 1,800 instructions a metric).
#[derive(Default)]
struct ValuesBuffers {
    scalar: Vec<(&'static Group, f64)>,
    histogram: Vec<HistogramValue<'static>>,
    summary: Vec<SummaryValue<'static>>,
}

impl ValuesBuffers {
    /// Takes back the vector of values rendered.
    fn keep(&mut self, values: MetricValues<'_>) {
        match values {
            MetricValues::Scalar(v) => self.scalar = emptied(v),
            MetricValues::Histogram(v) => self.histogram = emptied(v),
            MetricValues::Summary(v) => self.summary = emptied(v),
        }
    }
}

/// `v`'s allocation, emptied, for elements of the same layout (here: the
/// same type borrowing for another lifetime). Collecting an empty vector's
/// `into_iter` through `map` reuses its allocation: the standard library
/// collects in place when the layouts match (`emptied_keeps_the_allocation`
/// checks it).
fn emptied<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().map(|_| unreachable!("cleared")).collect()
}

// ---------------------------------------------------------------------------
// The exporter.

/// What the exporter keeps of one metric.
struct MetricState {
    catalogue: Catalogue,
    scrape: Scrape,
    /// Where the re-probing of exited files goes on (`Liveness::Leases`).
    reprobe: usize,
}

/// With `prerender`, a catalogue holding more than this many times the series
/// of the last scrape (and more than the exporter's floor, 1,024 unless set)
/// is started afresh: series that are gone (a process's files deleted, label
/// sets no longer written) are dropped in one go.
const CATALOGUE_SLACK: usize = 2;

/// What one scrape left out, for the log and the exporter's own metrics.
#[derive(Clone, Debug, Default)]
pub struct ScrapeReport {
    /// Files left out: the file, why, and the error (for the log only: it
    /// names paths and offsets).
    pub files: Vec<SkippedFile>,
    /// Entries left out, by reason.
    pub entries: AHashMap<EntrySkip, u64>,
    /// The first few entries left out, with their error (for the log).
    pub entry_details: Vec<(PathBuf, String)>,
}

/// A file a scrape left out.
#[derive(Clone, Debug)]
pub struct SkippedFile {
    pub path: PathBuf,
    pub reason: FileSkip,
    pub error: String,
}

/// Entry errors kept per scrape for the log; the rest are only counted.
const ENTRY_DETAILS_KEPT: usize = 16;

impl ScrapeReport {
    pub fn is_clean(&self) -> bool {
        self.files.is_empty() && self.entries.is_empty()
    }

    /// One line per skipped file and kept entry error, then the counts.
    pub fn log_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .files
            .iter()
            .map(|f| {
                format!(
                    "skipped store file {} ({}): {}",
                    f.path.display(),
                    f.reason.name(),
                    f.error
                )
            })
            .collect();
        for (path, detail) in &self.entry_details {
            lines.push(format!("skipped an entry of {}: {detail}", path.display()));
        }
        for reason in EntrySkip::ALL {
            if let Some(n) = self.entries.get(&reason) {
                lines.push(format!("skipped {n} entries ({})", reason.name()));
            }
        }
        lines
    }

    fn clear(&mut self) {
        self.files.clear();
        self.entries.clear();
        self.entry_details.clear();
    }
}

/// Exports a store directory. Long-lived: a server keeps one across scrapes,
/// and with `prerender` it keeps each metric's decoded, grouped and rendered
/// label sets too.
///
/// Bad files never fail a scrape: a file that vanished, is not a regular
/// file, stays locked, is corrupt or cannot be read is left out (whole: none
/// of its entries count), and so is an entry whose key does not decode or
/// names an invalid label; every other series is served, and
/// [`Exporter::last_report`] says what was left out.
pub struct Exporter {
    dir: PathBuf,
    registry: Registry,
    seams: ExportSeams,
    files: FileSet,
    reader: FileReader,
    metrics: Vec<MetricState>,
    catalogue_floor: usize,
    /// How long one scrape may take before the files not read yet are skipped.
    budget: Option<Duration>,
    /// What this scrape may still wait for locks ([`LOCK_WAIT_BUDGET`]).
    lock_wait_left: Duration,
    /// Entries of the files read but not folded yet (see [`FilePass`]).
    staged: Vec<StagedEntry>,
    /// Boxed: servers hold exporters by value in their enums.
    report: Box<ScrapeReport>,
    values: ValuesBuffers,
    /// The last clean scrape, written down to be replayed as a whole while
    /// the store keeps its shape (see [`plan`]).
    plan: Option<plan::ScrapePlan>,
}

/// One staged entry: its series, and its value and timestamp as stored.
type StagedEntry = (u32, [u8; 16]);

/// Reads one metric's files for [`Exporter::scrape`]: each file into the
/// staging area, with its lock wait taken from the scrape's budget and its
/// skipped entries counted only if the whole file was read.
struct FilePass<'a> {
    dir: &'a Path,
    metric: usize,
    def: &'a MetricDef,
    reader: &'a mut FileReader,
    catalogue: &'a mut Catalogue,
    staged: &'a mut Vec<StagedEntry>,
    report: &'a mut ScrapeReport,
    lock_wait_left: &'a mut Duration,
}

impl FilePass<'_> {
    /// Reads `file` into the staging area, waiting `wait` at most for its
    /// lock (less if the scrape's lock budget or time is short), and returns
    /// where its entries are staged. A corrupt file gets a second try.
    fn read(&mut self, file: &Listed, wait: Duration) -> FileResult<std::ops::Range<usize>> {
        if self.reader.deadline_passed() {
            return Err(FileFailure::new(
                FileSkip::Deadline,
                anyhow!("the scrape's time budget ran out"),
            ));
        }
        if let Some(staged) = self.replay(file) {
            return Ok(staged);
        }
        let mut tries = 0;
        loop {
            tries += 1;
            match self.read_once(file, wait) {
                Err(failure) if failure.reason == FileSkip::Corrupt && tries < 2 => continue,
                result => return result,
            }
        }
    }

    fn read_once(&mut self, file: &Listed, wait: Duration) -> FileResult<std::ops::Range<usize>> {
        let start = self.staged.len();
        let lock_wait = wait.min(*self.lock_wait_left);
        // The file's skipped entries: counted, and the first few kept for the log.
        let mut skipped = [0u64; EntrySkip::ALL.len()];
        let mut details: Vec<String> = Vec::new();
        let room = ENTRY_DETAILS_KEPT.saturating_sub(self.report.entry_details.len());
        let (catalogue, staged, def) = (&mut *self.catalogue, &mut *self.staged, self.def);
        catalogue.raw.start_file(file.slot);
        let read =
            self.reader.read(
                self.dir,
                self.metric,
                file,
                lock_wait,
                &mut |entry| match catalogue.lookup(&entry, def) {
                    Ok(series) => staged.push((series as u32, *entry.value_bytes)),
                    Err(bad) => {
                        skipped[bad.reason as usize] += 1;
                        if details.len() < room {
                            let at = entry.offset();
                            details.push(format!("entry at offset {at}: {}", bad.detail));
                        }
                    }
                },
            );
        *self.lock_wait_left = self
            .lock_wait_left
            .saturating_sub(std::mem::take(&mut self.reader.lock_waited));
        if let Err(failure) = read {
            self.staged.truncate(start);
            return Err(failure);
        }
        // Only keys found through `RawKeys` are recorded where they stood.
        let replayable = skipped.iter().all(|&n| n == 0)
            && matches!(self.catalogue.decode, KeyDecode::OncePerRawKey(_));
        self.catalogue.raw.end_file(file.slot, replayable);
        for (reason, n) in EntrySkip::ALL.into_iter().zip(skipped) {
            if n > 0 {
                *self.report.entries.entry(reason).or_default() += n;
            }
        }
        if !details.is_empty() {
            let path = file.path(self.dir);
            let path_of = |detail| (path.clone(), detail);
            self.report
                .entry_details
                .extend(details.into_iter().map(path_of));
        }
        Ok(start..self.staged.len())
    }

    /// Stages a kept file's entries without walking it, where that reads
    /// what a walk would: its writers have all exited (so it is read without
    /// its lock, [`FileReader::unlocked_map`]), it was last read whole with no
    /// entry skipped, and its `used` and every entry's length and padded key
    /// are still what they were, where they were. A walk finds its entries
    /// by their lengths and its keys' series by a hint, one entry at a time;
    /// this checks the same bytes, as the export floor does, and reads each
    /// value where it was. `None` where it does not hold: the file is read
    /// the usual way, which finds whatever changed.
    fn replay(&mut self, file: &Listed) -> Option<std::ops::Range<usize>> {
        let layout = self.catalogue.raw.layout(file.slot)?;
        let map = self.reader.unlocked_map(self.metric, file)?;
        let (raw, staged) = (&self.catalogue.raw, &mut *self.staged);
        let start = staged.len();
        let mut clock = ReadClock::new(Duration::ZERO, self.reader.deadline);
        let end = layout.end.map(|end| end as usize);
        let replayed = mapguard::read_guarded(map, |map| {
            let header = map[..4].try_into().expect("4 bytes");
            if check_used(header, map.len() as u64).ok() != end {
                return false;
            }
            for (&id, &at) in layout.ids.iter().zip(&layout.starts) {
                // In bounds: the entries tiled the file up to `end` when read.
                let (at, padded) = (at as usize, raw.padded(id));
                let key_at = at + 4;
                let value_at = key_at + padded.len();
                if map[at..key_at] != (padded.len() as u32).to_le_bytes()
                    || map[key_at..value_at] != *padded
                    || clock.tick(padded.len()).is_err()
                {
                    return false;
                }
                let value: [u8; 16] = map[value_at..value_at + 16].try_into().expect("16 bytes");
                staged.push((raw.spans[id].series as u32, value));
            }
            true
        });
        if replayed != Ok(true) {
            staged.truncate(start);
            return None;
        }
        probe!("export.file_replayed");
        self.catalogue.raw.last_read = Some(file.slot);
        Some(start..self.staged.len())
    }

    fn skip(&mut self, file: &Listed, failure: FileFailure) {
        self.report.files.push(SkippedFile {
            path: file.path(self.dir),
            reason: failure.reason,
            error: format!("{:#}", failure.error),
        });
    }
}

impl Exporter {
    pub fn new(dir: &Path, registry: Registry, strategies: StrategySet) -> Exporter {
        let seams = Seams::resolve(strategies).export;
        let metrics = registry
            .metrics
            .iter()
            .map(|def| MetricState {
                catalogue: Catalogue::new(def, seams),
                scrape: Scrape::default(),
                reprobe: 0,
            })
            .collect();
        let names: Vec<String> = registry.metrics.iter().map(|m| m.name.clone()).collect();
        Exporter {
            dir: dir.to_path_buf(),
            files: FileSet::new(dir, &names, seams.listing),
            registry,
            seams,
            reader: FileReader::new(seams.file_read, seams.liveness),
            metrics,
            catalogue_floor: 1024,
            budget: None,
            lock_wait_left: LOCK_WAIT_BUDGET,
            staged: Vec::new(),
            report: Box::default(),
            values: ValuesBuffers::default(),
            plan: None,
        }
    }

    /// An exporter for one scrape: nothing is kept for a next one, so files
    /// are read as `single-read` reads them per scrape (no mapping kept, no
    /// watch), whatever else the strategies keep.
    fn one_shot(mut self) -> Exporter {
        if self.seams.file_read == FileRead::KeptMapped {
            self.seams.file_read = FileRead::Mapped;
            self.seams.listing = Listing::OncePerScrape;
            self.reader = FileReader::new(self.seams.file_read, self.seams.liveness);
            let names: Vec<String> = self
                .registry
                .metrics
                .iter()
                .map(|m| m.name.clone())
                .collect();
            self.files = FileSet::new(&self.dir, &names, self.seams.listing);
        }
        self
    }

    /// Sets the catalogue size under which nothing is dropped (tests use a
    /// small one to drop often).
    #[doc(hidden)]
    pub fn with_catalogue_floor(mut self, floor: usize) -> Exporter {
        self.catalogue_floor = floor;
        self
    }

    /// Bounds each scrape in time: files not read when `budget` has passed,
    /// or still being walked then, are skipped ([`FileSkip::Deadline`]).
    /// Unbounded unless set (lock waits are bounded by [`LOCK_WAIT_BUDGET`]
    /// regardless).
    pub fn with_scrape_budget(mut self, budget: Duration) -> Exporter {
        self.budget = Some(budget);
        self
    }

    #[doc(hidden)]
    pub fn with_kept_limit(mut self, limit: usize) -> Exporter {
        self.reader.fd_limit = limit;
        self
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// What the last scrape left out.
    pub fn last_report(&self) -> &ScrapeReport {
        &self.report
    }

    /// Reads, decodes and aggregates one metric.
    pub fn values(&mut self, def_index: usize) -> Result<MetricValues<'_>> {
        self.report.clear();
        let deadline = self.start_clocks();
        self.begin_scrape()?;
        let _fold_lock = self.files.lock_for_scrape();
        self.scrape(def_index, deadline)?;
        let state = &self.metrics[def_index];
        Ok(metric_values(
            &self.registry.metrics[def_index],
            &state.catalogue,
            &state.scrape,
            &mut self.values,
        ))
    }

    /// Starts a scrape's clocks: its deadline, and its lock wait budget.
    fn start_clocks(&mut self) -> Instant {
        self.lock_wait_left = LOCK_WAIT_BUDGET;
        self.reader.coarse_deadline = self.budget.map(|b| coarse_now() + b);
        self.budget.map_or_else(far_future, |b| Instant::now() + b)
    }

    /// Reads every file of one metric into its scrape, in file order. A file
    /// is folded in only once it was read whole (its entries are staged as
    /// it is walked), so a file that fails counts for nothing; a corrupt one
    /// gets a second try at once (a file that shrank or was replaced while
    /// read usually reads fine the second time), a locked one after the
    /// metric's other files, whose entries then wait staged so every file is
    /// still folded in file order.
    fn scrape(&mut self, def_index: usize, deadline: Instant) -> Result<()> {
        let def = &self.registry.metrics[def_index];
        let mode = def.aggregation();
        let state = &mut self.metrics[def_index];
        let live = state.scrape.series_order.len();
        let start_afresh = match self.seams.keep {
            Keep::Nothing => true,
            Keep::Catalogue => {
                state.catalogue.series.len() > CATALOGUE_SLACK * live.max(self.catalogue_floor)
            }
        };
        if start_afresh {
            state.catalogue = Catalogue::new(def, self.seams);
            state.scrape = Scrape::default();
        }
        let MetricState {
            catalogue,
            scrape,
            reprobe,
        } = state;
        self.files.list(def_index)?;
        for (metric, slot) in self.files.take_released() {
            self.reader.forget(metric, slot);
            catalogue.raw.forget(slot);
        }
        let (files, excluded) = self.files.view(def_index);
        self.reader.deadline = deadline;
        let mut pass = FilePass {
            dir: &self.dir,
            metric: def_index,
            def,
            reader: &mut self.reader,
            catalogue,
            staged: &mut self.staged,
            report: &mut self.report,
            lock_wait_left: &mut self.lock_wait_left,
        };
        scrape.start();
        // Files set aside while locked, and (file, staged range) of the files
        // read after the first of them, waiting to be folded in order.
        let mut set_aside: Vec<usize> = Vec::new();
        let mut waiting: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        for (i, file) in files.iter().enumerate() {
            if !excluded.is_empty() && excluded.get(&*file.name) == Some(&file.ino) {
                // Folded by a batch that committed and is not finished.
                continue;
            }
            match pass.read(file, LOCK_WAIT) {
                Ok(range) if set_aside.is_empty() => {
                    scrape.add_staged(mode, &pass.staged[range]);
                    pass.staged.clear();
                }
                Ok(range) => waiting.push((i, range)),
                Err(failure) if failure.reason == FileSkip::Locked => set_aside.push(i),
                Err(failure) => pass.skip(file, failure),
            }
        }
        for i in set_aside {
            match pass.read(&files[i], LOCK_RETRY_WAIT) {
                Ok(range) => waiting.push((i, range)),
                Err(failure) => pass.skip(&files[i], failure),
            }
        }
        waiting.sort_by_key(|(i, _)| *i);
        for (_, range) in waiting {
            scrape.add_staged(mode, &pass.staged[range]);
        }
        pass.staged.clear();
        self.reader
            .reprobe_exited(&self.dir, def_index, files, reprobe);
        catalogue.raw.end_scrape();
        scrape.group(catalogue);
        if def.kind == MetricType::Histogram {
            scrape.fold_histograms(def.buckets.len(), catalogue);
        }
        Ok(())
    }

    /// Clears `out` and writes the whole exposition into it. Fails only when
    /// the store directory cannot be listed; what was left out is in
    /// [`Exporter::last_report`].
    pub fn export_into(&mut self, out: &mut Vec<u8>) -> Result<()> {
        // A watched store's removal shows as its lost watch (and its listing
        // fails); the `stat` was 5 % of a folded store's scrape.
        if !self.files.watching() && !self.dir.is_dir() {
            bail!("store directory {} does not exist", self.dir.display());
        }
        out.clear();
        self.report.clear();
        let deadline = self.start_clocks();
        self.begin_scrape()?;
        // Without the fold lock: a plan reads only the files it holds
        // mapped, whose bytes a fold does not change (it renames a new fold
        // file in and its sources out), so a fold under way leaves it the
        // store as it was before the fold.
        if self.run_plan(out) {
            return Ok(());
        }
        let _fold_lock = self.files.lock_for_scrape();
        for i in 0..self.registry.metrics.len() {
            self.scrape(i, deadline)?;
            let (def, state) = (&self.registry.metrics[i], &self.metrics[i]);
            let values = metric_values(def, &state.catalogue, &state.scrape, &mut self.values);
            render::write_family(out, def, &values, &state.catalogue.rendered);
            self.values.keep(values);
        }
        // Only a watched store's listing can be known unchanged (the others
        // are listed every scrape), and only kept files are replayed.
        if self.seams.listing == Listing::Watched && self.files.watching() {
            self.plan = plan::ScrapePlan::build(self, out);
        }
        Ok(())
    }

    /// Scrapes by the last scrape's plan, if the listing is as it was and
    /// the plan's checks of every file hold; else drops it.
    fn run_plan(&mut self, out: &mut Vec<u8>) -> bool {
        let Some(plan) = &mut self.plan else {
            return false;
        };
        if plan.generation() != self.files.generation() || !plan.run(&self.reader, out) {
            self.plan = None;
            out.clear();
            return false;
        }
        probe!("export.scrape_planned");
        for &metric in plan.reprobed() {
            let files = self.files.view(metric).0;
            let cursor = &mut self.metrics[metric].reprobe;
            self.reader.reprobe_exited(&self.dir, metric, files, cursor);
        }
        true
    }

    /// Brings the file set up to date; the reader forgets files gone or
    /// replaced. A scrape that reads the listing then holds the fold lock
    /// ([`FileSet::lock_for_scrape`]).
    fn begin_scrape(&mut self) -> Result<()> {
        self.reader.start_scrape();
        self.files.update()?;
        for (metric, slot) in self.files.take_released() {
            self.reader.forget(metric, slot);
            self.metrics[metric].catalogue.raw.forget(slot);
        }
        for (metric, slot) in self.files.take_writer_closed() {
            self.reader.writer_closed(metric, slot);
        }
        Ok(())
    }
}

/// Exports a store directory once; bad files and entries are left out (see
/// [`Exporter`]). [`export_with_report`] also says what was.
pub fn export(dir: &Path, registry: &Registry, strategies: StrategySet) -> Result<Vec<u8>> {
    export_with_report(dir, registry, strategies).map(|(out, _)| out)
}

/// [`export`], with what it left out.
pub fn export_with_report(
    dir: &Path,
    registry: &Registry,
    strategies: StrategySet,
) -> Result<(Vec<u8>, ScrapeReport)> {
    let mut out = Vec::new();
    let mut exporter = Exporter::new(dir, registry.clone(), strategies).one_shot();
    exporter.export_into(&mut out)?;
    Ok((out, *exporter.report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::formenc::Dialect;
    use crate::shared::probe::{counted, Counts, ThreadIo};
    use crate::shared::strategy::{Stage, Strategy};
    use crate::write::{Client, ClientConfig};

    const LABEL_SETS: usize = 200;

    /// A store of two processes that wrote the same `LABEL_SETS` label sets
    /// of one counter (with the baseline: no mapping of its own), and the
    /// bytes their files use.
    fn two_processes() -> (tempfile::TempDir, Registry, u64) {
        let registry = Registry::from_json(
            r#"{"metrics": [{"name": "c_total", "type": "counter", "help": "h", "labels": ["l"]}]}"#,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut used = 0;
        for pid in [1, 2] {
            let config = ClientConfig {
                dialect: Dialect::Uri,
                strategies: StrategySet::NONE,
                pid_override: Some(pid),
            };
            let mut client = Client::new(dir.path(), &registry, config).unwrap();
            let id = client.metric("c_total").unwrap();
            for i in 0..LABEL_SETS {
                let value = format!("set {i} / {}", "x".repeat(100));
                client.increment(id, &[("l", &value)], 1.0).unwrap();
            }
            let path = crate::format::storefile::file_path(dir.path(), "c_total", pid);
            let header = std::fs::read(path).unwrap();
            used += u64::from(u32::from_le_bytes(header[..4].try_into().unwrap()));
        }
        (dir, registry, used)
    }

    /// One scrape: the events it counted and this thread's I/O.
    fn scrape(exporter: &mut Exporter) -> (Counts, ThreadIo) {
        let mut out = Vec::new();
        let ((result, counts), io) = ThreadIo::of(|| counted(|| exporter.export_into(&mut out)));
        result.unwrap();
        assert!(exporter.last_report().is_clean());
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 2 + LABEL_SETS);
        (counts, io)
    }

    /// How many of this process's mappings are of files in `dir`.
    fn mappings_of(dir: &Path) -> usize {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let dir = dir.to_str().unwrap();
        maps.lines().filter(|l| l.contains(dir)).count()
    }

    /// Each export strategy has its effect, counted, under every combination
    /// of the others: how often files are read, which mappings outlive a
    /// scrape, how many keys are decoded and by which decoder, and what a
    /// second scrape builds again.
    #[test]
    fn each_export_strategy_has_its_effect() {
        let (dir, registry, used) = two_processes();
        let entries = 2 * LABEL_SETS as u64;
        for s in StrategySet::combinations(Stage::Export) {
            let mut exporter = Exporter::new(dir.path(), registry.clone(), s);
            let (first, first_io) = scrape(&mut exporter);
            let kept_mappings = mappings_of(dir.path());
            let (second, _) = scrape(&mut exporter);

            // single-read: each file's used region read once (mapped, or
            // pread once per scrape), not twice through read(2).
            if s.contains(Strategy::SingleRead) {
                assert!(
                    first_io.rchar < 2 * used,
                    "{s}: {first_io:?}, {used} bytes used"
                );
            } else {
                assert!(
                    first_io.rchar >= 2 * used,
                    "{s}: {first_io:?}, {used} bytes used"
                );
            }

            // single-read with prerender: the mappings kept for the next
            // scrape, and the directory watched instead of listed again.
            let kept = s.contains(Strategy::SingleRead) && s.contains(Strategy::Prerender);
            assert_eq!(kept_mappings, if kept { 2 } else { 0 }, "{s}");
            assert_eq!(first.get("export.dir_listed"), 1, "{s}: {first:?}");
            let listed_again = if kept { 0 } else { 1 };
            assert_eq!(
                second.get("export.dir_listed"),
                listed_again,
                "{s}: {second:?}"
            );

            // fold-exited, with files kept: both processes have exited, so
            // the next scrape reads their files without taking their locks.
            assert_eq!(first.get("export.file_locked"), 2, "{s}: {first:?}");
            let unlocked = kept && s.contains(Strategy::FoldExited);
            let locked_again = if unlocked { 0 } else { 2 };
            assert_eq!(
                second.get("export.file_locked"),
                locked_again,
                "{s}: {second:?}"
            );

            // decode-once: each distinct raw key decoded once, not each entry;
            // with prerender, not again in the next scrape.
            let once = s.contains(Strategy::DecodeOnce);
            let decoded = if once { LABEL_SETS as u64 } else { entries };
            assert_eq!(first.get("export.key_decoded"), decoded, "{s}: {first:?}");
            let decoded_again = match (once, s.contains(Strategy::Prerender)) {
                (true, true) => 0,
                (true, false) => LABEL_SETS as u64,
                (false, _) => entries,
            };
            assert_eq!(
                second.get("export.key_decoded"),
                decoded_again,
                "{s}: {second:?}"
            );

            // fast-unescape: the fast decoder, and only it, decodes.
            let (fast, reference) = (
                first.get("export.unescape.fast"),
                first.get("export.unescape.reference"),
            );
            if s.contains(Strategy::FastUnescape) {
                assert!(fast > 0 && reference == 0, "{s}: {first:?}");
            } else {
                assert!(fast == 0 && reference > 0, "{s}: {first:?}");
            }

            // prerender: the catalogue (label sets grouped, their pairs
            // rendered) built once, kept for the next scrape.
            assert_eq!(first.get("export.group_created"), LABEL_SETS as u64, "{s}");
            let rebuilt = if s.contains(Strategy::Prerender) {
                0
            } else {
                LABEL_SETS as u64
            };
            assert_eq!(
                second.get("export.group_created"),
                rebuilt,
                "{s}: {second:?}"
            );

            drop(exporter);
            assert_eq!(mappings_of(dir.path()), 0, "{s}: dropped with the exporter");
        }
    }

    #[test]
    fn emptied_keeps_the_allocation() {
        let group = Group {
            labels: Vec::new(),
            rendered: None,
        };
        let mut v: Vec<(&Group, f64)> = Vec::with_capacity(100);
        v.extend((0..100).map(|i| (&group, f64::from(i))));
        let at = v.as_ptr() as usize;
        let back: Vec<(&'static Group, f64)> = emptied(v);
        assert!(back.is_empty());
        assert_eq!((back.as_ptr() as usize, back.capacity()), (at, 100));
    }

    /// A long-lived exporter with leases probes exited processes' files again
    /// in turn (a new process given a dead one's pid may reopen one), but not
    /// fold files, whose ids no process has: a folded store's warm scrape
    /// opens no file.
    #[test]
    fn fold_files_are_not_probed_again() {
        let (dir, registry, _) = two_processes();
        let all = StrategySet::all().restrict(Stage::Export);
        let reprobes = |exporter: &mut Exporter| {
            scrape(exporter);
            (0..3)
                .map(|_| scrape(exporter).0.get("export.exited_reprobed"))
                .sum::<u64>()
        };
        let mut unfolded = Exporter::new(dir.path(), registry.clone(), all);
        assert!(reprobes(&mut unfolded) > 0);
        drop(unfolded);

        let config = crate::export::fold::FoldConfig {
            grace: Duration::ZERO,
            durable: false,
            ..crate::export::fold::FoldConfig::default()
        };
        crate::export::fold::fold_store(dir.path(), &registry, &config).unwrap();
        let files = std::fs::read_dir(dir.path()).unwrap().flatten();
        assert_eq!(
            files.filter(|f| f.path().is_file()).count(),
            1,
            "folded into one file"
        );
        let mut folded = Exporter::new(dir.path(), registry, all);
        assert_eq!(reprobes(&mut folded), 0);
    }

    /// Exited processes' files are replayed (their entries staged from where
    /// they were, keys compared, nothing walked) while each file's `used` and
    /// keys stay put: a value changed in place is read, a file whose `used`
    /// moved is walked again, and every scrape prints what a fresh baseline
    /// export prints. A scrape whose listing did not change since a clean one
    /// runs that scrape's plan instead ([`plan`]); a file closed after writing
    /// (as each change here is) changes the listing.
    #[test]
    fn exited_files_are_replayed_while_their_keys_stay_put() {
        use std::os::unix::fs::FileExt;
        let (dir, registry, _) = two_processes();
        let all = StrategySet::all().restrict(Stage::Export);
        let mut exporter = Exporter::new(dir.path(), registry.clone(), all);
        let check = |exporter: &mut Exporter| {
            let expected = export(dir.path(), &registry, StrategySet::NONE).unwrap();
            let mut out = Vec::new();
            let (result, counts) = counted(|| exporter.export_into(&mut out));
            result.unwrap();
            assert!(exporter.last_report().is_clean());
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&expected)
            );
            (
                counts.get("export.file_replayed"),
                counts.get("export.scrape_planned"),
            )
        };
        assert_eq!(check(&mut exporter), (0, 0), "first read: walked");
        assert_eq!(check(&mut exporter), (0, 1), "nothing changed: planned");

        // Written in place and closed (a file held open for writing has a
        // writer, and is read under its lock).
        let path = crate::format::storefile::file_path(dir.path(), "c_total", 1);
        let write_at = |at: usize, bytes: &[u8]| {
            let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            file.write_all_at(bytes, at as u64).unwrap();
        };
        let bytes = std::fs::read(&path).unwrap();
        let len = u32::from_le_bytes(bytes[HEADER_SIZE..HEADER_SIZE + 4].try_into().unwrap());
        write_at(HEADER_SIZE + 4 + len as usize, &41.5f64.to_le_bytes());
        assert_eq!(check(&mut exporter), (2, 0), "a value changed in place");
        assert!(export(dir.path(), &registry, StrategySet::NONE)
            .unwrap()
            .windows(5)
            .any(|w| w == b"42.5\n"));

        // The last entry given up: `used` moved, so that file is walked.
        let bytes = std::fs::read(&path).unwrap();
        let used = check_used(bytes[..4].try_into().unwrap(), bytes.len() as u64).unwrap();
        let last = entries(&bytes, used).last().unwrap().unwrap().offset() as u32;
        write_at(0, &last.to_le_bytes());
        assert_eq!(check(&mut exporter), (1, 0), "one file walked again");
        assert_eq!(check(&mut exporter), (0, 1), "and planned after");
    }
}
