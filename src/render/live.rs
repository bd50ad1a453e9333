//! An in-memory registry for one process: families of counters and gauges with
//! many series (a million and more), values changing between scrapes, rendered
//! as client_ruby prints the text format.
//!
//! Storage is columnar per family so a million series cost a few allocations,
//! not millions: all label values of a family back to back in one byte arena
//! (`u32` end offsets), the values in one `Vec<f64>`, and a hash table of series
//! indices for get-or-create.
//!
//! # The `prerender` seam
//!
//! Only one thing differs between strategies: how each series' line prefix
//! `name{k="v",...} ` reaches the scrape buffer ([`LinePrefixes`], resolved
//! in [`crate::shared::seams`]).
//! - Baseline (RabbitMQ before "Pre-render prometheus labels"): on every scrape,
//!   walk the series' label pairs, escape each value byte by byte, build the
//!   line in a fresh buffer, then copy it out.
//! - `prerender`: the prefix is rendered once when the series is created (with a
//!   fast "needs escaping?" scan), so a scrape is one buffer of copies plus value
//!   formatting.
//!
//! Both write the same bytes; `tests/render_live.rs` proves it by proptest over
//! awkward names and values.

use crate::format::registry::{self, MetricType};
use crate::format::rubyfloat;
use crate::format::text::{FamilyEncoder, SampleEncoder};
use crate::shared::event_probe::probe;
use crate::shared::seams::{LinePrefixes, Seams};
use crate::shared::strategy::StrategySet;
use anyhow::{bail, Context, Result};
use hashbrown::HashTable;
use std::hash::{BuildHasher, Hasher};

/// A family's place in its [`LiveRegistry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FamilyId(u32);

impl FamilyId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One series: its family and its index within the family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeriesId {
    pub family: FamilyId,
    pub index: u32,
}

/// Families of counters and gauges, rendered in registration order.
pub struct LiveRegistry {
    families: Vec<Family>,
    /// The seam, resolved once: every family keeps its prefixes this way.
    prefixes: LinePrefixes,
    hasher: ahash::RandomState,
}

struct Family {
    name: Box<[u8]>,
    kind: MetricType,
    help: Box<[u8]>,
    label_names: Box<[Box<[u8]>]>,
    /// Label values of every series, back to back.
    label_bytes: Vec<u8>,
    /// End offset in `label_bytes` of each label value, `label_names.len()` per series.
    value_ends: Vec<u32>,
    values: Vec<f64>,
    /// Series indices, hashed by label values (get-or-create).
    index: HashTable<u32>,
    prefixes: FamilyPrefixes,
}

/// A family's prefixes, as its [`LinePrefixes`] seam keeps them.
enum FamilyPrefixes {
    /// Baseline: nothing kept; every scrape renders each prefix afresh.
    PerScrape,
    /// `prerender`: every prefix rendered once at series creation, back to back.
    Prerendered { bytes: Vec<u8>, ends: Vec<u32> },
}

impl LiveRegistry {
    /// An empty registry; `strategies` decides whether prefixes are pre-rendered.
    pub fn new(strategies: StrategySet) -> LiveRegistry {
        LiveRegistry {
            families: Vec::new(),
            prefixes: Seams::resolve(strategies).render.line_prefixes,
            // Fixed keys: the table only holds our own series, and runs stay reproducible.
            hasher: ahash::RandomState::with_seeds(0x9e37, 0x79b9, 0x7f4a, 0x7c15),
        }
    }

    /// Registers a counter or gauge family with its label names, in order.
    pub fn register(
        &mut self,
        name: &str,
        kind: MetricType,
        help: &str,
        label_names: &[&str],
    ) -> Result<FamilyId> {
        if !registry::is_metric_name(name.as_bytes()) {
            bail!("invalid metric name {name:?}");
        }
        if !matches!(kind, MetricType::Counter | MetricType::Gauge) {
            bail!(
                "metric {name}: only counters and gauges are supported, not {}",
                kind.name()
            );
        }
        for f in &self.families {
            let other = std::str::from_utf8(&f.name).expect("registered names are ASCII");
            registry::name_clash(other, f.kind, name, kind)?;
        }
        for (i, label) in label_names.iter().enumerate() {
            registry::validate_label_name(label, &[])
                .with_context(|| format!("metric {name}: invalid label name {label:?}"))?;
            if label_names[..i].contains(label) {
                bail!("metric {name}: label {label} is declared twice");
            }
        }
        let id = FamilyId(u32::try_from(self.families.len()).context("too many families")?);
        self.families.push(Family {
            name: name.as_bytes().into(),
            kind,
            help: help.as_bytes().into(),
            label_names: label_names.iter().map(|l| l.as_bytes().into()).collect(),
            label_bytes: Vec::new(),
            value_ends: Vec::new(),
            values: Vec::new(),
            index: HashTable::new(),
            prefixes: match self.prefixes {
                LinePrefixes::PerScrape => FamilyPrefixes::PerScrape,
                LinePrefixes::Prerendered => FamilyPrefixes::Prerendered {
                    bytes: Vec::new(),
                    ends: Vec::new(),
                },
            },
        });
        Ok(id)
    }

    /// The series with these label values (one per declared label, in order),
    /// created at 0.0 if new.
    pub fn series(&mut self, family: FamilyId, label_values: &[&[u8]]) -> Result<SeriesId> {
        let hasher = &self.hasher;
        let fam = self
            .families
            .get_mut(family.index())
            .context("unknown family")?;
        if label_values.len() != fam.label_names.len() {
            bail!(
                "metric {}: expected {} label values, got {}",
                String::from_utf8_lossy(&fam.name),
                fam.label_names.len(),
                label_values.len()
            );
        }
        let hash = hash_values(hasher, label_values.iter().copied());
        if let Some(&index) = fam.index.find(hash, |&i| {
            fam.label_values(i as usize)
                .eq(label_values.iter().copied())
        }) {
            return Ok(SeriesId { family, index });
        }
        let index = u32::try_from(fam.values.len()).context("too many series in one family")?;
        for value in label_values {
            fam.label_bytes.extend_from_slice(value);
            let end = u32::try_from(fam.label_bytes.len()).with_context(|| {
                format!(
                    "metric {}: label values exceed 4 GiB",
                    String::from_utf8_lossy(&fam.name)
                )
            })?;
            fam.value_ends.push(end);
        }
        fam.values.push(0.0);
        if let FamilyPrefixes::Prerendered { bytes, ends } = &mut fam.prefixes {
            write_prefix_once(bytes, &fam.name, &fam.label_names, label_values);
            ends.push(u32::try_from(bytes.len()).context("pre-rendered prefixes exceed 4 GiB")?);
        }
        let Family {
            index: table,
            label_bytes,
            value_ends,
            label_names,
            ..
        } = fam;
        let k = label_names.len();
        table.insert_unique(hash, index, |&i| {
            hash_values(hasher, values_of(label_bytes, value_ends, k, i as usize))
        });
        Ok(SeriesId { family, index })
    }

    /// Sets a series' value (also for counters: a collector copies them from elsewhere).
    pub fn set(&mut self, id: SeriesId, value: f64) {
        self.families[id.family.index()].values[id.index as usize] = value;
    }

    /// Adds to a series' value; counters refuse to go down, as client_ruby does.
    pub fn inc(&mut self, id: SeriesId, by: f64) -> Result<()> {
        let fam = &mut self.families[id.family.index()];
        if fam.kind == MetricType::Counter && by < 0.0 {
            bail!(
                "counter {} cannot decrease (increment {by})",
                String::from_utf8_lossy(&fam.name)
            );
        }
        fam.values[id.index as usize] += by;
        Ok(())
    }

    pub fn get(&self, id: SeriesId) -> f64 {
        self.families[id.family.index()].values[id.index as usize]
    }

    /// Every value of one family, by series index (for bulk updates between scrapes).
    pub fn values_mut(&mut self, family: FamilyId) -> &mut [f64] {
        &mut self.families[family.index()].values
    }

    pub fn family_count(&self) -> usize {
        self.families.len()
    }

    pub fn family_ids(&self) -> impl Iterator<Item = FamilyId> {
        (0..self.families.len() as u32).map(FamilyId)
    }

    pub fn family_name(&self, family: FamilyId) -> &str {
        std::str::from_utf8(&self.families[family.index()].name).expect("validated ASCII")
    }

    pub fn family_kind(&self, family: FamilyId) -> MetricType {
        self.families[family.index()].kind
    }

    pub fn family_help(&self, family: FamilyId) -> &str {
        std::str::from_utf8(&self.families[family.index()].help).expect("registered as &str")
    }

    pub fn label_names(&self, family: FamilyId) -> impl Iterator<Item = &str> {
        let names = &self.families[family.index()].label_names;
        names
            .iter()
            .map(|n| std::str::from_utf8(n).expect("validated ASCII"))
    }

    /// A series' label values, in declared order.
    pub fn label_values(&self, id: SeriesId) -> impl Iterator<Item = &[u8]> {
        self.families[id.family.index()].label_values(id.index as usize)
    }

    /// Every value of one family, by series index.
    pub fn values(&self, family: FamilyId) -> &[f64] {
        &self.families[family.index()].values
    }

    pub fn series_count(&self) -> usize {
        self.families.iter().map(|f| f.values.len()).sum()
    }

    /// Clears `out` and writes the exposition of every family.
    pub fn render_into(&self, out: &mut Vec<u8>) {
        out.clear();
        for family in &self.families {
            family.write(out);
        }
    }

    /// Clears `out` and writes the exposition of the given families, in the given order.
    pub fn render_families_into(&self, families: &[FamilyId], out: &mut Vec<u8>) {
        out.clear();
        for id in families {
            self.families[id.index()].write(out);
        }
    }
}

impl Family {
    fn label_values(&self, series: usize) -> impl Iterator<Item = &[u8]> {
        values_of(
            &self.label_bytes,
            &self.value_ends,
            self.label_names.len(),
            series,
        )
    }

    /// `# TYPE`, `# HELP`, then one line per series, as client_ruby prints them.
    fn write(&self, out: &mut Vec<u8>) {
        let mut family = FamilyEncoder::new(out, &self.name, self.kind.name(), &self.help);
        match &self.prefixes {
            FamilyPrefixes::PerScrape => self.write_lines_per_scrape(&mut family),
            FamilyPrefixes::Prerendered { bytes, ends } => {
                // Room for the family's lines first: the copies and values
                // below then never grow the buffer (a scrape of 63k series,
                // alternated with the render floor three times: 1.14x the
                // floor's time without it, 1.08x with).
                family.reserve(bytes.len() + self.values.len() * rubyfloat::MAX_LINE_END);
                let mut start = 0;
                for (&end, &value) in ends.iter().zip(&self.values) {
                    family
                        .prerendered(&bytes[start..end as usize])
                        .ruby_float(value);
                    start = end as usize;
                }
            }
        }
    }

    /// Baseline: each line built from the label pairs in a fresh buffer,
    /// escaping byte by byte, then copied into the body.
    fn write_lines_per_scrape(&self, family: &mut FamilyEncoder<'_>) {
        for (series, &value) in self.values.iter().enumerate() {
            probe!("render.prefix_encoded");
            let mut line = Vec::new();
            let pairs = self.label_names.iter().map(|n| &n[..]);
            SampleEncoder::new(&mut line, &self.name, b"")
                .labels_escaped_bytewise(pairs.zip(self.label_values(series)))
                .value()
                .ruby_float(value);
            family.line(&line);
        }
    }
}

/// Renders `name{k="v",...} ` once, at series creation (fast scan, then copy).
fn write_prefix_once(
    out: &mut Vec<u8>,
    name: &[u8],
    label_names: &[Box<[u8]>],
    label_values: &[&[u8]],
) {
    probe!("render.prefix_encoded");
    let names = label_names.iter().map(|n| &n[..]);
    SampleEncoder::new(out, name, b"")
        .labels(names.zip(label_values.iter().copied()))
        .end_prefix();
}

fn values_of<'a>(
    label_bytes: &'a [u8],
    value_ends: &'a [u32],
    k: usize,
    series: usize,
) -> impl Iterator<Item = &'a [u8]> {
    let ends = &value_ends[series * k..(series + 1) * k];
    let mut start = if series == 0 {
        0
    } else {
        value_ends[series * k - 1] as usize
    };
    ends.iter().map(move |&end| {
        let value = &label_bytes[start..end as usize];
        start = end as usize;
        value
    })
}

fn hash_values<'a>(hasher: &ahash::RandomState, values: impl Iterator<Item = &'a [u8]>) -> u64 {
    let mut h = hasher.build_hasher();
    for v in values {
        // Length first, so ("ab","c") and ("a","bc") hash apart.
        h.write_usize(v.len());
        h.write(v);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::event_probe::counted;
    use crate::shared::strategy::Strategy;

    /// `prerender`: each series' prefix encoded once, when it is created;
    /// without it, once per series per scrape.
    #[test]
    fn prerender_encodes_each_prefix_once() {
        for set in StrategySet::combinations(crate::shared::strategy::Stage::Render) {
            let mut reg = LiveRegistry::new(set);
            let (_, created) = counted(|| {
                let f = reg.register("f", MetricType::Gauge, "", &["a"]).unwrap();
                for i in 0..10 {
                    reg.series(f, &[format!("v{i}").as_bytes()]).unwrap();
                }
            });
            let mut out = Vec::new();
            let (_, scrapes) = counted(|| (0..3).for_each(|_| reg.render_into(&mut out)));
            let prerender = set.contains(Strategy::Prerender);
            let (at_creation, per_scrape) = if prerender { (10, 0) } else { (0, 10) };
            assert_eq!(created.get("render.prefix_encoded"), at_creation, "{set}");
            assert_eq!(
                scrapes.get("render.prefix_encoded"),
                3 * per_scrape,
                "{set}"
            );
        }
    }

    fn both(build: impl Fn(&mut LiveRegistry)) -> Vec<u8> {
        let mut outs = Vec::new();
        for set in [
            StrategySet::NONE,
            StrategySet::NONE.with(Strategy::Prerender),
        ] {
            let mut reg = LiveRegistry::new(set);
            build(&mut reg);
            let mut out = Vec::new();
            reg.render_into(&mut out);
            outs.push(out);
        }
        assert_eq!(
            String::from_utf8_lossy(&outs[0]),
            String::from_utf8_lossy(&outs[1])
        );
        outs.pop().unwrap()
    }

    #[test]
    fn renders_like_client_ruby() {
        let out = both(|reg| {
            let c = reg
                .register(
                    "jobs_total",
                    MetricType::Counter,
                    "Jobs.\nDone \\ \"ok\"",
                    &["queue", "vhost"],
                )
                .unwrap();
            let s = reg.series(c, &[b"q\"1\\\n", b"/"]).unwrap();
            reg.inc(s, 3.0).unwrap();
            let s2 = reg.series(c, &[b"caf\xc3\xa9", b"/"]).unwrap();
            reg.set(s2, 0.25);
            assert_eq!(reg.series(c, &[b"q\"1\\\n", b"/"]).unwrap(), s);
            let g = reg.register("up", MetricType::Gauge, "", &[]).unwrap();
            let u = reg.series(g, &[]).unwrap();
            reg.set(u, f64::NEG_INFINITY);
        });
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "# TYPE jobs_total counter\n# HELP jobs_total Jobs.\\nDone \\\\ \"ok\"\n\
             jobs_total{queue=\"q\\\"1\\\\\\n\",vhost=\"/\"} 3.0\n\
             jobs_total{queue=\"café\",vhost=\"/\"} 0.25\n\
             # TYPE up gauge\n# HELP up \nup -Infinity\n"
        );
    }

    #[test]
    fn refuses_bad_input() {
        let mut reg = LiveRegistry::new(StrategySet::NONE);
        assert!(reg.register("1bad", MetricType::Gauge, "", &[]).is_err());
        assert!(reg.register("h", MetricType::Histogram, "", &[]).is_err());
        assert!(reg
            .register("x", MetricType::Gauge, "", &["__name"])
            .is_err());
        assert!(reg
            .register("x", MetricType::Gauge, "", &["a", "a"])
            .is_err());
        let c = reg
            .register("c_total", MetricType::Counter, "", &["a"])
            .unwrap();
        assert!(reg
            .register("c_total", MetricType::Counter, "", &["a"])
            .is_err());
        assert!(reg.series(c, &[]).is_err());
        let s = reg.series(c, &[b"x"]).unwrap();
        assert!(reg.inc(s, -1.0).is_err());
        assert_eq!(reg.get(s), 0.0);
    }

    #[test]
    fn label_boundaries_do_not_collide() {
        let mut reg = LiveRegistry::new(StrategySet::NONE);
        let f = reg
            .register("f", MetricType::Gauge, "", &["a", "b"])
            .unwrap();
        let x = reg.series(f, &[b"ab", b"c"]).unwrap();
        let y = reg.series(f, &[b"a", b"bc"]).unwrap();
        assert_ne!(x, y);
        assert_eq!(reg.series_count(), 2);
    }
}
