//! N receivers answering as one, on a real cluster: three `clickhouse-server` processes (one shard
//! each, loopback ports picked at run time), receivers writing to them with
//! `serve --clickhouse`, the feed sharded over them by hashmod, and `promlab
//! query --clickhouse` compared, byte for byte, with one receiver fed the
//! whole stream. Then the faults: a repeated insert, a node down, ClickHouse
//! stopped under a running feed, a receiver SIGKILLed.
//!
//! Each test starts its own cluster (about a second) and they run one at a
//! time (a lock), so two clusters never load the machine at once.

#[path = "support/cluster.rs"]
mod cluster_support;
#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use cluster_support::*;
use promlab::shared::strategy::{Stage, StrategySet};
use promlab_lab::cluster::client::ClickHouse;
use promlab_lab::cluster::local::{self, LocalCluster};
use promlab_lab::cluster::schema::Schema;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;
use support::Served;

/// One cluster at a time.
static SERIAL: Mutex<()> = Mutex::new(());

struct Env {
    dir: tempfile::TempDir,
    cluster: LocalCluster,
    plan: PathBuf,
    database: String,
}

/// A fresh 3-node cluster, or `None` (a skip; a failure under `CI`) without ClickHouse.
fn env(database: &str) -> Option<Env> {
    if local::server_command().is_none() {
        common::skip(
            "clickhouse-server (the cluster tests)",
            "apt-get install clickhouse-server",
        );
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let ports = local::free_node_ports(3);
    let cluster = LocalCluster::start(
        &dir.path().join("cluster"),
        &ports,
        "promlab",
        Duration::from_secs(90),
    )
    .expect("start a local ClickHouse cluster");
    let plan = dir.path().join("plan.toml");
    std::fs::write(&plan, PLAN).unwrap();
    Some(Env {
        dir,
        cluster,
        plan,
        database: database.to_string(),
    })
}

impl Env {
    fn url(&self, node: usize) -> String {
        self.cluster.nodes[node].url()
    }

    fn schema(&self) -> Schema {
        Schema {
            database: self.database.clone(),
            cluster: "promlab".into(),
        }
    }

    fn ch(&self, node: usize) -> ClickHouse {
        ClickHouse::new(&self.url(node), Duration::from_secs(60)).unwrap()
    }

    /// A receiver writing to node `node` as `id`.
    fn receiver(&self, node: usize, id: &str, strategies: &str, extra: &[&str]) -> Served {
        let plan = self.plan.to_str().unwrap().to_string();
        let url = self.url(node);
        let mut args = vec![
            "--plan",
            &plan,
            "--max-ahead-secs",
            "0",
            "--strategies",
            strategies,
            "--clickhouse",
            &url,
            "--clickhouse-database",
            &self.database,
            "--receiver-id",
            id,
        ];
        args.extend_from_slice(extra);
        support::serve(&args)
    }

    /// The one receiver fed everything: no ClickHouse.
    fn single(&self, strategies: &str) -> Served {
        single_receiver(&self.plan, strategies)
    }

    /// `promlab query --clickhouse` through node `node`: (success, stdout, stderr).
    fn query(&self, node: usize, window: Option<i64>) -> (bool, Vec<u8>, String) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_promlab"));
        command.args(["query", "--clickhouse", &self.url(node), "--agg", "data"]);
        command.args([
            "--plan",
            self.plan.to_str().unwrap(),
            "--clickhouse-database",
            &self.database,
        ]);
        if let Some(w) = window {
            command.args(["--window", &w.to_string()]);
        }
        let out = command.output().expect("run promlab query");
        (
            out.status.success(),
            out.stdout,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// Three receivers over three nodes answer every closed
/// window with the bytes of one receiver fed the whole stream, under every
/// one of the 16 ingest strategy sets; and the windows still open when the
/// three stop cleanly (written as they stop) answer as the one's open windows do.
#[test]
fn three_receivers_answer_as_one_for_every_ingest_strategy_set() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(env) = env("sets") else { return };
    let ticks = 12;
    for (k, set) in StrategySet::combinations(Stage::Ingest)
        .into_iter()
        .enumerate()
    {
        let strategies = set.to_string();
        // Each set its own hour, so its windows are its own.
        let start_ms = 1_700_000_000_000 + k as i64 * 3_600_000;
        let mut receivers: Vec<Served> = (0..3)
            .map(|n| env.receiver(n, &format!("set{k}-r{n}"), &strategies, &[]))
            .collect();
        let single = env.single(&strategies);
        let urls: Vec<String> = receivers.iter().map(write_url).collect();
        assert!(
            feed(&urls, start_ms, 0..ticks),
            "the sharded feed failed ({strategies})"
        );
        assert!(
            feed(&[write_url(&single)], start_ms, 0..ticks),
            "the single feed failed"
        );
        let closed = closed_windows(start_ms, ticks);
        assert_eq!(closed.len(), 5);
        for r in &receivers {
            wait_written(r, closed.last().unwrap() + WINDOW_MS);
        }
        for (i, &w) in closed.iter().enumerate() {
            let (ok, got, err) = env.query(i % 3, Some(w));
            assert!(ok, "{strategies}: query of window {w} failed: {err}");
            let want = answer(&single, w);
            assert!(want.starts_with(b"{\"aggregation\":\"data\",\"window_start_ms\":1"));
            assert_eq!(text(&got), text(&want), "{strategies}: window {w}");
        }
        // No --window: the newest window every receiver wrote, as the receiver's last closed.
        let (ok, got, err) = env.query(1, None);
        assert!(ok, "{err}");
        assert_eq!(
            text(&got),
            text(&support::get(single.addr, "/api/v1/quantiles?agg=data", &[]).body)
        );
        // A clean stop writes the windows still open; they answer as the one's open windows.
        for r in &mut receivers {
            assert!(r.terminate(Duration::from_secs(60)).success());
        }
        let open = closed.last().unwrap() + WINDOW_MS;
        let (ok, got, err) = env.query(0, Some(open));
        assert!(ok, "{err}");
        assert_eq!(
            text(&got),
            text(&answer(&single, open)),
            "{strategies}: open window {open}"
        );
        eprintln!(
            "cluster: strategies {strategies}: {} closed windows and the open one identical",
            closed.len()
        );
    }
}

/// A retried or repeated insert never changes an answer,
/// wherever the repeat lands. Every row the receivers wrote is inserted
/// again into its own node and into another shard's; the answers stay the
/// single receiver's, before and after the engine merges its parts.
#[test]
fn a_repeated_insert_never_changes_an_answer() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(env) = env("repeats") else { return };
    let start_ms = 1_700_000_000_000;
    let ticks = 12;
    let mut receivers: Vec<Served> = (0..3)
        .map(|n| env.receiver(n, &format!("r{n}"), "all", &[]))
        .collect();
    let single = env.single("all");
    let urls: Vec<String> = receivers.iter().map(write_url).collect();
    assert!(feed(&urls, start_ms, 0..ticks));
    assert!(feed(&[write_url(&single)], start_ms, 0..ticks));
    let closed = closed_windows(start_ms, ticks);
    for r in &receivers {
        wait_written(r, closed.last().unwrap() + WINDOW_MS);
    }
    for r in &mut receivers {
        r.terminate(Duration::from_secs(60));
    }
    let schema = env.schema();
    let columns = [
        (
            "pane_bins_local",
            promlab_lab::cluster::schema::PANE_BINS_COLUMNS,
        ),
        (
            "receivers_local",
            promlab_lab::cluster::schema::RECEIVERS_COLUMNS,
        ),
    ];
    let mut repeated = 0;
    for node in 0..3 {
        for (table, cols) in columns {
            let rows = env
                .ch(node)
                .execute(
                    &format!(
                        "SELECT {cols} FROM {} FORMAT RowBinary",
                        schema.table(table)
                    ),
                    &[],
                )
                .unwrap();
            repeated += rows.len();
            // Again where it was, and on the next shard.
            env.ch(node)
                .insert(&schema.table(table), cols, &rows)
                .unwrap();
            env.ch((node + 1) % 3)
                .insert(&schema.table(table), cols, &rows)
                .unwrap();
        }
    }
    assert!(repeated > 10_000, "{repeated} bytes of rows repeated");
    let check = |when: &str| {
        for &w in closed
            .iter()
            .chain([closed.last().unwrap() + WINDOW_MS].iter())
        {
            let (ok, got, err) = env.query(2, Some(w));
            assert!(ok, "{when}: {err}");
            assert_eq!(text(&got), text(&answer(&single, w)), "{when}: window {w}");
        }
    };
    check("rows written three times over two shards");
    for node in 0..3 {
        for (table, _) in columns {
            env.ch(node)
                .execute(
                    &format!("OPTIMIZE TABLE {} FINAL", schema.table(table)),
                    &[],
                )
                .unwrap();
        }
    }
    check("after the engine merged its parts");
    // One group over every window: each line the single receiver's answer with that group alone.
    let windows: Vec<i64> = closed
        .iter()
        .copied()
        .chain([closed.last().unwrap() + WINDOW_MS])
        .collect();
    for value in ["g0", "g7"] {
        let group = |newest: Option<i64>, nodes: &[usize]| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_promlab"));
            command.arg("query");
            for &node in nodes {
                command.args(["--clickhouse", &env.url(node)]);
            }
            command.args(["--agg", "data"]);
            command.args(["--plan", env.plan.to_str().unwrap()]);
            command.args(["--clickhouse-database", &env.database]);
            command.args(["--group", &format!("label_0={value}")]);
            if let Some(newest) = newest {
                command.args(["--window", &newest.to_string()]);
            }
            command.args(["--windows", &windows.len().to_string()]);
            let out = command.output().expect("run promlab query --group");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            out
        };
        let out = group(Some(*windows.last().unwrap()), &[1]);
        // Not told the newest window, it finds the same one; given every
        // node, it reads each shard's own tables, and answers the same.
        assert_eq!(text(&group(None, &[1]).stdout), text(&out.stdout));
        for newest in [None, Some(*windows.last().unwrap())] {
            assert_eq!(text(&group(newest, &[2, 0, 1]).stdout), text(&out.stdout));
        }
        let lines: Vec<serde_json::Value> = text(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), windows.len());
        for (line, &w) in lines.iter().zip(&windows) {
            let mut want: serde_json::Value = serde_json::from_slice(&answer(&single, w)).unwrap();
            want["groups"]
                .as_array_mut()
                .unwrap()
                .retain(|g| g["labels"]["label_0"] == value);
            assert_eq!(want["groups"].as_array().unwrap().len(), 1, "{want}");
            assert_eq!(line, &want, "group label_0={value}, window {w}");
        }
    }
}

/// A node down fails the query and names the shard — never a
/// silently partial quantile; back up, the answer is whole again.
#[test]
fn a_node_down_fails_the_query_naming_its_shard() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut env) = env("down") else { return };
    let start_ms = 1_700_000_000_000;
    let receivers: Vec<Served> = (0..3)
        .map(|n| env.receiver(n, &format!("r{n}"), "all", &[]))
        .collect();
    let urls: Vec<String> = receivers.iter().map(write_url).collect();
    assert!(feed(&urls, start_ms, 0..12));
    let closed = closed_windows(start_ms, 12);
    for r in &receivers {
        wait_written(r, closed.last().unwrap() + WINDOW_MS);
    }
    let (ok, whole, err) = env.query(0, Some(start_ms));
    assert!(ok, "{err}");
    let tcp = env.cluster.nodes[2].ports.tcp;
    env.cluster.nodes[2].kill();
    for entry in [0, 1] {
        let (ok, out, err) = env.query(entry, Some(start_ms));
        assert!(!ok, "a query with shard 3 down succeeded: {}", text(&out));
        assert!(out.is_empty(), "printed an answer: {}", text(&out));
        assert!(err.contains(&format!("shard 3 (127.0.0.1:{tcp})")), "{err}");
    }
    // The default window too.
    let (ok, _, err) = env.query(0, None);
    assert!(!ok && err.contains("shard 3"), "{err}");
    env.cluster.nodes[2].start(Duration::from_secs(90)).unwrap();
    let (ok, again, err) = env.query(0, Some(start_ms));
    assert!(ok, "{err}");
    assert_eq!(text(&again), text(&whole));
}

/// ClickHouse stopped and restarted under a running feed.
/// Within the queue's bound nothing is lost: the receivers retry, and every
/// window answers as the single receiver's. Past the bound, the windows
/// dropped are counted in `/metrics` and flagged in the answer with the
/// samples they lost, which is exactly what the answer lacks.
#[test]
fn clickhouse_stopped_under_a_running_feed_loses_nothing_within_the_bound() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut env) = env("restart") else {
        return;
    };
    let start_ms = 1_700_000_000_000;
    let receivers: Vec<Served> = (0..3)
        .map(|n| env.receiver(n, &format!("r{n}"), "all", &[]))
        .collect();
    let single = env.single("all");
    let urls: Vec<String> = receivers.iter().map(write_url).collect();
    let both = |ticks: std::ops::Range<u64>| {
        assert!(feed(&urls, start_ms, ticks.clone()));
        assert!(feed(&[write_url(&single)], start_ms, ticks));
    };
    both(0..6);
    // Node 2 (receiver r1's) stops; the feed runs on for ten windows.
    env.cluster.nodes[1].stop(Duration::from_secs(30));
    for chunk in 0..5 {
        both(6 + chunk * 4..10 + chunk * 4);
    }
    // A failed insert stays queued while the node is down.
    wait_metrics(
        &receivers[1],
        [
            "promlab_clickhouse_insert_failures_total",
            "promlab_clickhouse_queue_batches",
        ],
        |[failures, queued]| failures >= Some(1.0) && queued >= Some(1.0),
    );
    env.cluster.nodes[1].start(Duration::from_secs(90)).unwrap();
    let closed = closed_windows(start_ms, 26);
    for r in &receivers {
        wait_written(r, closed.last().unwrap() + WINDOW_MS);
        assert_eq!(
            metric(r, "promlab_clickhouse_windows_dropped_total"),
            Some(0.0)
        );
    }
    for &w in &closed {
        let (ok, got, err) = env.query(0, Some(w));
        assert!(ok, "window {w}: {err}");
        assert_eq!(text(&got), text(&answer(&single, w)), "window {w}");
    }

    // Live receivers that have not written a window make it incomplete: these stop cleanly.
    for mut r in receivers {
        assert!(r.terminate(Duration::from_secs(60)).success());
    }

    // Past the bound: b2 holds about one window's batch; its node stops for six windows.
    let start_ms = 1_700_100_000_000;
    // Only b2's queue is that small: a receiver whose node is up but slow on a
    // loaded machine must not meet its bound.
    let bounded: Vec<Served> = (0..3)
        .map(|n| {
            let queue: &[&str] = if n == 2 {
                &["--clickhouse-queue-bytes", "12000"]
            } else {
                &[]
            };
            env.receiver(n, &format!("b{n}"), "all", queue)
        })
        .collect();
    let single = env.single("all");
    let urls: Vec<String> = bounded.iter().map(write_url).collect();
    let both = |ticks: std::ops::Range<u64>| {
        assert!(feed(&urls, start_ms, ticks.clone()));
        assert!(feed(&[write_url(&single)], start_ms, ticks));
    };
    both(0..4);
    wait_written(&bounded[2], start_ms + WINDOW_MS);
    env.cluster.nodes[2].stop(Duration::from_secs(30));
    for chunk in 0..6 {
        both(4 + chunk * 2..6 + chunk * 2);
        // Each close's batch meets a full queue or a dead node in turn.
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_metrics(
        &bounded[2],
        [
            "promlab_clickhouse_windows_dropped_total",
            "promlab_clickhouse_samples_dropped_total",
        ],
        |[windows, samples]| windows >= Some(1.0) && samples > Some(0.0),
    );
    env.cluster.nodes[2].start(Duration::from_secs(90)).unwrap();
    both(16..18);
    let closed = closed_windows(start_ms, 18);
    for r in &bounded {
        wait_written(r, closed.last().unwrap() + WINDOW_MS);
    }
    let (mut flagged, mut lost) = (0, 0u64);
    for &w in &closed {
        let (ok, got, err) = env.query(0, Some(w));
        let want = answer(&single, w);
        let count = |json: &[u8]| -> u64 {
            let v: serde_json::Value = serde_json::from_slice(json).unwrap();
            v["groups"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g["count"].as_u64().unwrap())
                .sum()
        };
        if ok {
            assert_eq!(text(&got), text(&want), "window {w}");
            continue;
        }
        // Flagged: names b2, says how many samples it lost, and lacks exactly those.
        assert!(err.contains("is incomplete") && err.contains("b2"), "{err}");
        let v: serde_json::Value = serde_json::from_slice(&got).unwrap();
        let incomplete = v["incomplete"].as_array().unwrap();
        assert_eq!(incomplete.len(), 1, "{v}");
        assert_eq!(incomplete[0]["receiver"], "b2");
        let samples = incomplete[0]["samples_lost"].as_u64().unwrap();
        assert_eq!(count(&want) - count(&got), samples, "window {w}");
        flagged += 1;
        lost += samples;
    }
    // Read again: a batch may also meet the queue still full just after the node is back.
    let dropped = metric(&bounded[2], "promlab_clickhouse_windows_dropped_total").unwrap();
    let samples_dropped = metric(&bounded[2], "promlab_clickhouse_samples_dropped_total").unwrap();
    assert_eq!(
        flagged as f64, dropped,
        "every dropped window flagged, no other"
    );
    assert_eq!(lost as f64, samples_dropped);
}

/// A receiver SIGKILLed and restarted (same id). Windows it
/// had written answer as before (nothing counted twice); the window it had
/// open is lost, flagged, and lacks exactly the samples it held; the window
/// its new life began in is flagged too (the cluster cannot tell whether the
/// dead one had samples of it) but lacks nothing; later ones are whole.
#[test]
fn a_receiver_killed_and_restarted_counts_no_window_twice() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(env) = env("kill") else { return };
    let start_ms = 1_700_000_000_000;
    let mut receivers: Vec<Served> = (0..3)
        .map(|n| env.receiver(n, &format!("r{n}"), "all", &[]))
        .collect();
    let single = env.single("all");
    let urls = |rs: &[Served]| -> Vec<String> { rs.iter().map(write_url).collect() };
    assert!(feed(&urls(&receivers), start_ms, 0..12));
    assert!(feed(&[write_url(&single)], start_ms, 0..12));
    let closed = closed_windows(start_ms, 12);
    for r in &receivers {
        wait_written(r, closed.last().unwrap() + WINDOW_MS);
    }
    let before: Vec<Vec<u8>> = closed.iter().map(|&w| env.query(0, Some(w)).1).collect();
    // SIGKILL r1 with window start+10 s open (ticks 10 and 11), then start it again.
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(receivers[1].pid() as i32, libc::SIGKILL) };
    receivers[1] = env.receiver(1, "r1", "all", &[]);
    assert!(feed(&urls(&receivers), start_ms, 12..24));
    assert!(feed(&[write_url(&single)], start_ms, 12..24));
    let all_closed = closed_windows(start_ms, 24);
    for r in &receivers {
        wait_written(r, all_closed.last().unwrap() + WINDOW_MS);
    }
    for (&w, before) in closed.iter().zip(&before) {
        let (ok, got, err) = env.query(1, Some(w));
        assert!(ok, "{err}");
        assert_eq!(text(&got), text(before), "window {w} changed");
        assert_eq!(text(&got), text(&answer(&single, w)), "window {w}");
    }
    let lost_window = start_ms + 10_000;
    let shards = promlab_lab::feed::Sharding::default().shards(&workload(start_ms), 3);
    let r1_series = shards.iter().filter(|&&s| s == 1).count() as u64;
    let count = |json: &[u8]| -> u64 {
        let v: serde_json::Value = serde_json::from_slice(json).unwrap();
        v["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["count"].as_u64().unwrap())
            .sum()
    };
    for &w in &all_closed[closed.len()..] {
        let (ok, got, err) = env.query(2, Some(w));
        let want = answer(&single, w);
        if w == lost_window || w == lost_window + WINDOW_MS {
            assert!(
                !ok && err.contains("r1") && err.contains("unclean"),
                "window {w}: {err}"
            );
            let v: serde_json::Value = serde_json::from_slice(&got).unwrap();
            assert_eq!(v["incomplete"][0]["receiver"], "r1");
            let missing = if w == lost_window { 2 * r1_series } else { 0 };
            assert_eq!(count(&want) - count(&got), missing, "window {w}");
        } else {
            assert!(ok, "window {w}: {err}");
            assert_eq!(text(&got), text(&want), "window {w}");
        }
    }
    drop(env.dir);
}
