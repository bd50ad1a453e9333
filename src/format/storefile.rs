//! The store file format, shared by the writer ([`crate::write`]) and the
//! exporter ([`crate::export`]): client_ruby's `DirectFileStore` files.
//!
//! One file per metric per process, named `metric_<name>___<pid>.bin`: an
//! `i32` `used` count, 4 bytes of padding, then entries back to back (`i32`
//! padded length, the form-encoded key padded with spaces so that `4 + len` is
//! a multiple of 8 — at least one space —, `f64` value, `f64` monotonic
//! timestamp). Files start at 1 MiB and double when full. Readers and writers
//! hold an exclusive `flock` on the file while they touch it.
//!
//! What client_ruby writes, and so what a reader accepts: a key is padded
//! with one to eight spaces (`key + ' ' * (8 - (key.length + 4) % 8)`), so a
//! stored key length is never 0 — an empty label set is stored as four
//! spaces. A zero length is bytes no writer wrote (a sparse or zeroed
//! region, a `used` past the data): [`entries`] stops there with
//! [`EntryError::BadLength`], so such a region is never walked as millions
//! of empty entries. Client_ruby reads a zero length as the empty key; this
//! reader refuses it. A key padded with more than [`MAX_PADDING`] spaces or
//! NULs is not one client_ruby wrote either ([`Entry::key_checked`]).

use anyhow::{bail, Result};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// client_ruby's initial file size.
pub const INITIAL_FILE_SIZE: u64 = 1024 * 1024;
/// Offset of the first entry.
pub const HEADER_SIZE: usize = 8;
/// The most padding client_ruby writes after a key: eight spaces (when
/// `4 + key length` is already a multiple of 8).
pub const MAX_PADDING: usize = 8;

/// The path of one metric's file for one process.
pub fn file_path(dir: &Path, metric: &str, pid: u32) -> PathBuf {
    dir.join(format!("metric_{metric}___{pid}.bin"))
}

/// Files of one metric, sorted by path: exactly the names [`file_path`]
/// gives, `metric_<name>___<pid>.bin` with a decimal pid ([`is_metric_file`]).
pub fn metric_files(dir: &Path, metric: &str) -> Result<Vec<PathBuf>> {
    use anyhow::Context;
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)
        .with_context(|| format!("cannot read store directory {}", dir.display()))?
    {
        let entry = entry?;
        if is_metric_file(entry.file_name().as_encoded_bytes(), metric) {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// Whether `file_name` is `metric_<metric>___<pid>.bin` with a decimal pid.
/// client_ruby globs `metric_<name>___*`, which also takes the files of metric
/// `<name>___x` (and stray names); this is its `01-exact-glob` patch's rule.
pub fn is_metric_file(file_name: &[u8], metric: &str) -> bool {
    file_name
        .strip_prefix(b"metric_")
        .and_then(|rest| rest.strip_prefix(metric.as_bytes()))
        .and_then(|rest| rest.strip_prefix(b"___"))
        .and_then(|rest| rest.strip_suffix(b".bin"))
        .is_some_and(|pid| !pid.is_empty() && pid.iter().all(u8::is_ascii_digit))
}

/// A store file name's metric and id: `metric_<metric>___<id>.bin` with a
/// decimal id, split at the last `___` (a metric name may hold `___`; an id
/// never does). The id is a process id, or — with [`FOLD_ID_DIGITS`] digits
/// or more — a fold file's (`crate::export::fold`).
pub fn parse_file_name(file_name: &[u8]) -> Option<(&[u8], &[u8])> {
    let inner = file_name.strip_prefix(b"metric_")?.strip_suffix(b".bin")?;
    let split = memchr::memmem::rfind(inner, b"___")?;
    let (metric, id) = (&inner[..split], &inner[split + 3..]);
    (!metric.is_empty() && !id.is_empty() && id.iter().all(u8::is_ascii_digit))
        .then_some((metric, id))
}

/// The file name prefix of the one-file-per-process layout (client_ruby's
/// `poc_file_per_process` branch): `metrics___<id>.bin` holds every metric of
/// one process, each key naming its metric in a [`METRIC_NAME_LABEL`] label.
/// No per-metric file name starts so (`metric_` then a name, never `metrics`).
pub const PROCESS_FILE_PREFIX: &[u8] = b"metrics___";

/// The label a one-file-per-process key names its metric by.
pub const METRIC_NAME_LABEL: &[u8] = b"___metric_name";

/// The path of one process's file in the one-file-per-process layout.
pub fn process_file_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("metrics___{id}.bin"))
}

/// A one-file-per-process file name's id: `metrics___<id>.bin` with a
/// decimal id (a process id, or a fold file's: see [`is_fold_id`]). The
/// branch's exporter globs `metrics___*`; stray names are not its files.
pub fn parse_process_file_name(file_name: &[u8]) -> Option<&[u8]> {
    let id = file_name
        .strip_prefix(PROCESS_FILE_PREFIX)?
        .strip_suffix(b".bin")?;
    (!id.is_empty() && id.iter().all(u8::is_ascii_digit)).then_some(id)
}

/// Ids of this many digits or more are never process ids: Linux's pids stop
/// at `PID_MAX_LIMIT`, 2^22 = 4,194,304 (seven digits), in every pid
/// namespace. The fold names its files so (`crate::export::fold`), so no writer, in
/// any container, ever opens one: client_ruby's `metric_<name>___<pid>.bin`.
pub const FOLD_ID_DIGITS: usize = 8;

/// Whether a store file's id (see [`parse_file_name`]) is a fold file's.
pub fn is_fold_id(id: &[u8]) -> bool {
    id.len() >= FOLD_ID_DIGITS
}

/// A store file's bytes holding `entries` (raw key, value, timestamp) in
/// order, `used` set and nothing after it: what the fold writes.
pub fn file_bytes_with_timestamps<'a>(
    entries: impl IntoIterator<Item = (&'a [u8], f64, f64)>,
) -> Vec<u8> {
    let mut bytes = vec![0u8; HEADER_SIZE];
    for (key, value, timestamp) in entries {
        let mut entry = new_entry(key);
        let at = entry.len() - 16;
        entry[at..at + 8].copy_from_slice(&value.to_le_bytes());
        entry[at + 8..].copy_from_slice(&timestamp.to_le_bytes());
        bytes.extend_from_slice(&entry);
    }
    let used = bytes.len() as i32;
    bytes[..4].copy_from_slice(&used.to_le_bytes());
    bytes
}

/// Padded key length as client_ruby writes it: `4 + len` a multiple of 8, at least one space.
pub fn padded_len(key_len: usize) -> usize {
    key_len + (8 - (key_len + 4) % 8)
}

/// One entry's bytes as client_ruby appends it: padded length, key, spaces,
/// then a zero value and timestamp.
pub fn new_entry(key: &[u8]) -> Vec<u8> {
    let padded = padded_len(key.len());
    let mut entry = Vec::with_capacity(4 + padded + 16);
    entry.extend_from_slice(&(padded as i32).to_le_bytes());
    entry.extend_from_slice(key);
    entry.resize(4 + padded, b' ');
    entry.extend_from_slice(&[0u8; 16]);
    entry
}

/// A store file's used region holding `entries` (raw key, value) as
/// client_ruby appends them, timestamps zero: files laid by hand, for tests
/// and the reliability suite.
pub fn file_bytes<'a>(entries: impl IntoIterator<Item = (&'a [u8], f64)>) -> Vec<u8> {
    let mut bytes = vec![0u8; HEADER_SIZE];
    for (key, value) in entries {
        let mut entry = new_entry(key);
        let at = entry.len() - 16;
        entry[at..at + 8].copy_from_slice(&value.to_le_bytes());
        bytes.extend_from_slice(&entry);
    }
    let used = bytes.len() as i32;
    bytes[..4].copy_from_slice(&used.to_le_bytes());
    bytes
}

/// Reads `used` from the header: at least 8, at most the file's size; 0 (a
/// file created but never written) reads as empty, as client_ruby does.
pub fn check_used(header: [u8; 4], file_len: u64) -> Result<usize> {
    let used = i32::from_le_bytes(header);
    if used == 0 {
        return Ok(HEADER_SIZE);
    }
    if used < HEADER_SIZE as i32 || used as u64 > file_len {
        bail!("bad used = {used} (file is {file_len} bytes)");
    }
    Ok(used as usize)
}

/// Opens a store file for reading without blocking (a FIFO's `open` would
/// wait for a writer). Symlinks are followed, as client_ruby's `File.open`
/// follows them; `Ok(None)` if what the name leads to is not a regular file.
/// A missing file is the `NotFound` error, for the caller to name.
pub fn open_regular(path: &Path) -> std::io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    Ok(file.metadata()?.is_file().then_some(file))
}

/// Takes `fd`'s exclusive `flock`, trying again with a growing pause (50 µs,
/// doubling up to 5 ms) while another process holds it. `deadline` is asked
/// for only once the lock is found held, with the time of that first try, so
/// an uncontended lock reads no clock. `Ok(None)`: still held at the
/// deadline; otherwise how long it waited (zero if it did not).
pub fn lock_exclusive_until(
    fd: std::os::fd::RawFd,
    deadline: impl FnOnce(Instant) -> Instant,
) -> std::io::Result<LockWait> {
    let try_lock = || match flock(fd, libc::LOCK_EX | libc::LOCK_NB) {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
        Err(err) => Err(err),
    };
    if try_lock()? {
        return Ok(LockWait {
            locked: true,
            waited: Duration::ZERO,
        });
    }
    let first = Instant::now();
    let until = deadline(first);
    let mut pause = Duration::from_micros(50);
    loop {
        let now = Instant::now();
        if now >= until {
            return Ok(LockWait {
                locked: false,
                waited: now - first,
            });
        }
        std::thread::sleep(pause.min(until - now));
        pause = (pause * 2).min(Duration::from_millis(5));
        if try_lock()? {
            return Ok(LockWait {
                locked: true,
                waited: first.elapsed(),
            });
        }
    }
}

/// What [`lock_exclusive_until`] got.
#[derive(Clone, Copy, Debug)]
pub struct LockWait {
    /// Whether the lock is held now.
    pub locked: bool,
    /// How long it waited for it.
    pub waited: Duration,
}

/// `flock(2)`, retried when a signal interrupts it.
pub fn flock(fd: std::os::fd::RawFd, op: libc::c_int) -> std::io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor this process holds open.
        if unsafe { libc::flock(fd, op) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// One entry of a store file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Entry<'a> {
    /// The form-encoded key as stored, padding included.
    pub padded_key: &'a [u8],
    /// The value and the timestamp, as stored.
    pub value_bytes: &'a [u8; 16],
    /// File offset of the value.
    pub value_offset: usize,
}

impl<'a> Entry<'a> {
    /// The key without its padding (client_ruby's `unpack("A*")`). Found by
    /// scanning back from the key's end: callers that can compare padded keys
    /// skip it, and so skip waiting for that end to come from memory.
    pub fn key(&self) -> &'a [u8] {
        strip_padding(self.padded_key)
    }

    /// [`Entry::key`], if the key is padded with at most [`MAX_PADDING`]
    /// spaces or NULs, as client_ruby pads; `None` otherwise. Looks at the
    /// last nine bytes at most, so a hostile key of a million NULs (a sparse
    /// region) costs nothing to refuse.
    pub fn key_checked(&self) -> Option<&'a [u8]> {
        let padded = self.padded_key;
        let from = padded.len().saturating_sub(MAX_PADDING + 1);
        match padded[from..].iter().rposition(|&b| b != b' ' && b != 0) {
            Some(i) => Some(&padded[..from + i + 1]),
            None if padded.len() <= MAX_PADDING => Some(&padded[..0]),
            None => None,
        }
    }

    /// The value, read when asked for: a caller that compares the key first
    /// finds the value's cache line already fetched behind the key.
    pub fn value(&self) -> f64 {
        f64::from_le_bytes(self.value_bytes[..8].try_into().expect("8 bytes"))
    }

    pub fn timestamp(&self) -> f64 {
        f64::from_le_bytes(self.value_bytes[8..].try_into().expect("8 bytes"))
    }

    /// File offset of the entry.
    pub fn offset(&self) -> usize {
        self.value_offset - self.padded_key.len() - 4
    }
}

/// Why an entry could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryError {
    BadLength {
        at: usize,
        len: i32,
    },
    Truncated {
        at: usize,
        needs: usize,
        used: usize,
    },
}

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryError::BadLength { at, len } => {
                write!(f, "entry at offset {at} has key length {len}")
            }
            EntryError::Truncated { at, needs, used } => {
                write!(
                    f,
                    "entry at offset {at} needs {needs} bytes but used ends at {used}"
                )
            }
        }
    }
}

impl std::error::Error for EntryError {}

/// client_ruby's `unpack("A*")`: the key without trailing spaces and NULs.
pub fn strip_padding(padded: &[u8]) -> &[u8] {
    let end = padded
        .iter()
        .rposition(|&b| b != b' ' && b != 0)
        .map_or(0, |i| i + 1);
    &padded[..end]
}

/// Walks the entries of a file's bytes from offset 8 up to `used`.
pub fn entries(region: &[u8], used: usize) -> impl Iterator<Item = Result<Entry<'_>, EntryError>> {
    let mut pos = HEADER_SIZE;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || pos >= used {
            return None;
        }
        let at = pos;
        let result = entry_at(region, at, used);
        match &result {
            Ok((_, next)) => pos = *next,
            Err(_) => failed = true,
        }
        Some(result.map(|(entry, _)| entry))
    })
}

fn entry_at(region: &[u8], at: usize, used: usize) -> Result<(Entry<'_>, usize), EntryError> {
    let truncated = |needs| EntryError::Truncated { at, needs, used };
    let len_bytes = region
        .get(at..at + 4)
        .filter(|_| at + 4 <= used)
        .ok_or(truncated(4))?;
    let len = i32::from_le_bytes(len_bytes.try_into().expect("4 bytes"));
    // Zero: never written (client_ruby pads every key, the empty one to four
    // spaces); see the module doc.
    if len < 1 {
        return Err(EntryError::BadLength { at, len });
    }
    let needs = 4 + len as usize + 16;
    if at + needs > used || at + needs > region.len() {
        return Err(truncated(needs));
    }
    let padded_key = &region[at + 4..at + 4 + len as usize];
    let value_offset = at + 4 + len as usize;
    let value_bytes = region[value_offset..value_offset + 16]
        .try_into()
        .expect("16 bytes");
    Ok((
        Entry {
            padded_key,
            value_bytes,
            value_offset,
        },
        at + needs,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(padded_key: &[u8]) -> Entry<'_> {
        Entry {
            padded_key,
            value_bytes: &[0; 16],
            value_offset: 0,
        }
    }

    /// Keys padded as client_ruby pads them (one to eight spaces, NULs
    /// allowed as Ruby's `unpack("A*")` strips them) are found; a longer run
    /// is refused, whatever its length.
    #[test]
    fn keys_are_found_within_client_rubys_padding() {
        for key in [&b""[..], b"a=1", b"a=1234", b"abcdefgh=1234567"] {
            let padded = new_entry(key);
            let padded = &padded[4..padded.len() - 16];
            assert_eq!(entry(padded).key_checked(), Some(key), "{key:?}");
            assert_eq!(entry(padded).key(), key);
        }
        assert_eq!(entry(b"a=1\0\0\0\0\0").key_checked(), Some(&b"a=1"[..]));
        assert_eq!(entry(b"        ").key_checked(), Some(&b""[..]));
        assert_eq!(entry(b"         ").key_checked(), None);
        assert_eq!(entry(b"a=1         ").key_checked(), None);
        assert_eq!(entry(&[0u8; 1 << 20]).key_checked(), None);
    }

    /// A zero key length is refused where the walk meets it: client_ruby
    /// stores even the empty key as four spaces.
    #[test]
    fn a_zero_key_length_ends_the_walk() {
        let mut bytes = file_bytes([(&b""[..], 1.0)]);
        assert_eq!(&bytes[8..12], &4i32.to_le_bytes());
        bytes.extend_from_slice(&[0; 20]);
        let used = bytes.len();
        let walked: Vec<_> = entries(&bytes, used).collect();
        assert_eq!(walked.len(), 2);
        assert!(walked[0].is_ok());
        assert_eq!(walked[1], Err(EntryError::BadLength { at: 32, len: 0 }));
    }
}
