//! Profiles of a scenario's arms (`promlab flamegraph`, `promlab profiles`),
//! and the profile sets the dossiers embed.
//!
//! A workload is built once and each arm's first run is verified against the
//! scenario's expected digest, as `promlab ablate` does, so what is profiled
//! is what was verified. The arms then run in interleaved slices (a quarter
//! second of CPU each, whole runs) until each has used the CPU time asked:
//! CPU time, not wall time, because `cpu-clock` samples CPU time, so an arm's
//! sample count is the same on a busy machine as on a quiet one.
//!
//! A profile set (`promlab profiles`) is a results directory's `profiles/`:
//! `profiles.csv` (one row per arm: sampler, samples, CPU time, rate, runs and
//! units of work) and `<scenario>/<arm>.folded`. `promlab report` draws from
//! it, per strategy, the differential flamegraphs its dossier embeds
//! (`<scenario>/<a>-vs-<b>.on-<a>.svg` and `.on-<b>.svg`, on each profile's
//! frames, and the differential folded stacks beside them, `<a>-vs-<b>.folded`).

use super::format::per_unit;
use super::{
    all_arms, digest, load_scenarios, run_arm, workloads, ArmKind, Input, Output, Scenario,
};
use crate::profile::{self, draw, ArmProfile, Folded, Profiler, Sampler, SamplerKind};
use anyhow::{bail, Context, Result};
use promlab::shared::strategy::{Stage, Strategy, StrategySet};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The scenarios `promlab profiles` profiles when none is named: one per
/// stage, each the workload of the upstream report its strategies answer.
pub const DEFAULT_SCENARIOS: [&str; 4] = [
    "write-long-label",
    "large-ruby",
    "rabbitmq-per-object",
    "asap-1e5",
];

/// The longest slice of one arm before the next arm's turn (whole runs).
const SLICE_CPU: Duration = Duration::from_millis(250);
/// The fewest slices each arm's CPU time is cut into when arms are
/// interleaved: a burst of load on a shared machine then lands on every arm
/// alike rather than on one of four long slices (a 1-s diff of a set against
/// itself drifted 17 % at load 5 with 250-ms slices).
const LEAST_SLICES: u32 = 20;

/// One arm's profile, rooted at the workload's run.
pub struct ArmRecord {
    pub arm: String,
    pub strategies: StrategySet,
    /// What it read.
    pub input: Input,
    pub profile: ArmProfile,
    /// Samples whose stack reached the workload's run frame.
    pub reached: u64,
    pub runs: u64,
}

impl ArmRecord {
    /// Units of work the profile covers.
    pub fn work(&self, units_per_run: u64) -> f64 {
        self.runs as f64 * units_per_run as f64
    }

    /// Its rate, samples reaching the run, and runs, in one line.
    pub fn summary(&self, sampler: &Sampler, units: (u64, &str)) -> String {
        let samples = self.profile.samples();
        let rate = self.profile.rate_hz();
        let stacks = match sampler.kind {
            SamplerKind::Perf => format!(
                "{:.1} % of stacks unwound to the workload's run",
                100.0 * self.reached as f64 / samples.max(1) as f64
            ),
            // pprof names frames by their DWARF names (`run`), so its stacks stay whole.
            SamplerKind::Pprof => "stacks from the process's start".to_string(),
        };
        format!(
            "{}: {} runs ({} {} each), {:.2} s CPU in {:.2} s, {samples} samples: {rate:.0} Hz, {:.0} % of the {} Hz asked; {stacks}",
            self.arm,
            self.runs,
            units.0,
            units.1,
            self.profile.cpu.as_secs_f64(),
            self.profile.wall.as_secs_f64(),
            100.0 * rate / f64::from(sampler.frequency_hz),
            sampler.frequency_hz,
        )
    }
}

/// What [`record`] returns.
pub struct Recorded {
    pub sampler: Sampler,
    pub arms: Vec<ArmRecord>,
    /// Units of work one run does, and their name.
    pub units: (u64, &'static str),
    pub warnings: Vec<String>,
}

/// An arm to profile: a strategy set (run by [`Workload::run`]), or, without
/// one, an arm of the scenario's ablation by name (`as-written`,
/// `baseline-folded`: another input).
#[derive(Clone, Debug)]
pub struct ArmRequest {
    pub name: String,
    pub set: Option<StrategySet>,
}

/// Profiles `arms` of `scenario` (each verified first), interleaved, until
/// each has used `cpu` of CPU time; with `other_inputs`, also the ablation's
/// arms that read another input (export: `as-written`, `baseline-folded`),
/// so every comparison has its pair on one input.
pub fn record(
    scenario: &Scenario,
    quick: bool,
    requests: &[ArmRequest],
    other_inputs: bool,
    cpu: Duration,
    sampler: Sampler,
) -> Result<Recorded> {
    let size = scenario.size(quick);
    let stage = scenario.stage();
    let mut workload = workloads::build(&size.params)
        .with_context(|| format!("cannot build scenario {}", scenario.name))?;
    let all = StrategySet::all().restrict(stage);
    let ablation = all_arms(stage, all, workload.as_ref());
    let arms: Vec<(String, StrategySet, ArmKind)> = requests
        .iter()
        .map(|request| match request.set {
            Some(set) => Ok((request.name.clone(), set, ArmKind::Strategies)),
            None => ablation
                .iter()
                .find(|(name, _, kind)| *name == request.name && *kind != ArmKind::Upkeep)
                .cloned()
                .with_context(|| {
                    format!("scenario {} has no arm `{}`", scenario.name, request.name)
                }),
        })
        .collect::<Result<_>>()?;
    let mut arms: Vec<(String, StrategySet, ArmKind)> = arms;
    if other_inputs {
        arms.extend(
            ablation
                .iter()
                .filter(|(name, set, kind)| {
                    *kind == ArmKind::Extra && workload.input_of(name, *set) != Input::One
                })
                .cloned(),
        );
    }
    if arms.iter().any(|(_, set, kind)| {
        *kind != ArmKind::Strategies
            || set.contains(promlab::shared::strategy::Strategy::FoldExited)
    }) {
        workload.prepare_arms(all)?;
    }
    // The first run of each arm: verified (a floor that does not write the
    // answer, by the units it handled), and the warm-up.
    let units = workload.units().0;
    for (name, set, kind) in &arms {
        let got = match run_arm(workload.as_mut(), *kind, name, *set)? {
            Output::Units(n) if n == units && *kind == ArmKind::Floor => continue,
            Output::Units(n) => bail!("arm {name} handled {n} units, not {units}"),
            other => digest(&other.bytes()?),
        };
        if got != size.expected {
            bail!(
                "scenario {}: arm `{name}` (strategies `{set}`) produced digest {got}, {} expected; not profiling an unverified run",
                scenario.name,
                size.expected
            );
        }
    }
    let slice = if arms.len() == 1 {
        cpu
    } else {
        SLICE_CPU.min(cpu / LEAST_SLICES)
    };
    let mut profiler = Profiler::start(sampler.clone(), arms.len())?;
    let mut runs = vec![0u64; arms.len()];
    let mut round = 0;
    while (0..arms.len()).any(|i| profiler.cpu(i) < cpu) {
        for k in 0..arms.len() {
            let i = (k + round) % arms.len();
            if profiler.cpu(i) >= cpu {
                continue;
            }
            let (name, set, kind) = &arms[i];
            let done = profiler.slice(i, || -> Result<u64> {
                let start = sampler.cpu_now();
                let mut done = 0;
                while done == 0 || sampler.cpu_now().saturating_sub(start) < slice {
                    run_arm(workload.as_mut(), *kind, name, *set)?;
                    done += 1;
                }
                Ok(done)
            })??;
            runs[i] += done;
        }
        round += 1;
    }
    let profiles = profiler.finish()?;
    let records = profiles
        .arms
        .into_iter()
        .zip(arms)
        .zip(runs)
        .map(|((mut profile, (arm, set, _)), runs)| {
            let (rooted, reached) = profile.folded.rooted_at(workload_frame());
            profile.folded = one_root(&rooted);
            ArmRecord {
                input: workload.input_of(&arm, set),
                arm,
                strategies: set,
                profile,
                reached,
                runs,
            }
        })
        .collect();
    Ok(Recorded {
        sampler: profiles.sampler,
        arms: records,
        units: workload.units(),
        warnings: profiles.warnings,
    })
}

/// The part of a frame's name every `Workload` method's frame has: an arm's
/// runs are rooted at the first (`run`, `run_extra` or `floor`).
fn workload_frame() -> &'static str {
    profile::RUN_FRAME.trim_end_matches("run")
}

/// The samples of `folded` with one root for every arm: an arm run by
/// [`Workload::run_extra`] (another input) or [`Workload::floor`] has its
/// runs rooted there, named as [`Workload::run`] is, so a diff against a
/// strategy arm compares the work under it, not the name of its root.
///
/// [`Workload::run_extra`]: super::Workload::run_extra
/// [`Workload::floor`]: super::Workload::floor
/// [`Workload::run`]: super::Workload::run
fn one_root(folded: &Folded) -> Folded {
    let mut out = Folded::default();
    for (stack, count) in folded.iter() {
        let (root, rest) = stack.split_once(';').unwrap_or((stack, ""));
        let renamed = match root.split_once(workload_frame()) {
            Some((head, method)) if method != "run" => {
                Some(format!("{head}{}", profile::RUN_FRAME))
            }
            _ => None,
        };
        match (renamed, rest) {
            (Some(run), "") => out.add(&run, count),
            (Some(run), rest) => out.add(&format!("{run};{rest}"), count),
            (None, _) => out.add(stack, count),
        }
    }
    out
}

/// One row of `profiles.csv`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileRow {
    pub scenario: String,
    pub stage: String,
    pub size: String,
    pub arm: String,
    /// The arm's strategy set (`none` for the baseline).
    pub strategies: String,
    /// `perf` or `pprof`.
    pub sampler: String,
    pub frequency_hz: u32,
    pub samples: u64,
    pub cpu_seconds: f64,
    pub wall_seconds: f64,
    /// Samples per second of CPU time.
    pub rate_hz: f64,
    /// Fraction of samples whose stack was unwound to the workload's run.
    pub unwound: f64,
    pub runs: u64,
    pub units_per_run: u64,
    pub unit: String,
    /// The folded stacks, relative to the profiles directory.
    pub folded: String,
    /// What the arm read (`as-written`, `folded`; empty where the stage has
    /// one input, and in sets written before this column: see
    /// [`ProfileRow::input`]).
    #[serde(default)]
    pub reads: Option<String>,
}

impl ProfileRow {
    fn work(&self) -> f64 {
        self.runs as f64 * self.units_per_run as f64
    }

    fn set(&self) -> Result<StrategySet> {
        self.strategies
            .parse()
            .map_err(|e: String| anyhow::anyhow!("{}/{}: {e}", self.scenario, self.arm))
    }

    /// What the arm read: its `reads`, else (older sets, whose arms were
    /// all strategy sets) an export set's input.
    fn input(&self) -> Result<Input> {
        if let Some(input) = self.reads.as_deref().and_then(Input::parse) {
            return Ok(input);
        }
        Ok(match self.stage.parse::<Stage>() {
            Ok(Stage::Export) => Input::of_export_set(self.set()?),
            _ => Input::One,
        })
    }
}

/// Options of `promlab profiles`.
pub struct SetOptions {
    pub quick: bool,
    /// CPU time per arm.
    pub cpu: Duration,
    pub sampler: Sampler,
}

/// `promlab profiles`: every arm of each scenario (the ablation's: baseline,
/// each strategy alone, all but each, all; `Strategy::ALL`, so a new strategy
/// is profiled without more code) into `<out>/profiles/`.
pub fn profile_set(names: &[String], options: &SetOptions, out: &Path) -> Result<PathBuf> {
    let scenarios = load_scenarios(names, &DEFAULT_SCENARIOS)?;
    let dir = out.join("profiles");
    let mut rows = Vec::new();
    for scenario in &scenarios {
        let stage = scenario.stage();
        let arms: Vec<ArmRequest> = super::arms(stage, StrategySet::all())
            .into_iter()
            .map(|(name, set)| ArmRequest {
                name,
                set: Some(set),
            })
            .collect();
        eprintln!(
            "{}: profiling {} arms (and those reading another input), {:.1} s of CPU each, {}",
            scenario.name,
            arms.len(),
            options.cpu.as_secs_f64(),
            options.sampler.describe()
        );
        let recorded = record(
            scenario,
            options.quick,
            &arms,
            true,
            options.cpu,
            options.sampler.clone(),
        )?;
        for warning in &recorded.warnings {
            eprintln!("  warning: {warning}");
        }
        let scenario_dir = dir.join(&scenario.name);
        std::fs::create_dir_all(&scenario_dir)
            .with_context(|| format!("cannot create {}", scenario_dir.display()))?;
        for arm in &recorded.arms {
            eprintln!("  {}", arm.summary(&recorded.sampler, recorded.units));
            let folded = format!("{}/{}.folded", scenario.name, arm.arm);
            let pruned = arm.profile.folded.pruned(SET_MIN_FRACTION);
            std::fs::write(dir.join(&folded), pruned.to_text())
                .with_context(|| format!("cannot write {folded}"))?;
            rows.push(ProfileRow {
                scenario: scenario.name.clone(),
                stage: stage.to_string(),
                size: if options.quick { "quick" } else { "full" }.to_string(),
                arm: arm.arm.clone(),
                strategies: arm.strategies.to_string(),
                sampler: recorded.sampler.kind.name().to_string(),
                frequency_hz: recorded.sampler.frequency_hz,
                samples: arm.profile.samples(),
                cpu_seconds: round3(arm.profile.cpu.as_secs_f64()),
                wall_seconds: round3(arm.profile.wall.as_secs_f64()),
                rate_hz: round3(arm.profile.rate_hz()),
                unwound: round3(arm.reached as f64 / arm.profile.samples().max(1) as f64),
                runs: arm.runs,
                units_per_run: recorded.units.0,
                unit: recorded.units.1.to_string(),
                folded,
                reads: Some(arm.input.name().to_string()).filter(|r| !r.is_empty()),
            });
        }
    }
    let mut writer = csv::Writer::from_path(dir.join("profiles.csv"))?;
    for row in &rows {
        writer.serialize(row)?;
    }
    writer.flush()?;
    Ok(dir)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Reads `<dir>/profiles.csv`.
pub fn read_rows(dir: &Path) -> Result<Vec<ProfileRow>> {
    let path = dir.join("profiles.csv");
    let file =
        std::fs::File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
    csv::Reader::from_reader(file)
        .deserialize()
        .enumerate()
        .map(|(i, row)| row.with_context(|| format!("{} row {}", path.display(), i + 1)))
        .collect()
}

/// The newest results directory with a profile set (`<dir>/profiles/profiles.csv`).
pub fn latest(root: &Path) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("profiles")))
        .filter(|p| p.join("profiles.csv").is_file())
        .collect();
    dirs.sort();
    dirs.pop()
}

/// A profile set's folded stacks keep frames of at least this fraction of
/// the arm's samples (a frame below it counts as its caller's own time), so a
/// committed set stays small; the dossiers' graphs prune further.
pub const SET_MIN_FRACTION: f64 = 0.001;

/// Frames narrower than this (pixels of 1,200: 0.25 % of the samples) are
/// left out of the dossiers' SVGs and of the folded stacks beside them.
pub const DOSSIER_MIN_WIDTH_PX: f64 = 3.0;

/// One comparison a dossier shows: `b` against `a`, per unit of work.
struct Pair<'a> {
    a: &'a ProfileRow,
    b: &'a ProfileRow,
}

/// The pairs of `strategy`'s dossier in one scenario, each of two arms
/// reading the same input: the baseline against it alone (on what it alone
/// reads), and, on each input, promlab without it against promlab (when
/// that is another pair: with one strategy in the stage, it is the same).
fn pairs<'a>(strategy: Strategy, rows: &[&'a ProfileRow]) -> Result<Vec<Pair<'a>>> {
    let mut read: Vec<(&'a ProfileRow, StrategySet, Input)> = Vec::new();
    for row in rows {
        read.push((*row, row.set()?, row.input()?));
    }
    let find = |set: StrategySet, input: Input| {
        read.iter()
            .find(|(_, s, i)| *s == set && *i == input)
            .map(|(r, _, _)| *r)
    };
    let mut pairs = Vec::new();
    let alone = StrategySet::NONE.with(strategy);
    if let Some((b, _, input)) = read.iter().find(|(_, s, _)| *s == alone) {
        if let Some(a) = find(StrategySet::NONE, *input) {
            pairs.push(Pair { a, b });
        }
    }
    for input in [Input::One, Input::AsWritten, Input::Folded] {
        // promlab on the input: the arm with the most strategies, the first of equals.
        let mut all: Option<(&ProfileRow, StrategySet)> = None;
        for (row, set, _) in read.iter().filter(|(_, _, i)| *i == input) {
            if all.is_none_or(|(_, s)| set.iter().count() > s.iter().count()) {
                all = Some((*row, *set));
            }
        }
        let Some((all, set)) = all.filter(|(_, set)| set.contains(strategy)) else {
            continue;
        };
        if let Some(without) = find(set.without(strategy), input) {
            let same = pairs
                .iter()
                .any(|p| p.a.arm == without.arm && p.b.arm == all.arm);
            if !same {
                pairs.push(Pair { a: without, b: all });
            }
        }
    }
    Ok(pairs)
}

/// The markdown block of `strategy`'s dossier: per profiled scenario of its
/// stage, its differential flamegraphs, drawn into `profiles` (SVG and the
/// differential folded stacks beside it), linked relative to `dossier_dir`.
pub fn dossier_block(strategy: Strategy, profiles: &Path, dossier_dir: &Path) -> Result<String> {
    let rows = read_rows(profiles)?;
    let link_base = relative_path(dossier_dir, profiles)?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Regenerated by `promlab report` from `{}` (`promlab profiles`; the README beside it says how and where it was \
         taken). Differential flamegraphs per unit of work, the first profile's samples scaled to the second's \
         units of work; each frame coloured by the change of its own samples, **red where the second spends \
         more per unit, blue where it spends less**: on the first profile's frames (what the second no longer \
         spends shows) and on the second's (what it spends instead shows). Click one for the interactive SVG \
         (search, zoom). The folded stacks, the diff's (`<first>-vs-<second>.folded`: stack, first, second) \
         and each arm's own (`<arm>.folded`), open in inferno and `flamegraph.pl` (an arm's in speedscope \
         too).\n",
        profiles.display()
    );
    let mut scenarios: Vec<&str> = rows.iter().map(|r| r.scenario.as_str()).collect();
    scenarios.dedup();
    let mut shown = 0;
    for scenario in scenarios {
        let of: Vec<&ProfileRow> = rows.iter().filter(|r| r.scenario == scenario).collect();
        let Ok(stage) = of[0].stage.parse::<Stage>() else {
            continue;
        };
        if !strategy.applies_to(stage) {
            continue;
        }
        for pair in pairs(strategy, &of)? {
            let name = format!("{}-vs-{}", pair.a.arm, pair.b.arm);
            let read = |row: &ProfileRow| -> Result<Folded> {
                let path = profiles.join(&row.folded);
                Folded::parse(
                    &std::fs::read_to_string(&path)
                        .with_context(|| format!("cannot read {}", path.display()))?,
                )
            };
            let diff =
                draw::Diff::new(&read(pair.a)?, pair.a.work(), &read(pair.b)?, pair.b.work())?
                    .pruned(DOSSIER_MIN_WIDTH_PX / 1200.0);
            let unit = pair.b.unit.trim_end_matches('s');
            let label = |row: &ProfileRow| match row.arm.as_str() {
                "baseline" | "as-written" | "baseline-folded" => row.arm.clone(),
                _ => format!("`{}`", row.strategies),
            };
            let reads = match pair.b.input()? {
                Input::One => String::new(),
                Input::AsWritten => ", both on the store as written".to_string(),
                Input::Folded => ", both on the store folded".to_string(),
            };
            let title = format!(
                "{scenario} ({stage}, {}): {} → {}, per {unit}",
                pair.b.size, pair.a.arm, pair.b.arm
            );
            let scenario_dir = profiles.join(scenario);
            std::fs::write(scenario_dir.join(format!("{name}.folded")), diff.to_text())?;
            let mut cells = Vec::new();
            for (shape, on) in [(draw::Shape::First, pair.a), (draw::Shape::Second, pair.b)] {
                let subtitle = format!(
                    "on {}'s frames; a frame's own samples per {unit}: red where {} spends more, blue where less",
                    on.arm, pair.b.arm
                );
                let svg = diff.svg(
                    shape,
                    &draw::Style {
                        title: &title,
                        subtitle: &subtitle,
                        min_width_px: DOSSIER_MIN_WIDTH_PX,
                    },
                )?;
                let file = format!("{name}.on-{}.svg", on.arm);
                std::fs::write(scenario_dir.join(&file), svg)?;
                let link = format!("{}/{scenario}/{file}", link_base.display());
                cells.push(format!(
                    "[![{title}, on {}'s frames]({link})]({link})",
                    on.arm
                ));
            }
            let ns = |row: &ProfileRow| row.cpu_seconds * 1e9 / row.work().max(1.0);
            let _ = writeln!(
                out,
                "**{scenario} ({}): {} → {}**{reads}: CPU time per {unit} {} → {} ns ({:.2}×); {} at {:.0} and {:.0} Hz, {} and {} samples.\n",
                pair.b.size,
                label(pair.a),
                label(pair.b),
                per_unit(ns(pair.a)),
                per_unit(ns(pair.b)),
                ns(pair.b) / ns(pair.a).max(1e-9),
                pair.b.sampler,
                pair.a.rate_hz,
                pair.b.rate_hz,
                pair.a.samples,
                pair.b.samples,
            );
            let _ = writeln!(
                out,
                "| on {}'s frames: blue where {} spends less | on {}'s frames: red where it spends more |\n| --- | --- |\n| {} | {} |\n",
                pair.a.arm, pair.b.arm, pair.b.arm, cells[0], cells[1]
            );
            let changes: Vec<String> = diff
                .own_changes(4)
                .into_iter()
                .filter(|(_, a, b)| a != b)
                .map(|(frame, a, b)| format!("`{}` {a} → {b}", frame.replace('`', "'")))
                .collect();
            if !changes.is_empty() {
                let _ = writeln!(
                    out,
                    "Own samples that changed most (the first's scaled to the second's work; the diff's folded stacks: [`{name}.folded`]({}/{scenario}/{name}.folded)): {}.\n",
                    link_base.display(),
                    changes.join(", ")
                );
            }
            shown += 1;
        }
    }
    if shown == 0 {
        let _ = writeln!(
            out,
            "No two profiles of this set compare `{}` on one input (a set from before the arms of the store as written and folded were profiled has none): `promlab profiles` (with a scenario of its stage) makes them.\n",
            strategy.name()
        );
    }
    Ok(out)
}

/// Whether every arm of the profile set in `dir` has its folded stacks there
/// (a set whose stacks were not kept, only the SVGs drawn from them, has
/// none: its diffs cannot be drawn again).
pub fn has_stacks(dir: &Path) -> Result<bool> {
    Ok(read_rows(dir)?
        .iter()
        .all(|row| dir.join(&row.folded).is_file()))
}

/// `to` as seen from the directory `from` (both relative to the same directory, or absolute).
fn relative_path(from: &Path, to: &Path) -> Result<PathBuf> {
    let canonical = |p: &Path| {
        p.canonicalize()
            .with_context(|| format!("cannot find {}", p.display()))
    };
    let (from, to) = (canonical(from)?, canonical(to)?);
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for part in &to[common..] {
        path.push(part);
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(arm: &str, strategies: &str) -> ProfileRow {
        ProfileRow {
            scenario: "large-ruby".into(),
            stage: "export".into(),
            size: "quick".into(),
            arm: arm.into(),
            strategies: strategies.into(),
            sampler: "perf".into(),
            frequency_hz: 997,
            samples: 100,
            cpu_seconds: 0.1,
            wall_seconds: 0.1,
            rate_hz: 997.0,
            unwound: 1.0,
            runs: 10,
            units_per_run: 5,
            unit: "lines".into(),
            folded: format!("large-ruby/{arm}.folded"),
            reads: None,
        }
    }

    /// `fold-exited` changes what an arm reads: its pairs are the baseline
    /// against it on the folded store, and promlab without it against
    /// promlab on the store as written, never across the two.
    #[test]
    fn pairs_compare_arms_reading_the_same_input() {
        let all = "single-read,decode-once,fast-unescape,fold-exited,prerender";
        let read = |arm: &str, strategies: &str, reads: &str| ProfileRow {
            reads: Some(reads.to_string()),
            ..row(arm, strategies)
        };
        let rows = [
            row("baseline", "none"),
            row("fold-exited", "fold-exited"),
            row(
                "all-fold-exited",
                "single-read,decode-once,fast-unescape,prerender",
            ),
            row("all", all),
            read("as-written", all, "as-written"),
            read("baseline-folded", "none", "folded"),
        ];
        let refs: Vec<&ProfileRow> = rows.iter().collect();
        let names: Vec<(&str, &str)> = pairs(Strategy::FoldExited, &refs)
            .unwrap()
            .iter()
            .map(|p| (p.a.arm.as_str(), p.b.arm.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("baseline-folded", "fold-exited"),
                ("all-fold-exited", "as-written")
            ]
        );
        // An older set, without the arms of the other input: no pair across.
        let old: Vec<&ProfileRow> = rows[..4].iter().collect();
        assert!(pairs(Strategy::FoldExited, &old).unwrap().is_empty());
    }

    #[test]
    fn pairs_are_baseline_to_it_and_all_without_it_to_all() {
        let rows = [
            row("baseline", "none"),
            row("single-read", "single-read"),
            row("decode-once", "decode-once"),
            row("fast-unescape", "fast-unescape"),
            row("all-single-read", "decode-once,fast-unescape"),
            row("all-decode-once", "single-read,fast-unescape"),
            row("all-fast-unescape", "single-read,decode-once"),
            row("all", "single-read,decode-once,fast-unescape"),
        ];
        let refs: Vec<&ProfileRow> = rows.iter().collect();
        let names = |s: Strategy| -> Vec<(String, String)> {
            pairs(s, &refs)
                .unwrap()
                .iter()
                .map(|p| (p.a.arm.clone(), p.b.arm.clone()))
                .collect()
        };
        assert_eq!(
            names(Strategy::FastUnescape),
            [
                ("baseline".into(), "fast-unescape".into()),
                ("all-fast-unescape".into(), "all".into())
            ]
        );
        // With two, all without one is the other alone.
        let two = [
            row("baseline", "none"),
            row("decode-once", "decode-once"),
            row("fast-unescape", "fast-unescape"),
            row("all", "decode-once,fast-unescape"),
        ];
        let refs: Vec<&ProfileRow> = two.iter().collect();
        let second = &pairs(Strategy::FastUnescape, &refs).unwrap()[1];
        assert_eq!(
            (second.a.arm.as_str(), second.b.arm.as_str()),
            ("decode-once", "all")
        );
        // With one strategy the second pair is the first.
        let one = [row("baseline", "none"), row("prerender", "prerender")];
        let refs: Vec<&ProfileRow> = one.iter().collect();
        assert_eq!(pairs(Strategy::Prerender, &refs).unwrap().len(), 1);
        // A strategy the set has no profile of: no pair.
        assert!(pairs(Strategy::SingleRead, &refs).unwrap().is_empty());
    }

    #[test]
    fn relative_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (
            tmp.path().join("strategies"),
            tmp.path().join("x/y/profiles"),
        );
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        assert_eq!(
            relative_path(&a, &b).unwrap(),
            PathBuf::from("../x/y/profiles")
        );
    }
}
