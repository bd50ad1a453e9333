//! What an arm is: a workload run under a strategy set, its floor, another
//! path to the same answer, or upkeep beside the runs; what each reads; and
//! which arms an ablation runs.

use super::workloads;
use anyhow::{bail, Result};
use promlab::format::registry::Registry;
use promlab::shared::strategy::{Stage, Strategy, StrategySet};
use std::path::Path;

/// What one run produced, as it returns it.
pub enum Output<'a> {
    /// Bytes every run of every strategy combination must reproduce
    /// (exposition, or quantile JSON and counters).
    Bytes(&'a [u8]),
    /// A store directory the run wrote into (the write stage's product). Its
    /// state grows run by run, so it is compared after the same number of runs.
    Store(&'a Path),
    /// A floor's product, which is not the stage's answer: how many units it
    /// handled (checked against [`Workload::units`]).
    Units(u64),
    /// A store directory the run changed in place (the fold's copy): its
    /// exposition is the answer, as the reference exporter reads it after
    /// the timed run.
    StoreRead(&'a Path, &'a Registry),
}

impl Output<'_> {
    /// The comparable bytes: a store directory is read (timestamps zeroed),
    /// a store to read is exported by the reference exporter.
    pub fn bytes(&self) -> Result<std::borrow::Cow<'_, [u8]>> {
        Ok(match self {
            Output::Bytes(bytes) => std::borrow::Cow::Borrowed(bytes),
            Output::Store(dir) => std::borrow::Cow::Owned(workloads::store_bytes(dir)?),
            Output::Units(n) => std::borrow::Cow::Owned(n.to_le_bytes().to_vec()),
            Output::StoreRead(dir, registry) => {
                std::borrow::Cow::Owned(promlab::reference::exposition::export(dir, registry)?)
            }
        })
    }

    /// [`Output::bytes`], owned.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        Ok(self.bytes()?.into_owned())
    }
}

/// What an arm reads, where its stage has more than one input. An export
/// scenario's store is read as written (what `promlab serve --store` reads)
/// or as a copy folded once (what `serve --fold-exited` reads between its
/// folds); every other stage has one input. Only arms reading the same input
/// are compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Input {
    /// The stage's one input.
    One,
    /// The store as its writers left it.
    AsWritten,
    /// The store with its exited processes' files folded.
    Folded,
}

impl Input {
    /// Its name in the results' `reads` column (empty for [`Input::One`]).
    pub fn name(self) -> &'static str {
        match self {
            Input::One => "",
            Input::AsWritten => "as-written",
            Input::Folded => "folded",
        }
    }

    pub fn parse(name: &str) -> Option<Input> {
        [Input::One, Input::AsWritten, Input::Folded]
            .into_iter()
            .find(|i| i.name() == name)
    }

    /// The input of a strategy arm of an export scenario: the folded copy
    /// when the set has `fold-exited`, else the store as written.
    pub fn of_export_set(strategies: StrategySet) -> Input {
        if strategies.contains(Strategy::FoldExited) {
            Input::Folded
        } else {
            Input::AsWritten
        }
    }
}

/// A workload ready to run: built once, run many times.
pub trait Workload {
    /// One timed run, returning what it produced: that is what is verified.
    /// The first run of a strategy set produces the scenario's expected output.
    fn run(&mut self, strategies: StrategySet) -> Result<Output<'_>>;
    /// How much one run does, and of what (`lines`, `samples`, `ops`).
    fn units(&self) -> (u64, &'static str);
    /// The stage's floor on the same input: the least work its contract allows
    /// ([`floor`]). Checked like an arm: bytes against the verified answer, or
    /// ([`Output::Units`]) the units it handled against [`Workload::units`].
    fn floor(&mut self) -> Result<Output<'_>>;
    /// Called once, before anything runs, when several arms will share this
    /// workload (ablate, scale; not `arm-rss`'s child, which runs one): a
    /// workload whose arms share a process-wide resource settles it here.
    /// `all` is the stage's strategy set the ablation runs.
    fn prepare_arms(&mut self, _all: StrategySet) -> Result<()> {
        Ok(())
    }
    /// Arms besides the strategy sets and the stage's floor, by name, with
    /// the strategy set each runs under and its kind: other paths to the
    /// answer (the query's), arms that complete an input (export's store as
    /// written under every strategy, the baseline on the folded copy), floors
    /// of other contracts or inputs, upkeep (the fold). `all` is the stage's
    /// strategy set the ablation runs.
    fn extra_arms(&self, _all: StrategySet) -> Vec<(&'static str, StrategySet, ArmKind)> {
        Vec::new()
    }
    /// One run of an extra arm ([`Workload::extra_arms`]).
    fn run_extra(&mut self, name: &str, _strategies: StrategySet) -> Result<Output<'_>> {
        bail!("no extra arm `{name}` in this workload")
    }
    /// The floor arm the arm `name` (run under `strategies`) is held to: the
    /// stage's (`floor`) unless the arm keeps another contract or reads
    /// another input; empty for none.
    fn floor_of(&self, _arm: &str, _strategies: StrategySet) -> &'static str {
        FLOOR
    }
    /// What the arm `name` (run under `strategies`) reads.
    fn input_of(&self, _arm: &str, _strategies: StrategySet) -> Input {
        Input::One
    }
    /// How much one run of the arm `name` does, where that is not
    /// [`Workload::units`] (the fold: files folded).
    fn units_of(&self, _arm: &str) -> (u64, &'static str) {
        self.units()
    }
    /// What an upkeep arm needs before each run and is no part of its cost
    /// (the fold's fresh copy of the store): done outside the timed region.
    fn set_up(&mut self, _arm: &str) -> Result<()> {
        Ok(())
    }
}

/// The name of the stage's floor arm.
pub const FLOOR: &str = "floor";

/// What an arm runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArmKind {
    /// The stage under a strategy set ([`Workload::run`]).
    Strategies,
    /// The stage's floor ([`Workload::floor`]), or another contract's or
    /// input's (run by [`Workload::run_extra`]).
    Floor,
    /// Another path to the same answer, or the stage under a strategy set on
    /// another input ([`Workload::extra_arms`]).
    Extra,
    /// Work beside the runs (the fold of exited processes' files): each run
    /// after its set-up ([`Workload::set_up`]), outside the timed region; not
    /// a run of the stage, so held to no floor and compared with no arm.
    Upkeep,
}

/// One run of an arm of any kind (an upkeep arm's set-up is the caller's:
/// [`run_once`] does it).
pub fn run_arm<'w>(
    workload: &'w mut dyn Workload,
    kind: ArmKind,
    name: &str,
    strategies: StrategySet,
) -> Result<Output<'w>> {
    match kind {
        ArmKind::Strategies => workload.run(strategies),
        ArmKind::Floor if name == FLOOR => workload.floor(),
        ArmKind::Floor | ArmKind::Extra | ArmKind::Upkeep => workload.run_extra(name, strategies),
    }
}

/// One run of an arm (as [`all_arms`] lists it) outside the timed rounds (a
/// verification, a peak-memory probe): an upkeep arm's set-up, then
/// [`run_arm`].
pub fn run_once<'w>(
    workload: &'w mut dyn Workload,
    (name, strategies, kind): &(String, StrategySet, ArmKind),
) -> Result<Output<'w>> {
    if *kind == ArmKind::Upkeep {
        workload.set_up(name)?;
    }
    run_arm(workload, *kind, name, *strategies)
}

/// Every arm `promlab ablate` measures for `workload`: the strategy arms of
/// `set` ([`arms`]), then the workload's extra arms, then its floor.
pub fn all_arms(
    stage: Stage,
    set: StrategySet,
    workload: &dyn Workload,
) -> Vec<(String, StrategySet, ArmKind)> {
    let mut all: Vec<_> = arms(stage, set)
        .into_iter()
        .map(|(name, s)| (name, s, ArmKind::Strategies))
        .collect();
    for (name, s, kind) in workload.extra_arms(set.restrict(stage)) {
        all.push((name.to_string(), s, kind));
    }
    all.push((FLOOR.to_string(), StrategySet::NONE, ArmKind::Floor));
    all
}

/// The strategy set the benches ablate for `stage`: the build's features that
/// belong to it (`cargo bench --features series-cache,batch-routing`), or all
/// of the stage's strategies when none does.
pub fn configured(stage: Stage) -> StrategySet {
    let set = StrategySet::compiled_default().restrict(stage);
    if set.is_empty() {
        StrategySet::all().restrict(stage)
    } else {
        set
    }
}

/// The arms of an ablation of `set` (its strategies of `stage`): baseline,
/// each strategy alone, all but one (`all-<strategy>`), all — without
/// repeats, all last. The one arm list of `promlab ablate`, the criterion
/// benches and the iai bench.
pub fn arms(stage: Stage, set: StrategySet) -> Vec<(String, StrategySet)> {
    let strategies: Vec<Strategy> = set.restrict(stage).iter().collect();
    let all: StrategySet = strategies.iter().copied().collect();
    let mut arms = vec![("baseline".to_string(), StrategySet::NONE)];
    for s in &strategies {
        arms.push((s.name().to_string(), StrategySet::NONE.with(*s)));
    }
    // With two, "all but one" is the other one alone.
    if strategies.len() > 2 {
        for s in &strategies {
            arms.push((format!("all-{}", s.name()), all.without(*s)));
        }
    }
    if strategies.len() > 1 {
        arms.push(("all".to_string(), all));
    }
    arms
}

/// A bench's name for an arm: its strategies (`baseline` for none), so a
/// criterion history never mixes two different sets under one name.
pub fn bench_id(strategies: StrategySet) -> String {
    if strategies.is_empty() {
        "baseline".to_string()
    } else {
        strategies.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &str) -> StrategySet {
        names.parse().unwrap()
    }

    fn names(arms: &[(String, StrategySet)]) -> Vec<&str> {
        arms.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn arms_are_baseline_alone_all_but_one_all_without_repeats() {
        // One strategy: baseline and it.
        let a = arms(Stage::Ingest, set("series-cache"));
        assert_eq!(names(&a), ["baseline", "series-cache"]);
        // Two: "all but one" is the other alone, so it is not repeated.
        let a = arms(Stage::Ingest, set("series-cache,batch-routing"));
        assert_eq!(
            names(&a),
            ["baseline", "series-cache", "batch-routing", "all"]
        );
        assert_eq!(a[3].1, set("series-cache,batch-routing"));
        // Six: each alone, each left out, all.
        let a = arms(Stage::Write, StrategySet::all());
        assert_eq!(a.len(), 14);
        assert_eq!(
            a[7],
            (
                "all-key-cache".to_string(),
                set("increment-once,cached-pid,clock-once,coarse-clock,mmap-store")
            )
        );
        assert_eq!(a[13].1, StrategySet::all().restrict(Stage::Write));
        // Strategies of other stages are not arms; prerender is one of export's.
        let a = arms(Stage::Export, set("key-cache,prerender"));
        assert_eq!(names(&a), ["baseline", "prerender"]);
        assert_eq!(arms(Stage::Render, StrategySet::NONE).len(), 1);
        for stage in Stage::ALL {
            let a = arms(stage, StrategySet::all());
            let distinct: std::collections::HashSet<_> = a.iter().map(|(_, s)| *s).collect();
            assert_eq!(distinct.len(), a.len(), "{stage}");
        }
    }

    /// Why CI runs the benches' `--test` mode in the build with every feature
    /// only (`.ci/run`): a build with one strategy feature ablates a subset of
    /// the arms that build runs, each verified there.
    #[test]
    fn a_single_feature_ablates_a_subset_of_the_all_build() {
        for stage in Stage::ALL {
            let every = arms(stage, StrategySet::all());
            for strategy in StrategySet::all().restrict(stage).iter() {
                let alone = arms(stage, StrategySet::NONE.with(strategy));
                assert_eq!(names(&alone), ["baseline", strategy.name()], "{stage}");
                for arm in &alone {
                    assert!(every.contains(arm), "{stage}: {arm:?}");
                }
            }
        }
    }

    #[test]
    fn configured_is_the_features_of_the_stage_or_all_of_it() {
        for stage in Stage::ALL {
            let features = StrategySet::compiled_default().restrict(stage);
            let expected = if features.is_empty() {
                StrategySet::all().restrict(stage)
            } else {
                features
            };
            assert_eq!(configured(stage), expected);
        }
    }
}
