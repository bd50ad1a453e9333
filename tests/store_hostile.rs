//! Hostile store files, through every export combination and the reference
//! exporter: what is left out, what is counted, and that every good series is
//! still served the same way by all of them (keys Prometheus would refuse,
//! zero-length keys, sparse files, deadlines inside a walk, files locked for a while).
//! The binary-level cases (truncation under a live sidecar, FIFOs, file
//! churn, thousands of files under a low descriptor limit, stuck locks, a
//! real Prometheus) are in `experiments/lab/tests/store_sidecar.rs` and
//! `serve.rs`.

use promlab::export::{export_with_report, EntrySkip, Exporter, FileSkip};
use promlab::format::registry::Registry;
use promlab::format::storefile::{file_bytes, file_path, new_entry};
use promlab::shared::strategy::{Stage, StrategySet};
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
    assert_eq!(
        promlab::reference::exposition::exposition_fault(&want),
        None,
        "only valid exposition leaves the exporter"
    );
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

/// A histogram whose files do not match its declared buckets (a registry
/// changed between deploys): undeclared `le` values print after the declared
/// buckets in order of first appearance, `+Inf` where it first appeared (or
/// last, with every bucket's count, when no file has it), a key without `le`
/// as the bucket "", and `le="sum"` as the sum; with `prerender`'s kept line
/// prefixes as without, scrape after scrape.
#[test]
fn undeclared_buckets_and_inf_print_as_ruby_orders_them() {
    let reg = registry(
        r#"{"name": "h", "type": "histogram", "help": "h", "labels": ["a"], "buckets": ["1", "5"]}"#,
    );
    let tmp = tempfile::tempdir().unwrap();
    write_file(
        tmp.path(),
        "h",
        1,
        &[
            (b"a=x&le=1", 1.0),
            (b"a=x&le=%2BInf", 2.0),
            (b"a=x&le=2.5", 3.0),
            (b"a=x&le=sum", 4.0),
            (b"a=y&le=5", 5.0),
            (b"a=y&le=10", 6.0),
            (b"a=y", 7.0),
        ],
    );
    write_file(
        tmp.path(),
        "h",
        2,
        &[
            (b"a=x&le=2.5", 1.0),
            (b"a=y&le=10", 1.0),
            (b"a=z&le=%2BInf", 8.0),
        ],
    );
    let (text, _) = export_everywhere(tmp.path(), &reg);
    let x = text
        .lines()
        .filter(|l| l.contains("a=\"x\""))
        .collect::<Vec<_>>();
    assert_eq!(
        x,
        [
            "h_bucket{a=\"x\",le=\"1\"} 1.0",
            "h_bucket{a=\"x\",le=\"5\"} 1.0",
            "h_bucket{a=\"x\",le=\"+Inf\"} 3.0",
            "h_bucket{a=\"x\",le=\"2.5\"} 4.0",
            "h_sum{a=\"x\"} 4.0",
            "h_count{a=\"x\"} 3.0",
        ],
        "{text}"
    );
    assert!(text.contains("h_bucket{a=\"y\",le=\"10\"} 7.0\nh_bucket{a=\"y\",le=\"\"} 7.0\nh_bucket{a=\"y\",le=\"+Inf\"} 5.0\n"), "{text}");
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
    let err = promlab::format::formenc::decode_key_reference(&key).unwrap_err();
    assert!(err.to_string().contains("l000007"), "{err}");
}

/// Item 10: a second writer on the same file (same pid) is refused while the
/// first is open, and allowed once it is gone.
#[test]
fn a_second_writer_on_one_file_is_refused() {
    use promlab::write::{Client, ClientConfig};
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

/// Keys whose decoded labels Prometheus would refuse (a
/// value that is not UTF-8, `__name__`, another `__` name) and a key padded
/// past what client_ruby writes are left out and counted by reason, through
/// every combination and the reference; UTF-8 that is valid (`é`) and an
/// empty value are served.
#[test]
fn labels_prometheus_would_refuse_are_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = registry(r#"{"name": "c", "type": "counter", "help": "h", "aggregation": "sum"}"#);
    let mut padded = new_entry(b"code=500");
    // 12 spaces of padding where client_ruby writes at most 8.
    let len = i32::from_le_bytes(padded[..4].try_into().unwrap()) + 8;
    padded.splice(4 + 8..4 + 8, *b"        ");
    padded[..4].copy_from_slice(&len.to_le_bytes());
    let mut bytes = store_bytes(&[
        (b"code=200", 1.0),
        (b"path=%FF%FE", 2.0),
        (b"__name__=evil", 3.0),
        (b"__meta=1&code=200", 4.0),
        (b"path=caf%C3%A9", 5.0),
        (b"code=&path=%E6%97%A5", 6.0),
        (b"a=1&b=%C0%AF", 7.0),
    ]);
    bytes.extend_from_slice(&padded);
    let used = bytes.len() as i32;
    bytes[..4].copy_from_slice(&used.to_le_bytes());
    std::fs::write(file_path(tmp.path(), "c", 1), bytes).unwrap();
    write_file(
        tmp.path(),
        "c",
        2,
        &[(b"path=%FF%FE", 20.0), (b"code=200", 10.0)],
    );
    let (text, report) = export_everywhere(tmp.path(), &reg);
    assert_eq!(
        text,
        "# TYPE c counter\n# HELP c h\nc{code=\"200\"} 11.0\nc{path=\"café\"} 5.0\nc{code=\"\",path=\"日\"} 6.0\n"
    );
    assert!(report.files.is_empty());
    let count = |reason| report.entries.get(&reason).copied().unwrap_or(0);
    assert_eq!(count(EntrySkip::InvalidLabelValue), 3);
    assert_eq!(count(EntrySkip::ReservedLabelName), 2);
    assert_eq!(count(EntrySkip::BadKey), 1);
    assert_eq!(count(EntrySkip::InvalidLabelName), 0);
}

/// Client_ruby pads every key with at least one space, so
/// an empty label set is stored as four spaces (an unlabeled series) and a
/// stored key length of 0 is bytes no writer wrote: its file is refused as
/// corrupt (client_ruby would read it as the empty label set).
#[test]
fn a_zero_length_key_is_refused_and_an_empty_label_set_is_served() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = registry(r#"{"name": "g", "type": "gauge", "help": "h", "aggregation": "sum"}"#);
    write_file(tmp.path(), "g", 1, &[(b"", 1.5)]);
    assert_eq!(
        &std::fs::read(file_path(tmp.path(), "g", 1)).unwrap()[8..16],
        b"\x04\0\0\0    "
    );
    // Pid 2: a good entry, then a zero key length and 16 zero bytes.
    let mut zero = store_bytes(&[(b"a=1", 2.0)]);
    zero.extend_from_slice(&[0u8; 20]);
    let used = zero.len() as i32;
    zero[..4].copy_from_slice(&used.to_le_bytes());
    std::fs::write(file_path(tmp.path(), "g", 2), zero).unwrap();
    let (text, report) = export_everywhere(tmp.path(), &reg);
    assert_eq!(text, "# TYPE g gauge\n# HELP g h\ng 1.5\n");
    assert_eq!(report.files.len(), 1);
    assert_eq!(report.files[0].reason, FileSkip::Corrupt);
    assert!(
        report.files[0].error.contains("key length 0"),
        "{:?}",
        report.files[0]
    );
}

/// A sparse file whose `used` claims 2 GiB (what a crash
/// or a hostile writer leaves: zeros where entries would be) is refused at
/// its first entry, not walked as 107 M empty entries; the good file beside
/// it is served. Generous bound: the point is not seconds of work.
#[test]
fn a_sparse_file_claiming_two_gib_is_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = registry(r#"{"name": "c", "type": "counter", "help": "h", "aggregation": "sum"}"#);
    write_file(tmp.path(), "c", 1, &[(b"a=good", 5.0)]);
    let sparse = std::fs::File::create(file_path(tmp.path(), "c", 2)).unwrap();
    sparse.set_len(1 << 31).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, &i32::MAX.to_le_bytes(), 0).unwrap();
    drop(sparse);
    let started = std::time::Instant::now();
    let (text, report) = export_everywhere(tmp.path(), &reg);
    assert_eq!(text, "# TYPE c counter\n# HELP c h\nc{a=\"good\"} 5.0\n");
    assert_eq!(report.files.len(), 1);
    assert_eq!(report.files[0].reason, FileSkip::Corrupt);
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
}

/// Every file of `dir` but `skipped`, copied into a fresh directory.
fn store_without(dir: &Path, skipped: &[std::path::PathBuf]) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if !skipped.iter().any(|s| s == &path) {
            std::fs::copy(&path, copy.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    copy
}

/// The deadline is checked inside a file's walk, and a
/// file cut by it counts for nothing: whatever the budget, every combination
/// prints exactly the reference's exposition of the store without the files
/// it reports skipped (so no file is ever half in), and a budget that has
/// already passed skips every file.
#[test]
fn a_file_cut_by_the_deadline_counts_for_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = registry(
        r#"{"name": "a", "type": "counter", "help": "h", "aggregation": "sum"},
           {"name": "b", "type": "counter", "help": "h", "aggregation": "sum"}"#,
    );
    write_file(tmp.path(), "a", 1, &[(b"x=1", 1.0)]);
    // 200k entries over 2,000 label sets: many deadline checks in one walk.
    let keys: Vec<Vec<u8>> = (0..200_000)
        .map(|i| format!("k={}", i % 2000).into_bytes())
        .collect();
    let entries: Vec<(&[u8], f64)> = keys.iter().map(|k| (k.as_slice(), 1.0)).collect();
    write_file(tmp.path(), "b", 1, &entries);
    write_file(tmp.path(), "b", 2, &[(b"k=1", 0.5)]);
    let mut cut = 0;
    for budget_us in [0u64, 50, 200, 1_000, 5_000, 20_000, 100_000, 10_000_000] {
        for s in [StrategySet::NONE, StrategySet::all()] {
            let mut exporter = Exporter::new(tmp.path(), reg.clone(), s)
                .with_scrape_budget(std::time::Duration::from_micros(budget_us));
            let mut out = Vec::new();
            exporter.export_into(&mut out).unwrap();
            let report = exporter.last_report();
            let skipped: Vec<_> = report.files.iter().map(|f| f.path.clone()).collect();
            assert!(report.files.iter().all(|f| f.reason == FileSkip::Deadline));
            let rest = store_without(tmp.path(), &skipped);
            let want = promlab::reference::exposition::export(rest.path(), &reg).unwrap();
            assert!(
                out == want,
                "budget {budget_us} µs, {s}: {}",
                String::from_utf8_lossy(&out)
            );
            if budget_us == 0 {
                assert_eq!(skipped.len(), 3, "{s}");
            }
            cut += usize::from(skipped.contains(&file_path(tmp.path(), "b", 1)));
        }
    }
    assert!(cut >= 2, "the big file was never cut");
}

/// A file locked when first reached is set aside, the
/// metric's other files are read, and it is tried again: released within
/// the retry's wait, it is folded in its own place in file order (the sum
/// below depends on the order), so the exposition is the reference's.
#[test]
fn a_file_locked_for_a_while_is_read_after_the_others_in_its_place() {
    use std::os::fd::AsRawFd;
    let tmp = tempfile::tempdir().unwrap();
    let reg = registry(r#"{"name": "c", "type": "counter", "help": "h", "aggregation": "sum"}"#);
    // Summed in file order: ((1e16 + 1) + 1) - 1e16 = 0, as 1e16 + 1 rounds to
    // 1e16; with file 2 folded last, it would be 1.
    write_file(tmp.path(), "c", 1, &[(b"a=x", 1e16)]);
    write_file(tmp.path(), "c", 2, &[(b"a=x", 1.0), (b"a=y", 1.0)]);
    write_file(tmp.path(), "c", 3, &[(b"a=x", 1.0)]);
    write_file(tmp.path(), "c", 4, &[(b"a=x", -1e16), (b"a=z", 1.0)]);
    let want = promlab::reference::exposition::export(tmp.path(), &reg).unwrap();
    assert!(String::from_utf8_lossy(&want).contains("c{a=\"x\"} 0.0"));
    let mut folded_in_place = 0;
    for attempt in 0..10 {
        for s in [StrategySet::NONE, StrategySet::all()] {
            let held = std::fs::File::open(file_path(tmp.path(), "c", 2)).unwrap();
            promlab::format::storefile::flock(held.as_raw_fd(), libc::LOCK_EX).unwrap();
            let release = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(25));
                drop(held);
            });
            let (out, report) = export_with_report(tmp.path(), &reg, s).unwrap();
            release.join().unwrap();
            if report.is_clean() {
                assert!(out == want, "attempt {attempt}, {s}");
                folded_in_place += 1;
            } else {
                // A loaded machine can keep the releasing thread away past
                // the retry: then the file is left out whole, and counted.
                assert_eq!(report.files.len(), 1);
                assert_eq!(report.files[0].reason, FileSkip::Locked);
                let rest = store_without(tmp.path(), &[file_path(tmp.path(), "c", 2)]);
                let without = promlab::reference::exposition::export(rest.path(), &reg).unwrap();
                assert!(out == without, "attempt {attempt}, {s}");
            }
        }
        if folded_in_place >= 2 {
            break;
        }
    }
    assert!(
        folded_in_place >= 2,
        "the retry never found the file released"
    );
}

mod hostile_keys {
    use super::*;
    use proptest::prelude::*;

    /// Raw key components: good ones, and the ones Prometheus would refuse
    /// once decoded (non-UTF-8 values, reserved and invalid names), bad
    /// escapes, and repeated names.
    fn component() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "code=200",
            "code=500",
            "path=%2Fa+b",
            "path=caf%C3%A9",
            "path=%FF%FE",
            "path=%C3",
            "v=%ED%A0%80",
            "__name__=x",
            "__a=1",
            "_ok=1",
            "1st=x",
            "a-b=1",
            "%61=1",
            "=1",
            "code",
            "code=%ZZ",
            "le=1",
            "pid=7",
            "z=%00",
        ])
    }

    /// A raw key of 0 to 3 components, sometimes padded past 8 spaces.
    fn key() -> impl Strategy<Value = (String, bool)> {
        (
            prop::collection::vec(component(), 0..4),
            prop::bool::weighted(0.1),
        )
            .prop_map(|(parts, overpadded)| (parts.join("&"), overpadded))
    }

    fn file(keys: &[(String, bool)], values: &[f64]) -> Vec<u8> {
        let mut bytes = vec![0u8; 8];
        for ((key, overpadded), value) in keys.iter().zip(values) {
            let mut entry = new_entry(key.as_bytes());
            if *overpadded {
                let len = i32::from_le_bytes(entry[..4].try_into().unwrap()) + 8;
                let at = 4 + key.len();
                entry.splice(at..at, *b"        ");
                entry[..4].copy_from_slice(&len.to_le_bytes());
            }
            let at = entry.len() - 16;
            entry[at..at + 8].copy_from_slice(&value.to_le_bytes());
            bytes.extend_from_slice(&entry);
        }
        let used = bytes.len() as i32;
        bytes[..4].copy_from_slice(&used.to_le_bytes());
        bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Whatever raw keys the files hold, every combination (one-shot and
        /// long-lived) prints the reference's exposition, which holds only
        /// lines Prometheus accepts, and counts the same skips.
        #[test]
        fn every_combination_serves_only_valid_labels(
            files in prop::collection::vec(
                prop::collection::vec((key(), -5.0f64..5.0), 0..6),
                1..4,
            ),
            kind in prop::sample::select(vec!["counter", "histogram", "summary"]),
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let reg = registry(&format!(
                r#"{{"name": "m", "type": "{kind}", "help": "h", "aggregation": "sum"}}"#
            ));
            for (i, entries) in files.iter().enumerate() {
                let keys: Vec<(String, bool)> = entries.iter().map(|(k, _)| k.clone()).collect();
                let values: Vec<f64> = entries.iter().map(|(_, v)| *v).collect();
                std::fs::write(file_path(tmp.path(), "m", i as u32 + 1), file(&keys, &values)).unwrap();
            }
            export_everywhere(tmp.path(), &reg);
        }
    }
}
