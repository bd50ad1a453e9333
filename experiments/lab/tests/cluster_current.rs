//! The cluster's schema, inserts and queries on a current ClickHouse (PyPI `chdb`'s engine,
//! served on loopback by `experiments/peers/chdb_http.py`) give what they give on ClickHouse
//! 18.16 (a `clickhouse-server` node): the same statements create the tables, the same
//! `RowBinary` batches go in, and the rows read back, every window's answer, a group's
//! answers over its windows and the server-side `sumMap` merge are equal, byte for byte.
//! The 18.16 node's answers are the ones tests/cluster.rs proves equal to one receiver's.

#[path = "../../../tests/common/mod.rs"]
mod common;

use promlab::ingest::distributed::PaneRows;
use promlab::ingest::plan::Aggregation;
use promlab_lab::cluster::client::ClickHouse;
use promlab_lab::cluster::local::{self, LocalCluster};
use promlab_lab::cluster::query;
use promlab_lab::cluster::schema::{Batch, Event, Origin, Schema, PANE_BINS_COLUMNS};
use promlab_lab::cluster::shards::Shards;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const WINDOW_MS: i64 = 60_000;
const FIRST_WINDOW: i64 = 1_700_000_040_000;
const WINDOWS: i64 = 4;

/// `chdb_http.py`, stopped (its stdin closed, then killed) when dropped.
struct Chdb {
    child: Child,
    url: String,
}

impl Drop for Chdb {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The peers' venv's python3 when it has chDB, else the system's; `None` without chDB.
fn python_with_chdb() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../peers/.venv/bin/python3");
    let python = if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    };
    let ok = Command::new(&python)
        .args(["-c", "import chdb"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(python)
}

fn start_chdb(python: &Path, dir: &Path) -> Chdb {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../peers/chdb_http.py");
    let mut child = Command::new(python)
        .arg(script)
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start chdb_http.py");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let mut chdb = Chdb {
        child,
        url: String::new(),
    };
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("chdb_http.py says where it listens within 60 s");
    let port = line
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("chdb_http.py's first line: {line:?}"));
    chdb.url = format!("http://127.0.0.1:{}", port.trim());
    chdb
}

/// A small deterministic generator (no seeds to carry between the two engines).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn bins(rng: &mut Lcg) -> Vec<(i32, u64)> {
    let mut keys: Vec<i32> = (0..rng.below(12))
        .map(|_| rng.below(1_400) as i32 - 700)
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter()
        .map(|k| {
            let bits = 1 + rng.below(40);
            (k, 1 + rng.below(1 << bits))
        })
        .collect()
}

/// Group keys as the receiver writes them (JSON of the labels), and some no JSON writer makes.
fn group_keys() -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = (0..30).map(|g| format!("\"g{g}\"").into_bytes()).collect();
    keys.extend([
        b"".to_vec(),
        b"\"quote ' back \\\\ slash\"".to_vec(),
        vec![0xff, 0x00, b'\t', b'\n'],
    ]);
    keys
}

/// Three receivers' panes and lives: one stopped cleanly, one that lost a window past its
/// queue's bound and refused samples, one restarted after an unclean stop; rows repeated.
fn batches() -> Vec<Batch> {
    let mut rng = Lcg(0x5eed);
    let keys = group_keys();
    let mut out = Vec::new();
    for (receiver, incarnations) in [("r0", 1u64), ("r1", 1), ("r2", 2)] {
        for inc in 0..incarnations {
            let who = Origin {
                receiver: receiver.into(),
                incarnation: 1_000 + inc,
            };
            let mut batch = Batch::default();
            let at = FIRST_WINDOW + inc as i64 * 2 * WINDOW_MS;
            batch.event(&who, Event::Started, at, "", 0, 0, 0);
            // The first incarnation of r2 dies after its first window.
            let windows = if receiver == "r2" && inc == 0 {
                1
            } else {
                WINDOWS
            };
            let first = if receiver == "r2" && inc == 1 { 2 } else { 0 };
            for w in first..windows {
                let start = FIRST_WINDOW + w * WINDOW_MS;
                if receiver == "r1" && w == 2 {
                    batch.event(&who, Event::Lost, at, "data", start, 0, 777);
                    continue;
                }
                for key in &keys {
                    if rng.below(4) == 0 {
                        continue;
                    }
                    let pane = PaneRows {
                        positive: bins(&mut rng),
                        negative: bins(&mut rng),
                        zero_count: rng.below(3),
                        min: -(rng.below(1 << 40) as f64) / 7.0,
                        max: if rng.below(9) == 0 {
                            f64::MAX
                        } else {
                            rng.below(1 << 50) as f64 / 3.0
                        },
                        dropped: rng.below(2),
                    };
                    batch.pane(&who, "data", start, key, 0.01, &pane);
                }
                if receiver == "r1" && w == 1 {
                    batch.event(&who, Event::Refused, at, "data", start, 0, 42);
                }
                batch.event(&who, Event::Progress, at, "", 0, start + WINDOW_MS, 0);
            }
            if receiver == "r0" {
                batch.event(&who, Event::Stopped, at, "", 0, 0, 0);
            }
            out.push(batch);
        }
    }
    out
}

fn aggregation() -> Aggregation {
    Aggregation {
        id: "data".into(),
        metric: "data".into(),
        matchers: Default::default(),
        group_by: vec!["label_0".into()],
        window_secs: (WINDOW_MS / 1000) as u64,
        relative_accuracy: 0.01,
        quantiles: vec![0.5, 0.9, 0.99],
    }
}

/// Everything the engine at `url` gives back for the batches: the rows, every window's
/// answer (and the newest's), two groups' answers over every window.
fn readings(url: &str) -> Vec<(String, Vec<u8>)> {
    let ch = ClickHouse::new(url, Duration::from_secs(60)).unwrap();
    let schema = Schema::default();
    schema.create(&ch).expect("create the tables");
    // Created twice: every statement is `IF NOT EXISTS`.
    schema.create(&ch).expect("create the tables again");
    for batch in batches() {
        batch.insert(&ch, &schema).expect("insert");
    }
    // A repeated insert.
    batches()[1].insert(&ch, &schema).expect("insert again");
    let agg = aggregation();
    let mut out = Vec::new();
    let rows = format!(
        "SELECT DISTINCT {PANE_BINS_COLUMNS} FROM {} ORDER BY aggregation, window_start, \
         group_key, receiver, incarnation FORMAT RowBinary",
        schema.table("pane_bins")
    );
    out.push(("rows".into(), ch.execute(&rows, &[]).expect("read rows")));
    for w in (0..WINDOWS)
        .map(|w| Some(FIRST_WINDOW + w * WINDOW_MS))
        .chain([None])
    {
        let answer = query::answer(&ch, &schema, &agg, w).expect("answer");
        out.push((format!("window {w:?}"), answer.json));
    }
    // The server-side merge `promlab cluster measure` times (`sumMap`), in a fixed order.
    for w in 0..WINDOWS {
        let sql = query::server_merge_sql(&schema, &agg, FIRST_WINDOW + w * WINDOW_MS);
        let inner = sql.strip_suffix(" FORMAT RowBinary").unwrap();
        let sql = format!("SELECT * FROM ({inner}) ORDER BY group_key FORMAT RowBinary");
        let merged = ch.execute(&sql, &[]).expect("server-side merge");
        out.push((format!("server merge of window {w}"), merged));
    }
    // A group's answers through the `Distributed` table and from the shard's local table.
    let shards = Shards::resolve(std::slice::from_ref(&ch), &schema).expect("the node's shard");
    for key in [&b"\"g3\""[..], &[0xff, 0x00, b'\t', b'\n']] {
        let newest = Some(FIRST_WINDOW + (WINDOWS - 1) * WINDOW_MS);
        for (how, shards) in [("distributed", None), ("local", Some(&shards))] {
            let answers =
                query::group_answers(&ch, shards, &schema, &agg, key, newest, WINDOWS as u64)
                    .expect("group answers");
            for a in answers {
                out.push((format!("group {key:?} {:?} {how}", a.window_start), a.json));
            }
        }
    }
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(2_000)]).into_owned()
}

#[test]
fn a_current_clickhouse_answers_as_18_16_does() {
    if local::server_command().is_none() {
        common::skip(
            "clickhouse-server (the cluster tests)",
            "apt-get install clickhouse-server",
        );
        return;
    }
    let Some(python) = python_with_chdb() else {
        common::skip(
            "chdb, a current ClickHouse engine (the cluster's current-engine test)",
            "experiments/peers/install.sh --with-clickhouse",
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let chdb = start_chdb(&python, &dir.path().join("chdb"));
    let ports = local::free_node_ports(1);
    let mut cluster = LocalCluster::start(
        &dir.path().join("cluster"),
        &ports,
        "promlab",
        Duration::from_secs(90),
    )
    .expect("start a ClickHouse 18.16 node");
    let (old, current) = std::thread::scope(|s| {
        let current = s.spawn(|| readings(&chdb.url));
        (readings(&cluster.nodes[0].url()), current.join().unwrap())
    });
    cluster.stop(Duration::from_secs(30));
    assert_eq!(old.len(), current.len());
    for ((what, a), (_, b)) in old.iter().zip(&current) {
        assert!(
            a == b,
            "{what}: 18.16 gives\n{}\na current ClickHouse gives\n{}",
            text(a),
            text(b)
        );
    }
    // Not equal by being empty: rows, every group, the incomplete windows, the refused samples.
    assert!(
        old[0].1.len() > 10_000,
        "rows read back: {}",
        old[0].1.len()
    );
    let answers: Vec<String> = old[1..]
        .iter()
        .filter(|(what, _)| !what.starts_with("server merge"))
        .map(|(_, a)| String::from_utf8_lossy(a).into_owned())
        .collect();
    for needle in [
        "\"g29\"",
        "\"label_0\":\"\\u0000\\t\\n\"",
        "queue to ClickHouse",
        "unclean stop",
        "\"dropped\":42",
    ] {
        assert!(
            answers.iter().any(|a| a.contains(needle)),
            "no answer holds {needle}: {}",
            text(answers[0].as_bytes())
        );
    }
}
