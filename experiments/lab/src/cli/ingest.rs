//! `promlab ingest` and `promlab feed`.

use anyhow::{Context, Result};
use promlab::ingest::feed::{self, Workload};
use promlab::ingest::pipeline::Ingester;
use promlab::ingest::plan::Plan;
use promlab::strategy::StrategySet;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct IngestArgs {
    /// Aggregation plan (TOML); without it, the seed's plan.
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// Strategies to use: a comma-separated list, `none`, `all`, or `default`.
    #[arg(long, default_value = "default")]
    pub strategies: StrategySet,
    /// Close every open window after the last file, as if the stream had ended.
    #[arg(long)]
    pub flush: bool,
    /// Largest decoded request, in bytes.
    #[arg(long, default_value_t = 32 << 20)]
    pub max_body_bytes: usize,
    /// Request body files (snappy-compressed `WriteRequest`s), replayed in name order.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Replays the files through the receiver's handler and prints, per aggregation,
/// the quantiles of its last closed window (a JSON array).
pub fn ingest(args: IngestArgs) -> Result<()> {
    let plan = Plan::load_or_default(args.plan.as_deref())?;
    let mut ingester = Ingester::new(plan, args.strategies).with_max_decoded(args.max_body_bytes);
    let mut files = args.files;
    files.sort();
    for path in &files {
        let body = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        ingester
            .handle(&body)
            .with_context(|| format!("in {}", path.display()))?;
    }
    if args.flush {
        ingester.flush();
    }
    let totals = ingester.totals();
    eprintln!(
        "promlab ingest: {} requests, {} samples: {} accepted, {} late, {} stale, {} rejected, {} unrouted",
        totals.requests, totals.samples, totals.accepted, totals.late, totals.stale, totals.rejected, totals.unrouted
    );
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &ingester.query_all())?;
    out.write_all(b"\n")?;
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct FeedArgs {
    /// Where to POST the requests.
    #[arg(long, default_value = "http://127.0.0.1:9201/api/v1/write")]
    pub url: String,
    #[arg(long, default_value_t = 1000)]
    pub groups: u64,
    #[arg(long, default_value_t = 100)]
    pub series_per_group: u64,
    #[arg(long, default_value_t = 1)]
    pub samples_per_sec: u64,
    #[arg(long, default_value_t = 1.5)]
    pub pareto_shape: f64,
    #[arg(long, default_value_t = 1.0)]
    pub pareto_scale: f64,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Ticks to send (one per second).
    #[arg(long, default_value_t = 60)]
    pub duration_secs: u64,
    /// The first tick to send: a later run continues an earlier one's feed
    /// (tick `t` has timestamp `start_ms + 1000·t` and its own values).
    #[arg(long, default_value_t = 0)]
    pub first_tick: u64,
    /// Timestamp of tick 0 (default: now).
    #[arg(long)]
    pub start_ms: Option<i64>,
    /// Rows (one series, one sample) per request.
    #[arg(long, default_value_t = 50_000)]
    pub batch_rows: usize,
    /// Requests in flight within a tick.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Write the request bodies into this directory instead of sending them.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn feed(args: FeedArgs) -> Result<()> {
    let start_ms = match args.start_ms {
        Some(ms) => ms,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as i64,
    };
    let workload = Workload {
        groups: args.groups,
        series_per_group: args.series_per_group,
        samples_per_sec: args.samples_per_sec.max(1),
        pareto_shape: args.pareto_shape,
        pareto_scale: args.pareto_scale,
        seed: args.seed,
        start_ms,
        batch_rows: args.batch_rows.max(1),
    };
    let ticks = args.first_tick..args.first_tick + args.duration_secs;
    let report = match &args.out {
        Some(dir) => feed::write_bodies(&workload, ticks, dir)?,
        None => crate::feed::send(&workload, ticks, &args.url, args.concurrency)?,
    };
    eprintln!(
        "promlab feed: {} ticks, {} requests, {} samples, {} failed requests, {} late ticks",
        report.ticks, report.requests, report.samples, report.failed_requests, report.late_ticks
    );
    if report.failed_requests > 0 {
        anyhow::bail!("{} requests failed", report.failed_requests);
    }
    Ok(())
}
