//! What docs/ruby.md shows but cannot run here (a Kubernetes pod, a systemd
//! unit) is at least well-formed: every YAML block parses (Ruby's Psych), and
//! the unit passes `systemd-analyze verify` with its `ExecStart` pointed at
//! the built binary, where `systemd-analyze` exists (skipped otherwise, a
//! failure under `CI`). Under a second.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

fn page() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ruby.md"))
        .unwrap()
}

/// The page's fenced blocks of `language`.
fn blocks(page: &str, language: &str) -> Vec<String> {
    let fence = format!("```{language}\n");
    page.split(fence.as_str())
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap().to_string())
        .collect()
}

#[test]
fn the_pod_parses() {
    let yaml = blocks(&page(), "yaml");
    assert!(!yaml.is_empty(), "no YAML block in docs/ruby.md");
    if Command::new("ruby").arg("-v").output().is_err() {
        common::skip(
            "ruby, so the page's YAML is not parsed",
            "apt-get install ruby",
        );
        return;
    }
    for block in yaml {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("block.yaml");
        std::fs::write(&file, &block).unwrap();
        let out = Command::new("ruby")
            .args(["-ryaml", "-e"])
            .arg("docs = YAML.load_stream(File.read(ARGV[0])); abort 'empty' if docs.empty?; docs.each { |d| abort 'no kind' unless d['kind'] && d['spec'] }")
            .arg(&file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{block}\n{out:?}");
    }
}

#[test]
fn the_unit_verifies() {
    let units = blocks(&page(), "ini");
    assert_eq!(units.len(), 1, "one systemd unit in docs/ruby.md");
    let unit = units[0].replace("/usr/local/bin/promlab", env!("CARGO_BIN_EXE_promlab"));
    assert!(unit.contains(env!("CARGO_BIN_EXE_promlab")), "{unit}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("promlab-sidecar.service");
    std::fs::write(&file, unit).unwrap();
    let out = match Command::new("systemd-analyze")
        .arg("verify")
        .arg(&file)
        .output()
    {
        Ok(out) => out,
        Err(_) => {
            common::skip(
                "systemd-analyze, so the page's unit is not verified",
                "apt-get install systemd",
            );
            return;
        }
    };
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
