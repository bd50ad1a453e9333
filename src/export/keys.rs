//! Decoded label sets: raw keys decoded once per file or per export, and the
//! catalogue a long-lived exporter keeps across scrapes.

use super::*;

/// One decoded label set.
pub(super) struct Series {
    pub(super) labels: DecodedLabels,
    /// The group label's value, if the set has it (the last one, if repeated).
    pub(super) slot: Option<Box<[u8]>>,
}

/// Where a series sits, found once when it is met: what a scrape reads of a
/// series to group and fold it. These sit in a vector of their own (four to a
/// cache line) rather than in [`Series`], whose decoded labels a scrape never
/// reads: a cold scrape read a cache line per series for these two fields.
#[derive(Clone, Copy)]
pub(super) struct SeriesPlace {
    /// Its group: the label set without the metric's group label (`le` for a
    /// histogram, `quantile` for a summary; none for counters and gauges, whose
    /// groups are their series).
    pub(super) group: usize,
    /// What its group label's value makes it in its group (a scrape reads
    /// this, not the label value: an allocation of its own per series).
    pub(super) role: SlotRole,
}

/// A series' place in its group, by its group label's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotRole {
    /// A histogram's declared bucket (its index).
    Bucket(u32),
    /// `le="sum"` / `quantile="sum"`.
    Sum,
    /// A summary's `quantile="count"`.
    Count,
    /// A histogram's `le="+Inf"`.
    Inf,
    /// Anything else (a histogram's undeclared `le`, a counter's series).
    Other,
}

impl SlotRole {
    pub(super) fn of(def: &MetricDef, slot: Option<&[u8]>) -> SlotRole {
        match (def.kind, slot) {
            // `le="sum"` is the sum whatever the buckets say.
            (MetricType::Histogram | MetricType::Summary, Some(b"sum")) => SlotRole::Sum,
            (MetricType::Summary, Some(b"count")) => SlotRole::Count,
            (MetricType::Histogram, Some(le)) => {
                match def.buckets.iter().position(|b| b.as_bytes() == le) {
                    Some(i) => SlotRole::Bucket(i as u32),
                    None if le == b"+Inf" => SlotRole::Inf,
                    None => SlotRole::Other,
                }
            }
            _ => SlotRole::Other,
        }
    }
}

impl Series {
    /// A histogram series' bucket: Ruby's `label_set[:le].to_s`, so a
    /// missing `le` is the bucket "".
    pub(super) fn le(&self) -> &[u8] {
        self.slot.as_deref().unwrap_or_default()
    }
}

/// `decode-once`: each distinct raw key, decoded once, with its series.
#[derive(Default)]
pub(super) struct RawKeys {
    /// Every raw key as first found, padding included, back to back in the
    /// order met: a scrape compares against them in about that order, so the
    /// comparisons read two sequential streams.
    pub(super) bytes: Vec<u8>,
    /// Per raw key: where its padded bytes start in `bytes`, their length,
    /// its length without padding, and its series.
    pub(super) spans: Vec<RawKey>,
    pub(super) index: hashbrown::HashTable<usize>,
    /// Raw-key ids by entry ordinal, per file as of its last read, and in the
    /// file being read. The key at an ordinal is usually the one a hint says
    /// (one comparison of padded bytes finds it, without hashing hundreds of
    /// bytes): a file read before only grows, its entries never move; a file
    /// not read before is hinted by the one read just before it, as processes
    /// running the same code often write the same keys in the same order.
    /// Hints are only guesses: every key is compared in full.
    pub(super) files: Vec<FileKeys>,
    /// The file read last in this scrape.
    pub(super) last_read: Option<u32>,
    pub(super) hint: Vec<usize>,
    pub(super) this_file: Vec<usize>,
    pub(super) this_starts: Vec<u32>,
}

/// One file's raw keys as of its last read.
#[derive(Default)]
pub(super) struct FileKeys {
    /// Raw-key ids by entry ordinal.
    pub(super) ids: Vec<usize>,
    /// Where each entry starts (its length field), ordinal for ordinal.
    pub(super) starts: Vec<u32>,
    /// Where the last entry ends, if the file was read whole with no entry
    /// skipped: with `ids` and `starts`, what [`FilePass::replay`] checks the
    /// file against.
    pub(super) end: Option<u32>,
}

pub(super) struct RawKey {
    pub(super) start: usize,
    pub(super) padded_len: usize,
    pub(super) key_len: usize,
    pub(super) series: usize,
}

/// foldhash is markedly faster than ahash's portable fallback on keys of
/// hundreds of bytes.
pub(super) fn hash_raw_key(key: &[u8]) -> u64 {
    use std::hash::BuildHasher as _;
    foldhash::fast::FixedState::with_seed(0x5eed).hash_one(key)
}

impl RawKeys {
    pub(super) fn start_file(&mut self, slot: u32) {
        let slot = slot as usize;
        if self.files.len() <= slot {
            self.files.resize_with(slot + 1, FileKeys::default);
        }
        // The file's own list of the last read is its hint, and its buffers
        // take this read's ids and starts: a warm scrape moves lists, not copies.
        let file = &mut self.files[slot];
        let own = std::mem::take(&mut file.ids);
        self.this_starts = std::mem::take(&mut file.starts);
        self.this_starts.clear();
        file.end = None;
        let spare = if own.is_empty() {
            // Not read before (or empty): hinted by the file read just before.
            let mut hint = std::mem::take(&mut self.this_file);
            hint.clear();
            if let Some(last) = self.last_read {
                hint.extend_from_slice(&self.files[last as usize].ids);
            }
            std::mem::replace(&mut self.hint, hint)
        } else {
            std::mem::replace(&mut self.hint, own)
        };
        self.this_file = spare;
        self.this_file.clear();
    }

    /// The file at `slot` was read whole; `replayable` if its layout is one
    /// a scrape may replay (no entry skipped, every key found here).
    pub(super) fn end_file(&mut self, slot: u32, replayable: bool) {
        let end = match (self.this_file.last(), self.this_starts.last()) {
            (Some(&id), Some(&start)) => start as usize + 4 + self.spans[id].padded_len + 16,
            _ => HEADER_SIZE,
        };
        self.files[slot as usize] = FileKeys {
            ids: std::mem::take(&mut self.this_file),
            starts: std::mem::take(&mut self.this_starts),
            end: replayable.then(|| u32::try_from(end).ok()).flatten(),
        };
        self.last_read = Some(slot);
    }

    /// A file's slot was released: its hints and layout go.
    pub(super) fn forget(&mut self, slot: u32) {
        if let Some(file) = self.files.get_mut(slot as usize) {
            *file = FileKeys::default();
        }
    }

    /// The layout of the file at `slot` as last read, if replayable.
    pub(super) fn layout(&self, slot: u32) -> Option<&FileKeys> {
        self.files
            .get(slot as usize)
            .filter(|file| file.end.is_some())
    }

    /// Records that entry's key as the raw key `id`, met at the next ordinal.
    #[inline]
    pub(super) fn met(&mut self, id: usize, entry: &Entry<'_>) {
        self.this_file.push(id);
        self.this_starts.push(entry.offset() as u32);
    }

    pub(super) fn end_scrape(&mut self) {
        self.last_read = None;
    }

    pub(super) fn padded(&self, id: usize) -> &[u8] {
        let span = &self.spans[id];
        &self.bytes[span.start..span.start + span.padded_len]
    }

    pub(super) fn key(&self, id: usize) -> &[u8] {
        &self.padded(id)[..self.spans[id].key_len]
    }

    /// The series of the entry's key, if the hint for its ordinal is its
    /// padded key (one comparison, without finding where the key ends).
    #[inline]
    pub(super) fn find_hinted(&mut self, entry: &Entry<'_>) -> Option<usize> {
        let id = *self.hint.get(self.this_file.len())?;
        if self.padded(id) != entry.padded_key {
            return None;
        }
        self.met(id, entry);
        Some(self.spans[id].series)
    }

    /// The series of the entry's raw key `key` (unpadded), if met before.
    pub(super) fn find(&mut self, entry: &Entry<'_>, key: &[u8]) -> Option<usize> {
        let id = *self
            .index
            .find(hash_raw_key(key), |&id| self.key(id) == key)?;
        self.met(id, entry);
        Some(self.spans[id].series)
    }

    /// Records a raw key not met before (after [`RawKeys::find`] said so).
    pub(super) fn insert(&mut self, entry: &Entry<'_>, key: &[u8], series: usize) {
        let id = self.spans.len();
        self.spans.push(RawKey {
            start: self.bytes.len(),
            padded_len: entry.padded_key.len(),
            key_len: key.len(),
            series,
        });
        self.bytes.extend_from_slice(entry.padded_key);
        let (bytes, spans) = (&self.bytes, &self.spans);
        self.index.insert_unique(hash_raw_key(key), id, |&id| {
            let span = &spans[id];
            hash_raw_key(&bytes[span.start..span.start + span.key_len])
        });
        self.met(id, entry);
    }
}

/// Every label set of one metric met so far, decoded once and grouped. A
/// one-shot export fills it once; with `prerender`, a long-lived exporter
/// keeps it across scrapes, so a scrape of known keys decodes and escapes
/// nothing.
pub(super) struct Catalogue {
    /// The metric's group label (`le`, `quantile`), if it has one.
    pub(super) group_label: Option<&'static [u8]>,
    pub(super) series: Vec<Series>,
    /// Per series, its group and role (beside `series`, index for index).
    pub(super) places: Vec<SeriesPlace>,
    pub(super) by_hash: AHashMap<u64, Vec<usize>>,
    pub(super) groups: Vec<Group>,
    /// `prerender`: every group's rendered text, in the order met.
    pub(super) rendered: RenderedText,
    /// Group label sets → group; borrowed from `groups` only by hash, so the
    /// map holds indices.
    pub(super) group_by_hash: AHashMap<u64, Vec<usize>>,
    pub(super) raw: RawKeys,
    /// `decode-once`: raw component → decoded, for raw keys not seen before.
    pub(super) components: formenc::ComponentCache,
    pub(super) hasher: ahash::RandomState,
    pub(super) decode: KeyDecode,
    pub(super) keep: Keep,
}

impl Catalogue {
    pub(super) fn new(def: &MetricDef, seams: ExportSeams) -> Self {
        let kind = def.kind;
        Catalogue {
            group_label: match kind {
                MetricType::Histogram => Some(b"le"),
                MetricType::Summary => Some(b"quantile"),
                MetricType::Counter | MetricType::Gauge => None,
            },
            series: Vec::new(),
            places: Vec::new(),
            by_hash: AHashMap::new(),
            groups: Vec::new(),
            rendered: RenderedText::new(match seams.keep {
                Keep::Nothing => None,
                Keep::Catalogue => Some(render::rendered_header(def)),
            }),
            group_by_hash: AHashMap::new(),
            raw: RawKeys::default(),
            components: formenc::ComponentCache::default(),
            hasher: ahash::RandomState::with_seeds(1, 2, 3, 4),
            decode: seams.key_decode,
            keep: seams.keep,
        }
    }

    /// The series of an entry's key (a key of `def`'s files).
    pub(super) fn lookup(&mut self, entry: &Entry<'_>, def: &MetricDef) -> Result<usize, BadEntry> {
        match self.decode {
            KeyDecode::EveryEntry(unescape) => {
                probe!("export.key_decoded");
                let raw = checked_key(entry)?;
                self.find_or_insert(raw, unescape.decode_key(raw), def)
            }
            KeyDecode::OncePerRawKey(unescape) => {
                if let Some(series) = self.raw.find_hinted(entry) {
                    return Ok(series);
                }
                let raw = checked_key(entry)?;
                if let Some(series) = self.raw.find(entry, raw) {
                    return Ok(series);
                }
                probe!("export.key_decoded");
                let decoded = formenc::decode_key_cached(raw, unescape, &mut self.components);
                let series = self.find_or_insert(raw, decoded, def)?;
                self.raw.insert(entry, raw, series);
                Ok(series)
            }
        }
    }

    /// Finds the series of `raw`, decoded, adding it (and its group) if new.
    pub(super) fn find_or_insert(
        &mut self,
        raw: &[u8],
        decoded: Result<Vec<formenc::Label<'_>>, formenc::KeyError>,
        def: &MetricDef,
    ) -> Result<usize, BadEntry> {
        let decoded = decoded.map_err(|e| BadEntry::new(EntrySkip::BadKey, raw, e))?;
        let hash = self.hash(decoded.iter().map(|(n, v)| (&**n, &**v)));
        if let Some(candidates) = self.by_hash.get(&hash) {
            for &index in candidates {
                let pairs = decoded.iter().map(|(n, v)| (&**n, &**v));
                if same_labels(&self.series[index].labels, pairs) {
                    return Ok(index);
                }
            }
        }
        // Checked once per new label set: Prometheus rejects a whole
        // exposition for one bad label.
        for (name, value) in &decoded {
            if let Some((reason, why)) = label_fault(name, value) {
                let name = String::from_utf8_lossy(name);
                return Err(BadEntry::new(reason, raw, format!("label {name:?}: {why}")));
            }
        }
        let labels: DecodedLabels = decoded
            .into_iter()
            .map(|(n, v)| (n.into_owned().into(), v.into_owned().into()))
            .collect();
        let (group, slot) = self.group_of(&labels, def);
        let role = SlotRole::of(def, slot.as_deref());
        let index = self.series.len();
        self.series.push(Series { labels, slot });
        self.places.push(SeriesPlace { group, role });
        self.by_hash.entry(hash).or_default().push(index);
        Ok(index)
    }

    /// The group of a new series, added if new, and the series' group label value.
    pub(super) fn group_of(
        &mut self,
        labels: &DecodedLabels,
        def: &MetricDef,
    ) -> (usize, Option<Box<[u8]>>) {
        let mut slot = None;
        let mut base: Vec<(&[u8], &[u8])> = Vec::with_capacity(labels.len());
        for (n, v) in labels {
            if Some(&**n) == self.group_label {
                slot = Some(&**v);
            } else {
                base.push((n, v));
            }
        }
        let hash = self.hash(base.iter().copied());
        let found = self.group_by_hash.get(&hash).and_then(|candidates| {
            candidates
                .iter()
                .copied()
                .find(|&g| same_labels(&self.groups[g].labels, base.iter().copied()))
        });
        let group = found.unwrap_or_else(|| {
            probe!("export.group_created");
            let rendered = match self.keep {
                Keep::Nothing => None,
                Keep::Catalogue => Some(render::rendered_lines(
                    &mut self.rendered,
                    def,
                    base.iter().copied(),
                )),
            };
            self.groups.push(Group {
                labels: base
                    .iter()
                    .map(|(n, v)| (Box::from(*n), Box::from(*v)))
                    .collect(),
                rendered,
            });
            let g = self.groups.len() - 1;
            self.group_by_hash.entry(hash).or_default().push(g);
            g
        });
        (group, slot.map(Box::from))
    }

    pub(super) fn hash<'a>(&self, labels: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> u64 {
        let mut h = self.hasher.build_hasher();
        for (name, value) in labels {
            name.hash(&mut h);
            value.hash(&mut h);
        }
        h.finish()
    }
}

/// Why a decoded label would make Prometheus refuse the exposition, if it
/// would: its name is not a Prometheus label name, or a reserved one (`__`
/// and on: `__name__` would name the series twice), or its value is not UTF-8.
pub(super) fn label_fault(name: &[u8], value: &[u8]) -> Option<(EntrySkip, &'static str)> {
    if !is_label_name(name) {
        Some((EntrySkip::InvalidLabelName, "not a Prometheus label name"))
    } else if name.starts_with(b"__") {
        Some((
            EntrySkip::ReservedLabelName,
            "names starting with __ are reserved",
        ))
    } else if std::str::from_utf8(value).is_err() {
        Some((EntrySkip::InvalidLabelValue, "the value is not UTF-8"))
    } else {
        None
    }
}

/// The entry's key, unpadded, if padded as client_ruby pads
/// ([`Entry::key_checked`]).
pub(super) fn checked_key<'a>(entry: &Entry<'a>) -> Result<&'a [u8], BadEntry> {
    entry.key_checked().ok_or_else(|| {
        let padded = entry.padded_key;
        BadEntry::new(
            EntrySkip::BadKey,
            &padded[..padded.len().min(80)],
            "padded with more than the eight spaces client_ruby writes",
        )
    })
}

/// An entry left out of a scrape, and why (for the log).
pub(super) struct BadEntry {
    pub(super) reason: EntrySkip,
    pub(super) detail: String,
}

impl BadEntry {
    pub(super) fn new(reason: EntrySkip, raw: &[u8], why: impl std::fmt::Display) -> BadEntry {
        // The log gets the start of the key; responses never get it.
        let shown = &raw[..raw.len().min(80)];
        let more = if raw.len() > shown.len() { "…" } else { "" };
        BadEntry {
            reason,
            detail: format!("key {:?}{more}: {why}", String::from_utf8_lossy(shown)),
        }
    }
}

/// Whether `stored` holds exactly these pairs, in this order.
pub(super) fn same_labels<'a>(
    stored: &DecodedLabels,
    pairs: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])>,
) -> bool {
    stored.len() == pairs.len()
        && stored
            .iter()
            .zip(pairs)
            .all(|((n, v), (n2, v2))| **n == *n2 && **v == *v2)
}
