//! Instruction counts per stage (iai-callgrind): repeatable on this shared,
//! noisy machine where wall time is not. Each benchmark runs the ablation's
//! own workload (`harness::workloads`, what `promlab ablate` times) for one
//! arm: write (1,000 steps on a warm writer), export (one scrape of the seed
//! repro, of `many-processes` and of `many-metrics` at their quick sizes by a
//! long-lived exporter), render (one per-object scrape of 100
//! queues, awkward names mixed in), ingest (asap-1e5 at a tenth of its quick
//! size, 32,500 samples; prometheus-captures at quick, 31,356 samples, passes
//! 2–4 late — each into a fresh ingester, flushed and queried).
//!
//! **Arms follow the features**, like the criterion benches:
//! `harness::arms(stage, harness::configured(stage))` — baseline, each
//! strategy of S alone, S minus each, S. iai-callgrind's macros take literal
//! argument lists, so each benchmark is declared over arm *indices* 0..14
//! (`MAX_ARMS`, the most any stage has: write's 2 × 6 strategies + 2); the setup
//! resolves an index to its arm at run time, and an index past the build's
//! arm list gives `None`, a benchmark that does nothing (a near-zero count).
//! Index 0 is always the baseline; with no feature, for a stage of n
//! strategies, 1..=n are each alone (in `Strategy::ALL` order), then each
//! "all but one", then all. The setup also checks the arm's first run against
//! the expected answer (the scenario's digest at its own size,
//! `harness::expected_answer` at a smaller one) before the counted run.
//!
//! Each stage's floor (`harness::floor`, the least work the stage allows) is
//! counted on the same input by `floor`, and the query (`asap-query` at its
//! quick size: 1,000 groups of the last closed window) by `query_asap` per
//! arm and `query_paths` for its other paths (uncached, through serde).
//!
//! iai-callgrind names them `<function> arm_<i>:<setup>(<i>)`; with no
//! feature, export's and ingest's `arm_10`..`arm_13` (they have 10 arms) and
//! render's `arm_2`..`arm_13` are such empty benchmarks (20 instructions).
//!
//! Run with `cargo bench --features S --bench iai` (needs valgrind and
//! `iai-callgrind-runner` 0.16.1 on the PATH); build without
//! `target-cpu=native`, since valgrind cannot run AVX-512 code.

use iai_callgrind::{library_benchmark, library_benchmark_group, main};
use promlab::shared::strategy::StrategySet;
use promlab_lab::harness::{self, ArmKind, Generator, Output, Workload};
use std::hint::black_box;

/// Arm indices each benchmark is declared over (see the module doc).
const MAX_ARMS: usize = 14;

/// One arm of a harness workload, verified, ready for its counted run.
struct ArmRun {
    workload: Box<dyn Workload>,
    strategies: StrategySet,
}

/// The arm `index` of the workload `params` describes, or `None` past the
/// build's arms. Its first run (untimed) must give the expected answer.
fn arm_run(scenario: &str, params: Option<Generator>, index: usize) -> Option<ArmRun> {
    let scenario = harness::load_scenario(scenario).unwrap();
    let stage = scenario.stage();
    let arms = harness::arms(stage, harness::configured(stage));
    assert!(
        arms.len() <= MAX_ARMS,
        "{stage} has more arms than MAX_ARMS"
    );
    let (_, strategies) = *arms.get(index)?;
    let (params, expected) = match params {
        Some(params) if params != scenario.quick.params => {
            let answer = harness::expected_answer(&params).unwrap();
            (params, harness::digest(&answer))
        }
        _ => (scenario.quick.params, scenario.quick.expected),
    };
    let mut workload = harness::workloads::build(&params).unwrap();
    let got = harness::digest(&workload.run(strategies).unwrap().bytes().unwrap());
    assert_eq!(got, expected, "arm `{strategies}` of {}", scenario.name);
    Some(ArmRun {
        workload,
        strategies,
    })
}

/// The counted run.
fn run(arm: Option<ArmRun>) -> Option<ArmRun> {
    let mut arm = arm?;
    match arm.workload.run(arm.strategies).unwrap() {
        Output::Bytes(bytes) => black_box(bytes.len()),
        Output::Store(dir) | Output::StoreRead(dir, _) => black_box(dir.as_os_str().len()),
        Output::Units(n) => black_box(n as usize),
    };
    Some(arm)
}

/// The workload of `scenario` at the size the arms here count, with the arm
/// `name` (the floor, or an extra arm) run once and checked: bytes against
/// the expected answer, a floor's units against the workload's.
fn other_arm(scenario: &str, name: &'static str) -> (Box<dyn Workload>, &'static str) {
    let loaded = harness::load_scenario(scenario).unwrap();
    let (params, expected) = match size(scenario) {
        Some(params) if params != loaded.quick.params => {
            let answer = harness::expected_answer(&params).unwrap();
            (params, harness::digest(&answer))
        }
        _ => (loaded.quick.params, loaded.quick.expected),
    };
    let mut workload = harness::workloads::build(&params).unwrap();
    let units = workload.units().0;
    let (kind, set) = kind_of(name);
    match harness::run_arm(workload.as_mut(), kind, name, set).unwrap() {
        Output::Units(n) => assert_eq!(n, units, "{name} of {scenario}"),
        output => assert_eq!(
            harness::digest(&output.bytes().unwrap()),
            expected,
            "{name} of {scenario}"
        ),
    }
    (workload, name)
}

fn kind_of(name: &str) -> (ArmKind, StrategySet) {
    match name {
        "floor" => (ArmKind::Floor, StrategySet::NONE),
        _ => (
            ArmKind::Extra,
            StrategySet::all().restrict(promlab::shared::strategy::Stage::Ingest),
        ),
    }
}

/// The counted run of [`other_arm`]'s arm.
fn run_other((mut workload, name): (Box<dyn Workload>, &'static str)) -> usize {
    let (kind, set) = kind_of(name);
    match harness::run_arm(workload.as_mut(), kind, name, set).unwrap() {
        Output::Bytes(bytes) => black_box(bytes.len()),
        Output::Store(dir) | Output::StoreRead(dir, _) => black_box(dir.as_os_str().len()),
        Output::Units(n) => black_box(n as usize),
    }
}

/// The size each scenario is counted at here (`None`: its quick size).
fn size(scenario: &str) -> Option<Generator> {
    match scenario {
        "write-long-label" => Some(Generator::LongLabel { steps: 1000 }),
        "rabbitmq-per-object" => Some(Generator::Rabbitmq {
            queues: 100,
            awkward_names: true,
        }),
        "asap-1e5" => Some(Generator::Asap {
            groups: 5,
            series_per_group: 100,
            ticks: 65,
        }),
        _ => None,
    }
}

fn floor_of(scenario: &str) -> (Box<dyn Workload>, &'static str) {
    other_arm(scenario, "floor")
}

fn uncached_query(scenario: &str) -> (Box<dyn Workload>, &'static str) {
    other_arm(scenario, "all-uncached")
}

fn serde_query(scenario: &str) -> (Box<dyn Workload>, &'static str) {
    other_arm(scenario, "all-serde")
}

fn long_label(index: usize) -> Option<ArmRun> {
    arm_run("write-long-label", size("write-long-label"), index)
}

fn seed_repro(index: usize) -> Option<ArmRun> {
    arm_run("seed-repro", None, index)
}

fn many_processes(index: usize) -> Option<ArmRun> {
    arm_run("many-processes", None, index)
}

fn many_metrics(index: usize) -> Option<ArmRun> {
    arm_run("many-metrics", None, index)
}

fn rabbitmq(index: usize) -> Option<ArmRun> {
    arm_run("rabbitmq-per-object", size("rabbitmq-per-object"), index)
}

fn asap(index: usize) -> Option<ArmRun> {
    arm_run("asap-1e5", size("asap-1e5"), index)
}

fn query(index: usize) -> Option<ArmRun> {
    arm_run("asap-query", None, index)
}

fn prometheus_captures(index: usize) -> Option<ArmRun> {
    arm_run("prometheus-captures", None, index)
}

// 1000 × (histogram observe + counter increment), 195-character label, warm writer.
#[library_benchmark]
#[benches::arm(args = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], setup = long_label)]
fn write_long_label(arm: Option<ArmRun>) -> Option<ArmRun> {
    run(arm)
}

// One scrape of the seed repro (10 processes × 150 statements, 2,102 lines) by
// a long-lived exporter that has scraped it once already.
#[library_benchmark]
#[benches::arm(args = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], setup = seed_repro)]
fn scrape_seed_repro(arm: Option<ArmRun>) -> Option<ArmRun> {
    run(arm)
}

// One warm scrape of many-processes (quick: the all-types store cloned under
// 60 exited workers, 504 files) and of many-metrics (quick: 200 counters × 5
// processes, 1,000 one-entry files).
#[library_benchmark]
#[benches::many_processes(args = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], setup = many_processes)]
#[benches::many_metrics(args = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], setup = many_metrics)]
fn scrape_many_files(arm: Option<ArmRun>) -> Option<ArmRun> {
    run(arm)
}

// One per-object scrape of a live registry (100 queues: 6,396 lines).
#[library_benchmark]
#[benches::arm(args = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], setup = rabbitmq)]
fn render_rabbitmq_per_object(arm: Option<ArmRun>) -> Option<ArmRun> {
    run(arm)
}

// One ablation run of asap-1e5 (5 groups × 100 series, 65 ticks) and of
// prometheus-captures (quick: 4 passes of the 27 requests).
#[library_benchmark]
#[benches::asap(args = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], setup = asap)]
#[benches::prometheus_captures(args = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], setup = prometheus_captures)]
fn ingest_requests(arm: Option<ArmRun>) -> Option<ArmRun> {
    run(arm)
}

// One query of a long-lived receiver state (asap-query, quick: 1,000 groups ×
// 2 series): per arm, the answer kept per closed window after its first query.
#[library_benchmark]
#[benches::arm(args = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], setup = query)]
fn query_asap(arm: Option<ArmRun>) -> Option<ArmRun> {
    run(arm)
}

// The query's other paths, every ingest strategy: encoded afresh (no kept
// answer), and through `QueryResult` and serde (the path before).
#[library_benchmark]
#[bench::uncached(args = ("asap-query"), setup = uncached_query)]
#[bench::serde(args = ("asap-query"), setup = serde_query)]
fn query_paths(arm: (Box<dyn Workload>, &'static str)) -> usize {
    run_other(arm)
}

// Each stage's floor on the input its arms above count.
#[library_benchmark]
#[bench::write(args = ("write-long-label"), setup = floor_of)]
#[bench::export(args = ("seed-repro"), setup = floor_of)]
#[bench::export_many_processes(args = ("many-processes"), setup = floor_of)]
#[bench::export_many_metrics(args = ("many-metrics"), setup = floor_of)]
#[bench::render(args = ("rabbitmq-per-object"), setup = floor_of)]
#[bench::asap(args = ("asap-1e5"), setup = floor_of)]
#[bench::prometheus_captures(args = ("prometheus-captures"), setup = floor_of)]
#[bench::query(args = ("asap-query"), setup = floor_of)]
fn floor(arm: (Box<dyn Workload>, &'static str)) -> usize {
    run_other(arm)
}

library_benchmark_group!(name = write; benchmarks = write_long_label);
library_benchmark_group!(name = export; benchmarks = scrape_seed_repro, scrape_many_files);
library_benchmark_group!(name = render; benchmarks = render_rabbitmq_per_object);
library_benchmark_group!(name = ingest; benchmarks = ingest_requests);
library_benchmark_group!(name = query_group; benchmarks = query_asap, query_paths);
library_benchmark_group!(name = floors; benchmarks = floor);
main!(
    library_benchmark_groups = write,
    export,
    render,
    ingest,
    query_group,
    floors
);
