//! The `fold-exited` strategy's fold: the files of processes that have
//! exited are folded, per metric, into fold files by each aggregation's rule,
//! so a store that long-running apps fill with one file per worker per
//! metric (client_ruby#143, #232) goes back to O(live processes) files.
//!
//! # What a fold keeps identical
//!
//! An exporter (client_ruby's, promlab's) visits a metric's files in sorted
//! name order, aggregates each label set's values left to right (`sum` adds
//! from the first value, `max`/`min` keep the first of equals, `most_recent`
//! the first of the newest timestamp, `all` the first value; `all` keys carry
//! the writer's `pid`, so each process keeps its own series), and prints the
//! series in order of first appearance. A fold replaces a *run* — files next
//! to each other in that order, none of them live — by one file placed where
//! the run was, holding per label set the run's own aggregate (raw key as
//! first written in the run; series in order of first appearance in the
//! run). Order of appearance is then unchanged, and so is every `max`,
//! `min`, `most_recent` and `all`. A `sum` is not always: floating-point
//! addition does not associate, and `(p + a) + b` may differ from
//! `p + (a + b)` in the last bit when live values come before the run. So
//! the plan checks, series by series, that the aggregate over the folded
//! files is bit for bit the one over the run ([`plan_metric`]); a run is cut
//! where it is not, and a run with nothing live before it (the front of the
//! order) always is. The check is against the live files' values as read
//! then; later values give the folded store's own (equally exact) sums.
//!
//! # Which files are exited
//!
//! [`crate::export::liveness`]: a read lease, granted only while no one has the file
//! open for writing — the writer's own open file is the proof of life, not
//! a pid, so pid reuse and containers in other pid namespaces are no
//! hazard. Fold files are named `metric_<name>___<id>.bin` with an id of
//! [`FOLD_ID_DIGITS`] digits or more (never a pid), so no writer ever opens
//! one, and client_ruby's exporter reads them like any process's file.
//!
//! # Crash safety
//!
//! Everything the fold writes outside the store's own files lives in
//! `.fold/` (client_ruby's glob `metric_<name>___*` never sees it).
//! A batch (one run, or part of one) is:
//! 1. sources reopened, read leases taken, bytes read again and compared with
//!    what was planned;
//! 2. the fold file written to `.fold/<metric>.new` and synced; the
//!    fold file it replaces, if any, hard-linked to `<metric>.prev`;
//! 3. the journal `<metric>.journal` written (via a temporary, synced);
//! 4. under the store's fold lock (exclusive): the new file renamed into
//!    place (**the commit**), then every source renamed to `trash/`;
//! 5. after a grace period, every lease checked: a writer that started
//!    opening a source meanwhile (a new process given the dead one's pid)
//!    rolls the batch back, so it gets the file back with its values;
//! 6. leases released, `trash/` and `prev` removed, then the journal.
//!
//! [`recover`] finishes or undoes a batch a crash (SIGKILL) interrupted: a
//! journal whose new file is in place (same inode) is rolled forward, any
//! other is undone, so no value is lost or counted twice. promlab's
//! exporters take the fold lock shared for a scrape that reads the listing
//! and leave out the sources of a committed journal still in place
//! ([`committed_sources`]), so they never see a half-done batch (a scrape by
//! a plan reads only files it holds mapped, which a batch does not change,
//! and takes no lock); client_ruby's exporter does not know
//! the lock (see the dossier, `strategies/fold-exited.md`, for what it may
//! see during a fold).

use crate::export::liveness::{self, ReadLease, Writers};
use crate::export::Aggregate;
use crate::format::formenc;
use crate::format::registry::{is_label_name, ProcessAggregation, Registry};
use crate::format::storefile::{
    self, check_used, entries, flock, is_fold_id, parse_file_name, FOLD_ID_DIGITS, HEADER_SIZE,
};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The fold's own directory inside a store directory.
pub const FOLD_DIR: &str = ".fold";
/// The fold lock: exclusive while a batch commits, shared by promlab's
/// exporters for a scrape.
const LOCK_FILE: &str = "lock";
const TRASH_DIR: &str = "trash";

/// Where a fold can be stopped by a test (`promlab fold --kill-at STEP`),
/// in the order a batch passes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoldStep {
    /// The new fold file is written and synced.
    NewWritten,
    /// The journal is in place.
    JournalWritten,
    /// The new fold file is renamed into place.
    Committed,
    /// The first source is moved to `trash/`.
    FirstTrashed,
    /// Every source is in `trash/`.
    Trashed,
    /// The leases are checked and released.
    Released,
    /// `trash/` and `prev` are removed; the journal is still there.
    Cleaned,
}

impl FoldStep {
    pub const ALL: [FoldStep; 7] = [
        FoldStep::NewWritten,
        FoldStep::JournalWritten,
        FoldStep::Committed,
        FoldStep::FirstTrashed,
        FoldStep::Trashed,
        FoldStep::Released,
        FoldStep::Cleaned,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FoldStep::NewWritten => "new-written",
            FoldStep::JournalWritten => "journal-written",
            FoldStep::Committed => "committed",
            FoldStep::FirstTrashed => "first-trashed",
            FoldStep::Trashed => "trashed",
            FoldStep::Released => "released",
            FoldStep::Cleaned => "cleaned",
        }
    }
}

impl std::str::FromStr for FoldStep {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        FoldStep::ALL
            .into_iter()
            .find(|step| step.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = FoldStep::ALL.iter().map(|s| s.name()).collect();
                format!("unknown fold step `{s}` (one of {})", names.join(", "))
            })
    }
}

/// How a fold runs.
#[derive(Clone, Debug)]
pub struct FoldConfig {
    /// How long a committed batch keeps its leases before it is final: a
    /// writer that looked a source up just before it moved and is still on
    /// its way into `open` shows up as a broken lease within this time.
    pub grace: Duration,
    /// Sources per batch at most (each holds a descriptor while it commits).
    pub max_batch: usize,
    /// How long to wait for a live file's `flock` (its values are read for
    /// the exactness check) before leaving its metric for the next fold.
    pub lock_wait: Duration,
    /// Tests: SIGKILL this process when the first batch reaches this step.
    pub kill_at: Option<FoldStep>,
    /// Whether each step is synced to disk before the next (`fsync`), so a
    /// power loss, not only a crash, leaves a state the journal explains.
    /// Scratch copies (tests, the harness, `promlab verify`) skip it.
    pub durable: bool,
}

impl Default for FoldConfig {
    fn default() -> Self {
        FoldConfig {
            grace: Duration::from_millis(20),
            max_batch: 1024,
            lock_wait: Duration::from_secs(2),
            kill_at: None,
            durable: true,
        }
    }
}

/// What one fold did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoldReport {
    /// Files of exited processes (and earlier fold files) folded away.
    pub files_folded: u64,
    /// Fold files written (new or replacing one of the run's).
    pub fold_files_written: u64,
    /// Store files with a writer: left alone.
    pub live_files: u64,
    /// Files whose writers the kernel would not tell about (no lease):
    /// treated as live.
    pub unknown_files: u64,
    /// Exited files left because a `sum` would not stay bit-identical, there
    /// was no name for a fold file between their neighbours, or they hold
    /// entries an exporter skips.
    pub files_left: u64,
    /// Batches given up because a source changed or got a writer before
    /// its commit, or a writer came during the grace period (rolled back).
    pub batches_abandoned: u64,
    /// Journals of interrupted folds finished (rolled forward) or undone.
    pub recovered: u64,
    /// Metrics left for the next fold, and why (a live file stayed locked, a
    /// file could not be read).
    pub metrics_skipped: Vec<String>,
}

/// Folds the exited processes' files of every metric of `registry` in the
/// store `dir`. Finishes interrupted folds first ([`recover`]).
pub fn fold_store(dir: &Path, registry: &Registry, config: &FoldConfig) -> Result<FoldReport> {
    let fold_dir = FoldDir::create(dir, config.durable)?;
    let mut report = FoldReport {
        recovered: fold_dir.recover()?,
        ..FoldReport::default()
    };
    let mut by_metric: HashMap<Vec<u8>, Vec<(Vec<u8>, u64)>> = HashMap::new();
    for entry in std::fs::read_dir(dir)
        .with_context(|| format!("cannot read store directory {}", dir.display()))?
    {
        let entry = entry?;
        let name = entry.file_name().as_encoded_bytes().to_vec();
        if let Some((metric, _)) = parse_file_name(&name) {
            use std::os::unix::fs::DirEntryExt;
            by_metric
                .entry(metric.to_vec())
                .or_default()
                .push((name, entry.ino()));
        }
    }
    let mut killer = config.kill_at;
    for def in &registry.metrics {
        let Some(mut files) = by_metric.remove(def.name.as_bytes()) else {
            continue;
        };
        files.sort();
        let snapshot = match read_metric(dir, &files, config) {
            Ok(snapshot) => snapshot,
            Err(why) => {
                report
                    .metrics_skipped
                    .push(format!("{}: {why:#}", def.name));
                continue;
            }
        };
        for file in &snapshot {
            match file.state {
                FileState::Live => report.live_files += 1,
                FileState::Unknown => report.unknown_files += 1,
                _ => {}
            }
        }
        let mode = def.aggregation();
        let plan = plan_metric(&snapshot, mode, config.max_batch);
        report.files_left += plan.left as u64;
        'runs: for run in &plan.runs {
            // A long run commits batch by batch; each batch's fold file holds
            // the run's aggregate so far and replaces the one before it (the
            // same name), so the store between batches is exact too.
            let mut start = run.files.start;
            while start < run.files.end {
                let end = (start + config.max_batch).min(run.files.end);
                let batch = Batch {
                    members: start..end,
                    name: run.name.clone(),
                    entries: run_entries(&snapshot, run.files.start..end, mode),
                };
                match fold_dir.commit(&def.name, &snapshot, &batch, config, &mut killer) {
                    Ok(true) => {
                        report.files_folded += (end - start) as u64;
                        if end == run.files.end {
                            report.fold_files_written += u64::from(batch.entries.is_some());
                        }
                    }
                    Ok(false) => {
                        report.batches_abandoned += 1;
                        continue 'runs;
                    }
                    Err(err) => {
                        report
                            .metrics_skipped
                            .push(format!("{}: {err:#}", def.name));
                        break 'runs;
                    }
                }
                start = end;
            }
        }
    }
    Ok(report)
}

/// Finishes or undoes the batches that interrupted folds left (their
/// journals); returns how many.
pub fn recover(dir: &Path) -> Result<u64> {
    match FoldDir::open(dir)? {
        Some(fold_dir) => fold_dir.recover(),
        None => Ok(0),
    }
}

// ---------------------------------------------------------------------------
// One metric's files, as the fold read them.

/// What the fold knows of a file's writers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileState {
    /// Written to by a live process: never folded.
    Live,
    /// No lease to say: treated as live.
    Unknown,
    /// Its writer has exited, or it is a fold file: can be folded.
    Exited,
    /// Exited, but its bytes are not a store file, or it holds an entry an
    /// exporter skips: left as it is (an exporter's handling of it stays).
    Odd,
}

/// One file of a metric: its name, identity, state, bytes and entries.
#[derive(Debug)]
struct FileSnapshot {
    name: Vec<u8>,
    ino: u64,
    state: FileState,
    /// The used region (empty when it counts for nothing: corrupt, shorter
    /// than a header, not readable).
    bytes: Vec<u8>,
    /// Per entry: its series, value and timestamp (entries an exporter
    /// skips are not here).
    entries: Vec<(usize, f64, f64)>,
    /// Per entry of `entries`: its raw key's place in `bytes`.
    keys: Vec<(usize, usize)>,
}

/// Reads every file of one metric: exited ones under a read lease taken for
/// the read, live ones under their `flock`, as client_ruby's exporter reads.
fn read_metric(
    dir: &Path,
    files: &[(Vec<u8>, u64)],
    config: &FoldConfig,
) -> Result<Vec<FileSnapshot>> {
    let mut series = SeriesIds::default();
    let mut out = Vec::with_capacity(files.len());
    for (name, ino) in files {
        let path = dir.join(os(name));
        let file = match open_regular(&path) {
            Ok(Some(file)) => file,
            // Gone, or not a regular file: an exporter leaves it out too.
            Ok(None) => continue,
            Err(err) => return Err(err.context(format!("cannot open {}", path.display()))),
        };
        let ino = file.metadata().map(|m| m.ino()).unwrap_or(*ino);
        let (state, bytes) = match liveness::ReadLease::take(&file) {
            Ok(_lease) => (FileState::Exited, read_used(&file)?),
            Err(writers) => {
                let state = if writers == Writers::Open {
                    FileState::Live
                } else {
                    FileState::Unknown
                };
                let deadline = Instant::now() + config.lock_wait;
                if !lock_until(&file, deadline)? {
                    bail!("{} stayed locked", path.display());
                }
                let bytes = read_used(&file);
                let _ = flock(file.as_raw_fd(), libc::LOCK_UN);
                (state, bytes?)
            }
        };
        out.push(series.snapshot(name.clone(), ino, state, bytes));
    }
    Ok(out)
}

fn os(bytes: &[u8]) -> &std::ffi::OsStr {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::OsStr::from_bytes(bytes)
}

/// Opens a listed store file without blocking; `None` if it is gone or not
/// a regular file.
fn open_regular(path: &Path) -> Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(file.metadata()?.is_file().then_some(file))
}

/// `flock(LOCK_EX)`, waiting until `deadline` at most.
fn lock_until(file: &File, deadline: Instant) -> Result<bool> {
    loop {
        match flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => return Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Ok(false);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The file's used region: empty when it is shorter than a header or its
/// `used` is bad (an exporter reads the first as empty and skips the second).
fn read_used(file: &File) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    if len < 4 {
        return Ok(Vec::new());
    }
    let mut header = [0u8; 4];
    file.read_exact_at(&mut header, 0)?;
    let Ok(used) = check_used(header, len) else {
        return Ok(Vec::new());
    };
    let mut bytes = vec![0u8; used];
    match file.read_exact_at(&mut bytes, 0) {
        Ok(()) => Ok(bytes),
        // Shrunk under us: it counts for nothing.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// A decoded label set: (name, value) pairs, as bytes.
type LabelSet = Vec<(Vec<u8>, Vec<u8>)>;

/// Where a raw key lies: (file index, (start, end) of its bytes in the file).
type KeyPlace = (usize, (usize, usize));

/// A folded series: its first raw key met, its aggregate value and timestamp.
type FoldedEntry = (KeyPlace, f64, f64);

/// Decoded label sets → series numbers, for one metric.
#[derive(Default)]
struct SeriesIds {
    ids: HashMap<LabelSet, usize>,
}

impl SeriesIds {
    fn snapshot(
        &mut self,
        name: Vec<u8>,
        ino: u64,
        state: FileState,
        bytes: Vec<u8>,
    ) -> FileSnapshot {
        let mut snapshot = FileSnapshot {
            name,
            ino,
            state,
            bytes: Vec::new(),
            entries: Vec::new(),
            keys: Vec::new(),
        };
        if bytes.len() < HEADER_SIZE {
            // Shorter than a header: empty (and nothing to keep of it).
            return snapshot;
        }
        let used = bytes.len();
        let mut odd = false;
        for entry in entries(&bytes, used) {
            let Ok(entry) = entry else {
                // Corrupt: an exporter leaves the whole file out.
                snapshot.entries.clear();
                snapshot.keys.clear();
                if snapshot.state == FileState::Exited {
                    snapshot.state = FileState::Odd;
                }
                return snapshot;
            };
            let key = entry.key();
            match exportable_labels(key) {
                Some(labels) => {
                    let next = self.ids.len();
                    let id = *self.ids.entry(labels).or_insert(next);
                    let start = entry.offset() + 4;
                    snapshot
                        .entries
                        .push((id, entry.value(), entry.timestamp()));
                    snapshot.keys.push((start, start + key.len()));
                }
                None => odd = true,
            }
        }
        if odd && snapshot.state == FileState::Exited {
            snapshot.state = FileState::Odd;
        }
        snapshot.bytes = bytes;
        snapshot
    }
}

/// A raw key's labels when every exporter exports it (it decodes, names
/// valid labels, none of them `__name__`, values in UTF-8); `None` for keys
/// an exporter skips. Stricter than needed is safe: such files stay as
/// they are.
fn exportable_labels(raw: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let labels = formenc::decode_key_reference(raw).ok()?;
    labels
        .into_iter()
        .map(|(name, value)| {
            let ok = is_label_name(&name)
                && &*name != b"__name__"
                && std::str::from_utf8(&value).is_ok();
            ok.then(|| (name.into_owned(), value.into_owned()))
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The plan: which files fold into which fold file, checked exact.

/// A run of exited files to fold, and its fold file's name.
#[derive(Debug)]
struct RunPlan {
    /// Indices of the files folded (consecutive in name order).
    files: std::ops::Range<usize>,
    /// The fold file's name, placed where the run was.
    name: Vec<u8>,
}

/// One commit of a run: some of its files, and the fold file that then holds
/// the run's aggregate from its first file to the batch's last.
#[derive(Debug)]
struct Batch {
    /// Indices of the files this batch moves out.
    members: std::ops::Range<usize>,
    name: Vec<u8>,
    /// Per series: the first raw key met (file, key span), the aggregate
    /// value and timestamp; `None` when there is no entry (the files are only
    /// removed).
    entries: Option<Vec<FoldedEntry>>,
}

/// A run's own aggregate over `files`, series in order of first appearance.
fn run_entries(
    files: &[FileSnapshot],
    range: std::ops::Range<usize>,
    mode: ProcessAggregation,
) -> Option<Vec<FoldedEntry>> {
    let mut run = Run {
        start: range.start,
        series: Vec::new(),
        place: HashMap::new(),
    };
    for i in range {
        add_to_run(&mut run, i, &files[i], &[], mode);
    }
    (!run.series.is_empty()).then(|| {
        run.series
            .iter()
            .map(|&(_, _, agg, key)| (key, agg.value, agg.timestamp))
            .collect()
    })
}

struct Plan {
    runs: Vec<RunPlan>,
    /// Exited files that stay (no exact fold, no name, odd bytes).
    left: usize,
}

/// The run being built: files `start..`, their own aggregates, and the
/// aggregates before the run of the series they touch.
struct Run {
    start: usize,
    /// Per series touched: (aggregate before the run, the run's aggregate,
    /// first raw key), in order of first appearance in the run.
    series: Vec<(usize, Option<Aggregate>, Aggregate, KeyPlace)>,
    place: HashMap<usize, usize>,
}

/// Plans one metric's batches. Walks the files in name order, keeping every
/// series' aggregate as an exporter would; a run of exited files grows file
/// by file while, for every series the new file touches, the aggregate
/// before the run folded with the run's own aggregate is bit for bit the
/// aggregate after it. Otherwise (and at a live or odd file, or the end) the
/// run closes, and is folded if it has two files or more and a name fits
/// between its neighbours (and before its second batch, `max_batch` files in).
fn plan_metric(files: &[FileSnapshot], mode: ProcessAggregation, max_batch: usize) -> Plan {
    let mut state: Vec<Option<Aggregate>> = Vec::new();
    let mut plan = Plan {
        runs: Vec::new(),
        left: 0,
    };
    let mut run: Option<Run> = None;
    // The nearest file before the run that stays (its name bounds the fold
    // file's), or the fold file of the batch just before.
    let mut prev_name: Option<Vec<u8>> = None;
    for (i, file) in files.iter().enumerate() {
        let foldable = file.state == FileState::Exited;
        if let Some(open) = &run {
            if !foldable || !extends_exactly(open, file, &state, mode) {
                let closed = run.take().expect("open");
                close_run(closed, i, files, max_batch, &mut plan, &mut prev_name);
            }
        }
        if foldable && run.is_none() {
            // A file that is not exact on its own (a label set under two
            // spellings, a sum that does not associate) starts no run.
            let fresh = Run {
                start: i,
                series: Vec::new(),
                place: HashMap::new(),
            };
            if extends_exactly(&fresh, file, &state, mode) {
                run = Some(fresh);
            } else {
                plan.left += 1;
            }
        }
        match &mut run {
            Some(open) if foldable => add_to_run(open, i, file, &state, mode),
            _ => {
                if file.state == FileState::Odd {
                    plan.left += 1;
                }
                prev_name = Some(file.name.clone());
            }
        }
        // The exporter's own aggregate, over every file.
        for &(series, value, timestamp) in &file.entries {
            if series >= state.len() {
                state.resize(series + 1, None);
            }
            fold_into(&mut state[series], mode, value, timestamp);
        }
    }
    if let Some(closed) = run {
        close_run(
            closed,
            files.len(),
            files,
            max_batch,
            &mut plan,
            &mut prev_name,
        );
    }
    plan
}

fn fold_into(slot: &mut Option<Aggregate>, mode: ProcessAggregation, value: f64, timestamp: f64) {
    match slot {
        Some(agg) => agg.fold(mode, value, timestamp),
        None => *slot = Some(Aggregate { value, timestamp }),
    }
}

/// Whether `file` can join `run` with every series still exact.
fn extends_exactly(
    run: &Run,
    file: &FileSnapshot,
    state: &[Option<Aggregate>],
    mode: ProcessAggregation,
) -> bool {
    // The file's effect on the series it touches, both ways.
    let mut seq: HashMap<usize, Option<Aggregate>> = HashMap::new();
    let mut own: HashMap<usize, (Option<Aggregate>, Aggregate)> = HashMap::new();
    for &(series, value, timestamp) in &file.entries {
        let slot = seq
            .entry(series)
            .or_insert_with(|| state.get(series).copied().flatten());
        fold_into(slot, mode, value, timestamp);
        match own.get_mut(&series) {
            Some((_, agg)) => agg.fold(mode, value, timestamp),
            None => {
                let (before, mut agg) = match run.place.get(&series) {
                    Some(&at) => (run.series[at].1, run.series[at].2),
                    None => (
                        state.get(series).copied().flatten(),
                        Aggregate { value, timestamp },
                    ),
                };
                if run.place.contains_key(&series) {
                    agg.fold(mode, value, timestamp);
                }
                own.insert(series, (before, agg));
            }
        }
    }
    own.iter().all(|(series, (before, agg))| {
        let mut combined = *before;
        fold_into(&mut combined, mode, agg.value, agg.timestamp);
        same(combined, seq[series], mode)
    })
}

/// Whether two aggregates print alike and fold alike from here on.
fn same(a: Option<Aggregate>, b: Option<Aggregate>, mode: ProcessAggregation) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => {
            a.value.to_bits() == b.value.to_bits()
                && (mode != ProcessAggregation::MostRecent
                    || a.timestamp.to_bits() == b.timestamp.to_bits())
        }
        (None, None) => true,
        _ => false,
    }
}

fn add_to_run(
    run: &mut Run,
    index: usize,
    file: &FileSnapshot,
    state: &[Option<Aggregate>],
    mode: ProcessAggregation,
) {
    for (&(series, value, timestamp), &key) in file.entries.iter().zip(&file.keys) {
        match run.place.get(&series) {
            Some(&at) => {
                let agg = &mut run.series[at].2;
                agg.fold(mode, value, timestamp);
                if mode != ProcessAggregation::MostRecent {
                    // Informational: the newest write folded in.
                    agg.timestamp = agg.timestamp.max(timestamp);
                }
            }
            None => {
                run.place.insert(series, run.series.len());
                run.series.push((
                    series,
                    state.get(series).copied().flatten(),
                    Aggregate { value, timestamp },
                    (index, key),
                ));
            }
        }
    }
}

/// Plans a closed run (files `run.start..end`) when it has two files or
/// more and a fold file's name fits between its neighbours.
fn close_run(
    run: Run,
    end: usize,
    files: &[FileSnapshot],
    max_batch: usize,
    plan: &mut Plan,
    prev_name: &mut Option<Vec<u8>>,
) {
    let members = &files[run.start..end];
    // The fold file sorts before the files of the run's later batches, which
    // are still there while the first batch is its only part folded.
    let next_name = files
        .get(end.min(run.start + max_batch.max(1)))
        .map(|f| f.name.as_slice());
    let first_batch = &members[..members.len().min(max_batch.max(1))];
    let name = if members.len() >= 2 {
        fold_file_name(first_batch, prev_name.as_deref(), next_name)
    } else {
        None
    };
    match name {
        Some(name) => {
            *prev_name = Some(name.clone());
            plan.runs.push(RunPlan {
                files: run.start..end,
                name,
            });
        }
        None => {
            // A lone exited file stays (no fold file would be fewer files).
            plan.left += members.len();
            *prev_name = members.last().map(|f| f.name.clone());
        }
    }
}

/// A fold file's name for a run: strictly between `prev` and `next` (the
/// names that stay around it) so the run's place in name order is kept, and
/// with an id of [`FOLD_ID_DIGITS`] digits or more. A fold file of the run
/// keeps its name (and is replaced in one rename); otherwise a run member's
/// id followed by zeros, the first name after it in name order that no
/// process can have.
fn fold_file_name(
    members: &[FileSnapshot],
    prev: Option<&[u8]>,
    next: Option<&[u8]>,
) -> Option<Vec<u8>> {
    let fits = |name: &[u8]| prev.is_none_or(|p| p < name) && next.is_none_or(|n| name < n);
    if let Some(own) = members
        .iter()
        .find(|f| parse_file_name(&f.name).is_some_and(|(_, id)| is_fold_id(id)))
    {
        return fits(&own.name).then(|| own.name.clone());
    }
    members.iter().find_map(|member| {
        let (metric, id) = parse_file_name(&member.name)?;
        let zeros = FOLD_ID_DIGITS.saturating_sub(id.len()).max(1);
        let mut name = b"metric_".to_vec();
        name.extend_from_slice(metric);
        name.extend_from_slice(b"___");
        name.extend_from_slice(id);
        name.resize(name.len() + zeros, b'0');
        name.extend_from_slice(b".bin");
        fits(&name).then_some(name)
    })
}

// ---------------------------------------------------------------------------
// The fold's directory: lock, journals, commit and recovery.

/// A batch as its journal records it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Journal {
    /// The fold file's name in the store.
    name: String,
    /// The inode of the new fold file (the commit renames it to `name`);
    /// 0 when the batch only removes files.
    new_ino: u64,
    /// Whether `name` held a fold file before, kept as `<metric>.prev`.
    had_prev: bool,
    /// The files folded, with the inodes read.
    sources: Vec<JournalSource>,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct JournalSource {
    name: String,
    ino: u64,
}

/// `<store>/.fold/`.
struct FoldDir {
    store: PathBuf,
    path: PathBuf,
    durable: bool,
}

impl FoldDir {
    fn create(store: &Path, durable: bool) -> Result<FoldDir> {
        let path = store.join(FOLD_DIR);
        std::fs::create_dir_all(path.join(TRASH_DIR))
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(FoldDir {
            store: store.to_path_buf(),
            path,
            durable,
        })
    }

    fn open(store: &Path) -> Result<Option<FoldDir>> {
        let path = store.join(FOLD_DIR);
        if !path.is_dir() {
            return Ok(None);
        }
        FoldDir::create(store, true).map(Some)
    }

    /// `fsync` of a directory, when durable.
    fn sync(&self, dir: &Path) -> Result<()> {
        if self.durable {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// The fold lock, taken exclusively.
    fn lock(&self) -> Result<File> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(self.path.join(LOCK_FILE))?;
        flock(file.as_raw_fd(), libc::LOCK_EX)?;
        Ok(file)
    }

    fn journal_path(&self, metric: &str) -> PathBuf {
        self.path.join(format!("{metric}.journal"))
    }

    fn new_path(&self, metric: &str) -> PathBuf {
        self.path.join(format!("{metric}.new"))
    }

    fn prev_path(&self, metric: &str) -> PathBuf {
        self.path.join(format!("{metric}.prev"))
    }

    fn trash_path(&self, name: &str) -> PathBuf {
        self.path.join(TRASH_DIR).join(name)
    }

    /// Runs one batch; `Ok(false)` when it was given up (nothing changed).
    fn commit(
        &self,
        metric: &str,
        files: &[FileSnapshot],
        batch: &Batch,
        config: &FoldConfig,
        kill_at: &mut Option<FoldStep>,
    ) -> Result<bool> {
        let step = |reached: FoldStep| {
            if *kill_at == Some(reached) {
                // SAFETY: raise has no preconditions; this is the test's crash.
                unsafe { libc::raise(libc::SIGKILL) };
            }
        };
        let members = &files[batch.members.clone()];
        let name = String::from_utf8(batch.name.clone()).context("fold file name")?;
        // 1. Sources reopened, leased and read again: exactly as planned.
        let mut opened = Vec::with_capacity(members.len());
        for member in members {
            let path = self.store.join(os(&member.name));
            let Some(file) = open_regular(&path)? else {
                return Ok(false);
            };
            if file.metadata()?.ino() != member.ino {
                return Ok(false);
            }
            opened.push(file);
        }
        let mut leases = Vec::with_capacity(opened.len());
        for (file, member) in opened.iter().zip(members) {
            let Ok(lease) = ReadLease::take(file) else {
                return Ok(false);
            };
            if read_used(file)? != member.bytes {
                return Ok(false);
            }
            leases.push(lease);
        }
        // 2. The new fold file, and the one it replaces kept aside.
        let new_path = self.new_path(metric);
        let prev_path = self.prev_path(metric);
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
            std::fs::hard_link(self.store.join(&name), &prev_path)?;
        }
        step(FoldStep::NewWritten);
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
                    })
                })
                .collect::<Result<_>>()?,
        };
        let journal_path = self.journal_path(metric);
        let tmp = journal_path.with_extension("journal-tmp");
        write_synced(&tmp, &serde_json::to_vec(&journal)?, self.durable)?;
        std::fs::rename(&tmp, &journal_path)?;
        self.sync(&self.path)?;
        step(FoldStep::JournalWritten);
        if !leases.iter().all(ReadLease::intact) {
            self.undo(metric, &journal)?;
            return Ok(false);
        }
        // 4. The commit, then the sources out of the store, under the lock.
        {
            let _lock = self.lock()?;
            if new_ino != 0 {
                std::fs::rename(&new_path, self.store.join(&name))?;
            } else if replaces {
                std::fs::remove_file(self.store.join(&name))?;
            }
            self.sync(&self.store)?;
            step(FoldStep::Committed);
            for (i, source) in journal.sources.iter().enumerate() {
                std::fs::rename(self.store.join(&source.name), self.trash_path(&source.name))?;
                if i == 0 {
                    step(FoldStep::FirstTrashed);
                }
            }
            self.sync(&self.store)?;
        }
        step(FoldStep::Trashed);
        // 5. A writer on its way into a source's `open` shows up by now.
        std::thread::sleep(config.grace);
        let intact = leases.iter().all(ReadLease::intact);
        if !intact {
            let _lock = self.lock()?;
            self.roll_back(metric, &journal)?;
        }
        drop(leases);
        drop(opened);
        step(FoldStep::Released);
        if !intact {
            return Ok(false);
        }
        // 6. Clean up; the journal last.
        for source in &journal.sources {
            remove_if_there(&self.trash_path(&source.name))?;
        }
        remove_if_there(&prev_path)?;
        step(FoldStep::Cleaned);
        std::fs::remove_file(&journal_path)?;
        self.sync(&self.path)?;
        Ok(true)
    }

    /// Undoes a batch that did not commit: its new file, `prev` and journal go.
    fn undo(&self, metric: &str, _journal: &Journal) -> Result<()> {
        remove_if_there(&self.new_path(metric))?;
        remove_if_there(&self.prev_path(metric))?;
        remove_if_there(&self.journal_path(metric))?;
        self.sync(&self.path)
    }

    /// Undoes a committed batch: sources back from `trash/` (never over a
    /// file created at their name since), the fold file back to what it was.
    fn roll_back(&self, metric: &str, journal: &Journal) -> Result<()> {
        for source in &journal.sources {
            let trashed = self.trash_path(&source.name);
            if trashed.exists() {
                rename_no_replace(&trashed, &self.store.join(&source.name))?;
            }
        }
        let target = self.store.join(&journal.name);
        let prev = self.prev_path(metric);
        if journal.had_prev && prev.exists() {
            std::fs::rename(&prev, &target)?;
        } else if journal.new_ino != 0 && ino_of(&target) == Some(journal.new_ino) {
            std::fs::remove_file(&target)?;
        }
        self.sync(&self.store)?;
        remove_if_there(&self.new_path(metric))?;
        remove_if_there(&self.journal_path(metric))?;
        self.sync(&self.path)
    }

    /// Finishes or undoes every batch with a journal (see the module doc).
    fn recover(&self) -> Result<u64> {
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
            let Some(metric) = file_name.strip_suffix(".journal") else {
                continue;
            };
            let journal: Journal = serde_json::from_slice(&std::fs::read(&path)?)
                .with_context(|| format!("bad fold journal {}", path.display()))?;
            recovered += 1;
            if !is_committed(&self.store, &journal) {
                // Sources move only after the commit: they are all in place.
                self.undo(metric, &journal)?;
                continue;
            }
            // Committed: each source still in the store must be exited to
            // be moved out; one with a writer again (its pid reused after the
            // crash) undoes the whole batch instead.
            let mut resurrected = false;
            for source in &journal.sources {
                let at = self.store.join(&source.name);
                if ino_of(&at) == Some(source.ino) {
                    let file = File::open(&at)?;
                    if liveness::probe(&file) != Writers::None {
                        resurrected = true;
                    }
                }
            }
            if resurrected {
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

/// Whether a journal's batch committed: its fold file is in place (or, for a
/// batch that only removes files, it went past its journal: treated as
/// committed, since removing files of no entries changes nothing).
fn is_committed(store: &Path, journal: &Journal) -> bool {
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
    file: std::sync::Arc<File>,
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

fn ino_of(path: &Path) -> Option<u64> {
    std::fs::symlink_metadata(path).ok().map(|m| m.ino())
}

fn remove_if_there(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// Writes `bytes` to a new file at `path` (replacing one there), synced if
/// `durable`; returns its inode.
fn write_synced(path: &Path, bytes: &[u8], durable: bool) -> Result<u64> {
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

/// `rename` that fails rather than replace a file at `to`.
fn rename_no_replace(from: &Path, to: &Path) -> Result<()> {
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
        let err = std::io::Error::last_os_error();
        return Err(anyhow!(err).context(format!(
            "cannot move {} back to {}",
            from.display(),
            to.display()
        )));
    }
    Ok(())
}
