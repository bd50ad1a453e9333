//! The offline `promlab ingest` command on the real Prometheus fixtures and on
//! the feeder's own output files.

use std::path::PathBuf;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/remote-write/prometheus-2.42")
}

#[test]
fn ingest_command_prints_identical_json_for_every_combination() {
    let files: Vec<PathBuf> = std::fs::read_dir(fixture_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.toml");
    std::fs::write(
        &plan,
        "lateness_secs = 0\n[[aggregation]]\nid = \"gc\"\nmetric = \"go_gc_duration_seconds\"\ngroup_by = [\"quantile\"]\nwindow_secs = 5\n",
    )
    .unwrap();
    let mut outputs = Vec::new();
    for set in [
        "none",
        "borrowed-decode,bulk-sketch",
        "series-cache,batch-routing",
        "all",
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_promlab"))
            .args(["ingest", "--strategies", set, "--plan"])
            .arg(&plan)
            .args(&files)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        outputs.push(out.stdout);
    }
    assert!(outputs.windows(2).all(|w| w[0] == w[1]));
    let json: serde_json::Value = serde_json::from_slice(&outputs[0]).unwrap();
    let gc = &json[0];
    assert_eq!(gc["aggregation"], "gc");
    assert!(gc["window_start_ms"].as_i64().unwrap() > 1_700_000_000_000);
    let groups = gc["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 5, "{gc}");
    assert_eq!(groups[0]["labels"]["quantile"], "0");
    assert!(groups
        .iter()
        .all(|g| g["count"].as_u64().unwrap() > 0 && g["quantiles"]["0.99"].is_number()));
}

#[test]
fn feeder_out_files_replay_offline() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args([
            "feed",
            "--groups",
            "3",
            "--series-per-group",
            "4",
            "--samples-per-sec",
            "2",
            "--duration-secs",
            "70",
        ])
        .args(["--start-ms", "0", "--batch-rows", "5", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 70 * 5); // 24 rows per tick in requests of 5
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_promlab"))
        .arg("ingest")
        .args(&files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Ticks 0..70 s, lateness 5 s: the window [0, 60 s) closed, with 60 ticks × 2 samples × 4 series per group.
    assert_eq!(json[0]["window_start_ms"], 0);
    let groups = json[0]["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 3);
    assert_eq!(groups[1]["labels"]["label_0"], "g1");
    assert!(groups.iter().all(|g| g["count"] == 480));
}
