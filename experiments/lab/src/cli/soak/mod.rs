//! `promlab soak`: the reliability suite. Runs the real `promlab`
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
//!
//! Here: the arguments, the run and its clock. Its parts:
//! - `server.rs`: the servers and writer children, supervised;
//! - `feeder.rs` and `hostile.rs`: the receiver's clients, good and hostile;
//! - `sidecar.rs` and `churner.rs`: the sidecar's writers and scrapers, and
//!   what abuses its store directory;
//! - `exposition.rs`: the servers' expositions read with `promlab::scenarios::scrape_to_remote_write`;
//! - `tally.rs`: what each client's requests got;
//! - `report.rs`: the report and its checks.

mod churner;
mod exposition;
mod feeder;
mod hostile;
mod report;
mod server;
mod sidecar;
mod tally;

use churner::{churner, sweep, ChurnState};
use exposition::{final_total, receiver_accounting};
use feeder::{feeder, now_ms, FeedClock};
use hostile::{cardinality, hostile, slow_clients, SlowState};
use report::Report;
use server::Server;
use sidecar::{scraper, writer, writer_ops, WriterState};
use tally::Tallies;

use crate::machine::{Host, BUILD};
use anyhow::{bail, Context, Result};
use promlab::shared::strategy::StrategySet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
/// The good counter, written by the writers in one series, `{queue="default"}`.
const GOOD_COUNTER: &str = "soak_jobs_total";

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
        scope.spawn(|| slow_clients(&run, &receiver, &sidecar, &tallies, &clock, &slow));
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
