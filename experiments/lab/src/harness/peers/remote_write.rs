//! What the ingest peers share: a remote-write receiver started on loopback,
//! fed by `promlab feed` at the paced rate, its CPU and RSS read from /proc
//! (the method of `examples/ingest_cpu.rs`), and its answer for the last closed
//! minute checked against the exact quantiles and promlab's.
//!
//! The feed: `groups` × 100 series, one sample per series per second (1,000
//! groups = 1e5 samples/s), timestamps one second apart from a minute boundary
//! `S` in the recent past. `warmup_ticks` ticks (stamped just before `S`, so in
//! the previous minute) let the receiver meet every series once; then `chunks`
//! runs of `promlab feed --first-tick …` of `chunk_ticks` ticks each, the
//! receiver's user + system CPU read before and after each: one timed sample
//! per chunk.
//!
//! The query: every peer stores raw samples, so the exact answer is in it. No
//! PromQL or MetricsQL function pools raw samples across series *and* time —
//! `quantile_over_time` reduces one series over time, `quantile by` reduces
//! across series at one instant, and a quantile of quantiles is not the
//! quantile of the union — so the peer is asked for the raw samples, with the
//! range-vector selector `data{label_0=~"g0|g1|…"}[61s]` evaluated at `W + 60 s`
//! through `/api/v1/query` (a matrix of every stored sample, unaggregated), and
//! the samples with timestamps in `[W, W + 60 s)` are kept: exactly the group's
//! samples of minute `W`, whichever way the store bounds the range. Their value
//! at 0-based rank `floor(q·(n − 1))` is the exact quantile, the rank
//! definition of `tests/ingest_equivalence.rs`.

use super::{Measure, Peer, PeerContext, PeerOutcome, PeerResult};
use crate::http_client::{self, Client};
use crate::machine::ProcessStats;
use anyhow::{bail, Context, Result};
use promlab::ingest::feed::FeedWorkload;
use promlab::ingest::pipeline::Ingester;
use promlab::ingest::plan::Plan;
use promlab::shared::strategy::StrategySet;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(super) const SERIES_PER_GROUP: u64 = 100;
pub(super) const WINDOW_MS: i64 = 60_000;
pub(super) const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];
/// Groups per raw-sample query (50 groups × 100 series × 61 samples ≈ 12 MB of JSON).
const GROUPS_PER_QUERY: u64 = 50;

/// The paced feed a peer gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeedPlan {
    /// Groups of 100 series; samples per second = groups × 100.
    pub groups: u64,
    pub warmup_ticks: u64,
    pub chunk_ticks: u64,
    /// Timed chunks (one CPU sample each).
    pub chunks: u64,
}

impl FeedPlan {
    /// Quick: the quick scenario's 50 groups (5,000 samples/s) for ~70 s;
    /// full: 1,000 groups (1e5 samples/s) for ~300 s. Both span at least 66
    /// ticks, so the first minute closes (60 s plus promlab's 5 s lateness).
    pub fn for_size(quick: bool, repeats: usize) -> FeedPlan {
        let (groups, span): (u64, u64) = if quick { (50, 70) } else { (1000, 300) };
        let chunks = repeats.max(1) as u64;
        FeedPlan {
            groups,
            warmup_ticks: 2,
            chunk_ticks: span.div_ceil(chunks).max(5),
            chunks,
        }
    }

    pub fn measured_ticks(&self) -> u64 {
        self.chunk_ticks * self.chunks
    }

    pub fn samples_per_tick(&self) -> u64 {
        self.groups * SERIES_PER_GROUP
    }

    /// The minute compared: the last one closed by the measured feed (the
    /// newest timestamp minus promlab's lateness has passed its end), or, for a
    /// feed shorter than that, the first measured minute, as far as it got.
    fn compared_window(&self, s: i64) -> i64 {
        let newest = s + (self.measured_ticks() as i64 - 1) * 1000;
        let watermark = newest - Plan::default().lateness_ms();
        let last_closed = watermark.div_euclid(WINDOW_MS) * WINDOW_MS - WINDOW_MS;
        last_closed.max(s)
    }
}

/// How to run one receiver.
pub struct ReceiverSpec {
    pub arm: &'static str,
    /// The executable, looked up on `PATH` (and in /usr/bin).
    pub binary: &'static str,
    /// How to install it, for the skip message.
    pub install: &'static str,
    /// Its command line, given its port and work directory (may write files there).
    pub args: fn(port: u16, workdir: &Path) -> Result<Vec<String>>,
    /// A GET path that answers 200 once it takes writes.
    pub ready_path: &'static str,
    /// How far a stored value may be from the value fed, relatively (0: bit-exact).
    pub stored_tolerance: f64,
    /// What it does that promlab does not; printed under the table.
    pub note: &'static str,
}

/// A remote-write receiver as a peer of `asap-1e5`: `spec` says which and how
/// to run it; `plan` overrides the feed chosen by size (tests feed seconds,
/// not minutes).
pub struct Receiver {
    pub spec: &'static ReceiverSpec,
    pub plan: Option<FeedPlan>,
}

impl Peer for Receiver {
    fn arm(&self) -> &'static str {
        self.spec.arm
    }

    fn runs(&self, scenario: &str) -> bool {
        scenario == "asap-1e5"
    }

    fn run(&self, cx: &PeerContext<'_>) -> Result<PeerOutcome> {
        let plan = self
            .plan
            .unwrap_or_else(|| FeedPlan::for_size(cx.quick, cx.repeats));
        measure(cx, self.spec, plan)
    }
}

/// Finds `binary` on `PATH`, then in /usr/bin.
pub fn find_binary(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join(binary))
        .find(|p| p.is_file())
}

/// A child process killed and reaped when dropped, so a peer leaves nothing
/// running whichever way its run ends.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `command` to its end, or kills it after `limit`; its exit status and
/// standard error (kept in a file in `workdir`, so no pipe can fill and block it).
pub(super) fn run_within(
    command: &mut Command,
    workdir: &Path,
    limit: Duration,
) -> Result<(std::process::ExitStatus, String)> {
    let stderr_path = workdir.join("command.stderr");
    let mut child = KillOnDrop(
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_path)?)
            .spawn()?,
    );
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.0.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            bail!("still running after {} s; killed", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = String::from_utf8_lossy(&std::fs::read(&stderr_path)?).into_owned();
    Ok((status, stderr))
}

/// A free loopback port (bound, then released for the peer to take).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// User + system CPU of process `pid` (all its threads, living and exited).
fn cpu_time(pid: u32) -> Result<Duration> {
    Ok(ProcessStats::of(pid)
        .with_context(|| format!("reading the CPU time of process {pid}"))?
        .cpu)
}

/// `GET path` on the peer's loopback port: status and body.
fn http_get(client: &Client, port: u16, path: &str) -> Result<(u16, Vec<u8>)> {
    let response = client.get(&format!("http://127.0.0.1:{port}{path}"), &[])?;
    Ok((response.status, response.body))
}

fn log_tail(path: &Path) -> String {
    let log = std::fs::read(path).unwrap_or_default();
    let tail = String::from_utf8_lossy(&log[log.len().saturating_sub(1500)..]);
    format!("\n{} log tail:\n{tail}", path.display())
}

/// One group's samples of the compared minute, and its quantiles.
#[derive(Clone, Debug, Default)]
pub(super) struct GroupAnswer {
    pub count: u64,
    /// p50, p90, p99.
    pub quantiles: Vec<f64>,
}

/// Exact quantiles by the crate's rank definition: the sorted values at
/// 0-based ranks `floor(q·(n − 1))`.
pub(super) fn exact(values: &mut [f64]) -> GroupAnswer {
    values.sort_by(f64::total_cmp);
    let quantiles = if values.is_empty() {
        Vec::new()
    } else {
        QUANTILES
            .iter()
            .map(|q| values[(q * (values.len() as f64 - 1.0)) as usize])
            .collect()
    };
    GroupAnswer {
        count: values.len() as u64,
        quantiles,
    }
}

#[derive(Deserialize)]
struct ApiResponse {
    status: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    data: Option<ApiData>,
}

#[derive(Deserialize)]
struct ApiData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<MatrixSeries>,
}

#[derive(Deserialize)]
struct MatrixSeries {
    metric: BTreeMap<String, String>,
    /// `[seconds since the epoch, "value"]`.
    values: Vec<(f64, String)>,
}

/// Per group, the peer's raw samples of minute `[w, w + 60 s)`.
fn peer_samples(
    client: &Client,
    port: u16,
    groups: &[u64],
    w: i64,
) -> Result<BTreeMap<u64, Vec<f64>>> {
    let alternatives: Vec<String> = groups.iter().map(|g| format!("g{g}")).collect();
    // `[61s]` at `w + 60 s` covers the minute under both range conventions
    // (closed, or open on the left); the timestamp filter below makes it exact.
    let query = format!("data{{label_0=~\"{}\"}}[61s]", alternatives.join("|"));
    let url = format!("http://127.0.0.1:{port}/api/v1/query");
    let time = ((w + WINDOW_MS) / 1000).to_string();
    let request = client
        .agent()
        .get(&url)
        .query("query", &query)
        .query("time", &time);
    let http_client::Response { status, body, .. } =
        http_client::read(request.call(), "GET", &url)?;
    let response: ApiResponse = serde_json::from_slice(&body).with_context(|| {
        format!(
            "HTTP {status} from {url} for {query}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        )
    })?;
    let Some(data) = response.data.filter(|_| response.status == "success") else {
        bail!(
            "query {query} failed: {}",
            response.error.unwrap_or(response.status)
        );
    };
    if data.result_type != "matrix" {
        bail!(
            "query {query} answered a {}, not a matrix",
            data.result_type
        );
    }
    let mut out: BTreeMap<u64, Vec<f64>> = groups.iter().map(|&g| (g, Vec::new())).collect();
    for series in data.result {
        let group = series
            .metric
            .get("label_0")
            .and_then(|g| g.strip_prefix('g'))
            .and_then(|g| g.parse().ok())
            .with_context(|| format!("a series without a group: {:?}", series.metric))?;
        let values = out.entry(group).or_default();
        for (seconds, value) in series.values {
            let ts = (seconds * 1000.0).round() as i64;
            if (w..w + WINDOW_MS).contains(&ts) {
                values.push(value.parse().with_context(|| format!("value {value:?}"))?);
            }
        }
    }
    Ok(out)
}

/// Measures one receiver: see the module documentation.
pub fn measure(cx: &PeerContext<'_>, spec: &ReceiverSpec, plan: FeedPlan) -> Result<PeerOutcome> {
    let Some(binary) = find_binary(spec.binary) else {
        return Ok(PeerOutcome::Skipped(format!(
            "`{}` is not installed ({})",
            spec.binary, spec.install
        )));
    };
    let port = free_port()?;
    let log_path = cx.workdir.join(format!("{}.log", spec.binary));
    let log = std::fs::File::create(&log_path)?;
    let child = Command::new(&binary)
        .args((spec.args)(port, &cx.workdir)?)
        .current_dir(&cx.workdir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let mut peer = KillOnDrop(child);
    let pid = peer.0.id();

    let ready_client = Client::new(Some(Duration::from_secs(2)), 1);
    let ready_by = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = peer.0.try_wait()? {
            bail!(
                "{} exited at start ({status}){}",
                spec.binary,
                log_tail(&log_path)
            );
        }
        if matches!(http_get(&ready_client, port, spec.ready_path), Ok((200, _))) {
            break;
        }
        if Instant::now() > ready_by {
            bail!(
                "{} not ready within 60 s{}",
                spec.binary,
                log_tail(&log_path)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // S: a minute boundary a minute or two back, so no sample is stamped in the future.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let s = now_ms.div_euclid(WINDOW_MS) * WINDOW_MS - WINDOW_MS;
    let start_ms = s - plan.warmup_ticks as i64 * 1000;
    let url = format!("http://127.0.0.1:{port}/api/v1/write");
    let mut late_ticks = 0u64;
    let mut feed = |first: u64, ticks: u64| -> Result<()> {
        let mut command = Command::new(&cx.promlab);
        command
            .args(["feed", "--url", &url])
            .args(["--groups", &plan.groups.to_string()])
            .args(["--series-per-group", &SERIES_PER_GROUP.to_string()])
            .args(["--start-ms", &start_ms.to_string()])
            .args(["--first-tick", &first.to_string()])
            .args(["--duration-secs", &ticks.to_string()]);
        // A stalled receiver must not stall our run: the pace plus two minutes.
        let limit = Duration::from_secs(ticks + 120);
        let (status, stderr) = run_within(&mut command, &cx.workdir, limit)
            .with_context(|| format!("running {} feed", cx.promlab.display()))?;
        if !status.success() {
            bail!(
                "promlab feed into {} failed: {}{}",
                spec.binary,
                stderr.trim(),
                log_tail(&log_path)
            );
        }
        // "…, N late ticks": the receiver did not keep the pace.
        late_ticks += stderr
            .rsplit_once(" late ticks")
            .and_then(|(head, _)| head.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        Ok(())
    };
    feed(0, plan.warmup_ticks)?;
    let mut samples = Vec::new();
    let mut before = cpu_time(pid)?;
    for c in 0..plan.chunks {
        feed(plan.warmup_ticks + c * plan.chunk_ticks, plan.chunk_ticks)?;
        let after = cpu_time(pid)?;
        samples.push(after.saturating_sub(before));
        before = after;
    }
    let rss_kib = ProcessStats::of(pid).ok().and_then(|p| p.peak_rss_kib);
    if let Some(status) = peer.0.try_wait()? {
        bail!(
            "{} exited during the feed ({status}){}",
            spec.binary,
            log_tail(&log_path)
        );
    }

    let w = plan.compared_window(s);
    let check = compare(port, spec, &plan, start_ms, w).with_context(|| {
        format!(
            "{}: minute starting {w} ms{}",
            spec.arm,
            log_tail(&log_path)
        )
    })?;
    drop(peer);

    let rate = plan.samples_per_tick();
    Ok(PeerOutcome::Measured(PeerResult {
        arm: spec.arm.to_string(),
        measure: Measure::Cpu,
        samples,
        units: (plan.chunk_ticks * rate, "samples".to_string()),
        rss_kib,
        note: format!(
            "{}; fed {rate} samples/s ({} groups × 100 series) paced, {} s after a {} s warm-up, {late_ticks} late ticks; CPU of its process per {}-tick chunk; {check}",
            spec.note,
            plan.groups,
            plan.measured_ticks(),
            plan.warmup_ticks,
            plan.chunk_ticks,
        ),
    }))
}

/// Per group `0..groups`, the exact answer for the samples of `ticks`,
/// regenerated from the feed's formula.
pub(super) fn fed_answers(workload: &FeedWorkload, ticks: &[u64]) -> Vec<GroupAnswer> {
    let per_group = workload.series_per_group;
    (0..workload.groups)
        .map(|g| {
            let mut values: Vec<f64> = (g * per_group..(g + 1) * per_group)
                .flat_map(|n| ticks.iter().map(move |&t| workload.value(n, t)))
                .collect();
            exact(&mut values)
        })
        .collect()
}

/// Per group `0..groups`, promlab's answer for minute `w` after the requests
/// of `ticks` (an in-process ingester with every strategy; a group it lacks
/// has count 0).
pub(super) fn promlab_answers(
    workload: &FeedWorkload,
    ticks: &[u64],
    w: i64,
) -> Result<Vec<GroupAnswer>> {
    let generator = workload.generator();
    let mut ingester = Ingester::new(Plan::default(), StrategySet::all());
    for &t in ticks {
        for body in generator.tick_bodies(t) {
            ingester.handle(&body)?;
        }
    }
    ingester.flush();
    let result = ingester
        .query("data", Some(w))
        .context("no `data` aggregation")?;
    let mut answers = vec![GroupAnswer::default(); workload.groups as usize];
    for group in result.groups {
        let Some(g) = group
            .labels
            .get("label_0")
            .and_then(|g| g.strip_prefix('g'))
            .and_then(|g| g.parse::<usize>().ok())
            .filter(|&g| g < answers.len())
        else {
            continue;
        };
        answers[g] = GroupAnswer {
            count: group.count,
            quantiles: group.quantiles.0.iter().map(|(_, v)| *v).collect(),
        };
    }
    Ok(answers)
}

/// Checks the peer's exact p50/p90/p99 of minute `w` against the quantiles of
/// the samples fed (regenerated) and promlab's (the same requests through an
/// in-process ingester with every strategy); a summary for the note.
fn compare(
    port: u16,
    spec: &ReceiverSpec,
    plan: &FeedPlan,
    start_ms: i64,
    w: i64,
) -> Result<String> {
    let workload = FeedWorkload {
        groups: plan.groups,
        series_per_group: SERIES_PER_GROUP,
        ..FeedWorkload::seed(start_ms)
    };
    let fed_ticks = plan.warmup_ticks + plan.measured_ticks();
    let window_ticks: Vec<u64> = (0..fed_ticks)
        .filter(|&t| (w..w + WINDOW_MS).contains(&workload.timestamp(t, 0)))
        .collect();

    let fed = fed_answers(&workload, &window_ticks);
    let ours = promlab_answers(&workload, &window_ticks, w)?;

    // The peer's, from its raw samples; it may take a moment to make fresh writes searchable.
    let client = Client::new(Some(Duration::from_secs(120)), 1);
    let all_groups: Vec<u64> = (0..plan.groups).collect();
    let mut theirs: Vec<GroupAnswer> = Vec::with_capacity(plan.groups as usize);
    for batch in all_groups.chunks(GROUPS_PER_QUERY as usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut answers = loop {
            let raw = peer_samples(&client, port, batch, w)?;
            let complete = batch
                .iter()
                .all(|g| raw[g].len() as u64 == fed[*g as usize].count);
            if complete || Instant::now() > deadline {
                break raw;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        for g in batch {
            theirs.push(exact(answers.entry(*g).or_default()));
        }
    }

    let alpha = Plan::default().aggregations[0].relative_accuracy;
    let mut worst_ours = 0.0f64;
    let mut worst_stored = 0.0f64;
    for g in 0..plan.groups as usize {
        let (fed, theirs) = (&fed[g], &theirs[g]);
        if theirs.count != fed.count {
            bail!(
                "{} holds {} samples of group g{g} in the minute; {} were fed",
                spec.binary,
                theirs.count,
                fed.count
            );
        }
        let our = &ours[g];
        if our.count != fed.count {
            bail!(
                "promlab counted {} samples of g{g}; {} were fed",
                our.count,
                fed.count
            );
        }
        for (i, q) in QUANTILES.iter().enumerate() {
            let truth = theirs.quantiles[i];
            let stored = (truth - fed.quantiles[i]).abs() / fed.quantiles[i].abs();
            if stored > spec.stored_tolerance {
                bail!(
                    "{}'s p{} of g{g} is {truth}, but the samples fed give {}",
                    spec.binary,
                    q * 100.0,
                    fed.quantiles[i]
                );
            }
            worst_stored = worst_stored.max(stored);
            let estimate = our.quantiles[i];
            let relative = (estimate - truth).abs() / truth.abs();
            if relative > alpha * (1.0 + 1e-9) {
                bail!(
                    "quantiles disagree beyond α = {alpha}: g{g} p{}: {} says {truth} (exact), promlab says {estimate} (relative error {relative:.5})",
                    q * 100.0,
                    spec.binary
                );
            }
            worst_ours = worst_ours.max(relative);
        }
    }
    let minute = w.div_euclid(WINDOW_MS).rem_euclid(24 * 60);
    Ok(format!(
        "its exact p50/p90/p99 of minute {:02}:{:02} UTC ({} samples per group, from raw samples over its HTTP API) match the samples fed{}, and promlab's are within α = {alpha} of them for all {} groups (largest relative difference {:.5})",
        minute / 60,
        minute % 60,
        fed[0].count,
        if worst_stored == 0.0 {
            " bit for bit".to_string()
        } else {
            format!(" within {worst_stored:.1e}")
        },
        plan.groups,
        worst_ours
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compared_window_is_the_last_closed_minute() {
        let s = 1_800_000_000_000 - 1_800_000_000_000 % WINDOW_MS;
        // Quick: 70 ticks from S; the newest is S + 69 s, the watermark S + 64 s.
        assert_eq!(FeedPlan::for_size(true, 5).compared_window(s), s);
        // Full: 301 ticks; watermark S + 295 s closes the minute from S + 180 s.
        let full = FeedPlan::for_size(false, 7);
        assert_eq!(full.measured_ticks(), 301);
        assert_eq!(full.compared_window(s), s + 180_000);
        // A feed shorter than a minute: its first minute, open.
        let tiny = FeedPlan {
            groups: 2,
            warmup_ticks: 1,
            chunk_ticks: 3,
            chunks: 2,
        };
        assert_eq!(tiny.compared_window(s), s);
    }

    #[test]
    fn exact_quantiles_use_the_floor_rank() {
        let mut values: Vec<f64> = (1..=101).rev().map(f64::from).collect();
        let answer = exact(&mut values);
        assert_eq!(answer.count, 101);
        assert_eq!(answer.quantiles, vec![51.0, 91.0, 100.0]);
    }
}
