//! `promlab flamegraph`: full-rate profiles of known workloads name their hot
//! frames; a diff of a strategy set against itself is flat, against a real
//! change is not; the pprof fallback says what it is; bad input gives a clear
//! error and no file.
//!
//! The perf checks run where the kernel allows perf events (`cpu-clock`, as
//! `perf_event_paranoid` = 2 allows for one's own processes) and the `perf`
//! tool runs. Where the kernel refuses them they say so (`SKIPPED:`); where it
//! should allow them but does not, or the tool is missing, that is a skip that
//! fails under `CI`.
//!
//! "Duration" is CPU time: `--seconds` is CPU seconds of the workload, and
//! `cpu-clock` samples CPU time, so sample counts hold on a loaded machine:
//! a 1 s profile holds at least 90 % of 997 samples per CPU second it
//! covers (at least 897).

#[path = "../../../tests/common/mod.rs"]
mod common;

use promlab_lab::profile::draw::Diff;
use promlab_lab::profile::{self, Access, Folded};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The rate every perf profile is asked for, and the least share of it a
/// profile must reach (the bar: 90 % where the kernel allows it).
const HZ: f64 = 997.0;
const LEAST_RATE: f64 = 0.9;

/// A diff whose largest frame change (inclusive, per unit of work) is at most
/// this fraction of the first side's total is *flat*. Two interleaved
/// profiles of the same set of about 1,000 samples each differ by a few
/// percent (sampling and CPU-per-run noise on a shared machine: 1.6 % at
/// load 14); a strategy that saves a quarter of the work is far outside it
/// (fast-unescape alone: 47–51 %).
const FLAT: f64 = 0.12;

fn flamegraph(args: &[&str], out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_promlab"))
        .arg("flamegraph")
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run promlab")
}

/// Runs `promlab flamegraph`, requiring success; returns its stdout.
fn profiled(args: &[&str], out: &Path) -> String {
    let output = flamegraph(args, out);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{:?}: {stderr}\n{stdout}",
        output.status
    );
    eprintln!("{stdout}");
    stdout
}

/// Whether the perf checks can run here; says why not once. The kernel may
/// refuse perf events (`perf_event_paranoid` = 3): said, not a failure. When
/// it should allow them (≤ 2) but does not, or the tool is missing, that is a
/// skip that fails under CI.
fn perf_allowed() -> bool {
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    *ALLOWED.get_or_init(|| match profile::perf_access() {
        Access::Denied(why) => {
            let paranoid: Option<i32> =
                std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
                    .ok()
                    .and_then(|s| s.trim().parse().ok());
            if paranoid.is_some_and(|p| p <= 2) {
                common::skip(
                    &format!("perf events for promlab flamegraph's full-rate checks ({why}), though perf_event_paranoid allows them"),
                    "let the tests call perf_event_open: a container's seccomp profile may block it",
                );
            } else {
                not_allowed(&format!(
                    "perf checks of promlab flamegraph: the kernel refuses perf events here ({why}); the pprof fallback was checked instead"
                ));
            }
            false
        }
        Access::UserAndKernel | Access::UserOnly => match profile::perf_tool() {
            Ok(_) => true,
            Err(why) => {
                common::skip(
                    &format!("the perf tool for promlab flamegraph's full-rate checks ({why})"),
                    "apt-get install linux-perf",
                );
                false
            }
        },
    })
}

/// A check this machine cannot run, though nothing is missing: said on the
/// terminal and in the run's summary of skips, and not a failure under CI.
fn not_allowed(what: &str) {
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("SKIPPED: {what}\n").as_bytes(),
    );
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(common::skips_file())
        .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{what}\n").as_bytes()));
}

fn read_folded(path: &Path) -> Folded {
    Folded::parse(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The `N.NN s CPU` of a summary line.
fn cpu_seconds(summary_line: &str) -> f64 {
    let before = summary_line
        .split(" s CPU")
        .next()
        .expect("a CPU time in the summary");
    before
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("no CPU time in {summary_line:?}"))
}

/// Checks a perf profile's rate and roots; returns its folded stacks.
fn full_rate_profile(stdout: &str, svg: &Path, run_frame: &str) -> Folded {
    assert!(
        stdout.starts_with("sampler: perf (cpu-clock"),
        "not perf: {stdout}"
    );
    let line = stdout
        .lines()
        .find(|l| l.contains(" s CPU"))
        .expect("an arm's summary");
    let cpu = cpu_seconds(line);
    let folded = read_folded(&svg.with_extension("folded"));
    let samples = folded.samples() as f64;
    // At least 90 % of the asked rate over the CPU time profiled, which was
    // at least the 1 s asked.
    assert!(cpu >= 1.0, "{line}");
    assert!(
        samples >= LEAST_RATE * HZ * cpu,
        "{samples} samples in {cpu} s of CPU: below {LEAST_RATE} of {HZ} Hz ({line})"
    );
    // Deep, named Rust stacks: nearly every sample unwound to the workload's run.
    let rooted = folded.inclusive(run_frame) as f64;
    assert!(
        rooted >= 0.95 * samples,
        "{rooted} of {samples} samples reach {run_frame}"
    );
    folded
}

#[test]
fn baseline_export_profile_is_full_rate_and_names_the_unescape() {
    if !perf_allowed() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("seed-repro.svg");
    let stdout = profiled(
        &[
            "seed-repro",
            "--quick",
            "--strategies",
            "none",
            "--seconds",
            "1",
            "--sampler",
            "perf",
        ],
        &svg,
    );
    let folded = full_rate_profile(
        &stdout,
        &svg,
        "Export as promlab_lab::harness::arms::Workload>::run",
    );
    // The baseline decodes every key byte by byte: its unescape is a hot
    // frame, named (an inlined one: from the DWARF line tables).
    let samples = folded.samples() as f64;
    let unescape = folded.inclusive("unescape_reference") as f64;
    assert!(
        unescape >= 0.1 * samples,
        "unescape_reference has {unescape} of {samples} samples"
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("unescape_reference"),
        "the SVG lacks the frame"
    );
}

#[test]
fn baseline_ingest_profile_is_full_rate_and_names_the_label_map() {
    if !perf_allowed() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("captures.svg");
    let stdout = profiled(
        &[
            "prometheus-captures",
            "--quick",
            "--strategies",
            "none",
            "--seconds",
            "1",
            "--sampler",
            "perf",
        ],
        &svg,
    );
    let folded = full_rate_profile(
        &stdout,
        &svg,
        "Ingest as promlab_lab::harness::arms::Workload>::run",
    );
    // The baseline builds a HashMap<String, String> of every series' labels
    // per request (`BaselineSeries::canonicalize`) and parses series keys back
    // into one per sample (`parse_series_key`).
    let samples = folded.samples() as f64;
    let label_maps =
        folded.inclusive("BaselineSeries::canonicalize") + folded.inclusive("parse_series_key");
    assert!(
        label_maps as f64 >= 0.1 * samples,
        "the label maps have {label_maps} of {samples} samples"
    );
}

/// `--diff A B`: the differential folded stacks, per unit of work.
fn diff(set_a: &str, set_b: &str, seconds: &str, dir: &Path) -> (Diff, String) {
    let svg = dir.join(format!("{set_a}-vs-{set_b}.svg"));
    let stdout = profiled(
        &[
            "seed-repro",
            "--quick",
            "--diff",
            set_a,
            set_b,
            "--seconds",
            seconds,
            "--sampler",
            "perf",
        ],
        &svg,
    );
    let text = std::fs::read_to_string(svg.with_extension("folded")).unwrap();
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.trim_end().ends_with("</svg>"));
    for side in ["a.folded", "b.folded"] {
        assert!(
            read_folded(&svg.with_extension(side)).samples() > 0,
            "{side}"
        );
    }
    (Diff::parse(&text).unwrap(), stdout)
}

#[test]
fn a_diff_of_a_set_against_itself_is_flat_and_a_real_change_is_not() {
    if !perf_allowed() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (same, stdout) = diff("none", "none", "1", tmp.path());
    let (change, frame) = same.largest_change();
    assert!(
        change.abs() <= FLAT,
        "none against none changed {:+.1} % at {frame}: not flat\n{stdout}",
        100.0 * change
    );
    // fast-unescape alone takes a third of the baseline's work away (1.5× in
    // the ablation), nearly all of it the unescape's.
    let (real, stdout) = diff("none", "fast-unescape", "1", tmp.path());
    let (change, frame) = real.largest_change();
    assert!(
        change <= -2.0 * FLAT,
        "none against fast-unescape changed only {:+.1} % at {frame}\n{stdout}",
        100.0 * change
    );
    let (a, b) = real
        .own_changes(usize::MAX)
        .into_iter()
        .filter(|(f, _, _)| f.contains("unescape_reference"))
        .fold((0, 0), |(x, y), (_, a, b)| (x + a, y + b));
    assert!(a > 0 && b == 0, "unescape_reference: {a} → {b} samples");
}

#[test]
fn the_pprof_fallback_says_what_it_is() {
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("pprof.svg");
    let stdout = profiled(
        &[
            "seed-repro",
            "--quick",
            "--strategies",
            "all",
            "--seconds",
            "0.5",
            "--sampler",
            "pprof",
        ],
        &svg,
    );
    assert!(
        stdout.starts_with("sampler: pprof (SIGPROF timer"),
        "{stdout}"
    );
    assert!(stdout.contains("% of the 997 Hz asked"), "{stdout}");
    assert!(read_folded(&svg.with_extension("folded")).samples() > 0);
}

/// Exit code 1 with `needle` in the message (a panic exits 101), and no SVG left behind.
fn assert_clean_failure(out: &Output, needle: &str, svg: &Path) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{:?}: {stderr}", out.status);
    assert!(stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for path in [svg.to_path_buf(), svg.with_extension("folded")] {
        assert!(!path.exists(), "{} was left behind", path.display());
    }
}

#[test]
fn writes_a_well_formed_svg_and_its_folded_stacks() {
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("seed-repro.svg");
    let stdout = profiled(
        &[
            "seed-repro",
            "--quick",
            "--strategies",
            "all",
            "--seconds",
            "0.5",
        ],
        &svg,
    );
    // Whichever sampler ran, the summary names it and the rate it reached.
    assert!(stdout.starts_with("sampler: "), "{stdout}");
    assert!(stdout.contains(" Hz, "), "{stdout}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.starts_with("<?xml") || text.starts_with("<svg"),
        "not an SVG: {:?}",
        &text[..text.len().min(200)]
    );
    assert!(text.contains("<svg"), "no <svg> element");
    assert!(text.trim_end().ends_with("</svg>"), "the SVG is cut short");
    // The title names what was profiled.
    assert!(text.contains("seed-repro"), "the title lacks the scenario");
    // Folded stacks beside it: `frame;frame count` lines.
    let folded: PathBuf = svg.with_extension("folded");
    assert!(read_folded(&folded).samples() > 0);
}

#[test]
fn unknown_scenario() {
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("nope.svg");
    let out = flamegraph(&["no-such-scenario", "--seconds", "1"], &svg);
    assert_clean_failure(&out, "unknown scenario `no-such-scenario`", &svg);
}

#[test]
fn seconds_must_be_positive() {
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("zero.svg");
    let out = flamegraph(&["seed-repro", "--quick", "--seconds", "0"], &svg);
    assert_clean_failure(&out, "--seconds must be a positive number", &svg);
}

#[test]
fn frequency_must_be_in_range() {
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("hz.svg");
    let out = flamegraph(&["seed-repro", "--quick", "--frequency", "0"], &svg);
    assert_clean_failure(&out, "--frequency must be 1 to 100,000 Hz", &svg);
}

#[test]
fn output_directory_must_exist() {
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("missing-dir/out.svg");
    let out = flamegraph(&["seed-repro", "--quick", "--seconds", "1"], &svg);
    assert_clean_failure(&out, "cannot create", &svg);
}
