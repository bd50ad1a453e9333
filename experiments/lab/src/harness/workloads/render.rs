//! The render workload: RabbitMQ's per-object scrape of a live registry.

use super::{Output, Workload};
use anyhow::Result;
use promlab::shared::strategy::{Stage, StrategySet};
use std::collections::HashMap;

/// Render: RabbitMQ's per-object scrape of a live registry. Each strategy set
/// gets its own registry, built once (`prerender` pays its escaping there, at
/// series creation); a run is one scrape into a reused buffer.
pub(super) struct Render {
    queues: usize,
    awkward_names: bool,
    scenarios: HashMap<StrategySet, promlab::scenarios::rabbitmq::RabbitMqNode>,
    body: Vec<u8>,
    floor: Option<super::floor::RenderFloor>,
}

impl Render {
    pub(super) fn new(queues: usize, awkward_names: bool) -> Render {
        Render {
            queues,
            awkward_names,
            scenarios: HashMap::new(),
            body: Vec::new(),
            floor: None,
        }
    }

    fn scenario(
        &mut self,
        strategies: StrategySet,
    ) -> Result<&promlab::scenarios::rabbitmq::RabbitMqNode> {
        // Only the render stage's strategies change a registry.
        let key = strategies.restrict(Stage::Render);
        if !self.scenarios.contains_key(&key) {
            let scenario = promlab::scenarios::rabbitmq::RabbitMqNode::build(
                self.queues,
                self.awkward_names,
                key,
            )?;
            self.scenarios.insert(key, scenario);
        }
        Ok(&self.scenarios[&key])
    }
}

impl Workload for Render {
    fn run(&mut self, strategies: StrategySet) -> Result<Output<'_>> {
        let mut body = std::mem::take(&mut self.body);
        self.scenario(strategies)?.render_per_object(&mut body);
        self.body = body;
        Ok(Output::Bytes(&self.body))
    }

    /// The lines of the last scrape (every scrape has as many).
    fn units(&self) -> (u64, &'static str) {
        let lines = self.body.iter().filter(|&&b| b == b'\n').count();
        (lines as u64, "lines")
    }

    /// The scrape's lines prerendered from the baseline's exposition, copied,
    /// each value formatted: the same bytes when every value prints in its
    /// shortest form, otherwise checked by its line count.
    fn floor(&mut self) -> Result<Output<'_>> {
        if self.floor.is_none() {
            let mut body = std::mem::take(&mut self.body);
            self.scenario(StrategySet::NONE)?
                .render_per_object(&mut body);
            self.floor = Some(super::floor::RenderFloor::new(&body));
            // A scrape's lines are the units, whether the floor runs first or not.
            self.body = body;
        }
        // Into the arms' buffer (see `RenderFloor::run_into`).
        let floor = self.floor.as_mut().expect("built above");
        floor.run_into(&mut self.body);
        if floor.same_bytes {
            Ok(Output::Bytes(&self.body))
        } else {
            Ok(Output::Units(floor.lines()))
        }
    }
}
