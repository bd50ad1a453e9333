//! What every criterion bench shares: the arms the build's features ask for
//! (`harness::arms` of `harness::configured`, the list `promlab ablate` uses),
//! each verified before it is timed, and a summary table after each group.
//!
//! `cargo bench --features S --bench STAGE` ablates S (the features that
//! belong to STAGE; all of STAGE's strategies when none does): baseline, each
//! strategy of S alone, S minus each, S, then the workload's extra arms (the
//! query's other paths) and the stage's floor (`harness::floor`: the least
//! work the stage allows, checked like every arm). `-- --test` runs every arm
//! once, with its verification.

#![allow(dead_code)] // each bench uses its part

use criterion::measurement::Measurement;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use promlab::shared::strategy::{Stage, StrategySet};
use promlab_lab::harness::{self, ArmKind, Generator, Output};
use std::hint::black_box;
use std::path::PathBuf;
use std::time::SystemTime;

/// The arms of `stage` this build ablates, named for criterion (`harness::bench_id`).
pub fn arms(stage: Stage) -> Vec<(String, StrategySet)> {
    harness::arms(stage, harness::configured(stage))
        .into_iter()
        .map(|(_, set)| (harness::bench_id(set), set))
        .collect()
}

/// Panics unless `got` is `expected`, naming the arm and the first difference.
pub fn check(arm: &str, got: &[u8], expected: &[u8]) {
    if got != expected {
        panic!(
            "arm {arm} differs from the expected answer {}",
            harness::first_difference(expected, got, "expected", arm)
        );
    }
}

/// Times the harness's workload for `params` (what `promlab ablate` times),
/// one criterion benchmark per arm — the strategy arms, the workload's extra
/// arms, the floor — after checking every arm's first run: bytes against the
/// digest `expected`, a floor's units against the workload's.
pub fn bench_workload<M: Measurement>(
    c: &mut Criterion<M>,
    group_name: &str,
    params: &Generator,
    expected: &str,
    configure: impl FnOnce(&mut BenchmarkGroup<'_, M>),
) {
    let stage = params.stage();
    let mut workload = harness::workloads::build(params).unwrap();
    let arms: Vec<(String, StrategySet, ArmKind)> = arms(stage)
        .into_iter()
        .map(|(name, set)| (name, set, ArmKind::Strategies))
        .chain(
            harness::all_arms(stage, harness::configured(stage), workload.as_ref())
                .into_iter()
                .filter(|(_, _, kind)| *kind != ArmKind::Strategies),
        )
        .collect();
    for entry @ (arm, _, _) in &arms {
        let output = harness::run_once(workload.as_mut(), entry).unwrap();
        if let Output::Units(n) = output {
            let units = workload.units().0;
            assert!(
                n == units,
                "{group_name}: arm {arm} handled {n} units, {units} expected"
            );
            continue;
        }
        let got = harness::digest(&output.bytes().unwrap());
        assert!(
            got == expected,
            "{group_name}: arm {arm} produced digest {got}, {expected} expected"
        );
    }
    let mut summary = Summary::new(group_name);
    let mut group = c.benchmark_group(group_name);
    group.throughput(Throughput::Elements(workload.units().0));
    configure(&mut group);
    for (arm, set, kind) in &arms {
        group.bench_function(arm.as_str(), |b| {
            if *kind == ArmKind::Upkeep {
                // Each run on a fresh set-up, made outside the timed region.
                let workload = std::cell::RefCell::new(&mut workload);
                b.iter_batched(
                    || workload.borrow_mut().set_up(arm).unwrap(),
                    |()| {
                        let mut workload = workload.borrow_mut();
                        size(harness::run_arm(workload.as_mut(), *kind, arm, *set).unwrap())
                    },
                    criterion::BatchSize::PerIteration,
                )
            } else {
                b.iter(|| size(harness::run_arm(workload.as_mut(), *kind, arm, *set).unwrap()))
            }
        });
        summary.arm(arm);
    }
    group.finish();
    summary.print();
}

/// What a run returned, reduced to a number the optimizer must keep.
fn size(output: Output<'_>) -> usize {
    match output {
        Output::Bytes(bytes) => black_box(bytes.len()),
        Output::Store(dir) | Output::StoreRead(dir, _) => black_box(dir.as_os_str().len()),
        Output::Units(n) => black_box(n as usize),
    }
}

/// The table printed after a group: each arm's median and its ratio to the
/// baseline, from criterion's estimates of this run
/// (`<target>/criterion/<group>/<arm>/new/estimates.json`).
pub struct Summary {
    group: String,
    started: SystemTime,
    arms: Vec<String>,
}

impl Summary {
    pub fn new(group: &str) -> Summary {
        Summary {
            group: group.to_string(),
            started: SystemTime::now(),
            arms: Vec::new(),
        }
    }

    /// An arm, by its benchmark id within the group (the first is the
    /// baseline; `function/parameter` for a `BenchmarkId::new`).
    pub fn arm(&mut self, id: &str) {
        self.arms.push(id.to_string());
    }

    pub fn print(&self) {
        let medians: Vec<Option<f64>> = self.arms.iter().map(|a| self.median_ns(a)).collect();
        println!(
            "\n{} — medians of this run, ratio = arm / baseline, ÷ floor = arm / the `floor` arm:",
            self.group
        );
        if std::env::args().any(|a| a == "--test") {
            println!("  (--test: each arm ran once, after its output was verified)\n");
            return;
        }
        if medians.iter().all(Option::is_none) {
            println!("  (no estimates from this run: the arms were filtered out)\n");
            return;
        }
        let width = self.arms.iter().map(String::len).max().unwrap_or(0).max(3);
        println!(
            "  {:<width$}  {:>12}  {:>8}  {:>8}  {:>8}",
            "arm", "median", "ratio", "speed-up", "÷ floor"
        );
        let base = medians.first().copied().flatten();
        let floor = self
            .arms
            .iter()
            .position(|a| a == "floor")
            .and_then(|i| medians[i]);
        for (arm, median) in self.arms.iter().zip(&medians) {
            match (median, base) {
                (Some(m), Some(b)) => println!(
                    "  {arm:<width$}  {:>12}  {:>8.3}  {:>7.2}×  {:>8}",
                    human(*m),
                    m / b,
                    b / m,
                    floor.map_or("–".to_string(), |f| format!("{:.2}×", m / f))
                ),
                (Some(m), None) => println!("  {arm:<width$}  {:>12}", human(*m)),
                (None, _) => println!("  {arm:<width$}  {:>12}", "not run"),
            }
        }
        println!();
    }

    /// Criterion's median estimate for one arm, if it was written by this run.
    fn median_ns(&self, arm: &str) -> Option<f64> {
        // `function/parameter` ids (`BenchmarkId::new`) are two directories.
        let mut path = criterion_dir().join(filename_safe(&self.group));
        for part in arm.split('/') {
            path.push(filename_safe(part));
        }
        path.push("new/estimates.json");
        let modified = std::fs::metadata(&path).ok()?.modified().ok()?;
        if modified < self.started {
            return None;
        }
        let estimates: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
        estimates["median"]["point_estimate"].as_f64()
    }
}

/// Where criterion writes (its own rule: `$CRITERION_HOME`, else the cargo
/// target directory's `criterion`; a bench runs from `<target>/release/deps`).
fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(target).join("criterion");
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.join("criterion")))
        .unwrap_or_else(|| PathBuf::from("target/criterion"))
}

/// Criterion's directory name for a group or benchmark id.
fn filename_safe(name: &str) -> String {
    let mut safe = name.replace(['?', '"', '/', '\\', '*', '<', '>', ':', '|', '^'], "_");
    // Criterion truncates to 64 bytes, on a character boundary.
    let mut end = safe.len().min(64);
    while !safe.is_char_boundary(end) {
        end -= 1;
    }
    safe.truncate(end);
    safe
}

/// A duration in nanoseconds, readably (criterion's units: wall or CPU time).
fn human(ns: f64) -> String {
    match ns {
        n if n < 1e3 => format!("{n:.1} ns"),
        n if n < 1e6 => format!("{:.2} µs", n / 1e3),
        n if n < 1e9 => format!("{:.2} ms", n / 1e6),
        n => format!("{:.3} s", n / 1e9),
    }
}
