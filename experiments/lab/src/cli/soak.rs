//! `promlab soak`: the reliability suite (issue 12). Runs the real `promlab`
//! binary as child processes on loopback for a fixed time and replays the
//! hostile cases against them while they are under load:
//!
//! - the remote-write receiver (`promlab serve`) fed at `--overload` × the paced
//!   asap-1e5 rate by the feeder's own generator, while hostile clients send
//!   malformed, mislabelled, oversized, far-future and high-cardinality requests
//!   and a crowd of slow clients holds connections open;
//! - the store sidecar (`promlab serve --store`) scraped continuously while writer
//!   processes (`promlab replay-one`) write a counter whose exact total is known,
//!   and a churner truncates, deletes, grows, corrupts, renames and floods the
//!   store directory, one phase at a time.
//!
//! Every request has a client timeout, every loop is bounded in time and count,
//! and every child is killed when the suite ends (also on panic). A crashed
//! server is counted and restarted so the run goes on; a hung one is counted and
//! killed. The report (a table on stdout, Markdown and CSVs under `--out`) ends in
//! one line per check; the command fails if any check fails.
//! `experiments/reliability/README.md` describes the method and the checks.

use crate::http_client::{Client, Response};
use crate::machine::{Host, ProcessStats, BUILD};
use anyhow::{bail, Context, Result};
use promlab::ingest::feed::{splitmix64, FeedWorkload};
use promlab::ingest::wire;
use promlab::strategy::StrategySet;
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `promlab soak`: the reliability suite against the real binary.
#[derive(clap::Args, Debug)]
pub struct SoakArgs {
    /// How long the load runs, in seconds (setup and shutdown add a few).
    #[arg(long, default_value_t = 60)]
    pub secs: u64,
    /// Where the report goes (default experiments/reliability/results/<date>T<time>Z-<host>-<revision>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Strategies of the servers and writers: a comma-separated list, `none`, `all`,
    /// or `default` (the build's features; every strategy when none was named).
    #[arg(long, default_value = "default")]
    pub strategies: StrategySet,
    /// The feeder's rate as a multiple of the paced asap-1e5 rate (1e5 samples/s).
    #[arg(long, default_value_t = 10)]
    pub overload: u64,
    /// The receiver's peak RSS budget, in MiB (the cardinality client stops there).
    #[arg(long, default_value_t = 1024)]
    pub receiver_rss_budget_mib: u64,
    /// The sidecar's peak RSS budget, in MiB.
    #[arg(long, default_value_t = 256)]
    pub sidecar_rss_budget_mib: u64,
}

/// The servers' open-file limit: the usual default soft limit.
const FD_LIMIT: u64 = 1024;
/// Slow clients held open against the receiver: more than [`FD_LIMIT`].
const SLOW_CLIENTS: usize = 1100;
/// Store files dropped at once by the churner's `many-files` phase: more than [`FD_LIMIT`].
const MANY_FILES: u32 = 1100;
/// Client timeout of scrapes, probes and hostile requests.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Client timeout of the feeder's 50,000-row requests.
const FEED_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a server may take to exit after SIGTERM before it is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Distinct groups the cardinality client sends at most, 10,000 per request.
const CARDINALITY_CAP: u64 = 2_000_000;
const CARDINALITY_BATCH: u64 = 10_000;
/// Increments of one writer run (one `replay-one` process).
const INCREMENTS_PER_RUN: u64 = 20_000;
const WRITERS: u32 = 2;
/// The good counter's exposition line, up to its value.
const GOOD_SERIES: &str = "soak_jobs_total{queue=\"default\"} ";

const REGISTRY: &str = r#"{"metrics": [
    {"name": "soak_jobs_total", "type": "counter", "help": "Jobs done by the soak writers", "labels": ["queue"], "aggregation": "sum"},
    {"name": "soak_victim", "type": "counter", "help": "Files the churner abuses", "labels": ["k"], "aggregation": "sum"}
]}"#;

/// The churner's phases, in order; each lasts an equal share of the first 80 % of the run.
const PHASES: [&str; 10] = [
    "quiet",
    "truncate",
    "delete",
    "grow",
    "garbage",
    "odd-names",
    "prefix-clash",
    "bad-keys",
    "fifo",
    "many-files",
];
/// The phase after the churner's last: nothing abused, writers still writing.
const TAIL: &str = "tail (quiet)";
/// Scrapes that started in one phase and ended in the next.
const PHASE_CHANGE: &str = "(spanning a phase change)";

pub fn soak(args: SoakArgs) -> Result<()> {
    let began = Instant::now();
    let started_at = crate::machine::utc_now();
    let exe = std::env::current_exe().context("cannot find the promlab executable")?;
    let out = args.out.clone().unwrap_or_else(default_results_dir);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let work = tempfile::tempdir().context("creating a scratch directory")?;
    let store = work.path().join("store");
    std::fs::create_dir(&store)?;
    let registry = work.path().join("registry.json");
    std::fs::write(&registry, REGISTRY)?;
    let strategies = args.strategies.to_string();
    eprintln!(
        "promlab soak: {} s, strategies {strategies}, feeder at {}× asap-1e5, report in {}",
        args.secs,
        args.overload,
        out.display()
    );

    let receiver = Server::start(
        "receiver",
        &exe,
        vec!["serve".into(), "--strategies".into(), strategies.clone()],
    )?;
    let sidecar = Server::start(
        "sidecar",
        &exe,
        vec![
            "serve".into(),
            "--store".into(),
            store.display().to_string(),
            "--registry".into(),
            registry.display().to_string(),
            "--strategies".into(),
            strategies.clone(),
        ],
    )?;

    let run = Run {
        start: Instant::now(),
        length: Duration::from_secs(args.secs.max(1)),
        stop: AtomicBool::new(false),
    };
    let tallies = Tallies::default();
    let scrapes = Tallies::default();
    let writers = WriterState::default();
    let churn = ChurnState::default();
    let slow = SlowState::default();
    let feed_ticks = AtomicU64::new(0);
    let clock = FeedClock(now_ms().into());
    let cardinality_groups = AtomicU64::new(0);
    let cardinality_stop = Mutex::new(String::new());

    let ops = (0..WRITERS)
        .map(|w| -> Result<PathBuf> {
            let path = work.path().join(format!("ops-{w}.jsonl"));
            std::fs::write(&path, writer_ops(700_001 + w))?;
            Ok(path)
        })
        .collect::<Result<Vec<_>>>()?;

    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !run.over() {
                receiver.watch();
                sidecar.watch();
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        scope.spawn(|| {
            feeder(
                &run,
                &receiver,
                &tallies,
                args.overload,
                &feed_ticks,
                &clock,
            )
        });
        scope.spawn(|| hostile(&run, &receiver, &tallies, &slow, &clock));
        scope.spawn(|| {
            let why = cardinality(
                &run,
                &receiver,
                &tallies,
                args.receiver_rss_budget_mib,
                &cardinality_groups,
                &clock,
            );
            *cardinality_stop.lock().unwrap() = why;
        });
        scope.spawn(|| slow_clients(&run, &receiver, &tallies, &slow));
        for ops in &ops {
            let (exe, store, registry, strategies, writers, run) =
                (&exe, &store, &registry, &strategies, &writers, &run);
            scope.spawn(move || writer(run, exe, registry, store, strategies, ops, writers));
        }
        scope.spawn(|| churner(&run, &store, &churn));
        for _ in 0..2 {
            scope.spawn(|| scraper(&run, &sidecar, &scrapes, &writers, &churn));
        }
        std::thread::sleep(run.length);
        run.stop.store(true, Ordering::Relaxed);
    });
    // Anything the churner left, gone; then the exact total of what the writers finished.
    sweep(&store);
    let final_scrape = final_total(&sidecar);
    let accounting = receiver_accounting(&receiver);
    let receiver_end = receiver.shut_down();
    let sidecar_end = sidecar.shut_down();

    let report = Report {
        args: &args,
        started_at,
        elapsed: began.elapsed(),
        tallies: tallies.into_inner(),
        scrapes: scrapes.into_inner(),
        accounting,
        receiver: receiver_end,
        sidecar: sidecar_end,
        writers: writers.summary(),
        final_scrape,
        fifo_stuck: churn.fifo_stuck.load(Ordering::Relaxed),
        churn: churn.notes.into_inner().unwrap(),
        slow: slow.summary(),
        feed_ticks: feed_ticks.into_inner(),
        cardinality_groups: cardinality_groups.into_inner(),
        cardinality_stop: cardinality_stop.into_inner().unwrap(),
    };
    let failed = report.write(&out)?;
    if failed > 0 {
        bail!(
            "{failed} reliability checks failed (report in {})",
            out.display()
        );
    }
    Ok(())
}

/// `experiments/reliability/results/<date>T<time>Z-<host>-<revision>/`, fresh per run.
fn default_results_dir() -> PathBuf {
    let host = Host::read().hostname.unwrap_or_else(|| "host".into());
    let stamp = crate::machine::utc_now().replace(':', "");
    PathBuf::from("experiments/reliability/results")
        .join(format!("{stamp}-{host}-{}", BUILD.git_revision))
}

/// The clock of the run: everything stops by itself at `start + length`.
struct Run {
    start: Instant,
    length: Duration,
    stop: AtomicBool,
}

impl Run {
    fn over(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.start.elapsed() >= self.length
    }

    /// Whether the run is between fractions `from` and `to` of its length.
    fn within(&self, from: f64, to: f64) -> bool {
        let at = self.start.elapsed().as_secs_f64() / self.length.as_secs_f64();
        (from..to).contains(&at) && !self.over()
    }

    fn at(&self, fraction: f64) -> Instant {
        self.start + self.length.mul_f64(fraction)
    }

    /// Sleeps `d`, or less if the run ends first.
    fn sleep(&self, d: Duration) {
        let until = (Instant::now() + d).min(self.start + self.length);
        while !self.over() && Instant::now() < until {
            std::thread::sleep((until - Instant::now()).min(Duration::from_millis(50)));
        }
    }
}

// ---------------------------------------------------------------------------
// Servers: spawned, watched (crash → counted and restarted), shut down, killed on drop.

struct Server {
    name: &'static str,
    exe: PathBuf,
    args: Vec<String>,
    running: Mutex<Option<Running>>,
    base_url: RwLock<String>,
    /// Every exit that was not asked for, described.
    exits: Mutex<Vec<String>>,
    peak_rss_kib: AtomicU64,
}

struct Running {
    child: Child,
    /// The last lines it wrote to stderr, for the report of a crash.
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

/// How a server ended.
struct ServerEnd {
    name: &'static str,
    exits: Vec<String>,
    peak_rss_kib: u64,
    /// `Some(true)`: exited within the grace after SIGTERM; `Some(false)`: had to be killed.
    graceful: Option<bool>,
}

impl Server {
    fn start(name: &'static str, exe: &Path, args: Vec<String>) -> Result<Server> {
        let server = Server {
            name,
            exe: exe.to_owned(),
            args,
            running: Mutex::new(None),
            base_url: RwLock::new(String::new()),
            exits: Mutex::new(Vec::new()),
            peak_rss_kib: AtomicU64::new(0),
        };
        let (running, addr) = server.spawn()?;
        *server.running.lock().unwrap() = Some(running);
        *server.base_url.write().unwrap() = format!("http://{addr}");
        Ok(server)
    }

    /// Starts the child on an ephemeral loopback port, its open files limited to
    /// [`FD_LIMIT`], and reads the address it announces.
    fn spawn(&self) -> Result<(Running, SocketAddr)> {
        let mut command = Command::new(&self.exe);
        command
            .args(&self.args)
            .args(["--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: only async-signal-safe calls (getrlimit, setrlimit) between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                let mut limit = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                    limit.rlim_cur = limit.rlim_max.min(FD_LIMIT);
                    libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start the {}", self.name))?;
        let stderr = child.stderr.take().expect("piped stderr");
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let tail = tail.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(addr) = announced_address(&line) {
                        let _ = tx.send(addr);
                    }
                    let mut tail = tail.lock().unwrap();
                    if tail.len() == 5 {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            });
        }
        let running = Running {
            child,
            stderr_tail: tail,
        };
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => Ok((running, addr)),
            Err(_) => {
                let mut running = running;
                let _ = running.child.kill();
                let _ = running.child.wait();
                bail!(
                    "the {} did not announce its address: {}",
                    self.name,
                    running.tail()
                )
            }
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url.read().unwrap())
    }

    fn pid(&self) -> Option<u32> {
        self.running.lock().unwrap().as_ref().map(|r| r.child.id())
    }

    /// Resident set size now, in KiB.
    fn rss_kib(&self) -> Option<u64> {
        ProcessStats::of(self.pid()?).ok()?.rss_kib
    }

    /// Samples the peak RSS; counts and restarts a child that exited.
    fn watch(&self) {
        let mut running = self.running.lock().unwrap();
        let Some(r) = running.as_mut() else { return };
        if let Some(peak) = ProcessStats::of(r.child.id())
            .ok()
            .and_then(|s| s.peak_rss_kib)
        {
            self.peak_rss_kib.fetch_max(peak, Ordering::Relaxed);
        }
        let Ok(Some(status)) = r.child.try_wait() else {
            return;
        };
        let what = format!("{}; stderr: {}", describe(status), r.tail());
        eprintln!("promlab soak: the {} exited: {what}", self.name);
        self.exits.lock().unwrap().push(what);
        *running = None;
        match self.spawn() {
            Ok((fresh, addr)) => {
                *running = Some(fresh);
                *self.base_url.write().unwrap() = format!("http://{addr}");
            }
            Err(e) => self
                .exits
                .lock()
                .unwrap()
                .push(format!("restart failed: {e:#}")),
        }
    }

    /// SIGTERM, then SIGKILL after [`SHUTDOWN_GRACE`].
    fn shut_down(&self) -> ServerEnd {
        self.watch();
        let mut graceful = None;
        if let Some(mut r) = self.running.lock().unwrap().take() {
            let pid = r.child.id();
            if let Some(peak) = ProcessStats::of(pid).ok().and_then(|s| s.peak_rss_kib) {
                self.peak_rss_kib.fetch_max(peak, Ordering::Relaxed);
            }
            // SAFETY: signalling our own child, which has not been reaped.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + SHUTDOWN_GRACE;
            let mut exited = false;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = r.child.try_wait() {
                    exited = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if !exited {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
            graceful = Some(exited);
        }
        ServerEnd {
            name: self.name,
            exits: self.exits.lock().unwrap().clone(),
            peak_rss_kib: self.peak_rss_kib.load(Ordering::Relaxed),
            graceful,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut r) = self.running.get_mut().ok().and_then(Option::take) {
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
    }
}

impl Running {
    fn tail(&self) -> String {
        let tail = self.stderr_tail.lock().unwrap();
        tail.iter().cloned().collect::<Vec<_>>().join(" | ")
    }
}

/// The address in `... on http://ADDR[/path] ...`, the line `promlab serve` starts with.
fn announced_address(line: &str) -> Option<SocketAddr> {
    let (_, rest) = line.split_once(" on http://")?;
    rest.split(['/', ' ']).next()?.parse().ok()
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal} ({})", signal_name(signal)),
        _ => status.to_string(),
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGBUS => "SIGBUS",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        _ => "other",
    }
}

// ---------------------------------------------------------------------------
// Tallies: requests answered per status, latency, samples in 2xx answers.

#[derive(Default)]
struct Tally {
    outcomes: BTreeMap<String, u64>,
    latencies_us: Vec<u64>,
    /// Samples in requests answered 2xx.
    samples_ok: u64,
    /// Scrapes whose good counter was outside what the writers can have written.
    out_of_bounds: u64,
    /// Scrapes with an exposition line Prometheus would reject.
    invalid: u64,
    /// The last problem seen, for the report.
    note: String,
}

impl Tally {
    /// The first problem of a phase is its own; later ones may be the next phase's.
    fn note_first(&mut self, note: String) {
        if self.note.is_empty() {
            self.note = note;
        }
    }

    fn requests(&self) -> u64 {
        self.outcomes.values().sum()
    }

    fn count(&self, pred: impl Fn(&str) -> bool) -> u64 {
        self.outcomes
            .iter()
            .filter(|(k, _)| pred(k))
            .map(|(_, n)| n)
            .sum()
    }

    fn p99_ms(&self) -> f64 {
        let mut l = self.latencies_us.clone();
        if l.is_empty() {
            return 0.0;
        }
        l.sort_unstable();
        l[(l.len() * 99).div_ceil(100) - 1] as f64 / 1000.0
    }

    fn outcomes_text(&self) -> String {
        self.outcomes
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[derive(Default)]
struct Tallies(Mutex<BTreeMap<String, Tally>>);

impl Tallies {
    fn record(&self, name: &str, outcome: &Outcome, elapsed: Duration, samples: u64) {
        let mut all = self.0.lock().unwrap();
        let tally = all.entry(name.to_owned()).or_default();
        *tally.outcomes.entry(outcome.key()).or_default() += 1;
        tally.latencies_us.push(elapsed.as_micros() as u64);
        if outcome.is_success() {
            tally.samples_ok += samples;
        }
        if let Outcome::Failed(e) = outcome {
            tally.note_first(e.clone());
        }
    }

    fn with(&self, name: &str, f: impl FnOnce(&mut Tally)) {
        f(self.0.lock().unwrap().entry(name.to_owned()).or_default());
    }

    fn into_inner(self) -> BTreeMap<String, Tally> {
        self.0.into_inner().unwrap()
    }
}

/// What a request got: an HTTP status, or no answer.
enum Outcome {
    Status(u16),
    Timeout,
    Failed(String),
}

impl Outcome {
    fn of(result: &Result<Response>) -> Outcome {
        match result {
            Ok(r) => Outcome::Status(r.status),
            Err(e) => {
                let text = format!("{e:#}");
                let lower = text.to_ascii_lowercase();
                if lower.contains("timeout") || lower.contains("timed out") {
                    Outcome::Timeout
                } else {
                    Outcome::Failed(text)
                }
            }
        }
    }

    fn key(&self) -> String {
        match self {
            Outcome::Status(s) => s.to_string(),
            Outcome::Timeout => "timeout".into(),
            Outcome::Failed(_) => "no answer".into(),
        }
    }

    fn is_success(&self) -> bool {
        matches!(self, Outcome::Status(200..=299))
    }
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed())
}

// ---------------------------------------------------------------------------
// The receiver's clients.

const REMOTE_WRITE: [(&str, &str); 3] = [
    ("Content-Type", "application/x-protobuf"),
    ("Content-Encoding", "snappy"),
    ("X-Prometheus-Remote-Write-Version", "0.1.0"),
];
const FEEDER: &str = "feeder (asap-1e5)";
const CARDINALITY: &str = "cardinality (fresh label_0 values)";
const PROBE: &str = "probe during slow clients";

/// The timestamp of the feeder's current tick: what the other clients stamp their
/// valid samples with, so none is ahead of the feed (the feeder may fall behind the
/// wall clock under overload) and none is late.
struct FeedClock(std::sync::atomic::AtomicI64);

impl FeedClock {
    fn now(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The feeder's workload at `overload` × its paced rate, as fast as the receiver takes it.
fn feeder(
    run: &Run,
    rx: &Server,
    tallies: &Tallies,
    overload: u64,
    ticks: &AtomicU64,
    clock: &FeedClock,
) {
    let workload = FeedWorkload {
        samples_per_sec: overload.max(1),
        ..FeedWorkload::seed(clock.now())
    };
    let generator = workload.generator();
    let per_tick = workload.samples_per_tick();
    let batch = workload.batch_rows as u64;
    let client = Client::new(Some(FEED_TIMEOUT), 2);
    for t in 0.. {
        run.sleep((run.start + Duration::from_secs(t)).saturating_duration_since(Instant::now()));
        if run.over() {
            break;
        }
        clock.0.store(workload.timestamp(t, 0), Ordering::Relaxed);
        let bodies = generator.tick_bodies(t);
        let next = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(i) else { break };
                    if run.over() {
                        break;
                    }
                    let rows = batch.min(per_tick - i as u64 * batch);
                    let (result, elapsed) =
                        timed(|| client.post(&rx.url("/api/v1/write"), &REMOTE_WRITE, body));
                    tallies.record(FEEDER, &Outcome::of(&result), elapsed, rows);
                });
            }
        });
        ticks.fetch_add(1, Ordering::Relaxed);
    }
}

/// Remote-write bodies of one sample per series, `data{instance="i0", label_0=...}`.
fn samples_body(groups: impl Iterator<Item = String>, timestamp: i64) -> (Vec<u8>, u64) {
    let mut raw = Vec::new();
    let mut n = 0;
    for group in groups {
        let mut labels = Vec::new();
        wire::put_label(&mut labels, b"__name__", b"data");
        wire::put_label(&mut labels, b"instance", b"i0");
        wire::put_label(&mut labels, b"label_0", group.as_bytes());
        wire::put_series_one_sample(&mut raw, &labels, 1.0, timestamp);
        n += 1;
    }
    (wire::compress(&raw), n)
}

/// One hostile request: what it sends and the statuses a correct receiver answers.
struct HostileCase {
    name: &'static str,
    method: &'static str,
    path: String,
    headers: Vec<(&'static str, &'static str)>,
    body: Vec<u8>,
    /// Valid samples in the body (counted as sent when answered 2xx).
    samples: u64,
    /// When set, the body is one valid sample built at send time, its timestamp this
    /// function of the feeder's current one (so a valid sample is never late by itself).
    one_sample_at: Option<fn(i64) -> i64>,
    expected: &'static [u16],
    /// Whether the connection closed while sending counts as refused: a server may
    /// answer 413 and close before a body it will not take has been sent.
    closed_is_refusal: bool,
    /// The fraction of the run it is sent in (the far-future cases go last: they
    /// would make the rest of the run's samples late on a receiver without the fix).
    window: (f64, f64),
}

fn hostile_cases() -> Vec<HostileCase> {
    let rw = || REMOTE_WRITE.to_vec();
    let with_type = |t: &'static str| vec![("Content-Type", t), ("Content-Encoding", "snappy")];
    let mut unsorted = Vec::new();
    let mut labels = Vec::new();
    wire::put_label(&mut labels, b"label_0", b"g0");
    wire::put_label(&mut labels, b"__name__", b"data");
    wire::put_series_one_sample(&mut unsorted, &labels, 1.0, now_ms());
    let mut nameless = Vec::new();
    let mut labels = Vec::new();
    wire::put_label(&mut labels, b"label_0", b"g0");
    wire::put_series_one_sample(&mut nameless, &labels, 1.0, now_ms());
    let mut four_gb = Vec::new();
    put_varint(&mut four_gb, 4 << 30);
    four_gb.extend_from_slice(&[0; 64]);
    let garbage: Vec<u8> = (0..4096u64).map(|i| splitmix64(i) as u8).collect();
    let all = (0.0, 1.0);
    let case = |name, headers, body, samples, expected, window| HostileCase {
        name,
        method: "POST",
        path: "/api/v1/write".into(),
        headers,
        body,
        samples,
        one_sample_at: None,
        expected,
        closed_is_refusal: false,
        window,
    };
    let fresh = |name, headers, at: fn(i64) -> i64, expected, window| HostileCase {
        one_sample_at: Some(at),
        ..case(name, headers, Vec::new(), 1, expected, window)
    };
    vec![
        case("malformed snappy", rw(), garbage.clone(), 0, &[400], all),
        case(
            "malformed protobuf",
            rw(),
            wire::compress(&garbage),
            0,
            &[400],
            all,
        ),
        case(
            "series without __name__",
            rw(),
            wire::compress(&nameless),
            0,
            &[400],
            all,
        ),
        case(
            "unsorted labels",
            rw(),
            wire::compress(&unsorted),
            0,
            &[400],
            all,
        ),
        fresh(
            "content type text/plain",
            with_type("text/plain"),
            |t| t,
            &[415],
            all,
        ),
        fresh(
            "content type application/x-protobufXYZ",
            with_type("application/x-protobufXYZ"),
            |t| t,
            &[415],
            all,
        ),
        fresh(
            "remote-write 2.0 content type",
            with_type("application/x-protobuf;proto=io.prometheus.write.v2.Request"),
            |t| t,
            &[415],
            all,
        ),
        fresh(
            "content encoding gzip",
            vec![
                ("Content-Type", "application/x-protobuf"),
                ("Content-Encoding", "gzip"),
            ],
            |t| t,
            &[415],
            all,
        ),
        HostileCase {
            closed_is_refusal: true,
            ..case("body of 33 MiB", rw(), vec![0; 33 << 20], 0, &[413], all)
        },
        case("snappy header of 4 GiB", rw(), four_gb, 0, &[413], all),
        case(
            "snappy bomb (40 MiB of zeros)",
            rw(),
            wire::compress(&vec![0; 40 << 20]),
            0,
            &[413],
            all,
        ),
        // A correct receiver takes these (204, the sample counted too far ahead) or refuses
        // them (400/422); the harm they do is checked by the late-samples check.
        fresh(
            "timestamp in year 2100",
            rw(),
            |_| 4_102_444_800_000,
            &[204, 400, 422],
            (0.8, 1.0),
        ),
        fresh(
            "timestamp in ns sent as ms",
            rw(),
            |t| t.saturating_mul(1_000_000),
            &[204, 400, 422],
            (0.8, 1.0),
        ),
        HostileCase {
            name: "quantiles query with a bad window",
            method: "GET",
            path: "/api/v1/quantiles?agg=data&window=%ZZ".into(),
            headers: Vec::new(),
            body: Vec::new(),
            samples: 0,
            one_sample_at: None,
            expected: &[400],
            closed_is_refusal: false,
            window: all,
        },
        HostileCase {
            name: "quantiles query of an unknown aggregation",
            method: "GET",
            path: "/api/v1/quantiles?agg=nope".into(),
            headers: Vec::new(),
            body: Vec::new(),
            samples: 0,
            one_sample_at: None,
            expected: &[404],
            closed_is_refusal: false,
            window: all,
        },
    ]
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Sends the hostile cases in turn, one every 100 ms, pausing while the slow clients hold
/// the receiver's connections (the probe measures that window).
fn hostile(run: &Run, rx: &Server, tallies: &Tallies, slow: &SlowState, clock: &FeedClock) {
    let cases = hostile_cases();
    let client = Client::new(Some(REQUEST_TIMEOUT), 1);
    for case in cases.iter().cycle() {
        if run.over() {
            break;
        }
        if !run.within(case.window.0, case.window.1) || slow.active.load(Ordering::Relaxed) {
            if slow.active.load(Ordering::Relaxed) {
                run.sleep(Duration::from_millis(100));
            }
            continue;
        }
        let body = match case.one_sample_at {
            Some(at) => samples_body(std::iter::once("g0".to_string()), at(clock.now())).0,
            None => case.body.clone(),
        };
        let (result, elapsed) =
            timed(|| client.request(case.method, &rx.url(&case.path), &case.headers, &body));
        tallies.record(case.name, &Outcome::of(&result), elapsed, case.samples);
        run.sleep(Duration::from_millis(100));
    }
}

/// Fresh groups, 10,000 a request, until [`CARDINALITY_CAP`], the receiver's RSS budget,
/// or 50 % of the run. Returns why it stopped.
fn cardinality(
    run: &Run,
    rx: &Server,
    tallies: &Tallies,
    budget_mib: u64,
    groups: &AtomicU64,
    clock: &FeedClock,
) -> String {
    run.sleep(run.length.mul_f64(0.1));
    let client = Client::new(Some(REQUEST_TIMEOUT), 1);
    let mut next = 0u64;
    loop {
        if run.over() || Instant::now() >= run.at(0.5) {
            return "stopped at 50 % of the run".into();
        }
        if next >= CARDINALITY_CAP {
            return format!("stopped at its cap of {CARDINALITY_CAP} groups");
        }
        if let Some(rss) = rx.rss_kib() {
            if rss > budget_mib * 1024 {
                return format!(
                    "stopped: receiver RSS {} MiB over the budget of {budget_mib} MiB",
                    rss / 1024
                );
            }
        }
        let (body, n) = samples_body(
            (next..next + CARDINALITY_BATCH).map(|g| format!("c{g}")),
            clock.now(),
        );
        let (result, elapsed) =
            timed(|| client.post(&rx.url("/api/v1/write"), &REMOTE_WRITE, &body));
        tallies.record(CARDINALITY, &Outcome::of(&result), elapsed, n);
        next += CARDINALITY_BATCH;
        groups.store(next, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct SlowState {
    active: AtomicBool,
    opened: AtomicU64,
    refused: AtomicU64,
    /// Slow connections the receiver closed (a header-read timeout or a connection cap).
    closed_by_server: AtomicU64,
    held_secs: Mutex<f64>,
}

impl SlowState {
    fn summary(&self) -> String {
        format!(
            "{} slow connections opened ({} refused), held {:.0} s sending a byte a second; the receiver closed {} of them",
            self.opened.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
            self.held_secs.lock().unwrap(),
            self.closed_by_server.load(Ordering::Relaxed),
        )
    }
}

/// From 50 % to 80 % of the run: [`SLOW_CLIENTS`] connections that send a request
/// header one byte a second, while a probe on fresh connections checks the receiver
/// still answers.
fn slow_clients(run: &Run, rx: &Server, tallies: &Tallies, slow: &SlowState) {
    run.sleep(run.at(0.5).saturating_duration_since(Instant::now()));
    if run.over() {
        return;
    }
    let began = Instant::now();
    slow.active.store(true, Ordering::Relaxed);
    let window_end = run.at(0.8);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while Instant::now() < window_end && !run.over() {
                // A fresh connection every time: what a new legitimate client gets.
                let client = Client::new(Some(REQUEST_TIMEOUT), 1);
                let (result, elapsed) = timed(|| client.get(&rx.url("/metrics"), &[]));
                tallies.record(PROBE, &Outcome::of(&result), elapsed, 0);
                run.sleep(Duration::from_millis(500));
            }
        });
        hold_slow_connections(run, rx, slow, window_end);
    });
    *slow.held_secs.lock().unwrap() = began.elapsed().as_secs_f64();
    slow.active.store(false, Ordering::Relaxed);
}

/// Opens the slow connections and sends each a byte a second until `until`.
fn hold_slow_connections(run: &Run, rx: &Server, slow: &SlowState, until: Instant) {
    let addr: Option<SocketAddr> = rx
        .url("")
        .strip_prefix("http://")
        .and_then(|a| a.parse().ok());
    let mut conns: Vec<Option<TcpStream>> = Vec::new();
    if let Some(addr) = addr {
        for _ in 0..SLOW_CLIENTS {
            if Instant::now() >= until || run.over() {
                break;
            }
            match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(mut s) => {
                    let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
                    let _ = s.write_all(b"POST /api/v1/write HTTP/1.1\r\nHost: soak\r\n");
                    slow.opened.fetch_add(1, Ordering::Relaxed);
                    conns.push(Some(s));
                }
                Err(_) => {
                    slow.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    let mut next_byte = Instant::now();
    while Instant::now() < until && !run.over() {
        if Instant::now() >= next_byte {
            for conn in conns.iter_mut() {
                if let Some(s) = conn {
                    if s.write_all(b"X").is_err() {
                        slow.closed_by_server.fetch_add(1, Ordering::Relaxed);
                        *conn = None;
                    }
                }
            }
            next_byte += Duration::from_secs(1);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the receiver counted, from its own /metrics, against what the clients saw.
struct Accounting {
    /// `promlab_ingest_samples_total`, every `promlab_ingest_samples_<reason>_total`
    /// and `promlab_receiver_samples_dropped_total` (samples counted and dropped
    /// past a limit, summed over reasons).
    counters: BTreeMap<String, f64>,
    /// `promlab_receiver_samples_dropped_total` by its `reason` label.
    dropped_by_reason: BTreeMap<String, f64>,
    error: Option<String>,
}

fn receiver_accounting(rx: &Server) -> Accounting {
    rx.watch();
    let client = Client::new(Some(Duration::from_secs(10)), 1);
    match client.get(&rx.url("/metrics"), &[]) {
        Ok(r) if r.status == 200 => {
            let text = r.text();
            let mut counters = parse_flat(&text, "promlab_ingest_samples_");
            counters.extend(parse_flat(&text, "promlab_receiver_samples_dropped_"));
            Accounting {
                counters,
                dropped_by_reason: dropped_by_reason(&text),
                error: None,
            }
        }
        Ok(r) => Accounting {
            counters: BTreeMap::new(),
            dropped_by_reason: BTreeMap::new(),
            error: Some(format!("/metrics answered {}", r.status)),
        },
        Err(e) => Accounting {
            counters: BTreeMap::new(),
            dropped_by_reason: BTreeMap::new(),
            error: Some(format!("/metrics: {e:#}")),
        },
    }
}

/// Every sample of the families whose name starts with `prefix` and ends in
/// `_total`, summed over their labels.
/// `promlab_receiver_samples_dropped_total{reason="…"} n` lines, by reason.
fn dropped_by_reason(text: &str) -> BTreeMap<String, f64> {
    let prefix = "promlab_receiver_samples_dropped_total{reason=\"";
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|rest| {
            let (reason, value) = rest.split_once("\"} ")?;
            Some((reason.to_owned(), value.trim().parse::<f64>().ok()?))
        })
        .collect()
}

fn parse_flat(text: &str, prefix: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with(prefix)) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series);
        if let (true, Ok(v)) = (name.ends_with("_total"), value.parse::<f64>()) {
            *out.entry(name.to_owned()).or_default() += v;
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The sidecar: writers, churner, scrapers.

/// One writer run's op log: [`INCREMENTS_PER_RUN`] increments of the good counter.
fn writer_ops(pid: u32) -> String {
    let line = format!(
        "{{\"pid\":{pid},\"metric\":\"soak_jobs_total\",\"op\":\"inc\",\"value\":1,\"labels\":{{\"queue\":\"default\"}}}}\n"
    );
    line.repeat(INCREMENTS_PER_RUN as usize)
}

#[derive(Default)]
struct WriterState {
    started: AtomicU64,
    completed: AtomicU64,
    failures: Mutex<Vec<String>>,
}

impl WriterState {
    fn summary(&self) -> (u64, u64, Vec<String>) {
        (
            self.started.load(Ordering::Relaxed),
            self.completed.load(Ordering::Relaxed),
            self.failures.lock().unwrap().clone(),
        )
    }
}

/// Runs `promlab replay-one` on its op log again and again until the run ends; each
/// run adds exactly [`INCREMENTS_PER_RUN`] to the good counter.
fn writer(
    run: &Run,
    exe: &Path,
    registry: &Path,
    store: &Path,
    strategies: &str,
    ops: &Path,
    state: &WriterState,
) {
    while !run.over() {
        state.started.fetch_add(1, Ordering::Relaxed);
        let spawned = Command::new(exe)
            .arg("replay-one")
            .arg("--registry")
            .arg(registry)
            .arg("--store")
            .arg(store)
            .args(["--strategies", strategies, "--dialect", "uri"])
            .arg(ops)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        let child = match spawned {
            Ok(child) => Reaped(child),
            Err(e) => {
                state.failures.lock().unwrap().push(format!("spawn: {e}"));
                return;
            }
        };
        match child.wait_within(Duration::from_secs(60)) {
            Some((status, _)) if status.success() => {
                state.completed.fetch_add(1, Ordering::Relaxed);
            }
            Some((status, stderr)) => state.failures.lock().unwrap().push(format!(
                "{}: {}",
                describe(status),
                stderr.trim()
            )),
            None => state
                .failures
                .lock()
                .unwrap()
                .push("hung for 60 s, killed".into()),
        }
    }
}

/// A child killed (and reaped) when dropped.
struct Reaped(Child);

impl Reaped {
    /// Its exit status and stderr, or `None` (and killed) if it runs past `limit`.
    fn wait_within(mut self, limit: Duration) -> Option<(ExitStatus, String)> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.0.try_wait() {
                let mut stderr = String::new();
                if let Some(mut e) = self.0.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
                }
                return Some((status, stderr));
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[derive(Default)]
struct ChurnState {
    phase: AtomicUsize,
    /// Scrapes found blocked opening the FIFO (released by opening its write end).
    fifo_stuck: AtomicU32,
    /// What each phase did, for the report.
    notes: Mutex<Vec<(String, String)>>,
}

impl ChurnState {
    fn phase_name(&self) -> &'static str {
        PHASES
            .get(self.phase.load(Ordering::Relaxed))
            .copied()
            .unwrap_or(TAIL)
    }

    fn note(&self, phase: &str, note: String) {
        self.notes.lock().unwrap().push((phase.to_owned(), note));
    }
}

/// A store file as client_ruby lays it out: `used`, then entries of
/// (padded length, key, padding, value, timestamp), `len` bytes in all (sparse).
fn raw_store_file(entries: &[(&[u8], f64)], len: u64) -> Vec<u8> {
    let mut bytes = promlab::storefile::file_bytes(entries.iter().copied());
    bytes.resize(bytes.len().max(len as usize), 0);
    bytes
}

fn victim(store: &Path, pid: u32) -> PathBuf {
    promlab::storefile::file_path(store, "soak_victim", pid)
}

/// One phase per slot of the first 80 % of the run, each cleaning up after itself.
fn churner(run: &Run, store: &Path, state: &ChurnState) {
    let slot = run.length.mul_f64(0.8 / PHASES.len() as f64);
    for (i, phase) in PHASES.iter().enumerate() {
        if run.over() {
            break;
        }
        state.phase.store(i, Ordering::Relaxed);
        let end = run.start + slot * (i as u32 + 1);
        let note = match churn_phase(phase, run, store, end, &state.fifo_stuck) {
            Ok(note) => note,
            Err(e) => format!("churner error: {e:#}"),
        };
        sweep(store);
        state.note(phase, note);
    }
    state.phase.store(PHASES.len(), Ordering::Relaxed);
}

fn churn_phase(
    phase: &str,
    run: &Run,
    store: &Path,
    end: Instant,
    fifo_stuck: &AtomicU32,
) -> Result<String> {
    let until_end = || !run.over() && Instant::now() < end;
    let pause = |ms| run.sleep(Duration::from_millis(ms));
    let keys: Vec<Vec<u8>> = (0..1000).map(|k| format!("k=v{k}").into_bytes()).collect();
    let many: Vec<(&[u8], f64)> = keys.iter().map(|k| (k.as_slice(), 1.0)).collect();
    Ok(match phase {
        "quiet" => {
            run.sleep(end.saturating_duration_since(Instant::now()));
            "nothing abused".into()
        }
        "truncate" => {
            // 20,000 entries (~700 KiB used) in a 2 MiB file, cut to 4 KiB and restored
            // every few milliseconds without the lock: an outside `truncate` or `> file`
            // racing the reader's walk of its mapping.
            use std::os::unix::fs::FileExt;
            let path = victim(store, 900_001);
            let keys: Vec<Vec<u8>> = (0..20_000)
                .map(|k| format!("k=t{k}").into_bytes())
                .collect();
            let entries: Vec<(&[u8], f64)> = keys.iter().map(|k| (k.as_slice(), 1.0)).collect();
            let full = raw_store_file(&entries, 2 << 20);
            std::fs::write(&path, &full)?;
            let file = std::fs::OpenOptions::new().write(true).open(&path)?;
            let mut cuts = 0;
            while until_end() {
                pause(3);
                file.set_len(4096)?;
                cuts += 1;
                pause(3);
                file.write_all_at(&full[4096..], 4096)?;
            }
            format!("{cuts} cuts of a 2 MiB store file (20,000 entries) to 4 KiB and back")
        }
        "delete" => {
            let mut rounds = 0;
            while until_end() {
                for pid in 910_000..910_020 {
                    std::fs::write(victim(store, pid), raw_store_file(&many[..10], 4096))?;
                }
                pause(10);
                for pid in 910_000..910_020 {
                    std::fs::remove_file(victim(store, pid))?;
                }
                pause(10);
                rounds += 1;
            }
            format!("{rounds} rounds of 20 files created, then deleted")
        }
        "grow" => {
            // A real writer adding new series as fast as it can: the file grows past 1 MiB.
            let registry = promlab::registry::Registry::from_json(REGISTRY)?;
            let config = promlab::store::ClientConfig {
                pid_override: Some(920_001),
                ..Default::default()
            };
            let mut client = promlab::store::Client::new(store, &registry, config)?;
            let id = client.metric("soak_victim")?;
            let mut n = 0u64;
            while until_end() && n < 60_000 {
                for _ in 0..200 {
                    let value = format!("grow{n}");
                    client.increment(id, &[("k", value.as_str())], 1.0)?;
                    n += 1;
                }
                pause(5);
            }
            let len = std::fs::metadata(victim(store, 920_001)).map_or(0, |m| m.len());
            format!("{n} series written, the file grew to {} KiB", len / 1024)
        }
        "garbage" => {
            // Bad files of the good metric: each must be skipped, never fail the scrape.
            let good = |pid| promlab::storefile::file_path(store, "soak_jobs_total", pid);
            let random: Vec<u8> = (0..4096u64).map(|i| splitmix64(i ^ 0xbad) as u8).collect();
            let mut past_end = raw_store_file(&[(b"queue=default", 5.0)], 4096);
            past_end[..4].copy_from_slice(&100_000i32.to_le_bytes());
            let mut torn = raw_store_file(&[(b"queue=default", 5.0)], 0);
            let torn_len = torn.len() - 10;
            torn.truncate(torn_len);
            let mut bad_length = raw_store_file(&[(b"queue=default", 5.0)], 4096);
            bad_length[8..12].copy_from_slice(&(-8i32).to_le_bytes());
            std::fs::write(good(930_001), &random)?;
            std::fs::write(good(930_002), b"")?;
            std::fs::write(good(930_003), &past_end)?;
            std::fs::write(good(930_004), &torn)?;
            std::fs::write(good(930_005), &bad_length)?;
            run.sleep(end.saturating_duration_since(Instant::now()));
            "5 bad files of the good metric: random bytes, empty, used past the end, a torn entry, a negative entry length".into()
        }
        "odd-names" => {
            use std::os::unix::ffi::OsStrExt;
            let zero = raw_store_file(&[(b"queue=default", 0.0)], 4096);
            std::fs::write(store.join("metric_soak_jobs_total___.bin"), &zero)?;
            std::fs::write(store.join("metric_soak_jobs_total___abc.bin"), &zero)?;
            std::fs::write(store.join("metric_soak_victim___1\n2.bin"), &zero)?;
            std::fs::write(
                store.join(std::ffi::OsStr::from_bytes(
                    b"metric_soak_victim___\xff\xfe.bin",
                )),
                &zero,
            )?;
            std::fs::write(store.join("metric_.bin"), &zero)?;
            std::fs::write(store.join("metric_soak_victim___940001.bin.tmp"), &zero)?;
            std::fs::write(
                store.join(format!("metric_{}___1.bin", "x".repeat(230))),
                &zero,
            )?;
            std::fs::create_dir(victim(store, 940_002))?;
            std::os::unix::fs::symlink("/nonexistent/promlab-soak", victim(store, 940_003))?;
            std::os::unix::fs::symlink(victim(store, 940_004), victim(store, 940_004))?;
            run.sleep(end.saturating_duration_since(Instant::now()));
            "odd names (empty, non-numeric, newline and non-UTF-8 pids, 255 bytes), a directory, a dangling symlink, a symlink loop".into()
        }
        "prefix-clash" => {
            // A file of metric `soak_jobs_total___b`: counted under soak_jobs_total by a glob.
            let clash = store.join("metric_soak_jobs_total___b___950001.bin");
            std::fs::write(clash, raw_store_file(&[(b"queue=default", 1e9)], 4096))?;
            run.sleep(end.saturating_duration_since(Instant::now()));
            "metric_soak_jobs_total___b___950001.bin with 1e9 in the good series".into()
        }
        "bad-keys" => {
            // First an invalid label name (a valid key, an exposition Prometheus rejects),
            // then keys that do not decode.
            let path = victim(store, 960_001);
            std::fs::write(
                &path,
                raw_store_file(&[(b"k=ok", 1.0), (b"co%20de=x", 1.0)], 4096),
            )?;
            run.sleep((end.saturating_duration_since(Instant::now())) / 2);
            std::fs::write(
                &path,
                raw_store_file(
                    &[
                        (b"k=ok", 1.0),
                        (b"k=%ZZ", 1.0),
                        (b"=x", 1.0),
                        (b"k=\xff", 1.0),
                    ],
                    4096,
                ),
            )?;
            run.sleep(end.saturating_duration_since(Instant::now()));
            "a label name with a space (co%20de), then a bad escape, an empty label name, a non-ASCII byte".into()
        }
        "many-files" => {
            let one = raw_store_file(&[(b"k=many", 1.0)], 4096);
            for pid in 0..MANY_FILES {
                std::fs::write(victim(store, 970_000 + pid), &one)?;
            }
            run.sleep(end.saturating_duration_since(Instant::now()));
            format!(
                "{MANY_FILES} valid files at once (the sidecar's open-file limit is {FD_LIMIT})"
            )
        }
        "fifo" => {
            let path = victim(store, 980_001);
            let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
            // SAFETY: a valid C string; mkfifo only creates a node.
            if unsafe { libc::mkfifo(name.as_ptr(), 0o644) } != 0 {
                bail!("mkfifo: {}", std::io::Error::last_os_error());
            }
            // Held past a scrape's timeout, so a scrape stuck opening it shows as one.
            run.sleep(REQUEST_TIMEOUT + Duration::from_secs(1));
            let stuck = release_fifo(store, &path)?;
            fifo_stuck.store(stuck, Ordering::Relaxed);
            run.sleep(end.saturating_duration_since(Instant::now()));
            format!("a FIFO named like a store file; readers found blocked opening it: {stuck}")
        }
        other => bail!("unknown phase {other}"),
    })
}

/// Moves a FIFO out of the store and opens its write end a few times, so a reader
/// blocked opening it (a hung scrape) wakes up; returns how many were found blocked.
fn release_fifo(store: &Path, path: &Path) -> Result<u32> {
    let aside = store.with_extension("fifo-aside");
    std::fs::rename(path, &aside)?;
    let name = std::ffi::CString::new(aside.as_os_str().as_encoded_bytes())?;
    let mut stuck = 0;
    for _ in 0..20 {
        // SAFETY: a valid C string; the descriptor is closed right away.
        let fd = unsafe { libc::open(name.as_ptr(), libc::O_WRONLY | libc::O_NONBLOCK) };
        if fd >= 0 {
            stuck += 1;
            // SAFETY: our own descriptor.
            unsafe { libc::close(fd) };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::remove_file(&aside)?;
    Ok(stuck)
}

/// Removes everything in the store but the writers' own files.
fn sweep(store: &Path) {
    let Ok(entries) = std::fs::read_dir(store) else {
        return;
    };
    let writers: Vec<PathBuf> = (0..WRITERS)
        .map(|w| promlab::storefile::file_path(store, "soak_jobs_total", 700_001 + w))
        .collect();
    for entry in entries.flatten() {
        let path = entry.path();
        if writers.contains(&path) {
            continue;
        }
        let meta = std::fs::symlink_metadata(&path);
        let _ = match meta {
            Ok(m) if m.file_type().is_dir() => std::fs::remove_dir_all(&path),
            Ok(m) if std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()) => {
                release_fifo(store, &path)
                    .map(drop)
                    .map_err(std::io::Error::other)
            }
            _ => std::fs::remove_file(&path),
        };
    }
}

/// Scrapes `/metrics` until the run ends, tallied by churn phase: status, latency,
/// whether the good counter is within what the writers can have written, and whether
/// every line is exposition Prometheus accepts.
fn scraper(
    run: &Run,
    sidecar: &Server,
    scrapes: &Tallies,
    writers: &WriterState,
    churn: &ChurnState,
) {
    let client = Client::new(Some(REQUEST_TIMEOUT), 1);
    while !run.over() {
        let phase = churn.phase_name();
        let low = writers.completed.load(Ordering::Relaxed) * INCREMENTS_PER_RUN;
        let (result, elapsed) = timed(|| client.get(&sidecar.url("/metrics"), &[]));
        let high = writers.started.load(Ordering::Relaxed) * INCREMENTS_PER_RUN;
        // A scrape that spans a change of phase may have seen either phase's files.
        let phase = if churn.phase_name() == phase {
            phase
        } else {
            PHASE_CHANGE
        };
        let outcome = Outcome::of(&result);
        scrapes.record(phase, &outcome, elapsed, 0);
        if let Outcome::Failed(_) = outcome {
            // Refused: the sidecar is down (the watcher restarts it); no busy loop.
            std::thread::sleep(Duration::from_millis(20));
        }
        match &result {
            Ok(r) if r.status == 200 => {
                let text = r.text();
                let total = good_total(&text);
                let in_bounds = match total {
                    Some(v) => v >= low as f64 && v <= high as f64,
                    None => low == 0,
                };
                let invalid = text.lines().find(|l| !valid_exposition_line(l.as_bytes()));
                scrapes.with(phase, |t| {
                    if !in_bounds {
                        t.out_of_bounds += 1;
                        t.note_first(format!(
                            "good counter {total:?}, writers had written {low}..={high}"
                        ));
                    }
                    if let Some(line) = invalid {
                        t.invalid += 1;
                        t.note_first(format!("invalid line {:?}", truncate(line, 80)));
                    }
                });
            }
            Ok(r) => {
                let body = truncate(r.text().trim(), 120);
                scrapes.with(phase, |t| t.note_first(format!("{}: {body}", r.status)));
            }
            Err(_) => {}
        }
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_owned();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn good_total(text: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(GOOD_SERIES))
        .and_then(|v| v.trim().parse().ok())
}

/// After the run: one scrape of the clean store (10 s timeout), the good counter's total.
fn final_total(sidecar: &Server) -> Result<f64, String> {
    sidecar.watch();
    let client = Client::new(Some(Duration::from_secs(10)), 1);
    match client.get(&sidecar.url("/metrics"), &[]) {
        Ok(r) if r.status == 200 => {
            good_total(&r.text()).ok_or_else(|| "the good series is missing".into())
        }
        Ok(r) => Err(format!("{}: {}", r.status, truncate(r.text().trim(), 160))),
        Err(e) => Err(format!("{e:#}")),
    }
}

/// Whether a line of the text format is one Prometheus accepts: a comment, or a
/// metric name, optional `{name="value",...}` with valid label names and escapes,
/// a space and a value.
fn valid_exposition_line(line: &[u8]) -> bool {
    if line.is_empty() || line[0] == b'#' {
        return true;
    }
    let name_start = |b: u8| b.is_ascii_alphabetic() || b == b'_';
    let name_rest = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    if !(name_start(line[0]) || line[0] == b':') {
        return false;
    }
    while i < line.len() && (name_rest(line[i]) || line[i] == b':') {
        i += 1;
    }
    if line.get(i) == Some(&b'{') {
        i += 1;
        loop {
            if line.get(i) == Some(&b'}') {
                i += 1;
                break;
            }
            if !line.get(i).is_some_and(|&b| name_start(b)) {
                return false;
            }
            while i < line.len() && name_rest(line[i]) {
                i += 1;
            }
            if line.get(i..i + 2) != Some(b"=\"") {
                return false;
            }
            i += 2;
            loop {
                match line.get(i) {
                    None => return false,
                    Some(b'"') => break,
                    Some(b'\\') => {
                        if !matches!(line.get(i + 1), Some(b'\\' | b'"' | b'n')) {
                            return false;
                        }
                        i += 2;
                    }
                    Some(_) => i += 1,
                }
            }
            i += 1;
            match line.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => {}
                _ => return false,
            }
        }
    }
    line.get(i) == Some(&b' ') && i + 1 < line.len()
}

// ---------------------------------------------------------------------------
// The report.

struct Report<'a> {
    args: &'a SoakArgs,
    /// When the run started, UTC.
    started_at: String,
    elapsed: Duration,
    tallies: BTreeMap<String, Tally>,
    scrapes: BTreeMap<String, Tally>,
    accounting: Accounting,
    receiver: ServerEnd,
    sidecar: ServerEnd,
    writers: (u64, u64, Vec<String>),
    final_scrape: Result<f64, String>,
    churn: Vec<(String, String)>,
    fifo_stuck: u32,
    slow: String,
    feed_ticks: u64,
    cardinality_groups: u64,
    cardinality_stop: String,
}

#[derive(serde::Serialize)]
struct RequestRow<'a> {
    server: &'a str,
    client: &'a str,
    requests: u64,
    outcomes: String,
    p99_ms: f64,
    samples_in_2xx: u64,
    expected: String,
    note: &'a str,
}

#[derive(serde::Serialize)]
struct CheckRow {
    check: String,
    result: &'static str,
    detail: String,
}

#[derive(serde::Serialize)]
struct ServerRow<'a> {
    server: &'a str,
    unexpected_exits: usize,
    peak_rss_mib: f64,
    rss_budget_mib: u64,
    shutdown: &'a str,
    exits: String,
}

impl Report<'_> {
    /// Writes the report and prints it; returns how many checks failed.
    fn write(&self, out: &Path) -> Result<usize> {
        let cases = hostile_cases();
        let expected_of = |name: &str| {
            cases
                .iter()
                .find(|c| c.name == name)
                .map(|c| {
                    c.expected
                        .iter()
                        .map(u16::to_string)
                        .collect::<Vec<_>>()
                        .join("/")
                })
                .unwrap_or_else(|| match name {
                    FEEDER | CARDINALITY => "2xx (429 counted as dropped)".into(),
                    PROBE => "200".into(),
                    _ => String::new(),
                })
        };
        let mut requests = Vec::new();
        for (name, t) in &self.tallies {
            requests.push(RequestRow {
                server: "receiver",
                client: name,
                requests: t.requests(),
                outcomes: t.outcomes_text(),
                p99_ms: round2(t.p99_ms()),
                samples_in_2xx: t.samples_ok,
                expected: expected_of(name),
                note: &t.note,
            });
        }
        let phase_order = |name: &str| {
            PHASES
                .iter()
                .position(|p| *p == name)
                .unwrap_or(PHASES.len())
        };
        let mut phases: Vec<(&String, &Tally)> = self.scrapes.iter().collect();
        phases.sort_by_key(|(name, _)| phase_order(name));
        for (name, t) in &phases {
            requests.push(RequestRow {
                server: "sidecar",
                client: name,
                requests: t.requests(),
                outcomes: t.outcomes_text(),
                p99_ms: round2(t.p99_ms()),
                samples_in_2xx: 0,
                expected: format!(
                    "200; {} out of bounds, {} invalid",
                    t.out_of_bounds, t.invalid
                ),
                note: &t.note,
            });
        }
        let servers = [
            (&self.receiver, self.args.receiver_rss_budget_mib),
            (&self.sidecar, self.args.sidecar_rss_budget_mib),
        ];
        let server_rows: Vec<ServerRow> = servers
            .iter()
            .map(|(s, budget)| ServerRow {
                server: s.name,
                unexpected_exits: s.exits.len(),
                peak_rss_mib: round2(s.peak_rss_kib as f64 / 1024.0),
                rss_budget_mib: *budget,
                shutdown: match s.graceful {
                    Some(true) => "exited on SIGTERM",
                    Some(false) => "hung after SIGTERM, killed",
                    None => "not running",
                },
                exits: s.exits.join(" / "),
            })
            .collect();
        let checks = self.checks();

        let csv_out = |name: &str,
                       write: &dyn Fn(&mut csv::Writer<std::fs::File>) -> Result<()>|
         -> Result<()> {
            let path = out.join(name);
            let mut w = csv::Writer::from_path(&path)
                .with_context(|| format!("writing {}", path.display()))?;
            write(&mut w)?;
            w.flush()?;
            Ok(())
        };
        csv_out("requests.csv", &|w| {
            requests
                .iter()
                .try_for_each(|r| w.serialize(r).map_err(Into::into))
        })?;
        csv_out("servers.csv", &|w| {
            server_rows
                .iter()
                .try_for_each(|r| w.serialize(r).map_err(Into::into))
        })?;
        csv_out("checks.csv", &|w| {
            checks
                .iter()
                .try_for_each(|r| w.serialize(r).map_err(Into::into))
        })?;

        let md = self.markdown(&requests, &server_rows, &checks);
        std::fs::write(out.join("summary.md"), &md)?;
        print!("{md}");
        eprintln!("promlab soak: report in {}", out.display());
        Ok(checks.iter().filter(|c| c.result == "FAIL").count())
    }

    fn lost(&self) -> Option<(f64, f64, f64)> {
        if self.accounting.error.is_some() || !self.receiver.exits.is_empty() {
            return None;
        }
        let sent: u64 = self.tallies.values().map(|t| t.samples_ok).sum();
        let counted = self
            .accounting
            .counters
            .get("promlab_ingest_samples_total")
            .copied()
            .unwrap_or(0.0);
        let dispositions: f64 = self
            .accounting
            .counters
            .iter()
            .filter(|(k, _)| *k != "promlab_ingest_samples_total")
            .map(|(_, v)| v)
            .sum();
        Some((sent as f64, counted, sent as f64 - dispositions))
    }

    fn checks(&self) -> Vec<CheckRow> {
        let mut checks = Vec::new();
        let mut check = |name: &str, pass: bool, detail: String| {
            checks.push(CheckRow {
                check: name.to_owned(),
                result: if pass { "PASS" } else { "FAIL" },
                detail,
            })
        };
        let limit = self.args.secs as f64 + 60.0;
        check(
            "soak.completes-in-time",
            self.elapsed.as_secs_f64() <= limit,
            format!("{:.1} s (limit {limit:.0} s)", self.elapsed.as_secs_f64()),
        );
        for (s, budget) in [
            (&self.receiver, self.args.receiver_rss_budget_mib),
            (&self.sidecar, self.args.sidecar_rss_budget_mib),
        ] {
            check(
                &format!("{}.no-crash", s.name),
                s.exits.is_empty(),
                if s.exits.is_empty() {
                    "no unexpected exit".into()
                } else {
                    format!(
                        "{} unexpected exits: {}",
                        s.exits.len(),
                        truncate(&s.exits[0], 300)
                    )
                },
            );
            let peak = s.peak_rss_kib as f64 / 1024.0;
            check(
                &format!("{}.rss-within-budget", s.name),
                peak <= budget as f64,
                format!("peak RSS {peak:.1} MiB, budget {budget} MiB"),
            );
            check(
                &format!("{}.graceful-shutdown", s.name),
                s.graceful == Some(true),
                format!(
                    "SIGTERM → exit within {} s: {:?}",
                    SHUTDOWN_GRACE.as_secs(),
                    s.graceful
                ),
            );
        }
        // The receiver.
        match self.lost() {
            Some((sent, counted, lost)) => check(
                "receiver.no-lost-samples",
                lost == 0.0 && sent == counted,
                format!(
                    "samples in 2xx answers {sent}, receiver counted {counted}, accounted for by {} (dropped by reason: {}); lost {lost}",
                    self.accounting
                        .counters
                        .iter()
                        .filter(|(k, _)| *k != "promlab_ingest_samples_total")
                        .map(|(k, v)| format!("{} {v}", short(k)))
                        .collect::<Vec<_>>()
                        .join(", "),
                    self.accounting
                        .dropped_by_reason
                        .iter()
                        .map(|(reason, v)| format!("{reason} {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            None => check(
                "receiver.no-lost-samples",
                false,
                format!(
                    "cannot account: {}",
                    self.accounting
                        .error
                        .clone()
                        .unwrap_or_else(|| "the receiver restarted (its counters reset)".into())
                ),
            ),
        }
        let late = self
            .accounting
            .counters
            .get("promlab_ingest_samples_late_total")
            .copied()
            .unwrap_or(0.0);
        check(
            "receiver.on-time-samples-not-late",
            late == 0.0 && self.accounting.error.is_none(),
            format!("{late} samples counted late (every client sends current timestamps; the far-future cases go in the last 20 %)"),
        );
        for name in [FEEDER, CARDINALITY] {
            let t = self.tallies.get(name);
            let five = t.map_or(0, |t| t.count(|k| k.starts_with('5')));
            let unanswered = t.map_or(0, |t| t.count(|k| k == "timeout" || k == "no answer"));
            let bad = t.map_or(0, |t| t.count(|k| !(k.starts_with('2') || k == "429")));
            check(
                &format!(
                    "receiver.good-data.{}",
                    name.split(' ').next().unwrap_or(name)
                ),
                t.is_some_and(|t| t.requests() > 0) && bad == 0,
                format!(
                    "{} requests: {}; {five} 5xx, {unanswered} unanswered",
                    t.map_or(0, Tally::requests),
                    t.map_or(String::new(), Tally::outcomes_text)
                ),
            );
        }
        for case in hostile_cases() {
            let t = self.tallies.get(case.name);
            let wrong = t.map_or(0, |t| {
                t.count(|k| {
                    !(case.expected.iter().any(|e| e.to_string() == k)
                        || case.closed_is_refusal && k == "no answer")
                })
            });
            check(
                &format!("receiver.hostile.{}", slug(case.name)),
                t.is_some_and(|t| t.requests() > 0) && wrong == 0,
                format!(
                    "expected {:?}, got {}",
                    case.expected,
                    t.map_or("no request sent".into(), Tally::outcomes_text)
                ),
            );
        }
        let probe = self.tallies.get(PROBE);
        check(
            "receiver.slow-clients-do-not-block",
            probe.is_some_and(|t| t.requests() > 0 && t.count(|k| k == "200") == t.requests()),
            format!(
                "fresh-connection probes: {}; {}",
                probe.map_or("none".into(), Tally::outcomes_text),
                self.slow
            ),
        );
        // The sidecar.
        let all = |f: &dyn Fn(&Tally) -> u64| self.scrapes.values().map(f).sum::<u64>();
        let failing_phases = |f: &dyn Fn(&Tally) -> u64| {
            let mut v: Vec<String> = self
                .scrapes
                .iter()
                .filter(|(_, t)| f(t) > 0)
                .map(|(p, t)| format!("{p} {}", f(t)))
                .collect();
            v.sort();
            v.join(", ")
        };
        let five = |t: &Tally| t.count(|k| k.starts_with('5'));
        let unanswered = |t: &Tally| t.count(|k| k == "timeout");
        let refused = |t: &Tally| t.count(|k| k == "no answer");
        check(
            "sidecar.no-5xx",
            all(&five) == 0,
            format!(
                "{} of {} scrapes 5xx; by phase: {}",
                all(&five),
                all(&Tally::requests),
                failing_phases(&five)
            ),
        );
        check(
            "sidecar.scrapes-answered",
            all(&unanswered) == 0,
            format!(
                "{} scrapes unanswered within {} s; by phase: {} (and {} refused or cut off, by phase: {})",
                all(&unanswered),
                REQUEST_TIMEOUT.as_secs(),
                failing_phases(&unanswered),
                all(&refused),
                failing_phases(&refused),
            ),
        );
        let stuck = self.fifo_stuck;
        check(
            "sidecar.fifo-does-not-block",
            stuck == 0,
            format!("{stuck} scrapes found blocked opening a FIFO named like a store file (released by the suite)"),
        );
        let oob = |t: &Tally| t.out_of_bounds;
        check(
            "sidecar.good-total-within-bounds",
            all(&oob) == 0,
            format!("{} scrapes with the good counter outside what the writers had written; by phase: {}", all(&oob), failing_phases(&oob)),
        );
        let invalid = |t: &Tally| t.invalid;
        check(
            "sidecar.exposition-valid",
            all(&invalid) == 0,
            format!(
                "{} scrapes with a line Prometheus rejects; by phase: {}",
                all(&invalid),
                failing_phases(&invalid)
            ),
        );
        let (started, completed, failures) = &self.writers;
        check(
            "writers.all-runs-succeeded",
            failures.is_empty() && *completed > 0,
            format!(
                "{completed} of {started} writer runs completed; failures: {}",
                failures.first().map_or("none".into(), |f| truncate(f, 200))
            ),
        );
        let expected = completed * INCREMENTS_PER_RUN;
        check(
            "sidecar.final-total-exact",
            self.final_scrape == Ok(expected as f64),
            format!(
                "final scrape {:?}, writers wrote {expected}",
                self.final_scrape
            ),
        );
        checks
    }

    fn markdown(
        &self,
        requests: &[RequestRow],
        servers: &[ServerRow],
        checks: &[CheckRow],
    ) -> String {
        let host = Host::read();
        let mut md = String::new();
        let mut line = |s: String| {
            md.push_str(&s);
            md.push('\n');
        };
        line("# promlab soak".into());
        line(String::new());
        line(format!(
            "Started {} on {} ({} cores, {} MiB, {}), promlab {} ({}), strategies `{}`, {} s of load ({:.0} s in all).",
            self.started_at,
            host.hostname.as_deref().unwrap_or("?"),
            host.cores,
            host.memory_kib.unwrap_or(0) / 1024,
            host.cpu.as_deref().unwrap_or("?"),
            BUILD.git_revision,
            BUILD.profile,
            self.args.strategies,
            self.args.secs,
            self.elapsed.as_secs_f64()
        ));
        line(String::new());
        let failed = checks.iter().filter(|c| c.result == "FAIL").count();
        line(format!(
            "## Checks: {} passed, {failed} failed",
            checks.len() - failed
        ));
        line(String::new());
        line("| check | result | detail |".into());
        line("|---|---|---|".into());
        for c in checks {
            line(format!(
                "| {} | {} | {} |",
                c.check,
                c.result,
                md_cell(&c.detail)
            ));
        }
        line(String::new());
        line("## Servers".into());
        line(String::new());
        line("| server | unexpected exits | peak RSS (MiB) | budget (MiB) | shutdown |".into());
        line("|---|---:|---:|---:|---|".into());
        for s in servers {
            line(format!(
                "| {} | {} | {:.1} | {} | {} |",
                s.server, s.unexpected_exits, s.peak_rss_mib, s.rss_budget_mib, s.shutdown
            ));
        }
        line(String::new());
        line("## Requests".into());
        line(String::new());
        line(format!(
            "Receiver: the feeder started {} ticks of {} samples ({}× the paced asap-1e5 rate) and got {:.0} samples/s answered 2xx over the {} s; the cardinality client sent {} fresh groups and {}. Sidecar: scrapes by churn phase (the first problem seen in each).",
            self.feed_ticks,
            self.args.overload.max(1) * 100_000,
            self.args.overload,
            self.tallies.get(FEEDER).map_or(0, |t| t.samples_ok) as f64 / self.args.secs.max(1) as f64,
            self.args.secs,
            self.cardinality_groups,
            self.cardinality_stop,
        ));
        line(String::new());
        line("| server | client / phase | requests | answered | p99 (ms) | samples in 2xx | expected | last problem |".into());
        line("|---|---|---:|---|---:|---:|---|---|".into());
        for r in requests {
            line(format!(
                "| {} | {} | {} | {} | {:.2} | {} | {} | {} |",
                r.server,
                r.client,
                r.requests,
                r.outcomes,
                r.p99_ms,
                r.samples_in_2xx,
                r.expected,
                md_cell(&truncate(r.note, 160))
            ));
        }
        line(String::new());
        line("## Receiver accounting (its own /metrics at the end)".into());
        line(String::new());
        line("| counter | value |".into());
        line("|---|---:|".into());
        let sent: u64 = self.tallies.values().map(|t| t.samples_ok).sum();
        line(format!("| samples in 2xx answers (clients) | {sent} |"));
        for (k, v) in &self.accounting.counters {
            line(format!("| {k} | {v} |"));
        }
        for (reason, v) in &self.accounting.dropped_by_reason {
            line(format!(
                "| promlab_receiver_samples_dropped_total{{reason=\"{reason}\"}} | {v} |"
            ));
        }
        match self.lost() {
            Some((_, _, lost)) => line(format!("| lost (sent − accounted for) | {lost} |")),
            None => line(format!(
                "| lost | unknown: {} |",
                md_cell(
                    self.accounting
                        .error
                        .as_deref()
                        .unwrap_or("the receiver restarted")
                )
            )),
        }
        line(String::new());
        line("## Sidecar".into());
        line(String::new());
        let (started, completed, _) = &self.writers;
        line(format!(
            "{WRITERS} writer processes (`promlab replay-one`, {INCREMENTS_PER_RUN} increments a run): {completed} of {started} runs completed; final scrape {:?}, expected {}.",
            self.final_scrape,
            completed * INCREMENTS_PER_RUN
        ));
        line(String::new());
        for (phase, note) in &self.churn {
            line(format!("- {phase}: {}", md_cell(note)));
        }
        md
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn short(counter: &str) -> &str {
    counter
        .strip_prefix("promlab_ingest_samples_")
        .or_else(|| counter.strip_prefix("promlab_receiver_samples_"))
        .and_then(|s| s.strip_suffix("_total"))
        .unwrap_or(counter)
}

fn slug(name: &str) -> String {
    let mut s = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('-') {
            s.push('-');
        }
    }
    s.trim_matches('-').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_lines() {
        assert!(valid_exposition_line(b"# HELP a b"));
        assert!(valid_exposition_line(b"a_total 1.0"));
        assert!(valid_exposition_line(br#"a{k="v",l="x\"y\\z\n"} 1"#));
        assert!(!valid_exposition_line(br#"a{co de="x"} 1"#));
        assert!(!valid_exposition_line(br#"a{k="v} 1"#));
        assert!(!valid_exposition_line(b"a"));
        assert!(!valid_exposition_line(b"1a 1"));
    }

    #[test]
    fn addresses_and_counters() {
        assert_eq!(
            announced_address("promlab: remote-write receiver on http://127.0.0.1:4242/api/v1/write (strategies: all)"),
            Some("127.0.0.1:4242".parse().unwrap())
        );
        assert_eq!(
            announced_address(
                "promlab: serving /metrics (store) on http://127.0.0.1:9 (strategies: all)"
            ),
            Some("127.0.0.1:9".parse().unwrap())
        );
        let counters = parse_flat(
            "# TYPE promlab_ingest_samples_total counter\npromlab_ingest_samples_total 10\npromlab_ingest_samples_dropped_total{reason=\"a\"} 2\npromlab_ingest_samples_dropped_total{reason=\"b\"} 3\npromlab_sketch_bins 9\n",
            "promlab_ingest_samples_",
        );
        assert_eq!(counters["promlab_ingest_samples_total"], 10.0);
        assert_eq!(counters["promlab_ingest_samples_dropped_total"], 5.0);
        assert_eq!(
            slug("content type application/x-protobufXYZ"),
            "content-type-application-x-protobufxyz"
        );
    }

    #[test]
    fn raw_store_files_read_back() {
        let bytes = raw_store_file(&[(b"k=a", 2.5), (b"k=bb", 1.0)], 4096);
        assert_eq!(bytes.len(), 4096);
        let used = promlab::storefile::check_used(bytes[..4].try_into().unwrap(), 4096).unwrap();
        let entries: Vec<_> = promlab::storefile::entries(&bytes, used)
            .map(|e| e.unwrap())
            .map(|e| {
                (
                    promlab::storefile::strip_padding(e.key()).to_vec(),
                    e.value(),
                )
            })
            .collect();
        assert_eq!(entries, [(b"k=a".to_vec(), 2.5), (b"k=bb".to_vec(), 1.0)]);
    }
}
