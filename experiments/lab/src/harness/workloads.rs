//! Scenario generators → runnable [`Workload`]s, one per pipeline stage seam.

use super::{Scenario, Size, Workload};
use anyhow::{bail, Context, Result};
use promlab::strategy::{Stage, StrategySet};
use promlab::workload::{self, LongLabelWriter, StoreWorkload};
use std::collections::HashMap;
use std::path::Path;

/// Reads an integer parameter.
pub fn param_usize(size: &Size, name: &str) -> Result<usize> {
    size.params
        .get(name)
        .and_then(|v| v.as_integer())
        .and_then(|v| usize::try_from(v).ok())
        .with_context(|| format!("scenario parameter `{name}` (a non-negative integer) is missing"))
}

/// Reads a string parameter.
pub fn param_str(size: &Size, name: &str) -> Result<String> {
    size.params
        .get(name)
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .with_context(|| format!("scenario parameter `{name}` (a string) is missing"))
}

/// Reads a boolean parameter (false when absent).
pub fn param_bool(size: &Size, name: &str) -> bool {
    size.params
        .get(name)
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
}

/// Builds the workload a scenario names.
pub fn build(scenario: &Scenario, size: &Size, stage: Stage) -> Result<Box<dyn Workload>> {
    let workload: Box<dyn Workload> = match scenario.generator.as_str() {
        "long-label" => Box::new(LongLabel::new(param_usize(size, "steps")?)?),
        "seed-repro" => Box::new(Export::new(workload::seed_repro(
            param_usize(size, "processes")?,
            param_usize(size, "statements")?,
        ))?),
        "large" => Box::new(Export::new(workload::large(
            param_usize(size, "processes")?,
            param_usize(size, "statements")?,
            param_usize(size, "max_len")?,
        ))?),
        "ruby-store" => Box::new(Export::ruby_fixture(&param_str(size, "case")?)?),
        "rabbitmq" => Box::new(Render::new(
            param_usize(size, "queues")?,
            param_bool(size, "awkward_names"),
        )),
        "asap" => Box::new(Ingest::feeder(
            param_usize(size, "groups")? as u64,
            param_usize(size, "series_per_group")? as u64,
            param_usize(size, "ticks")? as u64,
        )?),
        "prometheus-captures" => Box::new(Ingest::captures(param_usize(size, "passes")?)?),
        other => bail!("unknown generator `{other}`"),
    };
    let expected_stage = match scenario.generator.as_str() {
        "long-label" => Stage::Write,
        "rabbitmq" => Stage::Render,
        "asap" | "prometheus-captures" => Stage::Ingest,
        _ => Stage::Export,
    };
    if stage != expected_stage {
        bail!(
            "generator `{}` belongs to the {expected_stage} stage, not {stage}",
            scenario.generator
        );
    }
    Ok(workload)
}

/// Export: a store written once by promlab's writer, scraped per run by one
/// long-lived exporter per strategy set, as a sidecar serving `/metrics` would.
/// Without `prerender` an exporter keeps only its read buffer between scrapes.
struct Export {
    _dir: tempfile::TempDir,
    dir: std::path::PathBuf,
    registry: promlab::registry::Registry,
    exporters: HashMap<StrategySet, promlab::export::Exporter>,
    out: Vec<u8>,
    lines: u64,
}

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
        let registry = promlab::registry::Registry::load(&case_dir.join("registry.json"))?;
        Export::from_store(dir, case_dir.join("store"), registry)
    }

    fn from_store(
        keep: tempfile::TempDir,
        dir: std::path::PathBuf,
        registry: promlab::registry::Registry,
    ) -> Result<Export> {
        let text = promlab::export::export(&dir, &registry, StrategySet::NONE)?;
        let lines = text.iter().filter(|&&b| b == b'\n').count() as u64;
        Ok(Export {
            _dir: keep,
            dir,
            registry,
            exporters: HashMap::new(),
            out: Vec::new(),
            lines,
        })
    }

    fn scrape(&mut self, strategies: StrategySet) -> Result<&[u8]> {
        let exporter = self.exporters.entry(strategies).or_insert_with(|| {
            promlab::export::Exporter::new(&self.dir, self.registry.clone(), strategies)
        });
        exporter.export_into(&mut self.out)?;
        Ok(&self.out)
    }
}

impl Workload for Export {
    /// The second scrape of a fresh exporter, checked against its first, so
    /// what a long-lived exporter keeps is verified too.
    fn output(&mut self, strategies: StrategySet) -> Result<Vec<u8>> {
        self.exporters.remove(&strategies);
        let first = self.scrape(strategies)?.to_vec();
        let second = self.scrape(strategies)?;
        if first != second {
            bail!(
                "strategies `{strategies}`: the second scrape differs from the first {}",
                super::first_difference(&first, second, "first", "second")
            );
        }
        Ok(first)
    }

    fn run(&mut self, strategies: StrategySet) -> Result<()> {
        self.scrape(strategies).map(drop)
    }

    fn units(&self) -> (u64, &'static str) {
        (self.lines, "lines")
    }
}

/// Write: `steps` × (histogram observe + counter increment) with a 195-char label.
struct LongLabel {
    steps: usize,
    /// One warm writer per strategy set, so runs time the steady state.
    writers: HashMap<StrategySet, (tempfile::TempDir, LongLabelWriter)>,
}

impl LongLabel {
    fn new(steps: usize) -> Result<LongLabel> {
        Ok(LongLabel {
            steps,
            writers: HashMap::new(),
        })
    }

    fn value(i: usize) -> f64 {
        [0.003, 0.03, 0.3, 3.0][i % 4]
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
        for entry in promlab::storefile::entries(&bytes, used) {
            let at = entry?.value_offset + 8;
            region[at..at + 8].fill(0);
        }
        out.extend_from_slice(&region);
    }
    Ok(out)
}

impl Workload for LongLabel {
    fn output(&mut self, strategies: StrategySet) -> Result<Vec<u8>> {
        let dir = tempfile::tempdir()?;
        let mut writer = LongLabelWriter::new(dir.path(), strategies)?;
        for i in 0..self.steps {
            writer.step(Self::value(i))?;
        }
        drop(writer);
        store_bytes(dir.path())
    }

    fn run(&mut self, strategies: StrategySet) -> Result<()> {
        let (_, writer) = match self.writers.entry(strategies) {
            std::collections::hash_map::Entry::Occupied(slot) => slot.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let dir = tempfile::tempdir()?;
                let writer = LongLabelWriter::new(dir.path(), strategies)?;
                slot.insert((dir, writer))
            }
        };
        for i in 0..self.steps {
            writer.step(Self::value(i))?;
        }
        Ok(())
    }

    fn units(&self) -> (u64, &'static str) {
        (self.steps as u64, "steps")
    }
}

/// Render: RabbitMQ's per-object scrape of a live registry. Each strategy set
/// gets its own registry, built once (`prerender` pays its escaping there, at
/// series creation); a run is one scrape into a reused buffer.
struct Render {
    queues: usize,
    awkward_names: bool,
    scenarios: HashMap<StrategySet, promlab::render::rabbitmq::RabbitMqNode>,
    body: Vec<u8>,
    lines: u64,
}

impl Render {
    fn new(queues: usize, awkward_names: bool) -> Render {
        Render {
            queues,
            awkward_names,
            scenarios: HashMap::new(),
            body: Vec::new(),
            lines: 0,
        }
    }

    fn scenario(
        &mut self,
        strategies: StrategySet,
    ) -> Result<&promlab::render::rabbitmq::RabbitMqNode> {
        // Only the render stage's strategies change a registry.
        let key = strategies.restrict(Stage::Render);
        if !self.scenarios.contains_key(&key) {
            let scenario = promlab::render::rabbitmq::RabbitMqNode::build(
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
    fn output(&mut self, strategies: StrategySet) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.scenario(strategies)?.render_per_object(&mut out);
        self.lines = out.iter().filter(|&&b| b == b'\n').count() as u64;
        Ok(out)
    }

    fn run(&mut self, strategies: StrategySet) -> Result<()> {
        let mut body = std::mem::take(&mut self.body);
        self.scenario(strategies)?.render_per_object(&mut body);
        self.body = body;
        Ok(())
    }

    fn units(&self) -> (u64, &'static str) {
        (self.lines, "lines")
    }
}

/// Ingest: remote-write request bodies through the receiver's handler, a new
/// ingester per run; the output is the quantiles of every aggregation's last
/// closed window (JSON) plus the counters, after the stream is flushed.
struct Ingest {
    plan: promlab::ingest::plan::Plan,
    bodies: Vec<Vec<u8>>,
    samples: u64,
}

/// The plan for Prometheus's own self-scrape: GC pause quantiles by `quantile`, 5 s windows.
const CAPTURES_PLAN: &str = "lateness_secs = 0\n[[aggregation]]\nid = \"gc\"\nmetric = \"go_gc_duration_seconds\"\ngroup_by = [\"quantile\"]\nwindow_secs = 5\n";

impl Ingest {
    /// The seed's feeder workload: `groups` × `series_per_group` series, one sample
    /// per series per tick, `ticks` ticks (seconds), in 50,000-row requests.
    fn feeder(groups: u64, series_per_group: u64, ticks: u64) -> Result<Ingest> {
        let workload = promlab::ingest::feed::Workload {
            groups,
            series_per_group,
            ..promlab::ingest::feed::Workload::seed(1_700_000_000_000)
        };
        let generator = workload.generator();
        let bodies: Vec<Vec<u8>> = (0..ticks).flat_map(|t| generator.tick_bodies(t)).collect();
        Ok(Ingest {
            plan: promlab::ingest::plan::Plan::default(),
            bodies,
            samples: workload.samples_per_tick() * ticks,
        })
    }

    /// The 27 requests a real Prometheus 2.42 sent, `passes` times over.
    fn captures(passes: usize) -> Result<Ingest> {
        let once = crate::fixtures::PROMETHEUS_CAPTURES;
        let bodies: Vec<Vec<u8>> = (0..passes)
            .flat_map(|_| once.iter().map(|b| b.to_vec()))
            .collect();
        let plan = promlab::ingest::plan::Plan::parse(CAPTURES_PLAN)?;
        let mut probe = promlab::ingest::pipeline::Ingester::new(plan.clone(), StrategySet::NONE);
        for body in &bodies {
            probe.handle(body)?;
        }
        Ok(Ingest {
            plan,
            bodies,
            samples: probe.totals().samples,
        })
    }

    fn ingest(&self, strategies: StrategySet) -> Result<promlab::ingest::pipeline::Ingester> {
        let mut ingester = promlab::ingest::pipeline::Ingester::new(self.plan.clone(), strategies);
        for body in &self.bodies {
            ingester.handle(body)?;
        }
        Ok(ingester)
    }
}

impl Workload for Ingest {
    fn output(&mut self, strategies: StrategySet) -> Result<Vec<u8>> {
        let mut ingester = self.ingest(strategies)?;
        ingester.flush();
        let totals = ingester.totals();
        let mut out = serde_json::to_vec(&ingester.query_all())?;
        out.extend_from_slice(
            format!(
                "\naccepted={} late={} stale={} rejected={} unrouted={}\n",
                totals.accepted, totals.late, totals.stale, totals.rejected, totals.unrouted
            )
            .as_bytes(),
        );
        Ok(out)
    }

    fn run(&mut self, strategies: StrategySet) -> Result<()> {
        self.ingest(strategies).map(drop)
    }

    fn units(&self) -> (u64, &'static str) {
        (self.samples, "samples")
    }
}
