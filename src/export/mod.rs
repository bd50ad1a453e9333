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
//! Bad input never fails a scrape: a file that vanished, is not
//! a regular file, stays locked, is corrupt, shrinks while mapped (see
//! [`mapguard`]) or cannot be read is left out whole, an entry whose key
//! does not decode or would not be a valid Prometheus label set is left out
//! alone, and [`Exporter::last_report`] says what was. NaN in `min`/`max`
//! loses to any number, so the result does not depend on file order (Ruby's
//! `Array#max` raises on it).
//!
//! No file costs a scrape more than a bounded share of it: each
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
//!
//! A store in the one-file-per-process layout of client_ruby's
//! `poc_file_per_process` branch (`metrics___<pid>.bin`), or holding both
//! layouts, is read by [`per_process`] once the listing met such a file.

mod aggregate;
pub mod dump;
pub(crate) mod fileset;
pub mod fold;
mod keys;
pub mod liveness;
mod per_process;
mod plan;
mod read;
mod scrape;
mod skip;

pub use crate::export::fileset::Watch as StoreWatch;
use crate::export::fileset::{FileSet, Listed};
use crate::export::liveness::Writers;
pub use crate::export::per_process::split_metric_name;
use crate::format::formenc;
use crate::format::registry::{is_label_name, MetricDef, MetricType, ProcessAggregation, Registry};
use crate::format::storefile::{
    check_used, entries, flock, strip_padding, Entry, EntryError, HEADER_SIZE,
};
use crate::render;
use crate::shared::event_probe::probe;
use crate::shared::mapguard;
use crate::shared::metric_values::{
    DecodedLabels, Group, HistogramValue, MetricValues, RenderedText, SummaryValue,
};
use crate::shared::seams::{ExportSeams, FileRead, Keep, KeyDecode, Listing, Liveness, Seams};
use crate::shared::strategy::StrategySet;
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

pub(crate) use aggregate::*;
use keys::*;
pub use read::*;
use scrape::*;
pub use skip::*;

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
    /// Set once a file of the one-file-per-process layout was met: the
    /// store is read as [`per_process`] reads it from then on.
    per_process: Option<Box<per_process::PerProcess>>,
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
            per_process: None,
        }
    }

    /// An exporter for one scrape: nothing is kept for a next one, so files
    /// are read as `single-read` reads them per scrape (no mapping kept, no
    /// watch), whatever else the strategies keep.
    fn one_shot(mut self) -> Exporter {
        if self.seams.file_read == FileRead::KeptMapped {
            self.read_afresh_each_scrape();
        }
        self
    }

    /// Files listed once per scrape and mapped only while read (no mapping
    /// kept, no watch): a fresh reader and file set for these seams.
    fn read_afresh_each_scrape(&mut self) {
        self.seams.listing = Listing::OncePerScrape;
        if self.seams.file_read == FileRead::KeptMapped {
            self.seams.file_read = FileRead::Mapped;
        }
        self.reader = FileReader::new(self.seams.file_read, self.seams.liveness);
        let names: Vec<String> = self
            .registry
            .metrics
            .iter()
            .map(|m| m.name.clone())
            .collect();
        self.files = FileSet::new(&self.dir, &names, self.seams.listing);
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

    /// The store directory it exports.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What the last scrape left out.
    pub fn last_report(&self) -> &ScrapeReport {
        &self.report
    }

    /// Reads, decodes and aggregates one metric.
    pub fn values(&mut self, def_index: usize) -> Result<MetricValues<'_>> {
        self.report.clear();
        let deadline = self.start_clocks();
        self.reader.start_scrape();
        if self.per_process.is_some() || self.files.process_files_seen() {
            self.scrape_per_process(deadline, None)?;
        } else {
            let _fold_lock = self.files.lock_for_scrape()?;
            self.absorb_listing_changes();
            self.scrape(def_index, deadline)?;
        }
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
        // fails), so a watched store's scrape skips the `stat`.
        if !self.files.watching() && !self.dir.is_dir() {
            bail!("store directory {} does not exist", self.dir.display());
        }
        out.clear();
        self.report.clear();
        let deadline = self.start_clocks();
        self.reader.start_scrape();
        if self.per_process.is_some() {
            return self.scrape_per_process(deadline, Some(out));
        }
        // Without the fold lock: a plan reads only the files it holds
        // mapped, whose bytes a fold does not change (it renames a new fold
        // file in and its sources out), so a fold under way leaves it the
        // store as it was before the fold. It runs only if the listing
        // changed in nothing since it was made (no event at all); any
        // change, a batch's first rename included, sends the scrape to the
        // listing, which is brought up to date under the lock.
        if self.plan.is_some() {
            self.files.update()?;
            self.absorb_listing_changes();
            if self.files.process_files_seen() {
                return self.scrape_per_process(deadline, Some(out));
            }
            if self.run_plan(out) {
                return Ok(());
            }
        }
        let fold_lock = self.files.lock_for_scrape()?;
        self.absorb_listing_changes();
        for i in 0..self.registry.metrics.len() {
            self.scrape(i, deadline)?;
            let (def, state) = (&self.registry.metrics[i], &self.metrics[i]);
            let values = metric_values(def, &state.catalogue, &state.scrape, &mut self.values);
            render::write_family(out, def, &values, &state.catalogue.rendered);
            self.values.keep(values);
        }
        if self.files.process_files_seen() {
            // The listing met the one-file-per-process layout: this scrape
            // and every later one read the store so.
            drop(fold_lock);
            out.clear();
            self.report.clear();
            return self.scrape_per_process(deadline, Some(out));
        }
        // Only a watched store's listing can be known unchanged (the others
        // are listed every scrape), and only kept files are replayed.
        if self.seams.listing == Listing::Watched && self.files.watching() {
            self.plan = plan::ScrapePlan::build(self, out);
        }
        Ok(())
    }

    /// A scrape of a store read as [`per_process`] reads it, switching to
    /// that reading first if needed: listed once per scrape, nothing kept
    /// mapped, no plan.
    fn scrape_per_process(&mut self, deadline: Instant, out: Option<&mut Vec<u8>>) -> Result<()> {
        let mut reading = match self.per_process.take() {
            Some(reading) => reading,
            None => {
                self.plan = None;
                self.read_afresh_each_scrape();
                for (def, state) in self.registry.metrics.iter().zip(&mut self.metrics) {
                    state.catalogue = Catalogue::new(def, self.seams);
                    state.scrape = Scrape::default();
                }
                Box::new(per_process::PerProcess::new(&self.registry))
            }
        };
        let scraped = reading.scrape(self, deadline, out);
        self.per_process = Some(reading);
        scraped
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

    /// After the file set was brought up to date: the reader forgets files
    /// gone or replaced, and probes those whose writer closed them.
    fn absorb_listing_changes(&mut self) {
        for (metric, slot) in self.files.take_released() {
            self.reader.forget(metric, slot);
            self.metrics[metric].catalogue.raw.forget(slot);
        }
        for (metric, slot) in self.files.take_writer_closed() {
            self.reader.writer_closed(metric, slot);
        }
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
mod tests;
