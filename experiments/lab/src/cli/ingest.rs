//! `promlab ingest` and `promlab feed`.

use anyhow::{Context, Result};
use promlab::ingest::feed::{self, FeedWorkload};
use promlab::ingest::pipeline::Ingester;
use promlab::ingest::plan::Plan;
use promlab::ingest::wire;
use promlab::shared::strategy::StrategySet;
use std::io::Write;
use std::path::PathBuf;

/// `promlab ingest`: replay remote-write bodies offline.
#[derive(clap::Args, Debug)]
#[command(after_help = PLAN_HELP)]
pub struct IngestArgs {
    /// Aggregation plan (TOML, format below); without it, the feeder's plan
    /// (metric `data` grouped by `label_0`).
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// Strategies to use: a comma-separated list, `none` (the baseline), `all`, or
    /// `default` (the build's features; every strategy when none was named).
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

/// The plan format, for `--help` (the same text as `promlab::ingest::plan`'s doc).
const PLAN_HELP: &str = "\
Plan format (TOML):
  lateness_secs = 5          # how far behind the newest timestamp a window still takes samples
  keep_windows = 10          # closed windows kept per aggregation
  [[aggregation]]
  id = \"data\"                # the name the answer carries
  metric = \"data\"            # __name__ to take
  group_by = [\"label_0\"]     # one DDSketch per distinct value tuple, per window
  window_secs = 60           # tumbling windows
  relative_accuracy = 0.01   # DDSketch alpha
  quantiles = [0.5, 0.9, 0.99]
  match = { job = \"feeder\" } # optional equality matchers on other labels
A plan for a Prometheus server's own metrics: experiments/plans/prometheus-captures.toml";

/// Replays the files through the receiver's handler and prints, per aggregation,
/// the quantiles of its last closed window (a JSON array).
pub fn ingest(args: IngestArgs) -> Result<()> {
    let plan = Plan::load_or_default(args.plan.as_deref())?;
    eprintln!("promlab ingest: strategies {}", args.strategies);
    let mut ingester =
        Ingester::new(plan.clone(), args.strategies).with_max_decoded(args.max_body_bytes);
    let mut files = args.files;
    files.sort();
    let mut bodies = Vec::with_capacity(files.len());
    for path in &files {
        let body = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        ingester
            .handle(&body)
            .with_context(|| format!("in {}", path.display()))?;
        bodies.push(body);
    }
    if args.flush {
        ingester.flush();
    }
    let totals = ingester.totals();
    eprintln!(
        "promlab ingest: {} requests, {} samples: {} accepted, {} late, {} stale, {} rejected, {} unrouted",
        totals.requests, totals.samples, totals.accepted, totals.late, totals.stale, totals.rejected, totals.unrouted
    );
    if totals.accepted == 0 && totals.samples > 0 {
        eprintln!("{}", nothing_routed(&plan, &bodies, args.max_body_bytes));
    }
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &ingester.query_all())?;
    out.write_all(b"\n")?;
    Ok(())
}

/// Why nothing was routed: the plan's selectors beside the metric names the
/// requests carry (the most frequent first), so a wrong plan is plain to see.
fn nothing_routed(plan: &Plan, bodies: &[Vec<u8>], limit: usize) -> String {
    let mut seen: std::collections::BTreeMap<Vec<u8>, u64> = Default::default();
    let mut raw = Vec::new();
    for body in bodies {
        let Ok(()) = wire::decompress(body, limit, &mut raw) else {
            continue;
        };
        let Ok(batch) = wire::decode_borrowed(&raw) else {
            continue;
        };
        for series in &batch.series {
            if let Some((_, name)) = batch
                .series_labels(series)
                .iter()
                .find(|(n, _)| *n == b"__name__")
            {
                *seen.entry(name.to_vec()).or_default() += 1;
            }
        }
    }
    let mut names: Vec<(u64, String)> = seen
        .into_iter()
        .map(|(name, n)| (n, String::from_utf8_lossy(&name).into_owned()))
        .collect();
    names.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let shown: Vec<&str> = names
        .iter()
        .take(12)
        .map(|(_, name)| name.as_str())
        .collect();
    let selectors: Vec<String> = plan
        .aggregations
        .iter()
        .map(|a| {
            let matchers: Vec<String> = a
                .matchers
                .iter()
                .map(|(k, v)| format!("{k}={v:?}"))
                .collect();
            if matchers.is_empty() {
                format!("{} (metric `{}`)", a.id, a.metric)
            } else {
                format!("{} (metric `{}`, {})", a.id, a.metric, matchers.join(", "))
            }
        })
        .collect();
    format!(
        "promlab ingest: warning: no sample matched the plan, so every answer is empty.\n  \
         the plan takes: {}\n  the requests carry {} metric names, most frequent first: {}{}\n  \
         give --plan FILE (see --help; experiments/plans/prometheus-captures.toml suits a Prometheus server's own metrics)",
        selectors.join("; "),
        names.len(),
        shown.join(", "),
        if names.len() > shown.len() { ", …" } else { "" },
    )
}

/// `promlab feed`: the paced remote-write feeder (see `promlab::ingest::feed` for
/// the exact series, values and timestamps it generates).
#[derive(clap::Args, Debug)]
pub struct FeedArgs {
    /// Where to POST the requests. Given more than once, each series goes to
    /// one URL: Prometheus's `hashmod` of --shard-labels modulo the number of
    /// URLs picks it, as `write_relabel_configs` (hashmod, then keep) on each
    /// remote-write endpoint would.
    #[arg(long, default_value = "http://127.0.0.1:9201/api/v1/write")]
    pub url: Vec<String>,
    /// With several --url: the labels whose values, joined by `;`, are hashed.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "__name__,instance,label_0"
    )]
    pub shard_labels: Vec<String>,
    /// Send each tick as soon as the previous one is answered, not one a second
    /// (replays with --start-ms in the past; tests).
    #[arg(long)]
    pub no_pacing: bool,
    /// Distinct `label_0` values (aggregation groups).
    #[arg(long, default_value_t = 1000)]
    pub groups: u64,
    /// Series per group (distinct `instance` values).
    #[arg(long, default_value_t = 100)]
    pub series_per_group: u64,
    /// Samples per series per tick (one tick per second).
    #[arg(long, default_value_t = 1)]
    pub samples_per_sec: u64,
    /// Shape of the Pareto distribution values are drawn from.
    #[arg(long, default_value_t = 1.5)]
    pub pareto_shape: f64,
    /// Scale (minimum value) of that Pareto distribution.
    #[arg(long, default_value_t = 1.0)]
    pub pareto_scale: f64,
    /// Seed of the value generator: the same seed gives the same values.
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
    let workload = FeedWorkload {
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
        Some(_) if args.url.len() > 1 => {
            anyhow::bail!("--out writes one stream: give one --url (or none)")
        }
        Some(dir) => feed::write_bodies(&workload, ticks, dir)?,
        None => crate::feed::send(
            &workload,
            ticks,
            &args.url,
            &crate::feed::Sharding {
                source_labels: args.shard_labels.clone(),
            },
            args.concurrency,
            !args.no_pacing,
        )?,
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
