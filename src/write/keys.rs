//! Keys: the seam of \`key-cache\`.

use super::*;

// ---------------------------------------------------------------------------
// Keys: the seam of `key-cache`.

/// The label that a metric type adds to every key (`le`, `quantile`), with its value.
pub(super) type Extra<'a> = Option<(&'static str, &'a str)>;

/// The labels a store key has beyond the caller's.
#[derive(Clone, Copy)]
pub(super) struct Added<'a> {
    /// The metric type's (`le`, `quantile`).
    pub(super) extra: Extra<'a>,
    /// The metric's name, in [`Layout::PerProcess`].
    pub(super) metric: Option<&'a str>,
    /// The process's, in `all` mode.
    pub(super) pid: Option<u32>,
}

/// Sorts `labels` and the `added` ones by name, as Ruby's `labels.to_a.sort`
/// does, and form-encodes them.
pub(super) fn encode_key(labels: &[(&str, &str)], added: Added<'_>, dialect: Dialect) -> Vec<u8> {
    probe!("write.key_encoded");
    let Added { extra, metric, pid } = added;
    let pid_text = pid.map(|p| p.to_string());
    let mut pairs: Vec<(&[u8], &[u8])> = labels
        .iter()
        .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
        .collect();
    if let Some((k, v)) = extra {
        pairs.push((k.as_bytes(), v.as_bytes()));
    }
    if let Some(name) = metric {
        pairs.push((storefile::METRIC_NAME_LABEL, name.as_bytes()));
    }
    if let Some(p) = &pid_text {
        pairs.push((b"pid", p.as_bytes()));
    }
    pairs.sort_unstable();
    let mut key = Vec::with_capacity(64);
    formenc::encode_key(&mut key, pairs, dialect);
    key
}

/// The series of one label set, numbered: a counter or gauge has one; a
/// histogram one per bucket, then `+Inf`, then `sum`; a summary `count`, `sum`.
pub(super) fn series_count(def: &MetricDef) -> usize {
    match def.kind {
        MetricType::Counter | MetricType::Gauge => 1,
        MetricType::Histogram => def.buckets.len() + 2,
        MetricType::Summary => 2,
    }
}

/// The extra label of series `series` (see [`series_count`]).
pub(super) fn series_extra(def: &MetricDef, series: usize) -> Extra<'_> {
    match def.kind {
        MetricType::Counter | MetricType::Gauge => None,
        MetricType::Histogram => Some((
            "le",
            match def.buckets.get(series) {
                Some(bound) => bound,
                None if series == def.buckets.len() => "+Inf",
                None => "sum",
            },
        )),
        MetricType::Summary => Some(("quantile", ["count", "sum"][series])),
    }
}

/// This process's label sets, each with the store keys of its series,
/// encoded on first use. It lives beside the store file in the per-process
/// state, so it is dropped with the file when a forked child reopens its own.
#[derive(Default)]
pub(super) struct KeyCache {
    /// (hash of the caller's labels, place in `sets`).
    pub(super) index: hashbrown::HashTable<(u64, usize)>,
    pub(super) sets: Vec<CachedLabelSet>,
    pub(super) hasher: foldhash::fast::RandomState,
    /// The place of the label set found last: a caller mostly repeats its
    /// label set, and comparing it costs a third of hashing it (a 195-byte value).
    pub(super) last: Option<usize>,
}

pub(super) struct CachedLabelSet {
    pub(super) labels: Vec<(Box<str>, Box<str>)>,
    /// By series number.
    pub(super) series: Vec<Option<CachedKey>>,
}

/// One series' key and, once looked up, the offset of its value in this
/// process's file: entries are only ever appended, never moved, so the offset
/// holds for as long as the file (and this cache with it) is open.
pub(super) struct CachedKey {
    pub(super) bytes: Box<[u8]>,
    pub(super) position: Option<usize>,
}

impl KeyCache {
    /// The place of `labels` among the cached label sets; a new one (of
    /// `series` series) is added when `validate` accepts the labels.
    pub(super) fn label_set(
        &mut self,
        labels: &[(&str, &str)],
        series: usize,
        validate: impl FnOnce() -> Result<()>,
    ) -> Result<usize> {
        if let Some(i) = self.last_if_same(labels) {
            return Ok(i);
        }
        let hash = self.hasher.hash_one(labels);
        let sets = &self.sets;
        let same = |&(h, i): &(u64, usize)| h == hash && same_labels(&sets[i].labels, labels);
        if let Some(&(_, i)) = self.index.find(hash, same) {
            self.last = Some(i);
            return Ok(i);
        }
        validate()?;
        let i = self.sets.len();
        self.sets.push(CachedLabelSet {
            labels: labels
                .iter()
                .map(|(k, v)| (Box::from(*k), Box::from(*v)))
                .collect(),
            series: (0..series).map(|_| None).collect(),
        });
        self.index.insert_unique(hash, (hash, i), |&(h, _)| h);
        self.last = Some(i);
        Ok(i)
    }
}

impl KeyCache {
    /// The place of the label set found last, if `labels` is it.
    #[inline]
    pub(super) fn last_if_same(&self, labels: &[(&str, &str)]) -> Option<usize> {
        let i = self.last?;
        same_labels(&self.sets[i].labels, labels).then_some(i)
    }
}

/// Whether a cached label set is the caller's, pair by pair.
pub(super) fn same_labels(cached: &[(Box<str>, Box<str>)], labels: &[(&str, &str)]) -> bool {
    cached.len() == labels.len()
        && cached
            .iter()
            .zip(labels)
            .all(|((k, v), (k2, v2))| &**k == *k2 && &**v == *v2)
}

/// A series' store key as the key seam hands it out.
pub(super) enum Key<'a> {
    /// Encoded for this call (the baseline).
    Encoded(Vec<u8>),
    /// This process's cached key (`key-cache`).
    Cached(&'a mut CachedKey),
}

impl Key<'_> {
    /// One lookup of the key's value offset in `file`, appending a zero entry
    /// when the key is new: by its bytes in the file's index, or, for a cached
    /// key that was looked up before, the offset it remembers.
    pub(super) fn position(&mut self, file: &mut StoreFile) -> Result<usize> {
        probe!("write.lookup");
        match self {
            Key::Encoded(bytes) => file.position(bytes),
            Key::Cached(key) => match key.position {
                Some(pos) => Ok(pos),
                None => {
                    let pos = file.position(&key.bytes)?;
                    key.position = Some(pos);
                    Ok(pos)
                }
            },
        }
    }
}
