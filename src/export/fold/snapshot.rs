//! One metric's files, as the fold read them.

use super::*;

// ---------------------------------------------------------------------------
// One metric's files, as the fold read them.

/// What the fold knows of a file's writers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FileState {
    /// Written to by a live process: never folded.
    Live,
    /// No lease to say: treated as live.
    Unknown,
    /// Its writer has exited, or it is a fold file: can be folded.
    Exited,
    /// Exited, but its bytes are not a store file, or it holds an entry an
    /// exporter skips: left as it is (an exporter's handling of it stays).
    Odd,
}

/// One file of a metric: its name, identity, state, bytes and entries.
#[derive(Debug)]
pub(super) struct FileSnapshot {
    pub(super) name: Vec<u8>,
    pub(super) ino: u64,
    pub(super) state: FileState,
    /// The used region (empty when it counts for nothing: corrupt, shorter
    /// than a header, not readable).
    pub(super) bytes: Vec<u8>,
    /// Per entry: its series, value and timestamp (entries an exporter
    /// skips are not here).
    pub(super) entries: Vec<(usize, f64, f64)>,
    /// Per entry of `entries`: its raw key's place in `bytes`.
    pub(super) keys: Vec<(usize, usize)>,
    /// When it was last written (its writer's last write, for an exited one).
    pub(super) mtime: Option<std::time::SystemTime>,
}

/// Reads every file of one metric: exited ones under a read lease taken for
/// the read, live ones under their `flock`, as client_ruby's exporter reads.
pub(super) fn read_metric(
    dir: &Path,
    files: &[(Vec<u8>, u64)],
    config: &FoldConfig,
    series: &mut SeriesIds,
) -> Result<Vec<FileSnapshot>> {
    let mut out = Vec::with_capacity(files.len());
    for (name, ino) in files {
        let path = dir.join(os(name));
        let file = match open_regular(&path) {
            Ok(Some(file)) => file,
            // Gone, or not a regular file: an exporter leaves it out too.
            Ok(None) => continue,
            Err(err) => return Err(err.context(format!("cannot open {}", path.display()))),
        };
        let meta = file.metadata().ok();
        let ino = meta.as_ref().map_or(*ino, |m| m.ino());
        let mtime = meta.and_then(|m| m.modified().ok());
        let (state, bytes) = match liveness::ReadLease::take(&file) {
            Ok(_lease) => (FileState::Exited, read_used(&file)?),
            Err(writers) => {
                let state = if writers == Writers::Open {
                    FileState::Live
                } else {
                    FileState::Unknown
                };
                let deadline = Instant::now() + config.lock_wait;
                if !lock_until(&file, deadline)? {
                    bail!("{} stayed locked", path.display());
                }
                let bytes = read_used(&file);
                let _ = flock(file.as_raw_fd(), libc::LOCK_UN);
                (state, bytes?)
            }
        };
        let mut snapshot = series.snapshot(name.clone(), ino, state, bytes);
        snapshot.mtime = mtime;
        out.push(snapshot);
    }
    Ok(out)
}

pub(super) fn os(bytes: &[u8]) -> &std::ffi::OsStr {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::OsStr::from_bytes(bytes)
}

/// Opens a listed store file ([`storefile::open_regular`]); `None` if it is
/// gone or not a regular file.
pub(super) fn open_regular(path: &Path) -> Result<Option<File>> {
    match storefile::open_regular(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        opened => Ok(opened?),
    }
}

/// `flock(LOCK_EX)`, waiting until `deadline` at most.
pub(super) fn lock_until(file: &File, deadline: Instant) -> Result<bool> {
    Ok(storefile::lock_exclusive_until(file.as_raw_fd(), |_| deadline)?.locked)
}

/// The file's used region: empty when it is shorter than a header or its
/// `used` is bad (an exporter reads the first as empty and skips the second).
pub(super) fn read_used(file: &File) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    if len < 4 {
        return Ok(Vec::new());
    }
    let mut header = [0u8; 4];
    file.read_exact_at(&mut header, 0)?;
    let Ok(used) = check_used(header, len) else {
        return Ok(Vec::new());
    };
    let mut bytes = vec![0u8; used];
    match file.read_exact_at(&mut bytes, 0) {
        Ok(()) => Ok(bytes),
        // Shrunk under us: it counts for nothing.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// A decoded label set: (name, value) pairs, as bytes.
pub(super) type LabelSet = Vec<(Vec<u8>, Vec<u8>)>;

/// Where a raw key lies: (file index, (start, end) of its bytes in the file).
pub(super) type KeyPlace = (usize, (usize, usize));

/// A folded series: its first raw key met, its aggregate value and timestamp.
pub(super) type FoldedEntry = (KeyPlace, f64, f64);

/// Decoded label sets → series numbers, for one metric's files, or for the
/// files of the one-file-per-process layout (a series there is its metric's
/// name and its other labels: `___metric_name` first, wherever its key had
/// it, as the exporter takes it out).
#[derive(Default)]
pub(super) struct SeriesIds {
    pub(super) ids: HashMap<LabelSet, usize>,
    /// One-file-per-process files: each registered metric's aggregation.
    pub(super) metrics: Option<HashMap<Vec<u8>, ProcessAggregation>>,
    /// One-file-per-process files: per series, its metric's aggregation.
    modes: Vec<ProcessAggregation>,
}

impl SeriesIds {
    /// For the files of the one-file-per-process layout: an entry whose key
    /// names no metric of `registry` is one an exporter skips (its file
    /// stays as it is).
    pub(super) fn per_process(registry: &Registry) -> SeriesIds {
        SeriesIds {
            metrics: Some(
                registry
                    .metrics
                    .iter()
                    .map(|m| (m.name.as_bytes().to_vec(), m.aggregation()))
                    .collect(),
            ),
            ..SeriesIds::default()
        }
    }

    /// Each series' aggregation: `one` for one metric's files.
    pub(super) fn modes(self, one: ProcessAggregation) -> Modes {
        match self.metrics {
            Some(_) => Modes::PerSeries(self.modes),
            None => Modes::One(one),
        }
    }

    /// The series of a raw key, if every exporter exports it.
    fn series_of(&mut self, raw: &[u8]) -> Option<usize> {
        let mut labels = exportable_labels(raw)?;
        let next = self.ids.len();
        let Some(metrics) = &self.metrics else {
            return Some(*self.ids.entry(labels).or_insert(next));
        };
        let at = labels.iter().position(|(n, _)| n == METRIC_NAME_LABEL)?;
        let (name, metric) = labels.remove(at);
        let mode = *metrics.get(&metric)?;
        labels.insert(0, (name, metric));
        let id = *self.ids.entry(labels).or_insert(next);
        if id == next {
            self.modes.push(mode);
        }
        Some(id)
    }

    pub(super) fn snapshot(
        &mut self,
        name: Vec<u8>,
        ino: u64,
        state: FileState,
        bytes: Vec<u8>,
    ) -> FileSnapshot {
        let mut snapshot = FileSnapshot {
            name,
            ino,
            state,
            bytes: Vec::new(),
            entries: Vec::new(),
            keys: Vec::new(),
            mtime: None,
        };
        if bytes.len() < HEADER_SIZE {
            // Shorter than a header: empty (and nothing to keep of it).
            return snapshot;
        }
        let used = bytes.len();
        let mut odd = false;
        for entry in entries(&bytes, used) {
            let Ok(entry) = entry else {
                // Corrupt: an exporter leaves the whole file out.
                snapshot.entries.clear();
                snapshot.keys.clear();
                if snapshot.state == FileState::Exited {
                    snapshot.state = FileState::Odd;
                }
                return snapshot;
            };
            let key = entry.key();
            match self.series_of(key) {
                Some(id) => {
                    let start = entry.offset() + 4;
                    snapshot
                        .entries
                        .push((id, entry.value(), entry.timestamp()));
                    snapshot.keys.push((start, start + key.len()));
                }
                None => odd = true,
            }
        }
        if odd && snapshot.state == FileState::Exited {
            snapshot.state = FileState::Odd;
        }
        snapshot.bytes = bytes;
        snapshot
    }
}

/// A raw key's labels when every exporter exports it (it decodes, names
/// valid labels, none of them `__name__`, values in UTF-8); `None` for keys
/// an exporter skips. Stricter than needed is safe: such files stay as
/// they are.
pub(super) fn exportable_labels(raw: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let labels = formenc::decode_key_reference(raw).ok()?;
    labels
        .into_iter()
        .map(|(name, value)| {
            let ok = is_label_name(&name)
                && &*name != b"__name__"
                && std::str::from_utf8(&value).is_ok();
            ok.then(|| (name.into_owned(), value.into_owned()))
        })
        .collect()
}
