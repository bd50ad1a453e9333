//! The stores and expositions that real client_ruby (4.2.5 and 5.x, and the
//! one-file-per-process branch) wrote: promlab must export them byte for
//! byte under every export-side strategy combination. (Rebuilding their store files from the op logs, with the
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

/// One long-lived exporter per export combination, scraped `scrapes` times:
/// each scrape must print `expected`.
fn assert_long_lived(store: &Path, registry: &Registry, expected: &[u8], scrapes: usize) {
    for strategies in StrategySet::combinations(Stage::Export) {
        let mut exporter = promlab::export::Exporter::new(store, registry.clone(), strategies);
        let mut out = Vec::new();
        for scrape in 0..scrapes {
            exporter.export_into(&mut out).unwrap();
            assert!(
                out == expected,
                "{}: scrape {scrape} with {strategies} differs, {}",
                store.display(),
                promlab::reference::first_difference::first_difference(
                    &out, expected, "ours", "expected"
                )
            );
            assert!(exporter.last_report().is_clean(), "{strategies}");
        }
    }
}

#[test]
fn exports_the_one_file_per_process_cases_byte_identical() {
    let (_tmp, cases) = per_process_cases();
    for case in &cases {
        assert_exports(case, &case.join("store"));
        let registry = Registry::load(&case.join("registry.json")).unwrap();
        let expected = std::fs::read(case.join("expected.prom")).unwrap();
        assert_eq!(
            promlab::reference::exposition::export(&case.join("store"), &registry).unwrap(),
            expected,
            "the reference exporter on {}",
            case.display()
        );
        assert_long_lived(&case.join("store"), &registry, &expected, 2);
    }
}

/// promlab's writer in the one-file-per-process layout writes the branch's
/// files byte for byte (timestamps aside): every case's op logs replayed, each
/// in a process of the log's pid, under every write strategy.
#[test]
fn the_writer_writes_the_one_file_per_process_cases_byte_identical() {
    use promlab::format::formenc::Dialect;
    use promlab::scenarios::op_log::OpLog;
    use promlab::write::{Client, ClientConfig, Layout};
    let (_tmp, cases) = per_process_cases();
    for case in &cases {
        let registry = Registry::load(&case.join("registry.json")).unwrap();
        for strategies in [StrategySet::NONE, StrategySet::all().restrict(Stage::Write)] {
            let dir = tempfile::tempdir().unwrap();
            for log in op_logs(case) {
                let log = OpLog::load(&log).unwrap();
                let config = ClientConfig {
                    dialect: Dialect::Cgi,
                    strategies,
                    pid_override: Some(log.pid),
                };
                let mut client =
                    Client::new_in_layout(dir.path(), &registry, config, Layout::PerProcess)
                        .unwrap();
                log.replay(&mut client).unwrap();
            }
            let what = format!("{} under {strategies}", case.display());
            assert_same_store(&case.join("store"), dir.path(), &what);
            let expected = std::fs::read(case.join("expected.prom")).unwrap();
            assert_exports_text(dir.path(), &registry, &expected);
        }
    }
}

/// Both layouts in one directory (a rolling deploy between a release and the
/// branch): every process of both is read, as one exporter globbing both
/// patterns in sorted path order would (every `metric_` file first).
#[test]
fn a_directory_mixing_both_layouts_is_read_whole() {
    let classic = fixtures().join("ruby-dfs/all-types-v4.2.5");
    let (_tmp, cases) = per_process_cases();
    let per_process = &cases[0];
    let dir = tempfile::tempdir().unwrap();
    for from in [classic.join("store"), per_process.join("store")] {
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    let registry = Registry::load(&classic.join("registry.json")).unwrap();
    let expected = promlab::reference::exposition::export(dir.path(), &registry).unwrap();
    let text = String::from_utf8(expected.clone()).unwrap();
    // Counted in both layouts' processes: twice what each printed alone.
    assert!(
        text.contains("http_requests_total{code=\"200\",path=\"plain\"} 12.5\n"),
        "{text}"
    );
    // `all` gauges: one series per process of either layout.
    assert_eq!(text.matches("workers_busy{pid=").count(), 10, "{text}");
    assert_exports_text(dir.path(), &registry, &expected);
    assert_long_lived(dir.path(), &registry, &expected, 2);
}

fn assert_exports_text(store: &Path, registry: &Registry, expected: &[u8]) {
    for strategies in StrategySet::combinations(Stage::Export) {
        let (out, report) =
            promlab::export::export_with_report(store, registry, strategies).unwrap();
        assert!(
            out == expected,
            "export with {strategies} differs, {}",
            promlab::reference::first_difference::first_difference(
                &out, expected, "ours", "expected"
            )
        );
        assert!(report.is_clean(), "{strategies}: {:?}", report.log_lines());
    }
}

/// A long-lived exporter (what `serve --store` keeps) that started on a
/// store of the per-metric layout reads the per-process files once they
/// appear, whatever its strategies keep between scrapes.
#[test]
fn a_long_lived_exporter_follows_a_store_into_the_other_layout() {
    let classic = fixtures().join("ruby-dfs/all-types-v4.2.5");
    let (_tmp, cases) = per_process_cases();
    let registry = Registry::load(&classic.join("registry.json")).unwrap();
    for strategies in StrategySet::combinations(Stage::Export) {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(&classic.join("store"), dir.path());
        let mut exporter = promlab::export::Exporter::new(dir.path(), registry.clone(), strategies);
        let mut out = Vec::new();
        for _ in 0..2 {
            exporter.export_into(&mut out).unwrap();
            assert_eq!(
                out,
                std::fs::read(classic.join("expected.prom")).unwrap(),
                "{strategies}"
            );
        }
        copy_dir(&cases[0].join("store"), dir.path());
        let expected = promlab::reference::exposition::export(dir.path(), &registry).unwrap();
        for _ in 0..2 {
            exporter.export_into(&mut out).unwrap();
            assert!(
                out == expected,
                "{strategies}: {}",
                promlab::reference::first_difference::first_difference(
                    &out,
                    &expected,
                    "ours",
                    "reference"
                )
            );
        }
        // The per-metric files go (a deploy finished): the rest is still read.
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("metric_")
            {
                std::fs::remove_file(path).unwrap();
            }
        }
        exporter.export_into(&mut out).unwrap();
        let expected = std::fs::read(cases[0].join("expected.prom")).unwrap();
        assert_eq!(out, expected, "{strategies}");
    }
}

/// Entries a file of every metric should not hold are counted, never served:
/// one without `___metric_name`, one naming a metric not registered.
#[test]
fn per_process_entries_without_a_registered_metric_are_counted() {
    use promlab::export::EntrySkip;
    let dir = tempfile::tempdir().unwrap();
    let bytes = promlab::format::storefile::file_bytes_with_timestamps([
        (
            &b"___metric_name=http_requests_total&code=200&path=x"[..],
            2.0,
            0.0,
        ),
        (&b"code=200&path=x"[..], 3.0, 0.0),
        (&b"___metric_name=nope&code=200"[..], 4.0, 0.0),
    ]);
    std::fs::write(dir.path().join("metrics___42.bin"), bytes).unwrap();
    let registry =
        Registry::load(&fixtures().join("ruby-dfs/all-types-v4.2.5/registry.json")).unwrap();
    for strategies in StrategySet::combinations(Stage::Export) {
        let (out, report) =
            promlab::export::export_with_report(dir.path(), &registry, strategies).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("http_requests_total{code=\"200\",path=\"x\"} 2.0\n"),
            "{text}"
        );
        assert_eq!(
            report.entries.get(&EntrySkip::NoMetricName),
            Some(&1),
            "{strategies}"
        );
        assert_eq!(
            report.entries.get(&EntrySkip::UnregisteredMetric),
            Some(&1),
            "{strategies}"
        );
    }
}
