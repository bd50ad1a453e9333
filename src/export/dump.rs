//! Every entry of one store file, as the exporter would judge it: its
//! decoded labels, value and timestamp, or why the exporter would leave it
//! out ([`EntrySkip`]); and what is wrong with the file as a whole, if
//! anything (a `used` past its end, an entry running past `used`, a length
//! no writer wrote). For `promlab dump`: unlike a scrape, a dump goes on as
//! far as the bytes allow, so a trimmed, truncated or corrupt file still
//! shows every entry that can be read.

use super::keys::{checked_key, label_fault};
use super::EntrySkip;
use crate::format::formenc::decode_key_reference;
use crate::format::storefile::{entries, open_regular, parse_file_name, HEADER_SIZE};
use std::io::Read;
use std::path::Path;

/// One store file, read for a dump.
#[derive(Clone, Debug, Default)]
pub struct FileDump {
    /// The metric and the id (a pid, or a fold file's id) its name gives;
    /// `None` when the name is not a store file's.
    pub metric: Option<String>,
    pub id: Option<String>,
    /// Whether the id is a fold file's (the exited processes it folded).
    pub fold: bool,
    /// The file's size, and the `used` its header claims (0: never written).
    pub size: u64,
    pub used: Option<i64>,
    pub entries: Vec<EntryDump>,
    /// What is wrong with the file as a whole: entries past this were not read.
    pub error: Option<String>,
}

/// One entry of a store file.
#[derive(Clone, Debug)]
pub struct EntryDump {
    /// File offset of the entry.
    pub offset: usize,
    /// The key as stored, without its padding.
    pub raw_key: Vec<u8>,
    pub value: f64,
    pub timestamp: f64,
    /// The decoded labels, or why a scrape leaves the entry out.
    pub labels: Result<Vec<(String, String)>, (EntrySkip, String)>,
}

/// Reads the file at `path` (without blocking on a FIFO and without its
/// lock: an entry being written as it is read may show torn). Fails only
/// when the file cannot be opened or read at all.
pub fn dump_file(path: &Path) -> std::io::Result<FileDump> {
    let name = path
        .file_name()
        .map(|n| n.as_encoded_bytes())
        .unwrap_or(b"");
    let mut dump = FileDump::default();
    if let Some((metric, id)) = parse_file_name(name) {
        dump.metric = Some(String::from_utf8_lossy(metric).into_owned());
        dump.id = Some(String::from_utf8_lossy(id).into_owned());
        dump.fold = crate::format::storefile::is_fold_id(id);
    }
    let Some(file) = open_regular(path)? else {
        dump.error = Some("not a regular file".to_owned());
        return Ok(dump);
    };
    dump.size = file.metadata()?.len();
    let mut header = [0u8; 4];
    let mut bytes = Vec::new();
    // A store file starts at 1 MiB and doubles; read what `used` covers,
    // never more than the file holds.
    let mut limited = file.take(dump.size);
    if let Err(e) = limited.read_exact(&mut header) {
        dump.error = Some(format!("no header ({} bytes): {e}", dump.size));
        return Ok(dump);
    }
    let used = i32::from_le_bytes(header);
    dump.used = Some(used.into());
    if used == 0 {
        return Ok(dump);
    }
    if used < HEADER_SIZE as i32 {
        dump.error = Some(format!("bad used = {used}: less than the header"));
        return Ok(dump);
    }
    let mut end = used as u64;
    if end > dump.size {
        dump.error = Some(format!(
            "used = {used} but the file is {} bytes (truncated): entries read up to its end",
            dump.size
        ));
        end = dump.size;
    }
    bytes.extend_from_slice(&header);
    limited
        .take(end - 4)
        .read_to_end(&mut bytes)
        .map_err(|e| std::io::Error::new(e.kind(), format!("reading entries: {e}")))?;
    let end = bytes.len();
    for entry in entries(&bytes, end) {
        match entry {
            Ok(entry) => dump.entries.push(EntryDump {
                offset: entry.offset(),
                raw_key: entry.key().to_vec(),
                value: entry.value(),
                timestamp: entry.timestamp(),
                labels: labels(&entry),
            }),
            Err(e) => {
                let why = format!("{e}; the entries after it cannot be found");
                dump.error = Some(match dump.error.take() {
                    Some(before) => format!("{before}; {why}"),
                    None => why,
                });
            }
        }
    }
    Ok(dump)
}

/// An entry's labels as a scrape decodes and checks them.
fn labels(
    entry: &crate::format::storefile::Entry<'_>,
) -> Result<Vec<(String, String)>, (EntrySkip, String)> {
    let raw = checked_key(entry).map_err(|bad| (bad.reason, bad.detail))?;
    let decoded =
        decode_key_reference(raw).map_err(|e| (EntrySkip::BadKey, format!("key: {e}")))?;
    decoded
        .into_iter()
        .map(|(name, value)| match label_fault(&name, &value) {
            Some((reason, why)) => Err((
                reason,
                format!("label {:?}: {why}", String::from_utf8_lossy(&name)),
            )),
            None => Ok((
                String::from_utf8_lossy(&name).into_owned(),
                String::from_utf8_lossy(&value).into_owned(),
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::storefile::file_bytes_with_timestamps;

    #[test]
    fn good_bad_and_truncated_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("metric_c___12.bin");
        let mut bytes = file_bytes_with_timestamps([
            (&b"path=%2Fa"[..], 3.0, 1.5),
            (&b"path=%zz"[..], 1.0, 2.0),
            (&b"__name__=x"[..], 1.0, 2.0),
        ]);
        std::fs::write(&path, &bytes).unwrap();
        let dump = dump_file(&path).unwrap();
        assert_eq!(dump.metric.as_deref(), Some("c"));
        assert_eq!(dump.id.as_deref(), Some("12"));
        assert!(dump.error.is_none());
        assert_eq!(dump.entries.len(), 3);
        let first = &dump.entries[0];
        assert_eq!((first.offset, first.value, first.timestamp), (8, 3.0, 1.5));
        assert_eq!(
            first.labels.as_ref().unwrap(),
            &[("path".to_owned(), "/a".to_owned())]
        );
        assert_eq!(
            dump.entries[1].labels.as_ref().unwrap_err().0,
            EntrySkip::BadKey
        );
        assert_eq!(
            dump.entries[2].labels.as_ref().unwrap_err().0,
            EntrySkip::ReservedLabelName
        );
        // Cut inside the last entry: the two before it are still read.
        bytes.truncate(bytes.len() - 5);
        std::fs::write(&path, &bytes).unwrap();
        let dump = dump_file(&path).unwrap();
        assert_eq!(dump.entries.len(), 2);
        assert!(dump.error.unwrap().contains("truncated"));
    }
}
