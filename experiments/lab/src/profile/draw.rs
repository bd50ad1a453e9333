//! Flamegraphs and differential flamegraphs as SVG, drawn by inferno.
//!
//! A differential flamegraph compares two profiles of the same workload per
//! unit of work (a line exported, a sample ingested, a write step): the first
//! profile's counts are scaled to the second's amount of work, then inferno's
//! differential folding pairs the stacks and its flamegraph draws one
//! profile's frames, each coloured by the change of its own samples (the
//! frame as the leaf, as `flamegraph.pl` does): red where the second spends
//! more per unit, blue where it spends less (Brendan Gregg's differential
//! flame graphs). Drawn on the second profile's frames ([`Shape::Second`],
//! the usual one) a frame the second no longer has is not there; drawn on the
//! first's ([`Shape::First`]) it is, in blue, and new frames are not: a
//! change of strategy is best read from both.

use super::folded::{kept_prefix, prefix_counts};
use super::Folded;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;

/// Frames narrower than this many pixels (of 1,200) are left out of an SVG:
/// inferno's default, for a flamegraph one looks at once.
pub const MIN_WIDTH_PX: f64 = 0.1;

/// How a graph is labelled and pruned.
pub struct Style<'a> {
    pub title: &'a str,
    pub subtitle: &'a str,
    /// Frames narrower than this many pixels (of 1,200) are left out.
    pub min_width_px: f64,
}

fn options<'a>(style: &Style<'_>) -> inferno::flamegraph::Options<'a> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = style.title.to_string();
    options.subtitle = (!style.subtitle.is_empty()).then(|| style.subtitle.to_string());
    options.min_width = style.min_width_px;
    options.count_name = "samples".to_string();
    // The same colour for the same function in every graph, and the same
    // bytes for the same profile (the committed SVGs only change with the data).
    options.hash = true;
    options.deterministic = true;
    options
}

/// A flamegraph of `folded`.
pub fn svg(folded: &Folded, style: &Style<'_>) -> Result<Vec<u8>> {
    if folded.is_empty() {
        bail!("no samples to draw");
    }
    let text = folded.to_text();
    let mut out = Vec::new();
    inferno::flamegraph::from_lines(&mut options(style), text.lines(), &mut out)
        .context("cannot draw the flamegraph")?;
    Ok(out)
}

/// Whose frames a differential flamegraph draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// The first profile's (scaled to the second's work): what the second
    /// no longer spends shows, blue.
    First,
    /// The second profile's: what it spends instead shows, red.
    Second,
}

/// Two profiles of one workload, per unit of work: each stack's samples in
/// the first (`a`, scaled to the second's units of work) and the second (`b`).
#[derive(Clone, Debug, PartialEq)]
pub struct Diff {
    /// (stack, a scaled, b), in stack order.
    stacks: Vec<(String, u64, u64)>,
}

impl Diff {
    /// `a` recorded over `a_units` units of work, `b` over `b_units`.
    pub fn new(a: &Folded, a_units: f64, b: &Folded, b_units: f64) -> Result<Diff> {
        if !(a_units > 0.0 && b_units > 0.0) {
            bail!("a profile without work to compare per unit ({a_units}, {b_units} units)");
        }
        let scale = b_units / a_units;
        let mut scaled = Folded::default();
        for (stack, count) in a.iter() {
            scaled.add(stack, (count as f64 * scale).round() as u64);
        }
        let mut out = Vec::new();
        inferno::differential::from_readers(
            inferno::differential::Options::default(),
            scaled.to_text().as_bytes(),
            b.to_text().as_bytes(),
            &mut out,
        )
        .context("cannot fold the two profiles together")?;
        Diff::parse(&String::from_utf8_lossy(&out))
    }

    /// Reads `stack a b` lines (inferno's and `difffolded.pl`'s output).
    pub fn parse(text: &str) -> Result<Diff> {
        let mut stacks = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let mut fields = line.rsplitn(3, ' ');
            let (Some(b), Some(a), Some(stack)) = (fields.next(), fields.next(), fields.next())
            else {
                bail!("line {}: not `stack a b`: {line:?}", i + 1);
            };
            let count = |c: &str| {
                c.parse::<u64>()
                    .with_context(|| format!("line {}: bad count {c:?}", i + 1))
            };
            stacks.push((stack.to_string(), count(a)?, count(b)?));
        }
        stacks.sort();
        Ok(Diff { stacks })
    }

    /// `stack a b` lines, sorted: what `flamegraph.pl` and inferno draw as a
    /// differential flamegraph.
    pub fn to_text(&self) -> String {
        self.stacks
            .iter()
            .map(|(stack, a, b)| format!("{stack} {a} {b}\n"))
            .collect()
    }

    /// Samples of each side, `a` scaled to `b`'s work.
    pub fn totals(&self) -> (u64, u64) {
        self.stacks
            .iter()
            .fold((0, 0), |(ta, tb), (_, a, b)| (ta + a, tb + b))
    }

    /// The differential flamegraph on `shape`'s frames, red where `b`
    /// spends more per unit, blue where less.
    pub fn svg(&self, shape: Shape, style: &Style<'_>) -> Result<Vec<u8>> {
        let mut options = options(style);
        // inferno draws the last count's widths, coloured by last − first.
        let text: String = match shape {
            Shape::Second => self.to_text(),
            Shape::First => {
                options.negate_differentials = true;
                self.stacks
                    .iter()
                    .map(|(stack, a, b)| format!("{stack} {b} {a}\n"))
                    .collect()
            }
        };
        let (a, b) = self.totals();
        if (shape == Shape::Second && b == 0) || (shape == Shape::First && a == 0) {
            bail!("the profile to draw has no samples");
        }
        let mut out = Vec::new();
        inferno::flamegraph::from_lines(&mut options, text.lines(), &mut out)
            .context("cannot draw the differential flamegraph")?;
        Ok(out)
    }

    /// Every frame of the graph (a stack prefix, `root;…;frame`) with its
    /// inclusive samples on each side.
    pub fn frames(&self) -> BTreeMap<&str, (u64, u64)> {
        let a = prefix_counts(self.stacks.iter().map(|(s, a, _)| (s.as_str(), *a)));
        let b = prefix_counts(self.stacks.iter().map(|(s, _, b)| (s.as_str(), *b)));
        a.into_iter()
            .map(|(frame, a)| (frame, (a, b[frame])))
            .collect()
    }

    /// The same comparison with each stack cut after its last frame that
    /// holds at least `min_fraction` of either side's samples (as
    /// [`Folded::pruned`]): what the SVG draws when it leaves out frames
    /// narrower than that.
    pub fn pruned(&self, min_fraction: f64) -> Diff {
        let (total_a, total_b) = self.totals();
        let min = |total: u64| (total as f64 * min_fraction).ceil() as u64;
        let (min_a, min_b) = (min(total_a), min(total_b));
        let frames = self.frames();
        let mut kept: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for (stack, a, b) in &self.stacks {
            let end = kept_prefix(stack, |p| {
                let (a, b) = frames[p];
                a >= min_a || b >= min_b
            });
            let entry = kept.entry(&stack[..end]).or_default();
            entry.0 += a;
            entry.1 += b;
        }
        Diff {
            stacks: kept
                .into_iter()
                .map(|(s, (a, b))| (s.to_string(), a, b))
                .collect(),
        }
    }

    /// The largest change of any frame's samples (`b − a`, signed), as a
    /// fraction of `a`'s total, and that frame: how far the diff is from
    /// flat. A diff of a profile against another of the same work is flat
    /// within noise.
    pub fn largest_change(&self) -> (f64, String) {
        let (total, _) = self.totals();
        self.frames()
            .into_iter()
            .map(|(frame, (a, b))| {
                (
                    (b as f64 - a as f64) / total.max(1) as f64,
                    frame.to_string(),
                )
            })
            .max_by(|x, y| x.0.abs().total_cmp(&y.0.abs()))
            .unwrap_or((0.0, String::new()))
    }

    /// The functions whose own samples (as the leaf frame) changed most, as
    /// (name, a, b), largest change first.
    pub fn own_changes(&self, n: usize) -> Vec<(String, u64, u64)> {
        let mut own: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for (stack, a, b) in &self.stacks {
            let leaf = stack.rsplit(';').next().unwrap_or(stack);
            let entry = own.entry(leaf).or_default();
            entry.0 += a;
            entry.1 += b;
        }
        let mut changes: Vec<(String, u64, u64)> = own
            .into_iter()
            .map(|(f, (a, b))| (f.to_string(), a, b))
            .collect();
        changes.sort_by_key(|(f, a, b)| (std::cmp::Reverse(a.abs_diff(*b)), f.clone()));
        changes.truncate(n);
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folded(text: &str) -> Folded {
        Folded::parse(text).unwrap()
    }

    #[test]
    fn scales_the_first_profile_to_the_second_ones_work() {
        // A did 100 units in 40 samples, B 200 units in 40 samples: B costs half per unit.
        let a = folded("run;decode 30\nrun;render 10\n");
        let b = folded("run;decode 10\nrun;render 20\nrun;cache 10\n");
        let diff = Diff::new(&a, 100.0, &b, 200.0).unwrap();
        assert_eq!(
            diff.to_text(),
            "run;cache 0 10\nrun;decode 60 10\nrun;render 20 20\n"
        );
        assert_eq!(diff.totals(), (80, 40));
        let frames = diff.frames();
        assert_eq!(frames["run"], (80, 40));
        assert_eq!(frames["run;decode"], (60, 10));
        assert_eq!(diff.largest_change(), (-0.625, "run;decode".to_string()));
        assert_eq!(diff.own_changes(1), vec![("decode".to_string(), 60, 10)]);
        assert_eq!(
            diff.pruned(0.3).to_text(),
            "run 0 10\nrun;decode 60 10\nrun;render 20 20\n"
        );
        assert_eq!(Diff::parse(&diff.to_text()).unwrap(), diff);
        assert!(Diff::new(&a, 0.0, &b, 1.0).is_err());
    }

    /// The fill of the first frame named `name` in an inferno SVG.
    fn fill(svg: &str, name: &str) -> (u8, u8, u8) {
        let at = svg.find(&format!("<title>{name} (")).expect("the frame");
        let rest = &svg[at..];
        let rgb = &rest[rest.find("fill=\"rgb(").expect("a fill") + 10..];
        let numbers: Vec<u8> = rgb[..rgb.find(')').unwrap()]
            .split(',')
            .map(|n| n.trim().parse().unwrap())
            .collect();
        (numbers[0], numbers[1], numbers[2])
    }

    #[test]
    fn blue_where_the_second_spends_less_red_where_more() {
        // Same work; B replaced `old` by a cheaper `new`.
        let a = folded("run;old 50\nrun;kept 50\n");
        let b = folded("run;new 20\nrun;kept 50\n");
        let diff = Diff::new(&a, 1.0, &b, 1.0).unwrap();
        let style = Style {
            title: "t",
            subtitle: "s",
            min_width_px: MIN_WIDTH_PX,
        };
        let on_a = String::from_utf8(diff.svg(Shape::First, &style).unwrap()).unwrap();
        let on_b = String::from_utf8(diff.svg(Shape::Second, &style).unwrap()).unwrap();
        let (r, g, blue) = fill(&on_a, "old");
        assert!(
            blue == 255 && r < 255 && g < 255,
            "old on A: rgb({r},{g},{blue})"
        );
        assert!(
            !on_a.contains("<title>new ("),
            "A's frames lack B's new one"
        );
        let (red, g, b) = fill(&on_b, "new");
        assert!(
            red == 255 && g < 255 && b < 255,
            "new on B: rgb({red},{g},{b})"
        );
        assert!(!on_b.contains("<title>old ("));
    }

    #[test]
    fn a_profile_against_itself_is_flat() {
        let a = folded("run;decode 30\nrun;render 10\n");
        let diff = Diff::new(&a, 7.0, &a, 7.0).unwrap();
        assert_eq!(diff.largest_change().0, 0.0);
        for shape in [Shape::First, Shape::Second] {
            let style = Style {
                title: "t",
                subtitle: "s",
                min_width_px: MIN_WIDTH_PX,
            };
            let svg = String::from_utf8(diff.svg(shape, &style).unwrap()).unwrap();
            assert!(svg.contains("<svg") && svg.contains("decode"));
        }
    }
}
