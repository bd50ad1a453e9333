//! Render benchmarks on RabbitMQ's per-object scenario at N = 10,000 queues
//! (630,000 series), side by side in one run:
//! - `render_630k`: the baseline vs `prerender`, and the `prometheus-client`
//!   and `prometheus` crates rendering the same families (throughput in lines/s);
//! - `scrape_http_630k`: time to last byte of a full scrape from `promlab`'s
//!   server over loopback, plain and gzip, baseline and `prerender`.
//!
//! `PROMLAB_BENCH_QUEUES` changes the scale (e.g. 1000 for a quick look).
//!
//! ```text
//! cargo bench --bench render
//! ```

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prometheus_client::encoding::text::encode;
use promlab::render::rabbitmq::RabbitMqNode;
use promlab::strategy::{Strategy, StrategySet};
use promlab_lab::harness::peers::crates_render::{prometheus_client_registry, prometheus_registry};
use promlab_lab::http_client::Client;
use promlab_lab::serve::metrics::{app, Source};
use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn queues() -> usize {
    std::env::var("PROMLAB_BENCH_QUEUES")
        .ok()
        .and_then(|q| q.parse().ok())
        .unwrap_or(10_000)
}

fn prerender() -> StrategySet {
    StrategySet::NONE.with(Strategy::Prerender)
}

fn render(c: &mut Criterion) {
    let n = queues();
    let baseline = RabbitMqNode::build(n, false, StrategySet::NONE).unwrap();
    let fast = RabbitMqNode::build(n, false, prerender()).unwrap();
    let lines = baseline.series_count() as u64;

    let mut group = c.benchmark_group(format!("render_{}k", lines / 1000));
    group.throughput(Throughput::Elements(lines));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    let mut out = Vec::new();
    group.bench_function("baseline", |b| {
        b.iter(|| {
            baseline.render_per_object(&mut out);
            black_box(out.len())
        })
    });
    group.bench_function("prerender", |b| {
        b.iter(|| {
            fast.render_per_object(&mut out);
            black_box(out.len())
        })
    });

    let client = prometheus_client_registry(&baseline).unwrap();
    let mut text = String::new();
    group.bench_function("prometheus-client", |b| {
        b.iter(|| {
            text.clear();
            encode(&mut text, &client).unwrap();
            black_box(text.len())
        })
    });
    drop(client);

    let rust_prometheus = prometheus_registry(&baseline).unwrap();
    let encoder = prometheus::TextEncoder::new();
    group.bench_function("prometheus", |b| {
        b.iter(|| {
            out.clear();
            prometheus::Encoder::encode(&encoder, &rust_prometheus.gather(), &mut out).unwrap();
            black_box(out.len())
        })
    });
    group.finish();

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
    let (baseline_families, fast_families) = (integral(&baseline), integral(&fast));
    let integral_lines: usize = baseline_families
        .iter()
        .map(|&f| baseline.registry().values(f).len())
        .sum();
    let mut group = c.benchmark_group(format!("render_{}k_integral_values", integral_lines / 1000));
    group.throughput(Throughput::Elements(integral_lines as u64));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    group.bench_function("baseline", |b| {
        b.iter(|| {
            baseline
                .registry()
                .render_families_into(&baseline_families, &mut out);
            black_box(out.len())
        })
    });
    group.bench_function("prerender", |b| {
        b.iter(|| {
            fast.registry()
                .render_families_into(&fast_families, &mut out);
            black_box(out.len())
        })
    });
    group.finish();
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
    for (name, set) in [("baseline", StrategySet::NONE), ("prerender", prerender())] {
        let scenario = RabbitMqNode::build(n, false, set).unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        runtime.spawn(async move { axum::serve(listener, app(Source::Scenario(scenario))).await });
        servers.push((name, addr));
    }

    let mut group = c.benchmark_group(format!("scrape_http_{}k", n * 63 / 1000));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    let client = Client::new(None, 1);
    let mut body = Vec::new();
    for &(name, addr) in &servers {
        for gzip in [false, true] {
            let bytes = scrape(&client, addr, gzip, &mut body);
            eprintln!("{name} gzip={gzip}: {bytes} body bytes");
            let id = BenchmarkId::new(name, if gzip { "gzip" } else { "plain" });
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
    drop(runtime);
}

criterion_group!(benches, render, scrape_http);
criterion_main!(benches);
