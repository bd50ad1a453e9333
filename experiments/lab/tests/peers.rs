//! `promlab ablate --peers` adds peer rows to the report: the render crates
//! always (they are dependencies), Python's prometheus_client when
//! `experiments/peers/install.sh` has installed it (`.ci/run` does; elsewhere,
//! without it, the test checks the skip is reported and says so, and under `CI`
//! that fails).

#[path = "../../../tests/common/mod.rs"]
mod common;

use promlab_lab::harness::peers::python_export::{prometheus_client_installed, python};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// `<dir>/<scenario>.csv` as rows keyed by arm, each a column → value map.
fn rows(dir: &Path, scenario: &str) -> HashMap<String, HashMap<String, String>> {
    csv::Reader::from_path(dir.join(format!("{scenario}.csv")))
        .unwrap()
        .deserialize()
        .map(|row| {
            let row: HashMap<String, String> = row.unwrap();
            (row["arm"].clone(), row)
        })
        .collect()
}

fn assert_peer_row(row: &HashMap<String, String>, min_units: u64) {
    assert_eq!(row["strategies"], "peer");
    assert_eq!(row["measure"], "wall");
    assert_eq!(row["unit"], "lines");
    assert!(row["units"].parse::<u64>().unwrap() >= min_units, "{row:?}");
    assert!(row["median_ns"].parse::<u64>().unwrap() > 0, "{row:?}");
    assert!(row["ratio_to_all"].parse::<f64>().unwrap() > 0.0, "{row:?}");
}

#[test]
fn ablate_with_peers_writes_peer_rows() {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args([
            "ablate",
            "seed-repro",
            "rabbitmq-per-object",
            "--quick",
            "--peers",
            "--repeats",
            "1",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );

    // The crates: always there, and their answers were checked (else skipped).
    let render = rows(out.path(), "rabbitmq-per-object");
    for arm in ["peer:crate-prometheus-client", "peer:crate-prometheus"] {
        let row = render
            .get(arm)
            .unwrap_or_else(|| panic!("no {arm} row:\n{stdout}"));
        assert_peer_row(row, 63_000);
        assert_eq!(row["rss_kib"], "", "in-process: RSS not attributed");
    }

    let export = rows(out.path(), "seed-repro");
    if prometheus_client_installed() {
        let row = export
            .get("peer:python-prometheus-client")
            .unwrap_or_else(|| panic!("no prometheus_client row:\n{stdout}"));
        assert_peer_row(row, 2_100);
        assert!(row["rss_kib"].parse::<u64>().unwrap() > 0, "{row:?}");
    } else {
        common::skip(
            "Python prometheus_client, so only its skip is checked",
            "experiments/peers/install.sh",
        );
        assert!(!export.contains_key("peer:python-prometheus-client"));
        assert!(
            stdout
                .contains("skipped peer:python-prometheus-client: prometheus_client not installed"),
            "{stdout}"
        );
    }
}

/// The Python peer's check really rejects a wrong answer: a missing series, a
/// changed value; and it accepts labels in another order and `le` printed
/// another way.
#[test]
fn python_check_rejects_mismatches() {
    if Command::new(python()).arg("--version").output().is_err() {
        common::skip(
            "python3, so no check of python_export.py's comparison",
            "apt-get install -y python3",
        );
        return;
    }
    let script = r#"
import sys
sys.path.insert(0, sys.argv[1])
from python_export import parse_exposition as parse, compare
ours = parse('# HELP q q\nq_bucket{db="a",le="1"} 2\nq_sum{db="a"} 0.6\nq_count{db="a"} 2\n')
same = parse('q_count{db="a"} 2.0\nq_bucket{le="1.0",db="a"} 2.0\nq_sum{db="a"} 0.6000000000000001\n')
assert compare(ours, same) == [], compare(ours, same)
missing = parse('q_bucket{db="a",le="1"} 2\nq_sum{db="a"} 0.6\n')
assert "missing" in compare(ours, missing)[0]
changed = parse('q_bucket{db="a",le="1"} 2\nq_sum{db="a"} 0.7\nq_count{db="a"} 2\n')
assert "differ" in compare(ours, changed)[0]
escaped = parse('m{s="a\\"b\\\\c\\nd"} 1\n')
assert list(escaped) == [("m", (("s", 'a"b\\c\nd'),))], escaped
print("ok")
"#;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../peers");
    let out = Command::new(python())
        .args(["-c", script])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stdout.starts_with(b"ok"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// client_ruby's own exporter, pristine, at 4.2.5 and 5.x: a peer row each on
/// `many-processes` (CPU time of the Ruby process), after its exposition of
/// the same directory matched the scenario's digest (else the peer is
/// reported as failed, and this test fails).
#[test]
fn client_ruby_peers_export_the_same_directory() {
    use promlab_lab::harness::peers::client_ruby::upstream_archive;
    let ruby = Command::new("ruby").arg("--version").output().is_ok();
    let sources = upstream_archive("client_ruby-v4.2.5.tar.gz").is_some()
        && upstream_archive("client_ruby-5.x-uri.tar.gz").is_some();
    if !ruby || !sources {
        common::skip(
            "ruby or the pristine client_ruby archives, so no client_ruby peer rows",
            "apt-get install -y ruby; the archives in ../shared/upstream/ or $PROMLAB_UPSTREAM",
        );
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args(["ablate", "many-processes", "--quick", "--peers"])
        .args(["--repeats", "1", "--strategies", "all", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let export = rows(out.path(), "many-processes");
    for arm in ["peer:client_ruby-4.2.5", "peer:client_ruby-5.x"] {
        let row = export
            .get(arm)
            .unwrap_or_else(|| panic!("no {arm} row:\n{stdout}"));
        assert_eq!(row["strategies"], "peer");
        assert_eq!(row["measure"], "cpu");
        assert_eq!(row["units"], "200", "{row:?}");
        assert!(row["median_ns"].parse::<u64>().unwrap() > 0, "{row:?}");
        assert!(row["rss_kib"].parse::<u64>().unwrap() > 0, "{row:?}");
    }
}
