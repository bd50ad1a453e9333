//! Stores in the one-file-per-process layout of client_ruby's
//! `poc_file_per_process` branch ([`crate::export::per_process`] reads it),
//! made from stores in the per-metric layout: the same series and values,
//! one file per process. For the tests (a store in both layouts, or any mix
//! of them) and for measuring the sidecar on the same data in each layout.

use crate::format::formenc::{self, Dialect};
use crate::format::registry::Registry;
use crate::format::storefile::{
    self, check_used, entries, file_bytes_with_timestamps, METRIC_NAME_LABEL,
};
use anyhow::{Context, Result};
use std::path::Path;

/// `key` (a per-metric file's key, labels sorted by name) with the
/// `___metric_name` label the branch adds, sorted in where its
/// `labels.to_a.sort` puts it: before the first label whose name sorts after
/// it (label names are written unescaped in both dialects).
pub fn key_with_metric_name(key: &[u8], metric: &str, dialect: Dialect) -> Vec<u8> {
    let mut pair = METRIC_NAME_LABEL.to_vec();
    pair.push(b'=');
    formenc::encode_component(&mut pair, metric.as_bytes(), dialect);
    if key.is_empty() {
        return pair;
    }
    let mut out = Vec::with_capacity(key.len() + pair.len() + 1);
    let mut placed = false;
    for (i, label) in key.split(|&b| b == b'&').enumerate() {
        let name = label.split(|&b| b == b'=').next().unwrap_or_default();
        if !placed && name > METRIC_NAME_LABEL {
            if i > 0 {
                out.push(b'&');
            }
            out.extend_from_slice(&pair);
            out.push(b'&');
            out.extend_from_slice(label);
            placed = true;
            continue;
        }
        if i > 0 {
            out.push(b'&');
        }
        out.extend_from_slice(label);
    }
    if !placed {
        out.push(b'&');
        out.extend_from_slice(&pair);
    }
    out
}

/// Replaces process `id`'s per-metric files in `dir` with its one file of
/// the one-file-per-process layout, `metrics___<id>.bin`: every entry of each
/// of its metric files, metric after metric in registry order, keys given
/// the metric's name ([`key_with_metric_name`]), values and timestamps as
/// they were. Returns whether the process had any file.
pub fn merge_process(dir: &Path, registry: &Registry, id: &str, dialect: Dialect) -> Result<bool> {
    let mut merged: Vec<(Vec<u8>, f64, f64)> = Vec::new();
    let mut sources = Vec::new();
    for def in &registry.metrics {
        let path = dir.join(format!("metric_{}___{id}.bin", def.name));
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        if bytes.len() >= 4 {
            let used = check_used(bytes[..4].try_into().expect("4 bytes"), bytes.len() as u64)
                .with_context(|| format!("{}", path.display()))?;
            for entry in entries(&bytes, used) {
                let entry = entry.with_context(|| format!("{}", path.display()))?;
                let key = key_with_metric_name(entry.key(), &def.name, dialect);
                merged.push((key, entry.value(), entry.timestamp()));
            }
        }
        sources.push(path);
    }
    if sources.is_empty() {
        return Ok(false);
    }
    let bytes = file_bytes_with_timestamps(merged.iter().map(|(k, v, t)| (&k[..], *v, *t)));
    let target = storefile::process_file_path(dir, id);
    let tmp = dir.join(format!(".merging-{id}"));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &target).with_context(|| format!("writing {}", target.display()))?;
    for source in sources {
        std::fs::remove_file(&source).with_context(|| format!("removing {}", source.display()))?;
    }
    Ok(true)
}

/// The ids of the processes with per-metric files in `dir`, sorted.
pub fn process_ids(dir: &Path) -> Result<Vec<String>> {
    let mut ids = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = entry?.file_name();
        if let Some((_, id)) = storefile::parse_file_name(name.as_encoded_bytes()) {
            ids.insert(String::from_utf8_lossy(id).into_owned());
        }
    }
    Ok(ids.into_iter().collect())
}

/// Rewrites every process of `dir` into the one-file-per-process layout.
pub fn convert_store(dir: &Path, registry: &Registry, dialect: Dialect) -> Result<()> {
    for id in process_ids(dir)? {
        merge_process(dir, registry, &id, dialect)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metric_name_is_sorted_in_as_rubys_sort_puts_it() {
        let k = |key: &str, m: &str| {
            String::from_utf8(key_with_metric_name(key.as_bytes(), m, Dialect::Cgi)).unwrap()
        };
        assert_eq!(k("", "up"), "___metric_name=up");
        assert_eq!(k("a=1&b=2", "x"), "___metric_name=x&a=1&b=2");
        assert_eq!(k("A=1&b=2", "x"), "A=1&___metric_name=x&b=2");
        assert_eq!(k("A=1&B=2", "a:b"), "A=1&B=2&___metric_name=a%3Ab");
        assert_eq!(k("__a=1&le=0.5", "x"), "___metric_name=x&__a=1&le=0.5");
    }

    #[test]
    fn the_converted_key_splits_back_into_the_original() {
        for key in ["", "a=1", "A=1&b=%26", "A=1&B=2", "_Z=1&code=200&pid=4"] {
            let with = key_with_metric_name(key.as_bytes(), "m:x", Dialect::Uri);
            let (name, rest) = crate::export::split_metric_name(&with).unwrap();
            assert_eq!(&*name, b"m:x");
            assert_eq!(&*rest, key.as_bytes());
        }
    }
}
