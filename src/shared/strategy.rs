//! The strategy switchboard.
//!
//! A *strategy* is one optimization that swaps one seam of the pipeline. What
//! actually runs is a [`StrategySet`], chosen at run time (`--strategies
//! key-cache,decode-once`, `none`, `all`, or `default`), so one binary can
//! walk the whole ablation matrix, interleaving the arms round by round.
//!
//! **What a cargo feature means.** Every strategy's code is always compiled;
//! a feature (`--features series-cache`) only turns its strategy on *by
//! default* in that build: it is in [`StrategySet::compiled_default`], which
//! `--strategies default` (every subcommand's default) resolves to, and which
//! the benches ablate (`cargo bench --features S --bench STAGE`: baseline,
//! each strategy of S alone, S minus each, S). A build that names no feature
//! defaults to every strategy: a plain build serves the fastest verified
//! configuration, and the baseline is opt-in (`--strategies none`). A feature
//! never removes or adds code, so any build can still run and verify every
//! combination. This file is the only place that reads the strategy features.

use std::fmt;
use std::str::FromStr;

/// The pipeline stage a strategy belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    Write,
    Export,
    Render,
    Ingest,
}

impl Stage {
    pub const ALL: [Stage; 4] = [Stage::Write, Stage::Export, Stage::Render, Stage::Ingest];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Write => "write",
            Stage::Export => "export",
            Stage::Render => "render",
            Stage::Ingest => "ingest",
        }
    }

    /// The strategies that swap a seam of this stage.
    pub fn strategies(self) -> impl Iterator<Item = Strategy> {
        Strategy::ALL
            .into_iter()
            .filter(move |s| s.applies_to(self))
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Stage {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Stage::ALL
            .into_iter()
            .find(|st| st.name() == s)
            .ok_or_else(|| {
                format!("unknown stage `{s}` (expected write, export, render or ingest)")
            })
    }
}

macro_rules! strategies {
    ($($variant:ident = $name:literal, $stage:ident;)*) => {
        /// One optimization, named after the upstream report it answers.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Strategy { $($variant,)* }

        impl Strategy {
            pub const ALL: [Strategy; strategies!(@count $($variant)*)] = [$(Strategy::$variant,)*];

            /// The name used for the cargo feature, the CLI and the dossier file.
            pub fn name(self) -> &'static str {
                match self { $(Strategy::$variant => $name,)* }
            }

            pub fn stage(self) -> Stage {
                match self { $(Strategy::$variant => Stage::$stage,)* }
            }

            /// Whether it swaps a seam of `stage`: its own, or — for
            /// `prerender`, which a long-lived store exporter uses too — export.
            pub fn applies_to(self, stage: Stage) -> bool {
                self.stage() == stage || (self == Strategy::Prerender && stage == Stage::Export)
            }

            /// Whether this build turns the strategy on by default.
            pub fn on_by_default(self) -> bool {
                match self { $(Strategy::$variant => cfg!(feature = $name),)* }
            }
        }
    };
    (@count) => { 0 };
    (@count $head:ident $($tail:ident)*) => { 1 + strategies!(@count $($tail)*) };
}

strategies! {
    KeyCache = "key-cache", Write;
    IncrementOnce = "increment-once", Write;
    CachedPid = "cached-pid", Write;
    ClockOnce = "clock-once", Write;
    CoarseClock = "coarse-clock", Write;
    MmapStore = "mmap-store", Write;
    SingleRead = "single-read", Export;
    DecodeOnce = "decode-once", Export;
    FastUnescape = "fast-unescape", Export;
    FoldExited = "fold-exited", Export;
    Prerender = "prerender", Render;
    BorrowedDecode = "borrowed-decode", Ingest;
    SeriesCache = "series-cache", Ingest;
    BatchRouting = "batch-routing", Ingest;
    BulkSketch = "bulk-sketch", Ingest;
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Strategy::ALL
            .into_iter()
            .find(|st| st.name() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = Strategy::ALL.iter().map(|s| s.name()).collect();
                format!(
                    "unknown strategy `{s}` (a set is `none`, `all`, `default`, or a comma-separated list of: {})",
                    known.join(", ")
                )
            })
    }
}

/// A set of strategies: what a run actually uses (one bit per strategy).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StrategySet(u32);

const _: () = assert!(
    Strategy::ALL.len() <= u32::BITS as usize,
    "widen StrategySet"
);

impl StrategySet {
    /// The baseline: no strategy at all.
    pub const NONE: StrategySet = StrategySet(0);

    pub fn all() -> StrategySet {
        Strategy::ALL.into_iter().collect()
    }

    /// What `--strategies default` means in this build: the strategies its
    /// cargo features name, or — when it names none, as a plain `cargo build`
    /// does — every strategy, so a user gets the fastest verified set unless
    /// they ask for the baseline (`none`).
    pub fn compiled_default() -> StrategySet {
        let named: StrategySet = Strategy::ALL
            .into_iter()
            .filter(|s| s.on_by_default())
            .collect();
        if named.is_empty() {
            StrategySet::all()
        } else {
            named
        }
    }

    pub fn contains(self, s: Strategy) -> bool {
        self.0 & (1 << s as u32) != 0
    }

    pub fn with(self, s: Strategy) -> StrategySet {
        StrategySet(self.0 | (1 << s as u32))
    }

    pub fn without(self, s: Strategy) -> StrategySet {
        StrategySet(self.0 & !(1 << s as u32))
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Strategy> {
        Strategy::ALL.into_iter().filter(move |s| self.contains(*s))
    }

    /// Only the strategies of one stage.
    pub fn restrict(self, stage: Stage) -> StrategySet {
        self.iter().filter(|s| s.applies_to(stage)).collect()
    }

    /// Every subset of the given strategies (2^n sets, the baseline first).
    pub fn subsets(strategies: &[Strategy]) -> Vec<StrategySet> {
        (0u32..1 << strategies.len())
            .map(|mask| {
                strategies
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, s)| *s)
                    .collect()
            })
            .collect()
    }

    /// Every combination of one stage's strategies.
    pub fn combinations(stage: Stage) -> Vec<StrategySet> {
        let of_stage: Vec<Strategy> = stage.strategies().collect();
        StrategySet::subsets(&of_stage)
    }
}

impl FromIterator<Strategy> for StrategySet {
    fn from_iter<I: IntoIterator<Item = Strategy>>(iter: I) -> Self {
        iter.into_iter().fold(StrategySet::NONE, StrategySet::with)
    }
}

impl fmt::Display for StrategySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        if *self == StrategySet::all() {
            return f.write_str("all");
        }
        let names: Vec<&str> = self.iter().map(Strategy::name).collect();
        f.write_str(&names.join(","))
    }
}

impl fmt::Debug for StrategySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StrategySet({self})")
    }
}

impl FromStr for StrategySet {
    type Err = String;
    /// `none`, `all`, `default` (the build's features), or a comma-separated list.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "none" | "baseline" | "" => Ok(StrategySet::NONE),
            "all" => Ok(StrategySet::all()),
            "default" => Ok(StrategySet::compiled_default()),
            list => list
                .split(',')
                .map(|name| name.trim().parse::<Strategy>())
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        let set: StrategySet = "key-cache,decode-once".parse().unwrap();
        assert!(set.contains(Strategy::KeyCache));
        assert!(set.contains(Strategy::DecodeOnce));
        assert!(!set.contains(Strategy::Prerender));
        assert_eq!(set.to_string().parse::<StrategySet>().unwrap(), set);
        assert_eq!("none".parse::<StrategySet>().unwrap(), StrategySet::NONE);
        assert_eq!(
            "all".parse::<StrategySet>().unwrap().iter().count(),
            Strategy::ALL.len()
        );
        assert!("key-cache,bogus"
            .parse::<StrategySet>()
            .unwrap_err()
            .contains("bogus"));
    }

    #[test]
    fn combinations_cover_each_stage() {
        assert_eq!(StrategySet::combinations(Stage::Write).len(), 64);
        assert_eq!(StrategySet::combinations(Stage::Export).len(), 32);
        assert_eq!(StrategySet::combinations(Stage::Render).len(), 2);
        assert_eq!(StrategySet::combinations(Stage::Ingest).len(), 16);
        assert_eq!(
            StrategySet::combinations(Stage::Ingest)[0],
            StrategySet::NONE
        );
    }
}
