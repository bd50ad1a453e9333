//! Export, side by side: the seed repro (10 processes × 150 statements) and the
//! larger case (10 processes, statements up to ~3,900 characters, ~50 MB of
//! store data), baseline vs each strategy alone vs the configured set. The
//! output of every arm is checked against the baseline before timing.
//!
//! Flamegraphs: `cargo bench --bench export -- --profile-time 10`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use promlab::strategy::{Stage, StrategySet};
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
    for (arm, strategies) in promlab::harness::bench_arms(Stage::Export) {
        let out = promlab::export::export(dir.path(), &workload.registry, strategies).unwrap();
        assert!(out == expected, "{arm} differs from the baseline");
        group.bench_function(BenchmarkId::from_parameter(&arm), |b| {
            b.iter(|| promlab::export::export(dir.path(), &workload.registry, strategies).unwrap())
        });
    }
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
