//! `promlab verify [--quick]`: the whole pipeline, end to end, under every one
//! of the 2^n strategy sets of the n strategies (`Strategy::ALL`; 14 strategies,
//! 16,384 sets, as of this writing), checked against the naive references of
//! `promlab::reference` and against what client_ruby wrote and printed.
//!
//! The chain, per input (a registry and the op logs of its writer processes):
//! write ops → store files → export → exposition → scraped into remote-write
//! requests → ingest → windows → quantiles.
//!
//! **How 2^n sets are checked without running the chain 2^n times.** Each
//! stage's output depends only on that stage's strategies: the store on the
//! set's write strategies, the exposition on the store and the set's export
//! strategies (and `prerender`, which the long-lived exporter uses), the
//! quantiles on the exposition and the set's ingest strategies. So each stage
//! runs once per distinct stage subset, on the outputs of the previous stage's
//! subsets: one store per write subset, then each store exported under each
//! export subset (an exposition sequence each), then one ingest run per ingest
//! subset and distinct exposition sequence. (`verify` prints the counts.) Then
//! every one of the 2^n sets is walked and its own chain — its write
//! subset's store → that store's exposition under its export subset → that
//! exposition's quantiles under its ingest subset — must pass every check.
//!
//! Checks:
//! - **store**: every write subset's store files equal the reference writer's
//!   bytes ([`promlab::reference::store`]), timestamps zeroed, and, for a
//!   client_ruby case, Ruby's own store;
//! - **exposition**: the store is exported after each writer process finishes
//!   (the store grows), by a long-lived [`Exporter`] kept across those scrapes
//!   and by a one-shot [`export::export`]; both must equal the reference
//!   exporter's bytes ([`promlab::reference::exposition`]) on that store; with
//!   `fold-exited`, a twin of the store folded after every writer exits
//!   ([`promlab::export::fold`]) must. For a client_ruby case, Ruby's store exported
//!   under every export subset (folded first with `fold-exited`; and the
//!   reference exporter) must print Ruby's `expected.prom`;
//! - **quantiles**: the exposition sequence is scraped (each exposition twice,
//!   5 s apart), converted to remote-write requests ([`promlab::scenarios::scrape_to_remote_write`]) and
//!   ingested under a plan with two aggregations per sample name. Every pane
//!   must hold exactly the panes and counts of the reference
//!   ([`promlab::reference::ingest`]), every quantile within α of the exact
//!   one ([`promlab::reference::quantile::check`]), and every set's panes must
//!   be bit-identical to the baseline's;
//! - **split and merge**: the same requests, their
//!   series spread over three ingesters by Prometheus's `hashmod`, every
//!   window closed and each receiver's panes written as the cluster's rows,
//!   read back and merged as the cluster's query merges them, must give every closed window of the single ingester: the
//!   same bins and every quantile bit for bit ([`split_and_merge_check`]).
//! - **queries** ([`query`]): the query path the receiver serves and
//!   `promlab ablate` times — `query_json`, `encode_query`, `query` through
//!   serde, `query_all`, then, flushed, `query_all` and the counters — must
//!   give the reference's answers byte for byte (the reference panes' values
//!   through the `sketches-ddsketch` crate), under every ingest subset;
//! - **the receiver's lanes** ([`lanes`]): the `LanedIngester` `promlab serve`
//!   runs, 1–4 lanes built as the receiver builds them, fed the requests from
//!   as many threads as lanes (every ingest subset) and, one at a time on
//!   seeded lanes, in seeded shuffled orders (the reference run on each
//!   order): the reference's panes and answers, one ingester's bit for bit;
//! - **the one-file-per-process layout** ([`per_process`], once per run):
//!   client_ruby's PoC branch's own stores (folded first with `fold-exited`),
//!   and every generated store merged into that layout (partly, then
//!   whole), under every export subset;
//! - **the live renderer** ([`live`], once per run): `LiveRegistry` under each
//!   of the 2,048 sets — a RabbitMQ node with awkward names, scraped, moved,
//!   scraped, scraped through the detailed endpoint, and generated families —
//!   byte for byte the reference renderer's ([`promlab::reference::live`]).

pub(crate) mod embedded;
pub mod generate;
mod ingest;
pub mod lanes;
pub mod live;
mod per_process;
mod query;

pub use ingest::*;

use crate::cluster::hashmod;
use crate::cluster::rowbinary::Reader;
use crate::cluster::schema::{Batch, Origin, PaneRow};
use anyhow::{bail, Context, Result};
use promlab::export::{self, Exporter};
use promlab::format::formenc::Dialect;
use promlab::format::registry::Registry;
use promlab::ingest::distributed::{group_key, merge_as_rows, PaneRows};
use promlab::ingest::pipeline::Ingester;
use promlab::ingest::plan::{Aggregation, Plan};
use promlab::ingest::window::PaneReport;
use promlab::ingest::wire::WriteRequest;
use promlab::reference;
use promlab::reference::first_difference::first_difference;
use promlab::scenarios::op_log::OpLog;
use promlab::scenarios::scrape_to_remote_write;
use promlab::shared::strategy::{Stage, Strategy, StrategySet};
use promlab::write::{Client, ClientConfig};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

/// One input of the chain.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub registry: Registry,
    /// Each writer process, in order: its key dialect and its ops.
    pub processes: Vec<(Dialect, OpLog)>,
    /// What client_ruby wrote and printed, for its cases.
    pub ruby: Option<RubyCase>,
    /// Export after every writer process (the store grows between scrapes), or
    /// only after the last (big cases).
    pub export_each_writer: bool,
}

/// A client_ruby case's store directory and its `expected.prom`.
#[derive(Clone, Debug)]
pub struct RubyCase {
    pub store: PathBuf,
    pub expected: Vec<u8>,
}

/// The quantiles every aggregation of the verify plan asks for.
pub const QUANTILES: [f64; 7] = [0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0];
/// The relative accuracy of every aggregation of the verify plan.
pub const ALPHA: f64 = 0.01;
/// Scrapes are this far apart (ms); each exposition is scraped twice.
pub const SCRAPE_INTERVAL_MS: i64 = 5_000;
/// The first scrape's timestamp (ms).
pub const FIRST_SCRAPE_MS: i64 = 1_700_000_000_000;
/// Samples per remote-write request: small, so a case makes many requests.
pub const MAX_SAMPLES_PER_SEND: usize = 100;
/// The target labels Prometheus adds on scrape.
pub const TARGET: [(&str, &str); 2] = [("instance", "localhost:9394"), ("job", "verify")];

/// What one case's check covered.
#[derive(Clone, Debug, Default)]
pub struct CaseReport {
    pub sets: usize,
    pub writers: usize,
    pub ops: usize,
    pub store_files: usize,
    pub expositions: usize,
    pub exposition_bytes: usize,
    pub requests: usize,
    pub samples: usize,
    pub panes: usize,
    /// Panes whose values span more bins than the sketch keeps (it merges the lowest).
    pub merged_panes: usize,
    pub quantiles: usize,
    /// Closed windows checked split over receivers and merged, per ingest subset.
    pub merged_windows: usize,
    pub ruby: bool,
    /// Query answers compared with the reference's (one ingester's, every ingest subset).
    pub answers: usize,
    /// The laned ingester's checks (the last exposition sequence's).
    pub laned: lanes::LanedReport,
}

/// How much of the slower checks a run makes.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Seeded shuffled request orders fed to the laned ingester.
    pub shuffles: usize,
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            shuffles: 2,
            seed: 1,
        }
    }
}

/// The distinct stage subsets of `sets`, in first-seen order.
fn subsets(sets: &[StrategySet], stage: Stage) -> Vec<StrategySet> {
    let mut out: Vec<StrategySet> = Vec::new();
    for s in sets {
        let r = s.restrict(stage);
        if !out.contains(&r) {
            out.push(r);
        }
    }
    out
}

/// Every one of the 2^n strategy sets, the baseline first.
pub fn every_set() -> Vec<StrategySet> {
    StrategySet::subsets(&promlab::shared::strategy::Strategy::ALL)
}

/// Compares two store snapshots (file name → comparable bytes).
fn same_store(
    got: &BTreeMap<String, Vec<u8>>,
    want: &BTreeMap<String, Vec<u8>>,
    want_name: &str,
) -> Result<(), String> {
    if got.keys().ne(want.keys()) {
        return Err(format!(
            "the store's files are {:?}, {want_name}'s {:?}",
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>()
        ));
    }
    for (name, bytes) in want {
        if &got[name] != bytes {
            return Err(format!(
                "{name} (timestamps zeroed) differs from {want_name}'s {}",
                first_difference(&got[name], bytes, "promlab", want_name)
            ));
        }
    }
    Ok(())
}

/// Writes `case` under the write subset `w` into `dir`, exporting after each
/// writer process under every export subset (a long-lived exporter per
/// subset, and a one-shot export), each checked against the reference
/// exporter. Returns the store check and, per export subset, the exposition
/// sequence or the first difference.
#[allow(clippy::type_complexity)]
fn write_and_export(
    case: &Case,
    w: StrategySet,
    exports: &[StrategySet],
    dir: &Path,
    reference_store: &BTreeMap<String, Vec<u8>>,
    ruby_store: Option<&BTreeMap<String, Vec<u8>>>,
) -> Result<(Result<(), String>, Vec<Result<Vec<Vec<u8>>, String>>)> {
    std::fs::create_dir_all(dir)?;
    // `fold-exited` subsets read a twin of the store that is folded after
    // every writer (each writer's files copied in as it exits, then folded
    // into what earlier folds left): exact folds, repeated, must still print
    // the reference exporter's bytes.
    let mut twin = FoldedTwin::new(dir, exports)?;
    let mut exporters: Vec<Exporter> = exports
        .iter()
        .map(|&e| {
            Exporter::new(twin.dir_for(e, dir), case.registry.clone(), e).with_catalogue_floor(2)
        })
        .collect();
    let mut sequences: Vec<Result<Vec<Vec<u8>>, String>> =
        exports.iter().map(|_| Ok(Vec::new())).collect();
    let mut out = Vec::new();
    for (step, (dialect, log)) in case.processes.iter().enumerate() {
        let config = ClientConfig {
            dialect: *dialect,
            strategies: w,
            pid_override: Some(log.pid),
        };
        let mut client = Client::new(dir, &case.registry, config)?;
        if let Err(e) = log.replay(&mut client) {
            let msg = format!("writer {} failed: {e:#}", log.pid);
            return Ok((
                Err(msg.clone()),
                exports.iter().map(|_| Err(msg.clone())).collect(),
            ));
        }
        drop(client);
        twin.writer_exited(dir, log.pid, &case.registry)?;
        if !case.export_each_writer && step + 1 < case.processes.len() {
            continue;
        }
        let want = reference::exposition::export(dir, &case.registry)
            .with_context(|| format!("the reference exporter, after writer {}", log.pid))?;
        for (i, &e) in exports.iter().enumerate() {
            let Ok(sequence) = &mut sequences[i] else {
                continue;
            };
            let long_lived = exporters[i].export_into(&mut out).map(|()| out.clone());
            let one_shot = export::export(twin.dir_for(e, dir), &case.registry, e);
            let mut failure = None;
            for (what, got) in [
                ("long-lived exporter", long_lived),
                ("one-shot export", one_shot),
            ] {
                match got {
                    Err(err) => {
                        failure = Some(format!(
                            "{what} after writer {} (step {}): {err:#}",
                            log.pid,
                            step + 1
                        ))
                    }
                    Ok(got) if got != want => {
                        failure = Some(format!(
                        "{what} after writer {} (step {}) differs from the reference exporter {}",
                        log.pid,
                        step + 1,
                        first_difference(&got, &want, "promlab", "reference")
                    ))
                    }
                    Ok(_) => {}
                }
            }
            match failure {
                Some(f) => sequences[i] = Err(f),
                None => sequence.push(want.clone()),
            }
        }
    }
    let store = reference::store::read_dir(dir)?;
    let mut store_check = same_store(&store, reference_store, "the reference writer");
    if let (Ok(()), Some(ruby)) = (&store_check, ruby_store) {
        store_check = same_store(&store, ruby, "client_ruby");
    }
    Ok((store_check, sequences))
}

/// A store's folded twin, for the export subsets with `fold-exited`.
struct FoldedTwin {
    dir: Option<tempfile::TempDir>,
    pids: HashSet<u32>,
}

impl FoldedTwin {
    fn new(_store: &Path, exports: &[StrategySet]) -> Result<FoldedTwin> {
        let folds = exports.iter().any(|e| e.contains(Strategy::FoldExited));
        Ok(FoldedTwin {
            dir: folds.then(tempfile::tempdir).transpose()?,
            pids: HashSet::new(),
        })
    }

    /// The directory export subset `e` reads.
    fn dir_for<'a>(&'a self, e: StrategySet, store: &'a Path) -> &'a Path {
        match &self.dir {
            Some(twin) if e.contains(Strategy::FoldExited) => twin.path(),
            _ => store,
        }
    }

    /// Copies the files of the writer that exited into the twin and folds
    /// it. A pid that wrote before rebuilds the twin from the whole store
    /// (its files hold its earlier values, which a fold file may hold too).
    fn writer_exited(&mut self, store: &Path, pid: u32, registry: &Registry) -> Result<()> {
        let Some(twin) = &self.dir else {
            return Ok(());
        };
        let again = !self.pids.insert(pid);
        let suffix = format!("___{pid}.bin");
        if again {
            for entry in std::fs::read_dir(twin.path())? {
                let entry = entry?;
                if entry.file_type()?.is_file() {
                    std::fs::remove_file(entry.path())?;
                }
            }
        }
        for entry in std::fs::read_dir(store)? {
            let entry = entry?;
            let name = entry.file_name();
            if again || name.to_string_lossy().ends_with(&suffix) {
                std::fs::copy(entry.path(), twin.path().join(&name))?;
            }
        }
        let config = promlab::export::fold::FoldConfig {
            grace: std::time::Duration::ZERO,
            durable: false,
            ..promlab::export::fold::FoldConfig::default()
        };
        promlab::export::fold::fold_store(twin.path(), registry, &config)?;
        Ok(())
    }
}

/// Checks one case under `sets`, working in `tmp`. `Err` names the first set
/// whose chain fails and the first difference.
pub fn check_case(case: &Case, sets: &[StrategySet], tmp: &Path) -> Result<CaseReport> {
    check_case_with(case, sets, tmp, Options::default())
}

/// [`check_case`] with `options`.
pub fn check_case_with(
    case: &Case,
    sets: &[StrategySet],
    tmp: &Path,
    options: Options,
) -> Result<CaseReport> {
    let writes = subsets(sets, Stage::Write);
    let exports = subsets(sets, Stage::Export);
    let ingests = subsets(sets, Stage::Ingest);
    let reference_store =
        reference::store::files(&case.registry, &case.processes).context("the reference writer")?;
    let ruby_store = match &case.ruby {
        Some(ruby) => {
            Some(reference::store::read_dir(&ruby.store).context("reading Ruby's store")?)
        }
        None => None,
    };
    // Ruby's own store under every export subset, and the reference exporter on it.
    let mut ruby_exports: HashMap<StrategySet, Result<(), String>> = HashMap::new();
    if let Some(ruby) = &case.ruby {
        let want = &ruby.expected;
        let r = reference::exposition::export(&ruby.store, &case.registry)?;
        if &r != want {
            bail!(
                "{}: the reference exporter differs from Ruby's expected.prom {}",
                case.name,
                first_difference(&r, want, "reference", "ruby")
            );
        }
        // Ruby's store folded (every file's writer exited), for `fold-exited`.
        let folded_ruby = tempfile::tempdir()?;
        for entry in std::fs::read_dir(&ruby.store)? {
            let entry = entry?;
            std::fs::copy(entry.path(), folded_ruby.path().join(entry.file_name()))?;
        }
        promlab::export::fold::fold_store(
            folded_ruby.path(),
            &case.registry,
            &promlab::export::fold::FoldConfig {
                grace: std::time::Duration::ZERO,
                durable: false,
                ..promlab::export::fold::FoldConfig::default()
            },
        )?;
        for &e in &exports {
            let store: &Path = if e.contains(Strategy::FoldExited) {
                folded_ruby.path()
            } else {
                &ruby.store
            };
            let mut exporter = Exporter::new(store, case.registry.clone(), e);
            let mut out = Vec::new();
            let mut result = Ok(());
            for scrape in 1..=2 {
                let got = exporter.export_into(&mut out).map(|()| out.clone());
                let one_shot = export::export(store, &case.registry, e);
                for (what, got) in [("long-lived exporter", got), ("one-shot export", one_shot)] {
                    match got {
                        Err(err) => result = Err(format!("{what} of Ruby's store: {err:#}")),
                        Ok(got) if &got != want => {
                            result = Err(format!(
                                "{what} of Ruby's store (scrape {scrape}) differs from expected.prom {}",
                                first_difference(&got, want, "promlab", "ruby")
                            ))
                        }
                        Ok(_) => {}
                    }
                }
            }
            ruby_exports.insert(e, result);
        }
    }
    // Stage 1 and 2: per write subset, its store and its exposition sequence per export subset.
    let mut store_checks: HashMap<StrategySet, Result<(), String>> = HashMap::new();
    let mut distinct_sequences: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut sequence_of: HashMap<(StrategySet, StrategySet), Result<usize, String>> =
        HashMap::new();
    for (n, &w) in writes.iter().enumerate() {
        let dir = tmp.join(format!("store-{n}"));
        let (store_check, sequences) = write_and_export(
            case,
            w,
            &exports,
            &dir,
            &reference_store,
            ruby_store.as_ref(),
        )?;
        store_checks.insert(w, store_check);
        for (&e, sequence) in exports.iter().zip(sequences) {
            let id = sequence.map(
                |seq| match distinct_sequences.iter().position(|d| *d == seq) {
                    Some(id) => id,
                    None => {
                        distinct_sequences.push(seq);
                        distinct_sequences.len() - 1
                    }
                },
            );
            sequence_of.insert((w, e), id);
        }
        std::fs::remove_dir_all(&dir).ok();
    }
    // Stage 3: per distinct exposition sequence, its panes under every ingest subset.
    let mut distinct_panes: Vec<Vec<PaneReport>> = Vec::new();
    let mut panes_of: HashMap<(usize, StrategySet), Result<usize, String>> = HashMap::new();
    let mut report = CaseReport {
        writers: case.processes.len(),
        ops: case.processes.iter().map(|(_, l)| l.ops.len()).sum(),
        store_files: reference_store.len(),
        ruby: case.ruby.is_some(),
        ..CaseReport::default()
    };
    for (id, sequence) in distinct_sequences.iter().enumerate() {
        let input = ingest_input(sequence)?;
        let want = input.reference.sorted();
        report.expositions = sequence.len();
        report.exposition_bytes = sequence.last().map_or(0, Vec::len);
        report.requests = input.bodies.len();
        report.samples = input.samples;
        report.panes = want.len();
        let params = reference::quantile::SketchParams::ingest(ALPHA);
        report.merged_panes = want
            .values()
            .filter(|v| reference::quantile::merges_bins(v, params))
            .count();
        report.quantiles = want.len() * QUANTILES.len();
        for &i in &ingests {
            let result = split_and_merge_check(&input, i).and_then(|windows| {
                report.merged_windows = windows;
                ingest_and_check(&input, &want, i)
            });
            let result = result.map(|(panes, answers)| {
                report.answers += answers;
                match distinct_panes.iter().position(|d| *d == panes) {
                    Some(p) => p,
                    None => {
                        distinct_panes.push(panes);
                        distinct_panes.len() - 1
                    }
                }
            });
            panes_of.insert((id, i), result);
        }
        // The receiver's lanes, on the same requests.
        let seed = options.seed.wrapping_add(id as u64);
        report.laned = lanes::check(&input, &ingests, options.shuffles, seed)
            .map_err(|e| anyhow::anyhow!("{}: the laned ingester: {e}", case.name))?;
    }
    // The walk: every set through its own stage subsets' outputs.
    let mut baseline_panes: Option<usize> = None;
    for &set in sets {
        let (w, e, i) = (
            set.restrict(Stage::Write),
            set.restrict(Stage::Export),
            set.restrict(Stage::Ingest),
        );
        let fail = |stage: &str, msg: &str| -> anyhow::Error {
            anyhow::anyhow!(
                "{}: strategy set `{set}` fails at {stage}: {msg}",
                case.name
            )
        };
        store_checks[&w]
            .as_ref()
            .map_err(|m| fail("write (store bytes)", m))?;
        if let Some(r) = ruby_exports.get(&e) {
            r.as_ref().map_err(|m| fail("export of Ruby's store", m))?;
        }
        let seq = *sequence_of[&(w, e)]
            .as_ref()
            .map_err(|m| fail("export (exposition)", m))?;
        let panes = *panes_of[&(seq, i)]
            .as_ref()
            .map_err(|m| fail("ingest (quantiles)", m))?;
        match baseline_panes {
            None => baseline_panes = Some(panes),
            Some(b) if b != panes => {
                let (x, y) = (&distinct_panes[panes], &distinct_panes[b]);
                let at = x
                    .iter()
                    .zip(y)
                    .position(|(p, q)| p != q)
                    .unwrap_or(x.len().min(y.len()));
                return Err(fail(
                    "ingest (bit-identity)",
                    &format!(
                        "pane {at} differs from the first set's ({}): {:?} vs {:?}",
                        sets[0],
                        x.get(at),
                        y.get(at)
                    ),
                ));
            }
            Some(_) => {}
        }
        report.sets += 1;
    }
    Ok(report)
}

/// The client_ruby cases this binary can check: the two `all-types` cases
/// built in; unless `quick`, `seed-repro-*` from a checkout's `tests/fixtures`
/// (too big to build in: 10 stores of 1 MiB each) and the built-in large case.
pub fn ruby_cases(
    fixtures: Option<&Path>,
    quick: bool,
    tmp: &Path,
) -> Result<(Vec<Case>, Vec<String>)> {
    let mut cases = Vec::new();
    let mut notes = Vec::new();
    for (name, dialect, files) in embedded::CASES {
        let dir = tmp.join(name);
        for (path, bytes) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().expect("a file in the case"))?;
            std::fs::write(&path, bytes)?;
        }
        cases.push(load_ruby_case(
            &dir,
            name,
            dialect.parse().map_err(anyhow::Error::msg)?,
        )?);
    }
    match fixtures.filter(|f| f.join("ruby-dfs").is_dir()) {
        _ if quick => notes.push("seed-repro-* and large-v5-uri: full run only".into()),
        Some(f) => {
            for (name, dialect) in [
                ("seed-repro-v4.2.5", Dialect::Cgi),
                ("seed-repro-v5-uri", Dialect::Uri),
            ] {
                // 10 writers, 400 kB of exposition: exported once, after the
                // last (the generated cases export after every writer).
                let mut case = load_ruby_case(&f.join("ruby-dfs").join(name), name, dialect)?;
                case.export_each_writer = false;
                cases.push(case);
            }
        }
        None => notes.push(
            "seed-repro-* skipped: no checkout's tests/fixtures found (pass --fixtures DIR)".into(),
        ),
    }
    if !quick {
        // 10 writers of 100,000 ops and 52.7 MB of store: exported once, after the last.
        let dir = crate::fixtures::unpack_ruby_case("large-v5-uri", tmp)?;
        let mut large = load_ruby_case(&dir, "large-v5-uri", Dialect::Uri)?;
        large.export_each_writer = false;
        cases.push(large);
    }
    Ok((cases, notes))
}

fn load_ruby_case(dir: &Path, name: &str, dialect: Dialect) -> Result<Case> {
    let registry = Registry::load(&dir.join("registry.json"))?;
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    logs.retain(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("ops-"))
    });
    logs.sort();
    let processes = logs
        .iter()
        .map(|p| OpLog::load(p).map(|log| (dialect, log)))
        .collect::<Result<_>>()?;
    Ok(Case {
        name: name.to_string(),
        registry,
        processes,
        ruby: Some(RubyCase {
            store: dir.join("store"),
            expected: std::fs::read(dir.join("expected.prom"))?,
        }),
        export_each_writer: true,
    })
}

/// `promlab verify` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct VerifyArgs {
    /// Fewer and smaller generated inputs, and no large client_ruby case (well under a minute).
    #[arg(long)]
    pub quick: bool,
    /// Seed of the generated inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A checkout's `tests/fixtures` (for the seed-repro cases); defaults to
    /// the checkout this binary was built from, when it is still there.
    #[arg(long)]
    pub fixtures: Option<PathBuf>,
}

/// The generated inputs of a run: (seed offset, size).
fn generated(quick: bool) -> Vec<generate::Size> {
    let size = |processes, ops_per_process, extra_values| generate::Size {
        processes,
        ops_per_process,
        extra_values,
    };
    if quick {
        vec![size(3, 60, 4), size(5, 200, 16)]
    } else {
        vec![
            size(2, 40, 2),
            size(4, 150, 8),
            size(6, 400, 24),
            size(8, 800, 40),
        ]
    }
}

fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Runs `promlab verify`.
pub fn run(args: VerifyArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let sets = every_set();
    let tmp = tempfile::tempdir()?;
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let fixtures = args
        .fixtures
        .clone()
        .or_else(|| built_from.is_dir().then_some(built_from));
    let (mut cases, notes) = ruby_cases(fixtures.as_deref(), args.quick, &tmp.path().join("ruby"))?;
    for (n, size) in generated(args.quick).into_iter().enumerate() {
        cases.push(generate::case(args.seed.wrapping_add(n as u64), size));
    }
    println!(
        "verify: {} strategy sets; per input each stage runs once per stage subset ({} write × {} export × {} ingest), \
         then every set is checked through its own subsets' outputs",
        sets.len(),
        subsets(&sets, Stage::Write).len(),
        subsets(&sets, Stage::Export).len(),
        subsets(&sets, Stage::Ingest).len()
    );
    for note in &notes {
        println!("  note: {note}");
    }
    let options = Options {
        shuffles: if args.quick { 2 } else { 4 },
        seed: args.seed,
    };
    let mut ruby_inputs = 0;
    let (mut answers, mut laned_runs, mut orders) = (0, 0, 0);
    for (n, case) in cases.iter().enumerate() {
        let case_started = std::time::Instant::now();
        let report = check_case_with(case, &sets, &tmp.path().join(format!("case-{n}")), options)?;
        ruby_inputs += usize::from(report.ruby);
        answers += report.answers;
        laned_runs += report.laned.runs;
        orders += report.laned.orders;
        println!(
            "  {:<20} {} sets ok: {} writers, {} ops, {} store files; {} scrape(s) of the store (last {} bytes){}; \
             {} requests, {} samples; {} panes ({} with merged bins), {} quantiles; {} query answers; \
             {} laned runs (1-4 lanes; {} orders, {} groups of requests at once); {} windows split over {} receivers and merged  ({:.1} s)",
            case.name,
            report.sets,
            report.writers,
            thousands(report.ops),
            report.store_files,
            report.expositions,
            thousands(report.exposition_bytes),
            if report.ruby { ", Ruby's store and expected.prom" } else { "" },
            thousands(report.requests),
            thousands(report.samples),
            thousands(report.panes),
            thousands(report.merged_panes),
            thousands(report.quantiles),
            thousands(report.answers),
            report.laned.runs,
            report.laned.orders,
            report.laned.concurrent_groups,
            thousands(report.merged_windows),
            RECEIVERS,
            case_started.elapsed().as_secs_f64()
        );
    }
    let layout_started = std::time::Instant::now();
    let layout = per_process::check(
        &sets,
        &cases,
        fixtures.as_deref(),
        args.quick,
        &tmp.path().join("per-process"),
    )?;
    println!(
        "  {:<20} {} export subsets ok: the PoC branch's own stores ({}) print its expected.prom; \
         {} generated stores, in both layouts at once and in this one alone, print the reference's; \
         {} exports, one-shot and long-lived  ({:.1} s)",
        "one file per process",
        subsets(&sets, Stage::Export).len(),
        layout
            .ruby_cases
            .iter()
            .map(|(name, files)| format!("{name}, {files} files"))
            .collect::<Vec<_>>()
            .join("; "),
        layout.generated,
        thousands(layout.exports),
        layout_started.elapsed().as_secs_f64()
    );
    let live_started = std::time::Instant::now();
    let queues = if args.quick { 6 } else { 24 };
    let live = live::check(&sets, queues, args.seed)?;
    println!(
        "  {:<20} {} sets ok: a RabbitMQ node of {queues} queues and generated families, {} series, \
         {} scrapes each  ({:.1} s)",
        "live renderer",
        live.sets,
        thousands(live.series),
        live.scrapes,
        live_started.elapsed().as_secs_f64()
    );
    println!(
        "verify: {} strategy sets × {} inputs ({} client_ruby, {} generated): store bytes identical \
         (to the reference writer, and Ruby's where given), exposition identical to the reference \
         (and Ruby's expected.prom where given), quantiles identical, within α = {} of exact; \
         split over {RECEIVERS} receivers by hashmod and merged as the cluster merges: every window's bins identical; \
         the query path (query_json, encode_query, query_all, flushed; {} answers) identical to the reference's; \
         the receiver's laned ingester ({} runs, 1-4 lanes, threads at once and {} request orders) \
         identical to one ingester and the reference; the live RabbitMQ renderer (LiveRegistry, {} sets) \
         identical to the reference renderer  ({:.1} s)",
        sets.len(),
        cases.len(),
        ruby_inputs,
        cases.len() - ruby_inputs,
        ALPHA,
        thousands(answers),
        thousands(laned_runs),
        orders,
        live.sets,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
