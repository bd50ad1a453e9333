//! Folded stacks: one line per distinct stack, `root;caller;…;leaf count`.
//! The format of Brendan Gregg's stackcollapse scripts, which `flamegraph.pl`,
//! inferno and speedscope all open.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::io::Write;

/// Sample counts per stack, frames root first, kept sorted so a file written
/// twice from the same samples is the same bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Folded {
    stacks: BTreeMap<String, u64>,
}

impl Folded {
    /// Adds `count` samples of `stack` (`root;…;leaf`).
    pub fn add(&mut self, stack: &str, count: u64) {
        if count > 0 {
            *self.stacks.entry(stack.to_string()).or_default() += count;
        }
    }

    pub fn merge(&mut self, other: &Folded) {
        for (stack, count) in &other.stacks {
            self.add(stack, *count);
        }
    }

    /// Every sample.
    pub fn samples(&self) -> u64 {
        self.stacks.values().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// The stacks and their counts, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.stacks.iter().map(|(s, c)| (s.as_str(), *c))
    }

    /// Reads `stack count` lines (blank lines are skipped).
    pub fn parse(text: &str) -> Result<Folded> {
        let mut folded = Folded::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            let Some((stack, count)) = line.rsplit_once(' ') else {
                bail!("line {}: not `stack count`: {line:?}", i + 1);
            };
            let count: u64 = count
                .parse()
                .with_context(|| format!("line {}: bad sample count {count:?}", i + 1))?;
            folded.add(stack, count);
        }
        Ok(folded)
    }

    pub fn write_to(&self, mut out: impl Write) -> std::io::Result<()> {
        for (stack, count) in &self.stacks {
            writeln!(out, "{stack} {count}")?;
        }
        Ok(())
    }

    pub fn to_text(&self) -> String {
        let mut out = Vec::new();
        self.write_to(&mut out).expect("writing to memory");
        String::from_utf8(out).expect("stacks are text")
    }

    /// Each stack from its outermost frame whose name contains `marker` on
    /// (the frames above it, the process's start-up and the profiling loop, are
    /// the same in every sample). Stacks without such a frame (the loop's own
    /// samples, or an unwind that stopped short) stay whole. Also returns how
    /// many samples had the frame.
    pub fn rooted_at(&self, marker: &str) -> (Folded, u64) {
        let mut rooted = Folded::default();
        let mut reached = 0;
        for (stack, count) in &self.stacks {
            let mut start = 0;
            let mut found = None;
            for frame in stack.split(';') {
                if frame.contains(marker) {
                    found = Some(start);
                    break;
                }
                start += frame.len() + 1;
            }
            match found {
                Some(at) => {
                    rooted.add(&stack[at..], *count);
                    reached += count;
                }
                None => rooted.add(stack, *count),
            }
        }
        (rooted, reached)
    }

    /// The same samples with each stack cut after its last frame that holds
    /// at least `min_fraction` of all samples (inclusive), so the cut frames'
    /// samples count as their caller's own: what a flamegraph that leaves out
    /// frames narrower than that shows, in far fewer lines.
    pub fn pruned(&self, min_fraction: f64) -> Folded {
        let min = (self.samples() as f64 * min_fraction).ceil() as u64;
        let inclusive = prefix_counts(self.iter());
        let mut pruned = Folded::default();
        for (stack, count) in &self.stacks {
            pruned.add(
                &stack[..kept_prefix(stack, |p| inclusive[p] >= min)],
                *count,
            );
        }
        pruned
    }

    /// Samples of stacks that hold a frame whose name contains `needle`
    /// (inclusive: the frame and everything it called).
    pub fn inclusive(&self, needle: &str) -> u64 {
        self.stacks
            .iter()
            .filter(|(stack, _)| stack.split(';').any(|f| f.contains(needle)))
            .map(|(_, c)| c)
            .sum()
    }

    /// Samples whose leaf frame's name contains `needle` (the frame's own time).
    pub fn own(&self, needle: &str) -> u64 {
        self.stacks
            .iter()
            .filter(|(stack, _)| stack.rsplit(';').next().is_some_and(|f| f.contains(needle)))
            .map(|(_, c)| c)
            .sum()
    }

    /// The `n` frames with the most inclusive samples below the root, as
    /// (name, samples); a frame counts once per stack however often it recurs.
    pub fn hottest(&self, n: usize) -> Vec<(String, u64)> {
        let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
        for (stack, count) in &self.stacks {
            let mut seen: Vec<&str> = Vec::new();
            for frame in stack.split(';').skip(1) {
                if !seen.contains(&frame) {
                    seen.push(frame);
                    *totals.entry(frame).or_default() += count;
                }
            }
        }
        let mut ranked: Vec<(String, u64)> = totals
            .into_iter()
            .map(|(f, c)| (f.to_string(), c))
            .collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        ranked.truncate(n);
        ranked
    }
}

/// Inclusive counts of every stack prefix (`root`, `root;a`, `root;a;b`, …).
pub(crate) fn prefix_counts<'a>(
    stacks: impl Iterator<Item = (&'a str, u64)>,
) -> BTreeMap<&'a str, u64> {
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for (stack, count) in stacks {
        let ends = stack
            .match_indices(';')
            .map(|(i, _)| i)
            .chain([stack.len()]);
        for end in ends {
            *counts.entry(&stack[..end]).or_default() += count;
        }
    }
    counts
}

/// The length of `stack`'s longest prefix whose every prefix `keep`s (at least the root frame).
pub(crate) fn kept_prefix(stack: &str, keep: impl Fn(&str) -> bool) -> usize {
    let mut kept = stack.find(';').unwrap_or(stack.len());
    for end in stack
        .match_indices(';')
        .map(|(i, _)| i)
        .skip(1)
        .chain([stack.len()])
    {
        if !keep(&stack[..end]) {
            break;
        }
        kept = end;
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_writes_and_merges() {
        let text = "main;run;leaf 3\nmain;run 2\n\nmain;run;leaf 1\n";
        let folded = Folded::parse(text).unwrap();
        assert_eq!(folded.samples(), 6);
        assert_eq!(folded.to_text(), "main;run 2\nmain;run;leaf 4\n");
        assert_eq!(Folded::parse(&folded.to_text()).unwrap(), folded);
        let mut twice = folded.clone();
        twice.merge(&folded);
        assert_eq!(twice.samples(), 12);
        assert!(Folded::parse("no-count\n").is_err());
        assert!(Folded::parse("a;b x\n").is_err());
    }

    #[test]
    fn pruning_gives_cut_frames_to_their_caller() {
        let folded = Folded::parse("run;a;b 90\nrun;a;c 4\nrun;a;c;d 1\nrun;e 5\n").unwrap();
        assert_eq!(
            folded.pruned(0.05).to_text(),
            "run;a;b 90\nrun;a;c 5\nrun;e 5\n"
        );
        assert_eq!(
            folded.pruned(0.06).to_text(),
            "run 5\nrun;a 5\nrun;a;b 90\n"
        );
        assert_eq!(folded.pruned(0.0), folded);
        assert_eq!(folded.pruned(1.0).to_text(), "run 100\n");
    }

    #[test]
    fn rooted_at_cuts_above_the_marker() {
        let folded = Folded::parse(
            "promlab;main;loop;<X as Workload>::run;decode 5\npromlab;main;loop 1\nbroken;decode 2\n",
        )
        .unwrap();
        let (rooted, reached) = folded.rooted_at("Workload>::run");
        assert_eq!(reached, 5);
        assert_eq!(
            rooted.to_text(),
            "<X as Workload>::run;decode 5\nbroken;decode 2\npromlab;main;loop 1\n"
        );
        assert_eq!(rooted.inclusive("decode"), 7);
        assert_eq!(rooted.own("loop"), 1);
        assert_eq!(rooted.hottest(1), vec![("decode".to_string(), 7)]);
    }
}
