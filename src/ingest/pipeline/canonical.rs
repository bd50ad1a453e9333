//! The canonicalize seam: every series of a request validated and given its
//! canonical form and destinations, before anything is applied. Two
//! canonicalizers: per request ([`BaselineSeries`], upstream's shape), and
//! through the [`SeriesCache`] (`series-cache`), once per series. Either
//! hands the routers a [`Resolved`].

use super::series_cache::SeriesCache;
use super::{intern, invalid, IngestError};
use crate::format::text::{write_escaped, Escape};
use crate::ingest::group_key::write_group_key;
use crate::ingest::groups::{Shared, OVERFLOW};
use crate::ingest::plan::{Plan, PlanGeneration};
use crate::ingest::wire::{self, Batch};
use crate::shared::seams::Canonicalize;
use std::collections::{BTreeMap, HashMap};

/// What a request's series are canonicalized by and into: the ingester's
/// seam, plan, series cache and buffers kept between requests, borrowed for
/// one request.
pub(super) struct Canonicalizer<'a> {
    pub(super) seam: Canonicalize,
    pub(super) plan: &'a PlanGeneration,
    pub(super) cache: &'a mut SeriesCache,
    /// The entry ids of the last request's series, for this one's.
    pub(super) spare_ids: &'a mut Vec<u32>,
    pub(super) spare_new_series: &'a mut NewSeriesBuffers,
    /// The ingester's copy of the group table's destinations (see [`intern`]).
    pub(super) dests: &'a mut Vec<(u16, u32)>,
    /// The group table and the budget.
    pub(super) shared: &'a Shared,
}

impl Canonicalizer<'_> {
    /// Canonicalize seam: every series of the request, validated, before anything is applied.
    #[inline(never)] // one call per request; kept apart so profiles show the seam
    pub(super) fn resolve(&mut self, batch: &Batch<'_>) -> Result<Resolved, IngestError> {
        if self.seam == Canonicalize::PerRequest {
            let series = batch
                .series
                .iter()
                .map(|s| BaselineSeries::canonicalize(batch.series_labels(s), &self.plan.plan))
                .collect::<Result<_, _>>()?;
            return Ok(Resolved::PerRequest(series));
        }
        self.cache.check_generation(self.plan.generation);
        let mut ids = std::mem::take(self.spare_ids);
        ids.clear();
        let mut new = std::mem::take(self.spare_new_series);
        let mut key = Vec::new();
        let mut deferred = Vec::new();
        for span in &batch.series {
            let mut labels = batch.series_labels(span);
            let raw = match span.raw_labels {
                Some(raw) => raw,
                None => {
                    key.clear();
                    for (n, v) in labels {
                        wire::put_label(&mut key, n, v);
                    }
                    &key[..]
                }
            };
            let id = match self.cache.lookup(raw) {
                Ok(id) => id,
                Err(unseen) => {
                    if let (true, Some(span_raw)) = (span.labels_deferred, span.raw_labels) {
                        deferred.clear();
                        wire::parse_label_fields(span_raw, &mut deferred)?;
                        labels = &deferred;
                    }
                    let series = NewSeries::canonicalize(labels, &self.plan.plan, &mut new)?;
                    if self.cache.keeps_keys() {
                        series.write_series_key(&mut new.series_key);
                    }
                    for i in 0..new.aggs.len() {
                        let agg = new.aggs[i];
                        let group_by = &self.plan.plan.aggregations[agg as usize].group_by;
                        let start = new.group_keys.len();
                        series.write_group_key(group_by, &mut new.group_keys);
                        let group_key = &new.group_keys[start..];
                        let dest = match new.last_group.dest(agg, group_key) {
                            Some(dest) => dest,
                            None => {
                                let (gid, dest) = intern(self.shared, self.dests, agg, group_key);
                                if gid != OVERFLOW {
                                    new.last_group.set(agg, group_key, dest);
                                }
                                dest
                            }
                        };
                        new.dests.push((dest, agg, new.group_keys.len()));
                    }
                    let mut start = 0;
                    let dests = new.dests.iter().map(|&(dest, agg, end)| {
                        let group_key = &new.group_keys[start..end];
                        start = end;
                        (dest, agg, group_key)
                    });
                    self.cache.insert(raw, unseen, &new.series_key, dests)
                }
            };
            ids.push(id);
        }
        *self.spare_new_series = new;
        Ok(Resolved::Cached(ids))
    }
}

/// What the canonicalize seam produced for a request's series, read by either
/// router: the per-sample one through [`Resolved::for_each_routed_key`], the
/// batched one through the series' destination ids.
pub(super) enum Resolved {
    /// Reference: per series, computed for this request.
    PerRequest(Vec<BaselineSeries>),
    /// `series-cache`: per series, an entry id in the cache.
    Cached(Vec<u32>),
}

impl Resolved {
    /// Series `i`'s (aggregation, group key, series key) per destination, built
    /// as upstream builds them for every routed sample.
    #[inline(always)]
    pub(super) fn for_each_routed_key(
        &self,
        i: usize,
        plan: &Plan,
        cache: &SeriesCache,
        mut f: impl FnMut(u16, String, String),
    ) {
        match self {
            Resolved::PerRequest(all) => {
                let s = &all[i];
                for &agg in &s.aggs {
                    let group_by = &plan.aggregations[agg as usize].group_by;
                    let labels = parse_series_key(&s.series_key);
                    f(
                        agg,
                        group_key_of(&labels, group_by),
                        s.series_key.to_string(),
                    );
                }
            }
            Resolved::Cached(ids) => {
                for (agg, group_key) in cache.dest_keys(ids[i]) {
                    f(
                        agg,
                        group_key.to_string(),
                        cache.series_key(ids[i]).to_string(),
                    );
                }
            }
        }
    }
}

/// The reference canonical form of a series, rebuilt for every request.
pub struct BaselineSeries {
    /// `name{k="v",…}`, values escaped, labels sorted.
    pub series_key: String,
    /// Indexes of the aggregations this series feeds.
    pub aggs: Vec<u16>,
    /// `k=v;` joined — upstream's attribute fingerprint. Nothing here reads it;
    /// it is built because upstream builds it per series per request.
    pub fingerprint: String,
    /// The label set as a JSON object — upstream's population key (same note).
    pub population: String,
}

/// Checks a series' labels as Prometheus requires them: UTF-8 names and
/// values, valid names, sorted by name without duplicates. The first label
/// that fails, in order, is the error.
fn validate(labels: &[(&[u8], &[u8])]) -> Result<(), IngestError> {
    let mut previous: Option<&[u8]> = None;
    for &(name, value) in labels {
        let name_str =
            std::str::from_utf8(name).map_err(|_| invalid("a label name is not UTF-8"))?;
        std::str::from_utf8(value)
            .map_err(|_| invalid(format!("the value of label `{name_str}` is not UTF-8")))?;
        if !crate::format::registry::is_label_name(name) {
            return Err(invalid(format!(
                "invalid label name `{}`",
                name_str.escape_debug()
            )));
        }
        if let Some(prev) = previous {
            if prev == name {
                return Err(invalid(format!("duplicate label name `{name_str}`")));
            }
            if prev > name {
                return Err(invalid(format!(
                    "label names are not sorted: `{name_str}` after `{}`",
                    String::from_utf8_lossy(prev)
                )));
            }
        }
        previous = Some(name);
    }
    Ok(())
}

/// [`validate`]'s answer for the usual series in one pass: label names (so
/// ASCII), ASCII values (so UTF-8), sorted without duplicates. Anything else
/// — an invalid series, or a valid one with a value beyond ASCII — takes
/// [`validate`], which names the first label that fails.
fn validate_ascii_first(labels: &[(&[u8], &[u8])]) -> Result<(), IngestError> {
    let plain = labels.iter().enumerate().all(|(i, &(name, value))| {
        value.is_ascii()
            && crate::format::registry::is_label_name(name)
            && (i == 0 || labels[i - 1].0 < name)
    });
    if plain {
        Ok(())
    } else {
        validate(labels)
    }
}

impl BaselineSeries {
    /// Validates a series and computes its canonical form, upstream-style.
    pub fn canonicalize(
        labels: &[(&[u8], &[u8])],
        plan: &Plan,
    ) -> Result<BaselineSeries, IngestError> {
        validate(labels)?;
        let utf8 = |b: &[u8]| std::str::from_utf8(b).expect("validated").to_owned();
        let map: HashMap<String, String> = labels
            .iter()
            .map(|&(name, value)| (utf8(name), utf8(value)))
            .collect();
        let metric = match map.get("__name__") {
            Some(n) if !n.is_empty() => n.clone(),
            _ => return Err(invalid("a series has no `__name__` label")),
        };
        let mut sorted: Vec<(String, String)> = map.clone().into_iter().collect();
        sorted.sort();
        let mut series_key = metric.clone();
        series_key.push('{');
        let mut first = true;
        for (k, v) in sorted.iter().filter(|(k, _)| k != "__name__") {
            if !first {
                series_key.push(',');
            }
            first = false;
            series_key.push_str(&format!("{k}=\"{}\"", escape_value(v)));
        }
        series_key.push('}');
        let fingerprint: String = sorted.iter().map(|(k, v)| format!("{k}={v};")).collect();
        let population_map: BTreeMap<&str, &str> = sorted
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let population =
            serde_json::to_string(&population_map).expect("a map of strings serializes");
        let aggs = plan
            .aggregations
            .iter()
            .enumerate()
            .filter(|(_, a)| {
                a.metric == metric
                    && a.matchers
                        .iter()
                        .all(|(k, v)| map.get(k).map_or("", String::as_str) == v)
            })
            .map(|(i, _)| i as u16)
            .collect();
        Ok(BaselineSeries {
            series_key,
            aggs,
            fingerprint: std::hint::black_box(fingerprint),
            population: std::hint::black_box(population),
        })
    }

    /// The group key for one aggregation (re-parsing the series key, upstream-style).
    pub fn group_key(&self, group_by: &[String]) -> String {
        group_key_of(&parse_series_key(&self.series_key), group_by)
    }
}

/// `series-cache`'s canonical form of a series it has not seen: the
/// validation, series key, aggregations and group keys of
/// [`BaselineSeries`], without what upstream builds per series and nothing
/// reads (a label map, a sorted copy of it, the fingerprint, the JSON
/// population, the series key parsed back for each group key): validated
/// labels are sorted and unique, so they are the sorted map. A series costs
/// the cache this once (`verify` holds it to the baseline's answers), written
/// into [`NewSeriesBuffers`] kept between requests: no allocation per series;
/// and its series key only where the per-sample router will read it.
pub(super) struct NewSeries<'l> {
    labels: &'l [(&'l [u8], &'l [u8])],
}

/// Where [`NewSeries`] writes a series' canonical form.
#[derive(Default)]
pub(super) struct NewSeriesBuffers {
    /// `name{k="v",…}`, values escaped, labels sorted.
    series_key: Vec<u8>,
    /// Indexes of the aggregations it feeds.
    aggs: Vec<u16>,
    /// Its group keys back to back, one per aggregation (written by the
    /// resolver), and per destination: (id, aggregation, end of its group key).
    group_keys: Vec<u8>,
    dests: Vec<(u32, u16, usize)>,
    last_group: LastGroup,
}

impl NewSeriesBuffers {
    /// Forgets the group last resolved: its id may be given to another group
    /// (reclaimed), or the plan changed.
    pub(super) fn forget_groups(&mut self) {
        self.last_group.dest = None;
    }
}

/// The group a new series was last resolved to (its aggregation, group key
/// and destination). A sender sends a group's series together, so most new
/// series are of the group the one before was, and find it here without the
/// shared group table's lock, which lanes contend for.
#[derive(Default)]
struct LastGroup {
    agg: u16,
    key: Vec<u8>,
    dest: Option<u32>,
}

impl LastGroup {
    fn dest(&self, agg: u16, key: &[u8]) -> Option<u32> {
        self.dest.filter(|_| self.agg == agg && self.key == key)
    }

    fn set(&mut self, agg: u16, key: &[u8], dest: u32) {
        self.agg = agg;
        self.key.clear();
        self.key.extend_from_slice(key);
        self.dest = Some(dest);
    }
}

impl<'l> NewSeries<'l> {
    /// Validates `labels`, writes their aggregations into `out` (its series
    /// key, group keys and destinations emptied for the caller).
    pub(super) fn canonicalize(
        labels: &'l [(&'l [u8], &'l [u8])],
        plan: &Plan,
        out: &mut NewSeriesBuffers,
    ) -> Result<NewSeries<'l>, IngestError> {
        validate_ascii_first(labels)?;
        let value_of = |name: &[u8]| label_value(labels, name);
        let metric = value_of(b"__name__");
        if metric.is_empty() {
            return Err(invalid("a series has no `__name__` label"));
        }
        out.aggs.clear();
        out.aggs.extend(
            plan.aggregations
                .iter()
                .enumerate()
                .filter(|(_, a)| {
                    a.metric.as_bytes() == metric
                        && a.matchers
                            .iter()
                            .all(|(k, v)| value_of(k.as_bytes()) == v.as_bytes())
                })
                .map(|(i, _)| i as u16),
        );
        out.series_key.clear();
        out.group_keys.clear();
        out.dests.clear();
        Ok(NewSeries { labels })
    }

    /// The series key, `name{k="v",…}` (values escaped, labels sorted), onto `out`.
    pub(super) fn write_series_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(label_value(self.labels, b"__name__"));
        out.push(b'{');
        let pairs = self.labels.iter().filter(|(n, _)| *n != b"__name__");
        for (i, (name, value)) in pairs.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(name);
            out.extend_from_slice(b"=\"");
            write_escaped(out, value, Escape::LabelValue);
            out.push(b'"');
        }
        out.push(b'}');
    }

    /// The group key for one aggregation (see [`write_group_key`]), onto `out`.
    pub(super) fn write_group_key(&self, group_by: &[String], out: &mut Vec<u8>) {
        write_group_key(
            out,
            group_by
                .iter()
                .map(|g| label_value(self.labels, g.as_bytes())),
        );
    }
}

/// The value of label `name` in validated labels, empty when absent (an
/// empty value and no label are the same series to Prometheus).
fn label_value<'l>(labels: &[(&'l [u8], &'l [u8])], name: &[u8]) -> &'l [u8] {
    labels
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(&b""[..], |(_, v)| *v)
}

fn escape_value(v: &str) -> String {
    let mut out = Vec::with_capacity(v.len());
    write_escaped(&mut out, v.as_bytes(), Escape::LabelValue);
    String::from_utf8(out).expect("escaping keeps UTF-8")
}

/// Parses `name{k="v",…}` back into a map (with `__name__`), unescaping values.
pub(super) fn parse_series_key(key: &str) -> HashMap<String, String> {
    let mut map = HashMap::new();
    let (name, rest) = key.split_once('{').unwrap_or((key, "}"));
    map.insert("__name__".to_string(), name.to_string());
    let mut chars = rest.chars().peekable();
    loop {
        let label: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if label.is_empty() || label == "}" {
            break;
        }
        chars.next(); // opening quote
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        map.insert(label, value);
        if chars.next() != Some(',') {
            break;
        }
    }
    map
}

/// The group key (see [`write_group_key`]) from a label map, as a new `String`.
pub(super) fn group_key_of(labels: &HashMap<String, String>, group_by: &[String]) -> String {
    let mut out = Vec::new();
    write_group_key(
        &mut out,
        group_by
            .iter()
            .map(|g| labels.get(g).map_or(&b""[..], |v| v.as_bytes())),
    );
    String::from_utf8(out).expect("group keys of UTF-8 values are UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_keys_round_trip() {
        let labels: [(&[u8], &[u8]); 3] =
            [(b"__name__", b"m"), (b"a", b"x\"y\\z\n,}"), (b"b", b"")];
        let s = BaselineSeries::canonicalize(&labels, &Plan::default()).unwrap();
        assert_eq!(s.series_key, "m{a=\"x\\\"y\\\\z\\n,}\",b=\"\"}");
        let map = parse_series_key(&s.series_key);
        assert_eq!(map["a"], "x\"y\\z\n,}");
        assert_eq!(map["b"], "");
        assert_eq!(map["__name__"], "m");
        assert_eq!(s.population, r#"{"__name__":"m","a":"x\"y\\z\n,}","b":""}"#);
    }

    #[test]
    fn validation() {
        let plan = Plan::default();
        let check =
            |labels: &[(&[u8], &[u8])]| BaselineSeries::canonicalize(labels, &plan).map(|_| ());
        assert!(check(&[(b"__name__", b"m")]).is_ok());
        assert!(check(&[]).is_err());
        assert!(check(&[(b"a", b"1")]).is_err());
        assert!(check(&[(b"__name__", b"m"), (b"a", b"1"), (b"a", b"2")])
            .unwrap_err()
            .to_string()
            .contains("duplicate"));
        assert!(check(&[(b"__name__", b"m"), (b"b", b"1"), (b"a", b"2")])
            .unwrap_err()
            .to_string()
            .contains("sorted"));
        assert!(check(&[(b"__name__", b"m"), (b"a-b", b"1")]).is_err());
        assert!(check(&[(b"__name__", b"m"), (b"a", b"\xff")]).is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// The one-pass check gives `validate`'s answer (its message
        /// included) for any labels: names and values from a small alphabet
        /// of valid, invalid and non-ASCII bytes, in any order.
        #[test]
        fn the_ascii_first_check_is_validate(
            labels in proptest::collection::vec(
                (
                    proptest::collection::vec(proptest::sample::select(b"_aZ09-\xc3\xa9\xff".to_vec()), 0..4),
                    proptest::collection::vec(proptest::sample::select(b"a\"\n\xc3\xa9\xff\x80".to_vec()), 0..4),
                ),
                0..5,
            ),
        ) {
            let labels: Vec<(&[u8], &[u8])> =
                labels.iter().map(|(n, v)| (n.as_slice(), v.as_slice())).collect();
            proptest::prop_assert_eq!(validate_ascii_first(&labels), validate(&labels));
        }
    }

    /// The cache's canonicalizer gives the baseline's series key,
    /// aggregations, group keys and errors (messages included), whatever
    /// the labels: escapes, empty values, matchers, group labels missing,
    /// every kind of invalid series.
    #[test]
    fn new_series_are_canonicalized_as_the_baseline_does() {
        let plan = Plan::parse(
            "[[aggregation]]\nid = \"a\"\nmetric = \"m\"\ngroup_by = [\"g\", \"__name__\", \"missing\"]\n\
             [[aggregation]]\nid = \"b\"\nmetric = \"m\"\ngroup_by = [\"g\"]\nmatch = { k = \"v\" }\n\
             [[aggregation]]\nid = \"c\"\nmetric = \"m\"\ngroup_by = [\"g\"]\nmatch = { k = \"\" }\n",
        )
        .unwrap();
        type Labels<'a> = Vec<(&'a [u8], &'a [u8])>;
        let cases: Vec<Labels<'_>> = vec![
            vec![(b"__name__", b"m"), (b"g", b"x\"y\\z\n,}"), (b"k", b"v")],
            vec![(b"__name__", b"m"), (b"g", b""), (b"k", b"")],
            vec![(b"__name__", b"m")],
            vec![(b"__name__", b"other"), (b"g", b"1")],
            vec![(b"__name__", b"")],
            vec![],
            vec![(b"a", b"1")],
            vec![(b"__name__", b"m"), (b"a", b"1"), (b"a", b"2")],
            vec![(b"__name__", b"m"), (b"b", b"1"), (b"a", b"2")],
            vec![(b"__name__", b"m"), (b"a-b", b"1")],
            vec![(b"__name__", b"m"), (b"a", b"\xff")],
            vec![(b"__name__", b"m"), (b"\xff", b"1")],
        ];
        for labels in &cases {
            let baseline = BaselineSeries::canonicalize(labels, &plan);
            let mut out = NewSeriesBuffers::default();
            let new = NewSeries::canonicalize(labels, &plan, &mut out);
            match (baseline, new) {
                (Ok(b), Ok(n)) => {
                    n.write_series_key(&mut out.series_key);
                    assert_eq!(out.series_key, b.series_key.as_bytes(), "{labels:?}");
                    assert_eq!(out.aggs, b.aggs, "{labels:?}");
                    for agg in &plan.aggregations {
                        let mut key = Vec::new();
                        n.write_group_key(&agg.group_by, &mut key);
                        assert_eq!(key, b.group_key(&agg.group_by).as_bytes());
                    }
                }
                (Err(b), Err(n)) => assert_eq!(b, n, "{labels:?}"),
                (b, n) => panic!(
                    "{labels:?}: baseline {:?}, cache {:?}",
                    b.is_ok(),
                    n.is_ok()
                ),
            }
        }
    }
}
