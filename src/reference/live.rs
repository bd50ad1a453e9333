//! The naive renderer of an in-memory registry
//! ([`crate::render::live::LiveRegistry`]): families of counters and gauges,
//! given as plain data, printed as client_ruby's `Formats::Text.marshal`
//! prints them — per family `# TYPE`, `# HELP`, then one line per series in
//! creation order, labels in declaration order, the value as Ruby's
//! `Float#to_s`. The lines are [`super::exposition`]'s plain loops; nothing
//! here touches the registry's arena, its prefixes or `text`'s encoders.

use crate::format::registry::MetricType;

/// One family as data: what was registered and every series' label values
/// (one per label name, in order) and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    pub name: String,
    pub kind: MetricType,
    pub help: String,
    pub label_names: Vec<String>,
    pub series: Vec<(Vec<Vec<u8>>, f64)>,
}

impl Family {
    /// How many series the families hold.
    pub fn count(families: &[Family]) -> usize {
        families.iter().map(|f| f.series.len()).sum()
    }
}

/// The exposition of `families`, in the order given.
pub fn render(families: &[Family]) -> Vec<u8> {
    let mut out = Vec::new();
    for family in families {
        super::exposition::header(&mut out, &family.name, family.kind, family.help.as_bytes());
        for (values, value) in &family.series {
            let pairs: Vec<(&[u8], &[u8])> = family
                .label_names
                .iter()
                .map(|n| n.as_bytes())
                .zip(values.iter().map(Vec::as_slice))
                .collect();
            super::exposition::line(&mut out, &family.name, &pairs, Some(*value));
        }
    }
    out
}
