//! The stores that real client_ruby (4.2.5 and 5.x) wrote, rebuilt byte for byte
//! (timestamps aside) by `promlab replay` from their op logs under every
//! write-side strategy combination, each log in its own process.

#[path = "../../../tests/common/mod.rs"]
mod common;

use common::*;
use promlab::format::registry::Registry;
use promlab::shared::strategy::{Stage, StrategySet};
use std::path::Path;

fn replay(case: &Path, store: &Path, dialect: &str, strategies: StrategySet) {
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args(["replay", "--registry"])
        .arg(case.join("registry.json"))
        .arg("--store")
        .arg(store)
        .args([
            "--dialect",
            dialect,
            "--strategies",
            &strategies.to_string(),
        ])
        .args(op_logs(case))
        .status()
        .unwrap();
    assert!(
        status.success(),
        "replay of {} with {strategies} failed",
        case.display()
    );
}

#[test]
fn replaying_op_logs_rebuilds_every_ruby_store() {
    for (case, dialect) in RUBY_CASES {
        let case = fixtures().join("ruby-dfs").join(case);
        for strategies in StrategySet::combinations(Stage::Write) {
            let tmp = tempfile::tempdir().unwrap();
            replay(&case, tmp.path(), dialect, strategies);
            assert_same_store(
                &case.join("store"),
                tmp.path(),
                &format!("{} with {strategies}", case.display()),
            );
        }
    }
}

#[test]
fn replaying_the_large_case_rebuilds_its_store_and_exposition() {
    let (_tmp, case) = unpack_large();
    for strategies in [StrategySet::NONE, StrategySet::all()] {
        let tmp = tempfile::tempdir().unwrap();
        replay(&case, tmp.path(), "uri", strategies);
        assert_same_store(
            &case.join("store"),
            tmp.path(),
            &format!("large with {strategies}"),
        );
        let registry = Registry::load(&case.join("registry.json")).unwrap();
        let expected = std::fs::read(case.join("expected.prom")).unwrap();
        for strategies in StrategySet::combinations(Stage::Export) {
            let out = promlab::export::export(tmp.path(), &registry, strategies).unwrap();
            assert!(
                out == expected,
                "large replayed, exported with {strategies}: {}",
                promlab::reference::first_difference::first_difference(
                    &out, &expected, "ours", "ruby"
                )
            );
        }
    }
}
