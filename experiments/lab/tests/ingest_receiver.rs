//! The remote-write receiver over HTTP: status codes, the feeder, queries, self-metrics.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use support::{http, serve};

const REMOTE_WRITE: [(&str, &str); 2] = [
    ("Content-Type", "application/x-protobuf"),
    ("Content-Encoding", "snappy"),
];

fn write(addr: SocketAddr, body: &[u8]) -> (u16, String) {
    http(addr, "POST", "/api/v1/write", &REMOTE_WRITE, body)
}

fn request(series: &[&[(&str, &str)]]) -> Vec<u8> {
    use promlab::ingest::wire::{Label, Sample, TimeSeries, WriteRequest};
    use prost::Message;
    let req = WriteRequest {
        timeseries: series
            .iter()
            .map(|labels| TimeSeries {
                labels: labels
                    .iter()
                    .map(|(n, v)| Label {
                        name: n.to_string(),
                        value: v.to_string(),
                    })
                    .collect(),
                samples: vec![Sample {
                    value: 1.0,
                    timestamp: 1_000,
                }],
            })
            .collect(),
        metadata: vec![],
    };
    promlab::ingest::wire::compress(&req.encode_to_vec())
}

#[test]
fn status_codes() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join("tests/fixtures/remote-write/prometheus-2.42/0000.bin");
    let body = std::fs::read(fixture).unwrap();
    let server = serve(&["--max-body-bytes", "100000", "--strategies", "all"]);
    let addr = server.addr;
    assert_eq!(write(addr, &body).0, 204);
    assert_eq!(
        http(
            addr,
            "POST",
            "/api/v1/write",
            &[("Content-Type", "text/plain")],
            &body
        )
        .0,
        415
    );
    assert_eq!(
        http(
            addr,
            "POST",
            "/api/v1/write",
            &[
                ("Content-Type", "application/x-protobuf"),
                ("Content-Encoding", "gzip")
            ],
            &body
        )
        .0,
        415
    );
    let (status, msg) = write(addr, b"\x05not snappy");
    assert_eq!(status, 400);
    assert!(msg.contains("snappy"), "{msg}");
    let (status, msg) = write(addr, &promlab::ingest::wire::compress(b"\xff\xff"));
    assert_eq!(status, 400);
    assert!(msg.contains("protobuf"), "{msg}");
    let (status, msg) = write(addr, &request(&[&[("job", "x")]]));
    assert_eq!(status, 400);
    assert!(msg.contains("__name__"), "{msg}");
    let (status, msg) = write(
        addr,
        &request(&[&[("__name__", "m"), ("b", "1"), ("a", "2")]]),
    );
    assert_eq!(status, 400);
    assert!(msg.contains("sorted"), "{msg}");
    let (status, msg) = write(
        addr,
        &request(&[&[("__name__", "m"), ("a", "1"), ("a", "2")]]),
    );
    assert_eq!(status, 400);
    assert!(msg.contains("duplicate"), "{msg}");
    // Over the limit compressed, and over the limit once decoded (from the snappy header).
    assert_eq!(write(addr, &vec![0u8; 100_001]).0, 413);
    let bomb = promlab::ingest::wire::compress(&vec![0u8; 200_000]);
    assert!(bomb.len() < 100_000);
    let (status, msg) = write(addr, &bomb);
    assert_eq!(status, 413, "{msg}");
    // Still alive and counting.
    let (status, metrics) = http(addr, "GET", "/metrics", &[], b"");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("promlab_ingest_requests_total 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("promlab_http_write_responses_total{code=\"400\"} 5\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("promlab_series_cache_entries "),
        "{metrics}"
    );
    assert_eq!(
        http(addr, "GET", "/api/v1/quantiles?agg=nope", &[], b"").0,
        404
    );
}

#[test]
fn feeder_to_receiver_to_quantiles() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.toml");
    std::fs::write(
        &plan,
        "lateness_secs = 0\n[[aggregation]]\nid = \"data\"\nmetric = \"data\"\ngroup_by = [\"label_0\"]\nwindow_secs = 1\n",
    )
    .unwrap();
    let server = serve(&["--plan", plan.to_str().unwrap()]);
    let url = format!("http://{}/api/v1/write", server.addr);
    let status = Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args([
            "feed",
            "--url",
            &url,
            "--groups",
            "2",
            "--series-per-group",
            "3",
            "--duration-secs",
            "3",
        ])
        .args(["--start-ms", "0", "--batch-rows", "4", "--concurrency", "2"])
        .status()
        .unwrap();
    assert!(status.success());
    let (status, body) = http(server.addr, "GET", "/api/v1/quantiles?agg=data", &[], b"");
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["aggregation"], "data");
    assert_eq!(json["window_start_ms"], 1000);
    let groups = json["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0]["labels"]["label_0"], "g0");
    assert_eq!(groups[0]["count"], 3);
    // Window 0 is still kept and can be named.
    let (_, body) = http(
        server.addr,
        "GET",
        "/api/v1/quantiles?agg=data&window=0",
        &[],
        b"",
    );
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["window_start_ms"], 0);
    // Reload bumps the generation and keeps the unchanged aggregation's windows.
    let (status, msg) = http(server.addr, "POST", "/-/reload", &[], b"");
    assert_eq!(status, 200, "{msg}");
    assert!(msg.contains("generation 2"), "{msg}");
    let (_, body) = http(server.addr, "GET", "/api/v1/quantiles?agg=data", &[], b"");
    assert!(body.contains("\"window_start_ms\":1000"), "{body}");
}

/// One `data{label_0="g0"}` sample at `timestamp` (ms).
fn sample_at(timestamp: i64, value: f64) -> Vec<u8> {
    use promlab::ingest::wire::{Label, Sample, TimeSeries, WriteRequest};
    use prost::Message;
    let labels = [("__name__", "data"), ("label_0", "g0")];
    let req = WriteRequest {
        timeseries: vec![TimeSeries {
            labels: labels
                .iter()
                .map(|(n, v)| Label {
                    name: n.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            samples: vec![Sample { value, timestamp }],
        }],
        metadata: vec![],
    };
    promlab::ingest::wire::compress(&req.encode_to_vec())
}

/// `data` by `label_0` in 1 s windows, no lateness.
const ONE_SECOND_WINDOWS: &str = "lateness_secs = 0\n[[aggregation]]\nid = \"data\"\nmetric = \"data\"\ngroup_by = [\"label_0\"]\nwindow_secs = 1\n";

/// A receiver of [`ONE_SECOND_WINDOWS`], its plan file in `dir`.
fn serve_one_second_windows(dir: &Path) -> (std::path::PathBuf, support::Served) {
    let plan = dir.join("plan.toml");
    std::fs::write(&plan, ONE_SECOND_WINDOWS).unwrap();
    let server = serve(&["--plan", plan.to_str().unwrap()]);
    (plan, server)
}

/// The last closed window's answer is kept outside the
/// ingester's lock and served while it stands — never past a window closing
/// or a reload dropping the aggregation.
#[test]
fn kept_answer_follows_closing_windows_and_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let (plan, server) = serve_one_second_windows(dir.path());
    let addr = server.addr;
    let query = || {
        let (status, body) = http(addr, "GET", "/api/v1/quantiles?agg=data", &[], b"");
        assert_eq!(status, 200, "{body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        (json["window_start_ms"].clone(), json["groups"].clone())
    };
    // Nothing closed yet: the empty answer, twice (the second one kept).
    assert_eq!(write(addr, &sample_at(100, 1.0)).0, 204);
    for _ in 0..2 {
        assert_eq!(query(), (serde_json::Value::Null, serde_json::json!([])));
    }
    // Each write that closes a window changes the answer; queries between agree.
    for (second, value) in [(1, 2.0), (2, 3.0), (3, 4.0)] {
        assert_eq!(write(addr, &sample_at(second * 1000 + 100, value)).0, 204);
        for _ in 0..2 {
            let (start, groups) = query();
            assert_eq!(start, (second - 1) * 1000);
            assert_eq!(groups[0]["count"], 1);
            let p50 = groups[0]["quantiles"]["0.5"].as_f64().unwrap();
            assert!((p50 - (value - 1.0)).abs() < 0.05, "{p50} for {value}");
        }
    }
    // A sample in the open window changes nothing closed.
    assert_eq!(write(addr, &sample_at(3200, 9.0)).0, 204);
    assert_eq!(query().0, 2000);
    // A reload that drops the aggregation: no answer for it any more.
    std::fs::write(
        &plan,
        ONE_SECOND_WINDOWS.replace("id = \"data\"", "id = \"other\""),
    )
    .unwrap();
    let (status, msg) = http(addr, "POST", "/-/reload", &[], b"");
    assert_eq!(status, 200, "{msg}");
    let (status, body) = http(addr, "GET", "/api/v1/quantiles?agg=data", &[], b"");
    assert_eq!(status, 404, "{body}");
}

/// A sender whose last samples came stamped ahead of the clock, then
/// stopped: the watermark, held behind the clock, stopped short of them, and
/// with no further request the window before them stayed open for good (a
/// `cluster measure` run waited on its last window in vain). The clock now
/// moves the watermark on: the window closes once the clock passes its end,
/// with no other request.
#[test]
fn the_clock_closes_a_window_after_the_sender_stops() {
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
    let dir = tempfile::tempdir().unwrap();
    let (_, server) = serve_one_second_windows(dir.path());
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let window = now.div_euclid(1000) * 1000;
    assert_eq!(write(server.addr, &sample_at(now, 1.0)).0, 204);
    assert_eq!(write(server.addr, &sample_at(now + 2_500, 2.0)).0, 204);
    let closed_through = || {
        let (_, text) = http(server.addr, "GET", "/metrics", &[], b"");
        text.lines()
            .find_map(|l| l.strip_prefix("promlab_receiver_closed_through_ms "))
            .map(|v| v.parse::<i64>().unwrap())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while closed_through() < Some(window + 1000) {
        assert!(
            Instant::now() < deadline,
            "window {window} still not closed 10 s after its end passed: closed through {:?}",
            closed_through()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Its answer, as a closed window's: the first sample alone.
    let path = format!("/api/v1/quantiles?agg=data&window={window}");
    let (status, body) = http(server.addr, "GET", &path, &[], b"");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"count\":1"), "{body}");
}

/// `--ingest-threads 3` (three lanes; the requests, one after another, land
/// on whichever lane is free) answers every query as one thread does, byte for
/// byte, open windows included.
#[test]
fn laned_receiver_answers_as_one_thread() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.toml");
    std::fs::write(
        &plan,
        "lateness_secs = 0\nkeep_windows = 2\n[[aggregation]]\nid = \"data\"\nmetric = \"data\"\ngroup_by = [\"label_0\"]\nwindow_secs = 1\n[[aggregation]]\nid = \"inst\"\nmetric = \"data\"\ngroup_by = [\"instance\"]\nwindow_secs = 2\n",
    )
    .unwrap();
    let plan = plan.to_str().unwrap();
    let one = serve(&[
        "--plan",
        plan,
        "--strategies",
        "all",
        "--ingest-threads",
        "1",
    ]);
    let three = serve(&[
        "--plan",
        plan,
        "--strategies",
        "all",
        "--ingest-threads",
        "3",
    ]);
    for server in [&one, &three] {
        let url = format!("http://{}/api/v1/write", server.addr);
        let status = Command::new(env!("CARGO_BIN_EXE_promlab"))
            .args([
                "feed",
                "--url",
                &url,
                "--groups",
                "20",
                "--series-per-group",
                "5",
            ])
            .args([
                "--duration-secs",
                "4",
                "--start-ms",
                "0",
                "--batch-rows",
                "7",
            ])
            .args(["--concurrency", "1"])
            .status()
            .unwrap();
        assert!(status.success());
    }
    for query in [
        "agg=data",
        "agg=inst",
        "agg=data&window=2000",
        "agg=data&window=0",
        "agg=inst&window=0",
        "agg=nope",
    ] {
        let path = format!("/api/v1/quantiles?{query}");
        let expected = http(one.addr, "GET", &path, &[], b"");
        assert!(
            expected.1.contains("groups") || query == "agg=nope",
            "{expected:?}"
        );
        assert_eq!(
            http(three.addr, "GET", &path, &[], b""),
            expected,
            "{query}"
        );
    }
    let samples = |addr: SocketAddr| {
        let (_, body) = http(addr, "GET", "/metrics", &[], b"");
        body.lines()
            .find(|l| l.starts_with("promlab_ingest_samples_total "))
            .map(str::to_string)
    };
    assert_eq!(samples(three.addr), samples(one.addr));
}
