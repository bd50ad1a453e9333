//! Write path, side by side: the `write-long-label` scenario's quick size —
//! 20,000 × (one histogram observe + one counter increment) with a
//! 195-character label (the 5.0.0 write-path report) — on a warm writer per
//! arm, as `promlab ablate` times it. The arms follow the features (see
//! `support/arms.rs`); each arm's first run, from an empty directory, must
//! leave the store files the scenario's digest names. The last benchmark,
//! `flock-pair`, times 20,000 × `flock(LOCK_EX)` + `flock(LOCK_UN)`, which
//! client_ruby's protocol holds around every observe: the floor under any arm.
//!
//! ```text
//! cargo bench --features key-cache,increment-once --bench write
//! ```

use criterion::{criterion_group, criterion_main, Criterion};
use promlab::store::{StoreFile, StoreIo};
use promlab_lab::harness::{self, Generator};
use std::hint::black_box;

fn long_label(c: &mut Criterion) {
    let scenario = harness::load_scenario("write-long-label").unwrap();
    let size = &scenario.quick;
    let Generator::LongLabel { steps } = size.params else {
        panic!("write-long-label is not a long-label scenario")
    };
    let group = "write/long-label";
    arms::bench_workload(c, group, &size.params, &size.expected, |g| {
        g.sample_size(20);
    });
    // The lock pair alone, on a real store file, as `Client::observe` takes it.
    let dir = tempfile::tempdir().unwrap();
    let mut file =
        StoreFile::open(&dir.path().join("metric_lock___4242.bin"), StoreIo::Mapped).unwrap();
    let mut group = c.benchmark_group(format!("{group}/floor"));
    group.sample_size(20);
    group.bench_function("flock-pair", |b| {
        b.iter(|| {
            for _ in 0..steps {
                file.with_lock(|f| Ok(black_box(f).used())).unwrap();
            }
        })
    });
    group.finish();
}

#[path = "support/arms.rs"]
mod arms;
#[path = "support/profiler.rs"]
mod profiler;

criterion_group! {
    name = benches;
    config = profiler::criterion();
    targets = long_label
}
criterion_main!(benches);
