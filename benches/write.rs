//! Write path, side by side: one histogram observe + one counter increment with
//! a 195-character label (the 5.0.0 write-path report), baseline vs each
//! strategy alone vs the configured set (`--features …`, or all).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use promlab::strategy::Stage;
use promlab::workload::LongLabelWriter;
use std::hint::black_box;

fn long_label(c: &mut Criterion) {
    let mut group = c.benchmark_group("write/long-label");
    group.throughput(Throughput::Elements(1));
    for (name, strategies) in promlab::harness::bench_arms(Stage::Write) {
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
