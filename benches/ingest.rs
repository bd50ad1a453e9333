//! Ingest benchmarks, side by side in one run:
//! - `ingest/asap-1e5`: the ablation's own run (`harness::workloads`) of the
//!   `asap-1e5` scenario at its quick size — the feeder's requests (50 groups ×
//!   100 series, one sample per series per second, 65 ticks: 325,000 samples in
//!   50,000-row requests) into a fresh ingester, the flush, and the query of
//!   every group — per arm (see `support/arms.rs`; throughput in samples/s, one core);
//! - `ingest/prometheus-captures`: the same for the 27 requests a real
//!   Prometheus 2.42 sent, 4 passes;
//! - `ingest_decode` (when `borrowed-decode` is an arm): snappy alone, then
//!   snappy + owned (prost) vs borrowed decode, on the seed's 1,000 groups;
//! - `query/asap-query` (wall time, not CPU: one arm asks over HTTP): the
//!   `asap-query` scenario at its quick size — `/api/v1/quantiles` for 1,000
//!   groups of the last closed window — per arm, then `all-uncached`,
//!   `all-serde` (the path before), `http` and the floors (the kept answer
//!   copied; the quantile scan with the answer written around its values).
//!
//! Every group has a `floor` arm (`harness::floor`), checked like the others.
//!
//! Each arm's answer (quantiles and counters) must match the scenario's digest
//! before it is timed. Times are this thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`), not wall time: the machine is shared, and CPU
//! per sample on one core is what the targets are about.
//!
//! `PROMLAB_BENCH_GROUPS` changes the number of groups of `ingest/asap-1e5`
//! (its answer then comes from `harness::expected_answer`) and of the others.
//!
//! ```text
//! cargo bench --features series-cache,batch-routing --bench ingest
//! cargo bench --bench ingest -- 'ingest/asap-1e5/(baseline|borrowed)' --profile-time 10   # flamegraphs
//! ```

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use promlab::ingest::feed::FeedWorkload;
use promlab::ingest::wire::{self, WriteRequest};
use promlab::shared::strategy::{Stage, Strategy};
use promlab_lab::harness::{self, Generator};
use std::hint::black_box;
use std::time::Duration;

const START_MS: i64 = 1_700_000_000_000 - 1_700_000_000_000 % 60_000;

fn bench_groups() -> Option<u64> {
    std::env::var("PROMLAB_BENCH_GROUPS")
        .ok()
        .and_then(|g| g.parse().ok())
}

fn workload() -> FeedWorkload {
    FeedWorkload {
        groups: bench_groups().unwrap_or(1000),
        ..FeedWorkload::seed(START_MS)
    }
}

/// Whether the build's ingest arms include `strategy`.
fn ablated(strategy: Strategy) -> bool {
    harness::configured(Stage::Ingest).contains(strategy)
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

fn bench_scenarios(c: &mut Criterion<ThreadCpu>) {
    let asap = harness::load_scenario("asap-1e5").unwrap();
    let (mut params, mut expected) = (asap.quick.params.clone(), asap.quick.expected.clone());
    if let (Some(n), Generator::Asap { groups, .. }) = (bench_groups(), &mut params) {
        *groups = n;
        expected = harness::digest(&harness::expected_answer(&params).unwrap());
    }
    arms::bench_workload(c, "ingest/asap-1e5", &params, &expected, |g| {
        g.sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(8));
    });
    let captures = harness::load_scenario("prometheus-captures").unwrap();
    arms::bench_workload(
        c,
        "ingest/prometheus-captures",
        &captures.quick.params,
        &captures.quick.expected,
        |g| {
            g.sample_size(20);
        },
    );
}

fn bench_decode(c: &mut Criterion<ThreadCpu>) {
    if !ablated(Strategy::BorrowedDecode) {
        return;
    }
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

fn bench_query(c: &mut Criterion) {
    let query = harness::load_scenario("asap-query").unwrap();
    arms::bench_workload(
        c,
        "query/asap-query",
        &query.quick.params,
        &query.quick.expected,
        |g| {
            g.sample_size(20);
        },
    );
}

#[path = "support/arms.rs"]
mod arms;
#[path = "support/profiler.rs"]
mod profiler;

criterion_group! {
    name = benches;
    config = profiler::criterion().with_measurement(ThreadCpu);
    targets = bench_scenarios, bench_decode
}
criterion_group! {
    name = query;
    config = profiler::criterion();
    targets = bench_query
}
criterion_main!(benches, query);
