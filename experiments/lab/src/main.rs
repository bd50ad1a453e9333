//! The `promlab` command line. Each subcommand's arguments and work live in the
//! lab's `cli` module; this file only dispatches.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "promlab",
    version,
    about = "The Prometheus metrics path, measurably fast and provably identical",
    long_about = "The Prometheus metrics path, measurably fast and provably identical.\n\n\
        With no command, promlab runs the main job: `promlab ablate --quick` over every built-in \
        scenario (verify every strategy combination against the scenario's expected answer, then \
        time the arms side by side). No subcommand is needed for that; the subcommands below are \
        the individual tools.\n\n\
        Strategy sets (--strategies): a comma-separated list of strategy names, `none` (the \
        baseline), `all`, or `default` (the strategies the build's cargo features name; every \
        strategy when the build names none)."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Print the exposition of a client_ruby-compatible store directory.
    Export(promlab_lab::cli::ExportArgs),
    /// Print every entry of a store's files: metric, process, labels, value, timestamp, and what is corrupt and why.
    Dump(promlab_lab::cli::DumpArgs),
    /// Rebuild a store by replaying op logs, each in its own child process.
    Replay(promlab_lab::cli::ReplayArgs),
    /// Verify, then measure, every strategy combination on built-in scenarios.
    Ablate(promlab_lab::cli::AblateArgs),
    /// How each stage's cost grows with its work: baseline, all and the floor at each point of an axis.
    Scale(promlab_lab::cli::ScaleArgs),
    /// Regenerate the dossiers' measured tables and the ranking from the latest results.
    Report(promlab_lab::cli::ReportArgs),
    /// Profile a scenario's runs under one strategy set (or two, --diff) and write an SVG flamegraph.
    Flamegraph(promlab_lab::cli::FlamegraphArgs),
    /// Profile every arm of the ablation (one scenario per stage by default) for the dossiers.
    Profiles(promlab_lab::cli::ProfilesArgs),
    /// Fold the files of exited processes in a store directory, once (fold-exited).
    Fold(promlab_lab::cli::FoldArgs),
    /// What a store scrape costs over HTTP (plain and gzip) against the same export in process, side by side.
    ServeCost(promlab_lab::cli::ServeCostArgs),
    /// Serve /metrics (store or RabbitMQ scenario) or a remote-write receiver.
    Serve(promlab_lab::cli::ServeArgs),
    /// Check the whole pipeline end to end under every strategy set against the naive references.
    Verify(promlab_lab::verify::VerifyArgs),
    /// Replay remote-write request bodies offline and print the quantiles.
    Ingest(promlab_lab::cli::ingest::IngestArgs),
    /// The paced remote-write feeder (sharded over several receivers by hashmod).
    Feed(promlab_lab::cli::ingest::FeedArgs),
    /// One window's quantiles from a ClickHouse cluster the receivers write to.
    Query(promlab_lab::cli::cluster::QueryArgs),
    /// A local ClickHouse cluster (config, start), its tables (init, schema), measurements.
    Cluster(promlab_lab::cli::cluster::ClusterArgs),
    /// The reliability suite: hostile cases and an overload run against the real binary.
    Soak(promlab_lab::cli::SoakArgs),
    /// Write an export scenario's store directory, registry and expected exposition.
    ScenarioStore(promlab_lab::cli::ScenarioStoreArgs),
    /// Internal: replay one op log in this process (used by `replay`).
    #[command(hide = true)]
    ReplayOne(promlab_lab::cli::ReplayOneArgs),
    /// Internal: one ablation arm once, for its peak memory (used by `ablate --peak-rss`).
    #[command(hide = true)]
    ArmRss(promlab_lab::cli::ArmRssArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        None => promlab_lab::cli::ablate(promlab_lab::cli::AblateArgs::main_job()),
        Some(Command::Export(args)) => promlab_lab::cli::export(args),
        Some(Command::Dump(args)) => promlab_lab::cli::dump(args),
        Some(Command::Replay(args)) => promlab_lab::cli::replay(args),
        Some(Command::ReplayOne(args)) => promlab_lab::cli::replay_one(args),
        Some(Command::ArmRss(args)) => promlab_lab::cli::arm_rss(args),
        Some(Command::Ablate(args)) => promlab_lab::cli::ablate(args),
        Some(Command::Scale(args)) => promlab_lab::cli::scale(args),
        Some(Command::Report(args)) => promlab_lab::cli::report(args),
        Some(Command::Flamegraph(args)) => promlab_lab::cli::flamegraph(args),
        Some(Command::Profiles(args)) => promlab_lab::cli::profiles(args),
        Some(Command::Fold(args)) => promlab_lab::cli::fold(args),
        Some(Command::ServeCost(args)) => promlab_lab::cli::serve_cost(args),
        Some(Command::Serve(args)) => promlab_lab::cli::serve(args),
        Some(Command::Verify(args)) => promlab_lab::verify::run(args),
        Some(Command::Ingest(args)) => promlab_lab::cli::ingest::ingest(args),
        Some(Command::Feed(args)) => promlab_lab::cli::ingest::feed(args),
        Some(Command::Query(args)) => promlab_lab::cli::cluster::query(args),
        Some(Command::Cluster(args)) => promlab_lab::cli::cluster::cluster(args),
        Some(Command::Soak(args)) => promlab_lab::cli::soak(args),
        Some(Command::ScenarioStore(args)) => promlab_lab::cli::scenario_store(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("promlab: {err:#}");
            ExitCode::FAILURE
        }
    }
}
