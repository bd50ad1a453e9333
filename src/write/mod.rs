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
use crate::format::storefile::{self, entries, file_path, flock, HEADER_SIZE, INITIAL_FILE_SIZE};
use crate::shared::mapguard;
use crate::shared::probe::probe;
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
// One process's file for one metric (client_ruby's `FileMappedDict`).

/// How values reach the file: [`StoreIo`], with its mapping.
enum Io {
    /// Seek + read / seek + write per value, as client_ruby does.
    Syscalls,
    /// A shared writable mapping of the whole file.
    Mapped(Mapping),
}

/// The writer's mapping of its file, registered with [`mapguard`] for as
/// long as it is mapped: a page the file no longer has (someone truncated
/// it) is a caught fault, not a `SIGBUS` that kills the application.
struct Mapping {
    /// Declared first: unregistered before the mapping is unmapped.
    guard: mapguard::Guard,
    map: MmapMut,
}

/// Writes between two checks of the file's size (one `fstat`): a file cut
/// within the pages the writer touches faults no page, so it is noticed here.
const WRITES_PER_SIZE_CHECK: u32 = 1024;

/// How often a file shrank under one of this process's writers and was
/// repaired ([`truncations`]).
static FILES_REPAIRED: AtomicU64 = AtomicU64::new(0);
static ENTRIES_RESET: AtomicU64 = AtomicU64::new(0);

/// Store files this process's writers found shrunk under them (someone
/// truncated them: the protocol never does) and repaired, and entries that
/// lost their value doing so. See [`StoreFile`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Truncations {
    pub files_repaired: u64,
    pub entries_reset: u64,
}

/// This process's [`Truncations`] so far.
pub fn truncations() -> Truncations {
    Truncations {
        files_repaired: FILES_REPAIRED.load(Ordering::Relaxed),
        entries_reset: ENTRIES_RESET.load(Ordering::Relaxed),
    }
}

/// Where a writer's owner lock sits: one byte far past any data.
const OWNER_LOCK_AT: i64 = 1 << 62;

/// Claims `file` for this writer for as long as it is open: an OFD write lock
/// on one byte past any data. Two writers sharing one file (one pid: a pid
/// reused inside a container, a copied store, an op log replayed twice)
/// would each append at their own idea of `used` and overwrite each other's
/// entries, losing increments silently; the second one is refused instead.
/// OFD locks and `flock` do not interact on Linux's local filesystems, so the
/// per-operation `flock` that client_ruby's exporter takes is unchanged. On
/// NFS, where `flock` is emulated with byte-range locks of the same owner,
/// the first operation's unlock releases the claim: detection is then
/// best-effort, and never blocks anyone. Kernels or filesystems without OFD
/// locks skip the check.
fn claim_writer(file: &File, path: &Path) -> Result<()> {
    // SAFETY: a zeroed flock struct, filled in; fcntl on a descriptor we hold.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = OWNER_LOCK_AT;
    lock.l_len = 1;
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => bail!(
            "store file {} is already open for writing (another writer with the same pid?); \
             two writers on one file would lose increments",
            path.display()
        ),
        _ => Ok(()),
    }
}

/// One metric's store file, owned by this process.
///
/// # A file shrunk under its writer
///
/// Nothing in the protocol shrinks a store file, but an outsider can (an
/// operator's `truncate` or `> file`, a clean-up script). The writer survives
/// it and repairs the file in place, under either [`StoreIo`]:
/// - **noticed** when a mapped access touches a page the file no longer has
///   (a fault [`mapguard`] catches: the access completes on a throwaway zero
///   page instead of killing the application with `SIGBUS`), when a read
///   through `read(2)` finds the file too short, before a new entry is
///   appended, and every [`WRITES_PER_SIZE_CHECK`] writes (an `fstat`: a cut
///   inside the pages the writer touches faults nothing);
/// - **repaired**: the file is re-extended to its size and every entry the
///   writer knows that the cut reached is written again, key and all, at the
///   offset it had (so cached offsets stay right), with value and timestamp
///   zero; `used` is written back if the header was cut. Entries wholly
///   before the cut keep their values. What the cut removed is lost, for
///   every reader, as it would be under client_ruby (whose next read of a
///   cut entry raises instead);
/// - **the write that noticed it** is then made again, on the repaired file:
///   an increment of a cut series counts from zero, nothing of the call is
///   lost. Writes made between a cut and its notice to a cut entry (possible
///   only within the page holding the new end of the file) are lost with it;
/// - **counted**: [`truncations`] (files repaired, entries reset), which
///   `promlab replay-one` reports on exit.
///
/// A file that keeps shrinking during the repeat of one write fails that
/// write with an error rather than loop.
pub struct StoreFile {
    file: File,
    io: Io,
    path: PathBuf,
    used: usize,
    capacity: u64,
    /// Key → offset of its value (foldhash: fast on keys of hundreds of bytes).
    positions: HashMap<Box<[u8]>, usize, foldhash::fast::RandomState>,
    /// Writes left before the next size check.
    writes_to_check: u32,
    /// Inside [`StoreFile::repeat_after_repair`]: a fault is its loop's to handle.
    repeating: bool,
}

impl StoreFile {
    /// Opens (or creates at 1 MiB) a store file and indexes its entries.
    pub fn open(path: &Path, io: StoreIo) -> Result<StoreFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("cannot open store file {}", path.display()))?;
        claim_writer(&file, path)?;
        let mut capacity = file.metadata()?.len();
        if capacity == 0 {
            file.set_len(INITIAL_FILE_SIZE)?;
            capacity = INITIAL_FILE_SIZE;
        }
        let mut store = StoreFile {
            file,
            io: Io::Syscalls,
            path: path.to_path_buf(),
            used: 0,
            capacity,
            positions: HashMap::default(),
            writes_to_check: WRITES_PER_SIZE_CHECK,
            repeating: false,
        };
        store.with_lock(|s| s.load())?;
        if io == StoreIo::Mapped {
            store.io = store.map()?;
        }
        Ok(store)
    }

    /// The file mapped and guarded; `Syscalls` when no guard is available (a
    /// writer never maps a file it cannot survive losing pages of).
    fn map(&self) -> Result<Io> {
        // SAFETY: the file is this process's own; other processes only read it
        // under flock, as they do with client_ruby's writes. A page the file
        // loses is caught by the guard registered below.
        let map = unsafe { MmapMut::map_mut(&self.file) }
            .with_context(|| format!("cannot map {}", self.path.display()))?;
        Ok(
            match mapguard::Guard::register(map.as_ptr(), map.len(), mapguard::Access::Write) {
                Ok(guard) => Io::Mapped(Mapping { guard, map }),
                Err(_) => Io::Syscalls,
            },
        )
    }

    /// Whether a mapped access since the last check touched a page the file
    /// no longer has.
    #[inline]
    fn faulted(&self) -> bool {
        match &self.io {
            Io::Mapped(m) => m.guard.faulted(),
            Io::Syscalls => false,
        }
    }

    /// [`StoreFile::faulted`], and this access is the one to repeat it.
    #[inline]
    fn must_repeat(&self) -> bool {
        self.faulted() && !self.repeating
    }

    /// Counts a write; every [`WRITES_PER_SIZE_CHECK`] writes, repairs the
    /// file if it shrank.
    #[inline]
    fn count_write(&mut self) -> Result<()> {
        self.writes_to_check -= 1;
        if self.writes_to_check == 0 {
            return self.check_size();
        }
        Ok(())
    }

    /// [`StoreFile::count_write`] after a mapped write, and, if it `faulted`,
    /// the write made again on the repaired file (`write`): one branch for
    /// both rare cases on the hot path.
    #[inline]
    fn after_mapped_write(
        &mut self,
        faulted: bool,
        write: impl Fn(&mut Self) -> Result<()>,
    ) -> Result<()> {
        self.writes_to_check -= 1;
        if faulted || self.writes_to_check == 0 {
            return self.after_mapped_write_rarely(faulted, write);
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn after_mapped_write_rarely(
        &mut self,
        faulted: bool,
        write: impl Fn(&mut Self) -> Result<()>,
    ) -> Result<()> {
        if faulted && !self.repeating {
            return self.repeat_after_repair(write);
        }
        if self.writes_to_check == 0 {
            return self.check_size();
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn check_size(&mut self) -> Result<()> {
        self.writes_to_check = WRITES_PER_SIZE_CHECK;
        self.repair_if_shrunk().map(|_| ())
    }

    /// Repairs the file if it is shorter than the writer made it; whether it was.
    #[inline(never)]
    fn repair_if_shrunk(&mut self) -> Result<bool> {
        let size = self.file.metadata()?.len();
        if size >= self.capacity && !self.faulted() {
            return Ok(false);
        }
        self.repair(size)?;
        Ok(true)
    }

    /// Re-extends a file cut to `size` and writes again, at their offsets,
    /// the entries the cut reached (value and timestamp zero) and the header;
    /// then maps it afresh (see the type's doc). The cut is `size`, or the
    /// first entry whose key is no longer in the file, if that comes first (a
    /// write through `write(2)` past the cut re-extends the file with zeros
    /// before anything notices).
    #[inline(never)]
    fn repair(&mut self, size: u64) -> Result<()> {
        let mapped = matches!(self.io, Io::Mapped(_));
        // Unmapped (and unregistered) first: the pages the guard replaced go with it.
        self.io = Io::Syscalls;
        let mut region = Vec::new();
        self.file.seek(SeekFrom::Start(0))?;
        (&mut self.file)
            .take(size.min(self.used as u64))
            .read_to_end(&mut region)?;
        let mut entries: Vec<(usize, Vec<u8>)> = self
            .positions
            .iter()
            .map(|(key, &value_at)| {
                let entry = storefile::new_entry(key);
                (value_at + 16 - entry.len(), entry)
            })
            .collect();
        entries.sort_unstable();
        let intact = |start: usize, entry: &[u8]| {
            let key = &entry[..entry.len() - 16];
            region.get(start..start + key.len()) == Some(key)
        };
        let cut = entries
            .iter()
            .find(|(start, entry)| !intact(*start, entry))
            .map_or(region.len(), |(start, _)| *start)
            .min(region.len());
        self.file.set_len(self.capacity)?;
        let mut reset = 0;
        for (start, entry) in entries.iter().filter(|(start, e)| start + e.len() > cut) {
            self.file.seek(SeekFrom::Start(*start as u64))?;
            self.file.write_all(entry)?;
            reset += 1;
        }
        if region.get(..4) != Some(&(self.used as i32).to_le_bytes()[..]) {
            self.file.seek(SeekFrom::Start(0))?;
            self.file.write_all(&(self.used as i32).to_le_bytes())?;
        }
        if mapped {
            self.io = self.map()?;
        }
        FILES_REPAIRED.fetch_add(1, Ordering::Relaxed);
        ENTRIES_RESET.fetch_add(reset, Ordering::Relaxed);
        Ok(())
    }

    /// `access`, made again on the repaired file after it met a cut file
    /// (offsets hold across a repair); an error if the file keeps shrinking.
    #[cold]
    #[inline(never)]
    fn repeat_after_repair<T>(&mut self, access: impl Fn(&mut Self) -> Result<T>) -> Result<T> {
        self.repeating = true;
        let out = self.repeat_up_to_3(access);
        self.repeating = false;
        if let Some(out) = out? {
            return Ok(out);
        }
        bail!(
            "store file {} keeps shrinking under its writer (truncated by someone else?)",
            self.path.display()
        )
    }

    /// Reads `used` and every entry's position (an empty file gets `used` = 8).
    fn load(&mut self) -> Result<()> {
        let mut header = [0u8; 4];
        self.file.seek(SeekFrom::Start(0))?;
        self.file.read_exact(&mut header)?;
        let used = i32::from_le_bytes(header);
        if used <= 0 {
            self.used = HEADER_SIZE;
            self.file.seek(SeekFrom::Start(0))?;
            self.file.write_all(&(HEADER_SIZE as i32).to_le_bytes())?;
            return Ok(());
        }
        let used = used as usize;
        if used < HEADER_SIZE || used as u64 > self.capacity {
            bail!(
                "corrupt store file {}: used = {used} outside 8..={}",
                self.path.display(),
                self.capacity
            );
        }
        let mut region = vec![0u8; used];
        self.file.seek(SeekFrom::Start(0))?;
        self.file.read_exact(&mut region)?;
        for entry in entries(&region, used) {
            let entry =
                entry.map_err(|e| anyhow!("corrupt store file {}: {e}", self.path.display()))?;
            self.positions
                .insert(entry.key().into(), entry.value_offset);
        }
        self.used = used;
        Ok(())
    }

    /// Runs `f` holding an exclusive `flock` on the file.
    pub fn with_lock<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let fd = self.file.as_raw_fd();
        flock(fd, libc::LOCK_EX).context("flock")?;
        let result = f(self);
        flock(fd, libc::LOCK_UN).context("flock")?;
        result
    }

    /// The value offset of `key`, appending a zero entry when it is new.
    pub fn position(&mut self, key: &[u8]) -> Result<usize> {
        if let Some(&pos) = self.positions.get(key) {
            return Ok(pos);
        }
        self.append_entry(key)
    }

    fn append_entry(&mut self, key: &[u8]) -> Result<usize> {
        self.repair_if_shrunk()?;
        let entry = storefile::new_entry(key);
        while (self.used + entry.len()) as u64 > self.capacity {
            self.capacity *= 2;
            self.file.set_len(self.capacity)?;
            if let Io::Mapped(_) = self.io {
                self.io = Io::Syscalls;
                self.io = self.map()?;
            }
        }
        let at = self.used;
        self.used += entry.len();
        let pos = self.used - 16;
        // Known from here: a repair writes it again, wherever it is cut.
        self.positions.insert(key.into(), pos);
        self.write_entry(at, &entry)?;
        if self.must_repeat() {
            self.repeat_after_repair(|s| s.write_entry(at, &entry))?;
        }
        Ok(pos)
    }

    fn repeat_up_to_3<T>(&mut self, access: impl Fn(&mut Self) -> Result<T>) -> Result<Option<T>> {
        for _ in 0..3 {
            let size = self.file.metadata()?.len();
            self.repair(size.min(self.capacity))?;
            let out = access(self)?;
            if !self.faulted() {
                return Ok(Some(out));
            }
        }
        Ok(None)
    }

    /// An entry at `at`, then `used` (readers trust `used`: the entry must be
    /// in place before it grows).
    fn write_entry(&mut self, at: usize, entry: &[u8]) -> Result<()> {
        let used_bytes = (self.used as i32).to_le_bytes();
        match &mut self.io {
            Io::Syscalls => {
                self.file.seek(SeekFrom::Start(at as u64))?;
                self.file.write_all(entry)?;
                self.file.seek(SeekFrom::Start(0))?;
                self.file.write_all(&used_bytes)?;
            }
            Io::Mapped(m) => {
                m.map[at..at + entry.len()].copy_from_slice(entry);
                std::sync::atomic::fence(Ordering::Release);
                m.map[..4].copy_from_slice(&used_bytes);
            }
        }
        Ok(())
    }

    /// The value at a value offset. Inlined: through a mapping it is one
    /// load, and the syscalls stay out of line.
    #[inline]
    pub fn read_at(&mut self, pos: usize) -> Result<f64> {
        let value = match &self.io {
            Io::Syscalls => return self.read_by_syscalls(pos),
            Io::Mapped(m) => f64::from_le_bytes(m.map[pos..pos + 8].try_into().expect("8 bytes")),
        };
        if self.must_repeat() {
            return self.repeat_after_repair(|s| s.read_at(pos));
        }
        Ok(value)
    }

    #[inline(never)]
    fn read_by_syscalls(&mut self, pos: usize) -> Result<f64> {
        let mut buf = [0u8; 8];
        self.file.seek(SeekFrom::Start(pos as u64))?;
        match self.file.read_exact(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                // The file was cut before this value.
                self.repair_if_shrunk()?;
                self.file.seek(SeekFrom::Start(pos as u64))?;
                self.file.read_exact(&mut buf)?;
            }
            other => other?,
        }
        Ok(f64::from_le_bytes(buf))
    }

    /// Writes a value and its timestamp (monotonic-clock seconds) at a value
    /// offset. Inlined, like [`StoreFile::read_at`].
    #[inline]
    pub fn write_at(&mut self, pos: usize, value: f64, timestamp: f64) -> Result<()> {
        let mut buf = [0u8; 16];
        buf[..8].copy_from_slice(&value.to_le_bytes());
        buf[8..].copy_from_slice(&timestamp.to_le_bytes());
        match &mut self.io {
            Io::Syscalls => {
                self.write_by_syscalls(pos, &buf)?;
                self.count_write()
            }
            Io::Mapped(m) => {
                m.map[pos..pos + 16].copy_from_slice(&buf);
                let faulted = m.guard.faulted();
                self.after_mapped_write(faulted, |s| s.write_at(pos, value, timestamp))
            }
        }
    }

    /// Adds `by` to the value at a value offset and writes the timestamp
    /// beside it: one read and one write of the same 16 bytes (through a
    /// mapping, one bounds check). Inlined, like [`StoreFile::read_at`].
    #[inline(always)]
    pub fn add_at(&mut self, pos: usize, by: f64, timestamp: f64) -> Result<()> {
        match &mut self.io {
            Io::Syscalls => {
                let value = self.read_by_syscalls(pos)?;
                self.write_at(pos, value + by, timestamp)
            }
            Io::Mapped(m) => {
                let slot: &mut [u8; 16] = (&mut m.map[pos..pos + 16]).try_into().expect("16 bytes");
                let value = f64::from_le_bytes(slot[..8].try_into().expect("8 bytes"));
                slot[..8].copy_from_slice(&(value + by).to_le_bytes());
                slot[8..].copy_from_slice(&timestamp.to_le_bytes());
                let faulted = m.guard.faulted();
                self.after_mapped_write(faulted, |s| s.add_at(pos, by, timestamp))
            }
        }
    }

    #[inline(never)]
    fn write_by_syscalls(&mut self, pos: usize, buf: &[u8; 16]) -> Result<()> {
        self.file.seek(SeekFrom::Start(pos as u64))?;
        self.file.write_all(buf)?;
        self.file.flush()?;
        Ok(())
    }

    pub fn used(&self) -> usize {
        self.used
    }
}

// ---------------------------------------------------------------------------
// Keys: the seam of `key-cache`.

/// The label that a metric type adds to every key (`le`, `quantile`), with its value.
type Extra<'a> = Option<(&'static str, &'a str)>;

/// Sorts `labels` (+ `extra`, + `pid` in `all` mode) by name and form-encodes them.
fn encode_key(
    labels: &[(&str, &str)],
    extra: Extra<'_>,
    pid: Option<u32>,
    dialect: Dialect,
) -> Vec<u8> {
    probe!("write.key_encoded");
    let pid_text = pid.map(|p| p.to_string());
    let mut pairs: Vec<(&[u8], &[u8])> = labels
        .iter()
        .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
        .collect();
    if let Some((k, v)) = extra {
        pairs.push((k.as_bytes(), v.as_bytes()));
    }
    if let Some(p) = &pid_text {
        pairs.push((b"pid", p.as_bytes()));
    }
    pairs.sort_unstable();
    let mut key = Vec::with_capacity(64);
    formenc::encode_key(&mut key, pairs, dialect);
    key
}

/// The series of one label set, numbered: a counter or gauge has one; a
/// histogram one per bucket, then `+Inf`, then `sum`; a summary `count`, `sum`.
fn series_count(def: &MetricDef) -> usize {
    match def.kind {
        MetricType::Counter | MetricType::Gauge => 1,
        MetricType::Histogram => def.buckets.len() + 2,
        MetricType::Summary => 2,
    }
}

/// The extra label of series `series` (see [`series_count`]).
fn series_extra(def: &MetricDef, series: usize) -> Extra<'_> {
    match def.kind {
        MetricType::Counter | MetricType::Gauge => None,
        MetricType::Histogram => Some((
            "le",
            match def.buckets.get(series) {
                Some(bound) => bound,
                None if series == def.buckets.len() => "+Inf",
                None => "sum",
            },
        )),
        MetricType::Summary => Some(("quantile", ["count", "sum"][series])),
    }
}

/// This process's label sets, each with the store keys of its series,
/// encoded on first use. It lives beside the store file in the per-process
/// state, so it is dropped with the file when a forked child reopens its own.
#[derive(Default)]
struct KeyCache {
    /// (hash of the caller's labels, place in `sets`).
    index: hashbrown::HashTable<(u64, usize)>,
    sets: Vec<CachedLabelSet>,
    hasher: foldhash::fast::RandomState,
    /// The place of the label set found last: a caller mostly repeats its
    /// label set, and comparing it costs a third of hashing it (a 195-byte value).
    last: Option<usize>,
}

struct CachedLabelSet {
    labels: Vec<(Box<str>, Box<str>)>,
    /// By series number.
    series: Vec<Option<CachedKey>>,
}

/// One series' key and, once looked up, the offset of its value in this
/// process's file: entries are only ever appended, never moved, so the offset
/// holds for as long as the file (and this cache with it) is open.
struct CachedKey {
    bytes: Box<[u8]>,
    position: Option<usize>,
}

impl KeyCache {
    /// The place of `labels` among the cached label sets; a new one (of
    /// `series` series) is added when `validate` accepts the labels.
    fn label_set(
        &mut self,
        labels: &[(&str, &str)],
        series: usize,
        validate: impl FnOnce() -> Result<()>,
    ) -> Result<usize> {
        if let Some(i) = self.last_if_same(labels) {
            return Ok(i);
        }
        let hash = self.hasher.hash_one(labels);
        let sets = &self.sets;
        let same = |&(h, i): &(u64, usize)| h == hash && same_labels(&sets[i].labels, labels);
        if let Some(&(_, i)) = self.index.find(hash, same) {
            self.last = Some(i);
            return Ok(i);
        }
        validate()?;
        let i = self.sets.len();
        self.sets.push(CachedLabelSet {
            labels: labels
                .iter()
                .map(|(k, v)| (Box::from(*k), Box::from(*v)))
                .collect(),
            series: (0..series).map(|_| None).collect(),
        });
        self.index.insert_unique(hash, (hash, i), |&(h, _)| h);
        self.last = Some(i);
        Ok(i)
    }
}

impl KeyCache {
    /// The place of the label set found last, if `labels` is it.
    #[inline]
    fn last_if_same(&self, labels: &[(&str, &str)]) -> Option<usize> {
        let i = self.last?;
        same_labels(&self.sets[i].labels, labels).then_some(i)
    }
}

/// Whether a cached label set is the caller's, pair by pair.
fn same_labels(cached: &[(Box<str>, Box<str>)], labels: &[(&str, &str)]) -> bool {
    cached.len() == labels.len()
        && cached
            .iter()
            .zip(labels)
            .all(|((k, v), (k2, v2))| &**k == *k2 && &**v == *v2)
}

/// A series' store key as the key seam hands it out.
enum Key<'a> {
    /// Encoded for this call (the baseline).
    Encoded(Vec<u8>),
    /// This process's cached key (`key-cache`).
    Cached(&'a mut CachedKey),
}

impl Key<'_> {
    /// One lookup of the key's value offset in `file`, appending a zero entry
    /// when the key is new: by its bytes in the file's index, or, for a cached
    /// key that was looked up before, the offset it remembers.
    fn position(&mut self, file: &mut StoreFile) -> Result<usize> {
        probe!("write.lookup");
        match self {
            Key::Encoded(bytes) => file.position(bytes),
            Key::Cached(key) => match key.position {
                Some(pos) => Ok(pos),
                None => {
                    let pos = file.position(&key.bytes)?;
                    key.position = Some(pos);
                    Ok(pos)
                }
            },
        }
    }
}

// ---------------------------------------------------------------------------
// One metric's store in this process (client_ruby's `MetricStore`).

/// What a metric store holds for the process that opened it.
struct ProcessState {
    pid: u32,
    file: StoreFile,
    keys: KeyCache,
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
}

impl Client {
    /// Registers every metric of `registry` against the store in `dir`.
    /// Writes nothing yet; see [`Client::init_unlabeled`].
    pub fn new(dir: &Path, registry: &Registry, config: ClientConfig) -> Result<Client> {
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
        Ok(Call {
            file,
            series: SeriesKeys {
                def,
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
        let path = file_path(&self.dir, &metric.def.name, pid);
        let file = StoreFile::open(&path, self.seams.store_io)?;
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
            pid_label,
            dialect,
            keys,
            labels,
            ..
        } = self;
        let encode = || encode_key(labels, series_extra(def, series), *pid_label, *dialect);
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
mod tests {
    use super::*;

    use crate::shared::probe::{counted, Counts, ThreadIo};
    use crate::shared::strategy::{Stage, Strategy};

    /// One kind of public call, repeated by [`costs_of`].
    #[derive(Clone, Copy, Debug)]
    enum Op {
        /// A counter's increment (aggregation `sum`).
        Increment,
        /// A histogram's observe (aggregation `sum`): two series written.
        Observe,
        /// A `most_recent` gauge's set.
        SetMostRecent,
    }

    const REPEATS: u64 = 10;

    /// What `REPEATS` calls of `op` cost after a first one (which opens the
    /// file and caches what a strategy caches): the events counted, and this
    /// thread's I/O.
    fn costs_of(strategies: StrategySet, op: Op) -> (Counts, ThreadIo) {
        let registry = Registry::from_json(
            r#"{"metrics": [
                {"name": "c_total", "type": "counter", "help": "h", "labels": ["l"]},
                {"name": "h_seconds", "type": "histogram", "help": "h", "labels": ["l"],
                 "buckets": ["1.0"], "aggregation": "sum"},
                {"name": "g_recent", "type": "gauge", "help": "h", "labels": ["l"],
                 "aggregation": "most_recent"}]}"#,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let config = ClientConfig {
            dialect: Dialect::Uri,
            strategies,
            pid_override: None,
        };
        let mut client = Client::new(dir.path(), &registry, config).unwrap();
        let labels = [("l", "x")];
        let call = |client: &mut Client| match op {
            Op::Increment => {
                let id = client.metric("c_total").unwrap();
                client.increment(id, &labels, 1.0).unwrap()
            }
            Op::Observe => {
                let id = client.metric("h_seconds").unwrap();
                client.observe(id, &labels, 0.5).unwrap()
            }
            Op::SetMostRecent => {
                let id = client.metric("g_recent").unwrap();
                client.set(id, &labels, 2.0).unwrap()
            }
        };
        call(&mut client);
        let ((_, counts), io) =
            ThreadIo::of(|| counted(|| (0..REPEATS).for_each(|_| call(&mut client))));
        (counts, io)
    }

    /// Each write strategy has its effect, counted, under every combination
    /// of the others: the key encodings, value lookups, `getpid`s, clock
    /// reads (and which clock) and I/O syscalls of repeated calls.
    #[test]
    fn each_write_strategy_has_its_effect() {
        let n = REPEATS;
        for s in StrategySet::combinations(Stage::Write) {
            let (inc, inc_io) = costs_of(s, Op::Increment);
            let (obs, _) = costs_of(s, Op::Observe);
            let (set, _) = costs_of(s, Op::SetMostRecent);
            let clock_reads =
                |c: &Counts| c.get("write.clock.monotonic") + c.get("write.clock.coarse");

            // key-cache: keys encoded once per process, not per call.
            let encoded = if s.contains(Strategy::KeyCache) { 0 } else { 1 };
            assert_eq!(inc.get("write.key_encoded"), encoded * n, "{s}: {inc:?}");
            assert_eq!(
                obs.get("write.key_encoded"),
                2 * encoded * n,
                "{s}: {obs:?}"
            );

            // increment-once: one value lookup per increment, not two; a set makes one.
            let lookups = if s.contains(Strategy::IncrementOnce) {
                1
            } else {
                2
            };
            assert_eq!(inc.get("write.lookup"), lookups * n, "{s}: {inc:?}");
            assert_eq!(obs.get("write.lookup"), 2 * lookups * n, "{s}: {obs:?}");
            assert_eq!(set.get("write.lookup"), n, "{s}: {set:?}");

            // cached-pid: the pid asked of the OS once per process, not per call.
            let asked = if s.contains(Strategy::CachedPid) {
                0
            } else {
                n
            };
            assert_eq!(inc.get("write.getpid"), asked, "{s}: {inc:?}");

            // clock-once: one clock reading per observe, not one per value written.
            let per_observe = if s.contains(Strategy::ClockOnce) {
                1
            } else {
                2
            };
            assert_eq!(clock_reads(&obs), per_observe * n, "{s}: {obs:?}");
            assert_eq!(clock_reads(&inc), n, "{s}: {inc:?}");

            // coarse-clock: the coarse clock wherever timestamps are discarded
            // (sum), the precise one where they are compared (most_recent).
            let coarse = s.contains(Strategy::CoarseClock);
            for (counts, discarded) in [(&inc, true), (&obs, true), (&set, false)] {
                let (precise, rough) = (
                    counts.get("write.clock.monotonic"),
                    counts.get("write.clock.coarse"),
                );
                if coarse && discarded {
                    assert!(precise == 0 && rough > 0, "{s}: {counts:?}");
                } else {
                    assert!(precise > 0 && rough == 0, "{s}: {counts:?}");
                }
            }

            // mmap-store: values through the mapping, no read or write syscall;
            // without it a read and a write per increment.
            if s.contains(Strategy::MmapStore) {
                assert_eq!((inc_io.syscr, inc_io.syscw), (0, 0), "{s}: {inc_io:?}");
            } else {
                assert!(inc_io.syscr >= n && inc_io.syscw >= n, "{s}: {inc_io:?}");
            }
        }
    }

    /// A file cut under its writer, to nothing and inside an entry, under
    /// every write combination: the writer repairs it in place, the entries
    /// the cut reached start again from zero, the others keep their values,
    /// and the write that met the cut is made (see [`StoreFile`]).
    #[test]
    fn a_file_cut_under_its_writer_is_repaired_in_place() {
        let registry = Registry::from_json(
            r#"{"metrics": [{"name": "c_total", "type": "counter", "help": "h", "labels": ["l"]}]}"#,
        )
        .unwrap();
        for strategies in StrategySet::combinations(Stage::Write) {
            let dir = tempfile::tempdir().unwrap();
            let config = ClientConfig {
                dialect: Dialect::Uri,
                strategies,
                pid_override: Some(99),
            };
            let mut client = Client::new(dir.path(), &registry, config).unwrap();
            let c = client.metric("c_total").unwrap();
            let path = storefile::file_path(dir.path(), "c_total", 99);
            let values = || -> Vec<(Vec<u8>, f64)> {
                let bytes = std::fs::read(&path).unwrap();
                crate::reference::exposition::read_entries(&bytes)
                    .unwrap()
                    .into_iter()
                    .map(|e| (e.key, e.value))
                    .collect()
            };
            let cut = |len: u64| {
                OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_len(len)
                    .unwrap()
            };
            for _ in 0..10 {
                client.increment(c, &[("l", "a")], 1.0).unwrap();
            }
            client.increment(c, &[("l", "b")], 5.0).unwrap();
            let before = truncations();
            cut(0);
            client.increment(c, &[("l", "a")], 1.0).unwrap();
            assert_eq!(
                values(),
                [(b"l=a".to_vec(), 1.0), (b"l=b".to_vec(), 0.0)],
                "{strategies}"
            );
            assert_eq!(std::fs::metadata(&path).unwrap().len(), INITIAL_FILE_SIZE);
            // Inside b's key: a is whole; noticed before the next entry is appended.
            cut(8 + 16 + 8 + 6);
            client.increment(c, &[("l", "a")], 1.0).unwrap();
            client.increment(c, &[("l", "c")], 1.0).unwrap();
            client.increment(c, &[("l", "b")], 2.0).unwrap();
            assert_eq!(
                values(),
                [
                    (b"l=a".to_vec(), 2.0),
                    (b"l=b".to_vec(), 2.0),
                    (b"l=c".to_vec(), 1.0)
                ],
                "{strategies}"
            );
            let after = truncations();
            // Other tests' writers may count too; this one repaired twice.
            assert!(
                after.files_repaired >= before.files_repaired + 2,
                "{strategies}"
            );
            assert!(
                after.entries_reset >= before.entries_reset + 3,
                "{strategies}"
            );
        }
    }

    #[test]
    fn key_cache_finds_each_label_set_whichever_came_last() {
        let mut cache = KeyCache::default();
        let ok = || Ok(());
        let a = cache
            .label_set(&[("statement", "SELECT 1")], 1, ok)
            .unwrap();
        let b = cache
            .label_set(&[("statement", "SELECT 2")], 1, ok)
            .unwrap();
        assert_ne!(a, b);
        // The last set is compared, not trusted: same length, other bytes.
        assert_eq!(
            cache
                .label_set(&[("statement", "SELECT 1")], 1, ok)
                .unwrap(),
            a
        );
        assert_eq!(
            cache
                .label_set(&[("statement", "SELECT 1")], 1, ok)
                .unwrap(),
            a
        );
        assert_eq!(
            cache
                .label_set(&[("statement", "SELECT 2")], 1, ok)
                .unwrap(),
            b
        );
        let mut reused = String::from("SELECT 1");
        assert_eq!(
            cache.label_set(&[("statement", &reused)], 1, ok).unwrap(),
            a
        );
        reused.replace_range(7.., "2");
        assert_eq!(
            cache.label_set(&[("statement", &reused)], 1, ok).unwrap(),
            b
        );
        assert_eq!(cache.sets.len(), 2);
    }

    /// The timestamps of a histogram's bucket and sum after each of three observes.
    fn observe_timestamps(strategies: StrategySet) -> Vec<(f64, f64)> {
        let registry = Registry::from_json(
            r#"{"metrics": [{"name": "t_seconds", "type": "histogram", "help": "h",
                "labels": ["l"], "buckets": ["1.0"], "aggregation": "sum"}]}"#,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let config = ClientConfig {
            dialect: Dialect::Uri,
            strategies,
            pid_override: Some(4242),
        };
        let mut client = Client::new(dir.path(), &registry, config).unwrap();
        let id = client.metric("t_seconds").unwrap();
        let path = file_path(dir.path(), "t_seconds", 4242);
        (0..3)
            .map(|_| {
                client.observe(id, &[("l", "x")], 0.5).unwrap();
                let bytes = std::fs::read(&path).unwrap();
                let used = i32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
                let stamps: Vec<f64> = entries(&bytes, used)
                    .map(|e| e.unwrap().timestamp())
                    .collect();
                // Series `le=1.0` (the bucket observed), `+Inf`, `sum`, in order of first write.
                assert_eq!(stamps.len(), 2, "bucket and sum");
                (stamps[0], stamps[1])
            })
            .collect()
    }

    /// Ruby's `buckets.bsearch { |b| b >= value }` finds no bucket for NaN, so
    /// client_ruby counts a NaN observation in `+Inf` (and the sum turns NaN).
    #[test]
    fn a_nan_observation_counts_in_the_inf_bucket_as_in_client_ruby() {
        let registry = Registry::from_json(
            r#"{"metrics": [{"name": "t_seconds", "type": "histogram", "help": "h",
                "labels": ["l"], "buckets": ["0.5", "1.0"], "aggregation": "sum"}]}"#,
        )
        .unwrap();
        for strategies in StrategySet::combinations(Stage::Write) {
            let dir = tempfile::tempdir().unwrap();
            let config = ClientConfig {
                dialect: Dialect::Uri,
                strategies,
                pid_override: Some(4242),
            };
            let mut client = Client::new(dir.path(), &registry, config).unwrap();
            let id = client.metric("t_seconds").unwrap();
            client.observe(id, &[("l", "x")], f64::NAN).unwrap();
            client.observe(id, &[("l", "x")], 0.75).unwrap();
            let bytes = std::fs::read(file_path(dir.path(), "t_seconds", 4242)).unwrap();
            let used = i32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
            let written: Vec<(String, f64)> = entries(&bytes, used)
                .map(|e| e.unwrap())
                .map(|e| (String::from_utf8_lossy(e.key()).into_owned(), e.value()))
                .collect();
            let le = |key: &str| key.rsplit("le=").next().unwrap().to_owned();
            let les: Vec<String> = written.iter().map(|(k, _)| le(k)).collect();
            assert_eq!(les, ["%2BInf", "sum", "1.0"], "{strategies:?}: {written:?}");
            assert_eq!(written[0].1, 1.0);
            assert!(written[1].1.is_nan());
        }
    }

    /// An observe's bucket and sum carry one reading with `clock-once`,
    /// and timestamps never go back.
    #[test]
    fn timestamps_are_clock_readings_once_per_op_with_clock_once() {
        for strategies in StrategySet::combinations(Stage::Write) {
            let per_op = strategies.contains(Strategy::ClockOnce);
            let stamps = observe_timestamps(strategies);
            let mut last = 0.0;
            for &(bucket, sum) in &stamps {
                assert!(
                    bucket > 0.0 && sum >= bucket && bucket >= last,
                    "{stamps:?}"
                );
                if per_op {
                    assert_eq!(bucket, sum, "one reading per observe: {stamps:?}");
                }
                last = sum;
            }
        }
    }

    /// `coarse-clock`: every metric's clock is the coarse one but
    /// `most_recent`'s, the one aggregation that compares timestamps.
    #[test]
    fn only_most_recent_keeps_the_precise_clock() {
        let registry = Registry::from_json(
            r#"{"metrics": [
                {"name": "g_sum", "type": "gauge", "aggregation": "sum"},
                {"name": "g_max", "type": "gauge", "aggregation": "max"},
                {"name": "g_min", "type": "gauge", "aggregation": "min"},
                {"name": "g_all", "type": "gauge", "aggregation": "all"},
                {"name": "g_recent", "type": "gauge", "aggregation": "most_recent"},
                {"name": "c_total", "type": "counter"},
                {"name": "h_seconds", "type": "histogram"}]}"#,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        for strategies in StrategySet::combinations(Stage::Write) {
            let config = ClientConfig {
                strategies,
                ..ClientConfig::default()
            };
            let client = Client::new(dir.path(), &registry, config).unwrap();
            let coarse = strategies.contains(Strategy::CoarseClock);
            for metric in &client.metrics {
                let expected = if coarse && metric.aggregation != ProcessAggregation::MostRecent {
                    Clock::MonotonicCoarse
                } else {
                    Clock::Monotonic
                };
                assert_eq!(
                    metric.stamps, expected,
                    "{} under {strategies}",
                    metric.def.name
                );
            }
        }
    }

    #[test]
    fn the_coarse_clock_is_the_monotonic_clock_as_of_its_last_tick() {
        for _ in 0..1000 {
            let coarse = Clock::MonotonicCoarse.seconds();
            let precise = Clock::Monotonic.seconds();
            let coarse_after = Clock::MonotonicCoarse.seconds();
            assert!(coarse > 0.0 && coarse <= precise, "{coarse} {precise}");
            // One tick (1–10 ms) behind at most.
            assert!(precise - coarse < 0.05, "{coarse} {precise}");
            assert!(coarse_after >= coarse, "{coarse} {coarse_after}");
        }
    }

    mod bucket_of {
        use super::super::bucket_of;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4096))]

            /// Counting the bounds below the value (or the binary search, past
            /// 32 bounds) finds client_ruby's bucket, the first bound >= value,
            /// on sorted bounds with repeats, values on the bounds, NaN, ±inf.
            #[test]
            fn equals_the_binary_search(
                mut bounds in proptest::collection::vec(
                    prop_oneof![-1e3f64..1e3, (-4i32..4).prop_map(f64::from)], 0..48),
                pick in any::<prop::sample::Index>(),
                value in prop_oneof![
                    -2e3f64..2e3,
                    (-4i32..4).prop_map(f64::from),
                    Just(f64::NAN),
                    Just(f64::INFINITY),
                    Just(f64::NEG_INFINITY),
                ],
                on_a_bound in any::<bool>(),
            ) {
                bounds.sort_by(f64::total_cmp);
                let value = if on_a_bound && !bounds.is_empty() {
                    bounds[pick.index(bounds.len())]
                } else {
                    value
                };
                // client_ruby: `buckets.bsearch { |b| b >= value }`, else +Inf.
                prop_assert_eq!(
                    bucket_of(&bounds, value),
                    bounds.iter().position(|&bound| bound >= value).unwrap_or(bounds.len())
                );
            }
        }
    }
}
