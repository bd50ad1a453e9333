//! Scaling runs (`promlab scale`): how each stage's cost grows with its work.
//!
//! An axis (`experiments/scaling/<name>.toml`) is typed data like a scenario:
//! what its x counts (files, series, groups, lanes…) and, at a quick and a full
//! size, the generator's parameters at each point. Per point, [`run_axis`]
//! 1. builds the workload and computes its expected answer from the
//!    independent source every scenario's comes from ([`expected_answer`]);
//! 2. verifies the first run of every arm — baseline, all of the stage's
//!    strategies, the workload's extra arms the axis names, the floors —
//!    against it (a floor that is not the answer by the units it handled);
//! 3. measures the arms interleaved ([`measure`]: wall and CPU time of every
//!    run, every output checked);
//! 4. with `--peak-rss`, runs each arm once more in a child of its own for its
//!    peak resident memory ([`rss::probe_params`]).
//!
//! Then, per arm, it fits the exponent `b` of `cost ∝ xᵇ` over the points
//! (least squares on logs) and gives the local exponent between neighbouring
//! points — where the curve bends — and writes `<out>/scaling/<axis>.csv`
//! (columns: [`CSV_HEADER`], documented in `experiments/README.md`) and
//! `<out>/scaling/machine.txt`.

use super::format::duration;
use super::report::{self, Progress};
use super::{
    all_arms, digest, expected_answer, measure, rss, workloads, ArmKind, ArmResult, Generator,
    Output, FLOOR,
};
use anyhow::{bail, Context, Result};
use promlab::shared::strategy::{Stage, StrategySet};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One axis, as its file describes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Axis {
    pub name: String,
    pub description: String,
    /// What x counts (`files`, `series`, `groups`, …), for the table and the figure.
    pub x: String,
    /// Extra arms of the workload to measure besides baseline, all and the
    /// floors (the query's `all-uncached`).
    #[serde(default)]
    pub extra_arms: Vec<String>,
    pub quick: Ladder,
    pub full: Ladder,
}

/// The points of an axis at one size.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ladder {
    /// Timed rounds per point (a point may say otherwise).
    pub repeats: usize,
    pub points: Vec<Point>,
}

/// One point: its x and the generator's parameters there.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Point {
    pub x: f64,
    pub params: Generator,
    #[serde(default)]
    pub repeats: Option<usize>,
}

impl Axis {
    pub fn ladder(&self, quick: bool) -> &Ladder {
        if quick {
            &self.quick
        } else {
            &self.full
        }
    }

    /// The stage's name as the figures say it: `query` for the query's
    /// generator, otherwise the stage of the axis's generator.
    pub fn stage(&self) -> &'static str {
        stage_label(&self.quick.points[0].params)
    }
}

fn stage_label(params: &Generator) -> &'static str {
    match params {
        Generator::AsapQuery { .. } => "query",
        other => match other.stage() {
            Stage::Write => "write",
            Stage::Export => "export",
            Stage::Render => "render",
            Stage::Ingest => "ingest",
        },
    }
}

/// The axes that ship with promlab (`experiments/scaling/`), in run order.
pub const BUILT_IN: [(&str, &str); 7] = [
    (
        "export-files",
        include_str!("../../../scaling/export-files.toml"),
    ),
    (
        "export-series-per-file",
        include_str!("../../../scaling/export-series-per-file.toml"),
    ),
    (
        "render-series",
        include_str!("../../../scaling/render-series.toml"),
    ),
    (
        "ingest-groups",
        include_str!("../../../scaling/ingest-groups.toml"),
    ),
    (
        "ingest-churn",
        include_str!("../../../scaling/ingest-churn.toml"),
    ),
    (
        "ingest-lanes",
        include_str!("../../../scaling/ingest-lanes.toml"),
    ),
    (
        "query-groups",
        include_str!("../../../scaling/query-groups.toml"),
    ),
];

/// A built-in axis by name, or an axis file by path; checked: points in
/// increasing x, every point of one stage.
pub fn load_axis(name_or_path: &str) -> Result<Axis> {
    let axis: Axis = super::scenario::load_definition(
        name_or_path,
        &BUILT_IN,
        "axis",
        "a stage: export, render, ingest, query; or a .toml file",
    )?;
    for ladder in [&axis.quick, &axis.full] {
        if ladder.points.is_empty() {
            bail!("axis {}: a size without points", axis.name);
        }
        if ladder.points.windows(2).any(|w| w[1].x <= w[0].x) || ladder.points[0].x <= 0.0 {
            bail!("axis {}: x must be positive and increase", axis.name);
        }
        if ladder
            .points
            .iter()
            .any(|p| stage_label(&p.params) != stage_label(&axis.quick.points[0].params))
        {
            bail!("axis {}: every point must run one stage", axis.name);
        }
    }
    Ok(axis)
}

/// The axes `names` selects: axis names, stage names (every axis of the
/// stage), or all built-ins when empty.
pub fn select(names: &[String]) -> Result<Vec<Axis>> {
    if names.is_empty() {
        return BUILT_IN.iter().map(|(n, _)| load_axis(n)).collect();
    }
    let mut axes: Vec<Axis> = Vec::new();
    for name in names {
        let chosen: Vec<Axis> = match name.as_str() {
            "write" | "export" | "render" | "ingest" | "query" => BUILT_IN
                .iter()
                .map(|(n, _)| load_axis(n))
                .collect::<Result<Vec<_>>>()?
                .into_iter()
                .filter(|a| a.stage() == name)
                .collect(),
            _ => vec![load_axis(name)?],
        };
        if chosen.is_empty() {
            bail!("no axis of the {name} stage");
        }
        for axis in chosen {
            if !axes.iter().any(|a| a.name == axis.name) {
                axes.push(axis);
            }
        }
    }
    Ok(axes)
}

/// Options of one scaling run.
#[derive(Clone, Debug)]
pub struct ScaleOptions {
    pub quick: bool,
    /// The results directory; the CSVs go to its `scaling/`.
    pub out: Option<PathBuf>,
    /// Override every point's rounds.
    pub repeats: Option<usize>,
    /// `--peak-rss`: the `promlab` binary to run each arm once in.
    pub peak_rss: Option<PathBuf>,
    pub progress: bool,
    /// Points whose x is above this are left out (a partial ladder).
    pub max_x: Option<f64>,
}

/// The measured arms of one point.
#[derive(Clone, Debug)]
pub struct PointResult {
    pub x: f64,
    pub params: Generator,
    pub units: (u64, &'static str),
    pub digest: String,
    pub expected_from: &'static str,
    pub arms: Vec<ArmResult>,
    /// Building the workload and its expected answer, in seconds.
    pub setup_secs: f64,
    pub load: Option<f64>,
}

/// The outcome of one axis.
#[derive(Clone, Debug)]
pub struct AxisResult {
    pub axis: String,
    pub stage: &'static str,
    pub x_name: String,
    pub size: &'static str,
    pub points: Vec<PointResult>,
    /// Points left out, with why.
    pub skipped: Vec<String>,
}

/// Where an expected answer comes from (see [`expected_answer`]).
fn expected_from(params: &Generator) -> &'static str {
    match params {
        Generator::RubyStore { .. } => "client_ruby's expected.prom",
        Generator::SeedRepro { .. } | Generator::Large { .. } | Generator::ManyMetrics { .. } => {
            "reference writer + reference exporter"
        }
        Generator::RubyClones { .. } => "reference exporter over the cloned client_ruby store",
        Generator::LongLabel { .. } => "reference writer's files",
        Generator::Rabbitmq { .. } => "reference renderer",
        Generator::AsapLanes { .. } => {
            "reference window rules + sketches-ddsketch (asap at the same size)"
        }
        Generator::Asap { .. }
        | Generator::AsapChurn { .. }
        | Generator::PrometheusCaptures { .. }
        | Generator::AsapQuery { .. } => "reference window rules + sketches-ddsketch",
    }
}

/// Why a point is left out on this machine, if it is.
fn skip_reason(point: &Point, cores: usize, max_x: Option<f64>) -> Option<String> {
    if let Generator::AsapLanes { lanes, .. } = point.params {
        if lanes > cores {
            return Some(format!(
                "{lanes} lanes: this machine gives the process {cores} cores (the model in the README extrapolates)"
            ));
        }
    }
    match max_x {
        Some(max) if point.x > max => Some(format!("x = {} is above --max-x {max}", point.x)),
        _ => None,
    }
}

/// Runs one axis: every point verified, then measured.
pub fn run_axis(axis: &Axis, options: &ScaleOptions) -> Result<AxisResult> {
    let ladder = axis.ladder(options.quick);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut result = AxisResult {
        axis: axis.name.clone(),
        stage: axis.stage(),
        x_name: axis.x.clone(),
        size: if options.quick { "quick" } else { "full" },
        points: Vec::new(),
        skipped: Vec::new(),
    };
    for point in &ladder.points {
        if let Some(why) = skip_reason(point, cores, options.max_x) {
            eprintln!("{}: skipped {}", axis.name, why);
            result.skipped.push(why);
            continue;
        }
        let repeats = options
            .repeats
            .or(point.repeats)
            .unwrap_or(ladder.repeats)
            .max(1);
        let point_result = run_point(axis, point, repeats, options)
            .with_context(|| format!("axis {}, {} = {}", axis.name, axis.x, point.x))?;
        println!("{}", point_table(axis, &point_result));
        result.points.push(point_result);
    }
    Ok(result)
}

fn run_point(
    axis: &Axis,
    point: &Point,
    repeats: usize,
    options: &ScaleOptions,
) -> Result<PointResult> {
    let label = format!("{} {}={}", axis.name, axis.x, point.x);
    let started = Instant::now();
    let load = crate::machine::LoadAverage::read().map(|l| l.0[0]);
    let stage = point.params.stage();
    let expected = expected_answer(&point.params).context("the expected answer")?;
    let mut workload = workloads::build(&point.params)?;
    workload.prepare_arms(StrategySet::all().restrict(stage))?;
    let setup_secs = started.elapsed().as_secs_f64();
    let all = StrategySet::all().restrict(stage);
    let arms: Vec<(String, StrategySet, ArmKind)> = all_arms(stage, all, workload.as_ref())
        .into_iter()
        // A stage of one strategy has no arm named `all`: that strategy alone is it.
        .map(|(name, set, kind)| {
            let is_all = kind == ArmKind::Strategies && set == all && !set.is_empty();
            (if is_all { "all".to_string() } else { name }, set, kind)
        })
        .filter(|(name, _, kind)| {
            name == "baseline"
                || name == "all"
                || *kind == ArmKind::Floor
                || axis.extra_arms.contains(name)
        })
        .collect();
    for wanted in &axis.extra_arms {
        if !arms.iter().any(|(name, _, _)| name == wanted) {
            bail!("the workload has no arm `{wanted}`");
        }
    }
    // 1. Every arm's first run: the expected answer, or a floor's units.
    let units = workload.units();
    let progress = Progress::new(options.progress, &label, arms.len() as u64, "verify");
    for arm @ (name, _, _) in &arms {
        let handled = match super::run_once(workload.as_mut(), arm)? {
            Output::Units(n) => Some(n),
            output => {
                let got = output.bytes()?;
                if *got != expected[..] {
                    bail!(
                        "`{name}` differs from the expected answer {}",
                        super::first_difference(&expected, &got, "expected", name)
                    );
                }
                None
            }
        };
        if let Some(n) = handled.filter(|&n| n != workload.units().0) {
            bail!("`{name}` handled {n} units, not {}", workload.units().0);
        }
        progress.inc();
    }
    progress.finish();
    // A render workload counts its lines once it has rendered.
    let units = if units.0 == 0 {
        workload.units()
    } else {
        units
    };
    // 2. Interleaved rounds.
    let mut measured = measure(
        &label,
        workload.as_mut(),
        &arms,
        repeats,
        &expected,
        options.progress,
    )?;
    drop(workload);
    let expected_digest = digest(&expected);
    // 3. Peak memory, each arm once in a child.
    if let Some(exe) = &options.peak_rss {
        for arm in &mut measured {
            arm.peak_rss_bytes = Some(rss::probe_params(
                exe,
                &point.params,
                &expected_digest,
                &arm.arm,
            )?);
        }
    }
    eprintln!(
        "{label}: {:.1} s (setup {setup_secs:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(PointResult {
        x: point.x,
        params: point.params.clone(),
        units,
        digest: expected_digest,
        expected_from: expected_from(&point.params),
        arms: measured,
        setup_secs,
        load,
    })
}

/// The terminal table of one point.
pub fn point_table(axis: &Axis, point: &PointResult) -> String {
    let (units, unit) = point.units;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{} ({}), {} = {}: {units} {unit} per run; every arm matched the expected answer {}… ({}); {} timed rounds; load {}",
        axis.name,
        axis.stage(),
        axis.x,
        point.x,
        &point.digest[..12],
        point.expected_from,
        point.arms.first().map_or(0, |a| a.samples.len()),
        point.load.map_or("?".to_string(), |l| format!("{l:.1}")),
    );
    let _ = writeln!(
        out,
        "  {:<16} {:>11} {:>11} {:>13} {:>13} {:>9}{}",
        "arm",
        "median",
        "cpu median",
        &format!("ns/{}", unit.trim_end_matches('s')),
        "cpu ns/unit",
        "÷ floor",
        report::rss_header(&point.arms)
    );
    for arm in &point.arms {
        let per = |ns: f64| ns / units.max(1) as f64;
        let _ = writeln!(
            out,
            "  {:<16} {:>11} {:>11} {:>13.1} {:>13.1} {:>9}{}",
            arm.arm,
            duration(arm.median().as_nanos() as f64),
            duration(arm.cpu_median().as_nanos() as f64),
            per(arm.median().as_nanos() as f64),
            per(arm.cpu_median().as_nanos() as f64),
            report::floor_cell(&point.arms, arm),
            report::rss_cell(arm),
        );
    }
    let label = format!("{} {}={}", axis.name, axis.x, point.x);
    for note in report::table_notes(&label, &point.arms) {
        let _ = writeln!(out, "  {note}");
    }
    out
}

/// The exponent `b` of `y ∝ xᵇ` by least squares on logs, over points with
/// positive x and y (`None` with fewer than two).
pub fn fit_exponent(points: &[(f64, f64)]) -> Option<f64> {
    let logs: Vec<(f64, f64)> = points
        .iter()
        .filter(|(x, y)| *x > 0.0 && *y > 0.0)
        .map(|(x, y)| (x.ln(), y.ln()))
        .collect();
    if logs.len() < 2 {
        return None;
    }
    let n = logs.len() as f64;
    let (mx, my) = (
        logs.iter().map(|p| p.0).sum::<f64>() / n,
        logs.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = logs.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = logs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// The local exponents between neighbouring points: where a curve bends.
pub fn local_exponents(points: &[(f64, f64)]) -> Vec<f64> {
    points
        .windows(2)
        .filter(|w| w[0].0 > 0.0 && w[1].0 > w[0].0 && w[0].1 > 0.0 && w[1].1 > 0.0)
        .map(|w| (w[1].1 / w[0].1).ln() / (w[1].0 / w[0].0).ln())
        .collect()
}

/// Per arm: its (x, median ns of a run) over the axis's points.
fn curves(result: &AxisResult) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut curves: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for point in &result.points {
        for arm in &point.arms {
            let y = arm.median().as_nanos() as f64;
            match curves.iter_mut().find(|(name, _)| *name == arm.arm) {
                Some((_, curve)) => curve.push((point.x, y)),
                None => curves.push((arm.arm.clone(), vec![(point.x, y)])),
            }
        }
    }
    curves
}

/// The fits of one axis: per arm, the exponent over every point and between
/// neighbours, and the widest ratio to its floor.
pub fn fits_table(result: &AxisResult) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{} ({}, {} size): cost of a run ∝ {}^b",
        result.axis, result.stage, result.size, result.x_name
    );
    let _ = writeln!(
        out,
        "  {:<16} {:>8}  {:<40} ÷ floor per point",
        "arm", "b (fit)", "b between neighbouring points"
    );
    for (arm, curve) in curves(result) {
        let ratios: Vec<String> = result
            .points
            .iter()
            .filter_map(|p| {
                let a = p.arms.iter().find(|a| a.arm == arm)?;
                (a.kind != ArmKind::Floor)
                    .then(|| report::ratio_to_floor(&p.arms, a))
                    .flatten()
                    .map(|r| format!("{r:.2}"))
            })
            .collect();
        let _ = writeln!(
            out,
            "  {:<16} {:>8}  {:<40} {}",
            arm,
            fit_exponent(&curve).map_or("–".to_string(), |b| format!("{b:.2}")),
            local_exponents(&curve)
                .iter()
                .map(|b| format!("{b:.2}"))
                .collect::<Vec<_>>()
                .join(" → "),
            ratios.join(" ")
        );
    }
    if let Some(model) = lanes_model(result) {
        out.push_str(&model);
    }
    for skipped in &result.skipped {
        let _ = writeln!(out, "  skipped: {skipped}");
    }
    out
}

/// The lanes axis on paper: from the measured throughputs, Amdahl's serial
/// share `s` (what does not run in parallel: window closes that merge every
/// lane, contention for memory), and the speed-up it predicts at 4–16 lanes.
fn lanes_model(result: &AxisResult) -> Option<String> {
    if result.x_name != "lanes" {
        return None;
    }
    let time_of = |lanes: f64| {
        let point = result.points.iter().find(|p| p.x == lanes)?;
        let all = point.arms.iter().find(|a| a.arm == "all")?;
        Some(all.median().as_secs_f64())
    };
    let one = time_of(1.0)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  lanes model (all): speed-up over one lane, measured, and Amdahl's with the serial share fitted at the most lanes measured:"
    );
    let most = result.points.iter().map(|p| p.x).fold(1.0, f64::max);
    let speedup_most = one / time_of(most)?;
    // S(n) = 1 / (s + (1 - s)/n)  ⇒  s = (n/S - 1) / (n - 1).
    let serial = if most > 1.0 {
        ((most / speedup_most - 1.0) / (most - 1.0)).clamp(0.0, 1.0)
    } else {
        0.0
    };
    for point in &result.points {
        if let Some(t) = time_of(point.x) {
            let _ = write!(out, "    {:>2} lanes: {:.2}× measured", point.x, one / t);
            // The same run's one-lane arm, measured in the same rounds.
            let side_by_side = point
                .arms
                .iter()
                .find(|a| a.arm == super::workloads::ONE_LANE)
                .zip(point.arms.iter().find(|a| a.arm == "all"));
            match side_by_side {
                Some((one_lane, all)) => {
                    let _ = writeln!(
                        out,
                        "; {:.2}× `{}` in the same rounds",
                        report::paired_ratio(one_lane, all),
                        super::workloads::ONE_LANE
                    );
                }
                None => out.push('\n'),
            }
        }
    }
    let _ = writeln!(out, "    serial share s = {serial:.3}");
    for n in [4.0, 8.0, 16.0] {
        let _ = writeln!(
            out,
            "    {n:>2} lanes: {:.2}× on paper",
            1.0 / (serial + (1.0 - serial) / n)
        );
    }
    Some(out)
}

/// The columns of `<out>/scaling/<axis>.csv`; see `experiments/README.md`.
pub const CSV_HEADER: &str = "axis,stage,size,x_name,x,arm,strategies,floor_arm,repeats,median_ns,min_ns,p25_ns,p75_ns,max_ns,cpu_median_ns,units,unit,ns_per_unit,cpu_ns_per_unit,ratio_to_floor,peak_rss_bytes,digest,expected_from,params,setup_secs,load_1m,runs_per_sample";

/// One row of a scaling CSV.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScaleRow {
    pub axis: String,
    pub stage: String,
    pub size: String,
    pub x_name: String,
    pub x: f64,
    pub arm: String,
    pub strategies: String,
    pub floor_arm: String,
    pub repeats: u64,
    pub median_ns: u64,
    pub min_ns: u64,
    pub p25_ns: u64,
    pub p75_ns: u64,
    pub max_ns: u64,
    pub cpu_median_ns: u64,
    pub units: u64,
    pub unit: String,
    pub ns_per_unit: f64,
    pub cpu_ns_per_unit: f64,
    pub ratio_to_floor: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    pub digest: String,
    pub expected_from: String,
    /// The point's generator parameters, as JSON.
    pub params: String,
    pub setup_secs: f64,
    pub load_1m: Option<f64>,
    /// How many back-to-back runs each sample timed (`harness::measure`; 1
    /// in runs before samples were).
    #[serde(default = "report::one")]
    pub runs_per_sample: u32,
}

pub fn rows(result: &AxisResult) -> Result<Vec<ScaleRow>> {
    let mut rows = Vec::new();
    for point in &result.points {
        for arm in &point.arms {
            let units = arm.units.0.max(1) as f64;
            let nanos = |d: std::time::Duration| d.as_nanos() as u64;
            rows.push(ScaleRow {
                axis: result.axis.clone(),
                stage: result.stage.to_string(),
                size: result.size.to_string(),
                x_name: result.x_name.clone(),
                x: point.x,
                arm: arm.arm.clone(),
                strategies: match arm.kind {
                    ArmKind::Floor => FLOOR.to_string(),
                    _ => arm.strategies.to_string(),
                },
                floor_arm: arm.floor.clone(),
                repeats: arm.samples.len() as u64,
                median_ns: nanos(arm.median()),
                min_ns: nanos(arm.quantile(0.0)),
                p25_ns: nanos(arm.quantile(0.25)),
                p75_ns: nanos(arm.quantile(0.75)),
                max_ns: nanos(arm.quantile(1.0)),
                cpu_median_ns: nanos(arm.cpu_median()),
                units: arm.units.0,
                unit: arm.units.1.to_string(),
                ns_per_unit: arm.median().as_nanos() as f64 / units,
                cpu_ns_per_unit: arm.cpu_median().as_nanos() as f64 / units,
                ratio_to_floor: report::ratio_to_floor(&point.arms, arm),
                peak_rss_bytes: arm.peak_rss_bytes,
                digest: point.digest.clone(),
                expected_from: point.expected_from.to_string(),
                params: serde_json::to_string(&point.params)?,
                setup_secs: point.setup_secs,
                load_1m: point.load,
                runs_per_sample: arm.runs_per_sample,
            });
        }
    }
    Ok(rows)
}

/// Writes `dir/<axis>.csv`.
pub fn write_csv(dir: &Path, result: &AxisResult) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(format!("{}.csv", result.axis));
    let mut writer = csv::Writer::from_path(&path)?;
    let rows = rows(result)?;
    if rows.is_empty() {
        writer.write_record(CSV_HEADER.split(','))?;
    }
    for row in rows {
        writer.serialize(row)?;
    }
    writer.flush()?;
    Ok(path)
}

/// Reads a scaling CSV.
pub fn read_rows(input: impl std::io::Read) -> Result<Vec<ScaleRow>> {
    csv::Reader::from_reader(input)
        .deserialize()
        .enumerate()
        .map(|(i, row)| row.with_context(|| format!("row {}", i + 1)))
        .collect()
}

/// Runs the axes and writes their CSVs into `<out>/scaling/`.
pub fn scale(axes: &[Axis], options: &ScaleOptions) -> Result<Vec<AxisResult>> {
    let load_at_start = report::run_started();
    let out = options
        .out
        .clone()
        .unwrap_or_else(report::default_results_dir)
        .join("scaling");
    let mut results = Vec::new();
    for axis in axes {
        let result = run_axis(axis, options)?;
        println!("{}", fits_table(&result));
        let path = write_csv(&out, &result)?;
        println!("wrote {}", path.display());
        results.push(result);
    }
    let ablate_like = super::AblateOptions {
        quick: options.quick,
        only: None,
        out: None,
        repeats: options.repeats,
        print_digests: false,
        progress: false,
        peers: false,
        with_clickhouse: false,
        peak_rss: options.peak_rss.clone(),
    };
    report::write_machine(&out, &ablate_like, load_at_start)?;
    println!("results: {}", out.display());
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_axes_load_and_climb() {
        for (name, _) in BUILT_IN {
            let axis = load_axis(name).unwrap();
            assert_eq!(axis.name, name);
            assert!(
                axis.full.points.len() >= axis.quick.points.len().min(3),
                "{name}"
            );
            // The full ladder reaches at least as far as the quick one.
            let top = |l: &Ladder| l.points.last().unwrap().x;
            assert!(top(&axis.full) >= top(&axis.quick), "{name}");
            for arm in &axis.extra_arms {
                let mut params = axis.quick.points[0].params.clone();
                shrink(&mut params);
                let workload = workloads::build(&params).unwrap();
                assert!(
                    workload
                        .extra_arms(StrategySet::all().restrict(params.stage()))
                        .iter()
                        .any(|(n, _, _)| n == arm),
                    "{name}: {arm}"
                );
            }
        }
        let stages: Vec<&str> = BUILT_IN
            .map(|(n, _)| load_axis(n).unwrap().stage())
            .to_vec();
        for stage in ["export", "render", "ingest", "query"] {
            assert!(stages.contains(&stage), "{stage}");
        }
        assert!(select(&["nope".to_string()]).is_err());
        let ingest = select(&["ingest".to_string(), "ingest-lanes".to_string()]).unwrap();
        assert!(ingest.iter().all(|a| a.stage() == "ingest"));
        assert_eq!(ingest.len(), 3);
    }

    /// A point's parameters at a size a test runs in a moment.
    fn shrink(params: &mut Generator) {
        match params {
            Generator::AsapQuery { groups, ticks, .. } => {
                *groups = 3;
                *ticks = 66;
            }
            Generator::Asap { groups, ticks, .. } | Generator::AsapChurn { groups, ticks, .. } => {
                *groups = 3;
                *ticks = 3;
            }
            _ => {}
        }
    }

    #[test]
    fn exponents_fit_power_laws_and_find_the_bend() {
        let line: Vec<(f64, f64)> = [1.0, 10.0, 100.0].iter().map(|&x| (x, 3.0 * x)).collect();
        assert!((fit_exponent(&line).unwrap() - 1.0).abs() < 1e-12);
        let square: Vec<(f64, f64)> = [2.0, 4.0, 8.0].iter().map(|&x| (x, x * x)).collect();
        assert!((fit_exponent(&square).unwrap() - 2.0).abs() < 1e-12);
        // Flat, then linear: the local exponents say where it bends.
        let bent = [(1.0, 10.0), (10.0, 10.0), (100.0, 100.0)];
        let local = local_exponents(&bent);
        assert!(local[0].abs() < 1e-12 && (local[1] - 1.0).abs() < 1e-12);
        assert_eq!(fit_exponent(&[(1.0, 1.0)]), None);
    }

    /// A small axis end to end: every arm verified and measured, the CSV
    /// written and read back, the floors named.
    #[test]
    fn a_small_query_axis_runs_and_writes_its_csv() {
        let axis: Axis = toml::from_str(
            r#"
name = "tiny"
description = "d"
x = "groups"
extra_arms = ["all-uncached"]
[quick]
repeats = 2
points = [
  { x = 2, params = { generator = "asap-query", groups = 2, series_per_group = 2, ticks = 66 } },
  { x = 4, params = { generator = "asap-query", groups = 4, series_per_group = 2, ticks = 66 } },
]
[full]
repeats = 1
points = [{ x = 2, params = { generator = "asap-query", groups = 2, series_per_group = 2, ticks = 66 } }]
"#,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let options = ScaleOptions {
            quick: true,
            out: Some(dir.path().to_path_buf()),
            repeats: None,
            peak_rss: None,
            progress: false,
            max_x: None,
        };
        let results = scale(&[axis], &options).unwrap();
        let arms: Vec<&str> = results[0].points[0]
            .arms
            .iter()
            .map(|a| a.arm.as_str())
            .collect();
        assert_eq!(
            arms,
            ["baseline", "all", "all-uncached", "floor-uncached", "floor"]
        );
        let text = std::fs::read_to_string(dir.path().join("scaling/tiny.csv")).unwrap();
        assert_eq!(text.lines().next(), Some(CSV_HEADER));
        let rows = read_rows(text.as_bytes()).unwrap();
        assert_eq!(rows.len(), 10);
        let uncached = rows.iter().find(|r| r.arm == "all-uncached").unwrap();
        assert_eq!(uncached.floor_arm, "floor-uncached");
        assert!(rows
            .iter()
            .all(|r| r.repeats == 2 && r.ratio_to_floor.is_some()));
        assert!(dir.path().join("scaling/machine.txt").is_file());
    }
}
