//! The `fold-exited` strategy's fold: the files of processes that have
//! exited are folded, per metric, into fold files by each aggregation's rule,
//! so a store that long-running apps fill with one file per worker per
//! metric (client_ruby#143, #232) goes back to O(live processes) files.
//!
//! In the one-file-per-process layout of client_ruby's `poc_file_per_process`
//! branch (`metrics___<pid>.bin`, [`crate::export::per_process`]) all of a
//! store's such files are one group, folded by the same rules into
//! `metrics___<8+ digits>.bin`, each series (its metric and its other
//! labels) by its own metric's aggregation.
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
//! 2. the fold file written to `.fold/<key>.new` and synced; the
//!    fold file it replaces, if any, hard-linked to `<key>.prev`;
//! 3. the journal `<key>.journal` written (via a temporary, synced);
//! 4. under the store's fold lock (exclusive): the new file renamed into
//!    place (**the commit**), then every source renamed to `trash/`;
//! 5. after a grace period, every lease checked: a writer that started
//!    opening a source meanwhile (a new process given the dead one's pid)
//!    rolls the batch back, so it gets the file back with its values (a
//!    rollback is recorded first and always completes, a source whose name
//!    was created again going back beside it: `FoldDir::roll_back`);
//! 6. leases released, `trash/` and `prev` removed, then the journal.
//!
//! Batches of different runs of a metric touch different files, so a
//! *round* of them (up to `max_batch` files) goes through step 4 under one
//! hold of the lock and shares one grace period; each keeps its own journal
//! (`<key>` is `<metric>`, then `<metric>.1`, `<metric>.2`, ...). One fold
//! runs on a store at a time (`.fold/run.lock`).
//!
//! [`recover`] finishes or undoes a batch a crash (SIGKILL) interrupted: a
//! rollback under way is finished; a journal whose new file is in place
//! (same inode) is rolled forward, unless a source has a writer again or no
//! longer holds the bytes folded (then rolled back); any other is undone; so
//! no value is lost or counted twice. promlab's
//! exporters take the fold lock shared for a scrape that reads the listing
//! and leave out the sources of a committed journal still in place
//! ([`committed_sources`]), so they never see a half-done batch (a scrape by
//! a plan reads only files it holds mapped, which a batch does not change,
//! and takes no lock); client_ruby's exporter does not know
//! the lock (see the dossier, `strategies/fold-exited.md`, for what it may
//! see during a fold).

use crate::export::aggregate::Aggregate;
use crate::export::liveness::{self, HeldLease, Writers};
use crate::format::formenc;
use crate::format::registry::{is_label_name, ProcessAggregation, Registry};
use crate::format::storefile::{
    self, check_used, entries, flock, is_fold_id, parse_file_name, parse_process_file_name,
    FOLD_ID_DIGITS, HEADER_SIZE, METRIC_NAME_LABEL,
};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

mod dir;
mod plan;
mod snapshot;
#[cfg(test)]
mod tests;

use dir::*;
pub use dir::{committed_sources, SharedLock};
use plan::*;
use snapshot::*;

/// The journal key of the one-file-per-process layout's batches (no metric
/// name has a `-`, so it is no metric's).
const PER_PROCESS_KEY: &str = "per-process";

/// Each series' aggregation in a plan.
pub(super) enum Modes {
    /// One metric's files: its aggregation.
    One(ProcessAggregation),
    /// One-file-per-process files: per series, its metric's.
    PerSeries(Vec<ProcessAggregation>),
}

impl Modes {
    pub(super) fn of(&self, series: usize) -> ProcessAggregation {
        match self {
            Modes::One(mode) => *mode,
            Modes::PerSeries(modes) => modes[series],
        }
    }
}

/// A store file's id, in either layout (`metric_<name>___<id>.bin`,
/// `metrics___<id>.bin`).
pub(super) fn file_id(name: &[u8]) -> Option<&[u8]> {
    parse_file_name(name)
        .map(|(_, id)| id)
        .or_else(|| parse_process_file_name(name))
}

/// The fold's own directory inside a store directory.
pub const FOLD_DIR: &str = ".fold";
/// The fold lock: exclusive while a batch commits, shared by promlab's
/// exporters for a scrape.
const LOCK_FILE: &str = "lock";
/// Held exclusively by the one fold that runs on a store (whoever runs it:
/// sidecars, `promlab fold`); another finds it held and leaves the store to it.
const RUN_LOCK_FILE: &str = "run.lock";
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
    /// Sources per batch, and per round of batches committed together, at
    /// most (each holds a descriptor and a lease while it commits).
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
    /// How far behind the fold is: of the processes' files it folded, the
    /// longest one waited, from its writer's last write to the end of this
    /// fold (`None` when it folded none).
    pub lag: Option<Duration>,
    /// Another fold of the store was running: this one did nothing.
    pub another_running: bool,
}

/// Folds the exited processes' files of every metric of `registry` in the
/// store `dir`. Finishes interrupted folds first ([`recover`]). One fold
/// runs on a store at a time: if another is running (another sidecar,
/// `promlab fold`), this one does nothing and says so
/// ([`FoldReport::another_running`]); two at once would finish and undo
/// each other's batches.
pub fn fold_store(dir: &Path, registry: &Registry, config: &FoldConfig) -> Result<FoldReport> {
    let fold_dir = FoldDir::create(dir, config.durable)?;
    let Some(_running) = fold_dir.run_lock()? else {
        return Ok(FoldReport {
            another_running: true,
            ..FoldReport::default()
        });
    };
    let mut report = FoldReport {
        recovered: fold_dir.recover()?,
        ..FoldReport::default()
    };
    let mut by_metric: HashMap<Vec<u8>, Vec<(Vec<u8>, u64)>> = HashMap::new();
    let mut per_process: Vec<(Vec<u8>, u64)> = Vec::new();
    for entry in std::fs::read_dir(dir)
        .with_context(|| format!("cannot read store directory {}", dir.display()))?
    {
        let entry = entry?;
        let name = entry.file_name().as_encoded_bytes().to_vec();
        use std::os::unix::fs::DirEntryExt;
        if let Some((metric, _)) = parse_file_name(&name) {
            by_metric
                .entry(metric.to_vec())
                .or_default()
                .push((name, entry.ino()));
        } else if parse_process_file_name(&name).is_some() {
            per_process.push((name, entry.ino()));
        }
    }
    let mut fold = Folding {
        dir,
        fold_dir: &fold_dir,
        config,
        killer: config.kill_at,
        report: &mut report,
        oldest: None,
        per_metric: HashMap::new(),
        per_metric_read: true,
    };
    for def in &registry.metrics {
        let Some(files) = by_metric.remove(def.name.as_bytes()) else {
            continue;
        };
        let ids = SeriesIds::default();
        fold.group(&def.name, files, ids, def.aggregation());
    }
    if !per_process.is_empty() {
        // The one-file-per-process layout: its files are one group, each
        // series folded by its own metric's aggregation.
        let ids = SeriesIds::per_process(registry);
        fold.group(PER_PROCESS_KEY, per_process, ids, ProcessAggregation::Sum);
    }
    let oldest = fold.oldest;
    report.lag = oldest.map(|mtime| mtime.elapsed().unwrap_or_default());
    Ok(report)
}

/// One fold of a store, group by group (a metric's files, or the
/// one-file-per-process layout's).
struct Folding<'a> {
    dir: &'a Path,
    fold_dir: &'a FoldDir,
    config: &'a FoldConfig,
    killer: Option<FoldStep>,
    report: &'a mut FoldReport,
    /// The last write of the longest-waiting process's file folded.
    oldest: Option<SystemTime>,
    /// Every series of the per-metric files (`___metric_name` first, then
    /// its labels), with its aggregate over them: what an exporter has
    /// folded before it reads the one-file-per-process layout's files.
    per_metric: HashMap<LabelSet, Aggregate>,
    /// Whether every metric's per-metric files were read.
    per_metric_read: bool,
}

impl Folding<'_> {
    /// Folds one group's files (`key` names it in journals and the report).
    fn group(
        &mut self,
        key: &str,
        mut files: Vec<(Vec<u8>, u64)>,
        mut ids: SeriesIds,
        one: ProcessAggregation,
    ) {
        let (config, report) = (self.config, &mut *self.report);
        let per_process = ids.metrics.is_some();
        if per_process && !self.per_metric_read {
            // Its runs could not be checked against what comes before them.
            report
                .metrics_skipped
                .push(format!("{key}: a metric's per-metric files were not read"));
            return;
        }
        files.sort();
        let snapshot = match read_metric(self.dir, &files, config, &mut ids) {
            Ok(snapshot) => snapshot,
            Err(why) => {
                report.metrics_skipped.push(format!("{key}: {why:#}"));
                self.per_metric_read &= per_process;
                return;
            }
        };
        let mut before: Vec<Option<Aggregate>> = vec![None; ids.ids.len()];
        if per_process {
            for (labels, &series) in &ids.ids {
                before[series] = self.per_metric.get(labels).copied();
            }
        } else {
            for file in &snapshot {
                for &(series, value, timestamp) in &file.entries {
                    fold_into(&mut before[series], one, value, timestamp);
                }
            }
            for (labels, &series) in &ids.ids {
                if let Some(agg) = before[series] {
                    let mut named = vec![(METRIC_NAME_LABEL.to_vec(), key.as_bytes().to_vec())];
                    named.extend(labels.iter().cloned());
                    self.per_metric.insert(named, agg);
                }
            }
            before.clear();
        }
        for file in &snapshot {
            match file.state {
                FileState::Live => report.live_files += 1,
                FileState::Unknown => report.unknown_files += 1,
                _ => {}
            }
        }
        let modes = ids.modes(one);
        let plan = plan_metric(&snapshot, &modes, config.max_batch, before);
        report.files_left += plan.left as u64;
        // A long run commits batch by batch; each batch's fold file holds
        // the run's aggregate so far and replaces the one before it (the
        // same name), so the store between batches is exact too. Batches of
        // different runs (files and fold files apart) commit together, up
        // to `max_batch` files a round, sharing the lock and one grace.
        let max = config.max_batch.max(1);
        // Per run, the first file of its next batch (past its end once
        // folded or given up).
        let mut next: Vec<usize> = plan.runs.iter().map(|run| run.files.start).collect();
        'rounds: loop {
            let mut round: Vec<(usize, Batch)> = Vec::new();
            let mut size = 0;
            for (r, run) in plan.runs.iter().enumerate() {
                let start = next[r];
                if start >= run.files.end {
                    continue;
                }
                let end = (start + max).min(run.files.end);
                if size > 0 && size + (end - start) > max {
                    continue;
                }
                size += end - start;
                round.push((
                    r,
                    Batch {
                        members: start..end,
                        name: run.name.clone(),
                        entries: run_entries(&snapshot, run.files.start..end, &modes),
                    },
                ));
            }
            if round.is_empty() {
                break;
            }
            let batches: Vec<Batch> = round.iter().map(|(_, batch)| batch.clone()).collect();
            match self
                .fold_dir
                .fold_round(key, &snapshot, &batches, config, &mut self.killer)
            {
                Ok(folded) => {
                    for ((r, batch), ok) in round.into_iter().zip(folded) {
                        let run = &plan.runs[r];
                        if !ok {
                            report.batches_abandoned += 1;
                            next[r] = run.files.end;
                            continue;
                        }
                        report.files_folded += batch.members.len() as u64;
                        for file in &snapshot[batch.members.clone()] {
                            let waiting = file_id(&file.name).is_some_and(|id| !is_fold_id(id));
                            if let (true, Some(mtime)) = (waiting, file.mtime) {
                                self.oldest =
                                    Some(self.oldest.map_or(mtime, |o: SystemTime| o.min(mtime)));
                            }
                        }
                        next[r] = batch.members.end;
                        if batch.members.end == run.files.end {
                            report.fold_files_written += u64::from(batch.entries.is_some());
                        }
                    }
                }
                Err(err) => {
                    report.metrics_skipped.push(format!("{key}: {err:#}"));
                    break 'rounds;
                }
            }
        }
    }
}

/// Finishes or undoes the batches that interrupted folds left (their
/// journals); returns how many. Nothing while another fold runs (it
/// recovers first itself).
pub fn recover(dir: &Path) -> Result<u64> {
    match FoldDir::open(dir)? {
        Some(fold_dir) => match fold_dir.run_lock()? {
            Some(_running) => fold_dir.recover(),
            None => Ok(0),
        },
        None => Ok(0),
    }
}
