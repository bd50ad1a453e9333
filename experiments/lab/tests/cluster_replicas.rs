//! Replicas that survive a lost node, on a real replicated cluster: two
//! shards of two `clickhouse-server` replicas each and a ZooKeeper, all on
//! loopback ports picked at run time; two receivers, each given both replicas
//! of its shard (`--clickhouse A --clickhouse B`), and the answers compared,
//! byte for byte, with one receiver fed the whole stream. The faults, in turn
//! on one cluster (starting one costs seconds): a replica SIGKILLed under a
//! running feed, ZooKeeper down under a running feed, both replicas of a shard down.

#[path = "support/cluster.rs"]
mod cluster_support;
#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use cluster_support::*;
use promlab_lab::cluster::client::ClickHouse;
use promlab_lab::cluster::local::{self, Layout, LocalCluster};
use promlab_lab::cluster::schema::{Schema, PANE_BINS_COLUMNS, RECEIVERS_COLUMNS};
use promlab_lab::cluster::zookeeper::{self, ZooKeeper};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use support::Served;

/// Nodes 0 and 1 are shard 1's replicas, nodes 2 and 3 shard 2's.
const SHARDS: [[usize; 2]; 2] = [[0, 1], [2, 3]];

struct Env {
    _dir: tempfile::TempDir,
    cluster: LocalCluster,
    plan: PathBuf,
}

/// A fresh cluster of 2 shards × 2 replicas with its ZooKeeper, or `None`
/// (a skip; a failure under `CI`) without ClickHouse or ZooKeeper.
fn env() -> Option<Env> {
    if local::server_command().is_none() {
        common::skip(
            "clickhouse-server (the replica tests)",
            "apt-get install clickhouse-server",
        );
        return None;
    }
    if zookeeper::server_command().is_none() {
        common::skip("ZooKeeper (the replica tests)", "apt-get install zookeeper");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let ports = local::free_node_ports(4);
    let zookeeper_port = local::free_ports(1)[0];
    let zookeeper = ZooKeeper::new(&dir.path().join("zookeeper"), zookeeper_port).unwrap();
    let layout = Layout {
        cluster: "promlab".into(),
        replicas: 2,
        zookeeper: Some(zookeeper.address()),
    };
    let cluster = LocalCluster::start_with(
        &dir.path().join("cluster"),
        &ports,
        &layout,
        Some(zookeeper),
        Duration::from_secs(90),
    )
    .expect("start a local replicated ClickHouse cluster");
    let plan = dir.path().join("plan.toml");
    std::fs::write(&plan, PLAN).unwrap();
    Some(Env {
        _dir: dir,
        cluster,
        plan,
    })
}

fn schema(database: &str) -> Schema {
    Schema {
        database: database.into(),
        cluster: "promlab".into(),
    }
}

impl Env {
    fn url(&self, node: usize) -> String {
        self.cluster.nodes[node].url()
    }

    fn ch(&self, node: usize) -> ClickHouse {
        ClickHouse::new(&self.url(node), Duration::from_secs(60)).unwrap()
    }

    /// A receiver writing to shard `shard`'s replicas (the first, then the other on failure).
    fn receiver(&self, shard: usize, id: &str, database: &str) -> Served {
        let plan = self.plan.to_str().unwrap().to_string();
        let [a, b] = SHARDS[shard].map(|n| self.url(n));
        support::serve(&[
            "--plan",
            &plan,
            "--max-ahead-secs",
            "0",
            "--strategies",
            "all",
            "--clickhouse",
            &a,
            "--clickhouse",
            &b,
            "--clickhouse-database",
            database,
            "--receiver-id",
            id,
        ])
    }

    /// `promlab query --clickhouse` through `nodes` (tried in turn): (success, stdout, stderr).
    fn query(&self, nodes: &[usize], database: &str, window: i64) -> (bool, Vec<u8>, String) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_promlab"));
        command.arg("query");
        for &n in nodes {
            command.args(["--clickhouse", &self.url(n)]);
        }
        command.args(["--agg", "data", "--plan", self.plan.to_str().unwrap()]);
        command.args(["--clickhouse-database", database]);
        command.args(["--window", &window.to_string()]);
        let out = command.output().expect("run promlab query");
        (
            out.status.success(),
            out.stdout,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Every closed window answers through `nodes` as the single receiver does.
    fn assert_exact(&self, nodes: &[usize], database: &str, windows: &[i64], single: &Served) {
        for &w in windows {
            let (ok, got, err) = self.query(nodes, database, w);
            assert!(ok, "window {w} through nodes {nodes:?}: {err}");
            assert_eq!(text(&got), text(&answer(single, w)), "window {w}");
        }
    }

    /// Node `node`'s two local tables, every row once in key order (`RowBinary`).
    fn local_rows(&self, node: usize, database: &str) -> Result<Vec<u8>, String> {
        let schema = schema(database);
        let mut rows = Vec::new();
        for (table, columns) in [
            ("pane_bins_local", PANE_BINS_COLUMNS),
            ("receivers_local", RECEIVERS_COLUMNS),
        ] {
            let sql = format!(
                "SELECT {columns} FROM {} FINAL ORDER BY {columns} FORMAT RowBinary",
                schema.table(table)
            );
            rows.extend(
                self.ch(node)
                    .execute(&sql, &[])
                    .map_err(|e| e.to_string())?,
            );
        }
        Ok(rows)
    }
}

/// Two receivers (one a shard, each given its shard's replicas) and the
/// single receiver, fed the same ticks of the windows from `start_ms`.
struct Fed {
    receivers: Vec<Served>,
    single: Served,
    start_ms: i64,
}

/// The ticks fed before the fault, and all of them.
const BEFORE: u64 = 6;
const TICKS: u64 = 14;

impl Fed {
    /// The tables created once for every node, `ON CLUSTER` (the receivers
    /// find them there); the receivers started and fed [`BEFORE`] ticks,
    /// every window they closed written.
    fn start(env: &Env, id: &str, database: &str, start_ms: i64) -> Fed {
        schema(database)
            .create_on_cluster(&env.ch(0), Duration::from_secs(60))
            .expect("CREATE … ON CLUSTER");
        let fed = Fed {
            receivers: (0..2)
                .map(|s| env.receiver(s, &format!("{id}{s}"), database))
                .collect(),
            single: single_receiver(&env.plan, "all"),
            start_ms,
        };
        fed.feed(0..BEFORE);
        for r in &fed.receivers {
            wait_written(r, fed.written_through(BEFORE));
        }
        fed
    }

    /// Every window ending at or before this is closed after `ticks` ticks.
    fn written_through(&self, ticks: u64) -> i64 {
        closed_windows(self.start_ms, ticks).last().unwrap() + WINDOW_MS
    }

    /// The rest of the ticks, two at a time (a window closes after each).
    fn feed_the_rest(&self) {
        for from in (BEFORE..TICKS).step_by(2) {
            self.feed(from..from + 2);
        }
    }

    /// Waits until every receiver wrote every closed window and checks none
    /// was dropped; the closed windows.
    fn all_written(&self) -> Vec<i64> {
        for r in &self.receivers {
            wait_written(r, self.written_through(TICKS));
            assert_eq!(
                metric(r, "promlab_clickhouse_windows_dropped_total"),
                Some(0.0)
            );
        }
        closed_windows(self.start_ms, TICKS)
    }

    fn feed(&self, ticks: std::ops::Range<u64>) {
        let urls: Vec<String> = self.receivers.iter().map(write_url).collect();
        assert!(feed(&urls, self.start_ms, ticks.clone()));
        assert!(feed(&[write_url(&self.single)], self.start_ms, ticks));
    }
}

/// The three faults, in turn on one cluster.
#[test]
fn replicas_survive_a_lost_node_and_zookeeper_down_and_a_lost_shard_fails_naming_it() {
    let Some(mut env) = env() else { return };
    let started = Instant::now();
    a_replica_killed_under_a_running_feed_loses_nothing_and_catches_up(&mut env);
    eprintln!(
        "replicas: a replica killed: done at {:?}",
        started.elapsed()
    );
    zookeeper_down_under_a_running_feed_queues_the_inserts_and_loses_nothing(&mut env);
    eprintln!("replicas: ZooKeeper down: done at {:?}", started.elapsed());
    both_replicas_of_a_shard_down_fails_the_query_naming_the_shard(&mut env);
    eprintln!("replicas: a shard down: done at {:?}", started.elapsed());
}

/// Shard 1's first replica — the one its receiver writes to — SIGKILLed
/// between chunks of the feed: the receiver moves to the other replica, every
/// window answers exactly (through the dead node's URL first: the query moves
/// on too), and the replica, restarted, catches up from its peer.
fn a_replica_killed_under_a_running_feed_loses_nothing_and_catches_up(env: &mut Env) {
    let db = "killed";
    let mut fed = Fed::start(env, "k", db, 1_700_000_000_000);
    env.cluster.nodes[0].kill();
    fed.feed_the_rest();
    let closed = fed.all_written();
    // The receiver met the dead replica and moved to the other.
    assert!(
        metric(
            &fed.receivers[0],
            "promlab_clickhouse_insert_failures_total"
        ) >= Some(1.0)
    );
    env.assert_exact(&[0, 3], db, &closed, &fed.single);
    // Restarted, the replica fetches what its peer took meanwhile.
    env.cluster.nodes[0].start(Duration::from_secs(90)).unwrap();
    let began = Instant::now();
    loop {
        let (caught_up, peer) = (env.local_rows(0, db), env.local_rows(1, db).unwrap());
        if caught_up.as_ref() == Ok(&peer) {
            assert!(peer.len() > 10_000, "{} bytes of rows", peer.len());
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(90),
            "node 1 has not caught up with its peer after 90 s: {} bytes of rows against {}",
            caught_up.map_or(0, |r| r.len()),
            peer.len()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!(
        "replicas: the restarted replica caught up in {:?}",
        began.elapsed()
    );
    env.assert_exact(&[0], db, &closed, &fed.single);
    for r in &mut fed.receivers {
        assert!(r.terminate(Duration::from_secs(60)).success());
    }
}

/// ZooKeeper SIGKILLed under a running feed: the replicated tables turn
/// read-only, the receivers' inserts fail and wait in their bounded queues
/// (counted in `/metrics`); ZooKeeper back, they are written and every window
/// answers exactly.
fn zookeeper_down_under_a_running_feed_queues_the_inserts_and_loses_nothing(env: &mut Env) {
    let db = "keeper";
    let fed = Fed::start(env, "z", db, 1_700_100_000_000);
    let through = fed.written_through(BEFORE);
    let zookeeper = env.cluster.zookeeper.as_mut().unwrap();
    zookeeper.kill();
    fed.feed_the_rest();
    for r in &fed.receivers {
        wait_metrics(
            r,
            [
                "promlab_clickhouse_insert_failures_total",
                "promlab_clickhouse_queue_batches",
            ],
            |[failures, queued]| failures >= Some(1.0) && queued >= Some(1.0),
        );
        assert!(metric(r, "promlab_clickhouse_queue_bytes") > Some(0.0));
        assert!(metric(r, "promlab_clickhouse_written_through_ms") <= Some(through as f64 + 1.0));
    }
    zookeeper.start(Duration::from_secs(90)).unwrap();
    let closed = fed.all_written();
    env.assert_exact(&[1], db, &closed, &fed.single);
    // Each shard's replicas hold the same rows.
    for [a, b] in SHARDS {
        let began = Instant::now();
        while env.local_rows(a, db) != env.local_rows(b, db) {
            assert!(
                began.elapsed() < Duration::from_secs(60),
                "nodes {a} and {b} differ after 60 s"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// Both replicas of shard 2 down: the query fails naming the shard and its
/// replicas, never a partial answer; one back, the answer is whole again.
fn both_replicas_of_a_shard_down_fails_the_query_naming_the_shard(env: &mut Env) {
    let db = "keeper";
    let window = 1_700_100_000_000;
    let (ok, whole, err) = env.query(&[0], db, window);
    assert!(ok, "{err}");
    let tcp = SHARDS[1].map(|n| env.cluster.nodes[n].ports.tcp);
    for n in SHARDS[1] {
        env.cluster.nodes[n].kill();
    }
    let (ok, out, err) = env.query(&[0], db, window);
    assert!(!ok, "a query with shard 2 down succeeded: {}", text(&out));
    assert!(out.is_empty(), "printed an answer: {}", text(&out));
    let named = format!("shard 2 (127.0.0.1:{}, 127.0.0.1:{})", tcp[0], tcp[1]);
    assert!(err.contains(&named), "{err}");
    env.cluster.nodes[3].start(Duration::from_secs(90)).unwrap();
    let (ok, again, err) = env.query(&[0], db, window);
    assert!(ok, "{err}");
    assert_eq!(text(&again), text(&whole));
}
