//! Scenario generators → runnable [`Workload`]s, one per pipeline stage seam.

mod export;
mod ingest;
mod lanes;
pub mod query;
mod render;
mod write;

pub(super) use ingest::{
    captures_bodies, captures_plan, feeder_bodies, feeder_workload, write_counters, FEEDER_START_MS,
};
pub use ingest::{churn_bodies, churn_bodies_batched, Ingest};
pub use lanes::{lane_shard, lanes_bodies, ShardPacing, ONE_LANE};

use super::{clones, floor, FLOOR};
use super::{ArmKind, Generator, Input, Output, Workload};
use anyhow::Result;
use export::Export;
use lanes::Laned;
use promlab::scenarios::store_workloads;
use promlab::shared::strategy::StrategySet;
use render::Render;
use std::path::Path;
use write::LongLabel;

/// Builds the workload a generator describes.
pub fn build(params: &Generator) -> Result<Box<dyn Workload>> {
    Ok(match params {
        Generator::LongLabel { steps } => Box::new(LongLabel::new(*steps)),
        Generator::SeedRepro { .. } | Generator::Large { .. } | Generator::ManyMetrics { .. } => {
            Box::new(Export::new(
                generated_store(params).expect("a generated store"),
            )?)
        }
        Generator::RubyStore { case } => Box::new(Export::ruby_fixture(case)?),
        Generator::RubyClones { case, processes } => Box::new(Export::clones(case, *processes)?),
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
        } => Box::new(query::Query::feeder(*groups, *series_per_group, *ticks)?),
    })
}

/// Writes the store of an export scenario's generator into `dir` (which must
/// exist) and returns its registry: the directory the export arms scrape,
/// for the peers and the upstream benchmarks to read too.
pub fn write_store(params: &Generator, dir: &Path) -> Result<promlab::format::registry::Registry> {
    if let Some(generated) = generated_store(params) {
        generated.write(dir, StrategySet::NONE)?;
        return Ok(generated.registry);
    }
    match params {
        Generator::RubyClones { case, processes } => super::clones::write(case, *processes, dir),
        Generator::RubyStore { case } => {
            let tmp = tempfile::tempdir()?;
            let case_dir = crate::fixtures::unpack_ruby_case(case, tmp.path())?;
            for entry in std::fs::read_dir(case_dir.join("store"))? {
                let entry = entry?;
                std::fs::copy(entry.path(), dir.join(entry.file_name()))?;
            }
            promlab::format::registry::Registry::load(&case_dir.join("registry.json"))
        }
        other => anyhow::bail!("{other:?} is not an export scenario's generator"),
    }
}

/// The store promlab's writer writes for a generated export scenario
/// (`seed-repro`, `large`, `many-metrics`): its registry and one op log per
/// writer process. `None` for every other generator.
pub fn generated_store(params: &Generator) -> Option<store_workloads::StoreWorkload> {
    Some(match params {
        Generator::SeedRepro {
            processes,
            statements,
        } => store_workloads::seed_repro(*processes, *statements),
        Generator::Large {
            processes,
            statements,
            max_len,
        } => store_workloads::large(*processes, *statements, *max_len),
        Generator::ManyMetrics { metrics, processes } => {
            store_workloads::many_metrics(*metrics, *processes)
        }
        _ => return None,
    })
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
