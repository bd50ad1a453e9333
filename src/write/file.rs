//! One process's file for one metric (client_ruby's \`FileMappedDict\`).

use super::*;

// ---------------------------------------------------------------------------
// One process's file for one metric (client_ruby's `FileMappedDict`).

/// How values reach the file: [`StoreIo`], with its mapping.
pub(super) enum Io {
    /// Seek + read / seek + write per value, as client_ruby does.
    Syscalls,
    /// A shared writable mapping of the whole file.
    Mapped(Mapping),
}

/// The writer's mapping of its file, registered with [`mapguard`] for as
/// long as it is mapped: a page the file no longer has (someone truncated
/// it) is a caught fault, not a `SIGBUS` that kills the application.
pub(super) struct Mapping {
    /// Declared first: unregistered before the mapping is unmapped.
    pub(super) guard: mapguard::Guard,
    pub(super) map: MmapMut,
}

/// Writes between two checks of the file's size (one `fstat`): a file cut
/// within the pages the writer touches faults no page, so it is noticed here.
pub(super) const WRITES_PER_SIZE_CHECK: u32 = 1024;

/// How often a file shrank under one of this process's writers and was
/// repaired ([`truncations`]).
pub(super) static FILES_REPAIRED: AtomicU64 = AtomicU64::new(0);
pub(super) static ENTRIES_RESET: AtomicU64 = AtomicU64::new(0);

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
pub(super) const OWNER_LOCK_AT: i64 = 1 << 62;

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
pub(super) fn claim_writer(file: &File, path: &Path) -> Result<()> {
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
    pub(super) file: File,
    pub(super) io: Io,
    pub(super) path: PathBuf,
    pub(super) used: usize,
    pub(super) capacity: u64,
    /// Key → offset of its value (foldhash: fast on keys of hundreds of bytes).
    pub(super) positions: HashMap<Box<[u8]>, usize, foldhash::fast::RandomState>,
    /// Writes left before the next size check.
    pub(super) writes_to_check: u32,
    /// Inside [`StoreFile::repeat_after_repair`]: a fault is its loop's to handle.
    pub(super) repeating: bool,
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
    pub(super) fn map(&self) -> Result<Io> {
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
    pub(super) fn faulted(&self) -> bool {
        match &self.io {
            Io::Mapped(m) => m.guard.faulted(),
            Io::Syscalls => false,
        }
    }

    /// [`StoreFile::faulted`], and this access is the one to repeat it.
    #[inline]
    pub(super) fn must_repeat(&self) -> bool {
        self.faulted() && !self.repeating
    }

    /// Counts a write; every [`WRITES_PER_SIZE_CHECK`] writes, repairs the
    /// file if it shrank.
    #[inline]
    pub(super) fn count_write(&mut self) -> Result<()> {
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
    pub(super) fn after_mapped_write(
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
    pub(super) fn after_mapped_write_rarely(
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
    pub(super) fn check_size(&mut self) -> Result<()> {
        self.writes_to_check = WRITES_PER_SIZE_CHECK;
        self.repair_if_shrunk().map(|_| ())
    }

    /// Repairs the file if it is shorter than the writer made it; whether it was.
    #[inline(never)]
    pub(super) fn repair_if_shrunk(&mut self) -> Result<bool> {
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
    pub(super) fn repair(&mut self, size: u64) -> Result<()> {
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
    pub(super) fn repeat_after_repair<T>(
        &mut self,
        access: impl Fn(&mut Self) -> Result<T>,
    ) -> Result<T> {
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
    pub(super) fn load(&mut self) -> Result<()> {
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

    pub(super) fn append_entry(&mut self, key: &[u8]) -> Result<usize> {
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

    pub(super) fn repeat_up_to_3<T>(
        &mut self,
        access: impl Fn(&mut Self) -> Result<T>,
    ) -> Result<Option<T>> {
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
    pub(super) fn write_entry(&mut self, at: usize, entry: &[u8]) -> Result<()> {
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
    pub(super) fn read_by_syscalls(&mut self, pos: usize) -> Result<f64> {
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
    pub(super) fn write_by_syscalls(&mut self, pos: usize, buf: &[u8; 16]) -> Result<()> {
        self.file.seek(SeekFrom::Start(pos as u64))?;
        self.file.write_all(buf)?;
        self.file.flush()?;
        Ok(())
    }

    pub fn used(&self) -> usize {
        self.used
    }
}
