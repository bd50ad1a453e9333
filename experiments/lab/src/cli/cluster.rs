//! `promlab query --clickhouse` and `promlab cluster …`: answers from a
//! ClickHouse cluster, and a local one to run them against.

use crate::cluster::client::ClickHouse;
use crate::cluster::local::{self, Layout, LocalCluster};
use crate::cluster::schema::{is_replicated, Ddl, Schema, DEFAULT_CLUSTER, DEFAULT_DATABASE};
use crate::cluster::shards::Shards;
use crate::cluster::zookeeper::{self, ZooKeeper};
use crate::cluster::{query, LOCAL_BASE_PORT};
use anyhow::{bail, Context, Result};
use promlab::ingest::plan::Plan;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// `promlab query`: one window's quantiles from the cluster.
#[derive(clap::Args, Debug)]
pub struct QueryArgs {
    /// A ClickHouse node of the cluster (its HTTP interface, http://HOST:PORT);
    /// repeat it for others, each tried in turn when one does not answer.
    /// Given a node of every shard, `--group` reads each shard's own tables
    /// directly instead of through the `Distributed` ones.
    #[arg(long, value_name = "URL", required = true)]
    pub clickhouse: Vec<String>,
    /// The aggregation (its id in the plan).
    #[arg(long)]
    pub agg: String,
    /// The window's start (ms since the epoch); default: the newest window every receiver has written.
    /// With `--group`: the newest of the windows answered; default: the newest window every
    /// receiver has closed and written, from their progress (answered empty if it holds no row).
    #[arg(long, value_name = "START_MS")]
    pub window: Option<i64>,
    /// One group only, by its group-by labels' values (repeat for each label; one left out
    /// is the empty value): its answer in each of the last `--windows` windows, one JSON a line.
    #[arg(long, value_name = "LABEL=VALUE")]
    pub group: Vec<String>,
    /// With `--group`: how many windows, the newest last.
    #[arg(long, default_value_t = 10, value_name = "K")]
    pub windows: u64,
    /// The receivers' aggregation plan (TOML); default: the feeder's.
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// The cluster the Distributed tables span (named in failures).
    #[arg(long, default_value = DEFAULT_CLUSTER)]
    pub clickhouse_cluster: String,
    /// The ClickHouse database of the tables.
    #[arg(long, default_value = DEFAULT_DATABASE)]
    pub clickhouse_database: String,
    /// Seconds each statement may take.
    #[arg(long, default_value_t = 60)]
    pub timeout_secs: u64,
}

/// Prints the answer: exactly the bytes a single receiver's
/// `GET /api/v1/quantiles?agg=ID&window=START_MS` answers (no newline). An
/// incomplete answer is printed with its `"incomplete"` list and fails.
/// With `--group`, one such answer a line per window, with that group alone.
pub fn query(args: QueryArgs) -> Result<()> {
    let plan = Plan::load_or_default(args.plan.as_deref())?;
    let Some(agg) = plan.aggregations.iter().find(|a| a.id == args.agg) else {
        bail!("no aggregation `{}` in the plan", args.agg);
    };
    let timeout = Duration::from_secs(args.timeout_secs);
    let ch = first_answering(&args.clickhouse, timeout)?;
    let schema = Schema {
        database: args.clickhouse_database,
        cluster: args.clickhouse_cluster,
    };
    let answers = if args.group.is_empty() {
        vec![query::answer(&ch, &schema, agg, args.window)?]
    } else {
        let mut labels = std::collections::BTreeMap::new();
        for pair in &args.group {
            let Some((name, value)) = pair.split_once('=') else {
                bail!("--group {pair:?}: expected LABEL=VALUE");
            };
            if !agg.group_by.iter().any(|l| l == name) {
                bail!(
                    "--group {pair:?}: `{}` groups by {:?}, not `{name}`",
                    agg.id,
                    agg.group_by
                );
            }
            labels.insert(name.to_string(), value.to_string());
        }
        if args.windows == 0 || args.windows > 10_000 {
            bail!("--windows {}: expected 1 to 10000", args.windows);
        }
        let key = promlab::ingest::distributed::group_key(agg, &labels);
        // Given a node of every shard, each shard's local tables are read
        // directly: one `Distributed` round less a read.
        let nodes = args
            .clickhouse
            .iter()
            .map(|url| ClickHouse::new(url, timeout))
            .collect::<Result<Vec<_>>>()?;
        let shards = (nodes.len() > 1)
            .then(|| Shards::resolve(&nodes, &schema))
            .flatten();
        query::group_answers(
            &ch,
            shards.as_ref(),
            &schema,
            agg,
            &key,
            args.window,
            args.windows,
        )?
    };
    let mut out = std::io::stdout().lock();
    let mut incomplete = Vec::new();
    for (i, answer) in answers.iter().enumerate() {
        if i > 0 {
            out.write_all(b"\n")?;
        }
        out.write_all(&answer.json)?;
        if !answer.incomplete.is_empty() {
            let who: Vec<String> = answer
                .incomplete
                .iter()
                .map(|i| format!("{} ({})", i.receiver, i.reason))
                .collect();
            incomplete.push(format!(
                "window {} is incomplete: {}",
                answer.window_start.unwrap_or_default(),
                who.join("; ")
            ));
        }
    }
    if answers.len() > 1 {
        out.write_all(b"\n")?;
    }
    out.flush()?;
    if !incomplete.is_empty() {
        bail!("{}", incomplete.join("\n"));
    }
    Ok(())
}

/// The first of `urls` whose node answers (the last one's failure if none does).
fn first_answering(urls: &[String], timeout: Duration) -> Result<ClickHouse> {
    let mut failure = None;
    for url in urls {
        let ch = ClickHouse::new(url, timeout)?;
        match ch.execute("SELECT 1", &[]) {
            Ok(_) => return Ok(ch),
            Err(e) => {
                if urls.len() > 1 {
                    eprintln!("promlab query: {e}; trying the next --clickhouse");
                }
                failure = Some(e);
            }
        }
    }
    Err(failure.map_or_else(|| anyhow::anyhow!("no --clickhouse URL"), Into::into))
}

/// `promlab cluster`: a local ClickHouse cluster, its tables, its measurements.
#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub command: ClusterCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum ClusterCommand {
    /// Write a local cluster's node configs (what `start` runs) into DIR.
    Config(LocalArgs),
    /// Start a local cluster (one clickhouse-server per node on 127.0.0.1,
    /// each in DIR/nodeN; with replicas, a ZooKeeper in DIR/zookeeper), create
    /// the tables on every node, and run until Ctrl-C or SIGTERM, then stop them.
    Start(LocalArgs),
    /// Create the tables on each node (idempotent; every node of the cluster
    /// needs them). A replicated cluster (its nodes have the `{shard}` and
    /// `{replica}` macros): once, `ON CLUSTER`, through the first URL.
    Init(InitArgs),
    /// Print the tables' DDL.
    Schema(SchemaArgs),
    /// Measure, side by side in one run: one receiver alone, one and three
    /// receivers writing to a local 3-node cluster (CPU per sample of the
    /// whole system, rows per sample, CPU per row), the cluster query of
    /// 1,000 groups, the chdb peer, and on paper what a 16-core node and an
    /// N-node cluster carry. Writes README.md into --out.
    Measure(MeasureArgs),
}

#[derive(clap::Args, Debug)]
pub struct MeasureArgs {
    /// Groups of the paced feed (the report's workload: 1,000).
    #[arg(long, default_value_t = 1000)]
    pub groups: u64,
    #[arg(long, default_value_t = 100)]
    pub series_per_group: u64,
    /// The plan's window (the report's: 60 s).
    #[arg(long, default_value_t = 60)]
    pub window_secs: u64,
    /// Measured seconds of feed per arm (after 2 warm-up ticks); at least two windows' worth.
    #[arg(long, default_value_t = 180)]
    pub secs: u64,
    /// Timed cluster queries.
    #[arg(long, default_value_t = 20)]
    pub queries: usize,
    /// Also run the chdb peer (experiments/peers/install.sh --with-clickhouse).
    #[arg(long)]
    pub with_chdb: bool,
    /// Where the report goes (README.md); default experiments/cluster/results/<UTC time>-<host>.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct LocalArgs {
    /// Where the nodes' directories go (and ZooKeeper's, `zookeeper/`, when it runs one).
    #[arg(long)]
    pub dir: PathBuf,
    /// Shards (`--nodes` is the same): shards × replicas nodes in all.
    #[arg(long, visible_alias = "nodes", default_value_t = 3)]
    pub shards: usize,
    /// Replicas a shard (on consecutive nodes). Above 1: replicated tables,
    /// `ON CLUSTER` DDL, and a ZooKeeper (run here on BASE+300, or `--zookeeper`).
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// With `--replicas` above 1: an existing ZooKeeper (HOST:PORT) instead of running one.
    #[arg(long, value_name = "HOST:PORT")]
    pub zookeeper: Option<String>,
    /// Ports: node i's HTTP BASE+i, native TCP BASE+100+i, interserver BASE+200+i
    /// (i from 0); ZooKeeper's BASE+300.
    #[arg(long, default_value_t = LOCAL_BASE_PORT)]
    pub base_port: u16,
    /// The cluster's name in the nodes' `remote_servers`.
    #[arg(long, default_value = DEFAULT_CLUSTER)]
    pub cluster: String,
}

#[derive(clap::Args, Debug)]
pub struct InitArgs {
    /// Each node's HTTP interface (repeat for every node).
    #[arg(long, value_name = "URL", required = true)]
    pub clickhouse: Vec<String>,
    #[arg(long, default_value = DEFAULT_CLUSTER)]
    pub clickhouse_cluster: String,
    #[arg(long, default_value = DEFAULT_DATABASE)]
    pub clickhouse_database: String,
}

#[derive(clap::Args, Debug)]
pub struct SchemaArgs {
    /// Replicas a shard: above 1, the replicated tables' DDL, `ON CLUSTER`.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    #[arg(long, default_value = DEFAULT_CLUSTER)]
    pub clickhouse_cluster: String,
    #[arg(long, default_value = DEFAULT_DATABASE)]
    pub clickhouse_database: String,
}

pub fn cluster(args: ClusterArgs) -> Result<()> {
    match args.command {
        ClusterCommand::Config(a) => {
            let (ports, layout) = check_nodes(&a)?;
            for dir in local::write_configs(&a.dir, &ports, &layout)? {
                println!("{}", dir.join("config.xml").display());
            }
            if a.replicas > 1 && a.zookeeper.is_none() {
                let dir = a.dir.join("zookeeper");
                zookeeper::write_config(&dir, local::zookeeper_port(a.base_port))?;
                println!("{}", dir.join("zoo.cfg").display());
            }
            Ok(())
        }
        ClusterCommand::Start(a) => start(a),
        ClusterCommand::Measure(a) => measure(a),
        ClusterCommand::Init(a) => {
            let schema = Schema {
                database: a.clickhouse_database,
                cluster: a.clickhouse_cluster,
            };
            let first = ClickHouse::new(&a.clickhouse[0], Duration::from_secs(90))?;
            if is_replicated(&first)? {
                // One statement for every node, through the first.
                schema
                    .create_on_cluster(&first, Duration::from_secs(60))
                    .context("creating the tables ON CLUSTER")?;
                println!(
                    "{}: tables ready on every node of cluster `{}` (ON CLUSTER)",
                    a.clickhouse[0], schema.cluster
                );
                return Ok(());
            }
            for url in &a.clickhouse {
                let ch = ClickHouse::new(url, Duration::from_secs(30))?;
                schema.create(&ch)?;
                println!("{url}: tables ready");
            }
            Ok(())
        }
        ClusterCommand::Schema(a) => {
            let schema = Schema {
                database: a.clickhouse_database,
                cluster: a.clickhouse_cluster,
            };
            let ddl = if a.replicas > 1 {
                Ddl::OnCluster
            } else {
                Ddl::PerNode
            };
            for statement in schema.statements(ddl) {
                println!("{statement};");
            }
            Ok(())
        }
    }
}

fn measure(a: MeasureArgs) -> Result<()> {
    if a.secs < 2 * a.window_secs {
        bail!(
            "--secs {} is under two windows of {} s: too few closes to measure",
            a.secs,
            a.window_secs
        );
    }
    let scratch = tempfile::tempdir()?;
    let host = crate::machine::Host::read();
    let hostname = host.hostname.clone().unwrap_or_else(|| "host".into());
    let out = a.out.clone().unwrap_or_else(|| {
        let stamp = crate::machine::utc_now().replace([':', '-'], "");
        PathBuf::from("experiments/cluster/results").join(format!("{stamp}-{hostname}"))
    });
    let command: Vec<String> = std::env::args().collect();
    let opts = crate::cluster::measure::MeasureOptions {
        promlab: std::env::current_exe()?,
        groups: a.groups,
        series_per_group: a.series_per_group,
        window_secs: a.window_secs,
        secs: a.secs,
        queries: a.queries.max(1),
        with_chdb: a.with_chdb,
        workdir: scratch.path().to_path_buf(),
    };
    let load = || crate::machine::LoadAverage::read().map_or("?".into(), |l| l.to_string());
    let before = load();
    let measured = crate::cluster::measure::run(&opts)?;
    let body = measured.report;
    let text = format!(
        "# Cluster costs, {}\n\n`{}` on {hostname} ({} cores, {}; revision {}); load average before {before}, after {}.\n\n{body}",
        crate::machine::utc_now(),
        command.join(" "),
        host.cores,
        host.cpu.as_deref().unwrap_or("?"),
        crate::machine::BUILD.git_revision,
        load(),
    );
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("README.md"), &text)?;
    std::fs::write(out.join("arms.csv"), &measured.arms_csv)?;
    std::fs::write(out.join("queries.csv"), &measured.queries_csv)?;
    let unknown = || "unknown".to_string();
    std::fs::write(
        out.join("machine.txt"),
        format!(
            "cpu: {}\ncores: {}\nmemory: {}\nkernel: {}\ngit revision: {}\nload average before (1, 5, 15 min): {before}\nload average after: {}\ncommand: {}\n",
            host.cpu.clone().unwrap_or_else(unknown),
            host.cores,
            host.memory_kib.map_or_else(unknown, |k| format!("MemTotal: {k} kB")),
            host.kernel.clone().unwrap_or_else(unknown),
            crate::machine::BUILD.git_revision,
            load(),
            command.join(" "),
        ),
    )?;
    println!(
        "{text}
(written to {})",
        out.join("README.md").display()
    );
    Ok(())
}

/// The nodes' ports and the layout `a` asks for.
fn check_nodes(a: &LocalArgs) -> Result<(Vec<local::NodePorts>, Layout)> {
    if a.shards == 0 || a.replicas == 0 || a.shards * a.replicas > 50 {
        bail!(
            "--shards {} --replicas {}: expected 1 to 50 nodes in all",
            a.shards,
            a.replicas
        );
    }
    let nodes = a.shards * a.replicas;
    if u32::from(a.base_port) + 300 + nodes as u32 > 65_535 {
        bail!(
            "--base-port {} leaves no room for {nodes} nodes' ports",
            a.base_port,
        );
    }
    if a.replicas == 1 && a.zookeeper.is_some() {
        bail!("--zookeeper is for --replicas 2 or more");
    }
    let zookeeper = (a.replicas > 1).then(|| {
        a.zookeeper
            .clone()
            .unwrap_or_else(|| format!("127.0.0.1:{}", local::zookeeper_port(a.base_port)))
    });
    let layout = Layout {
        cluster: a.cluster.clone(),
        replicas: a.replicas,
        zookeeper,
    };
    Ok((local::ports_from(a.base_port, nodes), layout))
}

fn start(a: LocalArgs) -> Result<()> {
    let (ports, layout) = check_nodes(&a)?;
    let zookeeper = match (a.replicas > 1, &a.zookeeper) {
        (true, None) => Some(ZooKeeper::new(
            &a.dir.join("zookeeper"),
            local::zookeeper_port(a.base_port),
        )?),
        _ => None,
    };
    let mut cluster =
        LocalCluster::start_with(&a.dir, &ports, &layout, zookeeper, Duration::from_secs(60))?;
    let schema = Schema {
        database: DEFAULT_DATABASE.into(),
        cluster: a.cluster.clone(),
    };
    if let Some(zookeeper) = &cluster.zookeeper {
        eprintln!(
            "promlab cluster: ZooKeeper on {} (data in {})",
            zookeeper.address(),
            zookeeper.dir().display()
        );
    }
    if a.replicas > 1 {
        let url = &cluster.urls()[0];
        schema
            .create_on_cluster(
                &ClickHouse::new(url, Duration::from_secs(90))?,
                Duration::from_secs(60),
            )
            .with_context(|| format!("creating the tables ON CLUSTER through {url}"))?;
    }
    for (i, url) in cluster.urls().iter().enumerate() {
        if a.replicas == 1 {
            schema
                .create(&ClickHouse::new(url, Duration::from_secs(30))?)
                .with_context(|| format!("creating the tables on {url}"))?;
        }
        let (shard, replica) = layout.position(i);
        eprintln!("promlab cluster: node on {url}, shard {shard} replica {replica} (tables ready)");
    }
    eprintln!(
        "promlab cluster: {} nodes of cluster `{}` running; Ctrl-C or SIGTERM stops them",
        cluster.nodes.len(),
        a.cluster
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        anyhow::Ok(())
    })?;
    cluster.stop(Duration::from_secs(20));
    eprintln!("promlab cluster: stopped");
    Ok(())
}
