//! Stage 3, render: Prometheus text exposition (0.0.4), byte-identical to what
//! client_ruby's `Formats::Text.marshal` prints.
//!
//! Per metric, in registration order: `# TYPE`, `# HELP` (help escapes `\` and
//! newline), then its series. Labels print in the label set's order (sorted
//! keys, as decoded from the store), `le` last for buckets; values print as
//! Ruby's `Float#to_s`. A histogram prints every declared bucket (cumulative),
//! then `+Inf`, `_sum`, `_count`; a summary `_sum`, then `_count`.
//!
//! [`live`] renders in-memory registries at scale (the `prerender` strategy).

use crate::values::{Group, MetricValues};
use crate::registry::MetricDef;
use crate::rubyfloat;
use crate::text::{self, Escape};

pub mod live;
pub mod rabbitmq;

/// Writes one metric family as client_ruby does.
pub fn write_family(out: &mut Vec<u8>, def: &MetricDef, values: &MetricValues) {
    let name = def.name.as_bytes();
    out.extend_from_slice(b"# TYPE ");
    out.extend_from_slice(name);
    out.push(b' ');
    out.extend_from_slice(def.kind.name().as_bytes());
    out.extend_from_slice(b"\n# HELP ");
    out.extend_from_slice(name);
    out.push(b' ');
    text::write_escaped(out, def.help.as_bytes(), Escape::Help);
    out.push(b'\n');
    match values {
        MetricValues::Scalar(series) => {
            for (labels, value) in series {
                write_sample(out, name, b"", labels, None, Some(*value));
            }
        }
        MetricValues::Histogram(groups) => {
            for group in groups {
                let declared = def.buckets.iter().map(|b| b.as_bytes()).zip(&group.buckets);
                let others = group.others.iter().map(|(le, v)| (*le, v));
                for (le, value) in declared.chain(others) {
                    write_sample(out, name, b"_bucket", group.labels, Some(le), Some(*value));
                }
                write_sample(out, name, b"_sum", group.labels, None, group.sum);
                write_sample(out, name, b"_count", group.labels, None, Some(group.count));
            }
        }
        MetricValues::Summary(groups) => {
            for group in groups {
                write_sample(out, name, b"_sum", group.labels, None, Some(group.sum));
                write_sample(out, name, b"_count", group.labels, None, Some(group.count));
            }
        }
    }
}

/// `name<suffix>{labels[,le="…"]} value\n`; a missing value prints empty, as Ruby's `nil.to_s`.
fn write_sample(
    out: &mut Vec<u8>,
    name: &[u8],
    suffix: &[u8],
    labels: &Group,
    le: Option<&[u8]>,
    value: Option<f64>,
) {
    out.extend_from_slice(name);
    out.extend_from_slice(suffix);
    let le = le.map(|le| (&b"le"[..], le));
    match &labels.rendered {
        // `prerender`: the label pairs were escaped once, when the set was met.
        Some(rendered) => {
            if !rendered.is_empty() || le.is_some() {
                out.push(b'{');
                out.extend_from_slice(rendered);
                if let Some(le) = le {
                    if !rendered.is_empty() {
                        out.push(b',');
                    }
                    text::write_label_pairs(out, [le]);
                }
                out.push(b'}');
            }
        }
        None => {
            let pairs = labels.labels.iter().map(|(n, v)| (&**n, &**v));
            text::write_label_block(out, pairs.chain(le));
        }
    }
    out.push(b' ');
    if let Some(value) = value {
        rubyfloat::write(out, value);
    }
    out.push(b'\n');
}
