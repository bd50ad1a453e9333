//! What an ablation run leaves behind: a terminal table, a CSV per scenario and
//! `machine.txt`. The columns are documented in `experiments/README.md`.

use super::{AblateOptions, ArmKind, ArmResult, Input, ScenarioResult};
use crate::machine::{self, Host, LoadAverage};
use anyhow::{Context, Result};
use promlab::shared::strategy::StrategySet;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A progress bar on stderr, or nothing.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    /// Without a terminal, a line when a phase starts and one when it ends.
    plain: Option<(String, std::time::Instant)>,
}

impl Progress {
    pub fn new(enabled: bool, scenario: &str, total: u64, phase: &str) -> Progress {
        if !enabled {
            let label = format!("{scenario}: {phase}");
            eprintln!("{label}: {total} runs…");
            return Progress {
                bar: None,
                plain: Some((label, std::time::Instant::now())),
            };
        }
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix:>22} {msg:8} [{bar:30}] {pos}/{len} {elapsed}",
            )
            .expect("template")
            .progress_chars("=> "),
        );
        bar.set_prefix(scenario.to_string());
        bar.set_message(phase.to_string());
        Progress {
            bar: Some(bar),
            plain: None,
        }
    }

    pub fn inc(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if let Some((label, started)) = &self.plain {
            eprintln!("{label}: done in {:.1} s", started.elapsed().as_secs_f64());
        }
    }
}

/// `experiments/results/<date>-<host>/`.
/// `experiments/results/<date>T<time>Z-<host>-<revision>/`: a fresh directory per
/// run, so a run never writes over results (committed ones are added deliberately).
pub fn default_results_dir() -> PathBuf {
    let host = Host::read().hostname.unwrap_or_else(|| "host".into());
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        .to_string()
        .replace(':', "");
    let revision = env!("PROMLAB_GIT_REVISION");
    PathBuf::from("experiments/results").join(format!("{stamp}-{host}-{revision}"))
}

fn human(d: Duration) -> String {
    super::format::duration(d.as_nanos() as f64)
}

/// The baseline reading `input`: the arm of no strategy on it (not a floor).
fn baseline_on(result: &ScenarioResult, input: Input) -> Option<&ArmResult> {
    result.arms.iter().find(|a| {
        matches!(a.kind, ArmKind::Strategies | ArmKind::Extra)
            && a.input == input
            && a.strategies.is_empty()
    })
}

/// promlab reading `input`: the arm with the most strategies on it, the
/// first of equals (a strategy arm before another path with as many: `all`
/// before the query's `http`).
fn promlab_on(result: &ScenarioResult, input: Input) -> Option<&ArmResult> {
    let mut best: Option<&ArmResult> = None;
    for arm in &result.arms {
        let counts = matches!(arm.kind, ArmKind::Strategies | ArmKind::Extra) && arm.input == input;
        if counts
            && best.is_none_or(|b| arm.strategies.iter().count() > b.strategies.iter().count())
        {
            best = Some(arm);
        }
    }
    best
}

/// What the peers of a stage read: an export peer the store as written
/// (its own files, written as its client writes them), never a folded one.
fn peer_input(stage: promlab::shared::strategy::Stage) -> Input {
    match stage {
        promlab::shared::strategy::Stage::Export => Input::AsWritten,
        _ => Input::One,
    }
}

/// The floor arm named `name` among `arms`.
fn floor_named<'a>(arms: &'a [ArmResult], name: &str) -> Option<&'a ArmResult> {
    arms.iter()
        .find(|a| a.kind == ArmKind::Floor && a.arm == name)
}

/// An arm's time ÷ the floor's it is held to, same run ([`paired_ratio`]).
pub fn ratio_to_floor(arms: &[ArmResult], arm: &ArmResult) -> Option<f64> {
    let floor = floor_named(arms, &arm.floor)?;
    Some(paired_ratio(arm, floor))
}

/// `arm`'s time ÷ `to`'s: round by round (each round runs every arm once, so
/// a round's two samples met the same state of a shared host), the median of
/// those ratios. The ratio of the two medians lets a slow spell that comes
/// and goes over a run land in one arm's median and not the other's. Arms of
/// unequal rounds (none the harness makes) fall back to the ratio of medians.
pub fn paired_ratio(arm: &ArmResult, to: &ArmResult) -> f64 {
    if arm.samples.len() != to.samples.len() || arm.samples.is_empty() {
        return arm.median().as_secs_f64() / to.median().as_secs_f64();
    }
    let mut ratios: Vec<f64> = arm
        .samples
        .iter()
        .zip(&to.samples)
        .map(|(a, b)| a.as_secs_f64() / b.as_secs_f64())
        .collect();
    ratios.sort_by(f64::total_cmp);
    // The middle one, or the mean of the middle two.
    let n = ratios.len();
    (ratios[(n - 1) / 2] + ratios[n / 2]) / 2.0
}

/// Below this many times its floor an arm is a finding, not noise: either the
/// floor is not the least work its contract allows, or the arm skips work the
/// contract requires.
pub const BELOW_FLOOR: f64 = 0.95;

/// The arms (not floors) that measured below [`BELOW_FLOOR`] × their floor,
/// each with its ratio.
pub fn below_floor(arms: &[ArmResult]) -> Vec<(&ArmResult, f64)> {
    arms.iter()
        .filter(|a| a.kind != ArmKind::Floor)
        .filter_map(|a| Some((a, ratio_to_floor(arms, a)?)))
        .filter(|(_, ratio)| *ratio < BELOW_FLOOR)
        .collect()
}

/// The lines that report [`below_floor`]'s arms (none when there are none).
pub fn below_floor_lines(label: &str, arms: &[ArmResult]) -> Vec<String> {
    below_floor(arms)
        .into_iter()
        .map(|(arm, ratio)| {
            format!(
                "FINDING {label}: `{}` measured {ratio:.2}× its floor `{}` (below {BELOW_FLOOR}×: \
                 more than noise; the floor is not the least work of its contract, or the arm \
                 skips work)",
                arm.arm, arm.floor
            )
        })
        .collect()
}

/// An arm's name in the terminal table.
fn label(arm: &ArmResult) -> String {
    let plain = arm.kind != ArmKind::Strategies
        || arm.arm == "all"
        || arm.arm == "baseline"
        || arm.arm.starts_with("all-");
    if plain {
        arm.arm.clone()
    } else {
        format!("{} alone", arm.arm)
    }
}

/// An arm's `÷ floor` cell in a terminal table: its ratio to the floor it is
/// held to, marked `!` below [`BELOW_FLOOR`] and `'` when that floor is
/// another contract's (a floor's own cell, 1.00×, is not marked).
pub fn floor_cell(arms: &[ArmResult], arm: &ArmResult) -> String {
    ratio_to_floor(arms, arm).map_or("–".to_string(), |r| {
        let mark = match arm.kind {
            ArmKind::Floor => "",
            _ if r < BELOW_FLOOR => "!",
            _ if arm.floor != super::FLOOR => "'",
            _ => "",
        };
        format!("{r:.2}×{mark}")
    })
}

/// The header of a terminal table's peak-RSS column, when any arm has one.
pub fn rss_header(arms: &[ArmResult]) -> &'static str {
    if arms.iter().any(|a| a.peak_rss_bytes.is_some()) {
        "   peak RSS"
    } else {
        ""
    }
}

/// An arm's peak-RSS cell in a terminal table (empty when not measured).
pub fn rss_cell(arm: &ArmResult) -> String {
    arm.peak_rss_bytes
        .map_or(String::new(), |b| format!(" {:>12}", super::format::mib(b)))
}

/// The lines under a terminal table: the other contracts' floors its `'`
/// marks, and the arms below their floor.
pub fn table_notes(label: &str, arms: &[ArmResult]) -> Vec<String> {
    let contract_floors: Vec<&str> = arms
        .iter()
        .filter(|a| a.kind == ArmKind::Floor && a.arm != super::FLOOR)
        .map(|a| a.arm.as_str())
        .collect();
    let mut notes = Vec::new();
    if !contract_floors.is_empty() {
        notes.push(format!(
            "(' : ÷ its own contract's floor, {})",
            contract_floors.join(", ")
        ));
    }
    notes.extend(
        below_floor_lines(label, arms)
            .into_iter()
            .map(|l| format!("! {l}")),
    );
    notes
}

/// The terminal table of one scenario: every ratio between arms reading
/// the same input ([`Input`]).
pub fn table(result: &ScenarioResult) -> String {
    let (units, unit) = result.units;
    let mut out = String::new();
    let others = match result.others_verified {
        0 => String::new(),
        n => format!(" (and the first run of {n} other arms)"),
    };
    let _ = writeln!(
        out,
        "\n{} ({}, {} size): {} {unit} per run; all {} combinations{others} matched the scenario's \
         expected digest {}…; {} timed rounds after a warm-up",
        result.scenario,
        result.stage,
        result.size,
        units,
        result.combinations_verified,
        &result.digest[..12],
        result.arms.first().map_or(0, |arm| arm.samples.len())
    );
    let inputs = result.arms.iter().any(|a| a.input != Input::One);
    let _ = writeln!(
        out,
        "  {:<34} {:<10} {:>11} {:>11} {:>11} {:>15} {:>9} {:>9}{}",
        "arm",
        if inputs { "reads" } else { "" },
        "median",
        "min",
        "max",
        format!("ns/{}", unit.trim_end_matches('s')),
        "speed-up",
        "÷ floor",
        rss_header(&result.arms)
    );
    for arm in &result.arms {
        let median = arm.median();
        let speedup = match (arm.kind, baseline_on(result, arm.input)) {
            (ArmKind::Upkeep, _) | (_, None) => "–".to_string(),
            (_, Some(base)) => {
                format!("{:.2}×", base.median().as_secs_f64() / median.as_secs_f64())
            }
        };
        let _ = writeln!(
            out,
            "  {:<34} {:<10} {:>11} {:>11} {:>11} {:>15} {:>9} {:>9}{}",
            label(arm),
            arm.input.name(),
            human(median),
            human(arm.quantile(0.0)),
            human(arm.quantile(1.0)),
            per_unit_cell(arm, unit),
            speedup,
            floor_cell(&result.arms, arm),
            rss_cell(arm),
        );
    }
    let _ = writeln!(
        out,
        "  (speed-up: the baseline reading the same input ÷ the arm; ÷ floor: the arm ÷ the floor of what it reads)"
    );
    for note in table_notes(&result.scenario, &result.arms) {
        let _ = writeln!(out, "  {note}");
    }
    if !result.peers.is_empty() || !result.peers_skipped.is_empty() {
        peers_table(&mut out, result);
    }
    out
}

/// An arm's time per unit: of the scenario's unit, or, for an arm that
/// counts its own (the fold: files), with that unit named.
fn per_unit_cell(arm: &ArmResult, unit: &str) -> String {
    let per_unit = arm.median().as_nanos() as f64 / arm.units.0.max(1) as f64;
    if arm.units.1 == unit {
        format!("{per_unit:.1}")
    } else {
        format!("{per_unit:.1}/{}", arm.units.1.trim_end_matches('s'))
    }
}

/// The peers' lines of the terminal table: each compared, per unit, with
/// promlab's baseline and promlab reading what the peer reads.
fn peers_table(out: &mut String, result: &ScenarioResult) {
    let input = peer_input(result.stage);
    let per_unit = |arm: Option<&ArmResult>| {
        arm.map(|a| a.median().as_nanos() as f64 / a.units.0.max(1) as f64)
    };
    let (base, ours) = (
        per_unit(baseline_on(result, input)),
        promlab_on(result, input),
    );
    let ours_per_unit = per_unit(ours);
    let _ = writeln!(
        out,
        "  peers (per unit, against promlab reading what they read{}):",
        ours.map_or(String::new(), |a| format!(": `{}`", a.arm))
    );
    for peer in &result.peers {
        let per_unit = peer.ns_per_unit();
        let versus =
            |ours: Option<f64>| ours.map_or("–".to_string(), |o| format!("{:.1}×", per_unit / o));
        let _ = writeln!(
            out,
            "  {:<34} {:<10} {:>11} {:>11} {:>11} {:>15.1}  ({} time, {} {}/run{}; promlab {} faster, its baseline {})",
            peer.arm,
            input.name(),
            human(peer.median()),
            human(peer.quantile(0.0)),
            human(peer.quantile(1.0)),
            per_unit,
            peer.measure.name(),
            peer.units.0,
            peer.units.1,
            peer.rss_kib.map_or(String::new(), |k| format!(", RSS {:.1} MiB", k as f64 / 1024.0)),
            versus(ours_per_unit),
            versus(base),
        );
        let _ = writeln!(out, "  {:<34} {}", "", peer.note);
    }
    for skipped in &result.peers_skipped {
        let _ = writeln!(out, "  skipped {skipped}");
    }
}

/// The CSV header; see `experiments/README.md`. `notebooks/ablation.ipynb`
/// reads the columns by name; keep their names and order.
pub const CSV_HEADER: &str = "scenario,stage,size,arm,strategies,repeats,median_ns,min_ns,p25_ns,p75_ns,max_ns,units,unit,ns_per_unit,speedup_vs_baseline,digest,measure,rss_kib,ratio_to_all,ratio_to_floor,peak_rss_bytes,floor_arm,runs_per_sample,reads,cpu_median_ns";

/// One row of a results CSV, field for column in [`CSV_HEADER`]'s order.
/// Older results lack the later columns: `measure` reads as `wall`, the
/// others as empty (as does an empty ratio, which pandas may leave behind),
/// and a row without `reads` reads what [`ResultRow::input`] derives.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResultRow {
    pub scenario: String,
    pub stage: String,
    pub size: String,
    pub arm: String,
    /// The arm's strategy set (`none`, `key-cache,increment-once`, …), or
    /// `floor`, `upkeep` (the fold) or `peer`.
    pub strategies: String,
    pub repeats: u64,
    pub median_ns: u64,
    pub min_ns: u64,
    pub p25_ns: u64,
    pub p75_ns: u64,
    pub max_ns: u64,
    pub units: u64,
    pub unit: String,
    #[serde(serialize_with = "three_decimals")]
    pub ns_per_unit: f64,
    /// The baseline reading the same input ÷ this arm (per unit for a
    /// peer); empty for the fold, and where that baseline was not measured.
    #[serde(default, serialize_with = "four_decimals_or_empty")]
    pub speedup_vs_baseline: Option<f64>,
    /// The SHA-256 of the arm's output; empty for a peer (another format).
    pub digest: String,
    #[serde(default = "wall")]
    pub measure: String,
    #[serde(default)]
    pub rss_kib: Option<u64>,
    /// This arm ÷ promlab reading the same input, per unit (`all`, or
    /// `as-written` on the store as written); empty for the fold.
    #[serde(default, serialize_with = "four_decimals_or_empty")]
    pub ratio_to_all: Option<f64>,
    /// The arm's time ÷ the floor arm's, same run: the median of the rounds'
    /// ratios ([`paired_ratio`]; per unit, medians, for a peer).
    #[serde(default, serialize_with = "four_decimals_or_empty")]
    pub ratio_to_floor: Option<f64>,
    /// `--peak-rss`: the arm's own peak resident memory, in bytes (`harness::rss`).
    #[serde(default)]
    pub peak_rss_bytes: Option<u64>,
    /// The floor arm `ratio_to_floor` is to: the stage's (`floor`), or the
    /// floor of another contract the arm keeps or input it reads (empty for
    /// the fold, and in runs before floors were named: the stage's).
    #[serde(default)]
    pub floor_arm: String,
    /// How many back-to-back runs each sample timed (`harness::measure`;
    /// 1 for a peer, and in runs before samples were: one run each).
    #[serde(default = "one")]
    pub runs_per_sample: u32,
    /// What the arm read: `as-written` or `folded` (export), empty where the
    /// stage has one input ([`Input`]).
    #[serde(default)]
    pub reads: Option<String>,
    /// The median CPU time of one run of this process, every thread (empty
    /// for a peer, whose CPU is in `median_ns` when `measure` is `cpu`).
    #[serde(default)]
    pub cpu_median_ns: Option<u64>,
}

impl ResultRow {
    /// What the arm read: its `reads`, or, in results written before that
    /// column, what the harness then read for it (an export arm the folded
    /// copy when its set has `fold-exited` or it is `floor-folded`).
    pub fn input(&self) -> Input {
        if let Some(input) = self.reads.as_deref().and_then(Input::parse) {
            return input;
        }
        if self.stage != promlab::shared::strategy::Stage::Export.name() {
            return Input::One;
        }
        match self.set() {
            Some(set) => Input::of_export_set(set),
            None if self.arm == "floor-folded" => Input::Folded,
            None => Input::AsWritten,
        }
    }

    /// The arm's strategy set; `None` for a floor, the fold or a peer.
    pub fn set(&self) -> Option<StrategySet> {
        self.strategies.parse().ok()
    }
}

/// The serde default of `runs_per_sample` in results written before it.
pub(super) fn one() -> u32 {
    1
}

fn wall() -> String {
    "wall".to_string()
}

fn three_decimals<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{v:.3}"))
}

fn four_decimals<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{v:.4}"))
}

fn four_decimals_or_empty<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => four_decimals(v, s),
        None => s.serialize_none(),
    }
}

/// A row of `result` for a timed arm or peer: what it is, its samples'
/// spread and its units; the ratios and the rest are the caller's.
fn timed_row(
    result: &ScenarioResult,
    arm: &str,
    strategies: String,
    samples: &[Duration],
    (units, unit): (u64, &str),
) -> ResultRow {
    let [median_ns, min_ns, p25_ns, p75_ns, max_ns] =
        [0.5, 0.0, 0.25, 0.75, 1.0].map(|q| super::quantile(samples, q).as_nanos() as u64);
    ResultRow {
        scenario: result.scenario.clone(),
        stage: result.stage.to_string(),
        size: result.size.to_string(),
        arm: arm.to_string(),
        strategies,
        repeats: samples.len() as u64,
        median_ns,
        min_ns,
        p25_ns,
        p75_ns,
        max_ns,
        units,
        unit: unit.to_string(),
        ns_per_unit: median_ns as f64 / units.max(1) as f64,
        measure: "wall".to_string(),
        runs_per_sample: 1,
        ..ResultRow::default()
    }
}

/// The rows of one scenario: promlab's arms, then the peers. Every ratio is
/// between rows reading the same input.
pub fn csv_rows(result: &ScenarioResult) -> Vec<ResultRow> {
    let per_unit = |arm: &ArmResult| arm.median().as_nanos() as f64 / arm.units.0.max(1) as f64;
    let reads = |input: Input| Some(input.name().to_string()).filter(|r| !r.is_empty());
    let mut rows = Vec::new();
    for arm in &result.arms {
        // The fold is not a run of the stage: compared with no arm.
        let compared = arm.kind != ArmKind::Upkeep;
        let strategies = match arm.kind {
            ArmKind::Floor => "floor".to_string(),
            ArmKind::Upkeep => "upkeep".to_string(),
            _ => arm.strategies.to_string(),
        };
        rows.push(ResultRow {
            speedup_vs_baseline: baseline_on(result, arm.input)
                .filter(|_| compared)
                .map(|base| base.median().as_secs_f64() / arm.median().as_secs_f64()),
            digest: result.digest.clone(),
            ratio_to_all: promlab_on(result, arm.input)
                .filter(|_| compared)
                .map(|all| per_unit(arm) / per_unit(all)),
            ratio_to_floor: ratio_to_floor(&result.arms, arm),
            peak_rss_bytes: arm.peak_rss_bytes,
            floor_arm: arm.floor.clone(),
            runs_per_sample: arm.runs_per_sample,
            reads: reads(arm.input),
            cpu_median_ns: Some(arm.cpu_median().as_nanos() as u64),
            ..timed_row(result, &arm.arm, strategies, &arm.samples, arm.units)
        });
    }
    // Peer rows: per-unit ratios, since a peer counts its own units, each to
    // promlab's arms reading what the peer reads; no digest, since a peer's
    // output is another format (each peer checks its answers).
    let input = peer_input(result.stage);
    let base = baseline_on(result, input).map(per_unit);
    let all = promlab_on(result, input).map(per_unit);
    let floor = floor_named(&result.arms, super::FLOOR).map(per_unit);
    for peer in &result.peers {
        let ns_per_unit = peer.ns_per_unit();
        let units = (peer.units.0, peer.units.1.as_str());
        rows.push(ResultRow {
            // A peer's median is its own (the lower of two middle samples).
            median_ns: peer.median().as_nanos() as u64,
            ns_per_unit,
            speedup_vs_baseline: base.map(|b| b / ns_per_unit),
            measure: peer.measure.name().to_string(),
            rss_kib: peer.rss_kib,
            ratio_to_all: all.map(|a| ns_per_unit / a),
            ratio_to_floor: floor.map(|f| ns_per_unit / f),
            floor_arm: super::FLOOR.to_string(),
            reads: reads(input),
            ..timed_row(result, &peer.arm, "peer".to_string(), &peer.samples, units)
        });
    }
    rows
}

/// Writes `rows` as a results CSV, header first.
pub fn write_rows(out: impl std::io::Write, rows: &[ResultRow]) -> Result<()> {
    let mut writer = csv::Writer::from_writer(out);
    if rows.is_empty() {
        writer.write_record(CSV_HEADER.split(','))?;
    }
    for row in rows {
        writer.serialize(row)?;
    }
    writer.flush()?;
    Ok(())
}

/// Reads a results CSV (columns by name, in any order).
pub fn read_rows(input: impl std::io::Read) -> Result<Vec<ResultRow>> {
    csv::Reader::from_reader(input)
        .deserialize()
        .enumerate()
        .map(|(i, row)| row.with_context(|| format!("row {}", i + 1)))
        .collect()
}

/// Writes `<dir>/<scenario>.csv`.
pub fn write_csv(dir: &Path, result: &ScenarioResult) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut csv = Vec::new();
    write_rows(&mut csv, &csv_rows(result))?;
    let path = dir.join(format!("{}.csv", result.scenario));
    std::fs::write(&path, csv).with_context(|| format!("cannot write {}", path.display()))
}

/// The load average when the run began, for `machine.txt`.
pub fn run_started() -> Option<LoadAverage> {
    LoadAverage::read()
}

/// Writes `<dir>/machine.txt`: what the figures were measured on and with,
/// and how busy the machine was as the run began and ended.
pub fn write_machine(
    dir: &Path,
    options: &AblateOptions,
    load_at_start: Option<LoadAverage>,
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let host = Host::read();
    let build = machine::BUILD;
    let unknown = || "unknown".to_string();
    let features: Vec<&str> = promlab::shared::strategy::Strategy::ALL
        .iter()
        .filter(|s| s.on_by_default())
        .map(|s| s.name())
        .collect();
    let load = |l: Option<LoadAverage>| l.map_or_else(unknown, |l| l.to_string());
    let text = format!(
        "cpu: {}\ncores: {}\nmemory: {}\nkernel: {}\nrustc: {}\ntarget: {}\nprofile: {} (opt-level {})\ncompiled features: {}\nstrategy set: {}\nsize: {}\ngit revision: {}\nload average at start (1, 5, 15 min): {}\nload average at end (1, 5, 15 min): {}\ndate: {}\nhost: {}\n",
        host.cpu.unwrap_or_else(unknown),
        host.cores,
        host.memory_kib.map_or_else(unknown, |k| format!("MemTotal: {k} kB")),
        host.kernel.unwrap_or_else(unknown),
        build.rustc,
        build.target,
        build.profile,
        build.opt_level,
        if features.is_empty() { "none".to_string() } else { features.join(",") },
        options.only.map_or("all of each stage".to_string(), |s| s.to_string()),
        if options.quick { "quick" } else { "full" },
        build.git_revision,
        load(load_at_start),
        load(LoadAverage::read()),
        machine::utc_now(),
        host.hostname.unwrap_or_default(),
    );
    std::fs::write(dir.join("machine.txt"), text)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(arm: &str) -> ResultRow {
        ResultRow {
            scenario: "seed-repro".to_string(),
            stage: "export".to_string(),
            size: "quick".to_string(),
            arm: arm.to_string(),
            strategies: "single-read,decode-once".to_string(),
            repeats: 3,
            median_ns: 1_234_567,
            min_ns: 1_000_000,
            p25_ns: 1_100_000,
            p75_ns: 1_300_000,
            max_ns: 1_400_000,
            units: 2100,
            unit: "lines".to_string(),
            ns_per_unit: 587.889,
            speedup_vs_baseline: Some(1.5),
            digest: "0f59dbe0".to_string(),
            measure: "wall".to_string(),
            rss_kib: Some(4096),
            ratio_to_all: Some(1.25),
            ratio_to_floor: Some(3.5),
            peak_rss_bytes: Some(1 << 20),
            floor_arm: "floor".to_string(),
            runs_per_sample: 4,
            reads: Some("as-written".to_string()),
            cpu_median_ns: Some(1_200_000),
        }
    }

    #[test]
    fn the_header_is_the_documented_one() {
        let mut csv = Vec::new();
        write_rows(&mut csv, &[row("baseline")]).unwrap();
        let text = String::from_utf8(csv).unwrap();
        assert_eq!(text.lines().next(), Some(CSV_HEADER));
        assert_eq!(
            text.lines().nth(1),
            Some("seed-repro,export,quick,baseline,\"single-read,decode-once\",3,1234567,1000000,1100000,1300000,1400000,2100,lines,587.889,1.5000,0f59dbe0,wall,4096,1.2500,3.5000,1048576,floor,4,as-written,1200000")
        );
        let mut empty = Vec::new();
        write_rows(&mut empty, &[]).unwrap();
        assert_eq!(String::from_utf8(empty).unwrap(), format!("{CSV_HEADER}\n"));
    }

    /// A slow spell that catches one arm's sample of a round and not the
    /// other's moves the ratio of medians a long way, the median of the
    /// rounds' ratios not: each round's two samples are compared.
    #[test]
    fn an_arm_is_held_to_its_floor_round_by_round() {
        use super::super::ArmKind;
        use std::time::Duration;
        let arm = |name: &str, kind: ArmKind, micros: &[u64]| ArmResult {
            arm: name.to_string(),
            strategies: promlab::shared::strategy::StrategySet::NONE,
            kind,
            floor: "floor".to_string(),
            input: super::super::Input::One,
            units: (1, "lines"),
            samples: micros.iter().map(|&m| Duration::from_micros(m)).collect(),
            cpu: Vec::new(),
            runs_per_sample: 1,
            writes_store: false,
            typical: Duration::ZERO,
            peak_rss_bytes: None,
        };
        // `all` is 1.1× the floor; a spell (×1.5) slows both in round 3,
        // only `all` in rounds 1 and 2, only the floor in round 4.
        let floor = arm("floor", ArmKind::Floor, &[100, 100, 150, 150, 100]);
        let all = arm("all", ArmKind::Strategies, &[165, 165, 165, 110, 110]);
        let medians = all.median().as_secs_f64() / floor.median().as_secs_f64();
        assert!((medians - 1.65).abs() < 1e-9, "{medians}");
        let arms = [all.clone(), floor.clone()];
        let ratio = ratio_to_floor(&arms, &all).unwrap();
        assert!((ratio - 1.1).abs() < 1e-9, "{ratio}");
        assert_eq!(ratio_to_floor(&arms, &floor), Some(1.0));
        // Unequal rounds (no measurement makes them): the ratio of medians.
        let short = arm("all", ArmKind::Strategies, &[110, 110, 165]);
        let ratio = paired_ratio(&short, &floor);
        assert!((ratio - 1.1).abs() < 1e-9, "{ratio}");
    }

    /// Every results CSV in the repository reads, with the rows its lines promise.
    #[test]
    fn committed_results_read() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("experiments/results"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        dirs.push(root.join("notebooks/fixtures/results"));
        let mut files = 0;
        for dir in dirs.iter().filter(|d| d.is_dir()) {
            for file in std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()) {
                if file.extension().is_some_and(|e| e == "csv") {
                    let text = std::fs::read_to_string(&file).unwrap();
                    let rows = read_rows(text.as_bytes())
                        .unwrap_or_else(|e| panic!("{}: {e:#}", file.display()));
                    assert_eq!(rows.len(), text.lines().count() - 1, "{}", file.display());
                    assert!(rows.iter().all(|r| r.median_ns > 0 && !r.arm.is_empty()));
                    files += 1;
                }
            }
        }
        assert!(files >= 6, "{files} results CSVs found");
    }

    /// Quotes, commas and line breaks in a field come back as they went out.
    #[test]
    fn awkward_fields_round_trip() {
        let awkward = [
            "peer:\"quoted\"",
            "a,b",
            "line\nbreak",
            "\"\"",
            "",
            ",\"\n\r\n\"",
        ];
        let rows: Vec<ResultRow> = awkward
            .iter()
            .map(|a| ResultRow {
                digest: a.to_string(),
                rss_kib: None,
                ..row(a)
            })
            .collect();
        let mut csv = Vec::new();
        write_rows(&mut csv, &rows).unwrap();
        assert_eq!(read_rows(&csv[..]).unwrap(), rows);
    }

    /// Results from before the peers (no `measure`, `rss_kib`, `ratio_to_all`) still read.
    #[test]
    fn older_results_read() {
        let csv = "scenario,stage,size,arm,strategies,repeats,median_ns,min_ns,p25_ns,p75_ns,max_ns,units,unit,ns_per_unit,speedup_vs_baseline,digest\n\
                   large,export,quick,baseline,\"none\",15,2,1,1,3,4,10,lines,0.200,1.0000,abc\n";
        let rows = read_rows(csv.as_bytes()).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].strategies.as_str(), rows[0].median_ns),
            ("none", 2)
        );
        assert_eq!((rows[0].measure.as_str(), rows[0].rss_kib), ("wall", None));
        assert_eq!(rows[0].ratio_to_all, None);
        assert_eq!(
            (rows[0].ratio_to_floor, rows[0].peak_rss_bytes),
            (None, None)
        );
        assert!(read_rows("scenario\nx\n".as_bytes()).is_err());
    }
}
