//! `promlab dump` against the real binary: client_ruby's own files (both
//! revisions), a fold file, and hand-corrupted copies — every entry shown,
//! with what is corrupt and why, as text and as JSON lines.

#[path = "../../../tests/common/mod.rs"]
mod common;

use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

fn dump(store: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args(["dump", "--store", store.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.stderr.is_empty() || !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), String::from_utf8(out.stdout).unwrap())
}

fn records(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn copy_store(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// The counter's entries, summed per label set across processes, are the
/// values client_ruby's own exporter printed; every file and entry is there,
/// in both formats.
#[test]
fn client_rubys_files_dump_whole() {
    for (case, _) in common::RUBY_CASES {
        let dir = common::fixtures().join("ruby-dfs").join(case);
        let store = dir.join("store");
        let (ok, text) = dump(&store, &["--json"]);
        assert!(ok);
        let records = records(&text);
        let files: Vec<&Value> = records.iter().filter(|r| r["record"] == "file").collect();
        assert_eq!(files.len(), std::fs::read_dir(&store).unwrap().count());
        let entries: Vec<&Value> = records.iter().filter(|r| r["record"] == "entry").collect();
        let counted: u64 = files.iter().map(|f| f["entries"].as_u64().unwrap()).sum();
        assert_eq!(entries.len() as u64, counted);
        assert!(entries.len() > 100, "{case}");
        assert!(entries.iter().all(|e| e.get("corrupt").is_none()), "{case}");
        assert!(files.iter().all(|f| f["error"].is_null()), "{case}");

        let expected = std::fs::read_to_string(dir.join("expected.prom")).unwrap();
        let mut sums: HashMap<String, f64> = HashMap::new();
        for e in entries
            .iter()
            .filter(|e| e["metric"] == "http_requests_total")
        {
            let labels = e["labels"].as_object().unwrap();
            let (code, path) = (&labels["code"], &labels["path"]);
            let line = format!("http_requests_total{{code={code},path={path}}}");
            *sums.entry(line).or_default() += e["value"].as_f64().unwrap();
        }
        if case.starts_with("all-types") {
            assert!(!sums.is_empty());
        }
        for (line, sum) in sums {
            let want: f64 = expected
                .lines()
                .find_map(|l| l.strip_prefix(line.as_str())?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("{case}: {line} not in expected.prom"))
                .parse()
                .unwrap();
            assert_eq!(sum, want, "{case}: {line}");
        }

        // Text: a header per file, a line per entry.
        let (ok, text) = dump(&store, &[]);
        assert!(ok);
        assert_eq!(
            text.lines().filter(|l| l.starts_with("# ")).count(),
            files.len()
        );
        assert_eq!(
            text.lines().filter(|l| !l.starts_with("# ")).count(),
            entries.len()
        );
    }
}

/// Hand-corrupted copies: a bad key, a reserved label, a `used` past the
/// end, a cut inside an entry, a zeroed length, garbage — each entry that
/// can be read is shown, each one a scrape skips says why, and the file's
/// own fault is named. Files named on the command line only are dumped.
#[test]
fn corrupt_and_truncated_files_show_what_can_be_read() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    copy_store(
        &common::fixtures().join("ruby-dfs/all-types-v5-uri/store"),
        &store,
    );
    let name = "metric_http_requests_total___22532.bin";
    let path = store.join(name);
    let good = std::fs::read(&path).unwrap();
    let (_, text) = dump(&store, &["--json", name]);
    let before = records(&text);
    let n = before[0]["entries"].as_u64().unwrap() as usize;
    assert!(n >= 3);
    assert_eq!(before.len(), n + 1);
    let second = before[2]["offset"].as_u64().unwrap() as usize;
    let third = before[3]["offset"].as_u64().unwrap() as usize;

    // The first key's first byte made non-ASCII; the second's name made `__x`.
    let mut bytes = good.clone();
    bytes[12] = 0xff;
    bytes[second + 4..second + 7].copy_from_slice(b"__x");
    std::fs::write(&path, &bytes).unwrap();
    let (ok, text) = dump(&store, &["--json", name]);
    assert!(ok);
    let records = records(&text);
    assert_eq!(records.len(), n + 1, "{text}");
    assert_eq!(records[0]["corrupt_entries"], 2);
    assert_eq!(records[1]["corrupt"], "bad_key");
    assert!(records[1]["error"].as_str().unwrap().contains("non-ASCII"));
    assert_eq!(records[2]["corrupt"], "reserved_label_name");
    assert!(records[3]["labels"].is_object());
    let (_, text) = dump(&store, &[name]);
    assert!(text.contains("CORRUPT bad_key"), "{text}");
    assert!(text.contains("(2 corrupt)"), "{text}");

    // Cut inside the third entry: two entries, and the file says why.
    std::fs::write(&path, &good[..third + 6]).unwrap();
    let (ok, text) = dump(&store, &["--json", name]);
    assert!(ok);
    let records: Vec<Value> = self::records(&text);
    assert_eq!(records.len(), 3, "{text}");
    let error = records[0]["error"].as_str().unwrap();
    assert!(error.contains("truncated"), "{error}");

    // A zero length where the third entry starts: the walk stops there.
    let mut bytes = good.clone();
    bytes[third..third + 4].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    let records = self::records(&dump(&store, &["--json", name]).1);
    assert_eq!(records.len(), 3);
    assert!(records[0]["error"]
        .as_str()
        .unwrap()
        .contains("key length 0"));

    // Garbage: a bad `used`; too short for a header; an empty file.
    for (bytes, says) in [
        (&[5u8, 0, 0, 0, 0, 0, 0, 0][..], "bad used = 5"),
        (&[1u8, 2][..], "no header"),
    ] {
        std::fs::write(&path, bytes).unwrap();
        let records = self::records(&dump(&store, &["--json", name]).1);
        assert!(
            records[0]["error"].as_str().unwrap().contains(says),
            "{records:?}"
        );
    }
    std::fs::write(&path, b"").unwrap();
    let records = self::records(&dump(&store, &["--json", name]).1);
    assert_eq!(records.len(), 1);

    // A file that is not there: said, and the exit status says so too,
    // after the others named are dumped.
    let (ok, text) = dump(
        &store,
        &["metric_nope___1.bin", "metric_free_slots___22531.bin"],
    );
    assert!(!ok);
    assert!(text.contains("metric_nope___1.bin: cannot read"), "{text}");
    assert!(text.contains("free_slots{"), "{text}");
}

/// A fold file (exited processes' files folded by `promlab fold`) dumps as
/// one, its values the sums of what it folded.
#[test]
fn a_fold_file_dumps_as_one() {
    use promlab::format::registry::Registry;
    use promlab::shared::strategy::StrategySet;
    use promlab::write::{Client, ClientConfig};
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    std::fs::create_dir(&store).unwrap();
    let json = r#"{"metrics": [{"name": "c", "type": "counter", "help": "C", "labels": ["a"], "aggregation": "sum"}]}"#;
    let registry_file = tmp.path().join("registry.json");
    std::fs::write(&registry_file, json).unwrap();
    let registry = Registry::from_json(json).unwrap();
    for pid in [11u32, 12, 13] {
        let config = ClientConfig {
            dialect: Default::default(),
            strategies: StrategySet::NONE,
            pid_override: Some(pid),
        };
        let mut client = Client::new(&store, &registry, config).unwrap();
        let c = client.metric("c").unwrap();
        client.increment(c, &[("a", "x")], pid as f64).unwrap();
    }
    let folded = Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args(["fold", "--store", store.to_str().unwrap()])
        .args(["--registry", registry_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(folded.status.success(), "{folded:?}");
    let records = records(&dump(&store, &["--json"]).1);
    assert_eq!(records.len(), 2, "{records:?}");
    assert_eq!(records[0]["fold"], true);
    assert_eq!(records[1]["value"], 36.0);
    assert_eq!(records[1]["labels"]["a"], "x");
}
