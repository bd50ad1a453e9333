//! Warm scrapes of a store directory by long-lived exporters, arms
//! interleaved round by round, every scrape checked against the baseline's
//! one-shot exposition; and one-shot exports. Thread CPU time and wall time
//! per scrape, medians.
//!
//!   cargo run --release -p promlab-lab --example store_scrape -- STORE REGISTRY ROUNDS ARM...
//!
//! An ARM is a strategy set (`none`, `all`, `single-read,prerender`, …),
//! `one-shot:SET` for `promlab export`'s one scrape, or `floor`: every store
//! file's used region, kept in memory, read once (the least a warm scrape can
//! do: its values must be read). Each long-lived exporter keeps a mapping per
//! file, and a process has `vm.max_map_count` of them (65,530 by default):
//! at tens of thousands of files, run one warm arm per process, alternated.

use anyhow::{bail, Context, Result};
use promlab::export::{export, Exporter};
use promlab::format::registry::Registry;
use promlab::shared::strategy::StrategySet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: fills `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

enum Arm {
    Warm(String, Box<Exporter>),
    OneShot(String, StrategySet),
    Floor(Vec<Vec<u8>>),
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        bail!("usage: store_scrape STORE REGISTRY ROUNDS ARM...");
    }
    let store = PathBuf::from(&args[0]);
    let registry = Registry::load(Path::new(&args[1]))?;
    let rounds: usize = args[2].parse().context("ROUNDS")?;
    let expected = export(&store, &registry, StrategySet::NONE)?;
    let mut arms = Vec::new();
    for arm in &args[3..] {
        arms.push(if arm == "floor" {
            let mut files = Vec::new();
            for entry in std::fs::read_dir(&store)? {
                let path = entry?.path();
                if path.is_file() {
                    files.push(std::fs::read(path)?);
                }
            }
            Arm::Floor(files)
        } else if let Some(set) = arm.strip_prefix("one-shot:") {
            Arm::OneShot(arm.clone(), set.parse().map_err(anyhow::Error::msg)?)
        } else {
            let strategies: StrategySet = arm.parse().map_err(anyhow::Error::msg)?;
            let exporter = Exporter::new(&store, registry.clone(), strategies);
            Arm::Warm(arm.clone(), Box::new(exporter))
        });
    }
    let mut out = Vec::new();
    // Warm-up: every exporter's first scrape, checked.
    for arm in &mut arms {
        if let Arm::Warm(name, exporter) = arm {
            exporter.export_into(&mut out)?;
            if out != expected {
                bail!("{name}: first scrape differs from the baseline's export");
            }
        }
    }
    let mut times: Vec<Vec<(Duration, Duration)>> = vec![Vec::new(); arms.len()];
    for round in 0..rounds {
        for k in 0..arms.len() {
            let i = (k + round) % arms.len();
            let (t, c) = (Instant::now(), thread_cpu());
            let ok = match &mut arms[i] {
                Arm::Warm(_, exporter) => {
                    exporter.export_into(&mut out)?;
                    out == expected
                }
                Arm::OneShot(_, set) => {
                    out = export(&store, &registry, *set)?;
                    out == expected
                }
                Arm::Floor(maps) => {
                    let mut sum = 0u64;
                    for map in maps.iter() {
                        let used = i32::from_le_bytes(map[..4].try_into()?) as usize;
                        for word in map[..used.min(map.len())].chunks_exact(8) {
                            sum = sum.wrapping_add(u64::from_le_bytes(word.try_into()?));
                        }
                    }
                    std::hint::black_box(sum);
                    true
                }
            };
            times[i].push((t.elapsed(), thread_cpu() - c));
            if !ok {
                bail!("arm {i} gave other bytes in round {round}");
            }
        }
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let floor_cpu = arms
        .iter()
        .zip(&times)
        .find(|(a, _)| matches!(a, Arm::Floor(_)))
        .map(|(_, t)| median(t.iter().map(|x| x.1).collect()));
    println!("arm\tmedian wall\tmedian thread CPU\tmin wall\tCPU / floor CPU");
    for (arm, t) in arms.iter().zip(&times) {
        let name = match arm {
            Arm::Warm(name, _) | Arm::OneShot(name, _) => name.as_str(),
            Arm::Floor(_) => "floor",
        };
        let wall = median(t.iter().map(|x| x.0).collect());
        let cpu = median(t.iter().map(|x| x.1).collect());
        let min = t.iter().map(|x| x.0).min().unwrap_or_default();
        let ratio = floor_cpu.map_or(String::from("-"), |f| {
            format!("{:.2}x", cpu.as_secs_f64() / f.as_secs_f64())
        });
        println!("{name}\t{wall:.2?}\t{cpu:.2?}\t{min:.2?}\t{ratio}");
    }
    Ok(())
}
