//! `promlab serve` as a real process: the RabbitMQ endpoints and store mode over
//! HTTP, `promtool check metrics` on what it serves, and a real Prometheus
//! scraping both modes.
//!
//! Prometheus and promtool come from the Debian `prometheus` package. Without
//! them the checks that need them are skipped with a notice, unless `CI` is set,
//! in which case they fail.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{get, serve, try_get, Reaped};

const QUEUES: usize = 50;
const SERIES_PER_QUEUE: usize = promlab::render::rabbitmq::SERIES_PER_QUEUE;

const GZIP: [(&str, &str); 1] = [("Accept-Encoding", "gzip")];

fn samples(text: &[u8]) -> usize {
    text.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty() && l[0] != b'#')
        .count()
}

/// Each line without its value: what stays put while values move.
fn line_prefixes(text: &[u8]) -> Vec<&[u8]> {
    text.split(|&b| b == b'\n')
        .map(|l| {
            if l.starts_with(b"#") {
                l
            } else {
                &l[..l.iter().rposition(|&b| b == b' ').unwrap_or(0)]
            }
        })
        .collect()
}

/// `/usr/bin/<name>` or `<name>` on PATH; `None` means skip (and fail under CI).
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        common::skip(
            &format!("`{name}`, so the checks that need it"),
            "apt-get install -y prometheus",
        );
    }
    found
}

fn promtool_accepts(promtool: &Path, body: &[u8]) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn promtool");
    child.stdin.take().unwrap().write_all(body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join("tests/fixtures/ruby-dfs")
        .join(name)
}

const STORE_FIXTURE: &str = "all-types-v4.2.5";

fn store_args(dir: &Path) -> Vec<String> {
    vec![
        "--store".into(),
        dir.join("store").display().to_string(),
        "--registry".into(),
        dir.join("registry.json").display().to_string(),
    ]
}

#[test]
fn scenario_endpoints_over_http() {
    let server = serve(&[
        "--scenario",
        "rabbitmq",
        "--queues",
        "20",
        "--awkward-names",
    ]);
    let addr = server.addr;

    let plain = get(addr, "/metrics/per-object", &[]);
    assert_eq!(plain.status, 200);
    assert_eq!(
        plain.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert_eq!(plain.header("content-encoding"), None);
    assert_eq!(samples(&plain.body), SERIES_PER_QUEUE * 20);

    let zipped = get(addr, "/metrics/per-object", &GZIP);
    assert_eq!(zipped.status, 200);
    assert_eq!(zipped.header("content-encoding"), Some("gzip"));
    let mut unzipped = Vec::new();
    flate2::read::GzDecoder::new(&zipped.body[..])
        .read_to_end(&mut unzipped)
        .unwrap();
    assert_eq!(line_prefixes(&unzipped), line_prefixes(&plain.body));
    assert_ne!(unzipped, plain.body, "values move between scrapes");

    let detailed = get(
        addr,
        "/metrics/detailed?family=queue_coarse_metrics&family=queue_consumer_count",
        &[],
    );
    assert_eq!(detailed.status, 200);
    assert_eq!(samples(&detailed.body), 5 * 20);
    let text = String::from_utf8(detailed.body.clone()).unwrap();
    assert!(text.starts_with("# TYPE rabbitmq_queue_messages_ready gauge\n"));
    assert!(text.contains("# TYPE rabbitmq_queue_consumers gauge\n"));
    assert!(!text.contains("rabbitmq_queue_consumer_capacity"));

    let unknown = get(
        addr,
        "/metrics/detailed?family=queue_coarse_metrics&family=nope",
        &[],
    );
    assert_eq!(unknown.status, 400);
    assert!(String::from_utf8_lossy(&unknown.body).contains("unknown family `nope`"));
    let bad_param = get(addr, "/metrics/detailed?vhost=%2F", &[]);
    assert_eq!(bad_param.status, 400);
    assert_eq!(get(addr, "/metrics", &[]).status, 404);
    assert_eq!(get(addr, "/nowhere", &[]).status, 404);

    if let Some(promtool) = tool("promtool") {
        promtool_accepts(&promtool, &plain.body);
        promtool_accepts(&promtool, &detailed.body);
    }
}

#[test]
fn store_mode_serves_the_ruby_exposition() {
    let dir = fixture(STORE_FIXTURE);
    let expected = std::fs::read(dir.join("expected.prom")).expect("fixture");
    // The baseline, and every strategy (a catalogue and mapped files kept across scrapes).
    for strategies in ["none", "all"] {
        let mut args = store_args(&dir);
        args.extend(["--strategies".to_string(), strategies.to_string()]);
        let server = serve(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let addr = server.addr;
        store_mode_scrapes(addr, &expected);
    }
}

fn store_mode_scrapes(addr: SocketAddr, expected: &[u8]) {
    for _ in 0..3 {
        // Again and again: the long-lived exporter must give the same bytes on later scrapes.
        let response = get(addr, "/metrics", &[]);
        assert_eq!(response.status, 200);
        assert_eq!(
            response.header("content-type"),
            Some("text/plain; version=0.0.4; charset=utf-8")
        );
        assert_eq!(
            String::from_utf8_lossy(&response.body),
            String::from_utf8_lossy(expected)
        );
    }
    let zipped = get(addr, "/metrics", &GZIP);
    let mut unzipped = Vec::new();
    flate2::read::GzDecoder::new(&zipped.body[..])
        .read_to_end(&mut unzipped)
        .unwrap();
    assert_eq!(unzipped, expected);
    assert_eq!(get(addr, "/metrics/per-object", &[]).status, 404);
    if let Some(promtool) = tool("promtool") {
        promtool_accepts(&promtool, expected);
    }
}

#[test]
fn store_mode_refuses_a_missing_directory() {
    let out = Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args([
            "serve",
            "--store",
            "/nonexistent/promlab-store",
            "--registry",
        ])
        .arg(fixture(STORE_FIXTURE).join("registry.json"))
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}

#[test]
fn unknown_scenario_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args(["serve", "--scenario", "kafka", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown scenario `kafka`"));
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Prometheus' instant query API, parsed.
fn query(prometheus: SocketAddr, expr: &str) -> Option<serde_json::Value> {
    let path = format!("/api/v1/query?query={expr}");
    let response = try_get(prometheus, &path, &[]).ok()?;
    if response.status != 200 {
        return None;
    }
    let json: serde_json::Value = serde_json::from_slice(&response.body).ok()?;
    Some(json["data"]["result"].clone())
}

/// `{job: value}` of an instant vector.
fn by_job(result: &serde_json::Value) -> std::collections::BTreeMap<String, f64> {
    result
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            (
                s["metric"]["job"].as_str().unwrap().to_owned(),
                s["value"][1].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn real_prometheus_scrapes_both_modes() {
    let Some(prometheus) = tool("prometheus") else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let queues = QUEUES.to_string();
    let scenario = serve(&[
        "--scenario",
        "rabbitmq",
        "--queues",
        &queues,
        "--awkward-names",
    ]);
    let scenario_addr = scenario.addr;
    let store_dir = fixture(STORE_FIXTURE);
    let args = store_args(&store_dir);
    let store = serve(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let store_addr = store.addr;
    let store_samples = samples(&std::fs::read(store_dir.join("expected.prom")).unwrap());

    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n\
             - job_name: per_object\n  metrics_path: /metrics/per-object\n  static_configs: [{{targets: ['{scenario_addr}']}}]\n\
             - job_name: detailed\n  metrics_path: /metrics/detailed\n  params: {{family: [queue_coarse_metrics, queue_consumer_count]}}\n  static_configs: [{{targets: ['{scenario_addr}']}}]\n\
             - job_name: store\n  metrics_path: /metrics\n  static_configs: [{{targets: ['{store_addr}']}}]\n"
        ),
    )
    .unwrap();
    let web: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let _prometheus = Reaped(
        Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                data.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn prometheus"),
    );

    let expected: std::collections::BTreeMap<String, f64> = [
        ("detailed".to_owned(), (5 * QUEUES) as f64),
        ("per_object".to_owned(), (SERIES_PER_QUEUE * QUEUES) as f64),
        ("store".to_owned(), store_samples as f64),
    ]
    .into();
    let mut scraped = Default::default();
    while Instant::now() < deadline {
        if let Some(result) = query(web, "scrape_samples_scraped") {
            scraped = by_job(&result);
            if scraped.len() == expected.len() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(scraped, expected, "scrape_samples_scraped per job");
    let up = by_job(&query(web, "up").expect("query up"));
    assert!(
        up.len() == 3 && up.values().all(|&v| v == 1.0),
        "up: {up:?}"
    );

    // The awkward queue name survived escaping, parsing and storage.
    let values = get(web, "/api/v1/label/queue/values", &[]);
    let json: serde_json::Value = serde_json::from_slice(&values.body).unwrap();
    let queues: Vec<&str> = json["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        queues.contains(&"perf \"test\" \\ 3\nsecond line ü 日本"),
        "queue label values: {queues:?}"
    );
    assert!(queues.contains(&"perf-test-49"));
}
