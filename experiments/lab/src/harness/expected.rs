//! Each scenario's expected answer, from an independent source: real
//! software or the naive references, never the code under test.

use super::{clones, query, workloads, Generator};
use anyhow::{Context, Result};
use promlab::format::formenc::Dialect;

/// The expected answer for a generated workload, computed independently of
/// the strategies under test — the one place `--print-digests` and the benches
/// (at sizes without a stored digest) get it from. Every stage's answer comes
/// from real software or from the naive references ([`promlab::reference`]),
/// never from a run of the stage under test, baseline included:
/// - a store client_ruby wrote: Ruby's own exposition (`expected.prom`);
/// - a generated store (`seed-repro`, `large`, `many-metrics`): the reference
///   writer's files from the op logs, exported by the reference exporter;
/// - a client_ruby store cloned under new pids (`many-processes*`): the
///   reference exporter over the cloned directory (and the client_ruby peers,
///   `--peers`, check Ruby's own exposition of it against the same digest);
/// - write (`long-label`): the reference writer's files from the writer's op
///   log, each at the size client_ruby gives a file of its used length
///   ([`promlab::reference::store::file_size`]), as [`workloads::store_bytes`]
///   lays a store out;
/// - render (`rabbitmq`): the node's families as plain data
///   ([`promlab::scenarios::rabbitmq::contents`], from the scenario's definition)
///   printed by the reference renderer ([`promlab::reference::live`]);
/// - ingest and query (`asap`, `prometheus-captures`, `asap-query`): the
///   request bodies decoded by `snap` and `prost`, the window rules applied
///   by the reference ([`promlab::reference::ingest`]), and each pane's
///   quantiles from the `sketches-ddsketch` crate fed its values — the real
///   sketch, so the JSON answer is expected bit for bit; the counters are the
///   reference's.
pub fn expected_answer(params: &Generator) -> Result<Vec<u8>> {
    use promlab::reference;
    let generated = match params {
        // Lanes answer as one ingester of the same requests does.
        Generator::AsapLanes {
            groups,
            series_per_group,
            ticks,
            ..
        } => {
            return expected_answer(&Generator::Asap {
                groups: *groups,
                series_per_group: *series_per_group,
                ticks: *ticks,
            })
        }
        Generator::RubyStore { case } => {
            let dir = tempfile::tempdir()?;
            let case_dir = crate::fixtures::unpack_ruby_case(case, dir.path())?;
            return Ok(std::fs::read(case_dir.join("expected.prom"))?);
        }
        Generator::RubyClones { case, processes } => {
            let dir = tempfile::tempdir()?;
            let registry = clones::write(case, *processes, dir.path())?;
            return promlab::reference::exposition::export(dir.path(), &registry);
        }
        Generator::SeedRepro { .. } | Generator::Large { .. } | Generator::ManyMetrics { .. } => {
            workloads::generated_store(params).expect("a generated store")
        }
        Generator::LongLabel { steps } => {
            let log = promlab::scenarios::store_workloads::long_label_log(*steps);
            let registry = promlab::scenarios::store_workloads::long_label_registry();
            let files = reference::store::files(&registry, &[(Dialect::Uri, log)])?;
            let mut out = Vec::new();
            for (name, region) in files {
                out.extend_from_slice(name.as_bytes());
                out.push(b'\n');
                let size = reference::store::file_size(region.len());
                out.extend_from_slice(&size.to_le_bytes());
                out.extend_from_slice(&region);
            }
            return Ok(out);
        }
        Generator::Rabbitmq {
            queues,
            awkward_names,
        } => {
            let families = promlab::scenarios::rabbitmq::contents(*queues, *awkward_names, 1);
            return Ok(reference::live::render(&families));
        }
        Generator::Asap {
            groups,
            series_per_group,
            ticks,
        } => {
            let bodies = workloads::feeder_bodies(
                workloads::FEEDER_START_MS,
                *groups,
                *series_per_group,
                *ticks,
            );
            return reference_ingest_answer(&promlab::ingest::plan::Plan::default(), bodies);
        }
        Generator::AsapChurn {
            groups,
            series_per_group,
            ticks,
            new_series_per_tick,
        } => {
            let bodies =
                workloads::churn_bodies(*groups, *series_per_group, *ticks, *new_series_per_tick);
            return reference_ingest_answer(&promlab::ingest::plan::Plan::default(), bodies);
        }
        Generator::PrometheusCaptures { passes } => {
            let bodies = workloads::captures_bodies(*passes);
            return reference_ingest_answer(&workloads::captures_plan()?, bodies);
        }
        Generator::AsapQuery {
            groups,
            series_per_group,
            ticks,
        } => {
            let plan = promlab::ingest::plan::Plan::default();
            let outcome = reference_ingest(
                &plan,
                workloads::feeder_bodies(query::START_MS, *groups, *series_per_group, *ticks),
            )?;
            let agg = plan
                .aggregations
                .iter()
                .position(|a| a.id == query::AGGREGATION)
                .context("the default plan's aggregation")?;
            // A receiver's state as it runs: the windows the watermark closed.
            let answer = reference::ingest::answer(&outcome, &plan, agg, false);
            return Ok(serde_json::to_vec(&answer)?);
        }
    };
    let dir = tempfile::tempdir()?;
    let logs: Vec<_> = generated
        .logs
        .iter()
        .map(|log| (Dialect::Uri, log.clone()))
        .collect();
    for (name, bytes) in reference::store::files(&generated.registry, &logs)? {
        std::fs::write(dir.path().join(name), bytes)?;
    }
    reference::exposition::export(dir.path(), &generated.registry)
}

/// The reference's outcome of `bodies`, in order.
fn reference_ingest(
    plan: &promlab::ingest::plan::Plan,
    bodies: impl Iterator<Item = Vec<u8>>,
) -> Result<promlab::reference::ingest::Outcome> {
    let mut run = promlab::reference::ingest::Run::new(plan);
    for body in bodies {
        run.request(&promlab::reference::ingest::decode_body(&body)?);
    }
    Ok(run.outcome)
}

/// An ingest run's answer by the reference: every aggregation's last closed
/// window once the stream is flushed, then the counters (as
/// `workloads::Ingest` writes its own).
fn reference_ingest_answer(
    plan: &promlab::ingest::plan::Plan,
    bodies: impl Iterator<Item = Vec<u8>>,
) -> Result<Vec<u8>> {
    let outcome = reference_ingest(plan, bodies)?;
    let mut out = serde_json::to_vec(&promlab::reference::ingest::answers(&outcome, plan, true))?;
    let c = outcome.counts;
    workloads::write_counters(
        &mut out,
        [c.accepted, c.late, c.stale, c.rejected, c.unrouted],
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::{digest, first_difference, load_scenario, BUILT_IN};
    use super::*;
    use promlab::shared::strategy::{Stage, StrategySet};

    /// Every built-in scenario's stored digest (at its quick size; seed-repro's
    /// full size is its quick one) is the answer of the references and real
    /// software ([`expected_answer`]), and the baseline's run gives it too:
    /// no stage's expected answer is the code under test's own.
    #[test]
    fn every_stored_digest_is_the_references_answer() {
        let mut checked = Vec::new();
        for (name, _) in BUILT_IN {
            let scenario = load_scenario(name).unwrap();
            let size = scenario.size(true);
            let answer = expected_answer(&size.params).unwrap();
            assert!(!answer.is_empty(), "{name}");
            assert_eq!(
                digest(&answer),
                size.expected,
                "{name}: the reference's answer"
            );
            let mut workload = workloads::build(&size.params).unwrap();
            let got = workload.run(StrategySet::NONE).unwrap().to_vec().unwrap();
            assert!(
                got == answer,
                "{name}: the baseline differs from the reference {}",
                first_difference(&got, &answer, "baseline", "reference")
            );
            checked.push(scenario.stage());
        }
        assert_eq!(checked.len(), BUILT_IN.len());
        for stage in Stage::ALL {
            assert!(checked.contains(&stage), "no scenario of the {stage} stage");
        }
    }
}
