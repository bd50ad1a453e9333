//! The read seam: how one file's entries are read (locks, mappings kept
//! across scrapes, deadlines), so that no file costs a scrape more than a
//! bounded share of it.

use super::*;
use crate::format::storefile;

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
pub(super) const DEADLINE_CHECK_ENTRIES: usize = 4096;
pub(super) const DEADLINE_CHECK_BYTES: usize = 16 << 20;

/// The clocks one file's read runs against: how long it may wait for the
/// file's lock (and how long it did), and the scrape's deadline, which its
/// walk checks every [`DEADLINE_CHECK_ENTRIES`] entries or
/// [`DEADLINE_CHECK_BYTES`] bytes.
pub(super) struct ReadClock {
    /// The longest the file's lock may be waited for (the clock is read
    /// only if the lock is busy).
    pub(super) lock_wait: Duration,
    pub(super) lock_waited: Duration,
    pub(super) deadline: Instant,
    pub(super) entries: usize,
    pub(super) bytes: usize,
}

impl ReadClock {
    pub(super) fn new(lock_wait: Duration, deadline: Instant) -> ReadClock {
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
    pub(super) fn tick(&mut self, bytes: usize) -> FileResult<()> {
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
pub(super) struct FileFailure {
    pub(super) reason: FileSkip,
    pub(super) error: anyhow::Error,
}

impl FileFailure {
    pub(super) fn new(reason: FileSkip, error: impl Into<anyhow::Error>) -> FileFailure {
        FileFailure {
            reason,
            error: error.into(),
        }
    }
}

pub(super) type FileResult<T> = std::result::Result<T, FileFailure>;

/// Reads store files: the read seam, and what it keeps between files and scrapes.
pub(super) struct FileReader {
    pub(super) read: FileRead,
    pub(super) liveness: Liveness,
    /// The baseline's key buffer; `Mapped`'s read buffer.
    pub(super) key: Vec<u8>,
    /// `KeptMapped`: per metric, per listed file's slot, the file kept mapped.
    pub(super) kept: Vec<Vec<Option<KeptFile>>>,
    /// Descriptors kept open (of files with a writer, for their lock) at most.
    pub(super) fd_limit: usize,
    pub(super) fds: usize,
    /// Counts scrapes.
    pub(super) scrape: u64,
    /// The scrape's deadline, checked inside each walk.
    pub(super) deadline: Instant,
    /// The same deadline on the coarse clock ([`coarse_now`]), checked
    /// before each file; `None` when the scrape has no budget.
    pub(super) coarse_deadline: Option<Duration>,
    /// Time spent waiting for locks since the exporter last took it.
    pub(super) lock_waited: Duration,
    /// Counts changes to kept files that a scrape plan depends on: a file
    /// forgotten, read the usual way (mapped again, its writers probed), or
    /// its writers' state changed ([`FileReader::changes`]).
    pub(super) changes: u64,
}

/// The coarse monotonic clock (the kernel's last tick, a few ms old):
/// checked before each file, where the fine clock's read would be a large
/// share of a folded store's scrape, which reads one small file per metric.
pub(super) fn coarse_now() -> Duration {
    crate::write::clock_reading(libc::CLOCK_MONOTONIC_COARSE)
}

/// A store file kept mapped between scrapes, so a scrape of it is a walk of
/// the mapping (plus, while its writer may be live, the `flock` pair), not an
/// open, a map, page faults, an unmap and a close. The descriptor is closed
/// once the file's writer is known to have exited: a mapping outlives its
/// descriptor, so no descriptor limit bounds how many files are kept.
pub(super) struct KeptFile {
    /// The inode the listing gave for the slot.
    pub(super) ino: u64,
    /// `None` while the file is shorter than a header. Shared with a
    /// scrape plan that reads it ([`plan`]), which keeps it mapped while it
    /// holds it.
    pub(super) map: Option<Arc<memmap2::Mmap>>,
    /// Kept while the file's writer may be live (its lock is taken every scrape).
    pub(super) fd: Option<KeptFd>,
    pub(super) writers: Writers,
    /// The scrape of the last liveness probe.
    pub(super) probed: u64,
}

/// A deadline that never comes.
pub(super) fn far_future() -> Instant {
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
pub(super) static KEPT_FDS: AtomicUsize = AtomicUsize::new(0);

/// A descriptor a [`KeptFile`] keeps, counted in [`KEPT_FDS`] while it lives.
pub(super) struct KeptFd(File);

impl KeptFd {
    pub(super) fn new(file: File) -> KeptFd {
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
pub(super) static KEPT_MAPS: AtomicUsize = AtomicUsize::new(0);
pub(super) static MAP_LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Map entries set aside by [`reserve_maps`] for mappings the exporters do
/// not make.
pub(super) static RESERVED_MAPS: AtomicUsize = AtomicUsize::new(0);

/// `vm.max_map_count` less 8,192 entries (or half of it, if larger) for the
/// rest of the process — thread stacks, libraries, allocator arenas — and
/// less what [`reserve_maps`] set aside.
pub(super) fn map_limit() -> usize {
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
/// (`vm.max_map_count` less room for the rest) less what they keep now. A
/// benchmark that holds a floor beside an exporter sizes the floor's own
/// mappings from it ([`reserve_maps`]).
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
pub(super) const PROBE_EVERY: u64 = 64;
/// Exited files of a metric probed again per scrape, in turn, in case a new
/// process was given the dead one's pid and opened its file.
pub(super) const REPROBES_PER_SCRAPE: usize = 4;

/// How many descriptors `KeptMapped` keeps open (files with a live writer,
/// for their lock): the descriptor limit less 2,048 (a server's connections
/// are capped at 512, and per-scrape opens need some), and at least a quarter
/// of it; past it, such files are opened per scrape.
pub(super) fn kept_limit() -> usize {
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
pub(super) fn process_kept_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(kept_limit)
}

/// What a walk of a kept mapping found.
pub(super) enum KeptWalk {
    Done,
    /// `used` is past the mapping: the file grew (it has a writer); map it again.
    Grew,
    /// No guard slot was free: read it under its lock instead.
    Unguarded,
}

impl FileReader {
    pub(super) fn new(read: FileRead, liveness: Liveness) -> FileReader {
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
    pub(super) fn deadline_passed(&self) -> bool {
        self.coarse_deadline
            .is_some_and(|deadline| coarse_now() >= deadline)
    }

    /// Reads one store file under `flock` (waiting until `deadline` at most;
    /// with `Leases`, a kept file whose writer has exited without it) and
    /// hands each entry to `visit`, checking the scrape's deadline
    /// (`self.deadline`) as it walks. On failure, `visit` may have seen some
    /// of the file's entries.
    pub(super) fn read(
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
    pub(super) fn read_once(
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

    pub(super) fn start_scrape(&mut self) {
        self.scrape += 1;
    }

    /// Forgets a file the listing no longer has at that slot (deleted or replaced).
    pub(super) fn forget(&mut self, metric: usize, slot: u32) {
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
    pub(super) fn writer_closed(&mut self, metric: usize, slot: u32) {
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
    pub(super) fn unlocked_map(&self, metric: usize, listed: &Listed) -> Option<&memmap2::Mmap> {
        self.exited(metric, listed.slot, listed.ino)?
            .map(|map| &**map)
    }

    /// The kept file at `slot` of `metric`, if it is still inode `ino` and
    /// its writers have all exited (`Leases`): its mapping, read without its
    /// lock (`None` inside: it exited before writing a header, so it holds
    /// nothing, for ever).
    pub(super) fn exited(
        &self,
        metric: usize,
        slot: u32,
        ino: u64,
    ) -> Option<Option<&Arc<memmap2::Mmap>>> {
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
    pub(super) fn changes(&self) -> u64 {
        self.changes
    }

    /// `Leases`: a few exited files are probed again each scrape, in turn;
    /// one found with a writer (a new process given the dead one's pid
    /// reopened it) is read under its lock again. Fold files are not: their
    /// ids are never pids ([`storefile::is_fold_id`], marked when listed), so
    /// no writer opens one (a fold replaces them by rename, under the fold
    /// lock), and a folded store's scrape would otherwise
    /// pay a probe (an open, two lease calls, a close) per metric.
    pub(super) fn reprobe_exited(
        &mut self,
        dir: &Path,
        metric: usize,
        files: &[Listed],
        cursor: &mut usize,
    ) {
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
    pub(super) fn read_kept(
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
pub(super) fn read_kept_locked(
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
pub(super) fn is_out_of_maps(failure: &FileFailure) -> bool {
    failure
        .error
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::raw_os_error)
        == Some(libc::ENOMEM)
}

/// Walks a kept mapping, guarded against the file shrinking, unless its
/// `used` is past the mapping (the file grew).
pub(super) fn walk_kept(
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
pub(super) fn open_failure(err: std::io::Error) -> FileFailure {
    let reason = if err.kind() == std::io::ErrorKind::NotFound {
        FileSkip::Vanished
    } else {
        FileSkip::Unreadable
    };
    FileFailure::new(reason, err)
}

/// Opens a store file ([`storefile::open_regular`]): a missing file vanished,
/// anything but a regular file is `NotRegular`.
pub(super) fn open_regular(path: &Path) -> FileResult<File> {
    match storefile::open_regular(path) {
        Ok(Some(file)) => Ok(file),
        Ok(None) => Err(FileFailure::new(
            FileSkip::NotRegular,
            anyhow!("not a regular file"),
        )),
        Err(err) => Err(open_failure(err)),
    }
}

/// Takes `fd`'s exclusive `flock`, waiting until the clock's lock deadline at
/// most (one try if it has passed), and adds the time it waited to the clock.
pub(super) fn lock_until(fd: std::os::fd::RawFd, clock: &mut ReadClock) -> FileResult<()> {
    let (deadline, lock_wait) = (clock.deadline, clock.lock_wait);
    let wait = storefile::lock_exclusive_until(fd, |now| deadline.min(now + lock_wait))
        .map_err(|err| FileFailure::new(FileSkip::Unreadable, err))?;
    clock.lock_waited += wait.waited;
    if !wait.locked {
        return Err(FileFailure::new(
            FileSkip::Locked,
            anyhow!("flock still held after waiting"),
        ));
    }
    probe!("export.file_locked");
    Ok(())
}

/// Opens `path` and runs `read` on it under `flock`.
pub(super) fn read_locked(
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
pub(super) fn map_file(file: &File) -> FileResult<Option<memmap2::Mmap>> {
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
pub(super) fn walk_mapped(
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
pub(super) fn walk(
    map: &[u8],
    clock: &mut ReadClock,
    visit: &mut impl FnMut(Entry<'_>),
) -> FileResult<()> {
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
pub(super) fn read_entry_by_entry(
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
pub(super) struct Late;

impl std::fmt::Display for Late {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the scrape's time budget ran out")
    }
}

impl std::error::Error for Late {}

pub(super) fn read_entry_by_entry_inner(
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
