//! Property tests for the first half: random registries, label values, values
//! and op sequences over 1–12 processes. Every write-side strategy combination
//! must write the same store bytes (timestamps aside), and every export-side
//! combination must print the same exposition as the baseline (and, in the
//! one-file-per-process layout, as the naive reference).

mod common;
#[path = "common/generators.rs"]
mod generators;

use generators::{label_value, value};
use promlab::format::formenc::Dialect;
use promlab::format::registry::{MetricDef, MetricType, ProcessAggregation, Registry};
use promlab::scenarios::op_log::{Op, OpKind, OpLog, OpValue};
use promlab::shared::strategy::{Stage, StrategySet};
use promlab::write::{Client, ClientConfig};
use proptest::prelude::*;
use std::path::Path;

fn metric_def(index: usize) -> impl Strategy<Value = MetricDef> {
    let kind = prop_oneof![
        Just(MetricType::Counter),
        Just(MetricType::Gauge),
        Just(MetricType::Histogram),
        Just(MetricType::Summary)
    ];
    (
        kind,
        0..3usize,
        0..5usize,
        proptest::collection::vec(-100.0f64..100.0, 1..5),
        "[ -~\n\\\\]{0,20}",
    )
        .prop_map(move |(kind, n_labels, agg, mut bounds, help)| {
            let aggregation = match (kind, agg) {
                (MetricType::Gauge, 0) => ProcessAggregation::Sum,
                (MetricType::Gauge, 1) => ProcessAggregation::Max,
                (MetricType::Gauge, 2) => ProcessAggregation::Min,
                (MetricType::Gauge, 3) => ProcessAggregation::MostRecent,
                (MetricType::Gauge, _) => ProcessAggregation::All,
                _ => ProcessAggregation::Sum,
            };
            bounds.sort_by(f64::total_cmp);
            let buckets = if kind == MetricType::Histogram {
                bounds
                    .iter()
                    .map(|b| promlab::format::rubyfloat::to_s(*b))
                    .collect()
            } else {
                Vec::new()
            };
            MetricDef {
                name: format!("m{index}_{}", kind.name()),
                kind,
                help,
                labels: ["path", "code", "zone"][..n_labels]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                aggregation: Some(aggregation),
                buckets,
            }
        })
}

fn registry() -> impl Strategy<Value = Registry> {
    (1..4usize)
        .prop_flat_map(|n| (0..n).map(metric_def).collect::<Vec<_>>())
        .prop_map(|metrics| {
            let mut registry = Registry { metrics };
            registry.validate().expect("generated registries are valid");
            registry
        })
}

/// Ops valid for `registry`: label sets drawn from a small pool so series repeat.
fn ops(registry: &Registry, pid: u32) -> impl Strategy<Value = Vec<Op>> {
    let registry = registry.clone();
    let pool = proptest::collection::vec(label_value(), 3);
    (
        pool,
        proptest::collection::vec(
            (0..16usize, 0..3usize, 0..3usize, 0..3usize, value(), 0..4u8),
            // At least one op: a process that wrote nothing has no file to compare.
            1..25,
        ),
    )
        .prop_map(move |(pool, raw)| {
            raw.into_iter()
                .map(|(m, a, b, c, v, choice)| {
                    let def = &registry.metrics[m % registry.metrics.len()];
                    let picks = [a, b, c];
                    let labels = def
                        .labels
                        .iter()
                        .zip(picks)
                        .map(|(name, i)| (name.clone(), pool[i].clone()))
                        .collect();
                    let (op, v) = match def.kind {
                        MetricType::Counter => {
                            (OpKind::Inc, if v.is_nan() { 1.0 } else { v.abs() })
                        }
                        MetricType::Gauge
                            if def.aggregation() == ProcessAggregation::MostRecent =>
                        {
                            (OpKind::Set, v)
                        }
                        MetricType::Gauge => (
                            match choice {
                                0 => OpKind::Inc,
                                1 => OpKind::Dec,
                                _ => OpKind::Set,
                            },
                            v,
                        ),
                        _ if choice == 0 => (OpKind::Init, 0.0),
                        _ => (OpKind::Observe, v),
                    };
                    Op {
                        pid,
                        metric: def.name.clone(),
                        op,
                        value: OpValue::new(v),
                        labels,
                    }
                })
                .collect()
        })
}

#[derive(Debug, Clone)]
struct Case {
    registry: Registry,
    /// Per process: its dialect and its ops.
    processes: Vec<(Dialect, OpLog)>,
}

fn case() -> impl Strategy<Value = Case> {
    (registry(), 1..=12usize).prop_flat_map(|(registry, n)| {
        let processes: Vec<_> = (0..n)
            .map(|i| {
                let pid = 1000 + i as u32 * 7;
                let dialect = prop_oneof![Just(Dialect::Uri), Just(Dialect::Cgi)];
                (dialect, ops(&registry, pid)).prop_map(move |(d, ops)| (d, OpLog { pid, ops }))
            })
            .collect();
        (Just(registry), processes).prop_map(|(registry, processes)| Case {
            registry,
            processes,
        })
    })
}

/// Writes every process's ops, one after another, like forked writers would.
fn write_store(case: &Case, dir: &Path, strategies: StrategySet) {
    for (dialect, log) in &case.processes {
        let config = ClientConfig {
            dialect: *dialect,
            strategies,
            pid_override: Some(log.pid),
        };
        let mut client = Client::new(dir, &case.registry, config).unwrap();
        for op in &log.ops {
            promlab::scenarios::op_log::apply(&mut client, op).unwrap();
        }
    }
}

/// Deletes every file of process `pid` (a process that exited and was cleaned up).
fn delete_process_files(dir: &Path, pid: u32) {
    let suffix = format!("___{pid}.bin");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.to_string_lossy().ends_with(&suffix) {
            std::fs::remove_file(path).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Long-lived exporters (what `promlab serve --store` keeps; `prerender`
    /// keeps its catalogue across scrapes) scrape a store while processes
    /// come and go: after each process writes, and after an earlier process's
    /// files are deleted, every combination prints what a fresh baseline
    /// export prints, and again on a second scrape with nothing changed.
    #[test]
    fn long_lived_exporters_follow_a_changing_store(case in case(), deletions in proptest::collection::vec(any::<bool>(), 12)) {
        let dir = tempfile::tempdir().unwrap();
        let mut exporters: Vec<_> = StrategySet::combinations(Stage::Export)
            .into_iter()
            .map(|s| (s, promlab::export::Exporter::new(dir.path(), case.registry.clone(), s).with_catalogue_floor(2)))
            .collect();
        let mut out = Vec::new();
        // Each process writes in turn; then the first writes its ops again,
        // into files that exist (values move, new keys are appended).
        let turns = case.processes.iter().chain(case.processes.first());
        for (i, (dialect, log)) in turns.enumerate() {
            let one = Case { registry: case.registry.clone(), processes: vec![(*dialect, log.clone())] };
            write_store(&one, dir.path(), StrategySet::NONE);
            if i > 0 && i < case.processes.len() && deletions[i] {
                delete_process_files(dir.path(), case.processes[i - 1].1.pid);
            }
            let expected = promlab::export::export(dir.path(), &case.registry, StrategySet::NONE).unwrap();
            for (strategies, exporter) in &mut exporters {
                exporter.export_into(&mut out).unwrap();
                prop_assert!(out == expected, "scrape {} with {} differs", i, strategies);
                // Nothing changed since: an exporter that planned the last
                // scrape runs its plan.
                exporter.export_into(&mut out).unwrap();
                prop_assert!(out == expected, "scrape {} again with {} differs", i, strategies);
            }
        }
    }

    /// The one-file-per-process layout of client_ruby's PoC branch: the same
    /// store with some (or all, or none) of its processes' files merged into
    /// one file each, keys naming their metric; every export combination,
    /// one-shot and long-lived, prints what the naive reference prints.
    #[test]
    fn the_one_file_per_process_layout_exports_as_the_reference(case in case(), merged in proptest::collection::vec(any::<bool>(), 12)) {
        let dir = tempfile::tempdir().unwrap();
        write_store(&case, dir.path(), StrategySet::NONE);
        for ((dialect, log), merge) in case.processes.iter().zip(&merged) {
            if *merge {
                promlab::scenarios::per_process_layout::merge_process(dir.path(), &case.registry, &log.pid.to_string(), *dialect).unwrap();
            }
        }
        let expected = promlab::reference::exposition::export(dir.path(), &case.registry).unwrap();
        let mut out = Vec::new();
        for strategies in StrategySet::combinations(Stage::Export) {
            let got = promlab::export::export(dir.path(), &case.registry, strategies).unwrap();
            prop_assert!(got == expected, "export with {} differs: {}", strategies,
                promlab::reference::first_difference::first_difference(&got, &expected, "ours", "reference"));
            let mut exporter = promlab::export::Exporter::new(dir.path(), case.registry.clone(), strategies);
            for scrape in 0..2 {
                exporter.export_into(&mut out).unwrap();
                prop_assert!(out == expected, "scrape {} with {} differs", scrape, strategies);
            }
        }
    }

    #[test]
    fn every_strategy_combination_writes_and_exports_the_same_bytes(case in case()) {
        let baseline_dir = tempfile::tempdir().unwrap();
        write_store(&case, baseline_dir.path(), StrategySet::NONE);
        for strategies in StrategySet::combinations(Stage::Write).into_iter().skip(1) {
            let dir = tempfile::tempdir().unwrap();
            write_store(&case, dir.path(), strategies);
            common::assert_same_store(baseline_dir.path(), dir.path(), &format!("write with {strategies}"));
        }
        let expected = promlab::export::export(baseline_dir.path(), &case.registry, StrategySet::NONE).unwrap();
        for strategies in StrategySet::combinations(Stage::Export).into_iter().skip(1) {
            let out = promlab::export::export(baseline_dir.path(), &case.registry, strategies).unwrap();
            prop_assert!(out == expected, "export with {} differs", strategies);
        }
    }
}

/// A long-lived exporter remembers which raw key it found at each ordinal of
/// each file, as a hint. A file rewritten in place (same path, same inode,
/// same size: a writer that breaks the append-only protocol) holds other keys
/// at those ordinals, with the same padded lengths; every combination must
/// still print what a fresh baseline export prints.
#[test]
fn keys_rewritten_in_place_are_not_trusted_from_hints() {
    let registry = Registry::from_json(
        r#"{"metrics": [{"name": "c", "type": "counter", "help": "h", "labels": ["a"], "aggregation": "sum"}]}"#,
    )
    .unwrap();
    let write = |dir: &Path, values: [(&str, f64); 3]| {
        let config = ClientConfig {
            dialect: Dialect::Uri,
            strategies: StrategySet::NONE,
            pid_override: Some(7),
        };
        let mut client = Client::new(dir, &registry, config).unwrap();
        let id = client.metric("c").unwrap();
        for (label, by) in values {
            client.increment(id, &[("a", label)], by).unwrap();
        }
    };
    let (live, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(live.path(), [("x1", 1.0), ("y1", 2.0), ("z1", 3.0)]);
    write(other.path(), [("z1", 30.0), ("x1", 10.0), ("y1", 20.0)]);
    let mut exporters: Vec<_> = StrategySet::combinations(Stage::Export)
        .into_iter()
        .map(|s| {
            (
                s,
                promlab::export::Exporter::new(live.path(), registry.clone(), s),
            )
        })
        .collect();
    let path = promlab::format::storefile::file_path(live.path(), "c", 7);
    let mut out = Vec::new();
    for round in 0..2 {
        if round == 1 {
            // std::fs::write truncates and rewrites: the inode stays.
            let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
            let bytes =
                std::fs::read(promlab::format::storefile::file_path(other.path(), "c", 7)).unwrap();
            std::fs::write(&path, bytes).unwrap();
            let after = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
            assert_eq!(inode, after);
        }
        let expected = promlab::export::export(live.path(), &registry, StrategySet::NONE).unwrap();
        assert!(String::from_utf8_lossy(&expected).contains(if round == 0 {
            "c{a=\"z1\"} 3.0"
        } else {
            "c{a=\"z1\"} 30.0"
        }));
        for (strategies, exporter) in &mut exporters {
            exporter.export_into(&mut out).unwrap();
            assert!(out == expected, "round {round} with {strategies} differs");
        }
    }
}

/// Store files start at 1 MiB and double (and `mmap-store` remaps) when full;
/// `key-cache` remembers each series' value offset. Enough long label sets to
/// grow the histogram's file from 1 MiB to 2 and then 4 MiB, then the first
/// label sets again (offsets cached before both growths): every combination
/// writes the baseline's bytes.
#[test]
fn cached_offsets_hold_across_file_growth() {
    let registry = promlab::scenarios::store_workloads::long_label_registry();
    const SETS: usize = 1000;
    const AGAIN: usize = 50;
    let write = |dir: &Path, strategies: StrategySet| {
        let config = ClientConfig {
            dialect: Dialect::Uri,
            strategies,
            pid_override: Some(4242),
        };
        let mut client = Client::new(dir, &registry, config).unwrap();
        let histogram = client.metric("request_seconds").unwrap();
        let counter = client.metric("requests_total").unwrap();
        for i in (0..SETS).chain(0..AGAIN) {
            let statement = promlab::scenarios::store_workloads::statement(i, 49);
            let labels = [("statement", statement.as_str())];
            for value in [0.003, 0.03, 0.3, 3.0] {
                client.observe(histogram, &labels, value).unwrap();
            }
            client.increment(counter, &labels, 1.0).unwrap();
        }
    };
    let baseline = tempfile::tempdir().unwrap();
    write(baseline.path(), StrategySet::NONE);
    let file = promlab::format::storefile::file_path(baseline.path(), "request_seconds", 4242);
    let len = std::fs::metadata(&file).unwrap().len();
    assert_eq!(
        len,
        4 * promlab::format::storefile::INITIAL_FILE_SIZE,
        "1 MiB, doubled twice"
    );
    for strategies in StrategySet::combinations(Stage::Write).into_iter().skip(1) {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), strategies);
        common::assert_same_store(
            baseline.path(),
            dir.path(),
            &format!("growth with {strategies}"),
        );
    }
}
