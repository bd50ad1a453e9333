//! Bad input gets a clear error and a non-zero exit, never a panic: a missing
//! directory, corrupt store files, an unknown strategy, a registry that does
//! not parse. One corrupt file never changes what other commands read.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Output};

fn promlab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args(args)
        .output()
        .expect("run promlab")
}

fn export(store: &Path, registry: &Path, strategies: &str) -> Output {
    promlab(&[
        "export",
        "--store",
        store.to_str().unwrap(),
        "--registry",
        registry.to_str().unwrap(),
        "--strategies",
        strategies,
    ])
}

/// Exit code 1 with `needle` in the message (a panic exits 101).
fn assert_clean_failure(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected a clean failure, got {:?}: {stderr}",
        out.status
    );
    assert!(stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

fn case_copy() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let case = common::fixtures().join("ruby-dfs/all-types-v5-uri");
    std::fs::create_dir(tmp.path().join("store")).unwrap();
    for entry in std::fs::read_dir(case.join("store")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            tmp.path().join("store").join(entry.file_name()),
        )
        .unwrap();
    }
    std::fs::copy(case.join("registry.json"), tmp.path().join("registry.json")).unwrap();
    let store = tmp.path().join("store");
    (tmp, store)
}

/// Every export-side strategy combination fails the same clean way.
fn assert_all_fail(store: &Path, registry: &Path, needle: &str) {
    for strategies in ["none", "single-read", "decode-once", "fast-unescape", "all"] {
        assert_clean_failure(&export(store, registry, strategies), needle);
    }
}

fn patch(path: &Path, offset: usize, bytes: &[u8]) {
    let mut data = std::fs::read(path).unwrap();
    data[offset..offset + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, data).unwrap();
}

#[test]
fn missing_store_directory() {
    let (tmp, _) = case_copy();
    assert_clean_failure(
        &export(
            &tmp.path().join("nope"),
            &tmp.path().join("registry.json"),
            "all",
        ),
        "does not exist",
    );
}

#[test]
fn bad_used_header() {
    let (tmp, store) = case_copy();
    let file = store.join("metric_http_requests_total___22532.bin");
    patch(&file, 0, &(1i32 << 30).to_le_bytes());
    assert_all_fail(&store, &tmp.path().join("registry.json"), "bad used");
    patch(&file, 0, &(-5i32).to_le_bytes());
    assert_all_fail(&store, &tmp.path().join("registry.json"), "bad used");
}

#[test]
fn truncated_entry() {
    let (tmp, store) = case_copy();
    let file = store.join("metric_http_requests_total___22532.bin");
    let mut data = std::fs::read(&file).unwrap();
    data.truncate(data.len() - 5);
    std::fs::write(&file, &data).unwrap();
    // `used` now points past the end of the file.
    assert_all_fail(
        &store,
        &tmp.path().join("registry.json"),
        "metric_http_requests_total___22532.bin",
    );
    // An entry length that runs past `used`.
    let (tmp, store) = case_copy();
    let file = store.join("metric_http_requests_total___22532.bin");
    patch(&file, 8, &10_000i32.to_le_bytes());
    assert_all_fail(&store, &tmp.path().join("registry.json"), "needs");
}

#[test]
fn invalid_escape_in_a_key() {
    let (tmp, store) = case_copy();
    let file = store.join("metric_http_requests_total___22532.bin");
    // The first key is `code=200&path=plain`: make it `code=%Z0&…`.
    let data = std::fs::read(&file).unwrap();
    let at = data.windows(8).position(|w| w == b"code=200").unwrap();
    patch(&file, at + 5, b"%Z");
    assert_all_fail(
        &store,
        &tmp.path().join("registry.json"),
        "invalid %-escape",
    );
}

#[test]
fn a_directory_where_a_file_should_be() {
    let (tmp, store) = case_copy();
    std::fs::create_dir(store.join("metric_queue_depth___99999.bin")).unwrap();
    assert_all_fail(
        &store,
        &tmp.path().join("registry.json"),
        "metric_queue_depth___99999.bin",
    );
}

#[test]
fn unknown_strategy_and_bad_registry() {
    let (tmp, store) = case_copy();
    let out = export(
        &store,
        &tmp.path().join("registry.json"),
        "decode-once,warp-drive",
    );
    assert_eq!(out.status.code(), Some(2), "clap rejects the argument");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown strategy `warp-drive`"));
    std::fs::write(
        tmp.path().join("bad.json"),
        "{\"metrics\": [{\"name\": 1}]}",
    )
    .unwrap();
    assert_clean_failure(
        &export(&store, &tmp.path().join("bad.json"), "all"),
        "registry does not parse",
    );
    std::fs::write(
        tmp.path().join("bad.json"),
        "{\"metrics\": [{\"name\": \"x y\", \"type\": \"counter\"}]}",
    )
    .unwrap();
    assert_clean_failure(
        &export(&store, &tmp.path().join("bad.json"), "all"),
        "invalid metric name",
    );
}

#[test]
fn the_intact_store_still_exports_after_the_failures() {
    // A failed export writes nothing: the fixture directory is read-only input.
    let case = common::fixtures().join("ruby-dfs/all-types-v5-uri");
    let out = export(&case.join("store"), &case.join("registry.json"), "all");
    assert!(out.status.success());
    assert_eq!(
        out.stdout,
        std::fs::read(case.join("expected.prom")).unwrap()
    );
}

/// What a newcomer gets wrong first: `--store` given a file, an archive or the case
/// directory instead of its `store/`. Each says what was given and what is wanted.
#[test]
fn store_mistakes_say_what_was_given() {
    let case = common::fixtures().join("ruby-dfs/all-types-v5-uri");
    let registry = case.join("registry.json");
    let out = export(&registry, &registry, "all");
    assert_clean_failure(&out, "is a file, not a store directory");
    let archive = common::fixtures().join("ruby-dfs/large-v5-uri.tar.gz");
    let out = export(&archive, &registry, "all");
    assert_clean_failure(&out, "is an archive: unpack it");
    // The case directory: the export runs (an empty store is valid) but warns, naming store/.
    let out = export(&case, &registry, "all");
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no file in") && stderr.contains("did you mean --store"),
        "{stderr}"
    );
    // And every command's first line names the strategy set it runs.
    assert!(
        stderr.starts_with("promlab export: strategies all"),
        "{stderr}"
    );
    // A registry naming no metric is said as such, not as a list of no names.
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("registry.json");
    std::fs::write(&empty, r#"{"metrics": []}"#).unwrap();
    let out = export(&case.join("store"), &empty, "all");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("the registry names no metric"), "{stderr}");
}

#[test]
fn flags_that_belong_to_another_mode_are_refused() {
    let out = promlab(&["serve", "--queues", "5"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--scenario"));
}

#[test]
fn an_unknown_strategy_lists_every_accepted_spelling() {
    let out = promlab(&["ingest", "--strategies", "bogus", "x.bin"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for word in ["`none`", "`all`", "`default`", "series-cache"] {
        assert!(stderr.contains(word), "{word} missing: {stderr}");
    }
}

/// `--listen localhost:0` resolves and binds loopback; the process is killed after its first line.
#[test]
fn listen_takes_a_host_name() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args(["serve", "--listen", "localhost:0", "--strategies", "none"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut announced = String::new();
    for line in lines.by_ref().take(3) {
        let line = line.unwrap();
        if line.contains("http://") {
            announced = line;
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        announced.contains("http://127.0.0.1:") || announced.contains("http://[::1]:"),
        "{announced}"
    );
    let out = promlab(&["serve", "--listen", "no-such-host.invalid:1"]);
    assert_clean_failure(&out, "expected HOST:PORT");
}

/// `promlab ingest` with a plan that matches nothing says so, with the metric names seen.
#[test]
fn ingest_says_when_nothing_matched_the_plan() {
    let dir = common::fixtures().join("remote-write/prometheus-2.42");
    let out = promlab(&["ingest", dir.join("0001.bin").to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("no sample matched the plan"), "{stderr}");
    assert!(stderr.contains("go_gc_duration_seconds"), "{stderr}");
    // The shipped plan for these captures routes them.
    let plan = common::fixtures().join("../../experiments/plans/prometheus-captures.toml");
    let mut args = vec![
        "ingest".to_string(),
        "--plan".into(),
        plan.display().to_string(),
    ];
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .collect();
    files.sort();
    args.extend(files.iter().map(|p| p.display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = promlab(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("no sample matched"), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        json.as_array()
            .unwrap()
            .iter()
            .all(|a| !a["groups"].as_array().unwrap().is_empty()),
        "{json}"
    );
}
