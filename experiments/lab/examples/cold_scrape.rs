//! A long-lived exporter's scrape with every strategy against the export
//! floor, warm and with the caches flushed before each scrape: how much of
//! `all ÷ floor` in the ablation (which times one scrape right after every
//! other arm's run) is cold caches, and how much is work.
//!
//! ```text
//! promlab scenario-store seed-repro --out /tmp/seed && promlab fold --store /tmp/seed/store --registry /tmp/seed/registry.json
//! cargo run --release -p promlab-lab --example cold_scrape -- /tmp/seed/store /tmp/seed/registry.json 300 0 4 16 64
//! ```
//! STORE may be `clones:N`: client_ruby 5.x's all-types fixture cloned under N
//! exited pids (export-files' points: 60, 600, 6000), folded, in a scratch
//! directory; REGISTRY is then ignored.
//!
//! `STORE REGISTRY ROUNDS MIB...`: per MiB given, `ROUNDS` rounds, each
//! writing one byte per cache line of a MiB-sized buffer (0: nothing; this
//! machine's L2 is 1 MiB a core, its L3 32 MiB) before a scrape by the
//! exporter, then again before one by the floor; medians. The exporter's
//! scrapes are checked against its first, the floor's against that too where
//! it prints the same bytes. Both write into the same buffer.

use anyhow::{bail, ensure, Context, Result};
use promlab::export::Exporter;
use promlab::format::registry::Registry;
use promlab::shared::strategy::StrategySet;
use promlab_lab::harness::clones;
use promlab_lab::harness::floor::ExportFloor;
use promlab_lab::harness::quantile;
use std::path::Path;
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [store, registry, rounds, sizes @ ..] = args.as_slice() else {
        bail!("usage: cold_scrape STORE REGISTRY ROUNDS MIB...");
    };
    let scratch = tempfile::tempdir()?;
    let (store, registry) = match store.strip_prefix("clones:") {
        Some(processes) => {
            let processes = processes.parse().context("clones:N")?;
            let registry = clones::write("all-types-v5-uri", processes, scratch.path())?;
            promlab::export::fold::fold_store(scratch.path(), &registry, &Default::default())?;
            (scratch.path(), registry)
        }
        None => (Path::new(store), Registry::load(Path::new(registry))?),
    };
    let rounds: usize = rounds.parse().context("ROUNDS")?;
    let mut exporter = Exporter::new(store, registry, StrategySet::all());
    let mut expected = Vec::new();
    exporter.export_into(&mut expected)?;
    let mut floor = ExportFloor::new(store, expected.clone())?;
    let floor_same_bytes = floor.same_bytes();
    let mut out = Vec::new();
    for size in sizes {
        let mib: usize = size.parse().context("MIB")?;
        let mut junk = vec![0u8; mib << 20];
        let mut flush = |round: usize| {
            for line in junk.chunks_mut(64) {
                line[0] = line[0].wrapping_add(round as u8 | 1);
            }
        };
        let (mut all, mut least) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            flush(round);
            let start = Instant::now();
            exporter.export_into(&mut out)?;
            all.push(start.elapsed());
            ensure!(out == expected, "a scrape differs from the first");
            flush(round);
            let start = Instant::now();
            floor.run_into(&mut out)?;
            least.push(start.elapsed());
            ensure!(
                !floor_same_bytes || out == expected,
                "the floor's scrape differs"
            );
        }
        let (all, least) = (quantile(&all, 0.5), quantile(&least, 0.5));
        println!(
            "{mib:>3} MiB flushed: all {all:>10.1?}  floor {least:>10.1?}  all ÷ floor {:.2}",
            all.as_secs_f64() / least.as_secs_f64()
        );
    }
    Ok(())
}
