//! Render benchmarks on RabbitMQ's per-object scenario at N = 10,000 queues
//! (630,000 series), side by side in one run:
//! - `render_630k`: the arms (see `support/arms.rs`: baseline and `prerender`
//!   unless the features say otherwise), the floor (`harness::floor::RenderFloor`:
//!   the scrape's lines prerendered, copied, each value formatted with
//!   `itoa`/`ryu`; checked against the expected exposition), and the
//!   `prometheus-client` and `prometheus` crates rendering the same families
//!   (throughput in lines/s);
//! - `scrape_http_630k`: time to last byte of a full scrape from `promlab`'s
//!   server over loopback, plain and gzip, per arm.
//!
//! Every arm's registry must render the expected exposition
//! (`harness::expected_answer`) before it is timed or served.
//!
//! `PROMLAB_BENCH_QUEUES` changes the scale (e.g. 1000 for a quick look).
//!
//! ```text
//! cargo bench --bench render
//! ```

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prometheus_client::encoding::text::encode;
use promlab::scenarios::rabbitmq::RabbitMqNode;
use promlab::shared::strategy::Stage;
use promlab_lab::harness::peers::crates_render::{prometheus_client_registry, prometheus_registry};
use promlab_lab::harness::{self, Generator};
use promlab_lab::http_client::Client;
use promlab_lab::servers::metrics::{app, Source};
use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn queues() -> usize {
    std::env::var("PROMLAB_BENCH_QUEUES")
        .ok()
        .and_then(|q| q.parse().ok())
        .unwrap_or(10_000)
}

/// Each arm's registry, checked against the expected exposition.
fn verified_scenarios(n: usize) -> Vec<(String, RabbitMqNode)> {
    let expected = harness::expected_answer(&Generator::Rabbitmq {
        queues: n,
        awkward_names: false,
    })
    .unwrap();
    let mut out = Vec::new();
    arms::arms(Stage::Render)
        .into_iter()
        .map(|(arm, set)| {
            let scenario = RabbitMqNode::build(n, false, set).unwrap();
            scenario.render_per_object(&mut out);
            arms::check(&arm, &out, &expected);
            (arm, scenario)
        })
        .collect()
}

fn render(c: &mut Criterion) {
    let n = queues();
    let scenarios = verified_scenarios(n);
    let baseline = &scenarios[0].1;
    let lines = baseline.series_count() as u64;

    let group_name = format!("render_{}k", lines / 1000);
    let mut summary = arms::Summary::new(&group_name);
    let mut group = c.benchmark_group(&group_name);
    group.throughput(Throughput::Elements(lines));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    let mut out = Vec::new();
    for (arm, scenario) in &scenarios {
        group.bench_function(arm.as_str(), |b| {
            b.iter(|| {
                scenario.render_per_object(&mut out);
                black_box(out.len())
            })
        });
        summary.arm(arm);
    }

    // The floor, on the expected exposition's lines and values.
    let expected = harness::expected_answer(&Generator::Rabbitmq {
        queues: n,
        awkward_names: false,
    })
    .unwrap();
    let mut floor = harness::floor::RenderFloor::new(&expected);
    if floor.same_bytes {
        arms::check("floor", floor.run(), &expected);
    } else {
        assert_eq!(
            floor.lines() as usize,
            expected.split(|&b| b == b'\n').count() - 1
        );
    }
    group.bench_function("floor", |b| b.iter(|| black_box(floor.run().len())));
    summary.arm("floor");
    drop(expected);

    let client = prometheus_client_registry(baseline).unwrap();
    let mut text = String::new();
    group.bench_function("prometheus-client", |b| {
        b.iter(|| {
            text.clear();
            encode(&mut text, &client).unwrap();
            black_box(text.len())
        })
    });
    drop(client);
    summary.arm("prometheus-client");

    let rust_prometheus = prometheus_registry(baseline).unwrap();
    let encoder = prometheus::TextEncoder::new();
    group.bench_function("prometheus", |b| {
        b.iter(|| {
            out.clear();
            prometheus::Encoder::encode(&encoder, &rust_prometheus.gather(), &mut out).unwrap();
            black_box(out.len())
        })
    });
    summary.arm("prometheus");
    group.finish();
    summary.print();

    // The same seam without the two families of full-precision ratios, whose
    // Ruby-exact formatting (a slow exact fallback in `rubyfloat`) costs as
    // much as all other lines together.
    let integral = |s: &RabbitMqNode| -> Vec<_> {
        let reg = s.registry();
        reg.family_ids()
            .filter(|&f| {
                !reg.family_name(f).contains("capacity")
                    && !reg.family_name(f).contains("utilisation")
            })
            .collect()
    };
    let families: Vec<_> = scenarios.iter().map(|(_, s)| integral(s)).collect();
    let integral_lines: usize = families[0]
        .iter()
        .map(|&f| baseline.registry().values(f).len())
        .sum();
    // No independent answer for this subset: every arm must render the baseline's.
    let mut expected = Vec::new();
    baseline
        .registry()
        .render_families_into(&families[0], &mut expected);
    let group_name = format!("render_{}k_integral_values", integral_lines / 1000);
    let mut summary = arms::Summary::new(&group_name);
    let mut group = c.benchmark_group(&group_name);
    group.throughput(Throughput::Elements(integral_lines as u64));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    for ((arm, scenario), families) in scenarios.iter().zip(&families) {
        scenario.registry().render_families_into(families, &mut out);
        arms::check(arm, &out, &expected);
        group.bench_function(arm.as_str(), |b| {
            b.iter(|| {
                scenario.registry().render_families_into(families, &mut out);
                black_box(out.len())
            })
        });
        summary.arm(arm);
    }
    group.finish();
    summary.print();
}

/// One scrape on a fresh connection (`Connection: close`): request sent → last
/// body byte received (the server moves values and renders); the body's length.
fn scrape(client: &Client, addr: SocketAddr, gzip: bool, body: &mut Vec<u8>) -> usize {
    let url = format!("http://{addr}/metrics/per-object");
    let close = ("Connection", "close");
    let headers: &[(&str, &str)] = if gzip {
        &[close, ("Accept-Encoding", "gzip")]
    } else {
        &[close]
    };
    let (status, _) = client.get_into(&url, headers, body).unwrap();
    assert_eq!(status, 200);
    body.len()
}

fn scrape_http(c: &mut Criterion) {
    let n = queues();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut servers = Vec::new();
    for (name, scenario) in verified_scenarios(n) {
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        runtime.spawn(async move { axum::serve(listener, app(Source::Scenario(scenario))).await });
        servers.push((name, addr));
    }

    let group_name = format!("scrape_http_{}k", n * 63 / 1000);
    let mut summary = arms::Summary::new(&group_name);
    let mut group = c.benchmark_group(&group_name);
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    let client = Client::new(None, 1);
    let mut body = Vec::new();
    for (name, addr) in &servers {
        let (name, addr) = (name.as_str(), *addr);
        for gzip in [false, true] {
            let bytes = scrape(&client, addr, gzip, &mut body);
            eprintln!("{name} gzip={gzip}: {bytes} body bytes");
            let id = BenchmarkId::new(name, if gzip { "gzip" } else { "plain" });
            summary.arm(&format!("{name}/{}", if gzip { "gzip" } else { "plain" }));
            group.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(scrape(&client, addr, gzip, &mut body));
                    }
                    start.elapsed()
                })
            });
        }
    }
    group.finish();
    summary.print();
    drop(runtime);
}

#[path = "support/arms.rs"]
mod arms;

criterion_group!(benches, render, scrape_http);
criterion_main!(benches);
