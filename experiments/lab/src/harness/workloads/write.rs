//! The write workload: warm writers, one per strategy set.

use super::{Output, Workload};
use anyhow::Result;
use promlab::scenarios::store_workloads::{self, LongLabelWriter};
use promlab::shared::strategy::StrategySet;
use std::collections::HashMap;

/// Write: `steps` × (histogram observe + counter increment) with a 195-char label.
pub(super) struct LongLabel {
    steps: usize,
    /// One warm writer per strategy set, so runs time the steady state.
    writers: HashMap<StrategySet, (tempfile::TempDir, LongLabelWriter)>,
    floor: Option<super::floor::WriteFloor>,
}

impl LongLabel {
    pub(super) fn new(steps: usize) -> LongLabel {
        LongLabel {
            steps,
            writers: HashMap::new(),
            floor: None,
        }
    }
}

impl Workload for LongLabel {
    /// `steps` steps of the set's warm writer (the first run starts from an
    /// empty directory); returns the directory it writes.
    fn run(&mut self, strategies: StrategySet) -> Result<Output<'_>> {
        let (dir, writer) = match self.writers.entry(strategies) {
            std::collections::hash_map::Entry::Occupied(slot) => slot.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let dir = tempfile::tempdir()?;
                let writer = LongLabelWriter::new(dir.path(), strategies)?;
                slot.insert((dir, writer))
            }
        };
        for i in 0..self.steps {
            writer.step(store_workloads::long_label_step_value(i))?;
        }
        Ok(Output::Store(dir.path()))
    }

    fn units(&self) -> (u64, &'static str) {
        (self.steps as u64, "steps")
    }

    /// The lock pair alone, once per step: the store is not written.
    fn floor(&mut self) -> Result<Output<'_>> {
        let floor = match &mut self.floor {
            Some(floor) => floor,
            None => self.floor.insert(super::floor::WriteFloor::new()?),
        };
        Ok(Output::Units(floor.run(self.steps)?))
    }
}
