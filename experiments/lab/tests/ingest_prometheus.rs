//! A real Prometheus (Debian's `prometheus`) scrapes itself and remote-writes
//! into `promlab serve`; the quantiles of its own metrics come back.
//!
//! Without the binary the test is skipped with a notice, and fails under `CI`.

#[path = "../../../tests/common/mod.rs"]
mod common;

use promlab_lab::http_client::Client;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn find_prometheus() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file())
}

fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let response = Client::new(Some(Duration::from_secs(5)), 1)
        .get(&format!("http://{addr}{path}"), &[])
        .ok()?;
    Some((response.status, response.text()))
}

#[test]
fn prometheus_remote_writes_and_quantiles_come_back() {
    let Some(prometheus) = find_prometheus() else {
        common::skip(
            "the `prometheus` binary, so no remote write from a real Prometheus",
            "apt-get install -y prometheus",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.toml");
    std::fs::write(
        &plan,
        r#"
lateness_secs = 0
[[aggregation]]
id = "http"
metric = "prometheus_http_requests_total"
group_by = ["handler"]
window_secs = 2
[[aggregation]]
id = "scrape"
metric = "scrape_duration_seconds"
group_by = ["job"]
match = { team = "lab" }
window_secs = 2
"#,
    )
    .unwrap();
    let mut receiver = Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--strategies",
            "all",
            "--plan",
        ])
        .arg(&plan)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(receiver.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let receiver = Killed(receiver);
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .expect("receiver address")
        .to_string();

    let prom_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            r#"
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: prometheus
    static_configs: [{{targets: ['127.0.0.1:{prom_port}'], labels: {{team: "lab"}}}}]
remote_write:
  - url: http://{addr}/api/v1/write
    queue_config: {{batch_send_deadline: 1s, max_samples_per_send: 500}}
    metadata_config: {{send: true, send_interval: 2s}}
"#
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let prometheus = Killed(
        Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );

    let deadline = Instant::now() + Duration::from_secs(50);
    let mut last = String::new();
    let found = loop {
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(500));
        let (Some((200, http)), Some((200, scrape))) = (
            get(&addr, "/api/v1/quantiles?agg=http"),
            get(&addr, "/api/v1/quantiles?agg=scrape"),
        ) else {
            continue;
        };
        let http: serde_json::Value = serde_json::from_str(&http).unwrap();
        let scrape: serde_json::Value = serde_json::from_str(&scrape).unwrap();
        last = format!("{http} {scrape}");
        let has_groups =
            |v: &serde_json::Value| v["groups"].as_array().is_some_and(|g| !g.is_empty());
        if has_groups(&http) && has_groups(&scrape) {
            break Some((http, scrape));
        }
    };
    let log = std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
    let Some((http, scrape)) = found else {
        panic!(
            "no quantiles within 50 s; last answer: {last}\nprometheus log tail:\n{}",
            &log[log.len().saturating_sub(3000)..]
        );
    };
    let metrics_group = http["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["labels"]["handler"] == "/metrics");
    let metrics_group =
        metrics_group.unwrap_or_else(|| panic!("no /metrics handler group in {http}"));
    assert!(metrics_group["count"].as_u64().unwrap() >= 1);
    assert!(metrics_group["quantiles"]["0.99"].as_f64().unwrap() >= 1.0);
    let scrape_group = &scrape["groups"][0];
    assert_eq!(scrape_group["labels"]["job"], "prometheus");
    let p50 = scrape_group["quantiles"]["0.5"].as_f64().unwrap();
    assert!(p50 > 0.0 && p50 < 1.0, "scrape duration p50 {p50}");
    let (_, metrics) = get(&addr, "/metrics").unwrap();
    assert!(
        metrics.contains("promlab_http_write_responses_total{code=\"204\"}"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("promlab_http_write_responses_total{code=\"400\"} 1"),
        "{metrics}"
    );
    drop(prometheus);
    drop(receiver);
}
