//! The ingest peers alone, at a chosen size, without promlab's ablation arms
//! (the full-size `promlab ablate asap-1e5 --peers` first verifies and times
//! every strategy combination on 30 M samples, which takes hours on 2 cores).
//! Prints what the ablation table prints for a peer row, minus the ratios.
//!
//! ```text
//! cargo build --release && cargo run --release --example ingest_peers -- \
//!     target/release/promlab full 7 [--with-clickhouse] [ARM...]
//! ```
//!
//! Named arms (`peer:chdb`, …) restrict the run to them.

use promlab_lab::harness::load_scenario;
use promlab_lab::harness::peers::{all, PeerContext, PeerOutcome};
use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [bin, size, repeats, rest @ ..] = &args[..] else {
        eprintln!(
            "usage: ingest_peers PROMLAB_BIN quick|full REPEATS [--with-clickhouse] [ARM...]"
        );
        std::process::exit(2);
    };
    let with_clickhouse = rest.iter().any(|a| a == "--with-clickhouse");
    let only: Vec<&String> = rest.iter().filter(|a| *a != "--with-clickhouse").collect();
    let quick = match size.as_str() {
        "quick" => true,
        "full" => false,
        other => panic!("size {other}: quick or full"),
    };
    let repeats: usize = repeats.parse().expect("REPEATS");
    let scenario = load_scenario("asap-1e5").expect("built-in scenario");
    let chosen = |arm: &str| only.is_empty() || only.iter().any(|a| *a == arm);
    for peer in all()
        .into_iter()
        .filter(|p| p.runs(&scenario.name) && chosen(p.arm()))
    {
        let dir = tempfile::tempdir().expect("scratch directory");
        let cx = PeerContext {
            scenario: &scenario,
            size: scenario.size(quick),
            quick,
            repeats,
            promlab: PathBuf::from(bin),
            workdir: dir.path().to_path_buf(),
            with_clickhouse,
        };
        match peer.run(&cx) {
            Ok(PeerOutcome::Measured(r)) => {
                let mut ms: Vec<u128> = r.samples.iter().map(|d| d.as_millis()).collect();
                ms.sort();
                println!(
                    "{}: median {:.2} s CPU per {} {} ({:.1} ns per {}; chunks {:?} ms), peak RSS {:.1} MiB\n  {}",
                    r.arm,
                    r.median().as_secs_f64(),
                    r.units.0,
                    r.units.1,
                    r.ns_per_unit(),
                    r.units.1.trim_end_matches('s'),
                    ms,
                    r.rss_kib.unwrap_or(0) as f64 / 1024.0,
                    r.note
                );
            }
            Ok(PeerOutcome::Skipped(reason)) => println!("{}: skipped: {reason}", peer.arm()),
            Err(e) => println!("{}: failed: {e:#}", peer.arm()),
        }
    }
}
