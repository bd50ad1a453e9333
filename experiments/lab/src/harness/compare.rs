//! Like with like: a results directory's rows grouped by scenario and by
//! what they read ([`Input`]), and the arms each figure of `promlab report`
//! compares. Every ratio it prints is within one group: an arm and the
//! baseline, promlab or the floor reading the same input, or a peer and
//! promlab reading what the peer reads. An export scenario has two groups,
//! the store as written and the store folded, and its fold's cost beside
//! the folded one.

use super::report::ResultRow;
use super::{Input, BUILT_IN, FLOOR};
use promlab::shared::strategy::{Stage, Strategy, StrategySet};

/// The rows of one scenario at one size that read one input.
pub struct Group<'a> {
    pub scenario: &'a str,
    pub size: &'a str,
    pub stage: &'a str,
    pub input: Input,
    /// Arms and floors reading the input.
    rows: Vec<&'a ResultRow>,
    /// Peers reading it.
    pub peers: Vec<&'a ResultRow>,
    /// The scenario's fold (`upkeep`), with the folded group: what keeps a
    /// store folded.
    pub fold: Option<&'a ResultRow>,
}

/// Every scenario's groups, scenarios in the pipeline's order (by stage,
/// then as `promlab ablate` runs the built-in ones), the store as written
/// (or the one input) before the store folded. A group without a promlab
/// arm (a run of the floors alone) is left out.
pub fn groups(rows: &[ResultRow]) -> Vec<Group<'_>> {
    let mut scenarios: Vec<(&str, &str, &str)> = Vec::new();
    for row in rows {
        let key = (row.stage.as_str(), row.scenario.as_str(), row.size.as_str());
        if !scenarios.contains(&key) {
            scenarios.push(key);
        }
    }
    let stage_rank = |stage: &str| Stage::ALL.iter().position(|s| s.name() == stage);
    let built_in_rank = |scenario: &str| BUILT_IN.iter().position(|(n, _)| *n == scenario);
    scenarios.sort_by_key(|&(stage, scenario, _)| {
        (
            stage_rank(stage).unwrap_or(usize::MAX),
            built_in_rank(scenario).unwrap_or(usize::MAX),
        )
    });
    let scenarios: Vec<(&str, &str)> = scenarios.into_iter().map(|(_, n, s)| (n, s)).collect();
    let mut groups = Vec::new();
    for (scenario, size) in scenarios {
        let of: Vec<&ResultRow> = rows
            .iter()
            .filter(|r| r.scenario == scenario && r.size == size)
            .collect();
        let fold = of.iter().copied().find(|r| r.strategies == "upkeep");
        for input in [Input::One, Input::AsWritten, Input::Folded] {
            let reading = |r: &&&ResultRow| r.input() == input;
            let group = Group {
                scenario,
                size,
                stage: of[0].stage.as_str(),
                input,
                rows: of
                    .iter()
                    .filter(reading)
                    .filter(|r| r.strategies != "peer" && r.strategies != "upkeep")
                    .copied()
                    .collect(),
                peers: of
                    .iter()
                    .filter(reading)
                    .filter(|r| r.strategies == "peer")
                    .copied()
                    .collect(),
                fold: fold.filter(|_| input == Input::Folded),
            };
            if group.promlab().is_some() {
                groups.push(group);
            }
        }
    }
    groups
}

impl<'a> Group<'a> {
    /// The arms that run the stage under a strategy set (not floors).
    fn arms(&self) -> impl Iterator<Item = (&'a ResultRow, StrategySet)> + '_ {
        self.rows.iter().filter_map(|r| Some((*r, r.set()?)))
    }

    /// The baseline on this input: the arm of no strategy.
    pub fn baseline(&self) -> Option<&'a ResultRow> {
        self.arms().find(|(_, set)| set.is_empty()).map(|(r, _)| r)
    }

    /// promlab on this input: the arm with the most strategies, the first of
    /// equals (`all` before the query's other paths to its answer). On the
    /// store as written that is `as-written`; in runs before that arm,
    /// `all-fold-exited`, every strategy but the fold.
    pub fn promlab(&self) -> Option<&'a ResultRow> {
        let mut best: Option<(&ResultRow, usize)> = None;
        for (row, set) in self.arms() {
            let n = set.iter().count();
            if n > 0 && best.is_none_or(|(_, m)| n > m) {
                best = Some((row, n));
            }
        }
        best.map(|(r, _)| r)
    }

    /// `strategy` alone on this input.
    pub fn alone(&self, strategy: Strategy) -> Option<&'a ResultRow> {
        let set = StrategySet::NONE.with(strategy);
        self.arms().find(|(_, s)| *s == set).map(|(r, _)| r)
    }

    /// promlab without `strategy` on this input (when promlab has it).
    pub fn without(&self, strategy: Strategy) -> Option<&'a ResultRow> {
        let all = self.promlab()?.set()?;
        if !all.contains(strategy) {
            return None;
        }
        let set = all.without(strategy);
        self.arms().find(|(_, s)| *s == set).map(|(r, _)| r)
    }

    /// The floor of this input: the one promlab is held to, else the
    /// stage's (`floor`, `floor-folded`).
    pub fn floor(&self) -> Option<&'a ResultRow> {
        let floors = || {
            self.rows
                .iter()
                .copied()
                .filter(|r| r.strategies == "floor")
        };
        let held_to = self.promlab().map(|p| p.floor_arm.as_str());
        floors()
            .find(|f| Some(f.arm.as_str()) == held_to)
            .or_else(|| floors().find(|f| f.arm == FLOOR || f.arm == "floor-folded"))
    }

    /// `row`'s time ÷ this input's floor: its `ratio_to_floor` where that is
    /// to this floor (the median of the rounds' ratios), else the medians'.
    pub fn to_floor(&self, row: &ResultRow) -> Option<f64> {
        let floor = self.floor()?;
        let held_to = match row.floor_arm.as_str() {
            "" => FLOOR,
            named => named,
        };
        match row.ratio_to_floor {
            Some(ratio) if held_to == floor.arm => Some(ratio),
            _ => Some(row.median_ns as f64 / floor.median_ns.max(1) as f64),
        }
    }

    /// The arm promlab's figures name, when it is not the usual one (`all`,
    /// `as-written`): a stage of one strategy's, or a run's older stand-in.
    pub fn promlab_name(&self) -> Option<&'a str> {
        let arm = self.promlab()?.arm.as_str();
        (arm != "all" && arm != "as-written").then_some(arm)
    }
}

/// `base`'s time ÷ `arm`'s (a speed-up, when `base` is the baseline).
pub fn speedup(base: &ResultRow, arm: &ResultRow) -> f64 {
    base.median_ns as f64 / arm.median_ns.max(1) as f64
}

/// `a`'s time per unit ÷ `b`'s: a peer against promlab, each in its units.
pub fn per_unit(a: &ResultRow, b: &ResultRow) -> f64 {
    a.ns_per_unit / b.ns_per_unit
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A row of an export scenario: `strategies` a set, `floor`, `upkeep`
    /// or `peer`; `reads` empty for a run written before that column.
    pub(in crate::harness) fn row(
        arm: &str,
        strategies: &str,
        reads: &str,
        median_ns: u64,
    ) -> ResultRow {
        ResultRow {
            scenario: "seed-repro".into(),
            stage: "export".into(),
            size: "full".into(),
            arm: arm.into(),
            strategies: strategies.into(),
            median_ns,
            units: 100,
            unit: "lines".into(),
            ns_per_unit: median_ns as f64 / 100.0,
            reads: Some(reads.to_string()).filter(|r| !r.is_empty()),
            ..ResultRow::default()
        }
    }

    const ALL: &str = "single-read,decode-once,fast-unescape,fold-exited,prerender";
    const ALL_BUT_FOLD: &str = "single-read,decode-once,fast-unescape,prerender";

    /// An older run (no `reads`): the arms with `fold-exited` read the folded
    /// copy, so the store as written's promlab is `all-fold-exited`, and the
    /// folded copy has no baseline.
    #[test]
    fn an_older_run_groups_by_what_its_arms_read() {
        let rows = [
            row("baseline", "none", "", 7_000),
            row("fold-exited", "fold-exited", "", 1_000),
            row("all-fold-exited", ALL_BUT_FOLD, "", 160),
            row("all", ALL, "", 33),
            row("floor-folded", "floor", "", 29),
            row("floor", "floor", "", 75),
            row("peer:python", "peer", "", 66_000),
        ];
        let groups = groups(&rows);
        assert_eq!(groups.len(), 2);
        let (written, folded) = (&groups[0], &groups[1]);
        assert_eq!(written.input, Input::AsWritten);
        assert_eq!(written.promlab().unwrap().arm, "all-fold-exited");
        assert_eq!(written.promlab_name(), Some("all-fold-exited"));
        assert_eq!(written.floor().unwrap().arm, "floor");
        assert_eq!(written.peers.len(), 1);
        assert_eq!(written.without(Strategy::FoldExited), None);
        assert_eq!(folded.promlab().unwrap().arm, "all");
        assert!(folded.baseline().is_none() && folded.peers.is_empty());
        assert_eq!(folded.floor().unwrap().arm, "floor-folded");
        assert_eq!(
            folded.alone(Strategy::FoldExited).unwrap().arm,
            "fold-exited"
        );
        assert!(written.alone(Strategy::FoldExited).is_none());
    }

    /// A run with every input complete: each group has its baseline, its
    /// promlab and its floor; the fold goes with the folded group.
    #[test]
    fn a_run_with_both_inputs_compares_within_each() {
        let rows = [
            row("baseline", "none", "as-written", 7_000),
            row("all-fold-exited", ALL_BUT_FOLD, "as-written", 160),
            row(
                "all-single-read",
                "decode-once,fast-unescape,fold-exited,prerender",
                "folded",
                40,
            ),
            row("all", ALL, "folded", 33),
            row("as-written", ALL, "as-written", 120),
            row("baseline-folded", "none", "folded", 300),
            row("floor-folded", "floor", "folded", 29),
            row("fold", "upkeep", "as-written", 5_000_000),
            row("floor", "floor", "as-written", 75),
        ];
        let groups = groups(&rows);
        let (written, folded) = (&groups[0], &groups[1]);
        assert_eq!(written.promlab().unwrap().arm, "as-written");
        assert_eq!(written.promlab_name(), None);
        assert_eq!(written.baseline().unwrap().arm, "baseline");
        assert_eq!(
            written.without(Strategy::FoldExited).unwrap().arm,
            "all-fold-exited"
        );
        assert!(written.fold.is_none());
        assert_eq!(folded.baseline().unwrap().arm, "baseline-folded");
        assert_eq!(
            folded.without(Strategy::SingleRead).unwrap().arm,
            "all-single-read"
        );
        assert_eq!(folded.fold.unwrap().arm, "fold");
        let all = folded.promlab().unwrap();
        assert!((speedup(folded.baseline().unwrap(), all) - 300.0 / 33.0).abs() < 1e-9);
        assert!((folded.to_floor(all).unwrap() - 33.0 / 29.0).abs() < 1e-9);
    }
}
