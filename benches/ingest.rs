//! Ingest benchmarks on the seed's workload: 1,000 groups × 100 series, one
//! sample per series per second, 50,000 rows per request (the feeder's
//! generator, in process). Side by side in one run:
//! - `ingest_handle`: `Ingester::handle` on ticks 1..=3 (300,000 samples, six
//!   request bodies as sent) after tick 0 warmed the ingester, for the
//!   baseline, each strategy alone, and all four (throughput in samples/s, one core);
//! - `ingest_decode`: snappy alone, then snappy + owned (prost) vs borrowed decode;
//! - `ingest_query`: the quantiles of all 1,000 groups of a closed window.
//!
//! Times are this thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall time:
//! the machine is shared, and CPU per sample on one core is what the targets are about.
//!
//! `PROMLAB_BENCH_GROUPS` changes the number of groups (e.g. 100 for a quick look).
//!
//! ```text
//! cargo bench --bench ingest
//! cargo bench --bench ingest -- 'ingest_handle/(baseline|all)' --profile-time 10   # flamegraphs
//! ```

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use promlab::ingest::feed::Workload;
use promlab::ingest::pipeline::Ingester;
use promlab::ingest::plan::Plan;
use promlab::ingest::wire::{self, WriteRequest};
use promlab::strategy::{Stage, Strategy, StrategySet};
use std::hint::black_box;
use std::time::Duration;

const START_MS: i64 = 1_700_000_000_000 - 1_700_000_000_000 % 60_000;

fn workload() -> Workload {
    let groups = std::env::var("PROMLAB_BENCH_GROUPS")
        .ok()
        .and_then(|g| g.parse().ok())
        .unwrap_or(1000);
    Workload {
        groups,
        ..Workload::seed(START_MS)
    }
}

/// The sets compared: baseline, each strategy alone, all.
fn sets() -> Vec<(String, StrategySet)> {
    let mut sets = vec![("baseline".to_string(), StrategySet::NONE)];
    for s in Stage::Ingest.strategies() {
        sets.push((s.name().to_string(), StrategySet::NONE.with(s)));
    }
    sets.push((
        "all".to_string(),
        StrategySet::all().restrict(Stage::Ingest),
    ));
    sets
}

/// CPU time of the calling thread, in nanoseconds.
pub struct ThreadCpu;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns() - start
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (div, unit) = match typical {
            t if t < 1e3 => (1.0, "ns cpu"),
            t if t < 1e6 => (1e3, "µs cpu"),
            t if t < 1e9 => (1e6, "ms cpu"),
            _ => (1e9, "s cpu"),
        };
        values.iter_mut().for_each(|v| *v /= div);
        unit
    }
    fn scale_throughputs(
        &self,
        typical: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        let n = match throughput {
            Throughput::Elements(n)
            | Throughput::Bytes(n)
            | Throughput::BytesDecimal(n)
            | Throughput::Bits(n) => *n,
            Throughput::ElementsAndBytes { elements, .. } => *elements,
        } as f64;
        let per_sec = n * 1e9 / typical;
        let (div, unit) = if per_sec < 1e6 {
            (1e3, "K/cpu-s")
        } else {
            (1e6, "M/cpu-s")
        };
        values.iter_mut().for_each(|v| *v = n * 1e9 / *v / div);
        unit
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn bench_handle(c: &mut Criterion<ThreadCpu>) {
    let generator = workload().generator();
    let warm = generator.tick_bodies(0);
    let bodies: Vec<Vec<u8>> = (1..=3).flat_map(|t| generator.tick_bodies(t)).collect();
    let samples = 3 * generator.workload.samples_per_tick();
    let mut group = c.benchmark_group("ingest_handle");
    group.throughput(Throughput::Elements(samples));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(8));
    for (name, set) in sets() {
        let mut ingester = Ingester::new(Plan::default(), set);
        for body in &warm {
            ingester.handle(body).unwrap();
        }
        group.bench_function(BenchmarkId::from_parameter(&name), |b| {
            b.iter(|| {
                for body in &bodies {
                    black_box(ingester.handle(body).unwrap());
                }
            })
        });
    }
    group.finish();
}

fn bench_decode(c: &mut Criterion<ThreadCpu>) {
    let generator = workload().generator();
    let bodies = generator.tick_bodies(1);
    let samples = generator.workload.samples_per_tick();
    let mut group = c.benchmark_group("ingest_decode");
    group.throughput(Throughput::Elements(samples));
    group.sample_size(20);
    let mut raw = Vec::new();
    group.bench_function("snappy", |b| {
        b.iter(|| {
            for body in &bodies {
                wire::decompress(body, 64 << 20, &mut raw).unwrap();
                black_box(&raw);
            }
        })
    });
    group.bench_function("snappy+owned", |b| {
        b.iter(|| {
            for body in &bodies {
                wire::decompress(body, 64 << 20, &mut raw).unwrap();
                let mut holder = WriteRequest::default();
                black_box(wire::decode_owned(&raw, &mut holder).unwrap().samples.len());
            }
        })
    });
    group.bench_function("snappy+borrowed", |b| {
        b.iter(|| {
            for body in &bodies {
                wire::decompress(body, 64 << 20, &mut raw).unwrap();
                black_box(wire::decode_borrowed(&raw).unwrap().samples.len());
            }
        })
    });
    group.finish();
}

fn bench_query(c: &mut Criterion<ThreadCpu>) {
    let generator = workload().generator();
    let mut group = c.benchmark_group("ingest_query");
    for (name, set) in [
        ("reference", StrategySet::NONE),
        ("bulk-sketch", StrategySet::NONE.with(Strategy::BulkSketch)),
    ] {
        let mut ingester = Ingester::new(
            Plan::default(),
            set.with(Strategy::SeriesCache).with(Strategy::BatchRouting),
        );
        for t in 0..5 {
            for body in generator.tick_bodies(t) {
                ingester.handle(&body).unwrap();
            }
        }
        ingester.flush();
        assert_eq!(
            ingester.query("data", None).unwrap().groups.len() as u64,
            generator.workload.groups
        );
        group.bench_function(BenchmarkId::new("all_groups", name), |b| {
            b.iter(|| black_box(ingester.query("data", None)))
        });
    }
    group.finish();
}

#[path = "support/profiler.rs"]
mod profiler;

criterion_group! {
    name = benches;
    config = profiler::criterion().with_measurement(ThreadCpu);
    targets = bench_handle, bench_decode, bench_query
}
criterion_main!(benches);
