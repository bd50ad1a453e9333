//! Scenario generators → runnable [`Workload`]s, one per pipeline stage seam.

use super::{Generator, Output, Workload};
use anyhow::Result;
use promlab::scenarios::workload::{self, LongLabelWriter, StoreWorkload};
use promlab::shared::strategy::{Stage, StrategySet};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// Builds the workload a generator describes.
pub fn build(params: &Generator) -> Result<Box<dyn Workload>> {
    Ok(match params {
        Generator::LongLabel { steps } => Box::new(LongLabel::new(*steps)),
        Generator::SeedRepro {
            processes,
            statements,
        } => Box::new(Export::new(workload::seed_repro(*processes, *statements))?),
        Generator::Large {
            processes,
            statements,
            max_len,
        } => Box::new(Export::new(workload::large(
            *processes,
            *statements,
            *max_len,
        ))?),
        Generator::RubyStore { case } => Box::new(Export::ruby_fixture(case)?),
        Generator::RubyClones { case, processes } => Box::new(Export::clones(case, *processes)?),
        Generator::ManyMetrics { metrics, processes } => {
            Box::new(Export::new(workload::many_metrics(*metrics, *processes))?)
        }
        Generator::Rabbitmq {
            queues,
            awkward_names,
        } => Box::new(Render::new(*queues, *awkward_names)),
        Generator::Asap {
            groups,
            series_per_group,
            ticks,
        } => Box::new(Ingest::feeder(*groups, *series_per_group, *ticks)?),
        Generator::AsapChurn {
            groups,
            series_per_group,
            ticks,
            new_series_per_tick,
        } => Box::new(Ingest::from_bodies(
            churn_bodies(*groups, *series_per_group, *ticks, *new_series_per_tick).collect(),
            groups * series_per_group * ticks,
        )?),
        Generator::AsapLanes {
            groups,
            series_per_group,
            ticks,
            lanes,
        } => Box::new(Laned::feeder(*groups, *series_per_group, *ticks, *lanes)?),
        Generator::PrometheusCaptures { passes } => Box::new(Ingest::captures(*passes)?),
        Generator::AsapQuery {
            groups,
            series_per_group,
            ticks,
        } => Box::new(super::query::Query::feeder(
            *groups,
            *series_per_group,
            *ticks,
        )?),
    })
}

/// Writes the store of an export scenario's generator into `dir` (which must
/// exist) and returns its registry: the directory the export arms scrape,
/// for the peers and the upstream benchmarks to read too.
pub fn write_store(params: &Generator, dir: &Path) -> Result<promlab::format::registry::Registry> {
    let generated = match params {
        Generator::SeedRepro {
            processes,
            statements,
        } => workload::seed_repro(*processes, *statements),
        Generator::Large {
            processes,
            statements,
            max_len,
        } => workload::large(*processes, *statements, *max_len),
        Generator::ManyMetrics { metrics, processes } => {
            workload::many_metrics(*metrics, *processes)
        }
        Generator::RubyClones { case, processes } => {
            return super::clones::write(case, *processes, dir)
        }
        Generator::RubyStore { case } => {
            let tmp = tempfile::tempdir()?;
            let case_dir = crate::fixtures::unpack_ruby_case(case, tmp.path())?;
            for entry in std::fs::read_dir(case_dir.join("store"))? {
                let entry = entry?;
                std::fs::copy(entry.path(), dir.join(entry.file_name()))?;
            }
            return promlab::format::registry::Registry::load(&case_dir.join("registry.json"));
        }
        other => anyhow::bail!("{other:?} is not an export scenario's generator"),
    };
    generated.write(dir, StrategySet::NONE)?;
    Ok(generated.registry)
}

/// Export: a store written once by promlab's writer, scraped per run by one
/// long-lived exporter per strategy set, as a sidecar serving `/metrics` would.
/// Without `prerender` an exporter keeps only its read buffer between scrapes.
/// With `fold-exited` it reads a copy of the store folded once before its
/// first scrape (the sidecar folds in the background, between scrapes), whose
/// files of live writers are held open for writing as in the original, and
/// is held to `floor-folded`, the floor of that folded copy: the least work
/// of a scrape of the directory it reads.
struct Export {
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
    fn new(workload: StoreWorkload) -> Result<Export> {
        let dir = tempfile::tempdir()?;
        workload.write(dir.path(), StrategySet::NONE)?;
        let store = dir.path().to_path_buf();
        Export::from_store(dir, store, workload.registry)
    }

    /// A store client_ruby wrote, unpacked into a temporary directory.
    fn ruby_fixture(case: &str) -> Result<Export> {
        let dir = tempfile::tempdir()?;
        let case_dir = crate::fixtures::unpack_ruby_case(case, dir.path())?;
        let registry = promlab::format::registry::Registry::load(&case_dir.join("registry.json"))?;
        Export::from_store(dir, case_dir.join("store"), registry)
    }

    /// A client_ruby store cloned under new pids ([`super::clones`]).
    fn clones(case: &str, processes: usize) -> Result<Export> {
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

/// Write: `steps` × (histogram observe + counter increment) with a 195-char label.
struct LongLabel {
    steps: usize,
    /// One warm writer per strategy set, so runs time the steady state.
    writers: HashMap<StrategySet, (tempfile::TempDir, LongLabelWriter)>,
    floor: Option<super::floor::WriteFloor>,
}

impl LongLabel {
    fn new(steps: usize) -> LongLabel {
        LongLabel {
            steps,
            writers: HashMap::new(),
            floor: None,
        }
    }
}

/// A store directory as comparable bytes: per file, its name, `used`, and its
/// used region with timestamps zeroed.
pub fn store_bytes(dir: &Path) -> Result<Vec<u8>> {
    let mut names: Vec<_> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    names.sort();
    let mut out = Vec::new();
    for path in names {
        let bytes = std::fs::read(&path)?;
        out.extend_from_slice(path.file_name().unwrap_or_default().as_encoded_bytes());
        out.push(b'\n');
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        let used = i32::from_le_bytes(bytes[..4].try_into()?) as usize;
        let mut region = bytes[..used].to_vec();
        for entry in promlab::format::storefile::entries(&bytes, used) {
            let at = entry?.value_offset + 8;
            region[at..at + 8].fill(0);
        }
        out.extend_from_slice(&region);
    }
    Ok(out)
}

impl Workload for LongLabel {
    /// `steps` steps of the set's warm writer (the first run starts from an
    /// empty directory); returns the directory it writes.
    fn run(&mut self, strategies: StrategySet) -> Result<Output<'_>> {
        let (dir, writer) = match self.writers.entry(strategies) {
            std::collections::hash_map::Entry::Occupied(slot) => slot.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let dir = tempfile::tempdir()?;
                let writer = LongLabelWriter::new(dir.path(), strategies)?;
                slot.insert((dir, writer))
            }
        };
        for i in 0..self.steps {
            writer.step(workload::long_label_step_value(i))?;
        }
        Ok(Output::Store(dir.path()))
    }

    fn units(&self) -> (u64, &'static str) {
        (self.steps as u64, "steps")
    }

    /// The lock pair alone, once per step: the store is not written.
    fn floor(&mut self) -> Result<Output<'_>> {
        let floor = match &mut self.floor {
            Some(floor) => floor,
            None => self.floor.insert(super::floor::WriteFloor::new()?),
        };
        Ok(Output::Units(floor.run(self.steps)?))
    }
}

/// Render: RabbitMQ's per-object scrape of a live registry. Each strategy set
/// gets its own registry, built once (`prerender` pays its escaping there, at
/// series creation); a run is one scrape into a reused buffer.
struct Render {
    queues: usize,
    awkward_names: bool,
    scenarios: HashMap<StrategySet, promlab::scenarios::rabbitmq::RabbitMqNode>,
    body: Vec<u8>,
    floor: Option<super::floor::RenderFloor>,
}

impl Render {
    fn new(queues: usize, awkward_names: bool) -> Render {
        Render {
            queues,
            awkward_names,
            scenarios: HashMap::new(),
            body: Vec::new(),
            floor: None,
        }
    }

    fn scenario(
        &mut self,
        strategies: StrategySet,
    ) -> Result<&promlab::scenarios::rabbitmq::RabbitMqNode> {
        // Only the render stage's strategies change a registry.
        let key = strategies.restrict(Stage::Render);
        if !self.scenarios.contains_key(&key) {
            let scenario = promlab::scenarios::rabbitmq::RabbitMqNode::build(
                self.queues,
                self.awkward_names,
                key,
            )?;
            self.scenarios.insert(key, scenario);
        }
        Ok(&self.scenarios[&key])
    }
}

impl Workload for Render {
    fn run(&mut self, strategies: StrategySet) -> Result<Output<'_>> {
        let mut body = std::mem::take(&mut self.body);
        self.scenario(strategies)?.render_per_object(&mut body);
        self.body = body;
        Ok(Output::Bytes(&self.body))
    }

    /// The lines of the last scrape (every scrape has as many).
    fn units(&self) -> (u64, &'static str) {
        let lines = self.body.iter().filter(|&&b| b == b'\n').count();
        (lines as u64, "lines")
    }

    /// The scrape's lines prerendered from the baseline's exposition, copied,
    /// each value formatted: the same bytes when every value prints in its
    /// shortest form, otherwise checked by its line count.
    fn floor(&mut self) -> Result<Output<'_>> {
        if self.floor.is_none() {
            let mut body = std::mem::take(&mut self.body);
            self.scenario(StrategySet::NONE)?
                .render_per_object(&mut body);
            self.floor = Some(super::floor::RenderFloor::new(&body));
            // A scrape's lines are the units, whether the floor runs first or not.
            self.body = body;
        }
        // Into the arms' buffer (see `RenderFloor::run_into`).
        let floor = self.floor.as_mut().expect("built above");
        floor.run_into(&mut self.body);
        if floor.same_bytes {
            Ok(Output::Bytes(&self.body))
        } else {
            Ok(Output::Units(floor.lines()))
        }
    }
}

/// Ingest: remote-write request bodies through the receiver's handler, a new
/// ingester per run; the output is the quantiles of every aggregation's last
/// closed window (JSON) plus the counters, after the stream is flushed.
pub struct Ingest {
    plan: promlab::ingest::plan::Plan,
    bodies: Vec<Vec<u8>>,
    samples: u64,
    /// The last run's answer.
    out: Vec<u8>,
    floor: super::floor::IngestFloor,
}

/// The plan for Prometheus's own self-scrape: GC pause quantiles by `quantile`, 5 s windows.
const CAPTURES_PLAN: &str = "lateness_secs = 0\n[[aggregation]]\nid = \"gc\"\nmetric = \"go_gc_duration_seconds\"\ngroup_by = [\"quantile\"]\nwindow_secs = 5\n";

pub(super) fn captures_plan() -> Result<promlab::ingest::plan::Plan> {
    promlab::ingest::plan::Plan::parse(CAPTURES_PLAN)
}

/// The 27 requests a real Prometheus 2.42 sent, `passes` times over.
pub(super) fn captures_bodies(passes: usize) -> impl Iterator<Item = Vec<u8>> {
    (0..passes).flat_map(|_| crate::fixtures::PROMETHEUS_CAPTURES.map(<[u8]>::to_vec))
}

/// The seed's feeder workload at `groups` × `series_per_group`.
pub(super) fn feeder_workload(
    groups: u64,
    series_per_group: u64,
) -> promlab::ingest::feed::FeedWorkload {
    promlab::ingest::feed::FeedWorkload {
        groups,
        series_per_group,
        ..promlab::ingest::feed::FeedWorkload::seed(1_700_000_000_000)
    }
}

/// Its request bodies, `ticks` seconds of them.
pub(super) fn feeder_bodies(
    groups: u64,
    series_per_group: u64,
    ticks: u64,
) -> impl Iterator<Item = Vec<u8>> {
    let generator = feeder_workload(groups, series_per_group).generator();
    (0..ticks).flat_map(move |t| generator.tick_bodies(t))
}

/// The counters line of an ingest run's answer: accepted, late, stale,
/// rejected, unrouted.
pub(super) fn write_counters(out: &mut Vec<u8>, counts: [u64; 5]) -> std::io::Result<()> {
    let [accepted, late, stale, rejected, unrouted] = counts;
    writeln!(
        out,
        "\naccepted={accepted} late={late} stale={stale} rejected={rejected} unrouted={unrouted}"
    )
}

impl Ingest {
    /// The seed's feeder workload: `groups` × `series_per_group` series, one sample
    /// per series per tick, `ticks` ticks (seconds), in 50,000-row requests.
    pub fn feeder(groups: u64, series_per_group: u64, ticks: u64) -> Result<Ingest> {
        let workload = feeder_workload(groups, series_per_group);
        let bodies = feeder_bodies(groups, series_per_group, ticks).collect();
        let plan = promlab::ingest::plan::Plan::default();
        Ok(Ingest {
            floor: super::floor::IngestFloor::new(&plan)?,
            plan,
            bodies,
            samples: workload.samples_per_tick() * ticks,
            out: Vec::new(),
        })
    }

    /// `bodies` (the feeder's plan) holding `samples` samples.
    fn from_bodies(bodies: Vec<Vec<u8>>, samples: u64) -> Result<Ingest> {
        let plan = promlab::ingest::plan::Plan::default();
        Ok(Ingest {
            floor: super::floor::IngestFloor::new(&plan)?,
            plan,
            bodies,
            samples,
            out: Vec::new(),
        })
    }

    /// The 27 requests a real Prometheus 2.42 sent, `passes` times over.
    fn captures(passes: usize) -> Result<Ingest> {
        let bodies: Vec<Vec<u8>> = captures_bodies(passes).collect();
        let plan = captures_plan()?;
        let mut probe = promlab::ingest::pipeline::Ingester::new(plan.clone(), StrategySet::NONE);
        for body in &bodies {
            probe.handle(body)?;
        }
        Ok(Ingest {
            floor: super::floor::IngestFloor::new(&plan)?,
            plan,
            bodies,
            samples: probe.totals().samples,
            out: Vec::new(),
        })
    }
}

impl Workload for Ingest {
    /// Every request into a fresh ingester, the flush, and the query of every
    /// aggregation (as JSON, as the receiver serves it, with the counters).
    fn run(&mut self, strategies: StrategySet) -> Result<Output<'_>> {
        let mut ingester = promlab::ingest::pipeline::Ingester::new(self.plan.clone(), strategies);
        for body in &self.bodies {
            ingester.handle(body)?;
        }
        ingester.flush();
        let t = ingester.totals();
        self.out.clear();
        ingester.query_all_json(&mut self.out);
        let counts = [t.accepted, t.late, t.stale, t.rejected, t.unrouted];
        write_counters(&mut self.out, counts)?;
        Ok(Output::Bytes(&self.out))
    }

    fn units(&self) -> (u64, &'static str) {
        (self.samples, "samples")
    }

    /// Decode, walk, find each series as `series-cache` does, one sketch add per sample; checked
    /// by the samples it walked.
    fn floor(&mut self) -> Result<Output<'_>> {
        Ok(Output::Units(self.floor.run(&self.bodies)?))
    }
}

/// The feeder's workload with series churn, as request bodies: every tick
/// sends one sample of each of the `groups` × `series_per_group` series slots
/// (the feeder's labels, values and timestamps), and from the second tick on,
/// `new_series_per_tick` slots, taken in turn and wrapping, hold a new series
/// each tick — the same group, a new `instance` (`i<i>-<generation>`): a
/// deployment whose pods come and go. With no churn the bodies are the
/// feeder's own (`asap` at the same sizes); with churn equal to the series,
/// every series of every tick is new.
pub fn churn_bodies(
    groups: u64,
    series_per_group: u64,
    ticks: u64,
    new_series_per_tick: u64,
) -> impl Iterator<Item = Vec<u8>> {
    let batch_rows = promlab::ingest::feed::FeedWorkload::seed(0).batch_rows;
    churn_bodies_batched(
        groups,
        series_per_group,
        ticks,
        new_series_per_tick,
        batch_rows,
    )
}

/// [`churn_bodies`] in requests of `batch_rows` rows (the last of a tick holds the rest).
pub fn churn_bodies_batched(
    groups: u64,
    series_per_group: u64,
    ticks: u64,
    new_series_per_tick: u64,
    batch_rows: usize,
) -> impl Iterator<Item = Vec<u8>> {
    use promlab::ingest::wire;
    let workload = promlab::ingest::feed::FeedWorkload {
        groups,
        series_per_group,
        batch_rows,
        ..promlab::ingest::feed::FeedWorkload::seed(1_700_000_000_000)
    };
    let series = workload.series();
    let churn = new_series_per_tick.min(series);
    (0..ticks).flat_map(move |t| {
        let mut requests = Vec::new();
        let mut current = Vec::new();
        let mut labels = Vec::with_capacity(64);
        let mut rows = 0;
        for n in 0..series {
            let (g, i) = (n / series_per_group, n % series_per_group);
            labels.clear();
            wire::put_label(&mut labels, b"__name__", b"data");
            match churn_generation(n, t, churn, series) {
                0 => wire::put_label(&mut labels, b"instance", format!("i{i}").as_bytes()),
                generation => wire::put_label(
                    &mut labels,
                    b"instance",
                    format!("i{i}-{generation}").as_bytes(),
                ),
            }
            wire::put_label(&mut labels, b"label_0", format!("g{g}").as_bytes());
            let value = workload.value(n, t);
            wire::put_series_one_sample(&mut current, &labels, value, workload.timestamp(t, 0));
            rows += 1;
            if rows == workload.batch_rows {
                requests.push(wire::compress(&std::mem::take(&mut current)));
                rows = 0;
            }
        }
        if rows > 0 {
            requests.push(wire::compress(&current));
        }
        requests
    })
}

/// How many times series slot `n` (of `series`) was given a new series by
/// tick `t`, when each tick from the second renews `churn` slots in turn:
/// ticks 1..=t renew the positions `0..t·churn` of the slots laid end to end.
fn churn_generation(n: u64, t: u64, churn: u64, series: u64) -> u64 {
    let renewed = t * churn;
    if n < renewed {
        (renewed - n - 1) / series + 1
    } else {
        0
    }
}

/// Ingest across cores: the feeder's workload through a laned ingester of
/// `lanes` lanes (`LanedIngester::handle`, as `promlab serve` takes a request
/// on a free lane), a fresh ingester per run, fed by `lanes` threads standing
/// for a sender's remote-write shards: Prometheus splits its series over
/// shards by hash, each shard sending its own series on its own connection,
/// so each thread sends the same share of every tick's requests (tick `t`'s
/// about [`LANE_SHARDS`] requests, request `r` by thread `r mod lanes`), as
/// fast as it can but never more than [`LAG_TICKS`] ticks ahead of the
/// slowest ([`ShardPacing`]; the lag stays under the plan's lateness, so no
/// sample is late). A lane stays
/// with its thread ([`LanedIngester`]'s free-lane choice), so each lane
/// learns its shard's series, not every series. The answer (every
/// aggregation's last closed window after the flush, and the counters) is
/// one ingester's, bit for bit: `asap` at the same sizes. The floor: `lanes`
/// threads each walking its shard's requests through the ingest floor
/// ([`super::floor::IngestFloor::run_bodies`]) — the least work spread over
/// as many cores, with nothing shared.
///
/// (Until issue 26 each thread took the next request, whichever shard it
/// was: every lane learned every series, and a new series costs `all` about
/// seven known ones, so 2 lanes on 2 cores measured 0.98× one lane at the
/// full size. Then they met at every tick's end, a barrier, and measured
/// 1.74×: most of what was lost was not the barrier but the lanes trading
/// senders at every window close, fixed in `LanedIngester`'s lane choice.)
struct Laned {
    plan: promlab::ingest::plan::Plan,
    /// Tick by tick, `per_tick` requests a tick.
    bodies: Vec<Vec<u8>>,
    per_tick: usize,
    lanes: usize,
    samples: u64,
    out: Vec<u8>,
    floors: Vec<super::floor::IngestFloor>,
}

/// Requests per tick of the lanes workload (about): the most lanes a ladder
/// has, so every thread sends a share.
const LANE_SHARDS: usize = 16;

/// How many ticks a shard may send ahead of the slowest: a sender at
/// saturation sends from its backlog without waiting for its other shards,
/// but not unboundedly ahead of them. Ticks are a second apart and the
/// plan's lateness is 5 s, so at 4 ticks no sample arrives late. (It was 2:
/// Prometheus's shards do not wait for each other at all, and the closer the
/// coupling, the more a stall of one core held the other lane too; three
/// quick lanes ladders each measured 2 lanes at 1.85/1.93/1.65x one lane
/// with 2, 1.96/1.71/2.00x with 4 — within this machine's noise.)
const LAG_TICKS: usize = 4;

/// The lanes workload's senders: each counts the ticks it has sent, and
/// waits before tick `t` while the slowest is more than [`LAG_TICKS`] behind.
pub struct ShardPacing {
    sent: std::sync::Mutex<Vec<usize>>,
    progress: std::sync::Condvar,
}

impl ShardPacing {
    pub fn new(shards: usize) -> ShardPacing {
        ShardPacing {
            sent: std::sync::Mutex::new(vec![0; shards]),
            progress: std::sync::Condvar::new(),
        }
    }

    pub fn wait_to_send(&self, tick: usize) {
        let sent = self.sent.lock().expect("pacing lock");
        let _sent = self
            .progress
            .wait_while(sent, |sent| {
                sent.iter().min().copied().unwrap_or(tick) + LAG_TICKS < tick
            })
            .expect("pacing lock");
    }

    pub fn sent(&self, shard: usize) {
        self.sent.lock().expect("pacing lock")[shard] += 1;
        self.progress.notify_all();
    }
}

impl Laned {
    fn feeder(groups: u64, series_per_group: u64, ticks: u64, lanes: usize) -> Result<Laned> {
        anyhow::ensure!(
            (1..=LANE_SHARDS.min(promlab::ingest::lanes::MAX_LANES)).contains(&lanes),
            "lanes = {lanes}: 1 to {LANE_SHARDS}"
        );
        let series = (groups * series_per_group) as usize;
        anyhow::ensure!(
            series >= LANE_SHARDS,
            "{series} series: the lanes workload splits each tick into {LANE_SHARDS} requests"
        );
        let plan = promlab::ingest::plan::Plan::default();
        let (bodies, per_tick) = lanes_bodies(groups, series_per_group, ticks)?;
        Ok(Laned {
            per_tick,
            floors: (0..lanes)
                .map(|_| super::floor::IngestFloor::new(&plan))
                .collect::<Result<_>>()?,
            plan,
            bodies,
            lanes,
            samples: groups * series_per_group * ticks,
            out: Vec::new(),
        })
    }
}

/// Sender `i`'s requests of one tick of the lanes workload, of `lanes` senders.
pub fn lane_shard(tick: &[Vec<u8>], lanes: usize, i: usize) -> impl Iterator<Item = &[u8]> {
    tick.iter().skip(i).step_by(lanes).map(Vec::as_slice)
}

/// The lanes workload's request bodies, tick by tick (the feeder's, each
/// tick in about [`LANE_SHARDS`] requests), and the requests a tick.
pub fn lanes_bodies(
    groups: u64,
    series_per_group: u64,
    ticks: u64,
) -> Result<(Vec<Vec<u8>>, usize)> {
    let series = (groups * series_per_group) as usize;
    let batch_rows = series.div_ceil(LANE_SHARDS);
    let per_tick = series.div_ceil(batch_rows);
    let bodies: Vec<Vec<u8>> =
        churn_bodies_batched(groups, series_per_group, ticks, 0, batch_rows).collect();
    anyhow::ensure!(bodies.len() == ticks as usize * per_tick);
    Ok((bodies, per_tick))
}

/// The lanes workload's arm of every strategy on one lane (one thread
/// sending every request), measured in the same rounds as the point's lanes
/// so the speed-up of N lanes is a ratio of one run, not of two points run
/// one after the other while the machine drifts.
pub const ONE_LANE: &str = "all-one-lane";

impl Laned {
    /// Every request through `lanes` lanes, one sender thread each.
    fn run_lanes(&mut self, lanes: usize, strategies: StrategySet) -> Result<Output<'_>> {
        use promlab::ingest::lanes::LanedIngester;
        let laned = LanedIngester::with_plan(lanes, &self.plan, strategies);
        let (bodies, per_tick) = (&self.bodies, self.per_tick);
        let pacing = ShardPacing::new(lanes);
        std::thread::scope(|s| -> Result<()> {
            let senders: Vec<_> = (0..lanes)
                .map(|i| {
                    let (laned, pacing) = (&laned, &pacing);
                    s.spawn(move || -> Result<()> {
                        // A failed request is kept and the sender goes on,
                        // so the others never wait for it.
                        let mut failed = None;
                        for (t, tick) in bodies.chunks(per_tick).enumerate() {
                            pacing.wait_to_send(t);
                            for body in lane_shard(tick, lanes, i) {
                                if let Err(e) = laned.handle(body) {
                                    failed.get_or_insert(e);
                                }
                            }
                            pacing.sent(i);
                        }
                        failed.map_or(Ok(()), |e| Err(e.into()))
                    })
                })
                .collect();
            for sender in senders {
                sender.join().expect("a sender thread panicked")?;
            }
            Ok(())
        })?;
        laned.flush();
        let t = laned.totals();
        self.out.clear();
        // As the one-ingester workload answers (no `QueryResult` built): the
        // answer is written on one thread after the senders, where each
        // floor thread writes its own.
        laned.query_all_json(&mut self.out);
        write_counters(
            &mut self.out,
            [t.accepted, t.late, t.stale, t.rejected, t.unrouted],
        )?;
        Ok(Output::Bytes(&self.out))
    }
}

impl Workload for Laned {
    fn run(&mut self, strategies: StrategySet) -> Result<Output<'_>> {
        self.run_lanes(self.lanes, strategies)
    }

    fn units(&self) -> (u64, &'static str) {
        (self.samples, "samples")
    }

    fn extra_arms(&self) -> Vec<(&'static str, StrategySet)> {
        vec![(ONE_LANE, StrategySet::all().restrict(Stage::Ingest))]
    }

    fn run_extra(&mut self, name: &str, strategies: StrategySet) -> Result<Output<'_>> {
        anyhow::ensure!(name == ONE_LANE, "no extra arm `{name}` in this workload");
        self.run_lanes(1, strategies)
    }

    /// `all-one-lane` is held to no floor: the floor runs the point's threads.
    fn floor_of(&self, arm: &str, _strategies: StrategySet) -> &'static str {
        if arm == ONE_LANE {
            ""
        } else {
            super::FLOOR
        }
    }

    fn floor(&mut self) -> Result<Output<'_>> {
        let (lanes, bodies, per_tick) = (self.lanes, &self.bodies, self.per_tick);
        let walked = std::thread::scope(|s| -> Result<u64> {
            let threads: Vec<_> = self
                .floors
                .iter_mut()
                .enumerate()
                .map(|(i, floor)| {
                    s.spawn(move || {
                        let shard = bodies
                            .chunks(per_tick)
                            .flat_map(|tick| lane_shard(tick, lanes, i));
                        floor.run_bodies(shard)
                    })
                })
                .collect();
            let mut walked = 0;
            for thread in threads {
                walked += thread.join().expect("a floor thread panicked")?;
            }
            Ok(walked)
        })?;
        Ok(Output::Units(walked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn churn_renews_slots_in_turn() {
        // 10 slots, 3 new a tick: tick 1 renews 0..3, tick 2 3..6, tick 4 9, 0, 1.
        let generation = |n, t| churn_generation(n, t, 3, 10);
        assert_eq!((0..10).map(|n| generation(n, 0)).sum::<u64>(), 0);
        assert_eq!(generation(2, 1), 1);
        assert_eq!(generation(3, 1), 0);
        assert_eq!(generation(5, 2), 1);
        assert_eq!(
            (generation(9, 4), generation(0, 4), generation(2, 4)),
            (1, 2, 1)
        );
        // Every tick renews exactly `churn` slots.
        for t in 1..20 {
            let renewed: u64 = (0..10)
                .map(|n| generation(n, t) - generation(n, t - 1))
                .sum();
            assert_eq!(renewed, 3);
        }
        // Churn of every series: every slot new every tick.
        assert!((0..10).all(|n| churn_generation(n, 7, 10, 10) == 7));
    }

    #[test]
    fn no_churn_is_the_feeders_workload() {
        let feeder = promlab::ingest::feed::FeedWorkload {
            groups: 3,
            series_per_group: 7,
            batch_rows: 50_000,
            ..promlab::ingest::feed::FeedWorkload::seed(1_700_000_000_000)
        };
        let generator = feeder.generator();
        let expected: Vec<Vec<u8>> = (0..4).flat_map(|t| generator.tick_bodies(t)).collect();
        assert_eq!(churn_bodies(3, 7, 4, 0).collect::<Vec<_>>(), expected);
        assert_ne!(churn_bodies(3, 7, 4, 1).collect::<Vec<_>>(), expected);
    }

    #[test]
    fn lanes_and_one_lane_answer_as_one_ingester_and_the_floor_walks_every_sample() {
        let mut one = build(&Generator::Asap {
            groups: 4,
            series_per_group: 50,
            ticks: 70,
        })
        .unwrap();
        let all = StrategySet::all();
        let expected = one.run(all).unwrap().bytes().unwrap().into_owned();
        for lanes in [1, 2, 3] {
            let params = Generator::AsapLanes {
                groups: 4,
                series_per_group: 50,
                ticks: 70,
                lanes,
            };
            let mut laned = build(&params).unwrap();
            for set in [StrategySet::NONE, all] {
                let got = laned.run(set).unwrap().bytes().unwrap().into_owned();
                assert!(got == expected, "{lanes} lanes, {set}");
            }
            // The one-lane arm, run beside the point's lanes, answers alike.
            let extra = laned.extra_arms();
            let [(name, set)] = extra[..] else {
                panic!("one extra arm")
            };
            let got = laned
                .run_extra(name, set)
                .unwrap()
                .bytes()
                .unwrap()
                .into_owned();
            assert!(got == expected, "{name} at {lanes} lanes");
            match laned.floor().unwrap() {
                Output::Units(n) => assert_eq!(n, 4 * 50 * 70),
                _ => panic!("the floor counts samples"),
            }
        }
    }
}
