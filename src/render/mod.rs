//! Stage 3, render: Prometheus text exposition (0.0.4), byte-identical to what
//! client_ruby's `Formats::Text.marshal` prints.
//!
//! Per metric, in registration order: `# TYPE`, `# HELP` (help escapes `\` and
//! newline), then its series. Labels print in the label set's order (sorted
//! keys, as decoded from the store), `le` last for buckets; values print as
//! Ruby's `Float#to_s`. A histogram prints every declared bucket (cumulative),
//! then `+Inf`, `_sum`, `_count`; a summary `_sum`, then `_count`. One
//! departure, so that only valid exposition is printed: a histogram label set
//! without a `sum` entry has no `_sum` line (Ruby prints one with no value).
//!
//! Every line is written by the one exposition encoder, [`crate::format::text`]'s
//! [`FamilyEncoder`] chain; the values come from
//! [`crate::shared::metric_values`], so this module and [`crate::export`] do not import each
//! other's internals.
//!
//! # Seams
//!
//! [`live`] has one seam, [`LinePrefixes`](crate::shared::seams::LinePrefixes), taken
//! from [`Seams::resolve`](crate::shared::seams::Seams::resolve) in
//! [`live::LiveRegistry::new`]; the store exposition here copies a group's
//! label pairs when the exporter's [`Keep`](crate::shared::seams::Keep) seam rendered
//! them ([`Group::rendered`]). Both are `prerender`'s; the table is in
//! [`crate::shared::seams`].
//!
//! [`live`] renders in-memory registries at scale;
//! [`rabbitmq`] builds RabbitMQ's per-object families on one.

use crate::format::registry::{MetricDef, MetricType};
use crate::format::text::{FamilyEncoder, SampleEncoder, ValueEncoder};
use crate::shared::metric_values::{Group, MetricValues, RenderedLines, RenderedText};

pub mod live;

/// Writes one metric family as client_ruby does; `text` holds the groups'
/// rendered lines, if they were rendered ([`Group::rendered`]).
pub fn write_family(
    out: &mut Vec<u8>,
    def: &MetricDef,
    values: &MetricValues,
    text: &RenderedText,
) {
    let name = def.name.as_bytes();
    let mut family = match text.header() {
        Some(header) => FamilyEncoder::with_header(out, name, header),
        None => FamilyEncoder::new(out, name, def.kind.name(), def.help.as_bytes()),
    };
    match values {
        MetricValues::Scalar(series) => {
            for (group, value) in series {
                sample(&mut family, text, group, SCALAR_LINE, b"", None).ruby_float(*value);
            }
        }
        MetricValues::Histogram(groups) => {
            let lines = HistogramLines(def.buckets.len());
            for group in groups {
                let declared = def.buckets.iter().map(|b| b.as_bytes()).zip(group.buckets);
                for (i, (le, value)) in declared.enumerate() {
                    sample(&mut family, text, group.labels, i, b"_bucket", Some(le))
                        .ruby_float(*value);
                }
                let inf = |family: &mut FamilyEncoder<'_>| {
                    sample(
                        family,
                        text,
                        group.labels,
                        lines.inf(),
                        b"_bucket",
                        Some(b"+Inf"),
                    )
                    .ruby_float(group.count)
                };
                for (i, (le, value)) in group.others.iter().enumerate() {
                    if i == group.inf_at {
                        inf(&mut family);
                    }
                    // Not declared (a changed registry): no prefix kept.
                    with_labels(family.sample(b"_bucket"), text, group.labels)
                        .label(b"le", le)
                        .value()
                        .ruby_float(*value);
                }
                if group.inf_at >= group.others.len() {
                    inf(&mut family);
                }
                // No `sum` entry (a writer killed between a bucket's first
                // write and its sum's): Ruby prints `_sum` with no value,
                // which makes Prometheus refuse the whole target; the line is
                // left out instead.
                if let Some(sum) = group.sum {
                    sample(&mut family, text, group.labels, lines.sum(), b"_sum", None)
                        .ruby_float(sum);
                }
                sample(
                    &mut family,
                    text,
                    group.labels,
                    lines.count(),
                    b"_count",
                    None,
                )
                .ruby_float(group.count);
            }
        }
        MetricValues::Summary(groups) => {
            for group in groups {
                sample(
                    &mut family,
                    text,
                    group.labels,
                    SUMMARY_SUM_LINE,
                    b"_sum",
                    None,
                )
                .ruby_float(group.sum);
                sample(
                    &mut family,
                    text,
                    group.labels,
                    SUMMARY_COUNT_LINE,
                    b"_count",
                    None,
                )
                .ruby_float(group.count);
            }
        }
    }
}

/// A group's label pairs: rendered once with `prerender` (a long-lived
/// exporter escaped them when it first met the set), else encoded now.
#[inline]
fn with_labels<'o>(
    sample: SampleEncoder<'o>,
    text: &RenderedText,
    group: &Group,
) -> SampleEncoder<'o> {
    match &group.rendered {
        Some(rendered) => sample.rendered_labels(text.pairs(rendered)),
        None => sample.labels(group.labels.iter().map(|(n, v)| (&**n, &**v))),
    }
}

/// One line of a group, up to its value: the prefix copied if the group's
/// lines were rendered ([`rendered_lines`]: `line` is its index there),
/// else `name<suffix>{labels[,le]} ` encoded now ([`encoded_sample`]).
/// Always inlined, the encoding kept out of line: a call's prologue and
/// epilogue would cost a prerendered line more than its copy does.
#[inline(always)]
fn sample<'f>(
    family: &'f mut FamilyEncoder<'_>,
    text: &RenderedText,
    group: &Group,
    line: usize,
    suffix: &[u8],
    le: Option<&[u8]>,
) -> ValueEncoder<'f> {
    match &group.rendered {
        Some(rendered) => family.prerendered(text.line(rendered, line)),
        None => encoded_sample(family, text, group, suffix, le),
    }
}

/// [`sample`] of a group whose lines were not rendered.
#[inline(never)]
fn encoded_sample<'f>(
    family: &'f mut FamilyEncoder<'_>,
    text: &RenderedText,
    group: &Group,
    suffix: &[u8],
    le: Option<&[u8]>,
) -> ValueEncoder<'f> {
    let sample = with_labels(family.sample(suffix), text, group);
    match le {
        Some(le) => sample.label(b"le", le),
        None => sample,
    }
    .value()
}

/// A counter's or gauge's one line.
const SCALAR_LINE: usize = 0;
const SUMMARY_SUM_LINE: usize = 0;
const SUMMARY_COUNT_LINE: usize = 1;

/// A histogram's lines with `n` declared buckets: each declared bucket, then
/// `+Inf`, `_sum`, `_count`.
struct HistogramLines(usize);

impl HistogramLines {
    fn inf(&self) -> usize {
        self.0
    }
    fn sum(&self) -> usize {
        self.0 + 1
    }
    fn count(&self) -> usize {
        self.0 + 2
    }
}

/// `prerender`: a family's `# TYPE` and `# HELP` lines, rendered once by the
/// encoder that writes them per scrape.
pub fn rendered_header(def: &MetricDef) -> Box<[u8]> {
    let mut header = Vec::new();
    crate::format::text::write_family_header(
        &mut header,
        def.name.as_bytes(),
        def.kind.name(),
        def.help.as_bytes(),
    );
    header.into_boxed_slice()
}

/// `prerender`: a group's label pairs (`labels`, in order, the group label
/// left out) escaped once, and the prefix of every line `def` fixes the name
/// and labels of, encoded by the same chain as a line written per scrape, so
/// the bytes are the same: the one line of a counter or gauge; a summary's
/// `_sum` and `_count`; a histogram's declared buckets, `+Inf`, `_sum`,
/// `_count` ([`HistogramLines`]).
pub fn rendered_lines<'a>(
    text: &mut RenderedText,
    def: &MetricDef,
    labels: impl Iterator<Item = (&'a [u8], &'a [u8])>,
) -> RenderedLines {
    let mut pairs = Vec::new();
    crate::format::text::write_label_pairs(&mut pairs, labels);
    let name = def.name.as_bytes();
    text.push(&pairs, |lines| {
        let mut prefix = |suffix: &[u8], le: Option<&[u8]>| {
            lines.line(|out| {
                let sample = SampleEncoder::new(out, name, suffix).rendered_labels(&pairs);
                match le {
                    Some(le) => sample.label(b"le", le),
                    None => sample,
                }
                .end_prefix()
            })
        };
        match def.kind {
            MetricType::Counter | MetricType::Gauge => prefix(b"", None),
            MetricType::Summary => {
                prefix(b"_sum", None);
                prefix(b"_count", None);
            }
            MetricType::Histogram => {
                for le in &def.buckets {
                    prefix(b"_bucket", Some(le.as_bytes()));
                }
                prefix(b"_bucket", Some(b"+Inf"));
                prefix(b"_sum", None);
                prefix(b"_count", None);
            }
        }
    })
}
