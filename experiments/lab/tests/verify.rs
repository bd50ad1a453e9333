//! The end-to-end equivalence check as property tests: random op logs, label
//! values (quotes, backslashes, newlines, `&`, `=`, `%`, `+`, `~`, `*`,
//! non-ASCII, empty) and values through the whole chain — write → store →
//! export → exposition → scrape → remote write → ingest → quantiles — under
//! all 2^n strategy sets of the n strategies ([`promlab_lab::verify::check_case`]); per stage,
//! each strategy alone and all of the stage's strategies against the naive
//! reference (memchr-style, one macro); and `promlab verify --quick` exits 0.

use generators::value;
use promlab::format::formenc::Dialect;
use promlab::reference;
use promlab::scenarios::op_log::OpLog;
use promlab::shared::strategy::{Strategy as S, StrategySet};
use promlab::write::{Client, ClientConfig};
use promlab_lab::verify::{self, generate, Case};
use proptest::prelude::*;
use std::path::Path;

#[path = "../../../tests/common/generators.rs"]
mod generators;

/// Label values with everything that needs escaping somewhere, and the
/// awkward ones the generated scenarios use.
fn label_value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(generate::AWKWARD.to_vec()).prop_map(String::from),
        generators::label_value(),
    ]
}

/// A case of `processes` writers of up to `ops` ops each over a pool of `pool` label values.
fn case(processes: std::ops::Range<usize>, ops: usize, pool: usize) -> impl Strategy<Value = Case> {
    let pick = (0..10usize, 0..pool, 0..pool, value(), 0..6usize).prop_map(
        |(kind, a, b, value, choice)| generate::Pick {
            kind,
            labels: [a, b],
            value,
            choice,
        },
    );
    let process = (any::<bool>(), prop::collection::vec(pick, 0..ops));
    (
        prop::collection::vec(label_value(), pool),
        prop::collection::vec(process, processes),
    )
        .prop_map(|(pool, processes)| Case {
            name: "proptest".into(),
            registry: generate::registry(),
            processes: processes
                .into_iter()
                .enumerate()
                .map(|(p, (cgi, picks))| {
                    let pid = 41_000 + p as u32 * 3;
                    let mut ops = generate::registration(pid);
                    ops.extend(picks.into_iter().map(|pick| generate::op(pid, pick, &pool)));
                    (
                        if cgi { Dialect::Cgi } else { Dialect::Uri },
                        OpLog { pid, ops },
                    )
                })
                .collect(),
            ruby: None,
            export_each_writer: true,
        })
}

fn write(case: &Case, dir: &Path, strategies: StrategySet) {
    for (dialect, log) in &case.processes {
        let config = ClientConfig {
            dialect: *dialect,
            strategies,
            pid_override: Some(log.pid),
        };
        let mut client = Client::new(dir, &case.registry, config).unwrap();
        log.replay(&mut client).unwrap();
    }
}

fn set(strategies: &[S]) -> StrategySet {
    strategies.iter().copied().collect()
}

/// Write: the store's files, timestamps zeroed, equal the reference writer's.
fn check_write(case: &Case, strategies: StrategySet) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    write(case, dir.path(), strategies);
    let got = reference::store::read_dir(dir.path()).unwrap();
    let want = reference::store::files(&case.registry, &case.processes).unwrap();
    prop_assert!(!want.is_empty(), "no store file to compare");
    prop_assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (name, bytes) in &want {
        prop_assert!(
            &got[name] == bytes,
            "{}: {}",
            name,
            promlab::reference::first_difference::first_difference(
                &got[name],
                bytes,
                "promlab",
                "reference"
            )
        );
    }
    Ok(())
}

/// Export: one-shot and long-lived (scraped after every writer) exports equal the reference exporter's.
fn check_export(case: &Case, strategies: StrategySet) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut exporter =
        promlab::export::Exporter::new(dir.path(), case.registry.clone(), strategies)
            .with_catalogue_floor(2);
    let mut out = Vec::new();
    for (i, process) in case.processes.iter().enumerate() {
        let one = Case {
            processes: vec![process.clone()],
            ..case.clone()
        };
        write(&one, dir.path(), StrategySet::NONE);
        let want = reference::exposition::export(dir.path(), &case.registry).unwrap();
        if strategies.contains(S::FoldExited) {
            // Every writer so far has exited: fold their files (exactly, so
            // the reference's answer on the unfolded store still holds).
            let config = promlab::export::fold::FoldConfig {
                grace: std::time::Duration::ZERO,
                durable: false,
                ..promlab::export::fold::FoldConfig::default()
            };
            promlab::export::fold::fold_store(dir.path(), &case.registry, &config).unwrap();
        }
        exporter.export_into(&mut out).unwrap();
        let once = promlab::export::export(dir.path(), &case.registry, strategies).unwrap();
        for (what, got) in [("long-lived", &out), ("one-shot", &once)] {
            prop_assert!(
                *got == want,
                "{} export after writer {}: {}",
                what,
                i + 1,
                promlab::reference::first_difference::first_difference(
                    got,
                    &want,
                    "promlab",
                    "reference"
                )
            );
        }
    }
    Ok(())
}

/// Ingest: panes and counts equal the reference's, quantiles within α of exact.
fn check_ingest(case: &Case, strategies: StrategySet) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut sequence = Vec::new();
    for process in &case.processes {
        let one = Case {
            processes: vec![process.clone()],
            ..case.clone()
        };
        write(&one, dir.path(), StrategySet::NONE);
        sequence.push(reference::exposition::export(dir.path(), &case.registry).unwrap());
    }
    let input = verify::ingest_input(&sequence).unwrap();
    let want = reference::ingest::panes(&input.decoded, &input.plan);
    if let Err(e) = verify::ingest_and_check(&input, &want, strategies) {
        return Err(TestCaseError::fail(e));
    }
    Ok(())
}

/// One property test per (stage, strategy alone) and per stage with all its
/// strategies, each against the naive reference (memchr-style); `COVERED`
/// lists the sets the tests use.
macro_rules! against_reference {
    ($($test:ident: $check:ident, $case:expr, [$($strategy:ident),*];)*) => {
        const COVERED: &[&[S]] = &[$(&[$(S::$strategy),*]),*];
        proptest! {
            #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]
            $(
                #[test]
                fn $test(case in $case) {
                    $check(&case, set(&[$(S::$strategy),*]))?;
                }
            )*
        }
    };
}

fn small() -> impl Strategy<Value = Case> {
    case(1..6, 40, 6)
}

/// Big enough for the ingest seams: hundreds of series, tens of requests of
/// 100 samples, panes with values 1e-7 to 1e20 (more bins than the sketch keeps).
fn big() -> impl Strategy<Value = Case> {
    case(3..6, 150, 24)
}

against_reference! {
    write_baseline: check_write, small(), [];
    write_key_cache: check_write, small(), [KeyCache];
    write_increment_once: check_write, small(), [IncrementOnce];
    write_cached_pid: check_write, small(), [CachedPid];
    write_clock_once: check_write, small(), [ClockOnce];
    write_coarse_clock: check_write, small(), [CoarseClock];
    write_mmap_store: check_write, small(), [MmapStore];
    write_all: check_write, small(), [KeyCache, IncrementOnce, CachedPid, ClockOnce, CoarseClock, MmapStore];
    export_baseline: check_export, small(), [];
    export_single_read: check_export, small(), [SingleRead];
    export_decode_once: check_export, small(), [DecodeOnce];
    export_fast_unescape: check_export, small(), [FastUnescape];
    export_fold_exited: check_export, small(), [FoldExited];
    export_prerender: check_export, small(), [Prerender];
    export_all: check_export, small(), [SingleRead, DecodeOnce, FastUnescape, FoldExited, Prerender];
    ingest_baseline: check_ingest, big(), [];
    ingest_borrowed_decode: check_ingest, big(), [BorrowedDecode];
    ingest_series_cache: check_ingest, big(), [SeriesCache];
    ingest_batch_routing: check_ingest, big(), [BatchRouting];
    ingest_bulk_sketch: check_ingest, big(), [BulkSketch];
    ingest_all: check_ingest, big(), [BorrowedDecode, SeriesCache, BatchRouting, BulkSketch];
}

#[test]
fn every_strategy_is_tested_alone_and_with_its_stage() {
    for s in S::ALL {
        assert!(
            COVERED.contains(&&[s][..]),
            "{s} has no test of its own in against_reference!"
        );
        let with_others = COVERED.iter().any(|c| c.len() > 1 && c.contains(&s));
        assert!(
            with_others,
            "{s} has no all-of-its-stage test in against_reference!"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, failure_persistence: None, ..ProptestConfig::default() })]

    /// The whole chain under every one of the 2^n strategy sets.
    #[test]
    fn every_strategy_set_end_to_end(case in case(1..5, 60, 8)) {
        let tmp = tempfile::tempdir().unwrap();
        let sets = verify::every_set();
        let every = 1usize << S::ALL.len();
        prop_assert_eq!(sets.len(), every);
        match verify::check_case(&case, &sets, tmp.path()) {
            Ok(report) => prop_assert_eq!(report.sets, every),
            Err(e) => return Err(TestCaseError::fail(format!("{e:#}"))),
        }
    }
}

/// A difference fails the check and names the set: here every write subset's
/// writer refuses an op (a counter decreased) that the reference writer takes.
#[test]
fn a_difference_names_the_first_set_that_hits_it() {
    let mut case = generate::case(
        7,
        generate::Size {
            processes: 2,
            ops_per_process: 10,
            extra_values: 0,
        },
    );
    let bad = promlab::scenarios::op_log::Op {
        pid: case.processes[1].1.pid,
        metric: "requests_total".into(),
        op: promlab::scenarios::op_log::OpKind::Inc,
        value: promlab::scenarios::op_log::OpValue::new(-1.0),
        labels: vec![("path".into(), "x".into()), ("code".into(), "200".into())],
    };
    case.processes[1].1.ops.push(bad);
    let tmp = tempfile::tempdir().unwrap();
    let err = verify::check_case(&case, &verify::every_set(), tmp.path()).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("strategy set `none` fails at write"), "{msg}");
}

#[test]
fn promlab_verify_quick_exits_zero() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args(["verify", "--quick"])
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let every = 1usize << S::ALL.len();
    assert!(
        stdout.contains(&format!("verify: {every} strategy sets × ")),
        "{stdout}"
    );
    // The summary names what else ships and was checked.
    for named in [
        "the query path (query_json, encode_query, query_all, flushed;",
        "the receiver's laned ingester (",
        &format!("the live RabbitMQ renderer (LiveRegistry, {every} sets)"),
    ] {
        assert!(stdout.contains(named), "{named}: {stdout}");
    }
}

/// The receiver's lanes under concurrency: requests of one group apply in
/// any order with the in-order outcome. The groups of a verify input hold
/// several requests (so threads do race), and together every request once.
#[test]
fn laned_requests_are_grouped_so_that_any_interleaving_is_the_in_order_run() {
    let case = generate::case(
        3,
        generate::Size {
            processes: 4,
            ops_per_process: 150,
            extra_values: 8,
        },
    );
    let tmp = tempfile::tempdir().unwrap();
    let mut sequence = Vec::new();
    for process in &case.processes {
        let one = Case {
            processes: vec![process.clone()],
            ..case.clone()
        };
        write(&one, tmp.path(), StrategySet::NONE);
        sequence.push(reference::exposition::export(tmp.path(), &case.registry).unwrap());
    }
    let input = verify::ingest_input(&sequence).unwrap();
    let groups = verify::lanes::concurrent_groups(&input.decoded, &input.plan);
    let all: Vec<usize> = groups.iter().flatten().copied().collect();
    assert_eq!(all, (0..input.bodies.len()).collect::<Vec<_>>());
    assert!(groups.iter().any(|g| g.len() > 1), "{groups:?}");
    // Every group reversed is still the in-order run, for the reference.
    let reversed: Vec<_> = groups
        .iter()
        .flat_map(|g| g.iter().rev())
        .map(|&r| input.decoded[r].clone())
        .collect();
    let outcome = reference::ingest::run(&reversed, &input.plan);
    assert_eq!(outcome.sorted(), input.reference.sorted());
    assert_eq!(outcome.counts, input.reference.counts);
    assert!(input.reference.counts.accepted > 0);
    // And the laned checks pass on it, naming what they ran.
    let ingests = StrategySet::combinations(promlab::shared::strategy::Stage::Ingest);
    let report = verify::lanes::check(&input, &ingests, 3, 7).unwrap();
    assert_eq!((report.runs, report.orders), (16 + 3 * 2 * 4, 4));
    assert!(report.answers > 0);
}
