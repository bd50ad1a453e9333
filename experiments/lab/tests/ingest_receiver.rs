//! The remote-write receiver over HTTP: status codes, the feeder, queries, self-metrics.

use promlab_lab::http_client::Client;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `promlab serve` on a free loopback port; killed on drop.
pub struct Server {
    child: Child,
    pub addr: String,
}

impl Server {
    pub fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_promlab"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn promlab serve");
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        Server { child, addr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request: (status, body as text).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let url = format!("http://{addr}{path}");
    let response = Client::new(Some(Duration::from_secs(20)), 1)
        .request(method, &url, headers, body)
        .unwrap_or_else(|e| panic!("{method} {url}: {e:#}"));
    (response.status, response.text())
}

const REMOTE_WRITE: [(&str, &str); 2] = [
    ("Content-Type", "application/x-protobuf"),
    ("Content-Encoding", "snappy"),
];

fn write(addr: &str, body: &[u8]) -> (u16, String) {
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
    let server = Server::start(&["--max-body-bytes", "100000", "--strategies", "all"]);
    let addr = &server.addr;
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
    let server = Server::start(&["--plan", plan.to_str().unwrap()]);
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
    let (status, body) = http(&server.addr, "GET", "/api/v1/quantiles?agg=data", &[], b"");
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
        &server.addr,
        "GET",
        "/api/v1/quantiles?agg=data&window=0",
        &[],
        b"",
    );
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["window_start_ms"], 0);
    // Reload bumps the generation and keeps the unchanged aggregation's windows.
    let (status, msg) = http(&server.addr, "POST", "/-/reload", &[], b"");
    assert_eq!(status, 200, "{msg}");
    assert!(msg.contains("generation 2"), "{msg}");
    let (_, body) = http(&server.addr, "GET", "/api/v1/quantiles?agg=data", &[], b"");
    assert!(body.contains("\"window_start_ms\":1000"), "{body}");
}

/// `--ingest-threads 3` (groups over three shards, requests decoded outside
/// the lock) answers every query as one thread does, byte for byte.
#[test]
fn sharded_receiver_answers_as_one_thread() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.toml");
    std::fs::write(
        &plan,
        "lateness_secs = 0\nkeep_windows = 2\n[[aggregation]]\nid = \"data\"\nmetric = \"data\"\ngroup_by = [\"label_0\"]\nwindow_secs = 1\n[[aggregation]]\nid = \"inst\"\nmetric = \"data\"\ngroup_by = [\"instance\"]\nwindow_secs = 2\n",
    )
    .unwrap();
    let plan = plan.to_str().unwrap();
    let one = Server::start(&[
        "--plan",
        plan,
        "--strategies",
        "all",
        "--ingest-threads",
        "1",
    ]);
    let three = Server::start(&[
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
        let expected = http(&one.addr, "GET", &path, &[], b"");
        assert!(
            expected.1.contains("groups") || query == "agg=nope",
            "{expected:?}"
        );
        assert_eq!(
            http(&three.addr, "GET", &path, &[], b""),
            expected,
            "{query}"
        );
    }
    let samples = |addr: &str| {
        let (_, body) = http(addr, "GET", "/metrics", &[], b"");
        body.lines()
            .find(|l| l.starts_with("promlab_ingest_samples_total "))
            .map(str::to_string)
    };
    assert_eq!(samples(&three.addr), samples(&one.addr));
}
