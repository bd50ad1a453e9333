//! `promlab serve --store` as an operator runs it: `/-/healthy` and
//! `/-/ready` (and the receiver's), a registry file that changes under the
//! sidecar (replaced by a rename, rewritten in place, broken, made
//! incompatible, removed), and store files of a metric the registry does not
//! name — counted and logged once, never folded, served once registered,
//! with no scrape going backwards across a reload.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use promlab::format::formenc::Dialect;
use promlab::format::registry::Registry;
use promlab::shared::strategy::StrategySet;
use promlab::write::{Client, ClientConfig};
use std::path::Path;
use std::time::{Duration, Instant};
use support::{get, serve, Served};

const REQUESTS: &str = r#"{"name": "requests_total", "type": "counter", "help": "Requests", "labels": ["path"], "aggregation": "sum"}"#;
const LATENCY: &str = r#"{"name": "latency_seconds", "type": "histogram", "help": "Latency", "labels": ["path"], "aggregation": "sum", "buckets": ["0.01", "0.1", "1"]}"#;

fn registry_json(metrics: &[&str]) -> String {
    format!("{{\"metrics\": [{}]}}", metrics.join(", "))
}

/// Writes both metrics' files for exited processes (their clients dropped).
fn write_store(dir: &Path) {
    let registry =
        Registry::from_json(&registry_json(&[REQUESTS, LATENCY])).expect("test registry");
    for (i, pid) in [101u32, 202, 303, 404].into_iter().enumerate() {
        let config = ClientConfig {
            dialect: Dialect::Uri,
            strategies: StrategySet::NONE,
            pid_override: Some(pid),
        };
        let mut client = Client::new(dir, &registry, config).unwrap();
        let requests = client.metric("requests_total").unwrap();
        client
            .increment(requests, &[("path", "/a")], 1.0 + i as f64)
            .unwrap();
        let latency = client.metric("latency_seconds").unwrap();
        client
            .observe(latency, &[("path", "/a")], 0.05 * (i + 1) as f64)
            .unwrap();
    }
}

/// A sample's value in an exposition (`line` is the sample without its value).
fn value(text: &str, line: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line)?.strip_prefix(' ')?.parse().ok())
}

fn own(served: &Served) -> String {
    get(served.addr, "/metrics/promlab", &[]).text()
}

/// Waits (10 s at most) until `/metrics/promlab` has `line` at `want`.
fn wait_for(served: &Served, line: &str, want: f64) {
    let started = Instant::now();
    loop {
        let text = own(served);
        if value(&text, line) == Some(want) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{line} never became {want}:\n{text}\nlog: {:?}",
            served.stderr_lines()
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn log_lines_with(served: &Served, needle: &str) -> usize {
    served
        .stderr_lines()
        .iter()
        .filter(|l| l.contains(needle))
        .count()
}

/// Atomically replaces `path` (write, then rename), as the app's writer does.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn health_and_readiness_on_the_sidecar_and_the_receiver() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    std::fs::create_dir(&store).unwrap();
    let registry = tmp.path().join("registry.json");
    std::fs::write(&registry, registry_json(&[REQUESTS])).unwrap();
    let sidecar = serve(&[
        "--store",
        store.to_str().unwrap(),
        "--registry",
        registry.to_str().unwrap(),
    ]);
    for (path, body) in [
        ("/-/healthy", "promlab is Healthy.\n"),
        ("/-/ready", "promlab is Ready.\n"),
    ] {
        let response = get(sidecar.addr, path, &[]);
        assert_eq!((response.status, response.text().as_str()), (200, body));
    }
    // The store gone: still healthy, not ready (and ready again once it is back).
    std::fs::rename(&store, tmp.path().join("moved")).unwrap();
    let response = get(sidecar.addr, "/-/ready", &[]);
    assert_eq!(response.status, 503, "{}", response.text());
    assert!(response.text().starts_with("promlab is not ready: "));
    assert_eq!(get(sidecar.addr, "/-/healthy", &[]).status, 200);
    std::fs::rename(tmp.path().join("moved"), &store).unwrap();
    assert_eq!(get(sidecar.addr, "/-/ready", &[]).status, 200);

    let receiver = serve(&[]);
    for path in ["/-/healthy", "/-/ready"] {
        assert_eq!(get(receiver.addr, path, &[]).status, 200, "{path}");
    }
}

/// A store with a metric the registry does not name: counted and logged
/// once, its files never folded; then the registry changes under the
/// sidecar every way it can, the counter it serves never going down.
#[test]
fn the_sidecar_follows_its_registry_and_counts_what_it_does_not_name() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    std::fs::create_dir(&store).unwrap();
    write_store(&store);
    let registry = tmp.path().join("registry.json");
    std::fs::write(&registry, registry_json(&[REQUESTS])).unwrap();
    let sidecar = serve(&[
        "--store",
        store.to_str().unwrap(),
        "--registry",
        registry.to_str().unwrap(),
        "--registry-check-ms",
        "50",
        "--fold-exited",
        "--fold-every",
        "1",
        "--strategies",
        "all",
    ]);
    let requests = "requests_total{path=\"/a\"}";
    let latency_count = "latency_seconds_count{path=\"/a\"}";
    // Scrapes all along; the counter must never go down or vanish.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = {
        let (stop, addr) = (stop.clone(), sidecar.addr);
        std::thread::spawn(move || {
            let mut scrapes = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let text = get(addr, "/metrics", &[("Accept-Encoding", "identity")]).text();
                assert_eq!(value(&text, requests), Some(10.0), "{text}");
                scrapes += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            scrapes
        })
    };

    // Counted and logged once; its four files left as they are by the folds.
    wait_for(&sidecar, "promlab_store_unregistered_files", 4.0);
    wait_for(&sidecar, "promlab_store_unregistered_metrics", 1.0);
    wait_for(&sidecar, "promlab_fold_files_folded_total", 4.0);
    std::thread::sleep(Duration::from_millis(1200)); // more folds and scans
    let files = |metric: &str| {
        std::fs::read_dir(&store)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy()
                    .starts_with(&format!("metric_{metric}___"))
            })
            .count()
    };
    assert_eq!(
        files("latency_seconds"),
        4,
        "an unregistered metric was folded"
    );
    assert_eq!(
        files("requests_total"),
        1,
        "the registered one was not folded"
    );
    let named = "files of metric latency_seconds that registry";
    assert_eq!(log_lines_with(&sidecar, named), 1);
    let metrics = get(sidecar.addr, "/metrics", &[]).text();
    assert_eq!(value(&metrics, latency_count), None);

    // Rewritten in place, broken: refused, the old one kept.
    std::fs::write(&registry, "{\"metrics\": [").unwrap();
    wait_for(
        &sidecar,
        "promlab_registry_reloads_total{result=\"invalid\"}",
        1.0,
    );
    wait_for(&sidecar, "promlab_registry_last_reload_successful", 0.0);
    // Incompatible: the counter made a gauge.
    replace(
        &registry,
        &registry_json(&[&REQUESTS.replace("counter", "gauge")]),
    );
    wait_for(
        &sidecar,
        "promlab_registry_reloads_total{result=\"incompatible\"}",
        1.0,
    );
    // Gone: unreadable.
    std::fs::remove_file(&registry).unwrap();
    wait_for(
        &sidecar,
        "promlab_registry_reloads_total{result=\"unreadable\"}",
        1.0,
    );
    assert_eq!(
        log_lines_with(&sidecar, "not taken, still serving the one before"),
        3
    );

    // Replaced by a rename, naming the other metric: served, then folded.
    replace(&registry, &registry_json(&[REQUESTS, LATENCY]));
    wait_for(
        &sidecar,
        "promlab_registry_reloads_total{result=\"ok\"}",
        1.0,
    );
    wait_for(&sidecar, "promlab_registry_metrics", 2.0);
    wait_for(&sidecar, "promlab_registry_last_reload_successful", 1.0);
    wait_for(&sidecar, "promlab_store_unregistered_files", 0.0);
    let metrics = get(sidecar.addr, "/metrics", &[]).text();
    assert_eq!(value(&metrics, latency_count), Some(4.0), "{metrics}");
    wait_for(&sidecar, "promlab_fold_files_folded_total", 8.0);
    assert_eq!(files("latency_seconds"), 1);
    let metrics = get(sidecar.addr, "/metrics", &[]).text();
    assert_eq!(value(&metrics, latency_count), Some(4.0), "{metrics}");

    // Rewritten in place, dropping it again: no longer served, counted again
    // (its one fold file), and logged again.
    std::fs::write(&registry, registry_json(&[REQUESTS])).unwrap();
    wait_for(
        &sidecar,
        "promlab_registry_reloads_total{result=\"ok\"}",
        2.0,
    );
    wait_for(&sidecar, "promlab_store_unregistered_files", 1.0);
    let metrics = get(sidecar.addr, "/metrics", &[]).text();
    assert_eq!(value(&metrics, latency_count), None);
    let started = Instant::now();
    while log_lines_with(&sidecar, named) < 2 {
        assert!(started.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(25));
    }

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let scrapes = scraper.join().expect("a scrape went backwards or failed");
    assert!(scrapes > 10, "only {scrapes} scrapes");
    assert_eq!(log_lines_with(&sidecar, "registry"), 3 + 2 + 2);
}
