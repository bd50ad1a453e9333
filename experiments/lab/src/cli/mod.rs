//! Subcommands of the first half (store, export, ablation, serving).
pub mod cluster;
mod dump;
mod flamegraph;
pub mod ingest;
mod serve_cost;
mod soak;

pub use dump::{dump, DumpArgs};
pub use flamegraph::{flamegraph, profiles, FlamegraphArgs, ProfilesArgs};
pub use serve_cost::{serve_cost, ServeCostArgs};
pub use soak::{soak, SoakArgs};

use crate::servers::ServerLimits;
use anyhow::{bail, Context, Result};
use promlab::format::formenc::Dialect;
use promlab::format::registry::Registry;
use promlab::ingest::pipeline::Limits;
use promlab::shared::strategy::StrategySet;
use promlab::write::{Client, ClientConfig};
use std::io::Write;
use std::path::PathBuf;

/// `promlab export`: print the exposition of a store directory.
#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// Store directory (client_ruby DirectFileStore layout).
    #[arg(long)]
    pub store: PathBuf,
    /// The registry, in the fixtures' registry.json format.
    #[arg(long)]
    pub registry: PathBuf,
    /// Strategies to use: a comma-separated list, `none` (the baseline), `all`, or
    /// `default` (the build's features; every strategy when none was named).
    #[arg(long, default_value = "default")]
    pub strategies: StrategySet,
}

/// `promlab replay`: rebuild a store from op logs, one child process per log.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The registry the ops refer to, in the fixtures' registry.json format.
    #[arg(long)]
    pub registry: PathBuf,
    /// The store directory to write (created if missing; files are named with each log's pid).
    #[arg(long)]
    pub store: PathBuf,
    /// Write-side strategies: a comma-separated list, `none` (the baseline), `all`, or
    /// `default` (the build's features; every strategy when none was named).
    #[arg(long, default_value = "default")]
    pub strategies: StrategySet,
    /// Key dialect: `uri` (client_ruby 5.x) or `cgi` (4.2.5).
    #[arg(long, default_value = "uri")]
    pub dialect: Dialect,
    /// Op logs (`ops-<pid>.jsonl`).
    #[arg(required = true)]
    pub ops: Vec<PathBuf>,
}

/// The child side of `replay`: one log, in this process.
#[derive(clap::Args, Debug)]
pub struct ReplayOneArgs {
    #[arg(long)]
    pub registry: PathBuf,
    #[arg(long)]
    pub store: PathBuf,
    #[arg(long)]
    pub strategies: StrategySet,
    #[arg(long)]
    pub dialect: Dialect,
    /// The op log, or `-`: ops read from stdin one line at a time, each
    /// applied as it arrives (a long-lived writer driven by another process).
    pub ops: PathBuf,
}

pub fn export(args: ExportArgs) -> Result<()> {
    eprintln!("promlab export: strategies {}", args.strategies);
    check_store_dir(&args.store)?;
    let registry = Registry::load(&args.registry)?;
    warn_unmatched_metrics(&args.store, &registry)?;
    let (text, report) =
        promlab::export::export_with_report(&args.store, &registry, args.strategies)?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&text)?;
    stdout.flush()?;
    // Every good series is printed; what was left out is named here, and the
    // exit status says the output is partial.
    if !report.is_clean() {
        for line in report.log_lines() {
            eprintln!("promlab export: {line}");
        }
        anyhow::bail!(
            "the exposition above is partial: {} store files and {} entries were skipped",
            report.files.len(),
            report.entries.values().sum::<u64>()
        );
    }
    Ok(())
}

pub fn replay(args: ReplayArgs) -> Result<()> {
    eprintln!(
        "promlab replay: strategies {}, {} op logs, one process each",
        args.strategies,
        args.ops.len()
    );
    Registry::load(&args.registry)?;
    let exe = std::env::current_exe().context("cannot find the promlab executable")?;
    let children: Vec<(PathBuf, std::process::Child)> = args
        .ops
        .iter()
        .map(|ops| {
            let child = std::process::Command::new(&exe)
                .arg("replay-one")
                .arg("--registry")
                .arg(&args.registry)
                .arg("--store")
                .arg(&args.store)
                .arg("--strategies")
                .arg(args.strategies.to_string())
                .arg("--dialect")
                .arg(match args.dialect {
                    Dialect::Cgi => "cgi",
                    Dialect::Uri => "uri",
                })
                .arg(ops)
                .spawn()
                .with_context(|| format!("cannot start a replay process for {}", ops.display()))?;
            Ok((ops.clone(), child))
        })
        .collect::<Result<_>>()?;
    let mut failed = Vec::new();
    for (ops, mut child) in children {
        if !child.wait()?.success() {
            failed.push(ops.display().to_string());
        }
    }
    if !failed.is_empty() {
        bail!("replay failed for {}", failed.join(", "));
    }
    Ok(())
}

pub fn replay_one(args: ReplayOneArgs) -> Result<()> {
    let registry = Registry::load(&args.registry)?;
    let config = |pid| ClientConfig {
        dialect: args.dialect,
        strategies: args.strategies,
        pid_override: Some(pid),
    };
    if args.ops.as_os_str() == "-" {
        // One op per line as it comes; the first op's pid names the files.
        let mut client: Option<Client> = None;
        for (n, line) in std::io::stdin().lines().enumerate() {
            let line = line.context("reading ops from stdin")?;
            if line.trim().is_empty() {
                continue;
            }
            let op = promlab::scenarios::op_log::OpLog::parse(&line)
                .with_context(|| format!("op {} from stdin", n + 1))?
                .ops
                .remove(0);
            let client = match &mut client {
                Some(client) => client,
                None => client.insert(Client::new(&args.store, &registry, config(op.pid))?),
            };
            promlab::scenarios::op_log::apply(client, &op)
                .with_context(|| format!("op {} ({:?} {})", n + 1, op.op, op.metric))?;
        }
    } else {
        let log = promlab::scenarios::op_log::OpLog::load(&args.ops)?;
        let mut client = Client::new(&args.store, &registry, config(log.pid))?;
        log.replay(&mut client)?;
    }
    let cut = promlab::write::truncations();
    if cut.files_repaired > 0 {
        eprintln!(
            "promlab replay-one: store files were cut under this writer and repaired {} time(s), \
             {} entries reset to zero (see promlab::write::StoreFile)",
            cut.files_repaired, cut.entries_reset
        );
    }
    Ok(())
}

/// `promlab serve`: the mode follows from the flags. `--store` (with
/// `--registry`) serves a client_ruby store directory; `--scenario rabbitmq`
/// serves RabbitMQ's endpoints; otherwise it is the remote-write receiver
/// (`--plan`, optional).
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on, `HOST:PORT` (a name such as `localhost` resolves; default
    /// 127.0.0.1:9394 for /metrics modes, 127.0.0.1:9201 for the receiver).
    #[arg(long)]
    pub listen: Option<String>,
    /// Store directory written by client_ruby's DirectFileStore (or promlab's writer).
    #[arg(long, requires = "registry")]
    pub store: Option<std::path::PathBuf>,
    /// The registry (registry.json format) for --store.
    #[arg(long)]
    pub registry: Option<std::path::PathBuf>,
    /// A built-in scenario to serve (`rabbitmq`).
    #[arg(long, conflicts_with = "store")]
    pub scenario: Option<String>,
    /// Scale of the rabbitmq scenario (10,000 queues give ~630k series; at most
    /// 100,000, whose ~6.3M series take some GB to build).
    #[arg(long, default_value_t = 10_000, requires = "scenario",
          value_parser = clap::value_parser!(u32).range(1..=MAX_QUEUES as i64))]
    pub queues: u32,
    /// Mix awkward names (quotes, backslashes, newlines, non-ASCII) into the scenario.
    #[arg(long, requires = "scenario")]
    pub awkward_names: bool,
    /// Aggregation plan (TOML) for the remote-write receiver.
    #[arg(long, conflicts_with_all = ["store", "scenario"])]
    pub plan: Option<std::path::PathBuf>,
    /// Largest accepted request body, compressed and decoded, in bytes (receiver only).
    #[arg(long, default_value_t = 32 << 20, conflicts_with_all = ["store", "scenario"])]
    pub max_body_bytes: usize,
    /// Receiver: lanes that take requests at once, each a whole ingester
    /// (its own series cache and open windows; closing windows are merged
    /// exactly), so N connections ingest on N cores. 0: one per core this
    /// process may use. Each lane holds up to the limits below.
    #[arg(long, default_value_t = 0, conflicts_with_all = ["store", "scenario"])]
    pub ingest_threads: usize,
    /// Receiver: more samples than this in one request is a 413.
    #[arg(long, default_value_t = Limits::serving().max_samples_per_request, conflicts_with_all = ["store", "scenario"])]
    pub max_samples_per_request: usize,
    /// Receiver: groups held, over all aggregations; samples of new groups past it are counted and dropped.
    #[arg(long, default_value_t = Limits::serving().capacity.groups, conflicts_with_all = ["store", "scenario"])]
    pub max_groups: usize,
    /// Receiver: pane slots held (per window, one per group id up to the highest with a pane there).
    #[arg(long, default_value_t = Limits::serving().capacity.pane_slots, conflicts_with_all = ["store", "scenario"])]
    pub max_pane_slots: usize,
    /// Receiver: DDSketch bins held (8 bytes each), over every pane.
    #[arg(long, default_value_t = Limits::serving().capacity.bins, conflicts_with_all = ["store", "scenario"])]
    pub max_bins: usize,
    /// Receiver: MiB of the series cache per lane (a series' raw labels and keys,
    /// about 300 bytes a series). Keep it above the series senders keep sending:
    /// a cache that fills is dropped whole, and until it is refilled every series
    /// takes the slow path (`promlab_series_cache_evicted_total` counts them).
    #[arg(long, default_value_t = Limits::serving().max_cache_bytes >> 20, conflicts_with_all = ["store", "scenario"])]
    pub max_series_cache_mib: usize,
    /// Receiver: how far ahead of this machine's clock a sample may be stamped; later
    /// ones are counted (`too_far_ahead`) and dropped. 0 turns the drop off; the
    /// watermark still never passes the clock minus the plan's lateness, so a
    /// sample ahead waits in its window until the clock gets there.
    #[arg(long, default_value_t = 600, conflicts_with_all = ["store", "scenario"])]
    pub max_ahead_secs: u64,
    /// Connections served at once; kept under 3/4 of the open-file limit too. At the cap
    /// the one sending slowest (headers or body; an idle keep-alive counts as sending
    /// nothing) is closed to make room for the next.
    #[arg(long, default_value_t = ServerLimits::default().max_connections as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Seconds a client has to send a request's headers (also the keep-alive idle timeout).
    #[arg(long, default_value_t = ServerLimits::default().header_timeout.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_timeout_secs: u64,
    /// Seconds a client has to send a request's body once its headers are in (408 past it).
    #[arg(long, default_value_t = ServerLimits::default().body_timeout.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub body_timeout_secs: u64,
    /// Seconds a client has to send the body and the server to answer (408 past it).
    #[arg(long, default_value_t = ServerLimits::default().request_timeout.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub request_timeout_secs: u64,
    /// Seconds open connections get to finish after SIGTERM or Ctrl-C before they are closed.
    #[arg(long, default_value_t = ServerLimits::default().shutdown_timeout.as_secs(),
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub shutdown_timeout_secs: u64,
    /// Store: fold the files of exited processes (the `fold-exited` strategy
    /// must be in --strategies). This writes into the store directory: fold
    /// files, and `.fold/` for its lock and journals. Off unless given;
    /// see strategies/fold-exited.md for what it assumes (a local filesystem,
    /// the store files' owner or CAP_LEASE, this sidecar as the directory's
    /// only exporter while it folds).
    #[arg(long, requires = "store")]
    pub fold_exited: bool,
    /// Store: milliseconds between looks at the registry file (a changed one
    /// is read once it stayed the same for one look; see docs/serving.md);
    /// every tenth look also counts the store files of metrics it does not name.
    #[arg(long, default_value_t = 1000, requires = "store",
          value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    pub registry_check_ms: u64,
    /// Store with --fold-exited: seconds between folds.
    #[arg(long, default_value_t = 60, requires = "fold_exited",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub fold_every: u64,
    /// Strategies to use: a comma-separated list, `none` (the baseline), `all`, or
    /// `default` (the build's features; every strategy when none was named).
    #[arg(long, default_value = "default")]
    pub strategies: promlab::shared::strategy::StrategySet,
    /// Receiver: also write each closed window's bins (per group, with its
    /// count, zero count, min and max) to this ClickHouse node's HTTP
    /// interface (http://HOST:PORT), one batch per close; the tables are
    /// created there if missing. Ingest never waits on it (a bounded queue,
    /// retried with backoff). Answers in memory are unchanged. Repeat it with
    /// each replica of the receiver's shard: the next is tried when one fails.
    #[arg(long, value_name = "URL", conflicts_with_all = ["store", "scenario"])]
    pub clickhouse: Vec<String>,
    /// Receiver: the cluster (a `remote_servers` entry of the node's config)
    /// the Distributed tables span.
    #[arg(long, default_value = crate::cluster::schema::DEFAULT_CLUSTER, requires = "clickhouse")]
    pub clickhouse_cluster: String,
    /// Receiver: the ClickHouse database of the tables.
    #[arg(long, default_value = crate::cluster::schema::DEFAULT_DATABASE, requires = "clickhouse")]
    pub clickhouse_database: String,
    /// Receiver: bytes of closed windows held while ClickHouse does not take
    /// them; past it a window is dropped, counted in /metrics and flagged lost
    /// in the cluster.
    #[arg(long, default_value_t = crate::cluster::export::DEFAULT_QUEUE_BYTES, requires = "clickhouse")]
    pub clickhouse_queue_bytes: usize,
    /// Receiver: this receiver's id in the cluster, the same across its
    /// restarts (default: HOSTNAME:PORT of --listen).
    #[arg(long, requires = "clickhouse")]
    pub receiver_id: Option<String>,
}

/// `promlab fold`: fold the files of exited processes, once.
#[derive(clap::Args, Debug)]
pub struct FoldArgs {
    /// Store directory (client_ruby DirectFileStore layout).
    #[arg(long)]
    pub store: PathBuf,
    /// The registry (registry.json format): which metrics, aggregated how.
    #[arg(long)]
    pub registry: PathBuf,
    /// Tests: SIGKILL this process when the first batch reaches this step.
    #[arg(long, hide = true)]
    pub kill_at: Option<promlab::export::fold::FoldStep>,
    /// How long a committed batch keeps its leases before it is final, in
    /// milliseconds (a writer on its way into a source's `open` shows up).
    #[arg(long, default_value_t = 20)]
    pub grace_ms: u64,
}

/// The largest `--queues` of the rabbitmq scenario.
pub const MAX_QUEUES: u32 = 100_000;

impl ServeArgs {
    fn server_limits(&self) -> ServerLimits {
        use std::time::Duration;
        ServerLimits {
            max_connections: self.max_connections as usize,
            header_timeout: Duration::from_secs(self.header_timeout_secs),
            body_timeout: Duration::from_secs(self.body_timeout_secs),
            request_timeout: Duration::from_secs(self.request_timeout_secs),
            shutdown_timeout: Duration::from_secs(self.shutdown_timeout_secs),
        }
    }

    /// `--clickhouse` and its companions, as the exporter takes them.
    fn clickhouse_export(
        &self,
        listen: std::net::SocketAddr,
    ) -> Result<Option<crate::cluster::export::ExportConfig>> {
        if self.clickhouse.is_empty() {
            return Ok(None);
        }
        let receiver = match &self.receiver_id {
            Some(id) if !id.is_empty() => id.clone(),
            Some(_) => bail!("--receiver-id must not be empty"),
            None => format!("{}:{}", hostname(), listen.port()),
        };
        Ok(Some(crate::cluster::export::ExportConfig {
            urls: self.clickhouse.clone(),
            schema: crate::cluster::schema::Schema {
                database: self.clickhouse_database.clone(),
                cluster: self.clickhouse_cluster.clone(),
            },
            receiver,
            queue_bytes: self.clickhouse_queue_bytes,
            timeout: std::time::Duration::from_secs(30),
        }))
    }

    fn ingest_limits(&self) -> Limits {
        let mut limits = Limits::serving();
        limits.max_samples_per_request = self.max_samples_per_request;
        limits.capacity.groups = self.max_groups;
        limits.capacity.pane_slots = self.max_pane_slots;
        limits.capacity.bins = self.max_bins;
        limits.max_cache_bytes = self.max_series_cache_mib.saturating_mul(1 << 20);
        limits.max_ahead_ms = (self.max_ahead_secs > 0)
            .then(|| i64::try_from(self.max_ahead_secs.saturating_mul(1000)).unwrap_or(i64::MAX));
        limits
    }
}

/// `promlab scenario-store`: an export scenario's store, registry and expected exposition.
#[derive(clap::Args, Debug)]
pub struct ScenarioStoreArgs {
    /// An export scenario (a built-in name or a .toml path).
    pub scenario: String,
    /// Its quick size (default: the full size).
    #[arg(long)]
    pub quick: bool,
    /// The directory to write (must not exist): `store/`, `registry.json` and
    /// `expected.prom` (the scenario's expected answer, from its independent source).
    #[arg(long)]
    pub out: PathBuf,
    /// Write the store in the one-file-per-process layout of client_ruby's
    /// `poc_file_per_process` branch: each process's files merged into one,
    /// `metrics___<pid>.bin`, keys naming their metric (the same series and
    /// values, so the same expected exposition).
    #[arg(long)]
    pub per_process: bool,
}

pub fn scenario_store(args: ScenarioStoreArgs) -> Result<()> {
    let scenario = crate::harness::load_scenario(&args.scenario)?;
    let size = scenario.size(args.quick);
    if args.out.exists() {
        bail!("{} exists; not writing over it", args.out.display());
    }
    let store = args.out.join("store");
    std::fs::create_dir_all(&store)?;
    let registry = crate::harness::workloads::write_store(&size.params, &store)?;
    if args.per_process {
        promlab::scenarios::per_process_layout::convert_store(
            &store,
            &registry,
            promlab::format::formenc::Dialect::Cgi,
        )?;
    }
    std::fs::write(args.out.join("registry.json"), registry.to_json())?;
    let expected = crate::harness::expected_answer(&size.params)?;
    let digest = crate::harness::digest(&expected);
    if !size.expected.is_empty() && digest != size.expected {
        bail!(
            "scenario {}: the expected answer's digest is {digest}, the scenario says {}",
            scenario.name,
            size.expected
        );
    }
    std::fs::write(args.out.join("expected.prom"), expected)?;
    let files = std::fs::read_dir(&store)?.count();
    eprintln!(
        "promlab scenario-store: {} ({}): {files} store files in {}, expected.prom {digest}",
        scenario.name,
        if args.quick { "quick" } else { "full" },
        store.display()
    );
    Ok(())
}

/// `promlab ablate`: verify, then measure, every strategy on built-in scenarios.
#[derive(clap::Args, Debug)]
pub struct AblateArgs {
    /// Scenarios (built-in names or .toml paths); all built-ins when none.
    pub scenarios: Vec<String>,
    /// The quick sizes (what CI and the default run use).
    #[arg(long)]
    pub quick: bool,
    /// Restrict the arms to these strategies (comma-separated; repeatable).
    #[arg(long)]
    pub strategies: Vec<StrategySet>,
    /// Where the CSVs and machine.txt go (default experiments/results/<date>-<host>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Timed rounds per arm, instead of the scenario's own.
    #[arg(long)]
    pub repeats: Option<usize>,
    /// Print each scenario's output digest instead of checking it.
    #[arg(long)]
    pub print_digests: bool,
    /// After promlab's arms, run the peers' (see experiments/peers/README.md).
    #[arg(long)]
    pub peers: bool,
    /// With --peers: include the embedded-ClickHouse (chdb) aggregation arm.
    #[arg(long, requires = "peers")]
    pub with_clickhouse: bool,
    /// After timing, run each arm once more in a child process of its own and
    /// report its peak resident memory (`peak_rss_bytes`).
    #[arg(long)]
    pub peak_rss: bool,
}

impl AblateArgs {
    /// `cargo run --release` with no arguments: the quick matrix over all scenarios.
    pub fn main_job() -> Self {
        AblateArgs {
            scenarios: Vec::new(),
            quick: true,
            strategies: Vec::new(),
            out: None,
            repeats: None,
            print_digests: false,
            peers: false,
            with_clickhouse: false,
            peak_rss: false,
        }
    }
}

pub fn ablate(args: AblateArgs) -> Result<()> {
    let only = (!args.strategies.is_empty()).then(|| {
        args.strategies
            .iter()
            .flat_map(|s| s.iter())
            .collect::<StrategySet>()
    });
    let options = crate::harness::AblateOptions {
        quick: args.quick,
        only,
        out: args.out,
        repeats: args.repeats,
        print_digests: args.print_digests,
        peers: args.peers,
        with_clickhouse: args.with_clickhouse,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        peak_rss: if args.peak_rss {
            Some(std::env::current_exe().context("cannot find this executable")?)
        } else {
            None
        },
    };
    crate::harness::ablate(&args.scenarios, &options).map(drop)
}

/// `promlab scale`: how each stage's cost grows with its work.
#[derive(clap::Args, Debug)]
pub struct ScaleArgs {
    /// Axes (built-in names or .toml paths) or stages (`export`, `render`,
    /// `ingest`, `query`: each of its axes); all built-in axes when none.
    /// Built in: export-files, export-series-per-file, render-series,
    /// ingest-groups, ingest-churn, ingest-lanes, query-groups
    /// (experiments/scaling/).
    pub axes: Vec<String>,
    /// The quick ladders (fewer, smaller points).
    #[arg(long)]
    pub quick: bool,
    /// The results directory; the CSVs go to its `scaling/` (default: a new
    /// experiments/results/<date>T<time>Z-<host>-<revision>/).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Timed rounds per point, instead of the axis's own.
    #[arg(long)]
    pub repeats: Option<usize>,
    /// Leave out the points whose x is above this (a partial ladder).
    #[arg(long)]
    pub max_x: Option<f64>,
    /// After timing each point, run each arm once more in a child process of
    /// its own for its peak resident memory (`peak_rss_bytes`).
    #[arg(long)]
    pub peak_rss: bool,
}

pub fn scale(args: ScaleArgs) -> Result<()> {
    use crate::harness::scale;
    let axes = scale::select(&args.axes)?;
    let options = scale::ScaleOptions {
        quick: args.quick,
        out: args.out,
        repeats: args.repeats,
        peak_rss: if args.peak_rss {
            Some(std::env::current_exe().context("cannot find this executable")?)
        } else {
            None
        },
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        max_x: args.max_x,
    };
    scale::scale(&axes, &options).map(drop)
}

/// `promlab arm-rss` (internal, for `ablate --peak-rss` and `scale --peak-rss`):
/// one arm once, its peak memory.
#[derive(clap::Args, Debug)]
pub struct ArmRssArgs {
    /// A scenario (its quick or full size)…
    #[arg(required_unless_present = "params", conflicts_with = "params")]
    pub scenario: Option<String>,
    #[arg(long)]
    pub arm: String,
    #[arg(long)]
    pub quick: bool,
    /// …or a workload generator's parameters, as JSON (a scaling point)…
    #[arg(long, requires = "expected")]
    pub params: Option<String>,
    /// …with the digest its output must have.
    #[arg(long)]
    pub expected: Option<String>,
}

pub fn arm_rss(args: ArmRssArgs) -> Result<()> {
    use crate::harness::rss;
    let (peak, before) = match (&args.scenario, &args.params, &args.expected) {
        (Some(scenario), _, _) => rss::measure(scenario, args.quick, &args.arm)?,
        (None, Some(params), Some(expected)) => {
            let params = serde_json::from_str(params).context("--params")?;
            rss::measure_params(&params, expected, &args.arm)?
        }
        _ => bail!("arm-rss needs a scenario or --params with --expected"),
    };
    println!("peak_rss_bytes={peak}\nrss_before_bytes={before}");
    Ok(())
}

/// `promlab report`: rewrite the figures of the dossiers, the ranking and the
/// README from ablation results, every ratio between arms reading the same input.
#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// A results directory (default: the newest under experiments/results).
    #[arg(long)]
    pub results: Option<PathBuf>,
    /// Where the dossiers are.
    #[arg(long, default_value = "strategies")]
    pub strategies_dir: PathBuf,
    /// The README whose results table (between `<!-- results:begin -->` and
    /// `<!-- results:end -->`, or in place of the older floors block) is
    /// regenerated.
    #[arg(long, default_value = "README.md")]
    pub readme: PathBuf,
    /// A profile set (`promlab profiles`: a results directory's `profiles/`) to
    /// draw the dossiers' differential flamegraphs from (default: the results
    /// directory's own, else the newest under experiments/results).
    #[arg(long)]
    pub profiles: Option<PathBuf>,
}

pub fn report(args: ReportArgs) -> Result<()> {
    use crate::harness::dossier::{self, ProfileSet};
    let root = std::path::Path::new("experiments/results");
    let results = match args.results {
        Some(dir) => dir,
        None => dossier::latest_results(root)?,
    };
    let profiles = args.profiles.or_else(|| {
        let own = results.join("profiles");
        if own.join("profiles.csv").is_file() {
            Some(own)
        } else {
            crate::harness::profiles::latest(root)
        }
    });
    let set = match &profiles {
        Some(dir) if crate::harness::profiles::has_stacks(dir)? => ProfileSet::Stacks(dir),
        Some(dir) => ProfileSet::NoStacks(dir),
        None => ProfileSet::None,
    };
    dossier::regenerate(&results, &args.strategies_dir, Some(&args.readme), &set)?;
    println!(
        "dossiers, ranking and README regenerated from {}",
        results.display()
    );
    match set {
        ProfileSet::Stacks(dir) => println!("differential flamegraphs drawn from {}", dir.display()),
        ProfileSet::NoStacks(dir) => println!(
            "no profile stacks in {}: run `promlab profiles` to regenerate (the dossiers' flamegraphs were left as they are)",
            dir.display()
        ),
        ProfileSet::None => println!(
            "no profile set (`promlab profiles`): the dossiers' flamegraphs were left as they are"
        ),
    }
    Ok(())
}

pub fn serve(args: ServeArgs) -> Result<()> {
    use crate::servers::metrics::{self, Source};
    let listen = |port| listen_address(args.listen.as_deref(), port);
    if let Some(dir) = &args.store {
        let registry_path = args
            .registry
            .as_deref()
            .context("--store needs --registry")?;
        check_store_dir(dir)?;
        let registry = Registry::load(registry_path)?;
        warn_unmatched_metrics(dir, &registry)?;
        raise_open_file_limit();
        let current = crate::servers::registry_follow::CurrentRegistry::new(registry.clone());
        let fold = if args.fold_exited {
            if !args
                .strategies
                .contains(promlab::shared::strategy::Strategy::FoldExited)
            {
                bail!("--fold-exited needs the fold-exited strategy in --strategies (`all` has it, and so does a build without strategy features)");
            }
            let every = std::time::Duration::from_secs(args.fold_every);
            Some(crate::servers::fold_loop::start(
                dir.clone(),
                current.clone(),
                every,
            )?)
        } else {
            None
        };
        let follow = crate::servers::registry_follow::Follower {
            registry_path: registry_path.to_path_buf(),
            store: dir.clone(),
            strategies: args.strategies,
            every: std::time::Duration::from_millis(args.registry_check_ms),
            registry: current,
            stats: Default::default(),
        };
        let exporter = promlab::export::Exporter::new(dir, registry, args.strategies);
        return metrics::serve(
            listen(9394)?,
            Source::Store(Box::new(exporter)),
            args.strategies,
            args.server_limits(),
            metrics::StoreExtras {
                fold,
                follow: Some(follow),
            },
        );
    }
    match args.scenario.as_deref() {
        Some("rabbitmq") => {
            let scenario = promlab::scenarios::rabbitmq::RabbitMqNode::build(
                args.queues as usize,
                args.awkward_names,
                args.strategies,
            )?;
            metrics::serve(
                listen(9394)?,
                Source::Scenario(scenario),
                args.strategies,
                args.server_limits(),
                metrics::StoreExtras::default(),
            )
        }
        Some(other) => bail!("unknown scenario `{other}` (known: rabbitmq)"),
        None => crate::servers::receiver::serve(crate::servers::receiver::ReceiverConfig {
            clickhouse: args.clickhouse_export(listen(9201)?)?,
            listen: listen(9201)?,
            plan: args.plan.clone(),
            max_body_bytes: args.max_body_bytes,
            strategies: args.strategies,
            limits: args.ingest_limits(),
            server: args.server_limits(),
            ingest_threads: args.ingest_threads,
        }),
    }
}

/// This machine's name (`localhost` if it has none we can read).
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..len]) {
        Ok(name) if ok && !name.is_empty() => name.to_string(),
        _ => "localhost".to_string(),
    }
}

/// Raises the soft open-file limit to the hard one: a store sidecar keeps a
/// descriptor for each file whose writer is live (for its `flock`), within a
/// share of the soft limit.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a struct of ours.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// `promlab fold`: one fold of a store's exited processes' files.
pub fn fold(args: FoldArgs) -> Result<()> {
    check_store_dir(&args.store)?;
    let registry = Registry::load(&args.registry)?;
    let config = promlab::export::fold::FoldConfig {
        grace: std::time::Duration::from_millis(args.grace_ms),
        kill_at: args.kill_at,
        ..promlab::export::fold::FoldConfig::default()
    };
    let report = promlab::export::fold::fold_store(&args.store, &registry, &config)?;
    if report.another_running {
        println!(
            "promlab fold: another fold of {} is running (a sidecar's?); nothing done",
            args.store.display()
        );
        return Ok(());
    }
    println!(
        "promlab fold: {} files folded into {} fold files; {} live, {} without a lease to tell (left as live), {} exited left as they are; {} batches given up; {} interrupted batches finished or undone",
        report.files_folded,
        report.fold_files_written,
        report.live_files,
        report.unknown_files,
        report.files_left,
        report.batches_abandoned,
        report.recovered
    );
    for skipped in &report.metrics_skipped {
        eprintln!("promlab fold: left for next time: {skipped}");
    }
    Ok(())
}

/// `--listen HOST:PORT`, resolved (the first address a name resolves to), or
/// 127.0.0.1 on `default_port`.
fn listen_address(listen: Option<&str>, default_port: u16) -> Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let Some(listen) = listen else {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], default_port)));
    };
    listen
        .to_socket_addrs()
        .with_context(|| format!("--listen {listen}: expected HOST:PORT, e.g. 127.0.0.1:{default_port} or localhost:{default_port}"))?
        .next()
        .with_context(|| format!("--listen {listen}: the name resolves to no address"))
}

/// A store directory as `--store` wants it, or an error that says what was given instead.
fn check_store_dir(dir: &std::path::Path) -> Result<()> {
    let name = dir.display();
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("store directory {name} does not exist")
        }
        Err(e) => bail!("cannot read store directory {name}: {e}"),
        Ok(meta) if !meta.is_dir() => {
            let packed = [".tar.gz", ".tgz", ".tar"]
                .iter()
                .any(|ext| name.to_string().ends_with(ext));
            if packed {
                bail!("--store {name} is an archive: unpack it (tar xzf {name}) and give the store/ directory inside")
            }
            bail!("--store {name} is a file, not a store directory (the directory holding metric_<name>___<pid>.bin or metrics___<pid>.bin files)")
        }
        Ok(_) => Ok(()),
    }
}

/// Warns when a registered metric has no file in the store: an empty
/// exposition is then more likely a wrong directory than an idle app.
fn warn_unmatched_metrics(dir: &std::path::Path, registry: &Registry) -> Result<()> {
    let names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read store directory {}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let has_file = |metric: &str| {
        names.iter().any(|file| {
            file.strip_prefix("metric_")
                .and_then(|rest| rest.strip_suffix(".bin"))
                .and_then(|rest| rest.rsplit_once("___"))
                .is_some_and(|(name, _pid)| name == metric)
        })
    };
    // A file of the one-file-per-process layout may hold every metric.
    let per_process = names
        .iter()
        .any(|file| promlab::format::storefile::parse_process_file_name(file.as_bytes()).is_some());
    if per_process || registry.metrics.iter().any(|m| has_file(&m.name)) {
        return Ok(());
    }
    if registry.metrics.is_empty() {
        eprintln!(
            "promlab: warning: the registry names no metric, so no file in {} is read",
            dir.display()
        );
        return Ok(());
    }
    let hint = if dir.join("store").is_dir() {
        format!(
            "; {} has a store/ directory: did you mean --store {}?",
            dir.display(),
            dir.join("store").display()
        )
    } else {
        String::new()
    };
    eprintln!(
        "promlab: warning: no file in {} belongs to a registered metric (expected metric_<name>___<pid>.bin for {}, or metrics___<pid>.bin){hint}",
        dir.display(),
        registry.metrics.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", ")
    );
    Ok(())
}
