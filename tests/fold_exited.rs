//! The fold of exited processes' files (`fold-exited`, `src/export/fold.rs`):
//! byte-identical expositions before and after, under every export strategy
//! combination, for every aggregation and both key dialects, with live
//! writers among the exited ones; live files never touched.

mod common;
#[path = "common/generators.rs"]
mod generators;

use generators::{label_value, value};
use promlab::export::fold::{fold_store, FoldConfig};
use promlab::format::formenc::Dialect;
use promlab::format::registry::{MetricType, ProcessAggregation, Registry};
use promlab::shared::strategy::{Stage, StrategySet};
use promlab::write::{Client, ClientConfig};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// Every aggregation: a counter, a gauge per mode, a histogram and a summary.
fn registry() -> Registry {
    let gauge = |name: &str, agg: &str| {
        format!(
            r#"{{"name": "{name}", "type": "gauge", "help": "g", "labels": ["path"], "aggregation": "{agg}"}}"#
        )
    };
    let json = format!(
        r#"{{"metrics": [
            {{"name": "requests_total", "type": "counter", "help": "c", "labels": ["path"]}},
            {{"name": "jobs_total", "type": "counter", "help": "unlabeled"}},
            {g_sum}, {g_max}, {g_min}, {g_all}, {g_recent},
            {{"name": "latency_seconds", "type": "histogram", "help": "h", "labels": ["path"], "buckets": ["0.01", "0.1", "1"]}},
            {{"name": "size_bytes", "type": "summary", "help": "s", "labels": ["path"]}}
        ]}}"#,
        g_sum = gauge("g_sum", "sum"),
        g_max = gauge("g_max", "max"),
        g_min = gauge("g_min", "min"),
        g_all = gauge("g_all", "all"),
        g_recent = gauge("g_recent", "most_recent"),
    );
    Registry::from_json(&json).unwrap()
}

/// One op: which metric (index), which label value (index into a pool), a value.
type RawOp = (usize, usize, f64);

#[derive(Clone, Debug)]
struct Process {
    pid: u32,
    dialect: Dialect,
    live: bool,
    ops: Vec<RawOp>,
}

fn integral(v: f64) -> f64 {
    if v.is_finite() {
        v.abs().round().min(1e9)
    } else {
        1.0
    }
}

fn process() -> impl Strategy<Value = Process> {
    (
        // Pids of every length, so live and exited files interleave in name
        // order (and fold names must fit between them).
        prop_oneof![1u32..100, 100u32..10_000, 10_000u32..4_000_000],
        prop_oneof![Just(Dialect::Uri), Just(Dialect::Cgi)],
        prop::bool::weighted(0.3),
        proptest::collection::vec((0..9usize, 0..3usize, value()), 0..12),
        any::<bool>(),
    )
        .prop_map(|(pid, dialect, live, ops, counts)| Process {
            pid,
            dialect,
            live,
            // Half the processes count in whole numbers (sums that associate),
            // half write any value (sums that may not).
            ops: ops
                .into_iter()
                .map(|(m, l, v)| (m, l, if counts { integral(v) } else { v }))
                .collect(),
        })
}

fn case() -> impl Strategy<Value = (Vec<String>, Vec<Process>)> {
    (
        proptest::collection::vec(label_value(), 3),
        proptest::collection::vec(process(), 2..14),
    )
        .prop_map(|(pool, mut processes)| {
            processes.sort_by_key(|p| p.pid);
            processes.dedup_by_key(|p| p.pid);
            (pool, processes)
        })
}

/// Writes every process's ops; returns the clients of the live ones (kept
/// open: their files stay open for writing, as a running process's do).
fn write(dir: &Path, registry: &Registry, pool: &[String], processes: &[Process]) -> Vec<Client> {
    let mut live = Vec::new();
    for process in processes {
        let config = ClientConfig {
            dialect: process.dialect,
            strategies: StrategySet::NONE,
            pid_override: Some(process.pid),
        };
        let mut client = Client::new(dir, registry, config).unwrap();
        client.init_unlabeled().unwrap();
        for &(m, l, v) in &process.ops {
            let def = &registry.metrics[m];
            let id = client.metric(&def.name).unwrap();
            let labels: Vec<(&str, &str)> = if def.labels.is_empty() {
                Vec::new()
            } else {
                vec![("path", pool[l].as_str())]
            };
            let _ = match (def.kind, def.aggregation()) {
                (MetricType::Counter, _) => client.increment(id, &labels, v.abs()),
                (MetricType::Gauge, ProcessAggregation::MostRecent) => client.set(id, &labels, v),
                (MetricType::Gauge, _) if l == 0 => client.set(id, &labels, v),
                (MetricType::Gauge, _) => client.increment(id, &labels, v),
                _ => client.observe(id, &labels, v),
            };
        }
        if process.live {
            live.push(client);
        }
    }
    live
}

/// Every file's bytes, by name.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

fn export_all(dir: &Path, registry: &Registry) -> Vec<(StrategySet, Vec<u8>)> {
    StrategySet::combinations(Stage::Export)
        .into_iter()
        .map(|s| (s, promlab::export::export(dir, registry, s).unwrap()))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Folding changes no byte of any exposition, under every export
    /// combination, and leaves every live file exactly as it was; a second
    /// fold changes nothing either.
    #[test]
    fn folding_changes_no_exposition((pool, processes) in case(), max_batch in prop_oneof![Just(1024usize), 1usize..4]) {
        let registry = registry();
        let dir = tempfile::tempdir().unwrap();
        let _live = write(dir.path(), &registry, &pool, &processes);
        let before = export_all(dir.path(), &registry);
        let files_before = files(dir.path());
        // Small batches: long runs commit in several, each exact on its own.
        let config = FoldConfig { grace: std::time::Duration::ZERO, max_batch, durable: false, ..FoldConfig::default() };
        let report = fold_store(dir.path(), &registry, &config).unwrap();
        prop_assert!(report.metrics_skipped.is_empty(), "{report:?}");
        let after = export_all(dir.path(), &registry);
        for ((strategies, a), (_, b)) in before.iter().zip(&after) {
            prop_assert!(a == b, "{strategies}: {}\n---\n{}", String::from_utf8_lossy(a), String::from_utf8_lossy(b));
        }
        let files_after = files(dir.path());
        let live_pids: Vec<u32> = processes.iter().filter(|p| p.live).map(|p| p.pid).collect();
        for (name, bytes) in &files_before {
            let pid: u32 = name.rsplit("___").next().unwrap().trim_end_matches(".bin").parse().unwrap_or(0);
            if live_pids.contains(&pid) {
                prop_assert_eq!(files_after.get(name), Some(bytes), "live file {} touched", name);
            }
        }
        prop_assert!(files_after.len() <= files_before.len());
        // Folded again (a run cut where a sum did not associate may fold
        // further once its neighbours are folded): nothing changes.
        fold_store(dir.path(), &registry, &config).unwrap();
        prop_assert!(export_all(dir.path(), &registry) == after);
        prop_assert!(files(dir.path()).len() <= files_after.len());
        // Nothing of the fold's own is left behind.
        let fold_dir = dir.path().join(promlab::export::fold::FOLD_DIR);
        let leftovers: Vec<_> = std::fs::read_dir(&fold_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        prop_assert!(leftovers.iter().all(|n| n == "lock" || n == "run.lock" || n == "trash"), "{leftovers:?}");
        prop_assert_eq!(std::fs::read_dir(fold_dir.join("trash")).unwrap().count(), 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The one-file-per-process layout (client_ruby's PoC branch): exited
    /// processes' files merged into `metrics___<pid>.bin` (some of them),
    /// live ones left per metric, so both layouts share the store; folding
    /// changes no exposition under any export combination, and the store
    /// still prints what the naive reference prints.
    #[test]
    fn folding_the_one_file_per_process_layout_changes_no_exposition(
        (pool, processes) in case(),
        merged in proptest::collection::vec(any::<bool>(), 14),
        max_batch in prop_oneof![Just(1024usize), 1usize..4],
    ) {
        let registry = registry();
        let dir = tempfile::tempdir().unwrap();
        let _live = write(dir.path(), &registry, &pool, &processes);
        for (process, merge) in processes.iter().zip(&merged) {
            if !process.live && *merge {
                promlab::scenarios::per_process_layout::merge_process(dir.path(), &registry, &process.pid.to_string(), process.dialect).unwrap();
            }
        }
        let before = export_all(dir.path(), &registry);
        let reference = promlab::reference::exposition::export(dir.path(), &registry).unwrap();
        prop_assert!(before[0].1 == reference);
        let config = FoldConfig { grace: std::time::Duration::ZERO, max_batch, durable: false, ..FoldConfig::default() };
        let report = fold_store(dir.path(), &registry, &config).unwrap();
        prop_assert!(report.metrics_skipped.is_empty(), "{report:?}");
        let after = export_all(dir.path(), &registry);
        for ((strategies, a), (_, b)) in before.iter().zip(&after) {
            prop_assert!(a == b, "{strategies}: {}\n---\n{}", String::from_utf8_lossy(a), String::from_utf8_lossy(b));
        }
        prop_assert!(promlab::reference::exposition::export(dir.path(), &registry).unwrap() == reference);
    }
}

/// Every process exited and in the one-file-per-process layout: their files
/// fold into one, `metrics___<8+ digits>.bin`, in front.
#[test]
fn exited_processes_of_the_one_file_per_process_layout_fold_into_one_file() {
    let registry = registry();
    let dir = tempfile::tempdir().unwrap();
    let pool = vec!["/a".to_owned(), "/b c".to_owned(), "é&=%".to_owned()];
    let processes: Vec<Process> = (0..30)
        .map(|i| Process {
            pid: 30_000 + i * 13,
            dialect: Dialect::Cgi,
            live: false,
            ops: (0..9)
                .map(|m| (m, (i as usize + m) % 3, 1.0 + m as f64))
                .collect(),
        })
        .collect();
    write(dir.path(), &registry, &pool, &processes);
    promlab::scenarios::per_process_layout::convert_store(dir.path(), &registry, Dialect::Cgi)
        .unwrap();
    assert_eq!(files(dir.path()).len(), 30);
    let before = export_all(dir.path(), &registry);
    let report = fold_store(dir.path(), &registry, &FoldConfig::default()).unwrap();
    assert_eq!(report.files_folded, 30, "{report:?}");
    assert_eq!(report.fold_files_written, 1, "{report:?}");
    assert_eq!(export_all(dir.path(), &registry), before);
    let names: Vec<String> = files(dir.path()).into_keys().collect();
    assert_eq!(names, ["metrics___30000000.bin"]);
}

/// The stores client_ruby's PoC branch wrote, folded: every export
/// combination still prints the branch's own exposition.
#[test]
fn the_poc_branchs_own_stores_fold_to_the_same_exposition() {
    let (_tmp, cases) = common::per_process_cases();
    for case in cases {
        let registry = Registry::load(&case.join("registry.json")).unwrap();
        let expected = std::fs::read(case.join("expected.prom")).unwrap();
        let store = case.join("store");
        let config = FoldConfig {
            grace: std::time::Duration::ZERO,
            durable: false,
            ..FoldConfig::default()
        };
        let report = fold_store(&store, &registry, &config).unwrap();
        assert!(report.files_folded >= 2, "{report:?}");
        for (strategies, out) in export_all(&store, &registry) {
            assert!(out == expected, "{}: {strategies}", case.display());
        }
    }
}

/// With every process exited, a metric's files fold into one, in front.
#[test]
fn exited_processes_fold_into_one_file_per_metric() {
    let registry = registry();
    let dir = tempfile::tempdir().unwrap();
    let pool = vec!["/a".to_owned(), "/b c".to_owned(), "é&=%".to_owned()];
    let processes: Vec<Process> = (0..40)
        .map(|i| Process {
            pid: 30_000 + i * 13,
            dialect: if i % 2 == 0 {
                Dialect::Uri
            } else {
                Dialect::Cgi
            },
            live: false,
            ops: (0..9)
                .map(|m| (m, (i as usize + m) % 3, 1.0 + m as f64))
                .collect(),
        })
        .collect();
    write(dir.path(), &registry, &pool, &processes);
    let before = export_all(dir.path(), &registry);
    let report = fold_store(dir.path(), &registry, &FoldConfig::default()).unwrap();
    assert_eq!(report.files_folded, 40 * 9, "{report:?}");
    assert_eq!(report.fold_files_written, 9, "{report:?}");
    assert_eq!(export_all(dir.path(), &registry), before);
    let names: Vec<String> = files(dir.path()).into_keys().collect();
    assert_eq!(names.len(), 9, "{names:?}");
    assert!(
        names.iter().all(|n| n.ends_with("___30000000.bin")),
        "{names:?}"
    );
}

/// A live writer's 1e16 before two exited ones' 1.0 each: `(1e16 + 1) + 1`
/// is 1e16, `1e16 + (1 + 1)` is 1e16 + 2. The two must not fold together;
/// with the live value 0 instead they may.
#[test]
fn a_sum_that_would_not_associate_is_not_folded() {
    let registry = Registry::from_json(
        r#"{"metrics": [{"name": "g", "type": "gauge", "help": "g", "aggregation": "sum"}]}"#,
    )
    .unwrap();
    for (live_value, expect_folded) in [(1e16, 0), (0.0, 2)] {
        let dir = tempfile::tempdir().unwrap();
        let client = |pid| {
            let config = ClientConfig {
                dialect: Dialect::Uri,
                strategies: StrategySet::NONE,
                pid_override: Some(pid),
            };
            Client::new(dir.path(), &registry, config).unwrap()
        };
        // Name order: 1 (live), 2, 3 (exited).
        let mut live = client(1);
        let id = live.metric("g").unwrap();
        live.set(id, &[], live_value).unwrap();
        for pid in [2, 3] {
            let mut exited = client(pid);
            exited.set(id, &[], 1.0).unwrap();
        }
        let before = export_all(dir.path(), &registry);
        let report = fold_store(dir.path(), &registry, &FoldConfig::default()).unwrap();
        assert_eq!(
            report.files_folded, expect_folded,
            "{live_value}: {report:?}"
        );
        assert_eq!(export_all(dir.path(), &registry), before, "{live_value}");
        drop(live);
    }
}

/// `max` keeps the first of equal values: 0.0 from a live writer, then
/// -0.0 and 0.0 exited. Folded, the run keeps -0.0, and the live 0.0 before
/// it still wins; the exposition prints `0.0` before and after.
#[test]
fn signed_zeros_keep_their_order_under_max_and_min() {
    for agg in ["max", "min"] {
        let registry = Registry::from_json(&format!(
            r#"{{"metrics": [{{"name": "g", "type": "gauge", "help": "g", "aggregation": "{agg}"}}]}}"#
        ))
        .unwrap();
        for first in [0.0, -0.0] {
            let dir = tempfile::tempdir().unwrap();
            let client = |pid| {
                let config = ClientConfig {
                    dialect: Dialect::Cgi,
                    strategies: StrategySet::NONE,
                    pid_override: Some(pid),
                };
                Client::new(dir.path(), &registry, config).unwrap()
            };
            let mut live = client(1);
            let id = live.metric("g").unwrap();
            live.set(id, &[], first).unwrap();
            for (pid, v) in [(2, -0.0), (3, 0.0), (4, f64::NAN), (5, -0.0)] {
                client(pid).set(id, &[], v).unwrap();
            }
            let before = export_all(dir.path(), &registry);
            let report = fold_store(dir.path(), &registry, &FoldConfig::default()).unwrap();
            assert_eq!(report.files_folded, 4, "{agg} {first}: {report:?}");
            assert_eq!(export_all(dir.path(), &registry), before, "{agg} {first}");
            drop(live);
        }
    }
}
