//! Subcommands of the first half (store, export, ablation, serving).
use anyhow::{bail, Result};

#[derive(clap::Args, Debug)]
pub struct ExportArgs {}
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {}
#[derive(clap::Args, Debug)]
pub struct ReplayOneArgs {}
#[derive(clap::Args, Debug)]
pub struct AblateArgs {}
impl AblateArgs {
    pub fn main_job() -> Self {
        AblateArgs {}
    }
}
/// `promlab serve`: the mode follows from the flags. `--store` (with
/// `--registry`) serves a client_ruby store directory; `--scenario rabbitmq`
/// serves RabbitMQ's endpoints; otherwise it is the remote-write receiver
/// (`--plan`, optional).
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on (default 127.0.0.1:9394 for /metrics modes, 127.0.0.1:9201 for the receiver).
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// Store directory written by client_ruby's DirectFileStore (or promlab's writer).
    #[arg(long, requires = "registry")]
    pub store: Option<std::path::PathBuf>,
    /// The registry (registry.json format) for --store.
    #[arg(long)]
    pub registry: Option<std::path::PathBuf>,
    /// A built-in scenario to serve (`rabbitmq`).
    #[arg(long, conflicts_with = "store")]
    pub scenario: Option<String>,
    /// Scale of the rabbitmq scenario (10,000 queues give ~630k series).
    #[arg(long, default_value_t = 10_000)]
    pub queues: usize,
    /// Mix awkward names (quotes, backslashes, newlines, non-ASCII) into the scenario.
    #[arg(long)]
    pub awkward_names: bool,
    /// Aggregation plan (TOML) for the remote-write receiver.
    #[arg(long, conflicts_with_all = ["store", "scenario"])]
    pub plan: Option<std::path::PathBuf>,
    /// Largest accepted request body, compressed and decoded, in bytes.
    #[arg(long, default_value_t = 32 << 20)]
    pub max_body_bytes: usize,
    /// Strategies to use: a comma-separated list, `none`, `all`, or `default`.
    #[arg(long, default_value = "default")]
    pub strategies: crate::strategy::StrategySet,
}

pub fn export(_: ExportArgs) -> Result<()> { bail!("todo") }
pub fn replay(_: ReplayArgs) -> Result<()> { bail!("todo") }
pub fn replay_one(_: ReplayOneArgs) -> Result<()> { bail!("todo") }
pub fn ablate(_: AblateArgs) -> Result<()> { bail!("todo") }
pub fn serve(args: ServeArgs) -> Result<()> {
    if args.store.is_some() || args.scenario.is_some() {
        crate::render::server::serve(args)
    } else {
        crate::ingest::receiver::serve(args)
    }
}
