//! Where one run of the ingest workload spends its time with every strategy:
//! the requests handled, the flush (every open window closed into bins), the
//! answer (every aggregation's JSON) and the drop of the ingester's state,
//! each timed apart, per run.
//!
//! ```text
//! cargo run --release -p promlab-lab --example ingest_phases -- GROUPS SERIES_PER_GROUP TICKS RUNS
//! cargo run --release -p promlab-lab --example ingest_phases -- 100000 10 5 5
//! ```
//! The bodies are the feeder's (`churn_bodies` without churn), encoded
//! before the first run; each run starts from a fresh ingester, as the
//! ablation's ingest workload does. The first run pays the process's first
//! touch of its memory.

use anyhow::{bail, Context, Result};
use promlab::ingest::pipeline::Ingester;
use promlab::ingest::plan::Plan;
use promlab::shared::strategy::StrategySet;
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [groups, series_per_group, ticks, runs] = args.as_slice() else {
        bail!("usage: ingest_phases GROUPS SERIES_PER_GROUP TICKS RUNS");
    };
    let groups: u64 = groups.parse().context("GROUPS")?;
    let series_per_group: u64 = series_per_group.parse().context("SERIES_PER_GROUP")?;
    let ticks: u64 = ticks.parse().context("TICKS")?;
    let runs: usize = runs.parse().context("RUNS")?;
    let bodies: Vec<Vec<u8>> =
        promlab_lab::harness::workloads::churn_bodies(groups, series_per_group, ticks, 0).collect();
    let plan = Plan::default();
    let mut answer = Vec::new();
    for run in 0..runs {
        let start = Instant::now();
        let mut ingester = Ingester::new(plan.clone(), StrategySet::all());
        for body in &bodies {
            ingester.handle(body)?;
        }
        let handled = Instant::now();
        ingester.flush();
        let flushed = Instant::now();
        answer.clear();
        ingester.query_all_json(&mut answer);
        let answered = Instant::now();
        drop(ingester);
        let dropped = Instant::now();
        println!(
            "run {run}: handle {:.1?}, flush {:.1?}, answer {:.1?} ({} bytes), drop {:.1?}, total {:.1?}",
            handled - start,
            flushed - handled,
            answered - flushed,
            answer.len(),
            dropped - answered,
            dropped - start,
        );
    }
    Ok(())
}
