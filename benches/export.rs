//! Export, side by side, as scrapes of a long-lived exporter per arm: the seed repro (10 processes × 150 statements) and the
//! larger case (10 processes, statements up to ~3,900 characters, ~50 MB of
//! store data), baseline vs each strategy alone vs the configured set. The
//! output of every arm is checked against the baseline before timing.
//!
//! Flamegraphs: `cargo bench --bench export -- --profile-time 10`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use promlab::export::Exporter;
use promlab::strategy::{Stage, Strategy, StrategySet};
use promlab::workload::{self, StoreWorkload};

fn bench_store(c: &mut Criterion, name: &str, workload: StoreWorkload, samples: usize) {
    let dir = tempfile::tempdir().unwrap();
    workload.write(dir.path(), StrategySet::NONE).unwrap();
    let expected =
        promlab::export::export(dir.path(), &workload.registry, StrategySet::NONE).unwrap();
    let lines = expected.iter().filter(|&&b| b == b'\n').count() as u64;
    let mut group = c.benchmark_group(format!("export/{name}"));
    group.sample_size(samples);
    group.throughput(Throughput::Elements(lines));
    // Scrapes by a long-lived exporter per arm, as a sidecar serves them
    // (`prerender` keeps its catalogue between them).
    for (arm, strategies) in promlab::harness::bench_arms(Stage::Export) {
        let mut exporter = Exporter::new(dir.path(), workload.registry.clone(), strategies);
        let mut out = Vec::new();
        exporter.export_into(&mut out).unwrap();
        assert!(out == expected, "{arm} differs from the baseline");
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
        |b| b.iter(|| promlab::export::export(dir.path(), &workload.registry, one_shot).unwrap()),
    );
    group.finish();
}

fn seed_repro(c: &mut Criterion) {
    bench_store(c, "seed-repro", workload::seed_repro(10, 150), 50);
}

fn large(c: &mut Criterion) {
    bench_store(c, "large", workload::large(10, 350, 3900), 10);
}

#[path = "support/profiler.rs"]
mod profiler;

criterion_group! {
    name = benches;
    config = profiler::criterion();
    targets = seed_repro, large
}
criterion_main!(benches);
