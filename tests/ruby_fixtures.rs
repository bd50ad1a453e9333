//! The stores and expositions that real client_ruby (4.2.5 and 5.x) wrote:
//! promlab must export them byte for byte under every export-side strategy
//! combination. (Rebuilding their store files from the op logs, with the
//! `promlab replay` binary, is the lab's `tests/ruby_replay.rs`.)

mod common;

use common::*;
use promlab::format::registry::Registry;
use promlab::shared::strategy::{Stage, StrategySet};
use std::path::Path;

fn assert_exports(case: &Path, store: &Path) {
    let registry = Registry::load(&case.join("registry.json")).unwrap();
    let expected = std::fs::read(case.join("expected.prom")).unwrap();
    for strategies in StrategySet::combinations(Stage::Export) {
        let out = promlab::export::export(store, &registry, strategies).unwrap();
        assert!(
            out == expected,
            "{}: export with {strategies} differs from Ruby's, {}",
            case.display(),
            promlab::reference::first_difference::first_difference(&out, &expected, "ours", "ruby")
        );
    }
}

#[test]
fn exports_every_ruby_case_byte_identical() {
    for (case, _) in RUBY_CASES {
        let case = fixtures().join("ruby-dfs").join(case);
        assert_exports(&case, &case.join("store"));
    }
}

#[test]
fn exports_the_large_case_byte_identical() {
    let (_tmp, case) = unpack_large();
    assert_exports(&case, &case.join("store"));
}

#[test]
fn a_rolling_upgrade_directory_merges_both_dialects() {
    // 4.2.5 and 5.x files in one directory: `~`/`*` keys differ, label sets don't.
    let v4 = fixtures().join("ruby-dfs/all-types-v4.2.5");
    let v5 = fixtures().join("ruby-dfs/all-types-v5-uri");
    let tmp = tempfile::tempdir().unwrap();
    for dir in [&v4, &v5] {
        for entry in std::fs::read_dir(dir.join("store")).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), tmp.path().join(entry.file_name())).unwrap();
        }
    }
    let registry = Registry::load(&v5.join("registry.json")).unwrap();
    let baseline = promlab::export::export(tmp.path(), &registry, StrategySet::NONE).unwrap();
    let text = String::from_utf8(baseline.clone()).unwrap();
    // One series for the `~`/`*` label set, summed over both versions' files.
    assert_eq!(text.matches("path=\"tilde~star*\"").count(), 1, "{text}");
    assert!(
        text.contains("http_requests_total{code=\"404\",path=\"tilde~star*\"} 44.0"),
        "{text}"
    );
    for strategies in StrategySet::combinations(Stage::Export) {
        assert_eq!(
            promlab::export::export(tmp.path(), &registry, strategies).unwrap(),
            baseline,
            "{strategies}"
        );
    }
}
