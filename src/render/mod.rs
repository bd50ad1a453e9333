//! Stage 3, render: Prometheus text exposition (0.0.4), byte-identical to what
//! client_ruby's `Formats::Text.marshal` prints.
//!
//! Per metric, in registration order: `# TYPE`, `# HELP` (help escapes `\` and
//! newline), then its series. Labels print in the label set's order (sorted
//! keys, as decoded from the store), `le` last for buckets; values print as
//! Ruby's `Float#to_s`. A histogram prints every declared bucket (cumulative),
//! then `+Inf`, `_sum`, `_count`; a summary `_sum`, then `_count`.
//!
//! Every line is written by the one exposition encoder, [`crate::text`]'s
//! [`FamilyEncoder`] chain; the values come from
//! [`crate::values`], so this module and [`crate::export`] do not import each
//! other's internals.
//!
//! # Seams
//!
//! [`live`] has one seam, [`LinePrefixes`](crate::seams::LinePrefixes), taken
//! from [`Seams::resolve`](crate::seams::Seams::resolve) in
//! [`live::LiveRegistry::new`]; the store exposition here copies a group's
//! label pairs when the exporter's [`Keep`](crate::seams::Keep) seam rendered
//! them ([`Group::rendered`]). Both are `prerender`'s; the table is in
//! [`crate::seams`].
//!
//! [`live`] renders in-memory registries at scale;
//! [`rabbitmq`] builds RabbitMQ's per-object families on one.

use crate::registry::MetricDef;
use crate::text::{FamilyEncoder, SampleEncoder};
use crate::values::{Group, MetricValues};

pub mod live;
pub mod rabbitmq;

/// Writes one metric family as client_ruby does.
pub fn write_family(out: &mut Vec<u8>, def: &MetricDef, values: &MetricValues) {
    let name = def.name.as_bytes();
    let mut family = FamilyEncoder::new(out, name, def.kind.name(), def.help.as_bytes());
    match values {
        MetricValues::Scalar(series) => {
            for (labels, value) in series {
                with_labels(family.sample(b""), labels)
                    .value()
                    .ruby_float(*value);
            }
        }
        MetricValues::Histogram(groups) => {
            for group in groups {
                let declared = def.buckets.iter().map(|b| b.as_bytes()).zip(&group.buckets);
                let others = group.others.iter().map(|(le, v)| (*le, v));
                for (le, value) in declared.chain(others) {
                    with_labels(family.sample(b"_bucket"), group.labels)
                        .label(b"le", le)
                        .value()
                        .ruby_float(*value);
                }
                with_labels(family.sample(b"_sum"), group.labels)
                    .value()
                    .ruby_float_or_empty(group.sum);
                with_labels(family.sample(b"_count"), group.labels)
                    .value()
                    .ruby_float(group.count);
            }
        }
        MetricValues::Summary(groups) => {
            for group in groups {
                with_labels(family.sample(b"_sum"), group.labels)
                    .value()
                    .ruby_float(group.sum);
                with_labels(family.sample(b"_count"), group.labels)
                    .value()
                    .ruby_float(group.count);
            }
        }
    }
}

/// A group's label pairs: rendered once with `prerender` (a long-lived
/// exporter escaped them when it first met the set), else encoded now.
#[inline]
fn with_labels<'o>(sample: SampleEncoder<'o>, group: &Group) -> SampleEncoder<'o> {
    match &group.rendered {
        Some(rendered) => sample.rendered_labels(rendered),
        None => sample.labels(group.labels.iter().map(|(n, v)| (&**n, &**v))),
    }
}
