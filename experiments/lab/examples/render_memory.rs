//! Peak memory (VmHWM) of the RabbitMQ scenario's registry, and of one render.
//!
//! ```text
//! cargo run --release --example render_memory -- 10000 prerender
//! cargo run --release --example render_memory -- 10000 none
//! ```
//! One process per strategy set: the high-water mark only ever grows.

use promlab::scenarios::rabbitmq::RabbitMqNode;
use promlab::shared::strategy::StrategySet;
use promlab_lab::machine::ProcessStats;
use std::time::Instant;

/// `VmHWM` and `VmRSS` of this process, in KiB (Linux `/proc/self/status`).
fn memory_kib() -> (u64, u64) {
    let stats = ProcessStats::of_self().unwrap_or_default();
    (stats.peak_rss_kib.unwrap_or(0), stats.rss_kib.unwrap_or(0))
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let queues: usize = args
        .next()
        .map(|q| q.parse())
        .transpose()?
        .unwrap_or(10_000);
    let strategies: StrategySet = args
        .next()
        .unwrap_or_else(|| "prerender".into())
        .parse()
        .map_err(anyhow::Error::msg)?;
    let (hwm0, _) = memory_kib();
    let start = Instant::now();
    let scenario = RabbitMqNode::build(queues, false, strategies)?;
    let built = start.elapsed();
    let (hwm1, rss1) = memory_kib();
    let mut out = Vec::new();
    scenario.render_per_object(&mut out);
    let (hwm2, _) = memory_kib();
    println!(
        "queues={queues} series={} strategies={strategies} build={:.0?} \
         start_hwm={hwm0}KiB registry_hwm={hwm1}KiB registry_rss={rss1}KiB \
         after_render_hwm={hwm2}KiB body={}B",
        scenario.series_count(),
        built,
        out.len()
    );
    Ok(())
}
