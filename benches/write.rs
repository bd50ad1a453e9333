//! Write path, side by side: one histogram observe + one counter increment with
//! a 195-character label (the 5.0.0 write-path report), baseline vs each
//! strategy alone vs the configured set (`--features …`, or all). The last arm,
//! `flock-pair`, times only the `flock(LOCK_EX)` + `flock(LOCK_UN)` that
//! client_ruby's protocol holds around every observe: the floor under any arm.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use promlab::store::{StoreFile, StoreIo};
use promlab::strategy::Stage;
use promlab::workload::LongLabelWriter;
use std::hint::black_box;

fn long_label(c: &mut Criterion) {
    let mut group = c.benchmark_group("write/long-label");
    group.throughput(Throughput::Elements(1));
    for (name, strategies) in promlab_lab::harness::bench_arms(Stage::Write) {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = LongLabelWriter::new(dir.path(), strategies).unwrap();
        let mut i = 0usize;
        group.bench_function(BenchmarkId::from_parameter(&name), |b| {
            b.iter(|| {
                i += 1;
                writer
                    .step(black_box([0.003, 0.03, 0.3, 3.0][i % 4]))
                    .unwrap()
            })
        });
    }
    // The lock pair alone, on a real store file, as `Client::observe` takes it.
    let dir = tempfile::tempdir().unwrap();
    let mut file =
        StoreFile::open(&dir.path().join("metric_lock___4242.bin"), StoreIo::Mapped).unwrap();
    group.bench_function(BenchmarkId::from_parameter("flock-pair"), |b| {
        b.iter(|| file.with_lock(|f| Ok(black_box(f).used())).unwrap())
    });
    group.finish();
}

#[path = "support/profiler.rs"]
mod profiler;

criterion_group! {
    name = benches;
    config = profiler::criterion();
    targets = long_label
}
criterion_main!(benches);
