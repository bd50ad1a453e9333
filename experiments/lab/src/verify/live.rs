//! The live renderer ([`LiveRegistry`], what `promlab serve --scenario
//! rabbitmq` serves) under every strategy set, against the reference renderer
//! ([`promlab::reference::live`]) on the same families as plain data.
//!
//! Per set, literally (a registry is cheap at this size): a RabbitMQ node
//! with awkward names (quotes, backslashes, newlines, non-ASCII in vhosts,
//! queues and exchanges), scraped per object, moved, scraped again, and
//! scraped through the detailed endpoint's family selection; and a registry
//! of generated families (every awkward label value, non-UTF-8 bytes, values
//! from `-0.0` and subnormals to `±Infinity` and `NaN`), scraped once.

use anyhow::{bail, Result};
use promlab::reference::live::{self as reference, Family};
use promlab::render::live::LiveRegistry;
use promlab::scenarios::rabbitmq::{self, RabbitMqNode};
use promlab::shared::strategy::StrategySet;

/// What the live renderer's check covered.
#[derive(Clone, Copy, Debug, Default)]
pub struct LiveReport {
    pub sets: usize,
    /// Series of one set's registries.
    pub series: usize,
    /// Scrapes compared per set.
    pub scrapes: usize,
}

/// The detailed endpoint's selection checked: a group, and an alias of part of one.
const DETAILED: [&str; 2] = ["channel_queue_metrics", "queue_consumer_count"];

/// Checks every set of `sets` on a node of `queues` queues and the families
/// generated from `seed`. `Err` names the first set and scrape that differ.
pub fn check(sets: &[StrategySet], queues: usize, seed: u64) -> Result<LiveReport> {
    let generated = super::generate::live_families(seed);
    let selected = rabbitmq::selected_names(DETAILED)?;
    let moved = rabbitmq::contents(queues, true, 2);
    let expected = [
        (
            "per-object scrape",
            reference::render(&rabbitmq::contents(queues, true, 1)),
        ),
        ("per-object scrape after a move", reference::render(&moved)),
        (
            "detailed scrape",
            reference::render(
                &moved
                    .iter()
                    .filter(|f| selected.contains(&f.name))
                    .cloned()
                    .collect::<Vec<_>>(),
            ),
        ),
        ("generated families", reference::render(&generated)),
    ];
    let mut report = LiveReport {
        series: Family::count(&moved) + Family::count(&generated),
        scrapes: expected.len(),
        ..LiveReport::default()
    };
    let mut out = Vec::new();
    for &set in sets {
        let mut node = RabbitMqNode::build(queues, true, set)?;
        let mut scrapes = Vec::with_capacity(expected.len());
        node.render_per_object(&mut out);
        scrapes.push(out.clone());
        node.advance();
        node.render_per_object(&mut out);
        scrapes.push(out.clone());
        node.render_detailed(DETAILED, &mut out)?;
        scrapes.push(out.clone());
        registry_of(&generated, set)?.render_into(&mut out);
        scrapes.push(out.clone());
        for ((what, want), got) in expected.iter().zip(&scrapes) {
            if got != want {
                bail!(
                    "live renderer, strategy set `{set}`: the {what} differs from the reference renderer's {}",
                    promlab::reference::first_difference::first_difference(got, want, "promlab", "reference")
                );
            }
        }
        report.sets += 1;
    }
    Ok(report)
}

/// A live registry holding `families`, under `strategies`.
fn registry_of(families: &[Family], strategies: StrategySet) -> Result<LiveRegistry> {
    let mut registry = LiveRegistry::new(strategies);
    for family in families {
        let names: Vec<&str> = family.label_names.iter().map(String::as_str).collect();
        let id = registry.register(&family.name, family.kind, &family.help, &names)?;
        for (values, value) in &family.series {
            let values: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            let series = registry.series(id, &values)?;
            registry.set(series, *value);
        }
    }
    Ok(registry)
}
