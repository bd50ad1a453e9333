//! Where one run of the lanes workload spends its time with every strategy,
//! on 1 and on 2 lanes, alternated: the senders (wall, and each sender's
//! thread CPU and minor page faults), the flush, the answer and the drop of the laned state, each
//! timed apart, with the process's CPU and minor page faults over the whole run.
//!
//! ```text
//! cargo run --release -p promlab-lab --example lanes_phases -- GROUPS SERIES_PER_GROUP TICKS RUNS
//! cargo run --release -p promlab-lab --example lanes_phases -- 1000 100 10 7
//! ```
//! The bodies, each sender's share of them and its pacing are the lanes
//! workload's (`harness::workloads`: each tick in 16 requests; thread `i`
//! sends requests `i`, `i + lanes`, … of each tick, at most 4 ticks ahead of
//! the slowest); the bodies are encoded before the first run. With `baseline-between`,
//! each timed run follows an untimed one with no strategy (on 2 lanes, one
//! sender), as an ablation's runs follow other arms'.

use anyhow::{bail, Context, Result};
use promlab::ingest::lanes::LanedIngester;
use promlab::ingest::plan::Plan;
use promlab::shared::strategy::StrategySet;
use promlab_lab::harness::workloads::{lane_shard, lanes_bodies, ShardPacing};
use std::time::{Duration, Instant};

/// CPU time (user + system) and minor page faults of `who`.
fn usage(who: libc::c_int) -> (Duration, i64) {
    // SAFETY: `rusage` is plain integers, so all zeros is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage only writes the struct it is given.
    unsafe { libc::getrusage(who, &mut usage) };
    let us = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (us(usage.ru_utime) + us(usage.ru_stime), usage.ru_minflt)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (args, between) = match args.as_slice() {
        [rest @ .., last] if last == "baseline-between" => (rest, true),
        all => (all, false),
    };
    let [groups, series_per_group, ticks, runs] = args else {
        bail!("usage: lanes_phases GROUPS SERIES_PER_GROUP TICKS RUNS [baseline-between]");
    };
    let groups: u64 = groups.parse().context("GROUPS")?;
    let series_per_group: u64 = series_per_group.parse().context("SERIES_PER_GROUP")?;
    let ticks: u64 = ticks.parse().context("TICKS")?;
    let runs: usize = runs.parse().context("RUNS")?;
    let (bodies, per_tick) = lanes_bodies(groups, series_per_group, ticks)?;
    let plan = Plan::default();
    let mut answer = Vec::new();
    for run in 0..runs {
        for lanes in [1, 2] {
            if between {
                // What the harness runs between two of an arm's samples: other arms.
                let laned = LanedIngester::with_plan(2, &plan, StrategySet::NONE);
                for body in &bodies {
                    laned.handle(body).expect("request");
                }
                laned.flush();
            }
            let (cpu_start, faults_start) = usage(libc::RUSAGE_SELF);
            let start = Instant::now();
            let laned = LanedIngester::with_plan(lanes, &plan, StrategySet::all());
            let pacing = ShardPacing::new(lanes);
            let sender_cpu: Vec<(Duration, i64)> = std::thread::scope(|s| {
                let threads: Vec<_> = (0..lanes)
                    .map(|i| {
                        let (laned, pacing, bodies) = (&laned, &pacing, &bodies);
                        s.spawn(move || {
                            for (t, tick) in bodies.chunks(per_tick).enumerate() {
                                pacing.wait_to_send(t);
                                for body in lane_shard(tick, lanes, i) {
                                    laned.handle(body).expect("request");
                                }
                                pacing.sent(i);
                            }
                            usage(libc::RUSAGE_THREAD)
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join().unwrap()).collect()
            });
            let handled = Instant::now();
            laned.flush();
            let flushed = Instant::now();
            answer.clear();
            laned.query_all_json(&mut answer);
            let answered = Instant::now();
            drop(laned);
            let dropped = Instant::now();
            let (cpu_end, faults_end) = usage(libc::RUSAGE_SELF);
            println!(
                "run {run} lanes {lanes}: senders {:.1?} (thread cpu, faults {:.1?}), flush {:.1?}, answer {:.1?}, drop {:.1?}, total {:.1?}, process cpu {:.1?}, minor faults {}",
                handled - start,
                sender_cpu,
                flushed - handled,
                answered - flushed,
                dropped - answered,
                dropped - start,
                cpu_end - cpu_start,
                faults_end - faults_start,
            );
        }
    }
    Ok(())
}
