//! Write path, side by side: the `write-long-label` scenario's quick size —
//! 20,000 × (one histogram observe + one counter increment) with a
//! 195-character label (the 5.0.0 write-path report) — on a warm writer per
//! arm, as `promlab ablate` times it. The arms follow the features (see
//! `support/arms.rs`); each arm's first run, from an empty directory, must
//! leave the store files the scenario's digest names. The last arm, `floor`
//! (`harness::floor::WriteFloor`), times 20,000 × `flock(LOCK_EX)` +
//! `flock(LOCK_UN)` on a store file, the lock pair client_ruby's protocol
//! holds around every observe: the floor under any arm.
//!
//! ```text
//! cargo bench --features key-cache,increment-once --bench write
//! ```

use criterion::{criterion_group, criterion_main, Criterion};
use promlab_lab::harness;

fn long_label(c: &mut Criterion) {
    let scenario = harness::load_scenario("write-long-label").unwrap();
    let size = &scenario.quick;
    arms::bench_workload(c, "write/long-label", &size.params, &size.expected, |g| {
        g.sample_size(20);
    });
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
