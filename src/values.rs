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
    /// `prerender`: the label pairs rendered and escaped once, `a="x",b="y"`.
    pub rendered: Option<Box<[u8]>>,
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
    pub buckets: Vec<f64>,
    /// `le` values not declared (a changed registry), and `+Inf`, in Ruby's hash
    /// order: in order of first appearance, `+Inf` last if it never appeared.
    pub others: Vec<(&'t [u8], f64)>,
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
