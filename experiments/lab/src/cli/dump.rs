//! `promlab dump --store DIR [FILE...]`: every entry of every store file —
//! metric, process, decoded labels, value, timestamp, and which entries a
//! scrape leaves out and why — as text, or as JSON lines (`--json`). Reads
//! files through the library's reader ([`promlab::export::dump`]), so what
//! it calls corrupt is what a scrape skips.

use anyhow::{bail, Context, Result};
use promlab::export::dump::{dump_file, EntryDump, FileDump};
use promlab::format::storefile::parse_file_name;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

/// `promlab dump`.
#[derive(clap::Args, Debug)]
pub struct DumpArgs {
    /// Store directory (client_ruby DirectFileStore layout).
    #[arg(long)]
    pub store: PathBuf,
    /// Files to dump: names in the store directory, or paths. Default: every
    /// `metric_<name>___<id>.bin` file of the store, in name order.
    pub files: Vec<PathBuf>,
    /// One JSON object a line: a `"file"` record per file, then an `"entry"`
    /// record per entry.
    #[arg(long)]
    pub json: bool,
}

/// Prints the dump; fails (after printing the rest) when a file could not be read at all.
pub fn dump(args: DumpArgs) -> Result<()> {
    let files = if args.files.is_empty() {
        store_files(&args.store)?
    } else {
        args.files
            .iter()
            .map(|f| {
                if f.is_absolute() || f.components().count() > 1 {
                    f.clone()
                } else {
                    args.store.join(f)
                }
            })
            .collect()
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut failed = 0;
    for path in &files {
        let shown = path
            .strip_prefix(&args.store)
            .unwrap_or(path)
            .display()
            .to_string();
        match dump_file(path) {
            Ok(file) if args.json => write_json(&mut out, &shown, &file)?,
            Ok(file) => write_text(&mut out, &shown, &file)?,
            Err(e) => {
                failed += 1;
                if args.json {
                    writeln!(
                        out,
                        "{}",
                        json!({"record": "file", "file": shown, "error": e.to_string()})
                    )?;
                } else {
                    writeln!(out, "# {shown}: cannot read: {e}")?;
                }
            }
        }
    }
    out.flush()?;
    if failed > 0 {
        bail!("{failed} of {} files could not be read", files.len());
    }
    Ok(())
}

/// The store's files, by name.
fn store_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read store directory {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| parse_file_name(e.file_name().as_encoded_bytes()).is_some())
        .map(|e| e.path())
        .collect();
    files.sort();
    Ok(files)
}

/// "pid 123", "fold file 12345678 (exited processes)", or "?".
fn process(file: &FileDump) -> String {
    match (&file.id, file.fold) {
        (Some(id), true) => format!("fold {id}"),
        (Some(id), false) => id.clone(),
        (None, _) => "?".to_owned(),
    }
}

fn number(v: f64) -> String {
    promlab::format::rubyfloat::to_s(v)
}

fn write_text(out: &mut impl Write, shown: &str, file: &FileDump) -> Result<()> {
    let corrupt = file.entries.iter().filter(|e| e.labels.is_err()).count();
    writeln!(
        out,
        "# {shown}: metric {}, process {}, {} bytes, used {}, {} entries ({corrupt} corrupt){}",
        file.metric.as_deref().unwrap_or("?"),
        process(file),
        file.size,
        file.used.map_or("-".to_owned(), |u| u.to_string()),
        file.entries.len(),
        file.error
            .as_ref()
            .map_or(String::new(), |e| format!("; FILE CORRUPT: {e}")),
    )?;
    let metric = file.metric.as_deref().unwrap_or("?");
    for entry in &file.entries {
        let at = entry.offset;
        match &entry.labels {
            Ok(labels) => {
                let labels: Vec<String> = labels
                    .iter()
                    .map(|(n, v)| format!("{n}={}", serde_json::to_string(v).expect("string")))
                    .collect();
                writeln!(
                    out,
                    "{shown}@{at} {metric}{{{}}} {} timestamp={} process={}",
                    labels.join(","),
                    number(entry.value),
                    number(entry.timestamp),
                    process(file)
                )?;
            }
            Err((reason, why)) => writeln!(
                out,
                "{shown}@{at} CORRUPT {} ({why}): key {} value {} timestamp={} process={}",
                reason.name(),
                raw_key(entry),
                number(entry.value),
                number(entry.timestamp),
                process(file)
            )?,
        }
    }
    Ok(())
}

fn raw_key(entry: &EntryDump) -> String {
    serde_json::to_string(&String::from_utf8_lossy(&entry.raw_key)).expect("string")
}

/// A float as JSON: a number, or "NaN", "+Inf", "-Inf" as Prometheus's API writes them.
fn json_float(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else if v.is_nan() {
        json!("NaN")
    } else if v > 0.0 {
        json!("+Inf")
    } else {
        json!("-Inf")
    }
}

fn write_json(out: &mut impl Write, shown: &str, file: &FileDump) -> Result<()> {
    let corrupt = file.entries.iter().filter(|e| e.labels.is_err()).count();
    let record = json!({
        "record": "file", "file": shown, "metric": file.metric, "process": file.id,
        "fold": file.fold, "size": file.size, "used": file.used,
        "entries": file.entries.len(), "corrupt_entries": corrupt, "error": file.error,
    });
    writeln!(out, "{record}")?;
    for entry in &file.entries {
        let mut record = json!({
            "record": "entry", "file": shown, "metric": file.metric, "process": file.id,
            "offset": entry.offset, "key": String::from_utf8_lossy(&entry.raw_key),
            "value": json_float(entry.value), "timestamp": json_float(entry.timestamp),
        });
        match &entry.labels {
            Ok(labels) => {
                let map: serde_json::Map<String, Value> =
                    labels.iter().map(|(n, v)| (n.clone(), json!(v))).collect();
                record["labels"] = Value::Object(map);
            }
            Err((reason, why)) => {
                record["corrupt"] = json!(reason.name());
                record["error"] = json!(why);
            }
        }
        writeln!(out, "{record}")?;
    }
    Ok(())
}
