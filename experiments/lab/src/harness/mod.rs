//! The research harness: scenarios as data, verified before they are timed.
//!
//! A scenario (`experiments/scenarios/*.toml`) names its generator and the
//! generator's typed parameters ([`Generator`], which also decides the stage)
//! at two sizes (`quick` for CI and the default run, `full` for the real
//! figures), each with the SHA-256 of the output every strategy combination
//! must produce — the way rebar's definitions carry their expected answer.
//! [`ablate`] then
//! 1. **verifies** every combination of the stage's strategies against that
//!    digest, stopping with the combination and the first differing line;
//! 2. **measures** the arms ([`arms`]: baseline, each strategy alone, all but
//!    one, all) interleaved round by round (A B C … A B C …) so drift hits
//!    every arm alike, checking what every timed run returned, and reports
//!    medians, spread and the speed-up over the baseline;
//! 3. **reports** a terminal table and a CSV per scenario plus `machine.txt`.

pub mod clones;
pub mod dossier;
pub mod floor;
pub mod peers;
pub mod profiles;
pub mod query;
pub mod report;
pub mod rss;
pub mod scale;
pub mod workloads;

use anyhow::{bail, Context, Result};
use promlab::format::formenc::Dialect;
use promlab::shared::strategy::{Stage, Strategy, StrategySet};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One workload, as a scenario file describes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub quick: Size,
    pub full: Size,
}

/// The generator's parameters at one size, and the answer to expect.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Size {
    /// Which generator builds the workload, with its parameters.
    pub params: Generator,
    /// How many timed rounds (each runs every arm once).
    pub repeats: usize,
    /// SHA-256 (hex) of the output every strategy combination must produce.
    pub expected: String,
}

/// A workload generator and its parameters (`params = { generator = "asap", groups = 50, … }`).
/// It serializes back to the same form (`promlab arm-rss --params` takes it as JSON).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(tag = "generator", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Generator {
    /// Write: `steps` × (histogram observe + counter increment), 195-character label.
    LongLabel { steps: usize },
    /// Export: the slow-export report's repro, written by promlab's writer.
    SeedRepro { processes: usize, statements: usize },
    /// Export: the larger case, generated.
    Large {
        processes: usize,
        statements: usize,
        max_len: usize,
    },
    /// Export: a store client_ruby wrote (a fixture case), with Ruby's exposition.
    RubyStore { case: String },
    /// Export: a small store client_ruby wrote (`all-types-*`) cloned under
    /// new pids, `processes` writer processes ([`clones`]): client_ruby#143's
    /// directory of exited workers' files.
    RubyClones { case: String, processes: usize },
    /// Export: `metrics` counters × `processes` processes, one entry per file,
    /// written by promlab's writer ([`promlab::scenarios::workload::many_metrics`]).
    ManyMetrics { metrics: usize, processes: usize },
    /// Render: RabbitMQ's per-object scrape of `queues` queues.
    Rabbitmq {
        queues: usize,
        #[serde(default)]
        awkward_names: bool,
    },
    /// Ingest: the feeder's workload, `ticks` seconds of it.
    Asap {
        groups: u64,
        series_per_group: u64,
        ticks: u64,
    },
    /// Ingest: the feeder's workload with series churn: every tick,
    /// `new_series_per_tick` of its series (taken in turn) are replaced by new
    /// ones in the same groups ([`workloads::churn_bodies`]).
    AsapChurn {
        groups: u64,
        series_per_group: u64,
        ticks: u64,
        new_series_per_tick: u64,
    },
    /// Ingest across cores: the feeder's workload through a laned ingester of
    /// `lanes` lanes, fed by as many threads at once (`workloads::Laned`).
    AsapLanes {
        groups: u64,
        series_per_group: u64,
        ticks: u64,
        lanes: usize,
    },
    /// Ingest: the requests a real Prometheus sent, `passes` times over.
    PrometheusCaptures { passes: usize },
    /// Query: the quantiles of every group's last closed window, after the
    /// feeder's workload (`ticks` seconds of it) was ingested.
    AsapQuery {
        groups: u64,
        series_per_group: u64,
        ticks: u64,
    },
}

impl Generator {
    /// The stage whose seam the generated workload runs.
    pub fn stage(&self) -> Stage {
        match self {
            Generator::LongLabel { .. } => Stage::Write,
            Generator::SeedRepro { .. }
            | Generator::Large { .. }
            | Generator::RubyStore { .. }
            | Generator::RubyClones { .. }
            | Generator::ManyMetrics { .. } => Stage::Export,
            Generator::Rabbitmq { .. } => Stage::Render,
            Generator::Asap { .. }
            | Generator::AsapChurn { .. }
            | Generator::AsapLanes { .. }
            | Generator::PrometheusCaptures { .. }
            | Generator::AsapQuery { .. } => Stage::Ingest,
        }
    }
}

impl Scenario {
    /// The stage of the scenario's generator (the same at both sizes: [`load_scenario`] checks).
    pub fn stage(&self) -> Stage {
        self.quick.params.stage()
    }

    pub fn size(&self, quick: bool) -> &Size {
        if quick {
            &self.quick
        } else {
            &self.full
        }
    }
}

/// The scenarios that ship with promlab (`experiments/scenarios/`), in run order.
pub const BUILT_IN: [(&str, &str); 11] = [
    (
        "write-long-label",
        include_str!("../../../scenarios/write-long-label.toml"),
    ),
    (
        "seed-repro",
        include_str!("../../../scenarios/seed-repro.toml"),
    ),
    ("large", include_str!("../../../scenarios/large.toml")),
    (
        "large-ruby",
        include_str!("../../../scenarios/large-ruby.toml"),
    ),
    (
        "many-processes",
        include_str!("../../../scenarios/many-processes.toml"),
    ),
    (
        "many-processes-5k",
        include_str!("../../../scenarios/many-processes-5k.toml"),
    ),
    (
        "many-metrics",
        include_str!("../../../scenarios/many-metrics.toml"),
    ),
    (
        "rabbitmq-per-object",
        include_str!("../../../scenarios/rabbitmq-per-object.toml"),
    ),
    ("asap-1e5", include_str!("../../../scenarios/asap-1e5.toml")),
    (
        "prometheus-captures",
        include_str!("../../../scenarios/prometheus-captures.toml"),
    ),
    (
        "asap-query",
        include_str!("../../../scenarios/asap-query.toml"),
    ),
];

/// A built-in scenario by name, or a scenario file by path.
pub fn load_scenario(name_or_path: &str) -> Result<Scenario> {
    let text = match BUILT_IN.iter().find(|(name, _)| *name == name_or_path) {
        Some((_, text)) => text.to_string(),
        None if Path::new(name_or_path).exists() => std::fs::read_to_string(name_or_path)?,
        None => {
            let names: Vec<&str> = BUILT_IN.iter().map(|(n, _)| *n).collect();
            bail!(
                "unknown scenario `{name_or_path}` (built in: {}; or a path to a .toml file)",
                names.join(", ")
            )
        }
    };
    let scenario: Scenario =
        toml::from_str(&text).with_context(|| format!("scenario {name_or_path} does not parse"))?;
    if scenario.quick.params.stage() != scenario.full.params.stage() {
        bail!(
            "scenario {name_or_path}: its quick size runs the {} stage but its full size the {}",
            scenario.quick.params.stage(),
            scenario.full.params.stage()
        );
    }
    Ok(scenario)
}

/// What one run produced, as it returns it.
pub enum Output<'a> {
    /// Bytes every run of every strategy combination must reproduce
    /// (exposition, or quantile JSON and counters).
    Bytes(&'a [u8]),
    /// A store directory the run wrote into (the write stage's product). Its
    /// state grows run by run, so it is compared after the same number of runs.
    Store(&'a Path),
    /// A floor's product, which is not the stage's answer: how many units it
    /// handled (checked against [`Workload::units`]).
    Units(u64),
}

impl Output<'_> {
    /// The comparable bytes: a store directory is read (timestamps zeroed).
    pub fn bytes(&self) -> Result<std::borrow::Cow<'_, [u8]>> {
        Ok(match self {
            Output::Bytes(bytes) => std::borrow::Cow::Borrowed(bytes),
            Output::Store(dir) => std::borrow::Cow::Owned(workloads::store_bytes(dir)?),
            Output::Units(n) => std::borrow::Cow::Owned(n.to_le_bytes().to_vec()),
        })
    }
}

/// A workload ready to run: built once, run many times.
pub trait Workload {
    /// One timed run, returning what it produced: that is what is verified.
    /// The first run of a strategy set produces the scenario's expected output.
    fn run(&mut self, strategies: StrategySet) -> Result<Output<'_>>;
    /// How much one run does, and of what (`lines`, `samples`, `ops`).
    fn units(&self) -> (u64, &'static str);
    /// The stage's floor on the same input: the least work its contract allows
    /// ([`floor`]). Checked like an arm: bytes against the verified answer, or
    /// ([`Output::Units`]) the units it handled against [`Workload::units`].
    fn floor(&mut self) -> Result<Output<'_>>;
    /// Called once, before anything runs, when several arms will share this
    /// workload (ablate, scale; not `arm-rss`'s child, which runs one): a
    /// workload whose arms share a process-wide resource settles it here.
    fn prepare_arms(&mut self) -> Result<()> {
        Ok(())
    }
    /// Arms besides the strategy sets and the floor (the query's other paths),
    /// by name, with the strategy set each runs under.
    fn extra_arms(&self) -> Vec<(&'static str, StrategySet)> {
        Vec::new()
    }
    /// One run of an extra arm ([`Workload::extra_arms`]).
    fn run_extra(&mut self, name: &str, _strategies: StrategySet) -> Result<Output<'_>> {
        bail!("no extra arm `{name}` in this workload")
    }
    /// Extra arms that are floors of another contract some arms keep (run by
    /// [`Workload::run_extra`]; the query's uncached answer is held to the
    /// quantile scan with the answer written, its kept answer to a copy).
    fn extra_floors(&self) -> Vec<&'static str> {
        Vec::new()
    }
    /// The floor arm the arm `name` (run under `strategies`) is held to: the
    /// stage's (`floor`) unless the arm keeps another contract
    /// ([`Workload::extra_floors`]).
    fn floor_of(&self, _arm: &str, _strategies: StrategySet) -> &'static str {
        FLOOR
    }
}

/// The name of the stage's floor arm.
pub const FLOOR: &str = "floor";

/// What an arm runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArmKind {
    /// The stage under a strategy set ([`Workload::run`]).
    Strategies,
    /// The stage's floor ([`Workload::floor`]), or a contract's
    /// ([`Workload::extra_floors`], run by [`Workload::run_extra`]).
    Floor,
    /// Another path to the same answer ([`Workload::extra_arms`]).
    Extra,
}

/// One run of an arm of any kind.
pub fn run_arm<'w>(
    workload: &'w mut dyn Workload,
    kind: ArmKind,
    name: &str,
    strategies: StrategySet,
) -> Result<Output<'w>> {
    match kind {
        ArmKind::Strategies => workload.run(strategies),
        ArmKind::Floor if name == FLOOR => workload.floor(),
        ArmKind::Floor | ArmKind::Extra => workload.run_extra(name, strategies),
    }
}

/// Every arm `promlab ablate` measures for `workload`: the strategy arms of
/// `set` ([`arms`]), then the workload's extra arms, then its floor.
pub fn all_arms(
    stage: Stage,
    set: StrategySet,
    workload: &dyn Workload,
) -> Vec<(String, StrategySet, ArmKind)> {
    let mut all: Vec<_> = arms(stage, set)
        .into_iter()
        .map(|(name, s)| (name, s, ArmKind::Strategies))
        .collect();
    let floors = workload.extra_floors();
    for (name, s) in workload.extra_arms() {
        let kind = if floors.contains(&name) {
            ArmKind::Floor
        } else {
            ArmKind::Extra
        };
        all.push((name.to_string(), s, kind));
    }
    all.push((FLOOR.to_string(), StrategySet::NONE, ArmKind::Floor));
    all
}

pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

/// The expected answer for a generated workload, computed independently of
/// the strategies under test — the one place `--print-digests` and the benches
/// (at sizes without a stored digest) get it from. Every stage's answer comes
/// from real software or from the naive references ([`promlab::reference`]),
/// never from a run of the stage under test, baseline included:
/// - a store client_ruby wrote: Ruby's own exposition (`expected.prom`);
/// - a generated store (`seed-repro`, `large`, `many-metrics`): the reference
///   writer's files from the op logs, exported by the reference exporter;
/// - a client_ruby store cloned under new pids (`many-processes*`): the
///   reference exporter over the cloned directory (and the client_ruby peers,
///   `--peers`, check Ruby's own exposition of it against the same digest);
/// - write (`long-label`): the reference writer's files from the writer's op
///   log, each at the size client_ruby gives a file of its used length
///   ([`promlab::reference::store::file_size`]), as [`workloads::store_bytes`]
///   lays a store out;
/// - render (`rabbitmq`): the node's families as plain data
///   ([`promlab::scenarios::rabbitmq::contents`], from the scenario's definition)
///   printed by the reference renderer ([`promlab::reference::live`]);
/// - ingest and query (`asap`, `prometheus-captures`, `asap-query`): the
///   request bodies decoded by `snap` and `prost`, the window rules applied
///   by the reference ([`promlab::reference::ingest`]), and each pane's
///   quantiles from the `sketches-ddsketch` crate fed its values — the real
///   sketch, so the JSON answer is expected bit for bit; the counters are the
///   reference's.
pub fn expected_answer(params: &Generator) -> Result<Vec<u8>> {
    use promlab::reference;
    let generated = match params {
        // Lanes answer as one ingester of the same requests does.
        Generator::AsapLanes {
            groups,
            series_per_group,
            ticks,
            ..
        } => {
            return expected_answer(&Generator::Asap {
                groups: *groups,
                series_per_group: *series_per_group,
                ticks: *ticks,
            })
        }
        Generator::RubyStore { case } => {
            let dir = tempfile::tempdir()?;
            let case_dir = crate::fixtures::unpack_ruby_case(case, dir.path())?;
            return Ok(std::fs::read(case_dir.join("expected.prom"))?);
        }
        Generator::RubyClones { case, processes } => {
            let dir = tempfile::tempdir()?;
            let registry = clones::write(case, *processes, dir.path())?;
            return promlab::reference::exposition::export(dir.path(), &registry);
        }
        Generator::ManyMetrics { metrics, processes } => {
            promlab::scenarios::workload::many_metrics(*metrics, *processes)
        }
        Generator::SeedRepro {
            processes,
            statements,
        } => promlab::scenarios::workload::seed_repro(*processes, *statements),
        Generator::Large {
            processes,
            statements,
            max_len,
        } => promlab::scenarios::workload::large(*processes, *statements, *max_len),
        Generator::LongLabel { steps } => {
            let log = promlab::scenarios::workload::long_label_log(*steps);
            let registry = promlab::scenarios::workload::long_label_registry();
            let files = reference::store::files(&registry, &[(Dialect::Uri, log)])?;
            let mut out = Vec::new();
            for (name, region) in files {
                out.extend_from_slice(name.as_bytes());
                out.push(b'\n');
                let size = reference::store::file_size(region.len());
                out.extend_from_slice(&size.to_le_bytes());
                out.extend_from_slice(&region);
            }
            return Ok(out);
        }
        Generator::Rabbitmq {
            queues,
            awkward_names,
        } => {
            let families = promlab::scenarios::rabbitmq::contents(*queues, *awkward_names, 1);
            return Ok(reference::live::render(&families));
        }
        Generator::Asap {
            groups,
            series_per_group,
            ticks,
        } => {
            let bodies = workloads::feeder_bodies(*groups, *series_per_group, *ticks);
            return reference_ingest_answer(&promlab::ingest::plan::Plan::default(), bodies);
        }
        Generator::AsapChurn {
            groups,
            series_per_group,
            ticks,
            new_series_per_tick,
        } => {
            let bodies =
                workloads::churn_bodies(*groups, *series_per_group, *ticks, *new_series_per_tick);
            return reference_ingest_answer(&promlab::ingest::plan::Plan::default(), bodies);
        }
        Generator::PrometheusCaptures { passes } => {
            let bodies = workloads::captures_bodies(*passes);
            return reference_ingest_answer(&workloads::captures_plan()?, bodies);
        }
        Generator::AsapQuery {
            groups,
            series_per_group,
            ticks,
        } => {
            let plan = promlab::ingest::plan::Plan::default();
            let outcome =
                reference_ingest(&plan, query::bodies(*groups, *series_per_group, *ticks))?;
            let agg = plan
                .aggregations
                .iter()
                .position(|a| a.id == query::AGGREGATION)
                .context("the default plan's aggregation")?;
            // A receiver's state as it runs: the windows the watermark closed.
            let answer = reference::ingest::answer(&outcome, &plan, agg, false);
            return Ok(serde_json::to_vec(&answer)?);
        }
    };
    let dir = tempfile::tempdir()?;
    let logs: Vec<_> = generated
        .logs
        .iter()
        .map(|log| (Dialect::Uri, log.clone()))
        .collect();
    for (name, bytes) in reference::store::files(&generated.registry, &logs)? {
        std::fs::write(dir.path().join(name), bytes)?;
    }
    reference::exposition::export(dir.path(), &generated.registry)
}

/// The reference's outcome of `bodies`, in order.
fn reference_ingest(
    plan: &promlab::ingest::plan::Plan,
    bodies: impl Iterator<Item = Vec<u8>>,
) -> Result<promlab::reference::ingest::Outcome> {
    let mut run = promlab::reference::ingest::Run::new(plan);
    for body in bodies {
        run.request(&promlab::reference::ingest::decode_body(&body)?);
    }
    Ok(run.outcome)
}

/// An ingest run's answer by the reference: every aggregation's last closed
/// window once the stream is flushed, then the counters (as
/// `workloads::Ingest` writes its own).
fn reference_ingest_answer(
    plan: &promlab::ingest::plan::Plan,
    bodies: impl Iterator<Item = Vec<u8>>,
) -> Result<Vec<u8>> {
    let outcome = reference_ingest(plan, bodies)?;
    let mut out = serde_json::to_vec(&promlab::reference::ingest::answers(&outcome, plan, true))?;
    let c = outcome.counts;
    workloads::write_counters(
        &mut out,
        [c.accepted, c.late, c.stale, c.rejected, c.unrouted],
    )?;
    Ok(out)
}

/// The strategy set the benches ablate for `stage`: the build's features that
/// belong to it (`cargo bench --features series-cache,batch-routing`), or all
/// of the stage's strategies when none does.
pub fn configured(stage: Stage) -> StrategySet {
    let set = StrategySet::compiled_default().restrict(stage);
    if set.is_empty() {
        StrategySet::all().restrict(stage)
    } else {
        set
    }
}

/// The arms of an ablation of `set` (its strategies of `stage`): baseline,
/// each strategy alone, all but one (`all-<strategy>`), all — without
/// repeats, all last. The one arm list of `promlab ablate`, the criterion
/// benches and the iai bench.
pub fn arms(stage: Stage, set: StrategySet) -> Vec<(String, StrategySet)> {
    let strategies: Vec<Strategy> = set.restrict(stage).iter().collect();
    let all: StrategySet = strategies.iter().copied().collect();
    let mut arms = vec![("baseline".to_string(), StrategySet::NONE)];
    for s in &strategies {
        arms.push((s.name().to_string(), StrategySet::NONE.with(*s)));
    }
    // With two, "all but one" is the other one alone.
    if strategies.len() > 2 {
        for s in &strategies {
            arms.push((format!("all-{}", s.name()), all.without(*s)));
        }
    }
    if strategies.len() > 1 {
        arms.push(("all".to_string(), all));
    }
    arms
}

/// A bench's name for an arm: its strategies (`baseline` for none), so a
/// criterion history never mixes two different sets under one name.
pub fn bench_id(strategies: StrategySet) -> String {
    if strategies.is_empty() {
        "baseline".to_string()
    } else {
        strategies.to_string()
    }
}

pub use promlab::reference::compare::first_difference;

/// A combination's output did not match.
fn mismatch_report(
    scenario: &str,
    strategies: StrategySet,
    got: &[u8],
    baseline: Option<&[u8]>,
    expected: &str,
) -> String {
    let mut report = format!(
        "scenario {scenario}: strategies `{strategies}` produced digest {} but {expected} was expected",
        digest(got)
    );
    if let Some(base) = baseline {
        if base != got {
            report.push_str("\nfirst difference from the baseline ");
            report.push_str(&first_difference(
                base,
                got,
                "baseline",
                &strategies.to_string(),
            ));
        } else {
            report.push_str("\n(the baseline produces the same bytes: the expected digest is stale or the generator changed)");
        }
    }
    report
}

/// Checks what one run of the arm `name` returned: bytes must be the verified
/// answer, a floor's units the workload's. A store is compared after the rounds.
fn check_output(
    scenario: &str,
    round: usize,
    name: &str,
    verified: &[u8],
    units: u64,
    output: &Output<'_>,
) -> Result<()> {
    match output {
        Output::Bytes(bytes) if *bytes != verified => bail!(
            "scenario {scenario}: run {round} of `{name}` differs from its verified output {}",
            first_difference(verified, bytes, "verified", name)
        ),
        Output::Units(n) if *n != units => bail!(
            "scenario {scenario}: run {round} of `{name}` handled {n} units, not the workload's {units}"
        ),
        _ => Ok(()),
    }
}

/// Options of one ablation run.
#[derive(Clone, Debug)]
pub struct AblateOptions {
    pub quick: bool,
    /// Restrict the arms to these strategies (per stage).
    pub only: Option<StrategySet>,
    pub out: Option<PathBuf>,
    /// Override the scenario's number of rounds.
    pub repeats: Option<usize>,
    /// Print the digests instead of checking them (to bless a changed generator).
    pub print_digests: bool,
    pub progress: bool,
    /// Run the peer arms after ours (`--peers`).
    pub peers: bool,
    /// Include the optional embedded-ClickHouse peer (`--with-clickhouse`).
    pub with_clickhouse: bool,
    /// `--peak-rss`: the `promlab` binary to run each arm once in, as a child
    /// process, for its peak resident memory ([`rss`]).
    pub peak_rss: Option<PathBuf>,
}

/// Timings of one arm.
#[derive(Clone, Debug)]
pub struct ArmResult {
    pub arm: String,
    pub strategies: StrategySet,
    pub kind: ArmKind,
    /// The floor arm this arm is held to ([`Workload::floor_of`]; a floor's own name).
    pub floor: String,
    /// Wall time of one run, per sample ([`measure`]: a sample's runs' sum
    /// over their count).
    pub samples: Vec<Duration>,
    /// CPU time of this process (every thread) of one run, per sample.
    pub cpu: Vec<Duration>,
    /// How many back-to-back runs each sample timed ([`MIN_SAMPLE`]).
    pub runs_per_sample: u32,
    /// Whether the arm's runs write a store (then it runs once per sample).
    pub writes_store: bool,
    /// The fastest of its warm-up runs (see [`warmed_up`]).
    pub typical: Duration,
    /// `--peak-rss`: the run's own peak resident memory, in bytes (see [`rss`]).
    pub peak_rss_bytes: Option<u64>,
}

impl ArmResult {
    /// Whether each sample follows an untimed run ([`WARM_RUN_BELOW`]):
    /// known once its warm-up ([`measure`]'s round 0) has run.
    pub fn warm_run(&self) -> bool {
        !self.writes_store && self.typical < WARM_RUN_BELOW
    }

    pub fn quantile(&self, q: f64) -> Duration {
        quantile(&self.samples, q)
    }

    pub fn median(&self) -> Duration {
        self.quantile(0.5)
    }

    /// The median CPU time of a run.
    pub fn cpu_median(&self) -> Duration {
        quantile(&self.cpu, 0.5)
    }
}

/// The `q` quantile of `samples` (nearest rank); zero when there are none.
pub fn quantile(samples: &[Duration], q: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    match sorted.len() {
        0 => Duration::ZERO,
        n => sorted[((n - 1) as f64 * q).round() as usize],
    }
}

/// This process's CPU time so far, every thread (`CLOCK_PROCESS_CPUTIME_ID`).
pub fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The outcome of one scenario.
#[derive(Clone, Debug)]
pub struct ScenarioResult {
    pub scenario: String,
    pub stage: Stage,
    pub size: &'static str,
    pub units: (u64, &'static str),
    pub digest: String,
    pub combinations_verified: usize,
    pub arms: Vec<ArmResult>,
    /// Peer arms (`--peers`), measured after ours.
    pub peers: Vec<peers::PeerResult>,
    /// Peers that had an arm here but did not run, with the reason.
    pub peers_skipped: Vec<String>,
}

/// Verifies, then measures, one scenario.
pub fn run_scenario(scenario: &Scenario, options: &AblateOptions) -> Result<ScenarioResult> {
    let stage = scenario.stage();
    let size = scenario.size(options.quick);
    let mut workload = workloads::build(&size.params)
        .with_context(|| format!("cannot build scenario {}", scenario.name))?;
    workload.prepare_arms()?;
    let expected = if options.print_digests {
        let answer = digest(&expected_answer(&size.params)?);
        println!(
            "{} ({}): expected = \"{answer}\"",
            scenario.name,
            if options.quick { "quick" } else { "full" }
        );
        answer
    } else {
        size.expected.clone()
    };

    // 1. Verify the first run of every combination of the stage's strategies.
    let combinations = StrategySet::combinations(stage);
    let progress = report::Progress::new(
        options.progress,
        &scenario.name,
        combinations.len() as u64,
        "verify",
    );
    let mut baseline_output: Option<Vec<u8>> = None;
    for strategies in &combinations {
        let output = workload.run(*strategies)?.bytes()?.into_owned();
        if digest(&output) != expected {
            bail!(mismatch_report(
                &scenario.name,
                *strategies,
                &output,
                baseline_output.as_deref(),
                &expected
            ));
        }
        if baseline_output.is_none() {
            baseline_output = Some(output);
        }
        progress.inc();
    }
    progress.finish();
    let verified = baseline_output.unwrap_or_default();
    let arms = all_arms(
        stage,
        options
            .only
            .unwrap_or_else(StrategySet::all)
            .restrict(stage),
        workload.as_ref(),
    );
    let mut result = ScenarioResult {
        scenario: scenario.name.clone(),
        stage,
        size: if options.quick { "quick" } else { "full" },
        units: workload.units(),
        digest: digest(&verified),
        combinations_verified: combinations.len(),
        arms: Vec::new(),
        peers: Vec::new(),
        peers_skipped: Vec::new(),
    };
    if options.print_digests {
        return Ok(result);
    }

    // 2. Measure the arms, interleaved; what every timed run returned is checked
    //    (the floor's too: its bytes, or the units it handled).
    let repeats = options.repeats.unwrap_or(size.repeats).max(1);
    let results = measure(
        &scenario.name,
        workload.as_mut(),
        &arms,
        repeats,
        &verified,
        options.progress,
    )?;
    result.arms = results;

    // 3. Peak memory, each arm once in a child of its own (`--peak-rss`).
    if let Some(exe) = &options.peak_rss {
        for arm in &mut result.arms {
            arm.peak_rss_bytes = Some(rss::probe(exe, &scenario.name, options.quick, &arm.arm)?);
        }
    }

    // 4. The peers, after ours.
    if options.peers {
        (result.peers, result.peers_skipped) = peers::run_for(
            scenario,
            size,
            options.quick,
            repeats,
            options.with_clickhouse,
        );
    }
    Ok(result)
}

/// Seeds [`measure`]'s round orders: the same orders in every run.
const ROUND_ORDER_SEED: u64 = 0x5eed_0fa7;

/// The least wall time of one [`measure`] sample: 5 ms, thousands of times
/// the clock's cost. With 1 ms, an arm of 0.8 ms ran 2 runs a sample and its
/// floor of 1.1 ms one, and on `large-ruby`, whose scrape streams 25 MB
/// through a shared host's memory, that read 0.75× (2026-12-04; 0.96× at
/// 5 ms, 1.04–1.10× alternated alone in `examples/cold_scrape`).
pub const MIN_SAMPLE: Duration = Duration::from_millis(5);

/// At most this many runs make one sample (a run of under 5 µs).
const MAX_RUNS_PER_SAMPLE: u32 = 1000;

/// An arm whose runs take less than this has one untimed run before each
/// sample: the first run after another arm's starts cold, and at a few
/// hundred microseconds that cold start was a third of a run or more, so a
/// sample of 2 runs and one of 4 (an arm and its floor, sized apart) measured
/// different shares of it (asap-query's answer computed afresh: 0.84× of its
/// floor, which measured 0.96–0.97× alone). Longer runs are timed from cold:
/// there the refill is a few percent, and a second run would double the
/// rounds' time.
pub const WARM_RUN_BELOW: Duration = Duration::from_millis(10);

/// Whether an arm's warm-up (round 0, untimed) has run enough to size its
/// samples: one run of a store writer (every arm writes as often) or of an
/// arm that took ten [`MIN_SAMPLE`]s or more; else runs until two have
/// passed, at least three runs, whose fastest sizes the samples: the first
/// run after another arm's is cold (asap-query's quantile floor took over
/// 1 ms for a 0.3 ms run), and on a shared host one run in a few is slow
/// (`large`'s floor drew one of over 5 ms for a 2 ms run, ran one run a
/// sample where `all` ran four, and read 1.11× `all`). The median of three
/// was not enough: `floor-folded`'s warm-up once drew two slow runs of
/// three, sized as a 10 ms arm (one cold run a sample, no warm run before
/// it) beside `all`'s two warm runs, and read 1.31× `all` (`large`, Zen 4).
fn warmed_up(runs: &[Duration], writes_store: bool) -> bool {
    let elapsed: Duration = runs.iter().sum();
    writes_store
        || runs
            .iter()
            .min()
            .is_some_and(|&fastest| fastest >= 10 * MIN_SAMPLE)
        || (runs.len() >= 3 && elapsed >= 2 * MIN_SAMPLE)
        || runs.len() >= MAX_RUNS_PER_SAMPLE as usize
}

/// How many back-to-back runs make a sample of an arm whose warm-up runs
/// took `typical` at their fastest: enough for [`MIN_SAMPLE`]; one for an arm that
/// writes a store.
fn runs_per_sample(typical: Duration, writes_store: bool) -> u32 {
    if writes_store || typical >= MIN_SAMPLE {
        return 1;
    }
    let per_run = typical.as_nanos().max(1);
    (MIN_SAMPLE.as_nanos().div_ceil(per_run) as u32).clamp(1, MAX_RUNS_PER_SAMPLE)
}

/// A floor and the arms within 2× of it run as many runs a sample, the most
/// any of them needs: on a memory-bound scrape a sample's later runs ran
/// faster than its first, so with `large`'s `all` at two runs a sample and
/// its floor at one (2.1 against 2.2 ms a run) `all` read 0.86× of it, at two
/// each 1.00× (2026-12-04). Arms further from their floor keep their own
/// count (raised to a microsecond floor's, a slow arm's rounds would take
/// minutes), as do arms timed from cold (10 ms or more a run).
fn share_runs_per_sample(results: &mut [ArmResult]) {
    let near = |arm: &ArmResult, floor: &ArmResult| {
        arm.warm_run() && floor.warm_run() && arm.typical < 2 * floor.typical
    };
    let shared: Vec<u32> = results
        .iter()
        .map(|arm| {
            let Some(floor) = results.iter().find(|f| f.arm == arm.floor) else {
                return arm.runs_per_sample;
            };
            if !near(arm, floor) {
                return arm.runs_per_sample;
            }
            results
                .iter()
                .filter(|other| other.floor == floor.arm && near(other, floor))
                .map(|other| other.runs_per_sample)
                .max()
                .unwrap_or(arm.runs_per_sample)
        })
        .collect();
    for (arm, runs) in results.iter_mut().zip(shared) {
        arm.runs_per_sample = runs;
    }
}

/// Measures `arms` of `workload`: one untimed warm-up round, then `repeats`
/// rounds, each running every arm once in an order of its own (shuffled, from
/// a fixed seed), so drift on a shared machine hits every arm alike and no arm
/// always runs after the same one. (Rounds used to rotate the one order: A B
/// C, B C A, …, where each arm follows the same arm every round, and an arm
/// after one that sweeps the caches ran cold every time: query-groups'
/// copy floor, after the quantile scan, measured 0.78–0.93× of the arms that
/// copy the same bytes.) What
/// every run returned is checked: bytes against `verified`, a floor's units
/// against the workload's; stores are compared after the last round.
///
/// A sample is [`MIN_SAMPLE`] or more of one arm's back-to-back runs (the
/// count sized by its warm-up runs, [`warmed_up`]), each timed on its own: a single run of a
/// few microseconds measured mostly how much of its working set the arm
/// before had evicted (export-files' folded scrapes moved by up to 2x, the
/// query's kept-answer copy by 2x between identical arms). The sample is their
/// sum over their count. An arm of under [`WARM_RUN_BELOW`] a run has an
/// untimed run before each sample. An arm that writes a store runs once per
/// sample, with none before: its store's state grows with every run, and every
/// arm must run as often.
pub fn measure(
    label: &str,
    workload: &mut dyn Workload,
    arms: &[(String, StrategySet, ArmKind)],
    repeats: usize,
    verified: &[u8],
    progress: bool,
) -> Result<Vec<ArmResult>> {
    let mut results: Vec<ArmResult> = arms
        .iter()
        .map(|(arm, s, kind)| ArmResult {
            arm: arm.clone(),
            strategies: *s,
            kind: *kind,
            floor: match kind {
                ArmKind::Floor => arm.clone(),
                _ => workload.floor_of(arm, *s).to_string(),
            },
            samples: Vec::new(),
            cpu: Vec::new(),
            runs_per_sample: 1,
            writes_store: false,
            typical: Duration::ZERO,
            peak_rss_bytes: None,
        })
        .collect();
    keep_freed_memory();
    let progress = report::Progress::new(progress, label, (repeats * arms.len()) as u64, "measure");
    let units = workload.units().0;
    // Digests of the last round's stores: every arm has run as often by then.
    let mut last_stores: Vec<Option<String>> = vec![None; arms.len()];
    let mut rng = fastrand::Rng::with_seed(ROUND_ORDER_SEED);
    let mut order: Vec<usize> = (0..arms.len()).collect();
    for round in 0..=repeats {
        rng.shuffle(&mut order);
        for &i in &order {
            let (name, set, kind) = &arms[i];
            let sampled = round > 0;
            if sampled && results[i].warm_run() {
                let output = run_arm(workload, *kind, name, *set)?;
                check_output(label, round, name, verified, units, &output)?;
            }
            let mut runs = 0;
            let mut elapsed = Duration::ZERO;
            let mut warm_up = Vec::new();
            // The CPU clock is a syscall (microseconds on a cold cache here):
            // read outside the wall-clock windows, which hold the arm alone.
            let start_cpu = process_cpu();
            loop {
                let start = Instant::now();
                let output = run_arm(workload, *kind, name, *set)?;
                let run = start.elapsed();
                (elapsed, runs) = (elapsed + run, runs + 1);
                check_output(label, round, name, verified, units, &output)?;
                if let store @ Output::Store(_) = output {
                    if round == repeats {
                        last_stores[i] = Some(digest(&store.bytes()?));
                    }
                    results[i].writes_store = true;
                }
                let done = if sampled {
                    runs == results[i].runs_per_sample
                } else {
                    warm_up.push(run);
                    warmed_up(&warm_up, results[i].writes_store)
                };
                if done {
                    break;
                }
            }
            let cpu = process_cpu() - start_cpu;
            if sampled {
                results[i].samples.push(elapsed / runs);
                results[i].cpu.push(cpu / runs);
                progress.inc();
            } else {
                let typical = *warm_up.iter().min().expect("a warm-up runs once or more");
                results[i].typical = typical;
                results[i].runs_per_sample = runs_per_sample(typical, results[i].writes_store);
            }
        }
        if round == 0 {
            share_runs_per_sample(&mut results);
        }
    }
    if let Some((i, _)) = last_stores
        .iter()
        .enumerate()
        .find(|(_, d)| d.is_some() && **d != last_stores[0])
    {
        bail!(
            "scenario {label}: after {} runs each, `{}` left a store different from the baseline's",
            repeats + 2,
            arms[i].1
        );
    }
    progress.finish();
    Ok(results)
}

/// Keeps the memory an arm frees in this process for the next run (glibc:
/// no trimming of the heap's top, blocks under 32 MiB from the heap), for
/// every arm alike. A run that builds its state afresh (the ingest
/// workload's new ingester) otherwise met the kernel's zeroed pages again
/// whenever glibc had handed its last run's memory back: `all` at 1,000
/// groups × 100 series took 4,460 page faults a run (14 % of its time, 56
/// against 48.6 ms) where its floor, whose memory happened to stay, took
/// none (2026-12-04). A long-lived receiver keeps its memory; what is timed
/// is the work, not glibc's trimming thresholds. Peak RSS is measured in
/// child processes of their own ([`rss`]), without this.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: `mallopt` only sets the allocator's thresholds; it is
            // called once, before the timed runs, with documented parameters.
            // (The largest threshold glibc takes for M_MMAP_THRESHOLD on
            // 64-bit is 32 MiB; a trim threshold this large never trims.)
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            }
        });
    }
}

/// Runs the named scenarios (all built-ins when empty) and reports.
pub fn ablate(names: &[String], options: &AblateOptions) -> Result<Vec<ScenarioResult>> {
    let load_at_start = report::run_started();
    let names: Vec<String> = if names.is_empty() {
        BUILT_IN.iter().map(|(n, _)| n.to_string()).collect()
    } else {
        names.to_vec()
    };
    let scenarios: Vec<Scenario> = names
        .iter()
        .map(|n| load_scenario(n))
        .collect::<Result<_>>()?;
    let out_dir = match &options.out {
        Some(dir) => dir.clone(),
        None => report::default_results_dir(),
    };
    let mut results = Vec::new();
    for scenario in &scenarios {
        let result = run_scenario(scenario, options)?;
        if !options.print_digests {
            println!("{}", report::table(&result));
            report::write_csv(&out_dir, &result)?;
        }
        results.push(result);
    }
    if !options.print_digests {
        report::write_machine(&out_dir, options, load_at_start)?;
        println!("results: {}", out_dir.display());
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An arm near its floor runs as many runs a sample as the floor (the
    /// most either needs); an arm far from it, or timed from cold, keeps its own.
    #[test]
    fn an_arm_near_its_floor_shares_its_runs_per_sample() {
        let arm = |name: &str, floor: &str, micros: u64, runs: u32| ArmResult {
            arm: name.to_string(),
            strategies: StrategySet::NONE,
            kind: ArmKind::Strategies,
            floor: floor.to_string(),
            samples: Vec::new(),
            cpu: Vec::new(),
            runs_per_sample: runs,
            writes_store: false,
            typical: Duration::from_micros(micros),
            peak_rss_bytes: None,
        };
        let mut results = vec![
            arm("all", "floor", 1_700, 3),
            arm("baseline", "floor", 300_000, 1),
            arm("slow", "floor", 4_000, 2),
            arm("floor", "floor", 1_900, 1),
            arm("other", "other-floor", 10, 500),
        ];
        share_runs_per_sample(&mut results);
        let runs: Vec<u32> = results.iter().map(|r| r.runs_per_sample).collect();
        assert_eq!(runs, [3, 1, 2, 3, 500]);
    }

    fn set(names: &str) -> StrategySet {
        names.parse().unwrap()
    }

    fn names(arms: &[(String, StrategySet)]) -> Vec<&str> {
        arms.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn arms_are_baseline_alone_all_but_one_all_without_repeats() {
        // One strategy: baseline and it.
        let a = arms(Stage::Ingest, set("series-cache"));
        assert_eq!(names(&a), ["baseline", "series-cache"]);
        // Two: "all but one" is the other alone, so it is not repeated.
        let a = arms(Stage::Ingest, set("series-cache,batch-routing"));
        assert_eq!(
            names(&a),
            ["baseline", "series-cache", "batch-routing", "all"]
        );
        assert_eq!(a[3].1, set("series-cache,batch-routing"));
        // Six: each alone, each left out, all.
        let a = arms(Stage::Write, StrategySet::all());
        assert_eq!(a.len(), 14);
        assert_eq!(
            a[7],
            (
                "all-key-cache".to_string(),
                set("increment-once,cached-pid,clock-once,coarse-clock,mmap-store")
            )
        );
        assert_eq!(a[13].1, StrategySet::all().restrict(Stage::Write));
        // Strategies of other stages are not arms; prerender is one of export's.
        let a = arms(Stage::Export, set("key-cache,prerender"));
        assert_eq!(names(&a), ["baseline", "prerender"]);
        assert_eq!(arms(Stage::Render, StrategySet::NONE).len(), 1);
        for stage in Stage::ALL {
            let a = arms(stage, StrategySet::all());
            let distinct: std::collections::HashSet<_> = a.iter().map(|(_, s)| *s).collect();
            assert_eq!(distinct.len(), a.len(), "{stage}");
        }
    }

    #[test]
    fn configured_is_the_features_of_the_stage_or_all_of_it() {
        for stage in Stage::ALL {
            let features = StrategySet::compiled_default().restrict(stage);
            let expected = if features.is_empty() {
                StrategySet::all().restrict(stage)
            } else {
                features
            };
            assert_eq!(configured(stage), expected);
        }
    }

    /// Every built-in scenario's stored digest (at its quick size; seed-repro's
    /// full size is its quick one) is the answer of the references and real
    /// software ([`expected_answer`]), and the baseline's run gives it too:
    /// no stage's expected answer is the code under test's own.
    #[test]
    fn every_stored_digest_is_the_references_answer() {
        let mut checked = Vec::new();
        for (name, _) in BUILT_IN {
            let scenario = load_scenario(name).unwrap();
            let size = scenario.size(true);
            let answer = expected_answer(&size.params).unwrap();
            assert!(!answer.is_empty(), "{name}");
            assert_eq!(
                digest(&answer),
                size.expected,
                "{name}: the reference's answer"
            );
            let mut workload = workloads::build(&size.params).unwrap();
            let got = workload
                .run(StrategySet::NONE)
                .unwrap()
                .bytes()
                .unwrap()
                .into_owned();
            assert!(
                got == answer,
                "{name}: the baseline differs from the reference {}",
                first_difference(&got, &answer, "baseline", "reference")
            );
            checked.push(scenario.stage());
        }
        assert_eq!(checked.len(), BUILT_IN.len());
        for stage in Stage::ALL {
            assert!(checked.contains(&stage), "no scenario of the {stage} stage");
        }
    }

    #[test]
    fn built_in_scenarios_are_typed() {
        let stages: Vec<(Stage, Stage)> = BUILT_IN
            .iter()
            .map(|(name, _)| {
                let s = load_scenario(name).unwrap();
                (s.stage(), s.full.params.stage())
            })
            .collect();
        use Stage::*;
        let expected = [
            Write, Export, Export, Export, Export, Export, Export, Render, Ingest, Ingest, Ingest,
        ];
        assert_eq!(stages, expected.map(|s| (s, s)));
        let asap = load_scenario("asap-1e5").unwrap();
        assert_eq!(
            asap.quick.params,
            Generator::Asap {
                groups: 50,
                series_per_group: 100,
                ticks: 65
            }
        );
    }

    #[test]
    fn bad_scenarios_are_errors() {
        let scenario = |quick: &str, full: &str| {
            format!("name = \"x\"\ndescription = \"d\"\n[quick]\nparams = {quick}\nrepeats = 1\nexpected = \"\"\n[full]\nparams = {full}\nrepeats = 1\nexpected = \"\"\n")
        };
        let parse = |text: String| toml::from_str::<Scenario>(&text);
        let ok = "{ generator = \"long-label\", steps = 3 }";
        assert!(parse(scenario(ok, ok)).is_ok());
        for bad in [
            "{ generator = \"long-label\" }",
            "{ generator = \"long-label\", steps = 3, extra = 1 }",
            "{ generator = \"long-label\", steps = -3 }",
            "{ generator = \"nope\", steps = 3 }",
            "{ steps = 3 }",
        ] {
            assert!(parse(scenario(bad, ok)).is_err(), "{bad}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mixed.toml");
        std::fs::write(
            &path,
            scenario(ok, "{ generator = \"prometheus-captures\", passes = 1 }"),
        )
        .unwrap();
        let err = load_scenario(path.to_str().unwrap()).unwrap_err();
        assert!(err.to_string().contains("stage"), "{err}");
    }

    /// The write stage's warm writers: verified on their first run, then
    /// compared after the same number of timed runs.
    #[test]
    fn ablate_verifies_the_warm_writers_it_times() {
        let mut scenario = load_scenario("write-long-label").unwrap();
        scenario.quick.params = Generator::LongLabel { steps: 200 };
        scenario.quick.expected = digest(&expected_answer(&scenario.quick.params).unwrap());
        let options = AblateOptions {
            quick: true,
            only: None,
            out: None,
            repeats: Some(2),
            print_digests: false,
            progress: false,
            peers: false,
            with_clickhouse: false,
            peak_rss: None,
        };
        let result = run_scenario(&scenario, &options).unwrap();
        // Fourteen strategy arms (baseline, six alone, six left out, all) and the floor.
        assert_eq!(result.arms.len(), 15);
        assert_eq!(result.arms[14].kind, ArmKind::Floor);
        assert!(result.arms.iter().all(|a| a.samples.len() == 2));
        assert_eq!(result.digest, scenario.quick.expected);
        // A wrong digest stops the run, naming the strategies.
        scenario.quick.expected = "0".repeat(64);
        let err = run_scenario(&scenario, &options).unwrap_err();
        assert!(err.to_string().contains("strategies `none`"), "{err}");
    }

    #[test]
    fn ingest_runs_return_their_verified_answer() {
        let scenario = load_scenario("prometheus-captures").unwrap();
        let params = Generator::PrometheusCaptures { passes: 1 };
        let mut workload = workloads::build(&params).unwrap();
        let first = workload
            .run(StrategySet::NONE)
            .unwrap()
            .bytes()
            .unwrap()
            .into_owned();
        assert!(first.starts_with(b"[") && first.ends_with(b"\n"));
        let all = StrategySet::all();
        assert_eq!(&*workload.run(all).unwrap().bytes().unwrap(), &first[..]);
        // At its quick size the answer is the scenario's digest.
        let mut quick = workloads::build(&scenario.quick.params).unwrap();
        let got = digest(&quick.run(all).unwrap().bytes().unwrap());
        assert_eq!(got, scenario.quick.expected);
    }
}
