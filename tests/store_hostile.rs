//! Hostile store files, through every export combination and the reference
//! exporter: what is left out, what is counted, and that every good series is
//! still served the same way by all of them (issue #12, items 1, 6, 7, 8, 10,
//! 13). The binary-level cases (truncation under a live sidecar, FIFOs, file
//! churn, thousands of files under a low descriptor limit) are in
//! `experiments/lab/tests/store_sidecar.rs`.

use promlab::export::{export_with_report, EntrySkip, Exporter, FileSkip};
use promlab::registry::Registry;
use promlab::storefile::{file_bytes, file_path, new_entry};
use promlab::strategy::{Stage, StrategySet};
use std::path::Path;

/// A store file's bytes: header, then each (raw key, value) as client_ruby appends it.
fn store_bytes(entries: &[(&[u8], f64)]) -> Vec<u8> {
    file_bytes(entries.iter().copied())
}

fn write_file(dir: &Path, metric: &str, pid: u32, entries: &[(&[u8], f64)]) {
    std::fs::write(file_path(dir, metric, pid), store_bytes(entries)).unwrap();
}

fn registry(json_metrics: &str) -> Registry {
    Registry::from_json(&format!(r#"{{"metrics": [{json_metrics}]}}"#)).unwrap()
}

/// Every export combination, one-shot and long-lived (two scrapes), prints
/// what the reference prints; returns that text and the one-shot baseline's report.
fn export_everywhere(dir: &Path, registry: &Registry) -> (String, promlab::export::ScrapeReport) {
    let want = promlab::reference::exposition::export(dir, registry).unwrap();
    let (baseline, report) = export_with_report(dir, registry, StrategySet::NONE).unwrap();
    for s in StrategySet::combinations(Stage::Export) {
        let (got, got_report) = export_with_report(dir, registry, s).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "one-shot {s}"
        );
        assert_eq!(got_report.files.len(), report.files.len(), "{s}");
        assert_eq!(got_report.entries, report.entries, "{s}");
        let mut exporter = Exporter::new(dir, registry.clone(), s);
        let mut out = Vec::new();
        for round in 0..2 {
            exporter.export_into(&mut out).unwrap();
            assert!(out == want, "long-lived {s}, scrape {round}");
        }
    }
    assert!(baseline == want);
    (String::from_utf8(want).unwrap(), report)
}

/// Item 8: a label name Prometheus would reject (the whole scrape with it) is
/// left out and counted, as is a key that does not decode; the good series
/// beside them are served.
#[test]
fn invalid_label_names_and_bad_keys_are_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = registry(r#"{"name": "c", "type": "counter", "help": "h", "aggregation": "sum"}"#);
    write_file(
        tmp.path(),
        "c",
        1,
        &[
            (b"code=200", 1.0),
            (b"co%20de=500", 2.0),
            (b"1st=x", 3.0),
            (b"code=%ZZ", 4.0),
            (b"code=404", 5.0),
        ],
    );
    let (text, report) = export_everywhere(tmp.path(), &reg);
    assert_eq!(
        text,
        "# TYPE c counter\n# HELP c h\nc{code=\"200\"} 1.0\nc{code=\"404\"} 5.0\n"
    );
    assert!(report.files.is_empty());
    assert_eq!(report.entries.get(&EntrySkip::InvalidLabelName), Some(&2));
    assert_eq!(report.entries.get(&EntrySkip::BadKey), Some(&1));
}

/// Item 8: NaN in `max`/`min` loses to any number whatever the file order
/// (Ruby's `Array#max` raises instead), and stays NaN only when every
/// process wrote NaN.
#[test]
fn nan_in_min_and_max_does_not_depend_on_file_order() {
    for mode in ["max", "min"] {
        let reg = registry(&format!(
            r#"{{"name": "g", "type": "gauge", "help": "h", "aggregation": "{mode}"}}"#
        ));
        let mut texts = Vec::new();
        for nan_first in [true, false] {
            let tmp = tempfile::tempdir().unwrap();
            let (first, second) = if nan_first {
                (f64::NAN, 3.0)
            } else {
                (3.0, f64::NAN)
            };
            write_file(tmp.path(), "g", 1, &[(b"a=x", first), (b"a=n", f64::NAN)]);
            write_file(tmp.path(), "g", 2, &[(b"a=x", second), (b"a=n", f64::NAN)]);
            texts.push(export_everywhere(tmp.path(), &reg).0);
        }
        assert_eq!(texts[0], texts[1], "{mode}");
        assert!(
            texts[0].contains("g{a=\"x\"} 3.0\n"),
            "{mode}: {}",
            texts[0]
        );
        assert!(
            texts[0].contains("g{a=\"n\"} NaN\n"),
            "{mode}: {}",
            texts[0]
        );
    }
}

/// Item 7: the files of metric `a___b` (and stray names) are not metric `a`'s.
#[test]
fn file_names_are_parsed_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = registry(
        r#"{"name": "a", "type": "counter", "help": "h", "aggregation": "sum"},
           {"name": "a___b", "type": "counter", "help": "h", "aggregation": "sum"}"#,
    );
    write_file(tmp.path(), "a", 1, &[(b"x=1", 1.0)]);
    write_file(tmp.path(), "a___b", 1, &[(b"x=1", 10.0)]);
    std::fs::write(
        tmp.path().join("metric_a___1.bin.bak"),
        store_bytes(&[(b"x=1", 100.0)]),
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("metric_a___x.bin"),
        store_bytes(&[(b"x=1", 1000.0)]),
    )
    .unwrap();
    let (text, _) = export_everywhere(tmp.path(), &reg);
    assert!(text.contains("a{x=\"1\"} 1.0\n"), "{text}");
    assert!(text.contains("a___b{x=\"1\"} 10.0\n"), "{text}");
}

/// Item 6: a corrupt file, a directory and a FIFO by a store file's name are
/// left out whole (none of their entries count), every other file is served,
/// and the report names them.
#[test]
fn bad_files_are_left_out_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = registry(r#"{"name": "c", "type": "counter", "help": "h", "aggregation": "sum"}"#);
    write_file(tmp.path(), "c", 1, &[(b"a=1", 1.0), (b"a=2", 2.0)]);
    // Pid 2: good first entry, then an entry whose length runs past `used`.
    let mut bad = store_bytes(&[(b"a=1", 100.0), (b"a=3", 300.0)]);
    let second = 8 + new_entry(b"a=1").len();
    bad[second..second + 4].copy_from_slice(&10_000i32.to_le_bytes());
    std::fs::write(file_path(tmp.path(), "c", 2), bad).unwrap();
    write_file(tmp.path(), "c", 3, &[(b"a=2", 20.0)]);
    std::fs::create_dir(file_path(tmp.path(), "c", 4)).unwrap();
    let fifo = file_path(tmp.path(), "c", 5);
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let (text, report) = export_everywhere(tmp.path(), &reg);
    assert_eq!(
        text,
        "# TYPE c counter\n# HELP c h\nc{a=\"1\"} 1.0\nc{a=\"2\"} 22.0\n"
    );
    let mut reasons: Vec<FileSkip> = report.files.iter().map(|f| f.reason).collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            FileSkip::NotRegular,
            FileSkip::NotRegular,
            FileSkip::Corrupt
        ]
    );
}

/// Item 13: a key of 100k labels exports in linear time. The duplicate-name
/// check was quadratic (5·10⁹ comparisons, 42 s); the bound here is generous,
/// the point is that it is not minutes.
#[test]
fn a_key_with_100k_labels_exports_in_linear_time() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = registry(r#"{"name": "c", "type": "counter", "help": "h", "aggregation": "sum"}"#);
    let mut key = Vec::new();
    for i in 0..100_000 {
        if i > 0 {
            key.push(b'&');
        }
        key.extend_from_slice(format!("l{i:06}=v").as_bytes());
    }
    write_file(tmp.path(), "c", 1, &[(&key, 1.0)]);
    let started = std::time::Instant::now();
    for s in [StrategySet::NONE, StrategySet::all()] {
        let (out, report) = export_with_report(tmp.path(), &reg, s).unwrap();
        assert!(report.is_clean());
        assert_eq!(out.iter().filter(|&&b| b == b'=').count(), 100_000);
    }
    let took = started.elapsed();
    assert!(took.as_secs() < 20, "took {took:?}");
    // A repeated name among many is still found.
    key.extend_from_slice(b"&l000007=w");
    let err = promlab::formenc::decode_key_reference(&key).unwrap_err();
    assert!(err.to_string().contains("l000007"), "{err}");
}

/// Item 10: a second writer on the same file (same pid) is refused while the
/// first is open, and allowed once it is gone.
#[test]
fn a_second_writer_on_one_file_is_refused() {
    use promlab::store::{Client, ClientConfig};
    let tmp = tempfile::tempdir().unwrap();
    let reg = registry(
        r#"{"name": "c", "type": "counter", "help": "h", "labels": ["a"], "aggregation": "sum"}"#,
    );
    let config = || ClientConfig {
        dialect: Default::default(),
        strategies: StrategySet::NONE,
        pid_override: Some(77),
    };
    let mut first = Client::new(tmp.path(), &reg, config()).unwrap();
    let id = first.metric("c").unwrap();
    first.increment(id, &[("a", "x")], 1.0).unwrap();
    let mut second = Client::new(tmp.path(), &reg, config()).unwrap();
    let id2 = second.metric("c").unwrap();
    let err = second.increment(id2, &[("a", "x")], 1.0).unwrap_err();
    assert!(
        format!("{err:#}").contains("already open for writing"),
        "{err:#}"
    );
    // The exporter still reads the file the first writer holds.
    let (out, report) = export_with_report(tmp.path(), &reg, StrategySet::all()).unwrap();
    assert!(report.is_clean());
    assert!(String::from_utf8_lossy(&out).contains("c{a=\"x\"} 1.0"));
    drop(first);
    second.increment(id2, &[("a", "x")], 1.0).unwrap();
    let out = promlab::export::export(tmp.path(), &reg, StrategySet::NONE).unwrap();
    assert!(String::from_utf8_lossy(&out).contains("c{a=\"x\"} 2.0"));
}
