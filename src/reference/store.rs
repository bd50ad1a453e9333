//! The naive writer: op logs in, each store file's used region out, with every
//! timestamp zeroed (timestamps are clock readings, the one part of a store
//! that differs run to run). Written from the format description and
//! client_ruby's `DirectFileStore`, apart from `store`/`formenc`:
//!
//! - one file per metric per process, `metric_<name>___<pid>.bin`;
//! - a key is the label set plus `le`/`quantile` (histograms, summaries) plus
//!   `pid` (gauges in `all` mode), sorted, form-encoded in the process's dialect;
//! - a new key is appended (value 0.0) the first time it is written; an
//!   increment reads and adds, a set writes;
//! - a histogram observe adds 1 to the first bucket whose bound is `>=` the
//!   value (`+Inf` if none, as Ruby's `bsearch`), then the value to `sum`; a
//!   summary observe adds 1 to `count`, then the value to `sum`; `init` writes
//!   every series of the label set (buckets, `+Inf`, `sum`; or `count`, `sum`).

use crate::format::formenc::Dialect;
use crate::format::registry::{MetricType, ProcessAggregation, Registry};
use crate::scenarios::op_log::{Op, OpKind, OpLog};
use anyhow::{bail, Result};
use std::collections::BTreeMap;

/// One file's entries: (key, value), in order of first write.
type File = Vec<(Vec<u8>, f64)>;

fn encode(out: &mut Vec<u8>, s: &[u8], dialect: Dialect) {
    for &b in s {
        let keep = b.is_ascii_alphanumeric()
            || b == b'_'
            || b == b'.'
            || b == b'-'
            || (b == b'~' && dialect == Dialect::Cgi)
            || (b == b'*' && dialect == Dialect::Uri);
        if keep {
            out.push(b);
        } else if b == b' ' {
            out.push(b'+');
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
}

fn key(mut pairs: Vec<(String, String)>, dialect: Dialect) -> Vec<u8> {
    pairs.sort();
    let mut out = Vec::new();
    for (i, (n, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(b'&');
        }
        encode(&mut out, n.as_bytes(), dialect);
        out.push(b'=');
        encode(&mut out, v.as_bytes(), dialect);
    }
    out
}

fn add(file: &mut File, key: Vec<u8>, f: impl FnOnce(f64) -> f64) {
    match file.iter_mut().find(|(k, _)| *k == key) {
        Some(entry) => entry.1 = f(entry.1),
        None => file.push((key, f(0.0))),
    }
}

fn apply(
    files: &mut BTreeMap<String, File>,
    registry: &Registry,
    pid: u32,
    dialect: Dialect,
    op: &Op,
) -> Result<()> {
    let Some(def) = registry.get(&op.metric) else {
        bail!("metric {} is not registered", op.metric)
    };
    let file = files
        .entry(format!("metric_{}___{pid}.bin", def.name))
        .or_default();
    let mut labels = op.labels.clone();
    if def.aggregation() == ProcessAggregation::All {
        labels.push(("pid".into(), pid.to_string()));
    }
    let with = |extra: &str, v: &str| {
        let mut l = labels.clone();
        l.push((extra.to_string(), v.to_string()));
        key(l, dialect)
    };
    let v = op.value.get();
    match (def.kind, op.op) {
        (MetricType::Counter | MetricType::Gauge, OpKind::Inc) => {
            add(file, key(labels, dialect), |x| x + v)
        }
        // Ruby negates, then adds (`increment(by: -by)`). black_box keeps the
        // negation from being folded into a subtraction, which would give a
        // NaN the other sign bit than the one Ruby (and promlab) store.
        (MetricType::Gauge, OpKind::Dec) => {
            let by = std::hint::black_box(-v);
            add(file, key(labels, dialect), |x| x + by)
        }
        (MetricType::Gauge, OpKind::Set) => add(file, key(labels, dialect), |_| v),
        (MetricType::Counter | MetricType::Gauge, OpKind::Init) => {
            add(file, key(labels, dialect), |_| 0.0)
        }
        (MetricType::Histogram, OpKind::Init) => {
            for b in def
                .buckets
                .iter()
                .map(String::as_str)
                .chain(["+Inf", "sum"])
            {
                add(file, with("le", b), |_| 0.0);
            }
        }
        (MetricType::Histogram, OpKind::Observe) => {
            let bounds: Vec<f64> = def
                .buckets
                .iter()
                .map(|b| b.parse().expect("validated"))
                .collect();
            let bucket = match bounds.iter().position(|&b| b >= v) {
                Some(i) => def.buckets[i].as_str(),
                None => "+Inf",
            };
            add(file, with("le", bucket), |x| x + 1.0);
            add(file, with("le", "sum"), |x| x + v);
        }
        (MetricType::Summary, OpKind::Init) => {
            add(file, with("quantile", "count"), |_| 0.0);
            add(file, with("quantile", "sum"), |_| 0.0);
        }
        (MetricType::Summary, OpKind::Observe) => {
            add(file, with("quantile", "count"), |x| x + 1.0);
            add(file, with("quantile", "sum"), |x| x + v);
        }
        (kind, op) => bail!("{}: a {} has no {op:?}", def.name, kind.name()),
    }
    Ok(())
}

/// Every file each process's ops write: name → used region, timestamps zeroed.
pub fn files(
    registry: &Registry,
    processes: &[(Dialect, OpLog)],
) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut files: BTreeMap<String, File> = BTreeMap::new();
    for (dialect, log) in processes {
        for op in &log.ops {
            apply(&mut files, registry, log.pid, *dialect, op)?;
        }
    }
    Ok(files
        .into_iter()
        .map(|(name, entries)| {
            let mut bytes = vec![0u8; 8];
            for (key, value) in entries {
                // `4 + len` padded to a multiple of 8 with spaces, at least one.
                let mut padded = key;
                padded.push(b' ');
                while (4 + padded.len()) % 8 != 0 {
                    padded.push(b' ');
                }
                bytes.extend_from_slice(&(padded.len() as i32).to_le_bytes());
                bytes.extend_from_slice(&padded);
                bytes.extend_from_slice(&value.to_le_bytes());
                bytes.extend_from_slice(&[0u8; 8]);
            }
            let used = bytes.len() as i32;
            bytes[..4].copy_from_slice(&used.to_le_bytes());
            (name, bytes)
        })
        .collect())
}

/// The size of a store file whose used region is `used` bytes long, as
/// client_ruby's `FileMappedDict` sizes it: created at 1 MiB
/// (`INITIAL_FILE_SIZE`), doubled while an entry does not fit.
pub fn file_size(used: usize) -> u64 {
    let mut capacity: u64 = 1024 * 1024;
    while used as u64 > capacity {
        capacity *= 2;
    }
    capacity
}

/// A store file's used region with every entry's timestamp zeroed (what
/// [`files`] gives), read from a file's bytes with plain slicing.
pub fn comparable(bytes: &[u8]) -> Result<Vec<u8>> {
    if bytes.len() < 8 {
        bail!("a store file is at least 8 bytes");
    }
    let used = i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if used < 8 || used as usize > bytes.len() {
        bail!("used = {used} but the file has {} bytes", bytes.len());
    }
    let mut region = bytes[..used as usize].to_vec();
    let mut pos = 8;
    while pos + 4 <= region.len() {
        let len = i32::from_le_bytes([
            region[pos],
            region[pos + 1],
            region[pos + 2],
            region[pos + 3],
        ]);
        let ts = pos + 4 + len.max(0) as usize + 8;
        if len < 0 || ts + 8 > region.len() {
            bail!("entry at {pos} runs past used");
        }
        region[ts..ts + 8].fill(0);
        pos = ts + 8;
    }
    Ok(region)
}

/// Every file of a store directory: name → [`comparable`] bytes.
pub fn read_dir(dir: &std::path::Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let bytes = std::fs::read(entry.path())?;
        out.insert(
            name.clone(),
            comparable(&bytes).map_err(|e| e.context(name))?,
        );
    }
    Ok(out)
}
