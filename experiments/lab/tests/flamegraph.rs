//! `promlab flamegraph`: a short profile of a quick scenario gives a
//! well-formed SVG; bad input gives a clear error and no file.

use std::path::Path;
use std::process::{Command, Output};

fn flamegraph(args: &[&str], out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_promlab"))
        .arg("flamegraph")
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run promlab")
}

/// Exit code 1 with `needle` in the message (a panic exits 101), and no SVG left behind.
fn assert_clean_failure(out: &Output, needle: &str, svg: &Path) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{:?}: {stderr}", out.status);
    assert!(stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!svg.exists(), "{} was left behind", svg.display());
}

#[test]
fn writes_a_well_formed_svg() {
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("seed-repro.svg");
    let out = flamegraph(
        &[
            "seed-repro",
            "--quick",
            "--strategies",
            "all",
            "--seconds",
            "1",
        ],
        &svg,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
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
fn output_directory_must_exist() {
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("missing-dir/out.svg");
    let out = flamegraph(&["seed-repro", "--quick", "--seconds", "1"], &svg);
    assert_clean_failure(&out, "cannot create", &svg);
}
