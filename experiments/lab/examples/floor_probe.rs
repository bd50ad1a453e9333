//! One arm of the render or export ablation, alone in a process, `N` times
//! after one untimed warm-up: for callgrind (instructions per run are the
//! difference between two `N`) and for `perf`.
//!
//! ```text
//! cargo build --release -p promlab-lab --example floor_probe
//! valgrind --tool=callgrind target/release/examples/floor_probe render prerender 3 1000
//! target/release/examples/floor_probe export floor 20
//! ```
//! `render ARM N [QUEUES]`: the RabbitMQ per-object scrape (`ARM` a strategy
//! set, or `floor`); `export ARM N`: a long-lived exporter's warm scrape of
//! the large client_ruby fixture (`large-v5-uri`).

use anyhow::{bail, Context, Result};
use promlab::render::rabbitmq::RabbitMqNode;
use promlab::strategy::StrategySet;
use promlab_lab::harness::floor::{ExportFloor, RenderFloor};
use std::time::{Duration, Instant};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [stage, arm, n, rest @ ..] = args.as_slice() else {
        bail!("usage: floor_probe render|export ARM N [QUEUES]");
    };
    let n: usize = n.parse().context("N")?;
    let mut run: Box<dyn FnMut() -> usize> = match stage.as_str() {
        "render" => {
            let queues = rest.first().map_or(Ok(10_000), |q| q.parse())?;
            let node = RabbitMqNode::build(queues, true, StrategySet::NONE)?;
            if arm == "floor" {
                let mut body = Vec::new();
                node.render_per_object(&mut body);
                let mut floor = RenderFloor::new(&body);
                eprintln!("floor same_bytes={}", floor.same_bytes);
                Box::new(move || floor.run().len())
            } else {
                let set: StrategySet = arm.parse().map_err(anyhow::Error::msg)?;
                let node = RabbitMqNode::build(queues, true, set)?;
                let mut body = Vec::new();
                Box::new(move || {
                    node.render_per_object(&mut body);
                    body.len()
                })
            }
        }
        "export" => {
            let dir = tempfile::tempdir()?;
            let case = promlab_lab::fixtures::unpack_ruby_case("large-v5-uri", dir.path())?;
            let registry = promlab::registry::Registry::load(&case.join("registry.json"))?;
            let store = case.join("store");
            let text = promlab::export::export(&store, &registry, StrategySet::NONE)?;
            if arm == "floor" {
                let mut floor = ExportFloor::new(&store, text)?;
                eprintln!("floor store_bytes={}", floor.store_bytes());
                Box::new(move || {
                    let _keep = &dir;
                    floor.run().len()
                })
            } else {
                let set: StrategySet = arm.parse().map_err(anyhow::Error::msg)?;
                let mut exporter = promlab::export::Exporter::new(&store, registry, set);
                let mut out = Vec::new();
                exporter.export_into(&mut out)?;
                if out != text {
                    bail!("{set}: the exporter's first scrape is not the exposition");
                }
                Box::new(move || {
                    let _keep = &dir;
                    exporter.export_into(&mut out).expect("export");
                    out.len()
                })
            }
        }
        other => bail!("unknown stage {other} (render or export)"),
    };
    run();
    let mut times: Vec<Duration> = Vec::with_capacity(n);
    let mut bytes = 0;
    for _ in 0..n {
        let start = Instant::now();
        bytes = run();
        times.push(start.elapsed());
    }
    times.sort();
    if let Some(median) = times.get(times.len() / 2) {
        println!(
            "{stage} {arm}: {n} runs, median {median:.2?}, min {:.2?}, {bytes} bytes",
            times[0]
        );
    }
    Ok(())
}
