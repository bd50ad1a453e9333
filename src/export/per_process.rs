//! The one-file-per-process layout: client_ruby's `poc_file_per_process`
//! branch (unmerged) writes every metric of a process into one file,
//! `metrics___<pid>.bin`, in the usual store file format, each key carrying
//! its metric's name as one more label, `___metric_name`, sorted in among
//! the others. Its exporter globs `metrics___*`, reads each file once in
//! sorted order, groups the entries by that label and prints the registered
//! metrics as client_ruby always does (series in order of first appearance,
//! values aggregated in file order).
//!
//! [`PerProcess`] reads a store so once the exporter has met such a file
//! ([`FileSet::process_files_seen`](crate::export::fileset::FileSet)): every
//! file once per scrape, each entry staged under its metric (the label taken
//! out of its key) and folded into that metric's scrape once the whole file
//! was read, exactly as a metric's own files are. A store holding both
//! layouts (a rolling deploy from a release to the branch, or back) is read
//! whole: each metric gets its own files and the per-process files, in
//! sorted name order, which puts every `metric_…` file before every
//! `metrics___…` one; a reader of one layout alone would silently miss the
//! other's processes.
//!
//! Of the seams, the file read (`single-read` maps; its kept mappings are
//! not kept here: the branch's files change with every metric a process
//! writes), the key decode (`decode-once`, `fast-unescape`) and what is kept
//! (`prerender`'s catalogue and rendered prefixes) apply; listing is once
//! per scrape, and every file is read under its `flock` (`fold-exited`'s
//! unlocked reads of exited processes' files are for the per-metric layout;
//! its fold folds both, and a scrape here leaves out the sources of a fold
//! batch committed and not finished, as every scrape does).
//! Bad input is left out as it is there, plus two reasons of its own: an
//! entry with no `___metric_name` label, and one naming a metric the
//! registry does not have (the branch's exporter ignores both).

use super::*;
use crate::format::storefile::METRIC_NAME_LABEL;
use std::borrow::Cow;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// What an exporter reading the one-file-per-process layout keeps.
pub(super) struct PerProcess {
    /// Registered metric names → registry index.
    names: AHashMap<Box<[u8]>, usize>,
    /// `decode-once`: per metric, each key (its metric's label taken out) →
    /// its series; dropped with the metric's catalogue.
    raw: Vec<AHashMap<Box<[u8]>, u32>>,
    /// Entries of files read but not folded yet: (metric, series, value and
    /// timestamp as stored).
    staged: Vec<(u32, u32, [u8; 16])>,
    /// The baseline's key buffer.
    key: Vec<u8>,
}

/// One file of a scrape: its name, and its metric (a per-metric file) or
/// `None` (a per-process file).
type FileToRead = (Box<[u8]>, Option<usize>);

/// Where an entry goes: the parts of the exporter staging needs.
struct Sink<'a> {
    names: &'a AHashMap<Box<[u8]>, usize>,
    raw: &'a mut [AHashMap<Box<[u8]>, u32>],
    staged: &'a mut Vec<(u32, u32, [u8; 16])>,
    metrics: &'a mut [MetricState],
    registry: &'a Registry,
    decode: KeyDecode,
}

impl PerProcess {
    pub(super) fn new(registry: &Registry) -> PerProcess {
        PerProcess {
            names: registry
                .metrics
                .iter()
                .enumerate()
                .map(|(i, m)| (m.name.as_bytes().into(), i))
                .collect(),
            raw: vec![AHashMap::new(); registry.metrics.len()],
            staged: Vec::new(),
            key: Vec::new(),
        }
    }

    /// One scrape of every metric; with `out`, the exposition written into it.
    pub(super) fn scrape(
        &mut self,
        ex: &mut Exporter,
        deadline: Instant,
        mut out: Option<&mut Vec<u8>>,
    ) -> Result<()> {
        let _fold_lock = ex.files.lock_for_scrape()?;
        for (i, state) in ex.metrics.iter_mut().enumerate() {
            let live = state.scrape.series_order.len();
            let afresh = match ex.seams.keep {
                Keep::Nothing => true,
                Keep::Catalogue => {
                    state.catalogue.series.len() > CATALOGUE_SLACK * live.max(ex.catalogue_floor)
                }
            };
            if afresh {
                state.catalogue = Catalogue::new(&ex.registry.metrics[i], ex.seams);
                state.scrape = Scrape::default();
                self.raw[i].clear();
            }
            state.scrape.start();
        }
        let files = files_to_read(&ex.files, ex.registry.metrics.len());
        let mut set_aside: Vec<usize> = Vec::new();
        let mut waiting: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        for (i, file) in files.iter().enumerate() {
            match self.read(ex, file, LOCK_WAIT, deadline) {
                Ok(range) if set_aside.is_empty() => {
                    fold_staged(&mut ex.metrics, &ex.registry, &self.staged[range]);
                    self.staged.clear();
                }
                Ok(range) => waiting.push((i, range)),
                Err(failure) if failure.reason == FileSkip::Locked => set_aside.push(i),
                Err(failure) => skip(ex, &files[i].0, failure),
            }
        }
        for i in set_aside {
            match self.read(ex, &files[i], LOCK_RETRY_WAIT, deadline) {
                Ok(range) => waiting.push((i, range)),
                Err(failure) => skip(ex, &files[i].0, failure),
            }
        }
        waiting.sort_by_key(|(i, _)| *i);
        for (_, range) in waiting {
            fold_staged(&mut ex.metrics, &ex.registry, &self.staged[range]);
        }
        self.staged.clear();
        for (def, state) in ex.registry.metrics.iter().zip(&mut ex.metrics) {
            state.scrape.group(&state.catalogue);
            if def.kind == MetricType::Histogram {
                state
                    .scrape
                    .fold_histograms(def.buckets.len(), &state.catalogue);
            }
            if let Some(out) = out.as_deref_mut() {
                let values = metric_values(def, &state.catalogue, &state.scrape, &mut ex.values);
                render::write_family(out, def, &values, &state.catalogue.rendered);
                ex.values.keep(values);
            }
        }
        Ok(())
    }

    /// Reads one file into the staging area (a corrupt one gets a second
    /// try) and returns where its entries are staged.
    fn read(
        &mut self,
        ex: &mut Exporter,
        file: &FileToRead,
        wait: Duration,
        deadline: Instant,
    ) -> FileResult<std::ops::Range<usize>> {
        if Instant::now() >= deadline {
            return Err(FileFailure::new(
                FileSkip::Deadline,
                anyhow!("the scrape's time budget ran out"),
            ));
        }
        let mut tries = 0;
        loop {
            tries += 1;
            match self.read_once(ex, file, wait, deadline) {
                Err(failure) if failure.reason == FileSkip::Corrupt && tries < 2 => continue,
                result => return result,
            }
        }
    }

    fn read_once(
        &mut self,
        ex: &mut Exporter,
        (name, metric): &FileToRead,
        wait: Duration,
        deadline: Instant,
    ) -> FileResult<std::ops::Range<usize>> {
        let start = self.staged.len();
        let mut clock = ReadClock::new(wait.min(ex.lock_wait_left), deadline);
        let mut skipped = [0u64; EntrySkip::ALL.len()];
        let mut details: Vec<String> = Vec::new();
        let room = ENTRY_DETAILS_KEPT.saturating_sub(ex.report.entry_details.len());
        let path = ex.dir.join(OsStr::from_bytes(name));
        let mut sink = Sink {
            names: &self.names,
            raw: &mut self.raw,
            staged: &mut self.staged,
            metrics: &mut ex.metrics,
            registry: &ex.registry,
            decode: ex.seams.key_decode,
        };
        let mut visit = |entry: Entry<'_>| {
            if let Err(bad) = sink.stage(&entry, *metric) {
                skipped[bad.reason as usize] += 1;
                if details.len() < room {
                    let at = entry.offset();
                    details.push(format!("entry at offset {at}: {}", bad.detail));
                }
            }
        };
        let key = &mut self.key;
        let read = read_locked(&path, &mut clock, |file, clock| match ex.seams.file_read {
            FileRead::EntryByEntry => read_entry_by_entry(file, key, clock, &mut visit),
            FileRead::Mapped | FileRead::KeptMapped => {
                let map = map_file(file)?;
                walk_mapped(file, map.as_ref(), clock, &mut visit)
            }
        });
        ex.lock_wait_left = ex.lock_wait_left.saturating_sub(clock.lock_waited);
        if let Err(failure) = read {
            self.staged.truncate(start);
            return Err(failure);
        }
        for (reason, n) in EntrySkip::ALL.into_iter().zip(skipped) {
            if n > 0 {
                *ex.report.entries.entry(reason).or_default() += n;
            }
        }
        let path_of = |detail| (path.clone(), detail);
        ex.report
            .entry_details
            .extend(details.into_iter().map(path_of));
        Ok(start..self.staged.len())
    }
}

impl Sink<'_> {
    /// Stages one entry under its metric's series: `metric` for a
    /// per-metric file, else the metric its key names.
    fn stage(&mut self, entry: &Entry<'_>, metric: Option<usize>) -> Result<(), BadEntry> {
        let raw = checked_key(entry)?;
        let (metric, key) = match metric {
            Some(metric) => (metric, Cow::Borrowed(raw)),
            None => {
                let Some((name, rest)) = split_metric_name(raw) else {
                    return Err(BadEntry::new(
                        EntrySkip::NoMetricName,
                        raw,
                        "no ___metric_name label in a file of every metric",
                    ));
                };
                let Some(&metric) = self.names.get(&*name) else {
                    return Err(BadEntry::new(
                        EntrySkip::UnregisteredMetric,
                        raw,
                        "names a metric the registry does not have",
                    ));
                };
                (metric, rest)
            }
        };
        let def = &self.registry.metrics[metric];
        let catalogue = &mut self.metrics[metric].catalogue;
        let series = match self.decode {
            KeyDecode::EveryEntry(unescape) => {
                probe!("export.key_decoded");
                catalogue.find_or_insert(&key, unescape.decode_key(&key), def)?
            }
            KeyDecode::OncePerRawKey(unescape) => match self.raw[metric].get(&*key) {
                Some(&series) => series as usize,
                None => {
                    probe!("export.key_decoded");
                    let decoded =
                        formenc::decode_key_cached(&key, unescape, &mut catalogue.components);
                    let series = catalogue.find_or_insert(&key, decoded, def)?;
                    self.raw[metric].insert(key.into_owned().into(), series as u32);
                    series
                }
            },
        };
        self.staged
            .push((metric as u32, series as u32, *entry.value_bytes));
        Ok(())
    }
}

/// A per-process key split: its metric's name (decoded), and the rest of the key.
pub type MetricAndKey<'a> = (Cow<'a, [u8]>, Cow<'a, [u8]>);

/// A per-process key's metric name (decoded) and the key without that label
/// (the first `___metric_name`, as the branch's `CGI::parse(...).first`
/// takes; a second one stays, and is refused as a reserved label name).
/// `None` if the key has no such label or its value does not decode.
pub fn split_metric_name(raw: &[u8]) -> Option<MetricAndKey<'_>> {
    let mut at = 0;
    loop {
        let end = memchr::memchr(b'&', &raw[at..]).map_or(raw.len(), |i| at + i);
        let pair = &raw[at..end];
        let (name, value) = match memchr::memchr(b'=', pair) {
            Some(eq) => (&pair[..eq], &pair[eq + 1..]),
            None => (pair, &pair[pair.len()..]),
        };
        let is_it = name == METRIC_NAME_LABEL
            || (memchr::memchr2(b'%', b'+', name).is_some()
                && formenc::decode_component(name).is_ok_and(|n| *n == *METRIC_NAME_LABEL));
        if is_it {
            let metric = formenc::decode_component(value).ok()?;
            let rest = if at == 0 {
                Cow::Borrowed(raw.get(end + 1..).unwrap_or_default())
            } else {
                Cow::Owned([&raw[..at - 1], &raw[end..]].concat())
            };
            return Some((metric, rest));
        }
        if end >= raw.len() {
            return None;
        }
        at = end + 1;
    }
}

/// Every metric's own files and the per-process files, in sorted name order,
/// but the sources of a fold batch committed and not finished.
fn files_to_read(files: &FileSet, metrics: usize) -> Vec<FileToRead> {
    let excluded = files.excluded();
    let kept = |name: &[u8], ino: u64| excluded.is_empty() || excluded.get(name) != Some(&ino);
    let mut out: Vec<FileToRead> = Vec::new();
    for metric in 0..metrics {
        for file in files.view(metric).0 {
            if kept(&file.name, file.ino) {
                out.push((file.name.clone(), Some(metric)));
            }
        }
    }
    for (name, ino) in files.process_files() {
        if kept(name, *ino) {
            out.push((name.clone(), None));
        }
    }
    out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Folds staged entries into their metrics' scrapes, in order.
fn fold_staged(metrics: &mut [MetricState], registry: &Registry, staged: &[(u32, u32, [u8; 16])]) {
    for (metric, series, bytes) in staged {
        let mode = registry.metrics[*metric as usize].aggregation();
        let value = f64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        let timestamp = f64::from_le_bytes(bytes[8..].try_into().expect("8 bytes"));
        metrics[*metric as usize]
            .scrape
            .add(*series as usize, mode, value, timestamp);
    }
}

fn skip(ex: &mut Exporter, name: &[u8], failure: FileFailure) {
    ex.report.files.push(SkippedFile {
        path: ex.dir.join(OsStr::from_bytes(name)),
        reason: failure.reason,
        error: format!("{:#}", failure.error),
    });
}

#[cfg(test)]
mod tests {
    use super::split_metric_name;

    fn split(raw: &str) -> Option<(String, String)> {
        split_metric_name(raw.as_bytes()).map(|(n, r)| {
            (
                String::from_utf8(n.into_owned()).unwrap(),
                String::from_utf8(r.into_owned()).unwrap(),
            )
        })
    }

    #[test]
    fn the_metric_name_label_is_taken_out_wherever_it_stands() {
        let s = |a: &str, b: &str| Some((a.to_string(), b.to_string()));
        assert_eq!(split("___metric_name=foo"), s("foo", ""));
        assert_eq!(split("___metric_name=foo&a=1&b=2"), s("foo", "a=1&b=2"));
        assert_eq!(split("A=1&___metric_name=a%3Ab&b=2"), s("a:b", "A=1&b=2"));
        assert_eq!(split("A=1&___metric_name=x"), s("x", "A=1"));
        assert_eq!(split("%5F__metric_name=x&a=1"), s("x", "a=1"));
        assert_eq!(split("a=1&b=2"), None);
        assert_eq!(split(""), None);
        assert_eq!(split("___metric_name=%ZZ"), None);
    }
}
