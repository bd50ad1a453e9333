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

use crate::export::aggregate::Aggregate;
use crate::export::liveness::{self, ReadLease, Writers};
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

mod dir;
mod plan;
mod snapshot;

use dir::*;
pub use dir::{committed_sources, SharedLock};
use plan::*;
use snapshot::*;

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
