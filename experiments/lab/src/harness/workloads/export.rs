//! The export workload: one long-lived exporter per strategy set scraping a store.

use super::{Output, Workload};
use anyhow::Result;
use promlab::scenarios::workload::StoreWorkload;
use promlab::shared::strategy::StrategySet;
use std::collections::HashMap;
use std::path::Path;

/// Export: a store written once by promlab's writer, scraped per run by one
/// long-lived exporter per strategy set, as a sidecar serving `/metrics` would.
/// Without `prerender` an exporter keeps only its read buffer between scrapes.
/// With `fold-exited` it reads a copy of the store folded once before its
/// first scrape (the sidecar folds in the background, between scrapes), whose
/// files of live writers are held open for writing as in the original, and
/// is held to `floor-folded`, the floor of that folded copy: the least work
/// of a scrape of the directory it reads.
pub(super) struct Export {
    _dir: tempfile::TempDir,
    dir: std::path::PathBuf,
    registry: promlab::format::registry::Registry,
    exporters: HashMap<StrategySet, promlab::export::Exporter>,
    folded: Option<FoldedCopy>,
    out: Vec<u8>,
    lines: u64,
    floor: super::floor::ExportFloor,
    /// The floor over the folded copy (made with it).
    floor_folded: Option<super::floor::ExportFloor>,
}

/// The floor of the stores `fold-exited` reads: the folded copy's.
const FLOOR_FOLDED: &str = "floor-folded";

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
        let registry = promlab::format::registry::Registry::load(&case_dir.join("registry.json"))?;
        Export::from_store(dir, case_dir.join("store"), registry)
    }

    /// A client_ruby store cloned under new pids ([`super::clones`]).
    pub(super) fn clones(case: &str, processes: usize) -> Result<Export> {
        let dir = tempfile::tempdir()?;
        let registry = super::clones::write(case, processes, dir.path())?;
        let store = dir.path().to_path_buf();
        Export::from_store(dir, store, registry)
    }

    fn from_store(
        keep: tempfile::TempDir,
        dir: std::path::PathBuf,
        registry: promlab::format::registry::Registry,
    ) -> Result<Export> {
        let text = promlab::export::export(&dir, &registry, StrategySet::NONE)?;
        let lines = text.iter().filter(|&&b| b == b'\n').count() as u64;
        let floor = super::floor::ExportFloor::new(&dir, text)?;
        Ok(Export {
            _dir: keep,
            dir,
            registry,
            exporters: HashMap::new(),
            folded: None,
            out: Vec::new(),
            lines,
            floor,
            floor_folded: None,
        })
    }

    /// The folded copy, made on first use.
    fn folded(&mut self) -> Result<&Path> {
        if self.folded.is_none() {
            self.folded = Some(FoldedCopy::new(&self.dir, &self.registry)?);
        }
        Ok(self.folded.as_ref().expect("made above").dir())
    }

    /// Every exporter that reads the folded copy, made and run once, and
    /// that copy's floor, made, before any other arm ([`Workload::prepare_arms`]):
    /// a sidecar runs one exporter, with the process's budget of
    /// kept mappings to itself, but here 32 share one process, and the first
    /// to run took the budget whole with the unfolded store's files (40,000
    /// at many-metrics' full size), leaving `all` to open and read its 400
    /// folded files every scrape (2.5 ms a scrape; 0.3 ms once it keeps
    /// them). The unfolded arms cannot keep all
    /// their files even alone at that size; they read past the budget either way.
    fn prime_folded(&mut self) -> Result<()> {
        use promlab::shared::strategy::{Stage, Strategy};
        let dir = self.folded()?.to_path_buf();
        for set in StrategySet::combinations(Stage::Export) {
            if set.contains(Strategy::FoldExited) {
                let mut exporter = promlab::export::Exporter::new(&dir, self.registry.clone(), set);
                exporter.export_into(&mut self.out)?;
                self.exporters.insert(set, exporter);
            }
        }
        self.make_floor_folded()
    }

    /// `floor-folded`, made on first use ([`Export::prime_folded`] makes it
    /// before any arm's warm-up, whose first run it would otherwise be).
    fn make_floor_folded(&mut self) -> Result<()> {
        if self.floor_folded.is_none() {
            let text = self.floor.exposition().to_vec();
            let dir = self.folded()?.to_path_buf();
            self.floor_folded = Some(super::floor::ExportFloor::new(&dir, text)?);
        }
        Ok(())
    }

    fn scrape(&mut self, strategies: StrategySet) -> Result<&[u8]> {
        let dir = if strategies.contains(promlab::shared::strategy::Strategy::FoldExited) {
            self.folded()?;
            self.folded.as_ref().expect("made above").dir()
        } else {
            self.dir.as_path()
        };
        let exporter = self.exporters.entry(strategies).or_insert_with(|| {
            promlab::export::Exporter::new(dir, self.registry.clone(), strategies)
        });
        exporter.export_into(&mut self.out)?;
        Ok(&self.out)
    }
}

/// An export floor's scrape: its bytes where they are the exposition's,
/// else its lines (its values printed in their shortest form, not Ruby's).
fn floor_output<'a>(
    floor: &mut super::floor::ExportFloor,
    out: &'a mut Vec<u8>,
) -> Result<Output<'a>> {
    floor.run_into(out)?;
    Ok(if floor.same_bytes() {
        Output::Bytes(out)
    } else {
        Output::Units(floor.lines())
    })
}

/// A store copied and folded (`fold-exited`): the copies of files whose
/// writer is live in the original are held open for writing, so the fold
/// and the exporters see the same writers there.
struct FoldedCopy {
    dir: tempfile::TempDir,
    _writers: Vec<std::fs::File>,
}

impl FoldedCopy {
    fn new(store: &Path, registry: &promlab::format::registry::Registry) -> Result<FoldedCopy> {
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
        let config = promlab::export::fold::FoldConfig {
            grace: std::time::Duration::ZERO,
            durable: false,
            ..promlab::export::fold::FoldConfig::default()
        };
        promlab::export::fold::fold_store(dir.path(), registry, &config)?;
        Ok(FoldedCopy {
            dir,
            _writers: writers,
        })
    }

    fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Copies a store file as sparse as client_ruby leaves it: its used region
/// written, the rest (zeros) left a hole at the same length. `fs::copy`
/// fills the holes here (`copy_file_range` without reflinks): 40,000 files of
/// 1 MiB each took 40 GB for a store of 160 MB.
fn copy_sparse(from: &Path, to: &Path) -> Result<()> {
    let bytes = std::fs::read(from)?;
    let used = match bytes.get(..4) {
        Some(header) => i32::from_le_bytes(header.try_into().expect("4 bytes")),
        None => -1,
    };
    let keep = if used >= 8 && used as usize <= bytes.len() {
        // The rest must be zeros, or it is written as it is.
        let tail_zero = bytes[used as usize..].iter().all(|&b| b == 0);
        if tail_zero {
            used as usize
        } else {
            bytes.len()
        }
    } else {
        bytes.len()
    };
    let file = std::fs::File::create(to)?;
    use std::io::Write;
    (&file).write_all(&bytes[..keep])?;
    file.set_len(bytes.len() as u64)?;
    Ok(())
}

impl Workload for Export {
    /// One scrape by the set's long-lived exporter (its first run is a fresh
    /// exporter's first scrape; later runs check what it keeps in between).
    fn run(&mut self, strategies: StrategySet) -> Result<Output<'_>> {
        Ok(Output::Bytes(self.scrape(strategies)?))
    }

    fn units(&self) -> (u64, &'static str) {
        (self.lines, "lines")
    }

    /// Every store file's used region read once, and the exposition written.
    fn floor(&mut self) -> Result<Output<'_>> {
        floor_output(&mut self.floor, &mut self.out)
    }

    fn extra_floors(&self) -> Vec<&'static str> {
        vec![FLOOR_FOLDED]
    }

    fn prepare_arms(&mut self) -> Result<()> {
        self.prime_folded()
    }

    fn extra_arms(&self) -> Vec<(&'static str, StrategySet)> {
        vec![(FLOOR_FOLDED, StrategySet::NONE)]
    }

    /// `floor-folded`: [`Workload::floor`] over the folded copy.
    fn run_extra(&mut self, name: &str, _strategies: StrategySet) -> Result<Output<'_>> {
        anyhow::ensure!(
            name == FLOOR_FOLDED,
            "no extra arm `{name}` in this workload"
        );
        self.make_floor_folded()?;
        floor_output(
            self.floor_folded.as_mut().expect("made above"),
            &mut self.out,
        )
    }

    /// An arm that reads the folded copy is held to its floor.
    fn floor_of(&self, _arm: &str, strategies: StrategySet) -> &'static str {
        if strategies.contains(promlab::shared::strategy::Strategy::FoldExited) {
            FLOOR_FOLDED
        } else {
            super::FLOOR
        }
    }
}
