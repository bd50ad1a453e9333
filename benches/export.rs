//! Export, side by side, as scrapes of a long-lived exporter per arm (what
//! `promlab ablate` times, `harness::workloads`): the seed repro (10
//! processes × 150 statements), the larger case as client_ruby wrote it (the
//! fixture: 52.7 MB of store data, 5,254 lines) and generated at twice its
//! size (97.8 MB, statements up to ~3,900 characters throughout), and the
//! shapes stores grow into: `many-processes` (client_ruby's all-types store
//! cloned under 6,000 exited workers' pids, 50,400 files), `many-processes-5k`
//! (5,040 files) and `many-metrics` (400 counters × 100 processes, 40,000
//! one-entry files). Under `-- --test` (each arm once, verified: what CI
//! runs per feature) those three run at their quick sizes. The arms
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
    bench_size(c, name, &scenario.full, samples);
}

/// A built-in export scenario at its full size, or at its quick size under
/// `--test` (tens of thousands of files: the verification is the point there).
fn bench_large_store(c: &mut Criterion, name: &str, samples: usize) {
    let scenario = harness::load_scenario(name).unwrap();
    let test_mode = std::env::args().any(|a| a == "--test");
    bench_size(c, name, scenario.size(test_mode), samples);
}

fn bench_size(c: &mut Criterion, name: &str, size: &harness::Size, samples: usize) {
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

fn many_processes(c: &mut Criterion) {
    bench_large_store(c, "many-processes", 10);
}

fn many_processes_5k(c: &mut Criterion) {
    bench_large_store(c, "many-processes-5k", 20);
}

fn many_metrics(c: &mut Criterion) {
    bench_large_store(c, "many-metrics", 10);
}

#[path = "support/arms.rs"]
mod arms;
#[path = "support/profiler.rs"]
mod profiler;

criterion_group! {
    name = benches;
    config = profiler::criterion();
    targets = seed_repro, large_ruby, large, many_processes, many_processes_5k, many_metrics
}
criterion_main!(benches);
