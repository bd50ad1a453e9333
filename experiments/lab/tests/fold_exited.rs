//! The fold of exited processes' files (`fold-exited`) against the real
//! binary and real client_ruby: a SIGKILL at every step of a batch loses no
//! value and counts none twice; client_ruby's own exporter reads a folded
//! store to the same bytes, and a restarted Ruby app keeps writing into it;
//! a file a writer opens (a new process given a dead one's pid) is never
//! folded away from it; a sidecar folding every second under a pre-fork
//! server's churn serves scrapes that never go backwards.

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "support/ruby.rs"]
mod ruby;
mod support;

use ruby::{client_ruby_lib, export_rb, ruby_and_client_ruby};

use promlab::export::fold::{FoldConfig, FoldStep};
use promlab::format::formenc::Dialect;
use promlab::format::registry::Registry;
use promlab::shared::strategy::{Stage, StrategySet};
use promlab::write::{Client, ClientConfig};
use std::path::Path;
use std::process::Command;

const REGISTRY: &str = r#"{"metrics": [
    {"name": "requests_total", "type": "counter", "help": "Requests", "labels": ["path"], "aggregation": "sum"},
    {"name": "latency_seconds", "type": "histogram", "help": "Latency", "labels": ["path"], "aggregation": "sum", "buckets": ["0.01", "0.1", "1"]},
    {"name": "size_bytes", "type": "summary", "help": "Sizes", "labels": ["path"], "aggregation": "sum"},
    {"name": "workers_busy", "type": "gauge", "help": "Busy", "labels": ["pool"], "aggregation": "all"},
    {"name": "memory_peak_bytes", "type": "gauge", "help": "Peak", "labels": ["pool"], "aggregation": "max"},
    {"name": "free_slots", "type": "gauge", "help": "Low water", "labels": ["pool"], "aggregation": "min"},
    {"name": "last_deploy", "type": "gauge", "help": "Deploy", "labels": ["pool"], "aggregation": "most_recent"},
    {"name": "queue_depth", "type": "gauge", "help": "Queued", "labels": ["pool"], "aggregation": "sum"}
]}"#;

fn registry() -> Registry {
    Registry::from_json(REGISTRY).unwrap()
}

fn promlab() -> Command {
    Command::new(env!("CARGO_BIN_EXE_promlab"))
}

/// Every export combination's exposition of `dir` (they must agree).
fn export(dir: &Path) -> Vec<u8> {
    let registry = registry();
    let mut outs = StrategySet::combinations(Stage::Export)
        .into_iter()
        .map(|s| (s, promlab::export::export(dir, &registry, s).unwrap()));
    let (_, first) = outs.next().unwrap();
    for (s, out) in outs {
        assert!(
            out == first,
            "{s}: {}",
            promlab::reference::first_difference::first_difference(
                &out,
                &first,
                s.to_string().as_str(),
                "baseline"
            )
        );
    }
    first
}

/// Long-lived exporters of `dir`, one per export combination, as sidecars
/// keep them (a watched file set, the fold lock's descriptor kept).
fn exporters(dir: &Path) -> Vec<promlab::export::Exporter> {
    StrategySet::combinations(Stage::Export)
        .into_iter()
        .map(|s| promlab::export::Exporter::new(dir, registry(), s))
        .collect()
}

/// A scrape by each long-lived exporter; all must print `want`.
fn scrape_all(exporters: &mut [promlab::export::Exporter], want: &[u8], when: &str) {
    let mut out = Vec::new();
    for exporter in exporters {
        exporter.export_into(&mut out).unwrap();
        assert!(
            out == want,
            "{when}: {}",
            promlab::reference::first_difference::first_difference(
                &out,
                want,
                "long-lived",
                "expected"
            )
        );
    }
}

/// Processes that wrote and exited (pids spread over name order), and one
/// live writer, its client returned (its files stay open for writing).
fn write_store(dir: &Path) -> Client {
    let registry = registry();
    let write = |client: &mut Client, i: u32| {
        let path = [("path", "/a")];
        let pool = [("pool", "web")];
        let v = 0.001 * (i + 1) as f64;
        // (metric, labels, value)
        type Step<'a> = (&'a str, &'a [(&'a str, &'a str)], f64);
        let steps: [Step; 8] = [
            ("requests_total", &path, 1.0 + i as f64),
            ("latency_seconds", &path, v),
            ("size_bytes", &path, 100.5 * i as f64),
            ("workers_busy", &pool, i as f64),
            ("memory_peak_bytes", &pool, (i * 7 % 5) as f64),
            ("free_slots", &pool, -(i as f64)),
            ("last_deploy", &pool, i as f64),
            ("queue_depth", &pool, 0.1 * i as f64),
        ];
        for (name, labels, value) in steps {
            let id = client.metric(name).unwrap();
            match name {
                "requests_total" | "queue_depth" => client.increment(id, labels, value),
                "latency_seconds" | "size_bytes" => client.observe(id, labels, value),
                _ => client.set(id, labels, value),
            }
            .unwrap();
        }
    };
    for (i, pid) in [310, 3100, 312, 40_000, 4, 7777].into_iter().enumerate() {
        let dialect = if i % 2 == 0 {
            Dialect::Uri
        } else {
            Dialect::Cgi
        };
        let mut client = Client::new(dir, &registry, config(pid, dialect)).unwrap();
        write(&mut client, i as u32);
    }
    let mut live = Client::new(dir, &registry, config(5000, Dialect::Uri)).unwrap();
    write(&mut live, 9);
    live
}

fn config(pid: u32, dialect: Dialect) -> ClientConfig {
    ClientConfig {
        dialect,
        strategies: StrategySet::NONE,
        pid_override: Some(pid),
    }
}

fn store_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `promlab fold` killed (SIGKILL) at each step of its first batch: the
/// store as left exports the same bytes (promlab's exporters honour the
/// fold's journal and lock), the next fold finishes or undoes the batch,
/// and then the store exports the same bytes again, with every exited file
/// folded. The live writer writes between the crash and the recovery. So do
/// exporters kept from before the crash, which follow the store's changes
/// and read `.fold/` only after one.
#[test]
fn a_crash_at_every_step_loses_nothing_and_counts_nothing_twice() {
    for step in FoldStep::ALL {
        let tmp = tempfile::tempdir().unwrap();
        let (folded, twin) = (tmp.path().join("folded"), tmp.path().join("twin"));
        let mut live = write_store(&folded);
        let mut twin_live = write_store(&twin);
        let before = export(&twin);
        assert_eq!(export(&folded), before);
        // Made before the store is first folded: `.fold/` appears under them.
        let mut kept = exporters(&folded);
        scrape_all(&mut kept, &before, "before the fold");
        let registry_file = tmp.path().join("registry.json");
        std::fs::write(&registry_file, REGISTRY).unwrap();
        let fold = |kill: Option<FoldStep>| {
            let mut cmd = promlab();
            cmd.arg("fold")
                .arg("--store")
                .arg(&folded)
                .arg("--registry")
                .arg(&registry_file);
            cmd.args(["--grace-ms", "0"]);
            if let Some(step) = kill {
                cmd.args(["--kill-at", step.name()]);
            }
            cmd.output().unwrap()
        };
        let crashed = fold(Some(step));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            crashed.status.signal(),
            Some(libc::SIGKILL),
            "{step:?}: {crashed:?}"
        );
        assert!(export(&folded) == before, "{step:?}: after the crash");
        scrape_all(&mut kept, &before, &format!("{step:?}: after the crash"));
        // The live writer goes on, in both stores.
        for client in [&mut live, &mut twin_live] {
            let id = client.metric("requests_total").unwrap();
            client.increment(id, &[("path", "/a")], 5.0).unwrap();
        }
        let after_writes = export(&twin);
        assert!(
            export(&folded) == after_writes,
            "{step:?}: the live writer's increment"
        );
        scrape_all(
            &mut kept,
            &after_writes,
            &format!("{step:?}: the increment"),
        );
        let recovered = fold(None);
        assert!(recovered.status.success(), "{step:?}: {recovered:?}");
        assert!(export(&folded) == after_writes, "{step:?}: after recovery");
        scrape_all(
            &mut kept,
            &after_writes,
            &format!("{step:?}: after recovery"),
        );
        // Per metric, the exited `310`, `3100`, `312`, `4`, `40000` sort
        // before the live `5000` and fold into one file; `7777`, alone after
        // it, stays: three files a metric.
        let files = store_files(&folded);
        let live_files = files.iter().filter(|n| n.ends_with("___5000.bin")).count();
        assert_eq!(live_files, 8, "{step:?}: {files:?}");
        assert_eq!(files.len(), 8 * 3, "{step:?}: {files:?}");
        let leftovers: Vec<_> = std::fs::read_dir(folded.join(promlab::export::fold::FOLD_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            leftovers
                .iter()
                .all(|n| n == "lock" || n == "run.lock" || n == "trash"),
            "{step:?}: {leftovers:?}"
        );
        // A second fold crashes under exporters that already follow the
        // store as folded: they must read the new journals, not keep the set
        // of sources to leave out they read before. Its round has two
        // batches, one each side of the live `5000`: the fold file and
        // `320`, and `7777` and `8000`.
        for dir in [&folded, &twin] {
            for pid in [320, 8000] {
                let mut exited = Client::new(dir, &registry(), config(pid, Dialect::Uri)).unwrap();
                let id = exited.metric("requests_total").unwrap();
                exited.increment(id, &[("path", "/a")], 3.0).unwrap();
            }
        }
        let again = export(&twin);
        scrape_all(&mut kept, &again, &format!("{step:?}: a new exited writer"));
        let crashed = fold(Some(step));
        assert_eq!(crashed.status.signal(), Some(libc::SIGKILL), "{step:?}");
        scrape_all(&mut kept, &again, &format!("{step:?}: second crash"));
        assert!(export(&folded) == again, "{step:?}: second crash");
        assert!(fold(None).status.success(), "{step:?}");
        scrape_all(&mut kept, &again, &format!("{step:?}: second recovery"));
        let files = store_files(&folded);
        let requests: Vec<_> = files
            .iter()
            .filter(|n| n.starts_with("metric_requests_total___"))
            .collect();
        assert_eq!(
            requests.len(),
            3,
            "{step:?}: two fold files and the live one: {files:?}"
        );
    }
}

/// A new process given a dead one's pid opens its file for writing while a
/// fold has moved it out (it looked the name up just before): the fold sees
/// its lease broken within the grace period and rolls the batch back, so the
/// writer's file is in place, and nothing was lost or counted twice.
#[test]
fn a_writer_opening_a_folded_file_gets_it_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let live = write_store(&dir);
    let before = export(&dir);
    // The exited process 310's counter file, looked up now (an O_PATH
    // descriptor: no open of the file itself yet).
    let name = "metric_requests_total___310.bin";
    let path = dir.join(name);
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a plain open of a NUL-terminated path.
    let looked_up = unsafe { libc::open(c_path.as_ptr(), libc::O_PATH) };
    assert!(looked_up >= 0);
    let config = FoldConfig {
        grace: std::time::Duration::from_secs(1),
        ..FoldConfig::default()
    };
    let fold = {
        let dir = dir.clone();
        std::thread::spawn(move || {
            promlab::export::fold::fold_store(&dir, &registry(), &config).unwrap()
        })
    };
    // Once the fold has moved it out, the "new process" opens it for writing
    // through the name it looked up (blocked until the fold lets go).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the fold never moved {name}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let reopened = format!("/proc/self/fd/{looked_up}");
    let writer = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&reopened)
        .unwrap();
    let report = fold.join().unwrap();
    assert!(report.batches_abandoned >= 1, "{report:?}");
    assert!(path.exists(), "{name} is back in place");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&path).unwrap().ino(),
        writer.metadata().unwrap().ino()
    );
    assert!(export(&dir) == before);
    drop(writer);
    // SAFETY: closes our own descriptor.
    unsafe { libc::close(looked_up) };
    drop(live);
}

/// A dead process's file that a new process (same pid) holds open for
/// writing is live: never folded, never changed.
#[test]
fn a_file_with_a_writer_is_never_folded() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let live = write_store(&dir);
    // pid 310 is reused: its files are opened for writing again.
    let reused = Client::new(&dir, &registry(), config(310, Dialect::Uri)).unwrap();
    let mut reused = reused;
    let id = reused.metric("requests_total").unwrap();
    reused.increment(id, &[("path", "/a")], 1.0).unwrap();
    let files_before: Vec<(String, Vec<u8>)> = store_files(&dir)
        .into_iter()
        .filter(|n| n == "metric_requests_total___310.bin" || n.ends_with("___5000.bin"))
        .map(|n| (n.clone(), std::fs::read(dir.join(&n)).unwrap()))
        .collect();
    let before = export(&dir);
    let report =
        promlab::export::fold::fold_store(&dir, &registry(), &FoldConfig::default()).unwrap();
    assert!(report.files_folded > 0, "{report:?}");
    assert_eq!(report.live_files, 9, "{report:?}");
    for (name, bytes) in &files_before {
        assert_eq!(
            &std::fs::read(dir.join(name)).unwrap(),
            bytes,
            "{name} changed"
        );
    }
    assert!(export(&dir) == before);
    drop((live, reused));
}

/// client_ruby with every revision available: `fold_app.rb` forks workers
/// that write and exit while one stays; the store is folded; client_ruby's
/// own exporter prints the same bytes as before and as promlab; the live
/// worker and a restarted app (new pids) keep writing, and every increment
/// is counted once.
#[test]
fn client_ruby_reads_a_folded_store_and_keeps_writing_into_it() {
    let Some(shared) = ruby_and_client_ruby() else {
        return;
    };
    for revision in ["v4.2.5", "5.x-uri"] {
        let tmp = tempfile::tempdir().unwrap();
        let lib = client_ruby_lib(&shared, revision, tmp.path());
        let store = tmp.path().join("store");
        std::fs::create_dir(&store).unwrap();
        let registry_file = tmp.path().join("registry.json");
        std::fs::write(&registry_file, REGISTRY).unwrap();
        let ruby_export = || {
            let out = Command::new("ruby")
                .arg("-I")
                .arg(&lib)
                .arg(export_rb())
                .arg(&registry_file)
                .arg(&store)
                .output()
                .unwrap();
            assert!(out.status.success(), "{revision}: {out:?}");
            out.stdout
        };
        // Round 1: 12 workers exit, one stays.
        let mut app = start_app(&lib, &store, 12, 1);
        let before = ruby_export();
        assert!(
            export(&store) == before,
            "{revision}: promlab and Ruby before the fold"
        );
        let out = promlab()
            .arg("fold")
            .arg("--store")
            .arg(&store)
            .arg("--registry")
            .arg(&registry_file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{revision}: {out:?}");
        let files = store_files(&store);
        assert!(files.len() < 8 * 13 / 2, "{revision}: {files:?}");
        assert!(ruby_export() == before, "{revision}: Ruby after the fold");
        assert!(
            export(&store) == before,
            "{revision}: promlab after the fold"
        );
        // The live worker writes again and exits; then the app restarts.
        finish_app(&mut app);
        let mut restarted = start_app(&lib, &store, 5, 2);
        finish_app(&mut restarted);
        let after = ruby_export();
        assert!(
            export(&store) == after,
            "{revision}: promlab and Ruby after the restart"
        );
        // Every increment once: 13 + 1 in round 1, 5 + 2 in round 2.
        let text = String::from_utf8(after).unwrap();
        assert!(
            text.contains("requests_total{path=\"/a\"} 21.0\n"),
            "{revision}: {text}"
        );
        // `all` keeps each process's series: 13 + 6 pids.
        assert_eq!(
            text.matches("workers_busy{").count(),
            19,
            "{revision}: {text}"
        );
    }
}

/// client_ruby's PoC branch (one file per process, `metrics___<pid>.bin`)
/// reads the stores it wrote, folded by `promlab fold`: its own exporter
/// prints its `expected.prom` before and after the fold, and so does
/// promlab under every export combination.
#[test]
fn the_poc_branch_reads_its_own_stores_folded_by_promlab() {
    let Some(shared) = ruby_and_client_ruby() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let lib = client_ruby_lib(&shared, "poc-file-per-process", tmp.path());
    let (_cases_tmp, cases) = common::per_process_cases();
    for case in cases {
        let (store, registry_file) = (case.join("store"), case.join("registry.json"));
        let registry = promlab::format::registry::Registry::load(&registry_file).unwrap();
        let expected = std::fs::read(case.join("expected.prom")).unwrap();
        let ruby_export = || {
            let out = Command::new("ruby")
                .arg("-I")
                .arg(&lib)
                .arg(export_rb())
                .arg(&registry_file)
                .arg(&store)
                .output()
                .unwrap();
            assert!(out.status.success(), "{}: {out:?}", case.display());
            out.stdout
        };
        assert!(ruby_export() == expected, "{}: before", case.display());
        let before = store_files(&store).len();
        let out = promlab()
            .arg("fold")
            .arg("--store")
            .arg(&store)
            .arg("--registry")
            .arg(&registry_file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let after = store_files(&store);
        assert!(after.len() < before, "{after:?}");
        assert!(
            after
                .iter()
                .any(|n| n.starts_with("metrics___") && n.len() >= 22),
            "{after:?}"
        );
        assert!(
            ruby_export() == expected,
            "{}: Ruby after the fold",
            case.display()
        );
        for strategies in StrategySet::combinations(Stage::Export) {
            let out = promlab::export::export(&store, &registry, strategies).unwrap();
            assert!(out == expected, "{}: {strategies}", case.display());
        }
    }
}

struct App {
    child: std::process::Child,
}

fn start_app(lib: &Path, store: &Path, workers: u32, round: u32) -> App {
    use std::io::BufRead;
    let mut child = Command::new("ruby")
        .arg("-I")
        .arg(lib)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/fold_app.rb"))
        .arg(store)
        .arg(workers.to_string())
        .arg(round.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    App { child }
}

fn finish_app(app: &mut App) {
    use std::io::Write;
    let mut stdin = app.child.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    assert!(app.child.wait().unwrap().success());
}

const PUMA_REGISTRY: &str = r#"{"metrics": [
    {"name": "jobs_total", "type": "counter", "help": "Jobs", "labels": ["queue"], "aggregation": "sum"},
    {"name": "job_seconds", "type": "histogram", "help": "Job time", "labels": ["queue"], "aggregation": "sum", "buckets": ["0.01", "0.1", "1", "10"]},
    {"name": "queue_depth", "type": "gauge", "help": "Depth", "labels": ["queue"], "aggregation": "sum"},
    {"name": "rss_peak", "type": "gauge", "help": "Peak", "labels": ["queue"], "aggregation": "max"},
    {"name": "last_job", "type": "gauge", "help": "Last", "labels": ["queue"], "aggregation": "most_recent"}
]}"#;

/// The series writers only increase (counters, histogram buckets, counts and
/// sums, a `sum` gauge only incremented), by line name and labels.
fn increasing_series(exposition: &[u8]) -> std::collections::HashMap<String, f64> {
    promlab::scenarios::scrape_to_remote_write::parse(exposition)
        .unwrap()
        .into_iter()
        .filter(|s| {
            ["jobs_total", "job_seconds", "queue_depth"]
                .iter()
                .any(|p| s.name.starts_with(p))
        })
        .map(|s| {
            let labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            (format!("{}{{{}}}", s.name, labels.join(",")), s.value)
        })
        .collect()
}

/// (A probe found that a sidecar folding every second beside a
/// Puma-like master — client_ruby 5.x workers forked as others exit, two
/// living throughout — served histogram buckets, counts and counters lower
/// than the scrape before, dozens of times a minute, and a scrape after the
/// last writer exited short of the store: a scrape listed the store before
/// taking the fold lock, so a batch committing in between made its sources
/// vanish from it or count twice.) Scraped every 100 ms for 12 s, every
/// increasing series never goes down; once the app has exited, the next
/// scrape is what a fresh `promlab export` reads, and holds every job the
/// workers wrote; the fold keeps up (its lag and run time are served).
#[test]
fn a_folding_sidecar_under_a_pre_fork_servers_churn_never_goes_backwards() {
    let Some(shared) = ruby_and_client_ruby() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let lib = client_ruby_lib(&shared, "5.x-uri", tmp.path());
    let store = tmp.path().join("store");
    std::fs::create_dir(&store).unwrap();
    let registry_file = tmp.path().join("registry.json");
    std::fs::write(&registry_file, PUMA_REGISTRY).unwrap();
    let (store_arg, registry_arg) = (store.to_str().unwrap(), registry_file.to_str().unwrap());
    let server = support::serve(&[
        "--store",
        store_arg,
        "--registry",
        registry_arg,
        "--fold-exited",
        "--fold-every",
        "1",
    ]);
    const SECS: u64 = 12;
    const WRITES: u64 = 10;
    let started = std::time::Instant::now();
    // Killed if the test fails first.
    let mut app = support::Reaped(
        Command::new("ruby")
            .arg("-I")
            .arg(&lib)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/puma_master.rb"))
            .arg(&store)
            .args(["6", "2", &SECS.to_string(), &WRITES.to_string()])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut last = std::collections::HashMap::new();
    let mut backwards = Vec::new();
    let mut scrapes = 0;
    while app.0.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(SECS + 60),
            "the app did not end"
        );
        let now = increasing_series(&support::get(server.addr, "/metrics", &[]).body);
        scrapes += 1;
        for (series, before) in &last {
            match now.get(series) {
                Some(v) if v >= before => {}
                got => backwards.push(format!("scrape {scrapes}: {series} {before} -> {got:?}")),
            }
        }
        last = now;
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(app.0.wait().unwrap().success());
    let mut printed = String::new();
    use std::io::Read;
    app.0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut printed)
        .unwrap();
    let mut written = 0;
    let mut forked = 0;
    for line in printed.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        match words[..] {
            ["long", _, "wrote", n] => written += n.parse::<u64>().unwrap(),
            ["forked", n] => forked = n.parse::<u64>().unwrap(),
            _ => panic!("unexpected line from the app: {line}"),
        }
    }
    written += forked * WRITES;
    assert!(
        backwards.is_empty(),
        "{} went backwards in {scrapes} scrapes: {:#?}",
        backwards.len(),
        &backwards[..backwards.len().min(12)]
    );
    // Quiet: the next scrape is a fresh export's, and holds every job.
    let scraped = support::get(server.addr, "/metrics", &[]).body;
    let out = promlab()
        .args(["export", "--store", store_arg, "--registry", registry_arg])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        scraped == out.stdout,
        "{}",
        promlab::reference::first_difference::first_difference(
            &scraped,
            &out.stdout,
            "sidecar",
            "export"
        )
    );
    let series = increasing_series(&scraped);
    for name in ["jobs_total", "job_seconds_count"] {
        let total: f64 = series
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{name}{{")))
            .map(|(_, v)| v)
            .sum();
        assert_eq!(total, written as f64, "{name}: {forked} workers forked");
    }
    // The fold kept up and says how far behind it is.
    let own = String::from_utf8(support::get(server.addr, "/metrics/promlab", &[]).body).unwrap();
    let gauge = |name: &str| -> f64 {
        own.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} in {own}"))
            .parse()
            .unwrap()
    };
    let (lag, took) = (
        gauge("promlab_fold_lag_seconds"),
        gauge("promlab_fold_last_run_seconds"),
    );
    eprintln!(
        "{forked} workers in {SECS} s ({:.0} exits/s), {scrapes} scrapes; last fold {took:.2} s, lag {lag:.2} s",
        forked as f64 / SECS as f64
    );
    assert!(
        gauge("promlab_fold_runs_total{result=\"ok\"}") >= 3.0,
        "{own}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let left = store_files(&store).len();
        // A fold file per metric, and the lone files folds leave.
        if left <= 5 * 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{left} files still unfolded"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
