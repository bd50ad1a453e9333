//! What a store export hands the renderer: client_ruby's `Metric#values`,
//! aggregated across processes. [`crate::export`] produces these and
//! [`crate::render`] prints them; neither imports the other's internals.

use std::fmt;

/// A label set decoded from a store key, in key order.
pub type DecodedLabels = Vec<(Box<[u8]>, Box<[u8]>)>;

/// Series sharing a label set without the group label: one histogram or
/// summary, or one counter or gauge series.
pub struct Group {
    pub labels: DecodedLabels,
    /// `prerender`: the group's label pairs and line prefixes, rendered once.
    pub rendered: Option<RenderedLines>,
}

/// `prerender`: where a group's rendered text is in its metric's
/// [`RenderedText`]: its label pairs escaped once (`a="x",b="y"`), and the
/// prefix (`name{labels} `) of every line its metric's definition fixes, in
/// the order [`crate::render::rendered_lines`] lays them out; a scrape copies
/// a prefix and writes the value.
#[derive(Clone, Debug)]
pub struct RenderedLines {
    pairs: std::ops::Range<usize>,
    /// Its first line's index in [`RenderedText`]'s line ends.
    first_line: usize,
}

/// `prerender`: every group's rendered text of one metric, in one buffer of
/// prefixes, back to back in the order the groups were met, which is the
/// order a scrape prints them in: a scrape reads it front to back (a buffer
/// per group was a cache and TLB miss per group on a cold scrape).
#[derive(Default)]
pub struct RenderedText {
    /// The family's `# TYPE` and `# HELP` lines, once rendered
    /// ([`crate::render::rendered_header`]).
    header: Option<Box<[u8]>>,
    prefixes: Vec<u8>,
    /// Where each line's prefix ends in `prefixes` (it starts where the
    /// line before it ends).
    ends: Vec<usize>,
    /// Every group's label pairs, back to back (read only for a line the
    /// definition does not fix, a bucket not declared).
    pairs: Vec<u8>,
}

impl RenderedText {
    /// No groups yet; the family's header lines, if rendered.
    pub fn new(header: Option<Box<[u8]>>) -> RenderedText {
        RenderedText {
            header,
            ..RenderedText::default()
        }
    }

    /// Adds a group's text: `pairs`, then its line prefixes, which
    /// `prefixes` writes one [`LinePrefixWriter::line`] call each.
    pub fn push(
        &mut self,
        pairs: &[u8],
        prefixes: impl FnOnce(&mut LinePrefixWriter<'_>),
    ) -> RenderedLines {
        let start = self.pairs.len();
        self.pairs.extend_from_slice(pairs);
        let first_line = self.ends.len();
        prefixes(&mut LinePrefixWriter { text: self });
        RenderedLines {
            pairs: start..self.pairs.len(),
            first_line,
        }
    }

    /// The family's header lines, if rendered.
    #[inline]
    pub fn header(&self) -> Option<&[u8]> {
        self.header.as_deref()
    }

    /// A group's label pairs.
    #[inline]
    pub fn pairs(&self, lines: &RenderedLines) -> &[u8] {
        &self.pairs[lines.pairs.clone()]
    }

    /// Line `i`'s prefix of a group.
    #[inline]
    pub fn line(&self, lines: &RenderedLines, i: usize) -> &[u8] {
        let at = lines.first_line + i;
        let start = if at == 0 { 0 } else { self.ends[at - 1] };
        &self.prefixes[start..self.ends[at]]
    }
}

/// Writes a group's line prefixes into [`RenderedText`] ([`RenderedText::push`]).
pub struct LinePrefixWriter<'t> {
    text: &'t mut RenderedText,
}

impl LinePrefixWriter<'_> {
    /// Writes one line's prefix with `write`, into the buffer it is given.
    pub fn line(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        write(&mut self.text.prefixes);
        self.text.ends.push(self.text.prefixes.len());
    }
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.labels.iter().map(|(n, v)| {
                (
                    String::from_utf8_lossy(n).into_owned(),
                    String::from_utf8_lossy(v).into_owned(),
                )
            }))
            .finish()
    }
}

impl PartialEq for Group {
    fn eq(&self, other: &Group) -> bool {
        self.labels == other.labels
    }
}

/// The exported values of one metric, as client_ruby's `Metric#values` returns them.
#[derive(Debug, PartialEq)]
pub enum MetricValues<'t> {
    /// Counters and gauges: one value per label set.
    Scalar(Vec<(&'t Group, f64)>),
    /// One entry per label set without `le`.
    Histogram(Vec<HistogramValue<'t>>),
    /// One entry per label set without `quantile`.
    Summary(Vec<SummaryValue<'t>>),
}

#[derive(Debug, PartialEq)]
pub struct HistogramValue<'t> {
    pub labels: &'t Group,
    /// Cumulative counts of the declared buckets, in declared order.
    pub buckets: &'t [f64],
    /// `le` values not declared (a changed registry), but `+Inf`, in order of
    /// first appearance (Ruby's hash order).
    pub others: Vec<(&'t [u8], f64)>,
    /// Where `+Inf` prints among `others` (before `others[inf_at]`; at the
    /// end when `inf_at == others.len()`): where it first appeared, or last
    /// if it never did.
    pub inf_at: usize,
    /// `None` if no `le="sum"` entry exists (Ruby prints an empty value; the
    /// renderer leaves the `_sum` line out).
    pub sum: Option<f64>,
    /// The `+Inf` count.
    pub count: f64,
}

#[derive(Debug, PartialEq)]
pub struct SummaryValue<'t> {
    pub labels: &'t Group,
    pub sum: f64,
    pub count: f64,
}
