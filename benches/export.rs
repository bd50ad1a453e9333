//! Export, side by side, as scrapes of a long-lived exporter per arm (what
//! `promlab ablate` times, `harness::workloads`): the seed repro (10
//! processes × 150 statements), the larger case as client_ruby wrote it (the
//! fixture: 52.7 MB of store data, 5,254 lines) and generated at twice its
//! size (97.8 MB, statements up to ~3,900 characters throughout). The arms
//! follow the features (see `support/arms.rs`; `prerender` counts as an
//! export strategy, a long-lived exporter uses it). Each arm's first scrape
//! must match the scenario's digest — for `large-ruby`, the digest of Ruby's
//! own `expected.prom` — before it is timed.
//!
//! ```text
//! cargo bench --features decode-once,single-read --bench export
//! cargo bench --bench export -- --profile-time 10   # flamegraphs
//! ```

use criterion::{criterion_group, criterion_main, Criterion};
use promlab_lab::harness;

/// A built-in export scenario at its full size.
fn bench_scenario(c: &mut Criterion, name: &str, samples: usize) {
    let scenario = harness::load_scenario(name).unwrap();
    let size = &scenario.full;
    arms::bench_workload(
        c,
        &format!("export/{name}"),
        &size.params,
        &size.expected,
        |g| {
            g.sample_size(samples);
        },
    );
}

fn seed_repro(c: &mut Criterion) {
    bench_scenario(c, "seed-repro", 50);
}

fn large_ruby(c: &mut Criterion) {
    bench_scenario(c, "large-ruby", 10);
}

fn large(c: &mut Criterion) {
    bench_scenario(c, "large", 10);
}

#[path = "support/arms.rs"]
mod arms;
#[path = "support/profiler.rs"]
mod profiler;

criterion_group! {
    name = benches;
    config = profiler::criterion();
    targets = seed_repro, large_ruby, large
}
criterion_main!(benches);
