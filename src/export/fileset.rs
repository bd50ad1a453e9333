//! Which files each metric has: the export stage's **listing** seam.
//!
//! | `Listing` | strategy | how the files are found |
//! |---|---|---|
//! | `PerMetric` | baseline | the directory listed once per metric, as client_ruby's `Dir.glob("metric_<name>___*")` in `MetricStore#all_values` |
//! | `OncePerScrape` | `single-read` | the directory listed once per scrape, each name parsed once and handed to its metric |
//! | `Watched` | `single-read` × `prerender` (a long-lived exporter) | listed once, then kept up to date from inotify events (created, deleted, renamed, a writer's close); a full listing again when the event queue overflows, the watch is lost, every five minutes, and always on network filesystems, where inotify does not see other hosts' changes |
//!
//! A listed file has a *slot*: a small number, dense within its metric, that
//! stays the same while the same inode sits at the same name, so the reader
//! keeps its mapping and the decoder its hints in vectors indexed by slot,
//! not in maps by path (no path hashed or allocated per file per scrape). A name whose inode changed (the file was replaced)
//! gets a new slot; the old one is *released*, and whoever keeps something by
//! slot forgets it ([`FileSet::take_released`]).
//!
//! Every listing also notes the files of the one-file-per-process layout
//! (`metrics___<id>.bin`); once one was met, the exporter reads the store as
//! [`crate::export::per_process`] does, listing it once per scrape.
//!
//! A store that was folded (`crate::export::fold`) has `.fold/`: then the
//! fold lock is held shared for the scrape and the sources of a committed but
//! unfinished batch are left out ([`FileSet::excluded`]).

use crate::export::fold;
use crate::format::storefile::{parse_file_name, parse_process_file_name};
use crate::shared::seams::Listing;
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One store file of a metric, as listed.
#[derive(Clone, Debug)]
pub(crate) struct Listed {
    /// The file name (`metric_<name>___<id>.bin`).
    pub(crate) name: Box<[u8]>,
    /// Its inode, as the directory says.
    pub(crate) ino: u64,
    /// Stable while the same inode sits at the same name.
    pub(crate) slot: u32,
    /// A fold file ([`crate::format::storefile::is_fold_id`]): no process writes it.
    pub(crate) fold: bool,
}

impl Listed {
    fn new(name: Box<[u8]>, ino: u64, slot: u32) -> Listed {
        let fold =
            parse_file_name(&name).is_some_and(|(_, id)| crate::format::storefile::is_fold_id(id));
        Listed {
            name,
            ino,
            slot,
            fold,
        }
    }

    pub(crate) fn path(&self, dir: &Path) -> PathBuf {
        dir.join(OsStr::from_bytes(&self.name))
    }
}

/// How often a watched store is listed in full anyway.
const RESCAN_EVERY: Duration = Duration::from_secs(300);

pub(crate) struct FileSet {
    dir: PathBuf,
    listing: Listing,
    /// Registered metric names → registry index.
    metrics: HashMap<Box<[u8]>, usize>,
    names: Vec<String>,
    /// Per metric: its files, sorted by name.
    files: Vec<Vec<Listed>>,
    /// Name → (slot, inode) of every listed file.
    slots: HashMap<Box<[u8]>, (u32, u64)>,
    /// Per metric: slots free for reuse, and the next new one.
    free: Vec<Vec<u32>>,
    next_slot: Vec<u32>,
    /// (metric, slot) released since the last call.
    released: Vec<(usize, u32)>,
    /// (metric, slot) whose writer closed the file since the last scrape (watched).
    writer_closed: Vec<(usize, u32)>,
    watch: Option<Watch>,
    /// When the watch last failed (it is tried again a minute later).
    watch_failed: Option<Instant>,
    listed_at: Option<Instant>,
    /// Whether the store has `.fold/`.
    folded: bool,
    excluded: HashMap<Vec<u8>, u64>,
    /// Whether `excluded` must be read again from `.fold/`: always for a
    /// listed store; for a watched one only after a listing or a change in
    /// the store (a batch commits by renaming its fold file into the store
    /// and ends by moving its sources out, under the fold lock).
    sources_stale: bool,
    /// The files of the one-file-per-process layout (`metrics___<id>.bin`),
    /// sorted by name, as the last full listing found them (name, inode).
    process_files: Vec<(Box<[u8]>, u64)>,
    /// Whether any listing or event ever met such a file: the exporter then
    /// reads the store as [`crate::export::per_process`] does.
    process_files_seen: bool,
    /// A watched store's fold lock file, kept open.
    fold_lock: Option<std::sync::Arc<std::fs::File>>,
    /// Counts listings and applied events: while it stays the same, so do
    /// the files of every metric, their slots and inodes, and whether the
    /// store is folded ([`FileSet::generation`]).
    generation: u64,
}

impl FileSet {
    pub(crate) fn new(dir: &Path, metric_names: &[String], listing: Listing) -> FileSet {
        FileSet {
            dir: dir.to_path_buf(),
            listing,
            metrics: metric_names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.as_bytes().into(), i))
                .collect(),
            names: metric_names.to_vec(),
            files: vec![Vec::new(); metric_names.len()],
            slots: HashMap::new(),
            free: vec![Vec::new(); metric_names.len()],
            next_slot: vec![0; metric_names.len()],
            released: Vec::new(),
            writer_closed: Vec::new(),
            watch: None,
            watch_failed: None,
            listed_at: None,
            folded: false,
            excluded: HashMap::new(),
            sources_stale: true,
            process_files: Vec::new(),
            process_files_seen: false,
            fold_lock: None,
            generation: 0,
        }
    }

    /// Brings the file set up to date for a scrape (per metric, the baseline
    /// lists in [`FileSet::list`] instead).
    pub(crate) fn update(&mut self) -> Result<()> {
        match self.listing {
            Listing::PerMetric => {
                self.folded = self.dir.join(fold::FOLD_DIR).is_dir();
                Ok(())
            }
            Listing::OncePerScrape => self.list_all(),
            Listing::Watched => self.follow(),
        }
    }

    /// For a scrape that reads the listed files: the fold lock, held shared
    /// when the store was folded, then the listing brought up to date
    /// ([`FileSet::update`]) and the files to leave out ([`FileSet::view`])
    /// with it, both under the lock. Listed before the lock, a scrape could
    /// list the store as it was before a batch and read it after: a source
    /// moved out meanwhile vanished from the scrape, and one still listed
    /// after its batch's journal went was counted twice, beside the fold file
    /// holding it (a batch renames in and out under the lock exclusively, and
    /// inotify has every event of its renames queued before it unlocks).
    pub(crate) fn lock_for_scrape(&mut self) -> Result<Option<fold::SharedLock>> {
        let mut lock = if self.folded {
            self.take_fold_lock()
        } else {
            None
        };
        self.update()?;
        if self.folded && lock.is_none() {
            // Folded since the last scrape (or its lock was not to be had):
            // the lock, then the listing again under it.
            lock = self.take_fold_lock();
            if lock.is_some() {
                self.update()?;
            }
        }
        if !self.folded {
            self.fold_lock = None;
            self.excluded.clear();
        } else if lock.is_none() {
            self.excluded.clear();
            self.sources_stale = true;
        } else if self.sources_stale || self.listing != Listing::Watched {
            self.excluded = fold::committed_sources(&self.dir);
            self.sources_stale = false;
        }
        Ok(lock)
    }

    /// The fold lock, shared. A watched store keeps its descriptor (the
    /// watch sees `.fold/` go and come back, and the descriptor is dropped
    /// then); a listed one opens it each scrape, as it lists.
    fn take_fold_lock(&mut self) -> Option<fold::SharedLock> {
        if self.listing != Listing::Watched {
            return fold::SharedLock::take(&self.dir);
        }
        if self.fold_lock.is_none() {
            self.fold_lock = fold::SharedLock::open(&self.dir).map(std::sync::Arc::new);
        }
        let lock = fold::SharedLock::hold(self.fold_lock.clone()?);
        if lock.is_none() {
            self.fold_lock = None;
        }
        lock
    }

    /// Lists metric `index`'s files, if the listing is per metric (the
    /// others listed them in [`FileSet::update`]).
    pub(crate) fn list(&mut self, index: usize) -> Result<()> {
        if self.listing == Listing::PerMetric {
            self.list_metric(index)?;
        }
        Ok(())
    }

    /// Whether an inotify watch follows the store (a removed directory
    /// then shows as a lost watch and a failed listing).
    pub(crate) fn watching(&self) -> bool {
        self.watch.is_some()
    }

    /// Whether a listing or an event ever met a file of the
    /// one-file-per-process layout.
    pub(crate) fn process_files_seen(&self) -> bool {
        self.process_files_seen
    }

    /// The one-file-per-process layout's files (name, inode), sorted by
    /// name, as the last full listing found them (a store read in that
    /// layout is listed once per scrape).
    pub(crate) fn process_files(&self) -> &[(Box<[u8]>, u64)] {
        &self.process_files
    }

    /// Metric `index`'s files, sorted by name, and the files to leave out.
    pub(crate) fn view(&self, index: usize) -> (&[Listed], &HashMap<Vec<u8>, u64>) {
        (&self.files[index], &self.excluded)
    }

    /// The files to leave out (name → inode): the sources of a fold batch
    /// committed and not finished.
    pub(crate) fn excluded(&self) -> &HashMap<Vec<u8>, u64> {
        &self.excluded
    }

    /// Changes whenever the listing may have: each listing (a baseline or
    /// `single-read` store is listed every scrape, so this changes every
    /// scrape) and each watched change. A scrape that finds it as it was
    /// lists exactly the files the last one did.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// (metric, slot) released since the last call (files gone or replaced).
    pub(crate) fn take_released(&mut self) -> std::vec::Drain<'_, (usize, u32)> {
        self.released.drain(..)
    }

    /// (metric, slot) whose writer closed the file since the last call (a
    /// watched store only): their writer may have exited.
    pub(crate) fn take_writer_closed(&mut self) -> std::vec::Drain<'_, (usize, u32)> {
        self.writer_closed.drain(..)
    }

    fn read_dir(&mut self) -> Result<std::fs::ReadDir> {
        crate::shared::event_probe::probe!("export.dir_listed");
        self.generation += 1;
        std::fs::read_dir(&self.dir)
            .with_context(|| format!("cannot read store directory {}", self.dir.display()))
    }

    /// client_ruby's glob for one metric (exactly `metric_<name>___<pid>.bin`).
    fn list_metric(&mut self, index: usize) -> Result<()> {
        use std::os::unix::fs::DirEntryExt;
        let mut found = Vec::new();
        let metric = self.names[index].clone();
        for entry in self.read_dir()? {
            let entry = entry?;
            let name = entry.file_name();
            if crate::format::storefile::is_metric_file(name.as_bytes(), &metric) {
                found.push((Box::<[u8]>::from(name.as_bytes()), entry.ino()));
            } else if parse_process_file_name(name.as_bytes()).is_some() {
                self.process_files_seen = true;
            }
        }
        self.folded = self.dir.join(fold::FOLD_DIR).is_dir();
        self.replace_metric(index, found);
        Ok(())
    }

    /// One listing for every metric.
    fn list_all(&mut self) -> Result<()> {
        use std::os::unix::fs::DirEntryExt;
        let mut found: Vec<Vec<(Box<[u8]>, u64)>> = vec![Vec::new(); self.files.len()];
        let mut folded = false;
        let mut process_files = std::mem::take(&mut self.process_files);
        process_files.clear();
        for entry in self.read_dir()? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.as_bytes();
            if name == fold::FOLD_DIR.as_bytes() {
                folded = true;
            } else if let Some(index) = self.metric_of(name) {
                found[index].push((name.into(), entry.ino()));
            } else if parse_process_file_name(name).is_some() {
                process_files.push((name.into(), entry.ino()));
            }
        }
        process_files.sort_unstable();
        self.process_files_seen |= !process_files.is_empty();
        self.process_files = process_files;
        self.folded = folded;
        self.sources_stale = true;
        for (index, files) in found.into_iter().enumerate() {
            self.replace_metric(index, files);
        }
        self.listed_at = Some(Instant::now());
        Ok(())
    }

    fn metric_of(&self, name: &[u8]) -> Option<usize> {
        let (metric, _) = parse_file_name(name)?;
        self.metrics.get(metric).copied()
    }

    /// Sets a metric's files to `found`, keeping the slots of files whose
    /// inode did not change and releasing those gone.
    fn replace_metric(&mut self, index: usize, mut found: Vec<(Box<[u8]>, u64)>) {
        found.sort_unstable();
        let old = std::mem::take(&mut self.files[index]);
        let mut next = Vec::with_capacity(found.len());
        let mut gone = old.into_iter().peekable();
        for (name, ino) in found {
            while let Some(old) = gone.next_if(|old| old.name < name) {
                self.release(index, &old.name);
            }
            // A name listed again keeps its slot if its inode is the same.
            let _ = gone.next_if(|old| old.name == name);
            let slot = self.slot_for(index, &name, ino);
            next.push(Listed::new(name, ino, slot));
        }
        for old in gone {
            self.release(index, &old.name);
        }
        self.files[index] = next;
    }

    fn slot_for(&mut self, index: usize, name: &[u8], ino: u64) -> u32 {
        if let Some(&(slot, known)) = self.slots.get(name) {
            if known == ino {
                return slot;
            }
            self.released.push((index, slot));
            self.free[index].push(slot);
        }
        let next = &mut self.next_slot[index];
        let slot = self.free[index].pop().unwrap_or_else(|| {
            *next += 1;
            *next - 1
        });
        self.slots.insert(name.into(), (slot, ino));
        slot
    }

    fn release(&mut self, index: usize, name: &[u8]) {
        if let Some((slot, _)) = self.slots.remove(name) {
            self.released.push((index, slot));
            self.free[index].push(slot);
        }
    }

    /// A watched store: events since the last scrape, or a full listing.
    fn follow(&mut self) -> Result<()> {
        let stale = self.listed_at.is_none_or(|at| at.elapsed() >= RESCAN_EVERY);
        if self.watch.is_none()
            && self
                .watch_failed
                .is_none_or(|at| at.elapsed() >= Duration::from_secs(60))
        {
            // Watch first, then list: nothing done between is missed (events
            // for files the listing already has are applied again, harmlessly).
            match Watch::new(&self.dir) {
                Ok(watch) => {
                    self.watch = Some(watch);
                    self.watch_failed = None;
                }
                Err(_) => self.watch_failed = Some(Instant::now()),
            }
            return self.list_all();
        }
        let Some(watch) = &mut self.watch else {
            return self.list_all();
        };
        let mut changes = Vec::new();
        let relist = watch.drain(|event| changes.push(event)).unwrap_or(true);
        if relist {
            if watch.lost {
                self.watch = None;
            }
            return self.list_all();
        }
        for change in changes {
            self.apply(change);
        }
        if stale {
            self.list_all()?;
        }
        Ok(())
    }

    fn apply(&mut self, change: Change) {
        self.generation += 1;
        match change {
            Change::Appeared(name) => {
                self.sources_stale = true;
                if *name == *fold::FOLD_DIR.as_bytes() {
                    self.folded = true;
                    self.fold_lock = None;
                    return;
                }
                if parse_process_file_name(&name).is_some() {
                    self.process_files_seen = true;
                }
                let Some(index) = self.metric_of(&name) else {
                    return;
                };
                let Ok(meta) = std::fs::symlink_metadata(self.dir.join(OsStr::from_bytes(&name)))
                else {
                    // Gone again: its removal event follows.
                    return;
                };
                use std::os::unix::fs::MetadataExt;
                let slot = self.slot_for(index, &name, meta.ino());
                let files = &mut self.files[index];
                let listed = Listed::new(name, meta.ino(), slot);
                match files.binary_search_by(|f| f.name.cmp(&listed.name)) {
                    Ok(at) => files[at] = listed,
                    Err(at) => files.insert(at, listed),
                }
            }
            Change::Gone(name) => {
                self.sources_stale = true;
                if *name == *fold::FOLD_DIR.as_bytes() {
                    self.folded = false;
                    self.fold_lock = None;
                    return;
                }
                let Some(index) = self.metric_of(&name) else {
                    return;
                };
                let files = &mut self.files[index];
                if let Ok(at) = files.binary_search_by(|f| f.name.cmp(&name)) {
                    files.remove(at);
                    self.release(index, &name);
                }
            }
            Change::WriterClosed(name) => {
                if let (Some(index), Some(&(slot, _))) =
                    (self.metric_of(&name), self.slots.get(&name))
                {
                    self.writer_closed.push((index, slot));
                }
            }
        }
    }
}

/// What an inotify event says about a name in the store.
enum Change {
    Appeared(Box<[u8]>),
    Gone(Box<[u8]>),
    WriterClosed(Box<[u8]>),
}

/// An inotify watch on the store directory (libc; non-blocking). Also
/// public as [`crate::export::StoreWatch`], for a reader that keeps no
/// listing of its own (the benchmarks' export floor).
pub struct Watch {
    fd: std::os::fd::OwnedFd,
    buf: Vec<u8>,
    /// The watch is gone (the directory was removed or moved).
    lost: bool,
}

impl Watch {
    /// A watch of `dir`; an error where inotify cannot see every change
    /// (a network filesystem) or no watch can be had.
    pub fn new(dir: &Path) -> std::io::Result<Watch> {
        use std::os::fd::FromRawFd;
        if on_network_filesystem(dir) {
            return Err(std::io::Error::other(
                "inotify does not see other hosts' changes",
            ));
        }
        // SAFETY: plain syscalls; the descriptor is owned from here on.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by inotify_init1.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
        let mask = libc::IN_CREATE
            | libc::IN_DELETE
            | libc::IN_MOVED_FROM
            | libc::IN_MOVED_TO
            | libc::IN_CLOSE_WRITE
            | libc::IN_DELETE_SELF
            | libc::IN_MOVE_SELF
            | libc::IN_ONLYDIR;
        use std::os::fd::AsRawFd;
        // SAFETY: a valid inotify descriptor and a NUL-terminated path.
        if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), mask) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Watch {
            fd,
            buf: vec![0u8; 64 * 1024],
            lost: false,
        })
    }

    /// Whether a file came, went or was written and closed, or the watch
    /// was lost, since the last read (the events are read and dropped): one
    /// `read` when nothing happened, what every watched scrape pays.
    pub fn changed(&mut self) -> std::io::Result<bool> {
        let mut changed = false;
        let relist = self.drain(|_| changed = true)?;
        Ok(changed || relist)
    }

    /// Hands every pending change to `change`; `Ok(true)` when the store
    /// must be listed in full (events were dropped, or the watch is gone).
    fn drain(&mut self, mut change: impl FnMut(Change)) -> std::io::Result<bool> {
        use std::os::fd::AsRawFd;
        let header = std::mem::size_of::<libc::inotify_event>();
        let mut relist = false;
        loop {
            // SAFETY: reads into our own buffer, of its length.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                )
            };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                return match err.kind() {
                    std::io::ErrorKind::WouldBlock => Ok(relist),
                    std::io::ErrorKind::Interrupted => continue,
                    _ => Err(err),
                };
            }
            let n = n as usize;
            let mut at = 0;
            while at + header <= n {
                // SAFETY: the kernel wrote a whole event here; read unaligned.
                let event: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(self.buf[at..].as_ptr().cast()) };
                let name_len = event.len as usize;
                let raw = &self.buf[at + header..(at + header + name_len).min(n)];
                let name: Box<[u8]> =
                    raw[..raw.iter().position(|&b| b == 0).unwrap_or(raw.len())].into();
                at += header + name_len;
                let mask = event.mask;
                if mask & libc::IN_Q_OVERFLOW != 0 {
                    relist = true;
                } else if mask & (libc::IN_IGNORED | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0
                {
                    self.lost = true;
                    relist = true;
                } else if mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
                    change(Change::Appeared(name));
                } else if mask & (libc::IN_DELETE | libc::IN_MOVED_FROM) != 0 {
                    change(Change::Gone(name));
                } else if mask & libc::IN_CLOSE_WRITE != 0 {
                    change(Change::WriterClosed(name));
                }
            }
        }
    }
}

/// Whether `dir` is on a filesystem other hosts write to (inotify reports
/// only this host's changes there).
fn on_network_filesystem(dir: &Path) -> bool {
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return true;
    };
    // SAFETY: a zeroed statfs for the kernel to fill, and a valid path.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut stat) } != 0 {
        return true;
    }
    const NETWORK: [i64; 8] = [
        0x6969,                // NFS
        0x517B,                // SMB
        0xFF53_4D42u32 as i64, // CIFS
        0xFE53_4D42u32 as i64, // SMB2
        0x00C3_6400,           // Ceph
        0x6573_5546,           // FUSE
        0x0102_1997,           // 9p
        0x0BD0_0BD0,           // Lustre
    ];
    NETWORK.contains(&(stat.f_type as i64))
}
