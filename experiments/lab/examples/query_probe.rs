//! The query's answer computed afresh against its floor, alone: `all-uncached`
//! and `floor-uncached` of asap-query, alternated, ROUNDS samples of BATCH back-to-back runs each.
//!
//! ```text
//! cargo run --release -p promlab-lab --example query_probe -- 1000 2 66 200 3
//! ```
use anyhow::{bail, Result};
use promlab::shared::strategy::{Stage, StrategySet};
use promlab_lab::harness::query::Query;
use promlab_lab::harness::{quantile, Workload};
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let [groups, series_per_group, ticks, rounds, batch] = args[..] else {
        bail!("usage: query_probe GROUPS SERIES_PER_GROUP TICKS ROUNDS BATCH");
    };
    let mut query = Query::feeder(groups, series_per_group, ticks)?;
    let all = StrategySet::all().restrict(Stage::Ingest);
    let (mut arm, mut floor) = (Vec::new(), Vec::new());
    let thrash = std::env::var_os("THRASH").is_some();
    // One sample: `batch` runs of an arm back to back, per run.
    let mut sample = |name: &str| -> Result<std::time::Duration> {
        let start = Instant::now();
        for _ in 0..batch {
            query.run_extra(name, all)?;
        }
        Ok(start.elapsed() / batch as u32)
    };
    for _ in 0..rounds {
        if thrash {
            sample("all-serde")?;
        }
        arm.push(sample("all-uncached")?);
        if thrash {
            sample("all-serde")?;
        }
        floor.push(sample("floor-uncached")?);
    }
    let (a, f) = (quantile(&arm, 0.5), quantile(&floor, 0.5));
    println!(
        "all-uncached {a:.1?}  floor-uncached {f:.1?}  ratio {:.3}",
        a.as_secs_f64() / f.as_secs_f64()
    );
    Ok(())
}
