//! The fold's directory: lock, journals, commit and recovery.

use super::*;

// ---------------------------------------------------------------------------
// The fold's directory: lock, journals, commit and recovery.

/// A batch as its journal records it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct Journal {
    /// The fold file's name in the store.
    pub(super) name: String,
    /// The inode of the new fold file (the commit renames it to `name`);
    /// 0 when the batch only removes files.
    pub(super) new_ino: u64,
    /// Whether `name` held a fold file before, kept as `<metric>.prev`.
    pub(super) had_prev: bool,
    /// The files folded, with the inodes read.
    pub(super) sources: Vec<JournalSource>,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct JournalSource {
    pub(super) name: String,
    pub(super) ino: u64,
    /// A hash of its used bytes as folded ([`used_hash`]), so recovery sees
    /// a source written since; `None` in a journal of an older fold.
    #[serde(default)]
    pub(super) hash: Option<u64>,
}

/// `<store>/.fold/`.
pub(super) struct FoldDir {
    pub(super) store: PathBuf,
    pub(super) path: PathBuf,
    pub(super) durable: bool,
}

impl FoldDir {
    pub(super) fn create(store: &Path, durable: bool) -> Result<FoldDir> {
        let path = store.join(FOLD_DIR);
        std::fs::create_dir_all(path.join(TRASH_DIR))
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(FoldDir {
            store: store.to_path_buf(),
            path,
            durable,
        })
    }

    pub(super) fn open(store: &Path) -> Result<Option<FoldDir>> {
        let path = store.join(FOLD_DIR);
        if !path.is_dir() {
            return Ok(None);
        }
        FoldDir::create(store, true).map(Some)
    }

    /// `fsync` of a directory, when durable.
    pub(super) fn sync(&self, dir: &Path) -> Result<()> {
        if self.durable {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// The run lock, if no other fold holds it: held for the whole fold.
    pub(super) fn run_lock(&self) -> Result<Option<File>> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(self.path.join(RUN_LOCK_FILE))
            .with_context(|| format!("cannot open {}", self.path.join(RUN_LOCK_FILE).display()))?;
        // SAFETY: flock on a descriptor we hold.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Some(file));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(None);
        }
        Err(anyhow!(err).context("cannot take the fold's run lock"))
    }

    /// The fold lock, taken exclusively.
    pub(super) fn lock(&self) -> Result<File> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(self.path.join(LOCK_FILE))?;
        flock(file.as_raw_fd(), libc::LOCK_EX)?;
        Ok(file)
    }

    /// A batch's journal, `.fold/<key>.journal` (see [`batch_key`]).
    pub(super) fn journal_path(&self, key: &str) -> PathBuf {
        self.path.join(format!("{key}.journal"))
    }

    pub(super) fn new_path(&self, key: &str) -> PathBuf {
        self.path.join(format!("{key}.new"))
    }

    pub(super) fn prev_path(&self, key: &str) -> PathBuf {
        self.path.join(format!("{key}.prev"))
    }

    /// Present while a batch's rollback is under way (see [`FoldDir::roll_back`]).
    pub(super) fn rollback_path(&self, key: &str) -> PathBuf {
        self.path.join(format!("{key}.rollback"))
    }

    pub(super) fn trash_path(&self, name: &str) -> PathBuf {
        self.path.join(TRASH_DIR).join(name)
    }

    /// Runs one round of batches of one metric, each of its own run (their
    /// files and fold files apart): each prepared (steps 1 to 3), then all
    /// committed under one hold of the lock (step 4), then one grace period
    /// for all (step 5) and each finished (step 6). Per batch, whether it
    /// was folded; `false` when it was given up (nothing of it changed).
    pub(super) fn fold_round(
        &self,
        metric: &str,
        files: &[FileSnapshot],
        batches: &[Batch],
        config: &FoldConfig,
        kill_at: &mut Option<FoldStep>,
    ) -> Result<Vec<bool>> {
        let mut prepared = Vec::with_capacity(batches.len());
        for (n, batch) in batches.iter().enumerate() {
            prepared.push(self.prepare(batch_key(metric, n), files, batch, kill_at)?);
        }
        // A writer may have come for a batch's sources since: that batch
        // is undone rather than committed.
        for slot in &mut prepared {
            if slot.as_ref().is_some_and(|batch| !batch.intact()) {
                let batch = slot.take().expect("checked");
                self.undo(&batch.key)?;
            }
        }
        let ready: Vec<Prepared> = prepared.iter_mut().filter_map(Option::take).collect();
        let mut folded = vec![false; batches.len()];
        let done = self.commit(ready, config, kill_at)?;
        for (n, ok) in done {
            folded[n] = ok;
        }
        Ok(folded)
    }

    /// Steps 1 to 3 of a batch: its sources reopened, leased and read again
    /// (exactly as planned, else `None`: given up, nothing changed), its fold
    /// file written as `<key>.new`, the one it replaces kept as `<key>.prev`,
    /// its journal `<key>.journal` in place.
    pub(super) fn prepare(
        &self,
        key: String,
        files: &[FileSnapshot],
        batch: &Batch,
        kill_at: &mut Option<FoldStep>,
    ) -> Result<Option<Prepared>> {
        let members = &files[batch.members.clone()];
        let name = String::from_utf8(batch.name.clone()).context("fold file name")?;
        // 1. Sources reopened, leased and read again: exactly as planned.
        let mut opened = Vec::with_capacity(members.len());
        for member in members {
            let path = self.store.join(os(&member.name));
            let Some(file) = open_regular(&path)? else {
                return Ok(None);
            };
            if file.metadata()?.ino() != member.ino {
                return Ok(None);
            }
            opened.push(file);
        }
        let mut leases = Vec::with_capacity(opened.len());
        for (file, member) in opened.into_iter().zip(members) {
            let Ok(lease) = HeldLease::take(file) else {
                return Ok(None);
            };
            if read_used(lease.file())? != member.bytes {
                return Ok(None);
            }
            leases.push(lease);
        }
        // 2. The new fold file, and the one it replaces kept aside.
        let new_path = self.new_path(&key);
        let prev_path = self.prev_path(&key);
        let _ = std::fs::remove_file(&prev_path);
        // The name holds a fold file already: one of the run's (its first
        // batch), or the run's own from its batch before.
        let replaces = self.store.join(&name).exists();
        let new_ino = match &batch.entries {
            Some(entries) => {
                let bytes = storefile::file_bytes_with_timestamps(entries.iter().map(
                    |&((file, (start, end)), value, timestamp)| {
                        (&files[file].bytes[start..end], value, timestamp)
                    },
                ));
                write_synced(&new_path, &bytes, self.durable)?
            }
            None => 0,
        };
        if replaces {
            std::fs::hard_link(self.store.join(&name), &prev_path)
                .with_context(|| format!("cannot keep {name} as {}", prev_path.display()))?;
        }
        step(kill_at, FoldStep::NewWritten);
        // 3. The journal.
        let journal = Journal {
            name: name.clone(),
            new_ino,
            had_prev: replaces,
            sources: members
                .iter()
                .filter(|m| m.name != batch.name)
                .map(|m| {
                    Ok(JournalSource {
                        name: String::from_utf8(m.name.clone())?,
                        ino: m.ino,
                        hash: Some(used_hash(&m.bytes)),
                    })
                })
                .collect::<Result<_>>()?,
        };
        let journal_path = self.journal_path(&key);
        // A rollback's marker left by a crash is no batch's now.
        remove_if_there(&self.rollback_path(&key))?;
        let tmp = journal_path.with_extension("journal-tmp");
        write_synced(&tmp, &serde_json::to_vec(&journal)?, self.durable)?;
        std::fs::rename(&tmp, &journal_path)?;
        self.sync(&self.path)?;
        step(kill_at, FoldStep::JournalWritten);
        let batch = Prepared {
            key,
            journal,
            leases,
        };
        if !batch.intact() {
            self.undo(&batch.key)?;
            return Ok(None);
        }
        Ok(Some(batch))
    }

    /// Steps 4 to 6 of prepared batches (by their place in the round):
    /// committed together under the lock, one grace period, then each
    /// kept, or rolled back if a writer came for one of its sources.
    fn commit(
        &self,
        batches: Vec<Prepared>,
        config: &FoldConfig,
        kill_at: &mut Option<FoldStep>,
    ) -> Result<Vec<(usize, bool)>> {
        if batches.is_empty() {
            return Ok(Vec::new());
        }
        self.commit_and_trash(&batches, kill_at)?;
        // 5. A writer on its way into a source's `open` shows up by now.
        std::thread::sleep(config.grace);
        self.settle(batches, kill_at)
    }

    /// Step 4: the commits, then the sources out of the store, under the lock.
    pub(super) fn commit_and_trash(
        &self,
        batches: &[Prepared],
        kill_at: &mut Option<FoldStep>,
    ) -> Result<()> {
        {
            let _lock = self.lock()?;
            for batch in batches {
                let name = &batch.journal.name;
                if batch.journal.new_ino != 0 {
                    std::fs::rename(self.new_path(&batch.key), self.store.join(name))
                        .with_context(|| format!("cannot commit {name}"))?;
                } else if batch.journal.had_prev {
                    std::fs::remove_file(self.store.join(name))
                        .with_context(|| format!("cannot commit the removal of {name}"))?;
                }
            }
            self.sync(&self.store)?;
            step(kill_at, FoldStep::Committed);
            let mut first = true;
            for source in batches.iter().flat_map(|b| &b.journal.sources) {
                std::fs::rename(self.store.join(&source.name), self.trash_path(&source.name))
                    .with_context(|| format!("cannot move {} to the trash", source.name))?;
                if std::mem::take(&mut first) {
                    step(kill_at, FoldStep::FirstTrashed);
                }
            }
            self.sync(&self.store)?;
        }
        step(kill_at, FoldStep::Trashed);
        Ok(())
    }

    /// Steps 5 (after the grace period) and 6: each batch kept, or rolled
    /// back if a writer came for one of its sources; leases released,
    /// `trash/` and `prev` removed, the journals last.
    pub(super) fn settle(
        &self,
        batches: Vec<Prepared>,
        kill_at: &mut Option<FoldStep>,
    ) -> Result<Vec<(usize, bool)>> {
        let intact: Vec<bool> = batches.iter().map(Prepared::intact).collect();
        if intact.contains(&false) {
            let _lock = self.lock()?;
            for (batch, _) in batches.iter().zip(&intact).filter(|(_, ok)| !**ok) {
                self.roll_back(&batch.key, &batch.journal)?;
            }
        }
        let batches: Vec<(String, Journal)> = batches
            .into_iter()
            .map(|batch| (batch.key, batch.journal))
            .collect();
        step(kill_at, FoldStep::Released);
        // 6. Clean up; the journals last.
        for ((key, journal), _) in batches.iter().zip(&intact).filter(|(_, ok)| **ok) {
            for source in &journal.sources {
                remove_if_there(&self.trash_path(&source.name))?;
            }
            remove_if_there(&self.prev_path(key))?;
        }
        step(kill_at, FoldStep::Cleaned);
        for ((key, _), _) in batches.iter().zip(&intact).filter(|(_, ok)| **ok) {
            std::fs::remove_file(self.journal_path(key))?;
        }
        self.sync(&self.path)?;
        Ok(batches
            .iter()
            .map(|(key, _)| batch_index(key))
            .zip(intact)
            .collect())
    }

    /// Undoes a batch that did not commit: its new file, `prev` and journal go.
    pub(super) fn undo(&self, key: &str) -> Result<()> {
        remove_if_there(&self.new_path(key))?;
        remove_if_there(&self.prev_path(key))?;
        remove_if_there(&self.journal_path(key))?;
        self.sync(&self.path)
    }

    /// Undoes a committed batch: sources back from `trash/`, the fold file
    /// back to what it was.
    ///
    /// Invariant: a rollback, once begun, always completes, and nothing a
    /// writer wrote into a source after the fold read it is lost.
    /// - It is recorded first, durably (`<key>.rollback`), so recovery after
    ///   a crash finishes it: rolled forward instead, the batch would drop
    ///   what a writer wrote into a source after the fold read it.
    /// - A source whose name was created again since (a new process given
    ///   the dead one's pid) is never moved over that file: it goes back
    ///   under a fold file's name beside it ([`aside_names`]), which
    ///   every exporter reads and a later fold folds like any fold file.
    pub(super) fn roll_back(&self, key: &str, journal: &Journal) -> Result<()> {
        let marker = self.rollback_path(key);
        if !marker.exists() {
            write_synced(&marker, b"", self.durable)?;
            self.sync(&self.path)?;
        }
        for source in &journal.sources {
            let trashed = self.trash_path(&source.name);
            if trashed.exists() {
                self.restore(&trashed, &source.name)?;
            }
        }
        let target = self.store.join(&journal.name);
        let prev = self.prev_path(key);
        if journal.had_prev && prev.exists() {
            std::fs::rename(&prev, &target)?;
        } else if journal.new_ino != 0 && ino_of(&target) == Some(journal.new_ino) {
            std::fs::remove_file(&target)?;
        }
        self.sync(&self.store)?;
        remove_if_there(&self.new_path(key))?;
        // The journal before the marker: a journal left without its marker
        // would be taken for a batch to roll forward.
        remove_if_there(&self.journal_path(key))?;
        self.sync(&self.path)?;
        remove_if_there(&marker)
    }

    /// Moves a trashed source back into the store: to its own name, or,
    /// when a file was created at that name since, beside it.
    fn restore(&self, trashed: &Path, name: &str) -> Result<()> {
        let back = |to: &str| match rename_no_replace(trashed, &self.store.join(to)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => {
                Err(anyhow!(e).context(format!("cannot move {} back to {to}", trashed.display())))
            }
        };
        if back(name)? {
            return Ok(());
        }
        let before = name_before(&self.store, name)?;
        for aside in aside_names(name, before.as_deref()) {
            if back(&aside)? {
                return Ok(());
            }
        }
        bail!(
            "no name to put {} back under beside {name}",
            trashed.display()
        )
    }

    /// Finishes or undoes every batch with a journal (see the module doc).
    pub(super) fn recover(&self) -> Result<u64> {
        let mut recovered = 0;
        let _lock = self.lock()?;
        for entry in std::fs::read_dir(&self.path)? {
            let path = entry?.path();
            let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if let Some(metric) = file_name.strip_suffix(".journal-tmp") {
                // Never renamed into place: the batch never committed.
                remove_if_there(&self.new_path(metric))?;
                remove_if_there(&self.prev_path(metric))?;
                remove_if_there(&path)?;
                recovered += 1;
                continue;
            }
            if let Some(key) = file_name.strip_suffix(".rollback") {
                // Its rollback finished but for the marker itself; a marker
                // with a journal is the journal's to handle.
                if !self.journal_path(key).exists() {
                    remove_if_there(&path)?;
                }
                continue;
            }
            let Some(metric) = file_name.strip_suffix(".journal") else {
                continue;
            };
            let journal: Journal = serde_json::from_slice(&std::fs::read(&path)?)
                .with_context(|| format!("bad fold journal {}", path.display()))?;
            recovered += 1;
            if self.rollback_path(metric).exists() {
                // A rollback was under way: it is finished, never undone.
                self.roll_back(metric, &journal)?;
                continue;
            }
            if !is_committed(&self.store, &journal) {
                // Sources move only after the commit: they are all in place.
                self.undo(metric)?;
                continue;
            }
            // Committed: each source must be exited and hold what was
            // folded to be moved out (or left in `trash/`); one with a writer
            // again (its pid reused after the crash), or written since the
            // fold read it, undoes the whole batch instead. A source already
            // in `trash/` too: a writer may have been on its way into its
            // `open` when the fold died (its lease broken, the grace cut
            // short), and have written, even exited, since.
            let mut written = false;
            for source in &journal.sources {
                let at = self.store.join(&source.name);
                let at = if ino_of(&at) == Some(source.ino) {
                    at
                } else {
                    self.trash_path(&source.name)
                };
                if ino_of(&at) == Some(source.ino) {
                    let file = File::open(&at)?;
                    written |= liveness::probe(&file) != Writers::None
                        || source.hash.is_some_and(|hash| {
                            read_used(&file).ok().map(|b| used_hash(&b)) != Some(hash)
                        });
                }
            }
            if written {
                self.roll_back(metric, &journal)?;
                continue;
            }
            for source in &journal.sources {
                let at = self.store.join(&source.name);
                if ino_of(&at) == Some(source.ino) {
                    std::fs::rename(&at, self.trash_path(&source.name))?;
                }
            }
            self.sync(&self.store)?;
            for source in &journal.sources {
                remove_if_there(&self.trash_path(&source.name))?;
            }
            remove_if_there(&self.prev_path(metric))?;
            remove_if_there(&self.new_path(metric))?;
            std::fs::remove_file(&path)?;
            self.sync(&self.path)?;
        }
        Ok(recovered)
    }
}

/// A batch of a round prepared for its commit: its `.fold/` files' key,
/// its journal, and its sources, each leased until the batch is final.
pub(super) struct Prepared {
    key: String,
    journal: Journal,
    leases: Vec<HeldLease>,
}

impl Prepared {
    /// Whether no writer has come for any of its sources.
    pub(super) fn intact(&self) -> bool {
        self.leases.iter().all(HeldLease::intact)
    }
}

/// The key of a round's `n`-th batch of `metric`: its files in `.fold/` are
/// `<key>.new`, `<key>.prev`, `<key>.journal`. Metric names have no dot, so
/// `<metric>` (the first) and `<metric>.<n>` are every batch's own.
pub(super) fn batch_key(metric: &str, n: usize) -> String {
    if n == 0 {
        metric.to_owned()
    } else {
        format!("{metric}.{n}")
    }
}

/// A batch's place in its round, from its key.
fn batch_index(key: &str) -> usize {
    key.rsplit_once('.')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(0)
}

/// Kills this process when a test asked for it at `reached` (the first
/// batch to get there).
fn step(kill_at: &Option<FoldStep>, reached: FoldStep) {
    if *kill_at == Some(reached) {
        // SAFETY: raise has no preconditions; this is the test's crash.
        unsafe { libc::raise(libc::SIGKILL) };
    }
}

/// Whether a journal's batch committed: its fold file is in place (or, for a
/// batch that only removes files, it went past its journal: treated as
/// committed, since removing files of no entries changes nothing).
pub(super) fn is_committed(store: &Path, journal: &Journal) -> bool {
    if journal.new_ino == 0 {
        return true;
    }
    ino_of(&store.join(&journal.name)) == Some(journal.new_ino)
}

/// For promlab's exporters: the files (name → inode) that a committed but
/// unfinished batch folded and that are still in the store, to leave out.
/// Read under the fold lock, shared ([`SharedLock`]).
pub fn committed_sources(store: &Path) -> HashMap<Vec<u8>, u64> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir(store.join(FOLD_DIR)) else {
        return out;
    };
    for entry in dir.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("journal") {
            continue;
        }
        let Some(journal) = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<Journal>(&bytes).ok())
        else {
            continue;
        };
        if journal.new_ino != 0 && is_committed(store, &journal) {
            for source in journal.sources {
                out.insert(source.name.into_bytes(), source.ino);
            }
        }
    }
    out
}

/// The fold lock, held shared for a scrape by promlab's exporters, so a
/// batch never commits in the middle of one. `None` when the store was never
/// folded (no `.fold/`).
pub struct SharedLock {
    pub(super) file: std::sync::Arc<File>,
}

impl SharedLock {
    /// Opens the store's fold lock and takes it.
    pub fn take(store: &Path) -> Option<SharedLock> {
        SharedLock::hold(std::sync::Arc::new(SharedLock::open(store)?))
    }

    /// The store's fold lock file, opened (to be held again and again).
    pub fn open(store: &Path) -> Option<File> {
        File::open(store.join(FOLD_DIR).join(LOCK_FILE)).ok()
    }

    /// Takes the lock through a descriptor kept open ([`SharedLock::open`]).
    pub fn hold(file: std::sync::Arc<File>) -> Option<SharedLock> {
        flock(file.as_raw_fd(), libc::LOCK_SH).ok()?;
        Some(SharedLock { file })
    }
}

impl Drop for SharedLock {
    /// Released explicitly: a kept descriptor outlives the lock.
    fn drop(&mut self) {
        let _ = flock(self.file.as_raw_fd(), libc::LOCK_UN);
    }
}

/// The name in `store` that comes last before `name` in name order among
/// the files of its group (the same name up to the id).
fn name_before(store: &Path, name: &str) -> Result<Option<String>> {
    let id_len = file_id(name.as_bytes()).map_or(0, <[u8]>::len);
    let prefix = &name[..name.len() - b".bin".len() - id_len];
    let mut before: Option<String> = None;
    for entry in std::fs::read_dir(store)? {
        let Ok(other) = entry?.file_name().into_string() else {
            continue;
        };
        let same_group = other
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(".bin"))
            .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()));
        if same_group && *other < *name && before.as_ref().is_none_or(|b| *b < other) {
            before = Some(other);
        }
    }
    Ok(before)
}

/// A hash of a source's used bytes, kept in its batch's journal.
pub(super) fn used_hash(bytes: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    foldhash::quality::FixedState::with_seed(0xf01d).hash_one(bytes)
}

pub(super) fn ino_of(path: &Path) -> Option<u64> {
    std::fs::symlink_metadata(path).ok().map(|m| m.ino())
}

pub(super) fn remove_if_there(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// Writes `bytes` to a new file at `path` (replacing one there), synced if
/// `durable`; returns its inode.
pub(super) fn write_synced(path: &Path, bytes: &[u8], durable: bool) -> Result<u64> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)?;
    file.write_all(bytes)?;
    if durable {
        file.sync_all()?;
    }
    Ok(file.metadata()?.ino())
}

/// `rename` that fails (`AlreadyExists`) rather than replace a file at `to`.
pub(super) fn rename_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let from_c = std::ffi::CString::new(from.as_os_str().as_bytes())?;
    let to_c = std::ffi::CString::new(to.as_os_str().as_bytes())?;
    // SAFETY: two NUL-terminated paths, relative to the working directory
    // only if relative (they are joined to the store's path).
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from_c.as_ptr(),
            libc::AT_FDCWD,
            to_c.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
