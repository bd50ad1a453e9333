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

/// `prerender`: a group's label pairs escaped once (`a="x",b="y"`), and the
/// prefix (`name{labels} `) of every line its metric's definition fixes, in
/// the order [`crate::render::rendered_lines`] lays them out; a scrape copies
/// a prefix and writes the value.
pub struct RenderedLines {
    pub pairs: Box<[u8]>,
    /// The prefixes back to back; prefix `i` ends at `ends[i]`.
    prefixes: Box<[u8]>,
    ends: Box<[u32]>,
}

impl RenderedLines {
    /// The label pairs and the prefixes, in order.
    pub fn new(pairs: Vec<u8>, prefixes: Vec<u8>, ends: Vec<u32>) -> RenderedLines {
        RenderedLines {
            pairs: pairs.into_boxed_slice(),
            prefixes: prefixes.into_boxed_slice(),
            ends: ends.into_boxed_slice(),
        }
    }

    /// Line `i`'s prefix.
    #[inline]
    pub fn line(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.prefixes[start..self.ends[i] as usize]
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
