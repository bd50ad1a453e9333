//! `promlab flamegraph`: where one scenario's time goes under one strategy set,
//! or (`--diff A B`) how it changes from one set to another, per unit of work.
//!
//! The workload is built, each set's first run verified against the
//! scenario's expected digest, then runs are profiled (`harness::profiles`):
//! the steady state the ablation times (`Workload::run`), not the setup. The
//! sampler is perf's `cpu-clock` where the kernel allows it, pprof's timer
//! otherwise (`crate::profile`); the summary names it and the rate it reached.
//! Beside `FILE.svg` go the folded stacks, `FILE.folded`. A diff draws B's
//! frames in `FILE.svg` and A's in `FILE.a.svg` (`profile::draw` says why
//! both), `FILE.folded` holding the differential stacks (stack, A, B) and
//! `FILE.a.folded`, `FILE.b.folded` each side's own.

use crate::harness::profiles::{self, ArmRecord, Recorded};
use crate::profile::{self, draw, SamplerChoice};
use anyhow::{bail, Context, Result};
use promlab::shared::strategy::StrategySet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How `promlab flamegraph` and `promlab profiles` sample.
#[derive(clap::Args, Debug)]
pub struct SamplingArgs {
    /// Samples per second of CPU time.
    #[arg(long, default_value_t = 997)]
    pub frequency: u32,
    /// The sampler: perf events where allowed, else pprof's timer (`auto`); or force one.
    #[arg(long, value_enum, default_value_t = SamplerChoice::Auto)]
    pub sampler: SamplerChoice,
}

impl SamplingArgs {
    fn sampler(&self) -> Result<profile::Sampler> {
        profile::choose(self.sampler, self.frequency)
    }
}

/// `--seconds` of CPU to profile, checked: positive, at most a day.
fn cpu_seconds(seconds: f64) -> Result<Duration> {
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= 86_400.0) {
        bail!("--seconds must be a positive number of seconds (at most a day), not {seconds}");
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// `promlab flamegraph`: profile a scenario's runs and write an SVG flamegraph.
#[derive(clap::Args, Debug)]
pub struct FlamegraphArgs {
    /// A built-in scenario name or a scenario .toml path.
    pub scenario: String,
    /// Strategies to run: a comma-separated list, `none`, `all`, or `default`.
    #[arg(long, default_value = "default", conflicts_with = "diff")]
    pub strategies: StrategySet,
    /// An arm of the scenario's ablation by name instead, for the arms a
    /// strategy set does not name: `as-written` (every strategy on the store
    /// as written, what `promlab serve --store` reads), `baseline-folded`, a
    /// floor (`floor`, `floor-folded`).
    #[arg(long, conflicts_with_all = ["diff", "strategies"])]
    pub arm: Option<String>,
    /// Profile two strategy sets (or arms by name, as `--arm` takes them),
    /// interleaved, and draw B's profile coloured by the difference per unit
    /// of work: red where B spends more, blue where less.
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    pub diff: Option<Vec<String>>,
    /// The scenario's quick size (default: its full size).
    #[arg(long)]
    pub quick: bool,
    /// CPU seconds of the workload to profile (per set with --diff); on a busy
    /// machine the wall time is longer, the sample count the same.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Frames narrower than this many pixels (of 1,200) are left out of the
    /// SVG, and of a diff's folded stacks: 3 keeps a graph small enough to
    /// embed in a document (frames of 0.25 % of the samples and more).
    #[arg(long, default_value_t = draw::MIN_WIDTH_PX)]
    pub min_width: f64,
    /// Where the SVG goes; the folded stacks go beside it (`.folded`).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn flamegraph(args: FlamegraphArgs) -> Result<()> {
    let cpu = cpu_seconds(args.seconds)?;
    let sampler = args.sampling.sampler()?;
    let scenario = crate::harness::load_scenario(&args.scenario)?;
    let stage = scenario.stage();
    // Each side a strategy set, or an arm by name (what does not parse as a set).
    let sides: Vec<(String, Option<StrategySet>)> = match (&args.diff, &args.arm) {
        (Some(diff), _) => diff
            .iter()
            .map(|side| (side.clone(), side.parse::<StrategySet>().ok()))
            .collect(),
        (None, Some(arm)) => vec![(arm.clone(), None)],
        (None, None) => vec![(args.strategies.to_string(), Some(args.strategies))],
    };
    // Only the scenario's own stage has strategies that change its runs.
    for (asked, set) in &sides {
        if set.is_some_and(|s| s.restrict(stage).is_empty() && !s.is_empty()) {
            eprintln!(
                "note: none of `{asked}` belongs to the {stage} stage of {}; profiling the baseline there",
                scenario.name
            );
        }
    }
    let outputs = Outputs::new(&args.out, sides.len() == 2);
    // Open the output before the long part, so a bad path fails at once; a
    // failure after that removes what was written rather than leave half of it.
    let file = std::fs::File::create(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    drop(file);
    let arms: Vec<profiles::ArmRequest> = sides
        .iter()
        .map(|(name, set)| match set {
            Some(set) => profiles::ArmRequest {
                name: set.restrict(stage).to_string(),
                set: Some(set.restrict(stage)),
            },
            None => profiles::ArmRequest {
                name: name.clone(),
                set: None,
            },
        })
        .collect();
    eprintln!(
        "profiling {} ({stage}, {}), {}: {:.1} s of CPU{}, {}",
        scenario.name,
        if args.quick { "quick" } else { "full" },
        sides
            .iter()
            .map(|(name, set)| match set {
                Some(set) => format!("strategies `{}`", set.restrict(stage)),
                None => format!("arm `{name}`"),
            })
            .collect::<Vec<_>>()
            .join(" against "),
        args.seconds,
        if sides.len() == 2 {
            " each, interleaved"
        } else {
            ""
        },
        sampler.describe()
    );
    let result =
        profiles::record(&scenario, args.quick, &arms, false, cpu, sampler).and_then(|recorded| {
            write(
                &recorded,
                &scenario.name,
                args.quick,
                args.min_width,
                &outputs,
            )
        });
    match result {
        Ok(summary) => {
            println!("{summary}");
            Ok(())
        }
        Err(err) => {
            outputs.remove();
            Err(err)
        }
    }
}

/// The files one invocation writes.
struct Outputs {
    svg: PathBuf,
    folded: PathBuf,
    /// For a diff: the graph on A's frames, and each side's folded stacks.
    sides: Option<(PathBuf, [PathBuf; 2])>,
}

impl Outputs {
    fn new(svg: &Path, diff: bool) -> Outputs {
        let beside = |ext: &str| svg.with_extension(ext);
        Outputs {
            svg: svg.to_path_buf(),
            folded: beside("folded"),
            sides: diff.then(|| (beside("a.svg"), [beside("a.folded"), beside("b.folded")])),
        }
    }

    fn remove(&self) {
        let sides = self
            .sides
            .iter()
            .flat_map(|(svg, folded)| [svg].into_iter().chain(folded));
        for path in [&self.svg, &self.folded].into_iter().chain(sides) {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// Draws and writes the profile(s); returns the summary to print.
fn write(
    recorded: &Recorded,
    scenario: &str,
    quick: bool,
    min_width_px: f64,
    outputs: &Outputs,
) -> Result<String> {
    let sampler = &recorded.sampler;
    let size = if quick { "quick" } else { "full" };
    let mut summary = format!("sampler: {}\n", sampler.describe());
    for arm in &recorded.arms {
        summary.push_str(&format!("  {}\n", arm.summary(sampler, recorded.units)));
        check_samples(arm, sampler)?;
        let rate = arm.profile.rate_hz() / f64::from(sampler.frequency_hz);
        if sampler.kind == profile::SamplerKind::Perf && rate < 0.9 {
            summary.push_str(&format!(
                "  warning: {}: {:.0} % of the asked rate (perf lost samples? see below)\n",
                arm.arm,
                100.0 * rate
            ));
        }
    }
    for warning in &recorded.warnings {
        summary.push_str(&format!("  warning: {warning}\n"));
    }
    match recorded.arms.as_slice() {
        [arm] => {
            let title = if arm.arm == arm.strategies.to_string() {
                format!(
                    "promlab {scenario} ({size}), strategies: {}",
                    arm.strategies
                )
            } else {
                format!(
                    "promlab {scenario} ({size}), arm {} (strategies: {})",
                    arm.arm, arm.strategies
                )
            };
            let subtitle = format!(
                "{} samples of {} runs, {} sampler",
                arm.profile.samples(),
                arm.runs,
                sampler.kind.name()
            );
            let svg = draw::svg(
                &arm.profile.folded,
                &draw::Style {
                    title: &title,
                    subtitle: &subtitle,
                    min_width_px,
                },
            )?;
            write_file(&outputs.svg, &svg)?;
            write_file(&outputs.folded, arm.profile.folded.to_text().as_bytes())?;
            summary.push_str(&format!(
                "wrote {} and {}\nhottest frames (inclusive): {}",
                outputs.svg.display(),
                outputs.folded.display(),
                hottest(&arm.profile.folded)
            ));
        }
        [a, b] => {
            let units = recorded.units;
            let unit = units.1.trim_end_matches('s');
            let diff = draw::Diff::new(
                &a.profile.folded,
                a.work(units.0),
                &b.profile.folded,
                b.work(units.0),
            )?
            .pruned(min_width_px / 1200.0);
            let title = format!(
                "promlab {scenario} ({size}): {} → {}, per {unit}",
                side(a),
                side(b)
            );
            let (on_a, sides) = outputs.sides.as_ref().expect("a diff has two sides");
            for (shape, path, frames) in [
                (draw::Shape::Second, &outputs.svg, "B's"),
                (draw::Shape::First, on_a, "A's"),
            ] {
                let subtitle = format!(
                    "on {frames} frames; a frame's own samples per {unit}: red where B spends more than A, blue where less"
                );
                let style = draw::Style {
                    title: &title,
                    subtitle: &subtitle,
                    min_width_px,
                };
                write_file(path, &diff.svg(shape, &style)?)?;
            }
            write_file(&outputs.folded, diff.to_text().as_bytes())?;
            for (arm, path) in [a, b].iter().zip(sides) {
                write_file(path, arm.profile.folded.to_text().as_bytes())?;
            }
            let per_k = |arm: &ArmRecord| {
                arm.profile.samples() as f64 * 1000.0 / arm.work(units.0).max(1.0)
            };
            let (total_a, total_b) = diff.totals();
            let (flat, frame) = diff.largest_change();
            summary.push_str(&format!(
                "per 1,000 {unit}s: A {:.2} samples, B {:.2} (B/A {:.3}); largest change of a frame: {:+.1} % of A's total, at {}\n",
                per_k(a),
                per_k(b),
                total_b as f64 / total_a.max(1) as f64,
                100.0 * flat,
                frame.rsplit(';').next().unwrap_or(&frame)
            ));
            let changes: Vec<String> = diff
                .own_changes(5)
                .into_iter()
                .map(|(frame, a, b)| format!("{frame} {a} → {b}"))
                .collect();
            summary.push_str(&format!(
                "own samples that changed most (A scaled to B's work): {}\nwrote {} (on B's frames), {} (on A's), {} (differential folded: stack, A, B), {} and {}",
                changes.join("; "),
                outputs.svg.display(),
                on_a.display(),
                outputs.folded.display(),
                sides[0].display(),
                sides[1].display()
            ));
        }
        _ => unreachable!("one arm or two"),
    }
    Ok(summary)
}

/// How a profiled arm is named in a title: its strategy set, or its name
/// when it is an arm a set does not name (`as-written`, a floor).
fn side(arm: &ArmRecord) -> String {
    if arm.arm.parse::<StrategySet>().is_ok() {
        format!("`{}`", arm.strategies)
    } else {
        format!("{} (`{}`)", arm.arm, arm.strategies)
    }
}

fn check_samples(arm: &ArmRecord, sampler: &profile::Sampler) -> Result<()> {
    if arm.profile.samples() == 0 {
        bail!(
            "{} took no samples of {} in {:.2} s of CPU ({} runs); try a longer --seconds",
            sampler.kind.name(),
            arm.arm,
            arm.profile.cpu.as_secs_f64(),
            arm.runs
        );
    }
    Ok(())
}

fn hottest(folded: &profile::Folded) -> String {
    let total = folded.samples().max(1) as f64;
    folded
        .hottest(6)
        .into_iter()
        .map(|(frame, n)| format!("{frame} {:.1} %", 100.0 * n as f64 / total))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `promlab profiles`: the profile set the dossiers embed.
#[derive(clap::Args, Debug)]
pub struct ProfilesArgs {
    /// Scenarios (built-in names or .toml paths); by default one per stage:
    /// write-long-label, large-ruby, rabbitmq-per-object, asap-1e5.
    pub scenarios: Vec<String>,
    /// The scenarios' quick sizes (default: their full sizes).
    #[arg(long)]
    pub quick: bool,
    /// CPU seconds of profile per arm (each arm's runs are whole, so the
    /// slowest arms may run longer).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// The results directory whose `profiles/` to write (default: a new
    /// experiments/results/<date>T<time>Z-<host>-<revision>).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn profiles(args: ProfilesArgs) -> Result<()> {
    let cpu = cpu_seconds(args.seconds)?;
    let load_at_start = crate::harness::report::run_started();
    let options = profiles::SetOptions {
        quick: args.quick,
        cpu,
        sampler: args.sampling.sampler()?,
    };
    let out = args
        .out
        .unwrap_or_else(crate::harness::report::default_results_dir);
    let dir = profiles::profile_set(&args.scenarios, &options, &out)?;
    let ablate = crate::harness::AblateOptions {
        quick: args.quick,
        only: None,
        out: None,
        repeats: None,
        print_digests: false,
        progress: false,
        peers: false,
        with_clickhouse: false,
        peak_rss: None,
    };
    crate::harness::report::write_machine(&dir, &ablate, load_at_start)?;
    println!(
        "profiles: {} (`promlab report` draws the dossiers' flamegraphs from the newest set)",
        dir.display()
    );
    Ok(())
}
