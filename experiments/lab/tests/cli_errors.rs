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
