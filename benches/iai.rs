//! Instruction counts per stage (iai-callgrind): repeatable on this shared,
//! noisy machine where wall time is not. Baseline, each strategy alone and all
//! of the stage's strategies. Write and export at the quick sizes; render and
//! ingest run the ablation's own workloads (`harness::workloads`), render and
//! asap-1e5 smaller than quick, prometheus-captures at quick. Run with
//! `cargo bench --bench iai` (needs valgrind and `iai-callgrind-runner` 0.16.1
//! on the PATH); build without `target-cpu=native`, since valgrind cannot run
//! AVX-512 code.

use iai_callgrind::{library_benchmark, library_benchmark_group, main};
use promlab::strategy::StrategySet;
use promlab::workload::{self, LongLabelWriter, StoreWorkload};
use promlab_lab::harness::{self, Workload};
use std::hint::black_box;

/// Steps per write benchmark (divide the count by this for one step).
const WRITE_STEPS: usize = 1000;

struct WarmWriter {
    _dir: tempfile::TempDir,
    writer: LongLabelWriter,
}

fn warm_writer(strategies: &str) -> WarmWriter {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = LongLabelWriter::new(dir.path(), strategies.parse().unwrap()).unwrap();
    writer.step(0.03).unwrap();
    WarmWriter { _dir: dir, writer }
}

// 1000 × (histogram observe + counter increment), 195-character label.
#[library_benchmark]
#[benches::long_label(
    args = ["none", "key-cache", "increment-once", "mmap-store", "key-cache,increment-once,mmap-store"],
    setup = warm_writer
)]
fn write_long_label(mut w: WarmWriter) -> WarmWriter {
    for i in 0..WRITE_STEPS {
        w.writer
            .step(black_box([0.003, 0.03, 0.3, 3.0][i % 4]))
            .unwrap();
    }
    w
}

struct WrittenStore {
    _dir: tempfile::TempDir,
    dir: std::path::PathBuf,
    workload: StoreWorkload,
    strategies: StrategySet,
}

fn seed_repro_store(strategies: &str) -> WrittenStore {
    let workload = workload::seed_repro(10, 150);
    let dir = tempfile::tempdir().unwrap();
    workload.write(dir.path(), StrategySet::NONE).unwrap();
    WrittenStore {
        dir: dir.path().to_path_buf(),
        _dir: dir,
        workload,
        strategies: strategies.parse().unwrap(),
    }
}

// One export of the seed repro (10 processes × 150 statements, 2,102 lines).
#[library_benchmark]
#[benches::seed_repro(
    args = ["none", "single-read", "decode-once", "fast-unescape", "single-read,decode-once,fast-unescape"],
    setup = seed_repro_store
)]
fn export_seed_repro(store: WrittenStore) -> (WrittenStore, Vec<u8>) {
    let out =
        promlab::export::export(&store.dir, &store.workload.registry, store.strategies).unwrap();
    (store, out)
}

struct WarmExporter {
    _store: WrittenStore,
    exporter: promlab::export::Exporter,
    out: Vec<u8>,
}

fn warm_exporter(strategies: &str) -> WarmExporter {
    let store = seed_repro_store(strategies);
    let mut exporter = promlab::export::Exporter::new(
        &store.dir,
        store.workload.registry.clone(),
        store.strategies,
    );
    let mut out = Vec::new();
    exporter.export_into(&mut out).unwrap();
    WarmExporter {
        _store: store,
        exporter,
        out,
    }
}

// One scrape of the seed repro by a long-lived exporter that has scraped it
// once already (what `promlab serve --store` does on every scrape).
#[library_benchmark]
#[benches::seed_repro(
    args = ["none", "single-read,decode-once,fast-unescape", "prerender", "single-read,decode-once,fast-unescape,prerender"],
    setup = warm_exporter
)]
fn scrape_seed_repro(mut warm: WarmExporter) -> WarmExporter {
    warm.exporter.export_into(&mut warm.out).unwrap();
    warm
}

/// A harness scenario's workload (the one `promlab ablate` times), at the
/// quick size with `params` overridden, ready to run `strategies`.
struct ScenarioRun {
    workload: Box<dyn Workload>,
    strategies: StrategySet,
}

fn scenario_run(name: &str, params: &[(&str, toml::Value)], strategies: &str) -> ScenarioRun {
    let scenario = harness::load_scenario(name).unwrap();
    let mut size = scenario.quick.clone();
    for (key, value) in params {
        size.params.insert(key.to_string(), value.clone());
    }
    let stage = scenario.stage().unwrap();
    let workload = harness::workloads::build(&scenario, &size, stage).unwrap();
    ScenarioRun {
        workload,
        strategies: strategies.parse().unwrap(),
    }
}

/// Render keeps one registry per strategy set, built on its first run; that
/// run (series creation, where `prerender` pays) stays out of the count.
fn rabbitmq_registry(strategies: &str) -> ScenarioRun {
    let mut run = scenario_run(
        "rabbitmq-per-object",
        &[("queues", toml::Value::Integer(RENDER_QUEUES))],
        strategies,
    );
    run.workload.run(run.strategies).unwrap();
    run
}

/// Queues of the render benchmark: 100 queues give 6,396 lines.
const RENDER_QUEUES: i64 = 100;

// One per-object scrape of a live registry (100 queues, awkward names mixed in).
#[library_benchmark]
#[benches::per_object(args = ["none", "prerender"], setup = rabbitmq_registry)]
fn render_rabbitmq_per_object(mut run: ScenarioRun) -> ScenarioRun {
    run.workload.run(run.strategies).unwrap();
    run
}

fn asap_requests(strategies: &str) -> ScenarioRun {
    scenario_run(
        "asap-1e5",
        &[("groups", toml::Value::Integer(5))],
        strategies,
    )
}

fn prometheus_requests(strategies: &str) -> ScenarioRun {
    scenario_run("prometheus-captures", &[], strategies)
}

// One ablation run of asap-1e5 at a tenth of its quick size: the feeder's
// requests (5 groups × 100 series, 65 ticks: 32,500 samples) into a fresh
// receiver state.
#[library_benchmark]
#[benches::asap(args = [
        "none",
        "borrowed-decode",
        "series-cache",
        "batch-routing",
        "bulk-sketch",
        "borrowed-decode,series-cache,batch-routing,bulk-sketch"
    ], setup = asap_requests)]
// One ablation run of prometheus-captures, quick size: the 27 requests a real
// Prometheus 2.42 sent, 4 passes (31,356 samples; passes 2–4 are late), into
// a fresh receiver state.
#[benches::prometheus_captures(args = [
        "none",
        "borrowed-decode",
        "series-cache",
        "batch-routing",
        "bulk-sketch",
        "borrowed-decode,series-cache,batch-routing,bulk-sketch"
    ], setup = prometheus_requests)]
fn ingest_requests(mut run: ScenarioRun) -> ScenarioRun {
    run.workload.run(run.strategies).unwrap();
    run
}

library_benchmark_group!(name = write; benchmarks = write_long_label);
library_benchmark_group!(name = export; benchmarks = export_seed_repro, scrape_seed_repro);
library_benchmark_group!(name = render; benchmarks = render_rabbitmq_per_object);
library_benchmark_group!(name = ingest; benchmarks = ingest_requests);
main!(library_benchmark_groups = write, export, render, ingest);
