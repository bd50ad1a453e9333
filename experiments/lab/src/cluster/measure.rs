//! `promlab cluster measure`: what the cluster costs, side by side in one run.
//!
//! Arms, one after another on the same machine and workload (the paced
//! feed: `groups` × `series_per_group` series, one sample each a second,
//! timestamps from the clock so windows close as time passes):
//!
//! 1. one receiver alone (answers in memory; no ClickHouse);
//! 2. one receiver writing to a local 3-node cluster;
//! 3. three receivers (the feed sharded by hashmod) writing to the cluster,
//!    each to its own node.
//!
//! Per arm: samples fed after a warm-up, CPU (user + system, `/proc`) of
//! every receiver and every ClickHouse server over the measured span and
//! until every window closed in it is written, rows written. Then the query
//! of the last closed window through the cluster (median and p90 of
//! `queries`) beside the one receiver's in-memory answer, each answer checked
//! to hold every group; one group's answers over the last (up to) ten
//! windows, from each shard's local tables and through the `Distributed`
//! tables alternately (the two answers checked equal); and, when installed, the chdb peer
//! (`peer:chdb`: raw rows into a `quantilesDDState` view, CPU per row). From
//! the measured per-sample costs, on paper: the cores the workload and 100
//! times it need (CPU per sample scales with samples; nothing about the
//! query is extrapolated).

use super::client::{literal, ClickHouse};
use super::local::{self, LocalCluster};
use super::query;
use super::schema::Schema;
use super::shards::Shards;
use crate::http_client::Client;
use crate::machine::ProcessStats;
use anyhow::{bail, Context, Result};
use promlab::ingest::feed::FeedWorkload;
use promlab::ingest::plan::Plan;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What `promlab cluster measure` runs.
#[derive(Clone, Debug)]
pub struct MeasureOptions {
    /// The promlab binary the receivers run.
    pub promlab: PathBuf,
    pub groups: u64,
    pub series_per_group: u64,
    /// The plan's window.
    pub window_secs: u64,
    /// Ticks (seconds) fed and measured per arm, after two warm-up ticks.
    pub secs: u64,
    /// Timed cluster queries.
    pub queries: usize,
    /// Run the chdb peer too (needs `experiments/peers/install.sh --with-clickhouse`).
    pub with_chdb: bool,
    /// Scratch space (nodes' data, plan).
    pub workdir: PathBuf,
}

/// One arm's measurement.
#[derive(Clone, Debug, Default)]
pub struct ArmResult {
    pub name: String,
    pub samples: u64,
    pub receivers_cpu: Duration,
    pub clickhouse_cpu: Duration,
    pub rows: u64,
    pub bytes: u64,
    pub windows: u64,
    /// How long the ClickHouse CPU was read over.
    pub span: Duration,
}

impl ArmResult {
    fn per_sample_ns(&self, cpu: Duration) -> f64 {
        cpu.as_nanos() as f64 / self.samples.max(1) as f64
    }
}

/// The timed queries.
#[derive(Default)]
struct Queries {
    /// The last closed window, one receiver in memory over HTTP.
    memory: Vec<Duration>,
    /// The same size of window through the cluster (`promlab query`'s path).
    cluster: Vec<Duration>,
    /// Its server-side merge's SQL alone.
    server_merge: Vec<Duration>,
    /// One group over `group_windows` windows through the `Distributed`
    /// tables, not told the newest (`promlab query --group`'s default).
    group_distributed: Vec<Duration>,
    /// The same told the newest window.
    group_told: Vec<Duration>,
    /// The same from each shard's local tables, the shards resolved first
    /// (`promlab query --group` given every node): not told the newest...
    group_local: Vec<Duration>,
    /// ... and told it.
    group_local_told: Vec<Duration>,
    /// Floors of the group query: the group's rows alone from each shard's
    /// local table at once (no progress read, not decoded)...
    floor_group_rows: Vec<Duration>,
    /// ... and a `Distributed` read that selects nothing.
    floor_distributed: Vec<Duration>,
    group_windows: u64,
    /// Active parts of `pane_bins_local` on each node when the group queries ran.
    parts: Vec<u64>,
}

/// A `promlab serve` child, killed when dropped.
struct Receiver {
    child: Child,
    addr: String,
    /// The last lines it wrote to stderr, for a failure to show.
    said: Arc<Mutex<VecDeque<String>>>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    fn start(promlab: &Path, plan: &Path, extra: &[String]) -> Result<Receiver> {
        // Room for every group's bins: the serving default (12 Mi bins) refuses
        // samples of 100,000 groups, and an answer with groups missing is not the one timed.
        let mut child = Command::new(promlab)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--max-bins",
                "100000000",
                "--plan",
            ])
            .arg(plan)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting promlab serve")?;
        let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
        let first = lines.next().transpose()?.unwrap_or_default();
        let addr = first
            .split("http://")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .with_context(|| format!("promlab serve said {first:?}"))?
            .to_string();
        // Keep draining its stderr (a full pipe would block it), its last lines kept.
        let said = Arc::new(Mutex::new(VecDeque::new()));
        let kept = Arc::clone(&said);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
                if kept.len() == Self::LINES_KEPT {
                    kept.pop_front();
                }
                kept.push_back(line);
            }
        });
        Ok(Receiver { child, addr, said })
    }

    const LINES_KEPT: usize = 20;

    /// What it reports of its ClickHouse writer, and the last lines it logged.
    fn describe(&self, client: &Client) -> String {
        let metrics = [
            "promlab_clickhouse_written_through_ms",
            "promlab_clickhouse_windows_written_total",
            "promlab_clickhouse_insert_failures_total",
            "promlab_clickhouse_queue_batches",
            "promlab_clickhouse_windows_dropped_total",
        ]
        .map(|name| format!("{name} {}", self.metric(client, name)));
        let said = self.said.lock().unwrap_or_else(|e| e.into_inner());
        format!(
            "receiver {}: {}; its last lines: {:?}",
            self.addr,
            metrics.join(", "),
            said
        )
    }

    /// SIGTERM, and its exit (a clean stop: it writes what it holds and a
    /// `stopped` row, so later arms' windows do not wait for it).
    fn stop(mut self) {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn cpu(&self) -> Duration {
        ProcessStats::of(self.child.id()).map_or(Duration::ZERO, |s| s.cpu)
    }

    fn metric(&self, client: &Client, name: &str) -> f64 {
        let Ok(r) = client.get(&format!("http://{}/metrics", self.addr), &[]) else {
            return f64::NAN;
        };
        r.text()
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(f64::NAN)
    }

    fn url(&self) -> String {
        format!("http://{}/api/v1/write", self.addr)
    }
}

fn nodes_cpu(cluster: &LocalCluster) -> Duration {
    cluster
        .nodes
        .iter()
        .filter_map(|n| n.pid())
        .filter_map(|pid| ProcessStats::of(pid).ok())
        .map(|s| s.cpu)
        .sum()
}

fn now_ms() -> i64 {
    promlab::ingest::pipeline::system_clock_ms()
}

/// What a run leaves: the report (Markdown) and its figures as CSV.
pub struct Measured {
    pub report: String,
    /// One line per arm.
    pub arms_csv: String,
    /// One line per timed query.
    pub queries_csv: String,
}

/// Runs every arm.
pub fn run(opts: &MeasureOptions) -> Result<Measured> {
    if local::server_command().is_none() {
        bail!("no ClickHouse server found: apt-get install clickhouse-server");
    }
    std::fs::create_dir_all(&opts.workdir)?;
    let plan_path = opts.workdir.join("plan.toml");
    std::fs::write(
        &plan_path,
        format!(
            "lateness_secs = 5\nkeep_windows = 4\n[[aggregation]]\nid = \"data\"\nmetric = \"data\"\n\
             group_by = [\"label_0\"]\nwindow_secs = {}\n",
            opts.window_secs
        ),
    )?;
    let plan = Plan::load(&plan_path)?;
    let agg = plan.aggregations[0].clone();
    let client = Client::new(Some(Duration::from_secs(60)), 4);
    let ports = local::free_node_ports(3);
    let mut cluster = LocalCluster::start(
        &opts.workdir.join("cluster"),
        &ports,
        "promlab",
        Duration::from_secs(90),
    )?;
    let schema = Schema::default();
    let version = clickhouse_version(&cluster.urls()[0]).unwrap_or_else(|| "?".into());
    for url in cluster.urls() {
        schema.create(&ClickHouse::new(&url, Duration::from_secs(60))?)?;
    }
    // What three idle servers burn (their background threads), to tell it from the writes' cost.
    let idle_span = Duration::from_secs(10);
    let idle_before = nodes_cpu(&cluster);
    std::thread::sleep(idle_span);
    let idle = nodes_cpu(&cluster)
        .saturating_sub(idle_before)
        .as_secs_f64()
        / idle_span.as_secs_f64();
    let mut arms = Vec::new();
    let mut q = Queries::default();
    for (name, receivers) in [
        ("one receiver, memory only", 0usize),
        ("1 receiver → 3-node cluster", 1),
        ("3 receivers → 3-node cluster", 3),
    ] {
        eprintln!(
            "promlab cluster measure: {name}: {} s of feed",
            opts.secs + 2
        );
        let started: Vec<Receiver> = if receivers == 0 {
            vec![Receiver::start(&opts.promlab, &plan_path, &[])?]
        } else {
            (0..receivers)
                .map(|k| {
                    let extra = [
                        "--clickhouse".to_string(),
                        cluster.urls()[k].clone(),
                        "--receiver-id".to_string(),
                        format!("measure-{receivers}-{k}"),
                    ];
                    Receiver::start(&opts.promlab, &plan_path, &extra)
                })
                .collect::<Result<_>>()?
        };
        let urls: Vec<String> = started.iter().map(Receiver::url).collect();
        let workload = FeedWorkload {
            groups: opts.groups,
            series_per_group: opts.series_per_group,
            ..FeedWorkload::seed(now_ms())
        };
        let sharding = crate::feed::Sharding::default();
        crate::feed::send(&workload, 0..2, &urls, &sharding, 1, true)?;
        let rows_before: f64 = started
            .iter()
            .map(|r| r.metric(&client, "promlab_clickhouse_rows_written_total"))
            .filter(|v| v.is_finite())
            .sum();
        let bytes_before: f64 = started
            .iter()
            .map(|r| r.metric(&client, "promlab_clickhouse_bytes_written_total"))
            .filter(|v| v.is_finite())
            .sum();
        let windows_before: f64 = started
            .iter()
            .map(|r| r.metric(&client, "promlab_clickhouse_windows_written_total"))
            .filter(|v| v.is_finite())
            .sum();
        let cpu_before: Duration = started.iter().map(Receiver::cpu).sum();
        let ch_before = nodes_cpu(&cluster);
        let span_start = Instant::now();
        let report = crate::feed::send(&workload, 2..2 + opts.secs, &urls, &sharding, 1, true)?;
        // The windows the measured span closed: written (their rows counted) before the CPU is read.
        let fed_through = workload.timestamp(1 + opts.secs, 0) - plan.lateness_ms();
        let closes = fed_through.div_euclid(agg.window_ms()) * agg.window_ms();
        if receivers > 0 {
            let deadline = Instant::now() + Duration::from_secs(120);
            while started
                .iter()
                .any(|r| r.metric(&client, "promlab_clickhouse_written_through_ms") < closes as f64)
            {
                if Instant::now() > deadline {
                    let described: Vec<String> =
                        started.iter().map(|r| r.describe(&client)).collect();
                    bail!(
                        "{name}: the receivers did not write through {closes} within 120 s\n{}",
                        described.join("\n")
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let sum = |name: &str| -> f64 {
            started
                .iter()
                .map(|r| r.metric(&client, name))
                .filter(|v| v.is_finite())
                .sum()
        };
        let arm = ArmResult {
            name: name.to_string(),
            samples: report.samples,
            receivers_cpu: started
                .iter()
                .map(Receiver::cpu)
                .sum::<Duration>()
                .saturating_sub(cpu_before),
            clickhouse_cpu: if receivers > 0 {
                nodes_cpu(&cluster).saturating_sub(ch_before)
            } else {
                Duration::ZERO
            },
            rows: (sum("promlab_clickhouse_rows_written_total") - rows_before).max(0.0) as u64,
            bytes: (sum("promlab_clickhouse_bytes_written_total") - bytes_before).max(0.0) as u64,
            windows: (sum("promlab_clickhouse_windows_written_total") - windows_before).max(0.0)
                as u64,
            span: span_start.elapsed(),
        };
        if report.failed_requests > 0 {
            bail!("{name}: {} requests failed", report.failed_requests);
        }
        // The last closed window's answer: in memory (arm 1) or from the cluster (arm 3).
        let last = closes - agg.window_ms();
        if receivers == 0 {
            let url = format!(
                "http://{}/api/v1/quantiles?agg=data&window={last}",
                started[0].addr
            );
            for _ in 0..opts.queries {
                let t = Instant::now();
                let body = client.get(&url, &[])?.body;
                q.memory.push(t.elapsed());
                check_groups("one receiver's in-memory answer", &body, opts.groups)?;
            }
        }
        if receivers == 3 {
            let ch = ClickHouse::new(&cluster.urls()[0], Duration::from_secs(60))?;
            for _ in 0..opts.queries {
                let t = Instant::now();
                let answer = query::answer(&ch, &schema, &agg, Some(last))?;
                q.cluster.push(t.elapsed());
                if !answer.incomplete.is_empty() {
                    bail!(
                        "the cluster's answer for {last} is incomplete: {:?}",
                        answer.incomplete
                    );
                }
                check_groups("the cluster's answer", &answer.json, opts.groups)?;
            }
            // The server-side merge's SQL alone, for the choice of where to merge.
            let sql = query::server_merge_sql(&schema, &agg, last);
            for _ in 0..opts.queries {
                let t = Instant::now();
                ch.execute(&sql, &[("skip_unavailable_shards", "0")])?;
                q.server_merge.push(t.elapsed());
            }
            eprintln!(
                "query of {} groups: median {:.1} ms, p90 {:.1} ms",
                opts.groups,
                ms(percentile(&q.cluster, 0.5)),
                ms(percentile(&q.cluster, 0.9))
            );
            // One group over the last windows this arm closed (at most ten),
            // alternately: through the `Distributed` tables not told the
            // newest (found as `promlab query --group` finds it, from the
            // receivers' progress) and told it; from each shard's local
            // tables, not told and told, the shards resolved each time as
            // `promlab query --group` given every node does; and the two floors.
            let nodes = cluster
                .urls()
                .iter()
                .map(|u| ClickHouse::new(u, Duration::from_secs(60)))
                .collect::<Result<Vec<_>>>()?;
            let shards = Shards::resolve(&nodes, &schema)
                .context("the cluster's nodes do not cover its shards")?;
            let fed_from = workload.timestamp(0, 0).div_euclid(agg.window_ms()) * agg.window_ms();
            let windows = ((last - fed_from) / agg.window_ms() + 1).clamp(1, 10) as u64;
            let nothing_distributed = format!(
                "SELECT count() FROM {} WHERE 0 FORMAT TabSeparated",
                schema.table("pane_bins")
            );
            for k in 0..opts.queries as u64 {
                let labels = [(
                    "label_0".to_string(),
                    format!("g{}", k * 7919 % opts.groups),
                )];
                let key = promlab::ingest::distributed::group_key(&agg, &labels.into());
                let t = Instant::now();
                let answers = query::group_answers(&ch, None, &schema, &agg, &key, None, windows)?;
                q.group_distributed.push(t.elapsed());
                let t = Instant::now();
                let told =
                    query::group_answers(&ch, None, &schema, &agg, &key, Some(last), windows)?;
                q.group_told.push(t.elapsed());
                let local = |newest: Option<i64>| {
                    let t = Instant::now();
                    let shards = Shards::resolve(&nodes, &schema)
                        .context("the cluster's nodes do not cover its shards")?;
                    let answers = query::group_answers(
                        &ch,
                        Some(&shards),
                        &schema,
                        &agg,
                        &key,
                        newest,
                        windows,
                    )?;
                    anyhow::Ok((answers, t.elapsed()))
                };
                let (cli, elapsed) = local(None)?;
                q.group_local.push(elapsed);
                let (local, elapsed) = local(Some(last))?;
                q.group_local_told.push(elapsed);
                let rows_local = query::group_rows_sql(
                    &schema.table("pane_bins_local"),
                    &agg,
                    &key,
                    last,
                    windows,
                );
                let t = Instant::now();
                shards.read_each(&[&rows_local])?;
                q.floor_group_rows.push(t.elapsed());
                let t = Instant::now();
                ch.execute(&nothing_distributed, &[])?;
                q.floor_distributed.push(t.elapsed());
                let json =
                    |a: &[query::Answer]| a.iter().map(|a| a.json.clone()).collect::<Vec<_>>();
                if json(&answers) != json(&told)
                    || json(&answers) != json(&local)
                    || json(&answers) != json(&cli)
                {
                    bail!("one group's answers differ between the Distributed tables and the shards' local tables, told the window or not");
                }
                if answers.last().and_then(|a| a.window_start) != Some(last) {
                    bail!(
                        "one group's newest window is {:?}, the newest closed is {last}",
                        answers.last().and_then(|a| a.window_start)
                    );
                }
                for a in &answers {
                    if !a.incomplete.is_empty() {
                        bail!(
                            "one group's answer for {:?} is incomplete: {:?}",
                            a.window_start,
                            a.incomplete
                        );
                    }
                    check_groups("one group's answer", &a.json, 1)?;
                }
            }
            q.group_windows = windows;
            let parts_sql = format!(
                "SELECT count() FROM system.parts WHERE database = {} AND table = 'pane_bins_local' AND active FORMAT TabSeparated",
                literal(&schema.database)
            );
            for node in &nodes {
                let body = node.execute(&parts_sql, &[])?;
                q.parts.push(String::from_utf8_lossy(&body).trim().parse()?);
            }
            let median = |times: &[Duration]| ms(percentile(times, 0.5));
            eprintln!(
                "query of one group over {windows} windows (medians): through Distributed {:.2} ms, told the window {:.2} ms; \
                 the shards' local tables {:.2} ms, told the window {:.2} ms; floors: its rows alone {:.2} ms, a Distributed read of nothing {:.2} ms",
                median(&q.group_distributed),
                median(&q.group_told),
                median(&q.group_local),
                median(&q.group_local_told),
                median(&q.floor_group_rows),
                median(&q.floor_distributed),
            );
        }
        arms.push(arm);
        started.into_iter().for_each(Receiver::stop);
    }
    cluster.stop(Duration::from_secs(30));
    let chdb = if opts.with_chdb {
        chdb_per_row(opts)
    } else {
        Err(anyhow::anyhow!("not asked for (--with-chdb)"))
    };
    let mut arms_csv = String::from(
        "arm,samples,receivers_cpu_ns,clickhouse_cpu_ns,clickhouse_idle_ns_per_s,span_ms,rows,bytes,windows\n",
    );
    for a in &arms {
        arms_csv.push_str(&format!(
            "{},{},{},{},{:.0},{},{},{},{}\n",
            a.name,
            a.samples,
            a.receivers_cpu.as_nanos(),
            a.clickhouse_cpu.as_nanos(),
            idle * 1e9,
            a.span.as_millis(),
            a.rows,
            a.bytes,
            a.windows
        ));
    }
    let mut queries_csv = String::from("query,groups,windows,run,ms\n");
    for (name, groups, windows, times) in [
        ("memory_window", opts.groups, 1, &q.memory),
        ("cluster_window", opts.groups, 1, &q.cluster),
        ("cluster_group_local", 1, q.group_windows, &q.group_local),
        (
            "cluster_group_local_told_window",
            1,
            q.group_windows,
            &q.group_local_told,
        ),
        (
            "floor_group_rows_local",
            1,
            q.group_windows,
            &q.floor_group_rows,
        ),
        ("floor_distributed_nothing", 0, 0, &q.floor_distributed),
        (
            "cluster_group_distributed",
            1,
            q.group_windows,
            &q.group_distributed,
        ),
        (
            "cluster_group_distributed_told_window",
            1,
            q.group_windows,
            &q.group_told,
        ),
        (
            "cluster_window_summap_sql_only",
            opts.groups,
            1,
            &q.server_merge,
        ),
    ] {
        for (i, t) in times.iter().enumerate() {
            queries_csv.push_str(&format!("{name},{groups},{windows},{i},{:.3}\n", ms(*t)));
        }
    }
    Ok(Measured {
        report: report(opts, &version, idle, &arms, &q, chdb),
        arms_csv,
        queries_csv,
    })
}

/// Fails unless the answer `json` holds `groups` groups (what was timed is a whole answer).
fn check_groups(what: &str, json: &[u8], groups: u64) -> Result<()> {
    let value: serde_json::Value =
        serde_json::from_slice(json).with_context(|| format!("{what} is not JSON"))?;
    let got = value["groups"].as_array().map_or(0, Vec::len) as u64;
    if got != groups {
        bail!("{what} holds {got} groups, not {groups}");
    }
    Ok(())
}

/// The chdb peer's CPU per row (median over its batches), or why not.
fn chdb_per_row(opts: &MeasureOptions) -> Result<f64> {
    use crate::harness::peers::{
        chdb::Chdb, remote_write::FeedPlan, Peer, PeerContext, PeerOutcome,
    };
    let scenario = crate::harness::load_scenario("asap-1e5")?;
    let workdir = opts.workdir.join("chdb");
    std::fs::create_dir_all(&workdir)?;
    let peer = Chdb {
        plan: Some(FeedPlan {
            groups: opts.groups,
            warmup_ticks: 0,
            chunk_ticks: 60,
            chunks: 1,
        }),
    };
    let cx = PeerContext {
        scenario: &scenario,
        size: &scenario.full,
        quick: false,
        repeats: 1,
        promlab: opts.promlab.clone(),
        workdir,
        with_clickhouse: true,
    };
    match peer.run(&cx)? {
        PeerOutcome::Measured(result) => {
            let mut ns: Vec<f64> = result
                .samples
                .iter()
                .map(|d| d.as_nanos() as f64 / result.units.0 as f64)
                .collect();
            ns.sort_by(f64::total_cmp);
            ns.get(ns.len() / 2).copied().context("no batch measured")
        }
        PeerOutcome::Skipped(why) => bail!("skipped: {why}"),
    }
}

/// The `q` quantile of `d`, nearest rank.
fn percentile(d: &[Duration], q: f64) -> Duration {
    let mut d = d.to_vec();
    d.sort();
    let rank = (d.len() as f64 * q).ceil() as usize;
    d.get(rank.saturating_sub(1)).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn report(
    opts: &MeasureOptions,
    version: &str,
    idle: f64,
    arms: &[ArmResult],
    q: &Queries,
    chdb: Result<f64>,
) -> String {
    let mut out = String::new();
    let rate = opts.groups * opts.series_per_group;
    out.push_str(&format!(
        "Workload: {} groups × {} series, one sample each a second ({rate} samples/s, paced), \
         {} s windows, {} measured ticks per arm after 2 warm-up ticks; 3 ClickHouse nodes \
         (`clickhouse-server` {}) on this machine. CPU is user + system from `/proc`, over the \
         measured ticks and until every window they closed was written.\n\n",
        opts.groups, opts.series_per_group, opts.window_secs, opts.secs, version
    ));
    out.push_str(&format!(
        "Three idle ClickHouse servers burn {:.1} ms of CPU a second (background threads), counted in the \
         ClickHouse column; the last column takes it out.\n\n",
        idle * 1e3
    ));
    out.push_str("| arm | samples | receivers CPU ns/sample | ClickHouse CPU ns/sample | whole system ns/sample | windows written | rows written | rows/sample | ClickHouse CPU ns/row | bytes/row | ClickHouse CPU ns/row, idle taken out |\n");
    out.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for a in arms {
        let r = a.per_sample_ns(a.receivers_cpu);
        let c = a.per_sample_ns(a.clickhouse_cpu);
        let per_row = if a.rows > 0 {
            format!("{:.0}", a.clickhouse_cpu.as_nanos() as f64 / a.rows as f64)
        } else {
            "–".into()
        };
        let bytes_row = if a.rows > 0 {
            format!("{:.1}", a.bytes as f64 / a.rows as f64)
        } else {
            "–".into()
        };
        let net = if a.rows > 0 {
            let busy = a.clickhouse_cpu.as_secs_f64() - idle * a.span.as_secs_f64();
            format!("{:.0}", busy.max(0.0) * 1e9 / a.rows as f64)
        } else {
            "–".into()
        };
        out.push_str(&format!(
            "| {} | {} | {r:.1} | {c:.1} | {:.1} | {} | {} | {:.5} | {per_row} | {bytes_row} | {net} |\n",
            a.name,
            a.samples,
            r + c,
            a.windows,
            a.rows,
            a.rows as f64 / a.samples.max(1) as f64,
        ));
    }
    match &chdb {
        Ok(ns) => out.push_str(&format!("| chdb peer (raw rows into a quantilesDDState view, not paced; one row a sample) | 60 s of the workload | – | {ns:.1} | {ns:.1} | – | – | 1 | {ns:.1} | – | – |\n")),
        Err(e) => out.push_str(&format!("\nchdb peer: {e:#}\n")),
    }
    let (cm, cp) = (
        ms(percentile(&q.cluster, 0.5)),
        ms(percentile(&q.cluster, 0.9)),
    );
    out.push_str(&format!(
        "\nQueries, {} of each, every answer checked to hold every group (one for the group query):\n\n\
         | query | median ms | p90 ms |\n| --- | ---: | ---: |\n",
        opts.queries
    ));
    let w = q.group_windows;
    let table: [(String, &[Duration]); 9] = [
        (format!("the last closed window ({} groups), one receiver in memory (HTTP)", opts.groups), &q.memory),
        ("the same size of window through the cluster (`promlab query`: one row per receiver and group read over 3 shards, merged and answered in Rust)".into(), &q.cluster),
        ("the same window's server-side merge, `sumMap` after a `GROUP BY` keeping one row per receiver (its SQL alone: not decoded, not answered)".into(), &q.server_merge),
        (format!("one group over its last {w} windows through the `Distributed` tables (`promlab query --group` not told `--window`: the receivers' progress read, then the group's rows)"), &q.group_distributed),
        ("the same told the newest window (`promlab query --group --window START_MS`: the progress and the rows read at once)".into(), &q.group_told),
        ("the same from each shard's local tables, not told the window (`promlab query --group` given a node of every shard: the shards resolved, the progress read, then the rows)".into(), &q.group_local),
        ("the same told the newest window (`promlab query --group --window START_MS` given a node of every shard: the shards resolved, then the progress and the rows read at once)".into(), &q.group_local_told),
        ("floor: the group's rows alone from each shard's local table at once (no progress read, not decoded)".into(), &q.floor_group_rows),
        ("floor: a `Distributed` read that selects nothing".into(), &q.floor_distributed),
    ];
    for (query, times) in table {
        out.push_str(&format!(
            "| {query} | {:.2} | {:.2} |\n",
            ms(percentile(times, 0.5)),
            ms(percentile(times, 0.9))
        ));
    }
    out.push_str(&format!(
        "\nActive parts of `pane_bins_local` on each node when the group queries ran: {:?}.\n\n\
         query of {} groups: median {cm:.1} ms, p90 {cp:.1} ms ({:.2} µs a group at this size, measured)\n",
        q.parts,
        opts.groups,
        cm * 1e3 / opts.groups as f64,
    ));
    // On paper, from the 3-receiver arm.
    if let Some(three) = arms.iter().find(|a| a.name.starts_with("3 ")) {
        let per_sample =
            three.per_sample_ns(three.receivers_cpu) + three.per_sample_ns(three.clickhouse_cpu);
        let alone = arms
            .first()
            .map_or(f64::NAN, |a| a.per_sample_ns(a.receivers_cpu));
        out.push_str(&format!(
            "\nOn paper (CPU-bound, every core busy, no other limit), from the 3-receiver arm: {per_sample:.1} ns of CPU a sample \
             for the whole system (one receiver alone: {alone:.1}).\n\n\
             | workload | samples/s | cores needed, cluster | 16-core nodes | cores needed, one receiver alone |\n| --- | ---: | ---: | ---: | ---: |\n"
        ));
        for (label, scale) in [
            ("the report's (1,000 groups × 100 series)", 1.0),
            ("100× (100,000 groups × 100 series)", 100.0),
        ] {
            let samples = 1e5 * scale;
            let cores = samples * per_sample / 1e9;
            out.push_str(&format!(
                "| {label} | {samples:.0} | {cores:.2} | {} | {:.2} |\n",
                (cores / 16.0).ceil().max(1.0),
                samples * alone / 1e9
            ));
        }
        out.push_str(&format!(
            "\nOn paper, from the same per-sample cost: one 16-core node carries about {:.1} M samples/s with its own \
             ClickHouse, an N-node cluster N times that (receivers and shards scale out; each window's rows go to one \
             node per receiver). The query was measured at {} groups only; other sizes are other runs of this command.\n",
            16e9 / per_sample / 1e6,
            opts.groups
        ));
    }
    out
}

/// The version a node reports.
fn clickhouse_version(url: &str) -> Option<String> {
    let ch = ClickHouse::new(url, Duration::from_secs(10)).ok()?;
    let out = ch.execute("SELECT version()", &[]).ok()?;
    Some(String::from_utf8_lossy(&out).trim().to_string())
}
