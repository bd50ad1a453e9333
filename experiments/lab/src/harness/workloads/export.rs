//! The export workload: long-lived exporters scraping a store, on the two
//! inputs a sidecar reads — the store as written and the store folded — and
//! the fold that turns one into the other.

use super::{ArmKind, Input, Output, Workload};
use crate::harness::floor::ExportFloor;
use anyhow::{ensure, Result};
use promlab::export::fold::{fold_store, FoldConfig};
use promlab::export::Exporter;
use promlab::format::registry::Registry;
use promlab::scenarios::store_workloads::StoreWorkload;
use promlab::shared::strategy::{Stage, Strategy, StrategySet};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Every strategy on the store as written: what `promlab serve --store`
/// reads by default (no `--fold-exited`).
pub const AS_WRITTEN: &str = "as-written";
/// The baseline on the folded copy.
pub const BASELINE_FOLDED: &str = "baseline-folded";
/// The floor of the folded copy.
pub const FLOOR_FOLDED: &str = "floor-folded";
/// The fold itself, on a fresh copy of the store as written each run.
pub const FOLD: &str = "fold";

/// Export: a store written once, scraped per run by one long-lived exporter
/// per input and strategy set, as a sidecar serving `/metrics` would (without
/// `prerender` an exporter keeps only its read buffer between scrapes).
///
/// Two inputs ([`Input`]). The store as written is what `serve --store`
/// reads: the baseline and every strategy set without `fold-exited` read it,
/// and so does `as-written`, every strategy on it. The store folded is a copy
/// folded once before the first scrape, as `serve --fold-exited` keeps it
/// between its folds (files of writers live in the original are held open
/// for writing in the copy too): every set with `fold-exited` reads it, and
/// so does `baseline-folded`. Each input has its floor (`floor`,
/// `floor-folded`): the least work of a scrape of the directory it reads.
/// The `fold` arm times what keeps a store folded: `serve --fold-exited`'s
/// fold of a fresh copy of the store as written, the copy made outside the
/// timed region ([`Workload::set_up`]).
pub(super) struct Export {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    registry: Registry,
    exporters: HashMap<(Input, StrategySet), Exporter>,
    folded: Option<FoldedCopy>,
    out: Vec<u8>,
    /// The verified exposition, and its lines.
    exposition: Vec<u8>,
    lines: u64,
    /// The floor over the store as written (remade by [`Export::prime`]).
    floor: Option<ExportFloor>,
    /// The floor over the folded copy (made with it).
    floor_folded: Option<ExportFloor>,
    /// The `fold` arm's copies: the next run's, made by its set-up, and the
    /// last run's, folded.
    fold_next: Option<StoreCopy>,
    fold_last: Option<StoreCopy>,
}

impl Export {
    pub(super) fn new(workload: StoreWorkload) -> Result<Export> {
        let dir = tempfile::tempdir()?;
        workload.write(dir.path(), StrategySet::NONE)?;
        let store = dir.path().to_path_buf();
        Export::from_store(dir, store, workload.registry)
    }

    /// A store client_ruby wrote, unpacked into a temporary directory.
    pub(super) fn ruby_fixture(case: &str) -> Result<Export> {
        let dir = tempfile::tempdir()?;
        let case_dir = crate::fixtures::unpack_ruby_case(case, dir.path())?;
        let registry = Registry::load(&case_dir.join("registry.json"))?;
        Export::from_store(dir, case_dir.join("store"), registry)
    }

    /// A client_ruby store cloned under new pids ([`super::clones`]).
    pub(super) fn clones(case: &str, processes: usize) -> Result<Export> {
        let dir = tempfile::tempdir()?;
        let registry = super::clones::write(case, processes, dir.path())?;
        let store = dir.path().to_path_buf();
        Export::from_store(dir, store, registry)
    }

    fn from_store(keep: tempfile::TempDir, dir: PathBuf, registry: Registry) -> Result<Export> {
        let exposition = promlab::export::export(&dir, &registry, StrategySet::NONE)?;
        let lines = exposition.iter().filter(|&&b| b == b'\n').count() as u64;
        let floor = Some(ExportFloor::new(&dir, exposition.clone())?);
        Ok(Export {
            _dir: keep,
            dir,
            registry,
            exporters: HashMap::new(),
            folded: None,
            out: Vec::new(),
            exposition,
            lines,
            floor,
            floor_folded: None,
            fold_next: None,
            fold_last: None,
        })
    }

    /// The folded copy, made on first use.
    fn folded(&mut self) -> Result<&FoldedCopy> {
        if self.folded.is_none() {
            self.folded = Some(FoldedCopy::new(&self.dir, &self.registry)?);
        }
        Ok(self.folded.as_ref().expect("made above"))
    }

    /// Settles the process's budget of kept mappings before any arm runs
    /// ([`Workload::prepare_arms`]). A sidecar runs one exporter with the
    /// budget to itself; here every arm's exporter shares one process, and
    /// the first to run would take it whole with the store as written's files,
    /// leaving `all` to open and read its folded files every scrape. So, in
    /// this order:
    /// the exporters of the folded copy (a few files each) and its floor;
    /// then the store as written's floor and `as-written`'s exporter, which
    /// share what is left half and half, so that arm is held to a floor that
    /// maps as many of its files as it keeps. The other arms on the store as
    /// written keep what remains (past a few thousand files, nothing) and
    /// read the rest each scrape.
    fn prime(&mut self, all: StrategySet) -> Result<()> {
        let dir = self.folded()?.dir().to_path_buf();
        for set in StrategySet::combinations(Stage::Export) {
            if set.contains(Strategy::FoldExited) {
                let mut exporter = Exporter::new(&dir, self.registry.clone(), set);
                exporter.export_into(&mut self.out)?;
                self.exporters.insert((Input::Folded, set), exporter);
            }
        }
        self.make_floor_folded()?;
        // The old floor's mappings and reservation go before the new one's.
        self.floor = None;
        let half = promlab::export::maps_left() / 2;
        let floor = ExportFloor::with_map_budget(&self.dir, self.exposition.clone(), half)?;
        self.floor = Some(floor);
        self.scrape(Input::AsWritten, all)?;
        Ok(())
    }

    /// `floor-folded`, made on first use ([`Export::prime`] makes it before
    /// any arm's warm-up, whose first run it would otherwise be).
    fn make_floor_folded(&mut self) -> Result<()> {
        if self.floor_folded.is_none() {
            let text = self.exposition.clone();
            let dir = self.folded()?.dir().to_path_buf();
            self.floor_folded = Some(ExportFloor::new(&dir, text)?);
        }
        Ok(())
    }

    /// One scrape of `input` by the long-lived exporter of `strategies`.
    fn scrape(&mut self, input: Input, strategies: StrategySet) -> Result<&[u8]> {
        let dir = match input {
            Input::Folded => self.folded()?.dir().to_path_buf(),
            Input::AsWritten | Input::One => self.dir.clone(),
        };
        let exporter = self
            .exporters
            .entry((input, strategies))
            .or_insert_with(|| Exporter::new(&dir, self.registry.clone(), strategies));
        exporter.export_into(&mut self.out)?;
        Ok(&self.out)
    }

    /// One fold of the copy the set-up made (or, without one, of a copy made
    /// here), as `serve --fold-exited` folds: `FoldConfig::default()`, its
    /// steps synced, its grace period waited.
    fn fold(&mut self) -> Result<Output<'_>> {
        let copy = match self.fold_next.take() {
            Some(copy) => copy,
            None => StoreCopy::new(&self.dir)?,
        };
        let report = fold_store(copy.dir(), &self.registry, &FoldConfig::default())?;
        let expected = self.folded()?.files_folded;
        ensure!(
            report.files_folded == expected,
            "the fold folded {} files, where the folded copy's folded {expected}",
            report.files_folded
        );
        let copy = self.fold_last.insert(copy);
        Ok(Output::StoreRead(copy.dir(), &self.registry))
    }
}

/// An export floor's scrape: its bytes where they are the exposition's,
/// else its lines (its values printed in their shortest form, not Ruby's).
fn floor_output<'a>(floor: &mut ExportFloor, out: &'a mut Vec<u8>) -> Result<Output<'a>> {
    floor.run_into(out)?;
    Ok(if floor.same_bytes() {
        Output::Bytes(out)
    } else {
        Output::Units(floor.lines())
    })
}

/// A store copied file by file: the copies of files whose writer is live in
/// the original are held open for writing, so a fold and the exporters see
/// the same writers there.
struct StoreCopy {
    dir: tempfile::TempDir,
    _writers: Vec<std::fs::File>,
}

impl StoreCopy {
    fn new(store: &Path) -> Result<StoreCopy> {
        use promlab::export::liveness::{probe, Writers};
        let dir = tempfile::tempdir()?;
        let mut writers = Vec::new();
        for entry in std::fs::read_dir(store)? {
            let entry = entry?;
            if !entry.file_type()?.is_file() {
                continue;
            }
            let copy = dir.path().join(entry.file_name());
            copy_sparse(&entry.path(), &copy)?;
            if probe(&std::fs::File::open(entry.path())?) == Writers::Open {
                writers.push(
                    std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(copy)?,
                );
            }
        }
        Ok(StoreCopy {
            dir,
            _writers: writers,
        })
    }

    fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The store folded once (`fold-exited`), as a sidecar's store is between
/// its folds: a copy, folded without syncing or a grace period (no writer
/// can come: a scratch copy).
struct FoldedCopy {
    copy: StoreCopy,
    /// How many files the fold folded away.
    files_folded: u64,
}

impl FoldedCopy {
    fn new(store: &Path, registry: &Registry) -> Result<FoldedCopy> {
        let copy = StoreCopy::new(store)?;
        let config = FoldConfig {
            grace: std::time::Duration::ZERO,
            durable: false,
            ..FoldConfig::default()
        };
        let report = fold_store(copy.dir(), registry, &config)?;
        Ok(FoldedCopy {
            copy,
            files_folded: report.files_folded,
        })
    }

    fn dir(&self) -> &Path {
        self.copy.dir()
    }
}

/// Copies a store file as sparse as client_ruby leaves it: its used region
/// written, the rest (zeros) left a hole at the same length. `fs::copy`
/// fills the holes here (`copy_file_range` without reflinks): 40,000 files of
/// 1 MiB each took 40 GB for a store of 160 MB. Only the used region is read
/// when the rest is a hole already (`SEEK_DATA` finds no data after it).
fn copy_sparse(from: &Path, to: &Path) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let source = std::fs::File::open(from)?;
    let len = source.metadata()?.len();
    let mut header = [0u8; 4];
    let used = match source.read_exact_at(&mut header, 0) {
        Ok(()) => i32::from_le_bytes(header),
        Err(_) => -1,
    };
    let used = u64::try_from(used)
        .ok()
        .filter(|&used| used >= 8 && used <= len);
    let keep = match used {
        Some(used) if hole_after(&source, used) => used,
        Some(used) => {
            // The rest must be zeros, or it is written as it is.
            let mut tail = vec![0u8; (len - used) as usize];
            source.read_exact_at(&mut tail, used)?;
            if tail.iter().all(|&b| b == 0) {
                used
            } else {
                len
            }
        }
        None => len,
    };
    let mut bytes = vec![0u8; keep as usize];
    source.read_exact_at(&mut bytes, 0)?;
    let file = std::fs::File::create(to)?;
    (&file).write_all(&bytes)?;
    file.set_len(len)?;
    Ok(())
}

/// Whether `file` holds no data from `offset` to its end (a hole, or the end).
fn hole_after(file: &std::fs::File, offset: u64) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(offset) = libc::off_t::try_from(offset) else {
        return false;
    };
    // SAFETY: lseek on a descriptor this function borrows; it only moves
    // that description's offset, which nothing here reads from.
    let found = unsafe { libc::lseek(file.as_raw_fd(), offset, libc::SEEK_DATA) };
    found < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO)
}

impl Workload for Export {
    /// One scrape by the set's long-lived exporter, of the input the set
    /// reads (its first run is a fresh exporter's first scrape; later runs
    /// check what it keeps in between).
    fn run(&mut self, strategies: StrategySet) -> Result<Output<'_>> {
        let input = Input::of_export_set(strategies);
        Ok(Output::Bytes(self.scrape(input, strategies)?))
    }

    fn units(&self) -> (u64, &'static str) {
        (self.lines, "lines")
    }

    /// Every store file's used region read once, and the exposition written.
    fn floor(&mut self) -> Result<Output<'_>> {
        let floor = self.floor.as_mut().expect("made with the workload");
        floor_output(floor, &mut self.out)
    }

    fn prepare_arms(&mut self, all: StrategySet) -> Result<()> {
        if all.contains(Strategy::FoldExited) {
            self.prime(all)?;
        }
        Ok(())
    }

    /// With `fold-exited` in the ablation, the arms that complete each
    /// input: `as-written` (every strategy of the ablation on the store as
    /// written), `baseline-folded`, `floor-folded`, and the fold's own cost.
    /// Without it every arm reads the store as written, and there are none.
    fn extra_arms(&self, all: StrategySet) -> Vec<(&'static str, StrategySet, ArmKind)> {
        if !all.contains(Strategy::FoldExited) {
            return Vec::new();
        }
        vec![
            (AS_WRITTEN, all, ArmKind::Extra),
            (BASELINE_FOLDED, StrategySet::NONE, ArmKind::Extra),
            (FLOOR_FOLDED, StrategySet::NONE, ArmKind::Floor),
            (
                FOLD,
                StrategySet::NONE.with(Strategy::FoldExited),
                ArmKind::Upkeep,
            ),
        ]
    }

    fn run_extra(&mut self, name: &str, strategies: StrategySet) -> Result<Output<'_>> {
        match name {
            AS_WRITTEN => Ok(Output::Bytes(self.scrape(Input::AsWritten, strategies)?)),
            BASELINE_FOLDED => Ok(Output::Bytes(self.scrape(Input::Folded, strategies)?)),
            FLOOR_FOLDED => {
                self.make_floor_folded()?;
                let floor = self.floor_folded.as_mut().expect("made above");
                floor_output(floor, &mut self.out)
            }
            FOLD => self.fold(),
            _ => anyhow::bail!("no extra arm `{name}` in this workload"),
        }
    }

    /// The fold's fresh copy of the store as written, with last run's gone
    /// (and the folded copy its files folded are checked against, made once).
    fn set_up(&mut self, arm: &str) -> Result<()> {
        if arm == FOLD {
            self.folded()?;
            self.fold_last = None;
            self.fold_next = Some(StoreCopy::new(&self.dir)?);
        }
        Ok(())
    }

    /// An arm is held to the floor of what it reads; the fold to none.
    fn floor_of(&self, arm: &str, strategies: StrategySet) -> &'static str {
        match self.input_of(arm, strategies) {
            _ if arm == FOLD => "",
            Input::Folded => FLOOR_FOLDED,
            Input::AsWritten | Input::One => super::FLOOR,
        }
    }

    fn input_of(&self, arm: &str, strategies: StrategySet) -> Input {
        match arm {
            AS_WRITTEN | FOLD | super::FLOOR => Input::AsWritten,
            BASELINE_FOLDED | FLOOR_FOLDED => Input::Folded,
            _ => Input::of_export_set(strategies),
        }
    }

    /// The fold's unit is a file folded.
    fn units_of(&self, arm: &str) -> (u64, &'static str) {
        match (arm, &self.folded) {
            (FOLD, Some(folded)) => (folded.files_folded, "files"),
            (FOLD, None) => (0, "files"),
            _ => self.units(),
        }
    }
}
