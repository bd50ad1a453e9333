//! The remote-write receiver against hostile clients (issue 12): timestamps far
//! ahead of the clock, a cardinality attack, slow clients, SIGTERM with
//! half-open clients. Loopback only; every wait bounded.

use promlab_lab::machine::ProcessStats;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{http, Served};

#[path = "../../../tests/common/remote_write.rs"]
mod remote_write;
mod support;

/// `promlab serve ARGS` on a free loopback port, optionally with an open-file
/// limit; killed on drop.
struct Server(Served);

impl Server {
    fn start(args: &[&str], max_files: Option<u64>) -> Server {
        Server(match max_files {
            Some(n) => support::serve_with_max_files(args, n),
            None => support::serve(args),
        })
    }

    fn get(&self, path: &str) -> (u16, String) {
        self.0.http("GET", path, &[], b"")
    }

    fn write(&self, body: &[u8]) -> (u16, String) {
        self.0.http("POST", "/api/v1/write", &REMOTE_WRITE, body)
    }

    /// A counter or gauge of `/metrics`, by its full sample name (with labels).
    fn metric(&self, sample: &str) -> f64 {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200, "{text}");
        text.lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {sample} in\n{text}"))
            .parse()
            .unwrap()
    }

    fn peak_rss_mib(&self) -> f64 {
        let stats = ProcessStats::of(self.0.pid()).unwrap();
        stats.peak_rss_kib.unwrap() as f64 / 1024.0
    }
}

const REMOTE_WRITE: [(&str, &str); 2] = [
    ("Content-Type", "application/x-protobuf"),
    ("Content-Encoding", "snappy"),
];

/// A request of `data` series, one per (group, timestamp, value).
fn request(samples: impl IntoIterator<Item = (String, i64, f64)>) -> Vec<u8> {
    let samples: Vec<(String, i64, f64)> = samples.into_iter().collect();
    let borrowed: Vec<(&str, i64, f64)> = samples
        .iter()
        .map(|(g, t, v)| (g.as_str(), *t, *v))
        .collect();
    remote_write::body(&borrowed)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Issue 12, item 5: one sample stamped in 2100 (or in ns sent as ms) moved the
/// watermark, and every real-time sample after it was late. Now it is counted
/// `too_far_ahead` and dropped, the rest of its request counts, and a sample
/// ahead but within the bound does not close the current window either.
#[test]
fn future_timestamps_cannot_close_windows() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.toml");
    std::fs::write(
        &plan,
        "lateness_secs = 5\n[[aggregation]]\nid = \"data\"\nmetric = \"data\"\ngroup_by = [\"label_0\"]\nwindow_secs = 60\n",
    )
    .unwrap();
    let server = Server::start(&["--plan", plan.to_str().unwrap()], None);
    let now = now_ms();
    let year_2100 = 4_102_444_800_000;
    let ns_as_ms = now * 1_000_000;
    let g = |s: &str| s.to_string();
    assert_eq!(server.write(&request([(g("a"), now, 1.0)])).0, 204);
    let (status, body) = server.write(&request([
        (g("a"), year_2100, 2.0),
        (g("b"), ns_as_ms, 3.0),
        (g("a"), now, 4.0),
    ]));
    assert_eq!(status, 204, "{body}");
    // Ahead of the clock, but within the bound (4 minutes of the default 10).
    assert_eq!(
        server.write(&request([(g("a"), now + 240_000, 5.0)])).0,
        204
    );
    assert_eq!(server.write(&request([(g("a"), now, 6.0)])).0, 204);
    let dropped = "promlab_receiver_samples_dropped_total{reason=\"too_far_ahead\"}";
    assert_eq!(server.metric(dropped), 2.0);
    assert_eq!(server.metric("promlab_ingest_samples_late_total"), 0.0);
    assert_eq!(server.metric("promlab_ingest_samples_accepted_total"), 4.0);
    // The current window is still open: no closed window to answer from.
    let (_, body) = server.get("/api/v1/quantiles?agg=data");
    assert!(body.contains("\"window_start_ms\":null"), "{body}");
}

/// Issue 12, item 11: 2M distinct `label_0` values took RSS to 3.6 GB. With
/// the default limits, a million new groups, then the groups spread over many
/// windows with values over the whole range, stay under 1 GiB, and the drops
/// are counted. Run with `--nocapture` for the figures.
#[test]
fn cardinality_attack_stays_under_the_memory_budget() {
    const BUDGET_MIB: f64 = 1024.0;
    for strategies in ["none", "all"] {
        let server = Server::start(&["--strategies", strategies], None);
        let now = now_ms();
        let started = Instant::now();
        // 1M distinct groups, 50k per request, all in the current window.
        for r in 0..20 {
            let body = request((0..50_000).map(|i| (format!("g{}", r * 50_000 + i), now, 1.0)));
            assert_eq!(server.write(&body).0, 204);
        }
        let groups = server.metric("promlab_receiver_groups");
        let limit = server.metric("promlab_receiver_groups_limit");
        assert_eq!(groups, limit);
        let over = "promlab_receiver_samples_dropped_total{reason=\"group_limit\"}";
        assert_eq!(server.metric(over), 1_000_000.0 - limit);
        // The same groups again, each in ten windows ahead of the clock (within
        // the default bound, so they stay open), with values from 1e-9 to 1e9 so
        // that every pane holds many bins.
        let phase1 = server.peak_rss_mib();
        for r in 0..20 {
            let body = request((0..5_000).flat_map(|i| {
                (0..10).flat_map(move |w| {
                    [-9, -3, 3, 9].map(|e| {
                        let group = format!("g{}", r * 5_000 + i);
                        (group, now + w * 55_000, 10f64.powi(e))
                    })
                })
            }));
            assert_eq!(server.write(&body).0, 204);
        }
        let rss = server.peak_rss_mib();
        let bins = "promlab_receiver_samples_dropped_total{reason=\"bin_limit\"}";
        let panes = "promlab_receiver_samples_dropped_total{reason=\"pane_limit\"}";
        let dropped = (
            server.metric(over),
            server.metric(bins),
            server.metric(panes),
        );
        eprintln!(
            "cardinality attack, --strategies {strategies}: peak RSS {phase1:.0} MiB after 1M groups, {rss:.0} MiB after 10 windows each, in {:.1} s; held groups {groups}, pane slots {}, bins {}; dropped (group, bin, pane limit) {dropped:?}",
            started.elapsed().as_secs_f64(),
            server.metric("promlab_receiver_pane_slots"),
            server.metric("promlab_receiver_sketch_bins"),
        );
        assert!(rss < BUDGET_MIB, "{strategies}: peak RSS {rss:.0} MiB");
        // Still answering.
        assert_eq!(server.get("/api/v1/quantiles?agg=data").0, 200);
    }
}

/// Issue 12, item 12: under `ulimit -n 256`, 300 clients sending a byte a
/// second blocked every legitimate request. Now each must finish its headers
/// within the header timeout, connections stay under the descriptor limit,
/// and a legitimate request is answered while they keep coming back.
#[test]
fn slow_clients_do_not_block_a_request() {
    let server = Server::start(&["--header-timeout-secs", "2"], Some(256));
    let addr = server.0.addr;
    let open = move || {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
        s.set_write_timeout(Some(Duration::from_millis(200))).ok()?;
        Some(s)
    };
    let mut slow: Vec<Option<TcpStream>> = (0..300).map(|_| open()).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_writer = stop.clone();
    let trickle = std::thread::spawn(move || {
        let (mut reopened, mut rounds) = (0, 0);
        while !stop_writer.load(std::sync::atomic::Ordering::Relaxed) {
            for s in &mut slow {
                let alive = s.as_mut().is_some_and(|s| s.write_all(b"G").is_ok());
                if !alive {
                    *s = open();
                    reopened += 1;
                }
            }
            rounds += 1;
            std::thread::sleep(Duration::from_secs(1));
        }
        (reopened, rounds)
    });
    // Past the header timeout, so the slow clients are coming back as they are cut off.
    std::thread::sleep(Duration::from_secs(3));
    let started = Instant::now();
    let (status, _) = http(server.0.addr, "GET", "/metrics", &[], b"");
    let waited = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (reopened, rounds) = trickle.join().unwrap();
    eprintln!(
        "slow clients: 300 at a byte a second under ulimit -n 256 ({reopened} reconnects over {rounds} rounds); a request waited {:.2} s",
        waited.as_secs_f64()
    );
    assert_eq!(status, 200);
    assert!(waited < Duration::from_secs(15), "{waited:?}");
}

/// Issue 12, item 12: SIGTERM waited for half-open clients. Now open
/// connections get the shutdown deadline, then are closed.
#[test]
fn sigterm_with_half_open_clients_exits_within_the_deadline() {
    let mut server = Server::start(&["--shutdown-timeout-secs", "2"], None);
    let addr = server.0.addr;
    // Half-open: headers sent, body promised but never sent; and headers half sent.
    let mut clients = Vec::new();
    for i in 0..20 {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        let partial: &[u8] = if i % 2 == 0 {
            b"POST /api/v1/write HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 1000\r\n\r\nabc"
        } else {
            b"POST /api/v1/write HTTP/1.1\r\nHost: x\r\n"
        };
        s.write_all(partial).unwrap();
        clients.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let status = server.0.terminate(Duration::from_secs(10));
    let took = started.elapsed();
    eprintln!(
        "SIGTERM with 20 half-open clients: exited ({status}) after {:.2} s",
        took.as_secs_f64()
    );
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    drop(clients);
}

/// Issue 12, item 9: a 4 GiB snappy header is 413 (the docs said so; it was
/// 400), and the content type is matched exactly, 2.0 named in the answer.
#[test]
fn content_type_and_oversized_header() {
    let server = Server::start(&[], None);
    let (status, body) = server.write(&[0x80, 0x80, 0x80, 0x80, 0x10, 0x00]);
    assert_eq!(status, 413, "{body}");
    let body_ok = request([("g".to_string(), now_ms(), 1.0)]);
    for (content_type, want) in [
        ("application/x-protobuf;proto=prometheus.WriteRequest", 204),
        ("application/x-protobufXYZ", 415),
        (
            "application/x-protobuf;proto=io.prometheus.write.v2.Request",
            415,
        ),
    ] {
        let (status, body) = http(
            server.0.addr,
            "POST",
            "/api/v1/write",
            &[
                ("Content-Type", content_type),
                ("Content-Encoding", "snappy"),
            ],
            &body_ok,
        );
        assert_eq!(status, want, "{content_type}: {body}");
        if content_type.contains("v2") {
            assert!(body.contains("2.0"), "{body}");
        }
    }
    // More samples than --max-samples-per-request is a 413 too, applied nothing.
    let server = Server::start(&["--max-samples-per-request", "10"], None);
    let body = request((0..11).map(|i| (format!("g{i}"), now_ms(), 1.0)));
    let (status, body) = server.write(&body);
    assert_eq!(status, 413, "{body}");
    assert_eq!(server.metric("promlab_ingest_requests_total"), 0.0);
}

/// `--listen localhost:PORT` resolves the name.
#[test]
fn listen_takes_a_host_name() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args(["serve", "--listen", "localhost:0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        line.contains("http://127.0.0.1:") || line.contains("http://[::1]:"),
        "{line}"
    );
}

/// Issue 12, item 13: `--queues 100000000` climbed without limit; now a clear error.
#[test]
fn scenario_size_is_bounded() {
    let out = Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args(["serve", "--scenario", "rabbitmq", "--queues", "100000000"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--queues") && stderr.contains("100000"),
        "{stderr}"
    );
}

/// The sidecar runs on the same server loop: a client that never finishes
/// its headers is cut off after the header timeout, and others are served.
#[test]
fn the_sidecar_has_the_same_header_timeout() {
    let server = Server::start(
        &[
            "--scenario",
            "rabbitmq",
            "--queues",
            "10",
            "--header-timeout-secs",
            "1",
        ],
        None,
    );
    let addr = server.0.addr;
    let mut slow = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    slow.write_all(b"GET /metrics/per-object HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    let n = std::io::Read::read(&mut slow, &mut buf).unwrap_or(0);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(
        n == 0 || String::from_utf8_lossy(&buf[..n]).contains("408"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    assert_eq!(server.get("/metrics/per-object").0, 200);
}
