//! End to end as a Ruby shop runs the sidecar: Debian's Puma in cluster mode
//! (4 workers, preloaded) serves a Rack app instrumented with client_ruby
//! 5.x; `puma_worker_killer` recycles a worker every second; promlab's Puma
//! plugin starts the real binary with `--fold-exited` from the master, and
//! the app writes its registry with promlab's Ruby library; a real Prometheus
//! scrapes the sidecar every second while a load generator sends a known
//! number of requests (one Puma closed unanswered as a worker stopped, which
//! the app never saw, is sent again); halfway, a phased restart (a hot
//! restart under `preload_app!`). Prometheus saw `up == 1` throughout and no
//! counter or histogram reset; the final values are the requests answered,
//! exactly; client_ruby's own Rack exporter prints the same bytes from the
//! same directory; folds keep the store at O(live workers) files; the
//! restarted master supervises the same sidecar; stopping Puma stops it.
//!
//! About 40 s. Without Ruby, Puma, puma_worker_killer, Prometheus or
//! client_ruby's sources it is skipped with a notice, and fails under `CI`.

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "support/ruby.rs"]
mod ruby;
mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WORKERS: usize = 4;
const LOAD_SECS: u64 = 15;
const CLIENTS: usize = 3;
/// The app's metrics (tests/support/puma_app/config.ru).
const METRICS: usize = 7;
/// Counters and histogram series: Prometheus must see no reset in any.
const MONOTONIC: [&str; 5] = [
    "app_requests_total",
    "app_request_seconds_bucket",
    "app_request_seconds_count",
    "app_request_seconds_sum",
    "app_requests_seen",
];

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Puma, puma_worker_killer and Prometheus, or `None` with the skip said.
fn tools() -> Option<(PathBuf, PathBuf)> {
    let Some(puma) = on_path("puma") else {
        common::skip(
            "Puma, so no end-to-end run under Puma",
            "apt-get install puma",
        );
        return None;
    };
    let killer = Command::new("ruby")
        .args(["-e", "require 'puma_worker_killer'"])
        .status();
    if !killer.is_ok_and(|s| s.success()) {
        common::skip(
            "puma_worker_killer, so no recycled workers",
            "apt-get install ruby-puma-worker-killer",
        );
        return None;
    }
    let Some(prometheus) = on_path("prometheus") else {
        common::skip(
            "the `prometheus` binary, so no real scraper",
            "apt-get install prometheus",
        );
        return None;
    };
    Some((puma, prometheus))
}

/// Why a request has no answer. `unsent` is true when the app cannot have
/// seen it: the connection failed, or the server closed it before answering
/// a byte (Puma closes connections whose request has not fully arrived when a
/// worker shuts down), so sending it again keeps the count exact.
struct Failure {
    unsent: bool,
    why: String,
}

/// One request on a connection of its own, sent in one write: the status and
/// body, or why there is none.
fn request(addr: SocketAddr, path: &str) -> Result<(u16, Vec<u8>), Failure> {
    let unsent = |e: std::io::Error| Failure {
        unsent: true,
        why: e.to_string(),
    };
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(unsent)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).map_err(unsent)?;
    let mut response = Vec::new();
    if let Err(e) = stream.read_to_end(&mut response) {
        return Err(Failure {
            unsent: response.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset,
            why: e.to_string(),
        });
    }
    let text = String::from_utf8_lossy(&response);
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok());
    let Some(status) = status else {
        return Err(Failure {
            unsent: response.is_empty(),
            why: format!("no status in {:?}", &text[..text.len().min(200)]),
        });
    };
    let body = match response.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) => response[at + 4..].to_vec(),
        None => Vec::new(),
    };
    Ok((status, body))
}

/// `/metrics` of a server, 200 and its body, or `None`.
fn metrics(addr: SocketAddr) -> Option<Vec<u8>> {
    match support::try_get(addr, "/metrics", &[]) {
        Ok(r) if r.status == 200 => Some(r.body),
        _ => None,
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query's vector: (labels, value) per series.
fn query(prometheus: SocketAddr, promql: &str) -> Vec<(serde_json::Value, f64)> {
    let path = format!("/api/v1/query?query={}", percent_encode(promql));
    let response = support::get(prometheus, &path, &[]);
    assert_eq!(response.status, 200, "{promql}: {}", response.text());
    let v: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    v["data"]["result"]
        .as_array()
        .unwrap_or_else(|| panic!("{promql}: {v}"))
        .iter()
        .map(|s| {
            let value = s["value"][1].as_str().unwrap().parse().unwrap();
            (s["metric"].clone(), value)
        })
        .collect()
}

fn sum_of(exposition: &[u8], name: &str) -> f64 {
    promlab::scenarios::scrape_to_remote_write::parse(exposition)
        .unwrap()
        .into_iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum()
}

fn store_files(store: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(store)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("metric_") && n.ends_with(".bin"))
        .collect();
    names.sort();
    names
}

/// Puma and, should it outlive Puma (a failed test), the sidecar it started:
/// stopped when dropped, so no test leaves one behind.
struct Puma {
    child: std::process::Child,
    store: PathBuf,
}

impl Drop for Puma {
    fn drop(&mut self) {
        // SAFETY: signals to our own child and to the sidecar it started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let pid = std::fs::read_to_string(self.store.join(".promlab-serve.pid"));
        if let Some(pid) = pid.ok().and_then(|p| p.trim().parse::<i32>().ok()) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline.windows(5).any(|w| w == b"serve") {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn puma_recycling_workers_scraped_by_prometheus_stays_exact() {
    let Some(shared) = ruby::ruby_and_client_ruby() else {
        return;
    };
    let Some((puma, prometheus)) = tools() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let lib = ruby::client_ruby_lib(&shared, "5.x-uri", tmp.path());
    let store = tmp.path().join("store");
    let (app_port, sidecar_port) = (support::free_port(), support::free_port());
    let app: SocketAddr = format!("127.0.0.1:{app_port}").parse().unwrap();
    let sidecar: SocketAddr = format!("127.0.0.1:{sidecar_port}").parse().unwrap();

    let puma_log = tmp.path().join("puma.log");
    let rubylib = format!("{}:{}", lib.display(), ruby::promlab_ruby_lib().display());
    let mut server = Puma {
        child: Command::new(&puma)
            .arg("-C")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/puma_app/puma.rb"))
            .env("RUBYLIB", rubylib)
            .env("PUMA_PORT", app_port.to_string())
            .env("PUMA_WORKERS", WORKERS.to_string())
            .env("PUMA_RECYCLE_SECS", "1")
            .env("PROMLAB_STORE", &store)
            .env("PROMLAB_LISTEN", sidecar.to_string())
            .env("PROMLAB_BIN", env!("CARGO_BIN_EXE_promlab"))
            .env("PROMLAB_FOLD_EVERY", "1")
            .stdout(std::fs::File::create(&puma_log).unwrap())
            .stderr(std::fs::File::create(tmp.path().join("puma.err")).unwrap())
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
        store: store.clone(),
    };
    let log = || {
        format!(
            "{}\n{}",
            std::fs::read_to_string(&puma_log).unwrap_or_default(),
            std::fs::read_to_string(tmp.path().join("puma.err")).unwrap_or_default()
        )
    };
    let first = std::panic::catch_unwind(|| {
        wait_for("the sidecar's /metrics", Duration::from_secs(60), || {
            metrics(sidecar)
        })
    });
    let Ok(_) = first else {
        panic!("the sidecar never answered; Puma's log:\n{}", log());
    };
    wait_for("Puma", Duration::from_secs(30), || {
        request(app, "/warm?n=0").ok().filter(|(s, _)| *s == 200)
    });
    let warmed = 1.0;

    let config = tmp.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: sidecar\n    static_configs: [{{targets: ['{sidecar}']}}]\n"
        ),
    )
    .unwrap();
    let log_file = std::fs::File::create(tmp.path().join("prometheus.log")).unwrap();
    let (_prometheus, prom) = support::prometheus(&prometheus, &config, log_file.into());
    wait_for("Prometheus's first scrape", Duration::from_secs(40), || {
        support::try_get(prom, "/-/ready", &[])
            .ok()
            .filter(|r| r.status == 200)?;
        (query(prom, "up{job=\"sidecar\"}").first()?.1 == 1.0).then_some(())
    });

    // The load: CLIENTS threads, a connection per request, for LOAD_SECS.
    let started = Instant::now();
    // A request the app cannot have seen (see `Failure`) is sent again, at
    // most RESENDS times in a row; any other failure fails.
    const RESENDS: usize = 5;
    let answered = Arc::new(AtomicU64::new(0));
    let resent = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (answered, resent, failed) = (answered.clone(), resent.clone(), failed.clone());
            std::thread::spawn(move || {
                let mut n = 1 + c as u64 * 1_000_000;
                while started.elapsed() < Duration::from_secs(LOAD_SECS) {
                    let path = ["/a", "/b/c", "/d"][(n % 3) as usize];
                    let mut tries = 0;
                    let outcome = loop {
                        match request(app, &format!("{path}?n={n}")) {
                            Err(f) if f.unsent && tries < RESENDS => {
                                tries += 1;
                                resent.fetch_add(1, Ordering::Relaxed);
                            }
                            outcome => break outcome,
                        }
                    };
                    match outcome {
                        Ok((200, _)) => {
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok((status, _)) => failed
                            .lock()
                            .unwrap()
                            .push(format!("{path}: status {status}")),
                        Err(f) => failed.lock().unwrap().push(format!("{path}: {}", f.why)),
                    }
                    n += 1;
                }
            })
        })
        .collect();
    // Halfway, SIGUSR1: a phased restart, which Puma does as a hot restart
    // under preload_app! (the master re-executes itself; the sidecar keeps
    // serving and the new master supervises it).
    std::thread::sleep(Duration::from_secs(LOAD_SECS / 2));
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGUSR1) };
    for c in clients {
        c.join().unwrap();
    }
    assert!(
        log().contains("supervising the sidecar an earlier master left running"),
        "the restarted master did not take the sidecar over:\n{}",
        log()
    );
    let failed = failed.lock().unwrap().clone();
    assert!(failed.is_empty(), "requests failed: {failed:?}");
    let sent = answered.load(Ordering::Relaxed) as f64 + warmed;
    let recycled = log().matches("Sending TERM").count();
    let resent = resent.load(Ordering::Relaxed);
    eprintln!(
        "{sent} requests answered in {LOAD_SECS} s ({resent} sent again, unanswered); \
         {recycled} workers recycled"
    );
    assert!(
        recycled >= 2 * WORKERS,
        "puma_worker_killer recycled only {recycled} workers:\n{}",
        log()
    );

    // Exact, in the sidecar and in Prometheus's last scrape.
    let scraped = metrics(sidecar).expect("the sidecar's /metrics");
    for name in [
        "app_requests_total",
        "app_request_seconds_count",
        "app_requests_seen",
    ] {
        assert_eq!(sum_of(&scraped, name), sent, "{name}");
    }
    wait_for(
        "Prometheus's scrape of the final values",
        Duration::from_secs(10),
        || {
            let seen = query(prom, "sum(app_requests_total)").first()?.1;
            (seen == sent).then_some(())
        },
    );
    let window = format!("{}s", started.elapsed().as_secs() + 20);
    let up = query(
        prom,
        &format!("min_over_time(up{{job=\"sidecar\"}}[{window}])"),
    );
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(up[0].1, 1.0, "the sidecar was down in a scrape");
    let scrapes = query(
        prom,
        &format!("count_over_time(up{{job=\"sidecar\"}}[{window}])"),
    );
    assert!(
        scrapes[0].1 >= LOAD_SECS as f64 * 0.7,
        "only {} scrapes",
        scrapes[0].1
    );
    let mut covered = 0;
    for name in MONOTONIC {
        let resets = query(prom, &format!("resets({name}[{window}])"));
        covered += resets.len();
        let reset: Vec<_> = resets.iter().filter(|(_, v)| *v != 0.0).collect();
        assert!(
            reset.is_empty(),
            "counter resets seen by Prometheus: {reset:?}"
        );
    }
    assert!(covered >= 20, "resets() covered only {covered} series");

    // client_ruby's own Rack exporter on the same directory: the same bytes
    // (a scrape of each, the sidecar's twice, so no fold or recycled worker
    // came between them).
    let compared = wait_for(
        "the same bytes from Ruby and the sidecar",
        Duration::from_secs(30),
        || {
            let before = metrics(sidecar)?;
            let (status, ruby) = request(app, "/metrics").ok()?;
            let after = metrics(sidecar)?;
            (status == 200 && before == ruby && ruby == after).then_some(ruby)
        },
    );
    assert_eq!(sum_of(&compared, "app_requests_total"), sent);

    // Folds keep the store at O(live workers): at most a file per metric per
    // live process (the workers and the master) and one fold file per metric.
    let bound = METRICS * (WORKERS + 2);
    let files = wait_for("the folds", Duration::from_secs(20), || {
        let files = store_files(&store);
        (files.len() <= bound).then_some(files)
    });
    assert!(recycled * 2 > bound / METRICS, "{files:?}");

    // Stopping Puma stops its sidecar.
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    wait_for("Puma to stop", Duration::from_secs(30), || {
        server.child.try_wait().unwrap()
    });
    wait_for(
        "the sidecar to stop with Puma",
        Duration::from_secs(20),
        || {
            TcpStream::connect_timeout(&sidecar, Duration::from_secs(1))
                .is_err()
                .then_some(())
        },
    );
}
