//! Export, side by side, as scrapes of a long-lived exporter per arm,
//! baseline vs each strategy alone vs the configured set: the seed repro (10
//! processes × 150 statements), the larger case as client_ruby wrote it (the
//! fixture: 52.7 MB of store data, 5,254 lines) and generated at twice its
//! size (97.8 MB, statements up to ~3,900 characters throughout). The output
//! of every arm is checked against the baseline before timing.
//!
//! Flamegraphs: `cargo bench --bench export -- --profile-time 10`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use promlab::export::Exporter;
use promlab::registry::Registry;
use promlab::strategy::{Stage, Strategy, StrategySet};
use promlab::workload::{self, StoreWorkload};
use std::path::Path;

fn bench_written(c: &mut Criterion, name: &str, workload: StoreWorkload, samples: usize) {
    let dir = tempfile::tempdir().unwrap();
    workload.write(dir.path(), StrategySet::NONE).unwrap();
    let expected =
        promlab::export::export(dir.path(), &workload.registry, StrategySet::NONE).unwrap();
    bench_store(c, name, dir.path(), &workload.registry, &expected, samples);
}

/// Every arm (the baseline among them) must print `expected` before it is timed.
fn bench_store(
    c: &mut Criterion,
    name: &str,
    dir: &Path,
    registry: &Registry,
    expected: &[u8],
    samples: usize,
) {
    let lines = expected.iter().filter(|&&b| b == b'\n').count() as u64;
    let mut group = c.benchmark_group(format!("export/{name}"));
    group.sample_size(samples);
    group.throughput(Throughput::Elements(lines));
    // Scrapes by a long-lived exporter per arm, as a sidecar serves them
    // (`prerender` keeps its catalogue between them).
    for (arm, strategies) in promlab_lab::harness::bench_arms(Stage::Export) {
        let mut exporter = Exporter::new(dir, registry.clone(), strategies);
        let mut out = Vec::new();
        exporter.export_into(&mut out).unwrap();
        assert!(
            out == expected,
            "{arm} differs from the expected exposition"
        );
        group.bench_function(BenchmarkId::from_parameter(&arm), |b| {
            b.iter(|| exporter.export_into(&mut out).unwrap())
        });
    }
    // A one-shot export (`promlab export`) with the three export strategies:
    // nothing is kept from one run to the next.
    let one_shot = StrategySet::all()
        .restrict(Stage::Export)
        .without(Strategy::Prerender);
    group.bench_function(
        BenchmarkId::from_parameter(format!("one-shot({one_shot})")),
        |b| b.iter(|| promlab::export::export(dir, registry, one_shot).unwrap()),
    );
    group.finish();
}

fn seed_repro(c: &mut Criterion) {
    bench_written(c, "seed-repro", workload::seed_repro(10, 150), 50);
}

/// The fixture's store, unpacked as the tests unpack it.
fn large_ruby(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let case = promlab_lab::fixtures::unpack_ruby_case("large-v5-uri", tmp.path()).unwrap();
    let registry = Registry::load(&case.join("registry.json")).unwrap();
    // Ruby's own answer: the baseline arm is checked against it too.
    let ruby = std::fs::read(case.join("expected.prom")).unwrap();
    bench_store(c, "large-ruby", &case.join("store"), &registry, &ruby, 10);
}

fn large(c: &mut Criterion) {
    bench_written(c, "large", workload::large(10, 350, 3900), 10);
}

#[path = "support/profiler.rs"]
mod profiler;

criterion_group! {
    name = benches;
    config = profiler::criterion();
    targets = seed_repro, large_ruby, large
}
criterion_main!(benches);
