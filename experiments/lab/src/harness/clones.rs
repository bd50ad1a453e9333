//! A client_ruby store cloned under new pids: the `many-processes` scenarios,
//! the shape of prometheus/client_ruby#143 (Passenger and Puma recycle
//! workers, each new worker writes its own files, and the directory fills
//! with the files of processes that exited long ago).
//!
//! The source is a fixture client_ruby wrote (`all-types-v5-uri` or
//! `all-types-v4.2.5`, built into the binary: five writer processes, nine
//! metrics in every type and aggregation, 42 files). Process `j` of the clone
//! is the fixture's process `j mod 5` under pid `PID_BASE + j`: its files, entry
//! for entry in the fixture's order, with
//! - a `pid=<old>` key component (a gauge in `all` mode) rewritten to the new
//!   pid, so every exited worker keeps its own series, as in client_ruby;
//! - each value multiplied by `1 + c mod 4` and each timestamp moved `c`
//!   seconds later, where `c = j / 5` is the clone's number, so `sum`, `max`,
//!   `min` and `most_recent` each depend on every clone (and `most_recent`
//!   picks the newest clone's value).
//!
//! Files are written as the fixture's are: the used region only (readers rely
//! on `used`, never on the size). Deterministic: the same arguments give the
//! same bytes.

use anyhow::{bail, Context, Result};
use promlab::format::registry::Registry;
use promlab::format::storefile::{entries, file_path, new_entry, HEADER_SIZE};
use std::path::Path;

/// The first clone's pid. Above 32,768 (the default `pid_max` on many
/// machines, this one's included), so on those no running process has it.
pub const PID_BASE: u32 = 100_000;

/// How many files `processes` cloned processes of `case` write.
pub fn file_count(case: &str, processes: usize) -> Result<usize> {
    let source = Source::load(case)?;
    Ok((0..processes)
        .map(|j| source.files_of[j % source.files_of.len()].len())
        .sum())
}

/// One store file of the fixture: its metric, and its entries (raw key,
/// value, timestamp) in file order.
type SourceFile = (String, Vec<(Vec<u8>, f64, f64)>);

/// The fixture's registry and, per process in pid order, its files.
struct Source {
    registry: Registry,
    pids: Vec<u32>,
    files_of: Vec<Vec<SourceFile>>,
}

impl Source {
    fn load(case: &str) -> Result<Source> {
        let (_, _, files) = crate::verify::embedded::CASES
            .iter()
            .find(|(name, _, _)| *name == case)
            .with_context(|| format!("no built-in client_ruby case named `{case}`"))?;
        let registry_json = files
            .iter()
            .find(|(path, _)| *path == "registry.json")
            .context("the case has no registry.json")?
            .1;
        let registry = Registry::from_json(std::str::from_utf8(registry_json)?)?;
        let mut by_pid: std::collections::BTreeMap<u32, Vec<SourceFile>> = Default::default();
        for (path, bytes) in files.iter() {
            let Some(name) = path.strip_prefix("store/") else {
                continue;
            };
            let (metric, pid) = name
                .strip_prefix("metric_")
                .and_then(|n| n.strip_suffix(".bin"))
                .and_then(|n| n.rsplit_once("___"))
                .with_context(|| format!("{path} is not a store file name"))?;
            let pid: u32 = pid.parse()?;
            let used = i32::from_le_bytes(bytes[..4].try_into()?) as usize;
            let mut file = Vec::new();
            for entry in entries(bytes, used) {
                let entry = entry.with_context(|| path.to_string())?;
                file.push((entry.key().to_vec(), entry.value(), entry.timestamp()));
            }
            by_pid
                .entry(pid)
                .or_default()
                .push((metric.to_string(), file));
        }
        if by_pid.is_empty() {
            bail!("case {case} has no store files");
        }
        let pids = by_pid.keys().copied().collect();
        Ok(Source {
            registry,
            pids,
            files_of: by_pid.into_values().collect(),
        })
    }
}

/// Writes `processes` cloned processes of `case` into `dir` (which must
/// exist); returns the case's registry.
pub fn write(case: &str, processes: usize, dir: &Path) -> Result<Registry> {
    let source = Source::load(case)?;
    let n = source.pids.len();
    let mut bytes = Vec::new();
    for j in 0..processes {
        let (k, clone) = (j % n, j / n);
        let pid = PID_BASE + j as u32;
        let old_pid = format!("pid={}", source.pids[k]);
        let new_pid = format!("pid={pid}");
        let factor = (1 + clone % 4) as f64;
        for (metric, file) in &source.files_of[k] {
            bytes.clear();
            bytes.resize(HEADER_SIZE, 0);
            for (key, value, timestamp) in file {
                let key = rewrite_pid(key, old_pid.as_bytes(), new_pid.as_bytes());
                let mut entry = new_entry(&key);
                let at = entry.len() - 16;
                entry[at..at + 8].copy_from_slice(&(value * factor).to_le_bytes());
                entry[at + 8..].copy_from_slice(&(timestamp + clone as f64).to_le_bytes());
                bytes.extend_from_slice(&entry);
            }
            let used = bytes.len() as i32;
            bytes[..4].copy_from_slice(&used.to_le_bytes());
            let path = file_path(dir, metric, pid);
            std::fs::write(&path, &bytes).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    Ok(source.registry)
}

/// `key` with its component `old` (`pid=<digits>`) replaced by `new`.
fn rewrite_pid(key: &[u8], old: &[u8], new: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 4);
    for (i, component) in key.split(|&b| b == b'&').enumerate() {
        if i > 0 {
            out.push(b'&');
        }
        out.extend_from_slice(if component == old { new } else { component });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_components_are_rewritten_whole() {
        assert_eq!(
            rewrite_pid(b"pid=22532&pool=default", b"pid=22532", b"pid=100007"),
            b"pid=100007&pool=default"
        );
        assert_eq!(
            rewrite_pid(b"pid=225321", b"pid=22532", b"pid=1"),
            b"pid=225321"
        );
        assert_eq!(rewrite_pid(b"", b"pid=1", b"pid=2"), b"");
    }

    /// One clone of each process is the fixture itself under new pids: the
    /// same exposition, but for the `all` gauge's pid label values.
    #[test]
    fn one_clone_is_the_fixture_under_new_pids() {
        for case in ["all-types-v5-uri", "all-types-v4.2.5"] {
            let tmp = tempfile::tempdir().unwrap();
            let registry = write(case, 5, tmp.path()).unwrap();
            assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 42);
            assert_eq!(file_count(case, 5).unwrap(), 42);
            let got = promlab::reference::exposition::export(tmp.path(), &registry).unwrap();
            let (_, _, files) = crate::verify::embedded::CASES
                .iter()
                .find(|(name, _, _)| *name == case)
                .unwrap();
            let expected = files.iter().find(|(p, _)| *p == "expected.prom").unwrap().1;
            let mut expected = String::from_utf8(expected.to_vec()).unwrap();
            let source = Source::load(case).unwrap();
            for (k, old) in source.pids.iter().enumerate() {
                expected = expected.replace(
                    &format!("pid=\"{old}\""),
                    &format!("pid=\"{}\"", PID_BASE + k as u32),
                );
            }
            assert_eq!(String::from_utf8(got).unwrap(), expected, "{case}");
        }
    }
}
