//! The ingest peers at a tiny size (seconds, not minutes): each installed one
//! is measured and its exact quantiles agree with promlab's within α (a
//! disagreement fails the run, so `Measured` means the comparison passed).
//! A peer that is not installed is skipped with a notice, and under `CI` that
//! fails (`.ci/run` installs every peer: Debian's prometheus and
//! victoria-metrics, chdb into experiments/peers/.venv).

#[path = "../../../tests/common/mod.rs"]
mod common;

use promlab_lab::harness::load_scenario;
use promlab_lab::harness::peers::remote_write::{find_binary, FeedPlan};
use promlab_lab::harness::peers::{
    chdb, prometheus, victoriametrics, Peer, PeerContext, PeerOutcome, PeerResult,
};
use std::path::PathBuf;

/// 2,000 samples/s for 1 + 2 × 3 ticks: one open minute, compared as far as it got.
const TINY: FeedPlan = FeedPlan {
    groups: 20,
    warmup_ticks: 1,
    chunk_ticks: 3,
    chunks: 2,
};

fn context_run(peer: &dyn Peer, with_clickhouse: bool) -> Result<PeerOutcome, String> {
    let scenario = load_scenario("asap-1e5").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cx = PeerContext {
        scenario: &scenario,
        size: &scenario.quick,
        quick: true,
        repeats: 2,
        promlab: PathBuf::from(env!("CARGO_BIN_EXE_promlab")),
        workdir: dir.path().to_path_buf(),
        with_clickhouse,
    };
    let outcome = peer.run(&cx).map_err(|e| format!("{e:#}"));
    // Nothing left running: no process names the peer's work directory.
    let workdir = dir.path().to_string_lossy().into_owned();
    let survivors: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&workdir))
        .collect();
    assert!(survivors.is_empty(), "still running: {survivors:?}");
    outcome
}

fn measured(peer: &dyn Peer, with_clickhouse: bool) -> PeerResult {
    match context_run(peer, with_clickhouse) {
        Ok(PeerOutcome::Measured(result)) => result,
        Ok(PeerOutcome::Skipped(reason)) => panic!("{} skipped: {reason}", peer.arm()),
        Err(e) => panic!("{} failed: {e}", peer.arm()),
    }
}

fn run_tiny(peer: &dyn Peer, binary: &str) {
    if find_binary(binary).is_none() {
        common::skip(
            &format!("the `{binary}` binary, so no {} arm", peer.arm()),
            "experiments/peers/install.sh",
        );
        return;
    }
    let result = measured(peer, false);
    eprintln!(
        "{}: {:.0} ns/sample CPU, RSS {:?} KiB\n{}",
        result.arm,
        result.ns_per_unit(),
        result.rss_kib,
        result.note
    );
    assert_eq!(result.arm, peer.arm());
    assert_eq!(result.samples.len(), 2);
    assert_eq!(result.units, (3 * 2_000, "samples".to_string()));
    // CPU per sample: some, and under a millisecond (the /proc clock ticks at 10 ms,
    // so one chunk may read zero, but not every chunk of a receiver doing the work).
    let total: std::time::Duration = result.samples.iter().sum();
    assert!(!total.is_zero(), "no CPU measured: {:?}", result.samples);
    assert!(
        result.ns_per_unit() < 1e6,
        "{} ns per sample",
        result.ns_per_unit()
    );
    assert!(result.rss_kib.is_some_and(|k| k > 1024));
    assert!(result.note.contains("within α = 0.01"), "{}", result.note);
}

#[test]
fn prometheus_peer_measures_and_agrees() {
    run_tiny(&prometheus::peer(Some(TINY)), prometheus::SPEC.binary);
}

#[test]
fn victoriametrics_peer_measures_and_agrees() {
    run_tiny(
        &victoriametrics::peer(Some(TINY)),
        victoriametrics::SPEC.binary,
    );
}

#[test]
fn chdb_peer_needs_its_flag_then_agrees() {
    let peer = chdb::Chdb { plan: Some(TINY) };
    match context_run(&peer, false) {
        Ok(PeerOutcome::Skipped(reason)) => assert_eq!(reason, "needs --with-clickhouse"),
        other => panic!("without --with-clickhouse: {other:?}"),
    }
    // The python the peer uses: the peers' venv if install.sh made one.
    let python = promlab_lab::harness::peers::python_export::python();
    let importable = std::process::Command::new(&python)
        .args(["-c", "import chdb"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !importable {
        common::skip(
            &format!("chdb for {}, so no peer:chdb arm", python.display()),
            "experiments/peers/install.sh --with-clickhouse",
        );
        return;
    }
    // One minute of 20 groups × 100 series: 120,000 rows, two batches (the first a warm-up).
    let result = measured(&peer, true);
    eprintln!(
        "{}: {:.0} ns/row CPU, RSS {:?} KiB\n{}",
        result.arm,
        result.ns_per_unit(),
        result.rss_kib,
        result.note
    );
    assert_eq!(result.samples.len(), 1);
    assert_eq!(result.units, (100_000, "rows".to_string()));
    assert!(
        result.ns_per_unit() < 1e6,
        "{} ns per row",
        result.ns_per_unit()
    );
}
