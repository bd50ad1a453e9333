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
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{get, serve, try_get};

const QUEUES: usize = 50;
const SERIES_PER_QUEUE: usize = promlab::scenarios::rabbitmq::SERIES_PER_QUEUE;

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

/// A store answer's framing, and that every answer, gzip included, is the
/// store as it is at the request: plain and gzip bodies carry a
/// `Content-Length` (no chunks), the gzip decompresses to the plain body,
/// and a value rewritten in a store file shows in the next gzip answer (a
/// kept gzip is served only for the same bytes).
#[test]
fn store_answers_are_framed_and_follow_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    common::copy_dir(&fixture(STORE_FIXTURE), tmp.path());
    let args = store_args(tmp.path());
    let server = serve(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let addr = server.addr;
    let framed = |response: &promlab_lab::http_client::Response| {
        assert_eq!(response.status, 200);
        assert_eq!(response.header("transfer-encoding"), None);
        assert_eq!(
            response.header("content-length"),
            Some(response.body.len().to_string().as_str())
        );
    };
    let gunzip = |body: &[u8]| {
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(body)
            .read_to_end(&mut plain)
            .unwrap();
        plain
    };
    let before = get(addr, "/metrics", &[]);
    framed(&before);
    for _ in 0..2 {
        let zipped = get(addr, "/metrics", &GZIP);
        framed(&zipped);
        assert_eq!(zipped.header("content-encoding"), Some("gzip"));
        assert_eq!(gunzip(&zipped.body), before.body);
    }
    // The first entry's value of one writer's counter file, in place (its
    // key's length counts the key's padding).
    let file = tmp
        .path()
        .join("store/metric_http_requests_total___22524.bin");
    let mut bytes = std::fs::read(&file).unwrap();
    let key_len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    let value_at = 12 + key_len;
    let value = f64::from_le_bytes(bytes[value_at..value_at + 8].try_into().unwrap());
    bytes[value_at..value_at + 8].copy_from_slice(&(value + 1000.0).to_le_bytes());
    std::fs::write(&file, &bytes).unwrap();
    let zipped = get(addr, "/metrics", &GZIP);
    framed(&zipped);
    let after = get(addr, "/metrics", &[]);
    framed(&after);
    assert_ne!(after.body, before.body, "the rewritten value is served");
    assert_eq!(gunzip(&zipped.body), after.body);
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

/// (A probe found that a histogram `x` and a counter `x_count` in one
/// registry made the sidecar serve two `TYPE` lines for `x`, which
/// `promtool check metrics` refuses.) Such a registry is refused at start,
/// naming both metrics; each metric alone serves valid exposition.
#[test]
fn a_registry_whose_names_clash_is_refused_at_start() {
    use promlab::format::storefile::{file_bytes, file_path};
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    let histogram = r#"{"name": "job_seconds", "type": "histogram", "help": "Job time", "labels": ["queue"], "buckets": ["1"]}"#;
    let counter =
        r#"{"name": "job_seconds_count", "type": "counter", "help": "Jobs", "labels": ["queue"]}"#;
    let registry = |name: &str, metrics: &[&str]| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!(r#"{{"metrics": [{}]}}"#, metrics.join(","))).unwrap();
        path
    };
    let both = registry("both.json", &[histogram, counter]);
    let entries: &[(&[u8], f64)] = &[(b"le=1&queue=default", 1.0), (b"le=sum&queue=default", 0.5)];
    std::fs::write(
        file_path(&store, "job_seconds", 10),
        file_bytes(entries.iter().copied()),
    )
    .unwrap();
    std::fs::write(
        file_path(&store, "job_seconds_count", 10),
        file_bytes([(&b"queue=default"[..], 3.0)]),
    )
    .unwrap();
    let run = |command: &str, registry: &Path| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_promlab"))
            .args([command, "--store"])
            .arg(&store)
            .arg("--registry")
            .arg(registry)
            .args(if command == "serve" {
                &["--listen", "127.0.0.1:0"][..]
            } else {
                &[]
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!("promlab {command} did not refuse the registry within 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    };
    for command in ["serve", "export"] {
        let out = run(command, &both);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command}: {stderr}");
        assert!(
            stderr
                .contains("metrics job_seconds (histogram) and job_seconds_count (counter) clash"),
            "{command}: {stderr}"
        );
    }
    // What serving both would print: each metric's own exposition, one after the other.
    let mut joined = Vec::new();
    for (name, metric) in [("h.json", histogram), ("c.json", counter)] {
        let out = run("export", &registry(name, &[metric]));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        joined.extend_from_slice(&out.stdout);
    }
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&joined).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("second TYPE line for metric name \"job_seconds\""),
        "promtool: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&joined)
    );
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
    let (_prometheus, web) = support::prometheus(&prometheus, &config, Stdio::null());

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

/// (A probe found that a key that decodes to `path=%FF%FE` or
/// names `__name__` was served as is, and a real Prometheus 2.42 refused the
/// whole target, 5 of 132 series ingested; a zero-length key was served as
/// an unlabeled series): such entries are left out and counted, so what the
/// sidecar serves passes `promtool check metrics` and a real Prometheus
/// ingests every good series of the target.
#[test]
fn only_valid_exposition_reaches_prometheus() {
    use promlab::format::storefile::{file_bytes, file_path};
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    std::fs::write(
        dir.path().join("registry.json"),
        r#"{"metrics": [
  {"name": "hostile_requests_total", "type": "counter", "help": "Requests", "labels": ["path", "code"], "aggregation": "sum"},
  {"name": "hostile_seconds", "type": "histogram", "help": "Latency", "labels": ["path"], "aggregation": "sum", "buckets": ["0.1", "1"]}
]}"#,
    )
    .unwrap();
    let mut good: Vec<(Vec<u8>, f64)> = (0..60)
        .map(|i| (format!("code=200&path=%2Fp{i}").into_bytes(), i as f64))
        .collect();
    good.push((b"code=200&path=caf%C3%A9".to_vec(), 1.0));
    let mut hostile = good.clone();
    hostile.extend([
        (b"code=200&path=%FF%FE".to_vec(), 1.0),
        (b"__name__=evil&code=200".to_vec(), 1.0),
        (b"__meta_x=1".to_vec(), 1.0),
        (b"1st=x".to_vec(), 1.0),
    ]);
    let write = |metric: &str, pid: u32, entries: &[(Vec<u8>, f64)]| {
        let bytes = file_bytes(entries.iter().map(|(k, v)| (k.as_slice(), *v)));
        std::fs::write(file_path(&store, metric, pid), bytes).unwrap();
    };
    write("hostile_requests_total", 1, &hostile);
    write("hostile_requests_total", 2, &good);
    // A zero-length key after a good entry: the file is refused whole.
    let mut zero = file_bytes([(&b"code=500&path=%2Fz"[..], 1.0)]);
    zero.extend_from_slice(&[0u8; 20]);
    let used = zero.len() as i32;
    zero[..4].copy_from_slice(&used.to_le_bytes());
    std::fs::write(file_path(&store, "hostile_requests_total", 3), zero).unwrap();
    // A histogram label set with buckets but no sum entry, and a full one.
    write(
        "hostile_seconds",
        1,
        &[
            (b"le=0.1&path=%2Fa".to_vec(), 1.0),
            (b"le=0.1&path=%2Fb".to_vec(), 2.0),
            (b"le=sum&path=%2Fb".to_vec(), 0.1),
            (b"le=1&path=%FF".to_vec(), 1.0),
        ],
    );
    let args = store_args(dir.path());
    let server = serve(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let body = get(server.addr, "/metrics", &[]).body;
    let text = String::from_utf8(body.clone()).expect("UTF-8");
    assert_eq!(
        promlab::reference::exposition::exposition_fault(&body),
        None
    );
    assert!(!text.contains("evil") && !text.contains("__meta") && !text.contains("/z"));
    assert!(text.contains("hostile_requests_total{code=\"200\",path=\"café\"} 2.0\n"));
    assert!(!text.contains("hostile_seconds_sum{path=\"/a\"}"), "{text}");
    assert!(
        text.contains("hostile_seconds_sum{path=\"/b\"} 0.1\n"),
        "{text}"
    );
    // 61 counter series; per histogram label set 3 buckets and _count, one _sum.
    let good_samples = 61 + 2 * 4 + 1;
    assert_eq!(samples(&body), good_samples, "{text}");
    let own = String::from_utf8_lossy(&get(server.addr, "/metrics/promlab", &[]).body).into_owned();
    for counted in [
        "promlab_store_entries_skipped_total{reason=\"invalid_label_value\"} 2",
        "promlab_store_entries_skipped_total{reason=\"reserved_label_name\"} 2",
        "promlab_store_entries_skipped_total{reason=\"invalid_label_name\"} 1",
        "promlab_store_files_skipped_total{reason=\"corrupt\"} 1",
    ] {
        assert!(own.contains(counted), "{counted} in\n{own}");
    }
    if let Some(promtool) = tool("promtool") {
        promtool_accepts(&promtool, &body);
    }

    let Some(prometheus) = tool("prometheus") else {
        return;
    };
    let store_addr = server.addr;
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n\
             - job_name: store\n  metrics_path: /metrics\n  static_configs: [{{targets: ['{store_addr}']}}]\n"
        ),
    )
    .unwrap();
    let (_prometheus, web) = support::prometheus(&prometheus, &config, Stdio::null());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut ingested = 0.0;
    while Instant::now() < deadline {
        if let Some(result) = query(
            web,
            "count(%7Bjob=%22store%22,__name__=~%22hostile.*%22%7D)",
        ) {
            if let Some(n) = result[0]["value"][1].as_str() {
                ingested = n.parse().unwrap();
                if ingested == good_samples as f64 {
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(ingested, good_samples as f64, "series Prometheus ingested");
    let up = by_job(&query(web, "up").expect("query up"));
    assert_eq!(up.get("store"), Some(&1.0), "up: {up:?}");
    let scraped = by_job(&query(web, "scrape_samples_scraped").expect("query"));
    assert_eq!(scraped.get("store"), Some(&(good_samples as f64)));
}
