//! The naive exporter and renderer: a client_ruby store directory and its
//! registry in, the text exposition out, byte for byte what client_ruby's
//! `Formats::Text.marshal` prints.
//!
//! Written from the format description alone (store layout, form-encoded keys,
//! aggregation modes, exposition layout), with none of the production code:
//! each file is read whole and walked entry by entry with plain slicing, each
//! key decoded as Ruby's `URI.decode_www_form` reads it ([`decode_key`]: an
//! algorithm of its own, written from the form-encoding rules, not from
//! `formenc`'s decoders; `tests/reference.rs` compares them), values aggregated in
//! `Vec`s searched linearly, and lines printed with plain loops. Floats print
//! through [`crate::format::rubyfloat::write_reference`]: the slow, obviously-correct
//! `Float#to_s` (shortest round-trip digits from `{:e}`), which
//! `tests/ruby_float.rs` checks against all 10,119 lines Ruby printed in
//! `tests/fixtures/ruby-float/to_s.tsv`; reusing it here is therefore reusing
//! an independently verified oracle, not the code under test.

use crate::format::registry::{MetricDef, MetricType, ProcessAggregation, Registry};
use anyhow::{bail, Context, Result};
use std::path::Path;

/// A decoded label set, in key order.
pub type Labels = Vec<(Vec<u8>, Vec<u8>)>;

/// One entry of a store file.
#[derive(Clone, Debug, PartialEq)]
pub struct RawEntry {
    /// The key without its padding.
    pub key: Vec<u8>,
    /// How many spaces and NULs followed it (client_ruby writes 1 to 8).
    pub padding: usize,
    pub value: f64,
    pub timestamp: f64,
}

/// Every entry of one store file's bytes, in file order.
pub fn read_entries(bytes: &[u8]) -> Result<Vec<RawEntry>> {
    if bytes.len() < 8 {
        bail!("a store file is at least 8 bytes, this one {}", bytes.len());
    }
    let used = i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if used < 8 || used as usize > bytes.len() {
        bail!("used = {used} but the file has {} bytes", bytes.len());
    }
    let used = used as usize;
    let mut entries = Vec::new();
    let mut pos = 8;
    while pos < used {
        if pos + 4 > used {
            bail!("entry at {pos} is cut off");
        }
        let len = i32::from_le_bytes([bytes[pos], bytes[pos + 1], bytes[pos + 2], bytes[pos + 3]]);
        // client_ruby pads every key with at least one space: a length of 0
        // is not an entry any writer wrote.
        if len < 1 {
            bail!("entry at {pos} has key length {len}");
        }
        let key_end = pos + 4 + len as usize;
        if key_end + 16 > used {
            bail!("entry at {pos} runs past used ({used})");
        }
        let padded = &bytes[pos + 4..key_end];
        // Ruby's `unpack("A*")`: drop trailing spaces and NULs.
        let mut end = padded.len();
        while end > 0 && (padded[end - 1] == b' ' || padded[end - 1] == 0) {
            end -= 1;
        }
        let f = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            f64::from_le_bytes(b)
        };
        entries.push(RawEntry {
            key: padded[..end].to_vec(),
            padding: padded.len() - end,
            value: f(key_end),
            timestamp: f(key_end + 8),
        });
        pos = key_end + 16;
    }
    Ok(entries)
}

/// Form-decodes one component as Ruby's `URI.decode_www_form_component`
/// does (client_ruby's store keys are `application/x-www-form-urlencoded`,
/// WHATWG URL § 5 with the URI percent-encoding of RFC 3986 § 2.1): a `%` not
/// followed by two hex digits makes the component invalid (Ruby checks
/// `/%(?!\h\h)/` before decoding and raises); then `+` is a space and `%XX`
/// the byte `0xXX`.
///
/// Two passes, each doing one thing: the validity check alone, then the
/// component cut at every `%` — the first piece is plain text, each later
/// piece starts with the two hex digits of one byte.
pub fn decode_component(s: &[u8]) -> Result<Vec<u8>> {
    for (at, _) in s.iter().enumerate().filter(|&(_, &b)| b == b'%') {
        let digits = s.get(at + 1..at + 3).unwrap_or_default();
        if digits.len() != 2 || !digits.iter().all(u8::is_ascii_hexdigit) {
            bail!(
                "`%` at {at} of {:?} is not followed by two hex digits",
                String::from_utf8_lossy(s)
            );
        }
    }
    let plain = |piece: &[u8]| -> Vec<u8> {
        piece
            .iter()
            .map(|&b| if b == b'+' { b' ' } else { b })
            .collect()
    };
    let mut pieces = s.split(|&b| b == b'%');
    let mut out = plain(pieces.next().unwrap_or_default());
    for piece in pieces {
        let (digits, rest) = piece.split_at(2);
        let digits = std::str::from_utf8(digits).expect("checked: two hex digits");
        out.push(u8::from_str_radix(digits, 16).expect("checked: two hex digits"));
        out.extend(plain(rest));
    }
    Ok(out)
}

/// Decodes a store key (`a=1&b=x+y`) into its label pairs, in key order, as
/// Ruby's `URI.decode_www_form` reads it (client_ruby 5.x; 4.2.5's `CGI.parse`
/// reads what client_ruby writes the same way): the key must be ASCII; it is
/// read record by record as `each_line('&')` yields them, each without its
/// `&` (so a trailing `&` ends the key and yields nothing more); a record is
/// cut at its first `=` into name and value (no `=`: the value is empty);
/// each side decodes as [`decode_component`].
pub fn decode_key(key: &[u8]) -> Result<Labels> {
    if let Some(at) = key.iter().position(|b| !b.is_ascii()) {
        bail!("byte {at} of the key is not ASCII");
    }
    let mut labels = Labels::new();
    let mut rest = key;
    while !rest.is_empty() {
        let (record, after) = match rest.iter().position(|&b| b == b'&') {
            Some(amp) => (&rest[..amp], &rest[amp + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        let (name, value) = match record.iter().position(|&b| b == b'=') {
            Some(eq) => (&record[..eq], &record[eq + 1..]),
            None => (record, &record[record.len()..]),
        };
        labels.push((decode_component(name)?, decode_component(value)?));
        rest = after;
    }
    Ok(labels)
}

/// Whether a file name is `metric_<name>___<digits>.bin`.
fn is_file_of(file_name: &str, name: &str) -> bool {
    let Some(pid) = file_name
        .strip_suffix(".bin")
        .and_then(|s| s.strip_prefix("metric_"))
        .and_then(|s| s.strip_prefix(name))
        .and_then(|s| s.strip_prefix("___"))
    else {
        return false;
    };
    !pid.is_empty() && pid.chars().all(|c| c.is_ascii_digit())
}

/// A file of the one-file-per-process layout (client_ruby's
/// `poc_file_per_process` branch): `metrics___<pid>.bin`, every metric of
/// one process, each key naming its metric in a `___metric_name` label.
fn is_process_file(file_name: &str) -> bool {
    file_name
        .strip_suffix(".bin")
        .and_then(|s| s.strip_prefix("metrics___"))
        .is_some_and(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()))
}

/// The label a key of the one-file-per-process layout names its metric by.
const METRIC_NAME_LABEL: &[u8] = b"___metric_name";

/// A one-file-per-process key's labels if it belongs to metric `name`: the
/// first `___metric_name` label names the metric and is taken out, the
/// others must be servable as they stand.
fn process_file_labels(key: &[u8], name: &str) -> Option<Labels> {
    let mut labels = decode_key(key).ok()?;
    let at = labels.iter().position(|(n, _)| n == METRIC_NAME_LABEL)?;
    if labels[at].1 != name.as_bytes() {
        return None;
    }
    labels.remove(at);
    servable(labels)
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`, written out.
fn valid_label_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.iter().enumerate().all(|(i, &c)| {
            c == b'_'
                || c.is_ascii_uppercase()
                || c.is_ascii_lowercase()
                || (i > 0 && c.is_ascii_digit())
        })
}

/// A key's labels if the key is one the exporter serves: ASCII, decodable,
/// no empty or repeated label name, every name a Prometheus label name that
/// does not start with `__` (reserved), every value UTF-8.
fn servable_labels(key: &[u8]) -> Option<Labels> {
    servable(decode_key(key).ok()?)
}

fn servable(labels: Labels) -> Option<Labels> {
    for (i, (name, value)) in labels.iter().enumerate() {
        if !valid_label_name(name)
            || name.starts_with(b"__")
            || std::str::from_utf8(value).is_err()
            || labels[i + 1..].iter().any(|(other, _)| other == name)
        {
            return None;
        }
    }
    Some(labels)
}

/// Every (label set, value, timestamp) of one metric, in sorted file order:
/// the metric's own files and the one-file-per-process layout's files (the
/// former sort first: `metric_` before `metrics`), the latter's entries of
/// other metrics left out. A file that is not a regular file or not a whole store file counts for
/// nothing; an entry whose key is not servable is left out.
fn metric_entries(dir: &Path, name: &str) -> Result<Vec<(Labels, f64, f64)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let file_name = entry?.file_name();
        if file_name
            .to_str()
            .is_some_and(|f| is_file_of(f, name) || is_process_file(f))
        {
            files.push(file_name);
        }
    }
    files.sort_by(|a, b| a.as_encoded_bytes().cmp(b.as_encoded_bytes()));
    let mut out = Vec::new();
    for file_name in files {
        let path = dir.join(&file_name);
        if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        // A file being created (shorter than its `used`) reads as empty.
        if bytes.len() < 4 {
            continue;
        }
        let bytes = if bytes[..4] == [0; 4] {
            Vec::new()
        } else {
            bytes
        };
        if bytes.is_empty() {
            continue;
        }
        let Ok(entries) = read_entries(&bytes) else {
            continue;
        };
        // A key padded with more than eight spaces is not one client_ruby wrote.
        let per_process = file_name.to_str().is_some_and(is_process_file);
        for e in entries.into_iter().filter(|e| e.padding <= 8) {
            let labels = if per_process {
                process_file_labels(&e.key, name)
            } else {
                servable_labels(&e.key)
            };
            if let Some(labels) = labels {
                out.push((labels, e.value, e.timestamp));
            }
        }
    }
    Ok(out)
}

/// The label sets of one metric with their values aggregated across processes,
/// in order of first appearance.
fn aggregate(entries: Vec<(Labels, f64, f64)>, mode: ProcessAggregation) -> Vec<(Labels, f64)> {
    // (labels, value, timestamp) in order of first appearance, found through a BTreeMap.
    let mut series: Vec<(Labels, f64, f64)> = Vec::new();
    let mut index: std::collections::BTreeMap<Labels, usize> = std::collections::BTreeMap::new();
    for (labels, value, ts) in entries {
        let Some(&i) = index.get(&labels) else {
            index.insert(labels.clone(), series.len());
            series.push((labels, value, ts));
            continue;
        };
        let s = &mut series[i];
        match mode {
            ProcessAggregation::Sum => s.1 += value,
            // Ruby keeps the first of equals (and raises on NaN); here NaN is
            // a missing value: any number beats it, whatever the file order.
            ProcessAggregation::Max => {
                if (s.1.is_nan() && !value.is_nan()) || value > s.1 {
                    s.1 = value
                }
            }
            ProcessAggregation::Min => {
                if (s.1.is_nan() && !value.is_nan()) || value < s.1 {
                    s.1 = value
                }
            }
            ProcessAggregation::MostRecent => {
                if ts > s.2 {
                    s.1 = value;
                    s.2 = ts;
                }
            }
            ProcessAggregation::All => {}
        }
    }
    series.into_iter().map(|(l, v, _)| (l, v)).collect()
}

fn escape(out: &mut Vec<u8>, s: &[u8], quote: bool) {
    for &b in s {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'"' if quote => out.extend_from_slice(b"\\\""),
            b => out.push(b),
        }
    }
}

/// `name{a="x",b="y"} value\n` (no braces without labels; `None` prints empty).
pub(crate) fn line(out: &mut Vec<u8>, name: &str, labels: &[(&[u8], &[u8])], value: Option<f64>) {
    out.extend_from_slice(name.as_bytes());
    if !labels.is_empty() {
        out.push(b'{');
        for (i, (n, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(n);
            out.extend_from_slice(b"=\"");
            escape(out, v, true);
            out.push(b'"');
        }
        out.push(b'}');
    }
    out.push(b' ');
    if let Some(v) = value {
        crate::format::rubyfloat::write_reference(out, v);
    }
    out.push(b'\n');
}

fn pairs(labels: &Labels) -> Vec<(&[u8], &[u8])> {
    labels.iter().map(|(n, v)| (&n[..], &v[..])).collect()
}

/// A histogram or summary: the label sets without `slot_name`, in order of
/// first appearance, each with its (slot value, value) pairs in order.
type SlotGroups = Vec<(Labels, Vec<(Vec<u8>, f64)>)>;

fn group_by_slot(series: Vec<(Labels, f64)>, slot_name: &[u8]) -> SlotGroups {
    let mut groups: SlotGroups = Vec::new();
    let mut index: std::collections::BTreeMap<Labels, usize> = std::collections::BTreeMap::new();
    for (labels, value) in series {
        let mut rest = Labels::new();
        let mut slot = Vec::new(); // a missing slot label is Ruby's `nil.to_s`, ""
        for (n, v) in labels {
            if n == slot_name {
                slot = v;
            } else {
                rest.push((n, v));
            }
        }
        match index.get(&rest) {
            Some(&i) => groups[i].1.push((slot, value)),
            None => {
                index.insert(rest.clone(), groups.len());
                groups.push((rest, vec![(slot, value)]));
            }
        }
    }
    groups
}

/// `# TYPE` and `# HELP` of a family (help escapes `\` and newline).
pub(crate) fn header(out: &mut Vec<u8>, name: &str, kind: MetricType, help: &[u8]) {
    out.extend_from_slice(format!("# TYPE {name} {}\n# HELP {name} ", kind.name()).as_bytes());
    escape(out, help, false);
    out.push(b'\n');
}

fn write_metric(out: &mut Vec<u8>, def: &MetricDef, series: Vec<(Labels, f64)>) {
    header(out, &def.name, def.kind, def.help.as_bytes());
    match def.kind {
        MetricType::Counter | MetricType::Gauge => {
            for (labels, value) in &series {
                line(out, &def.name, &pairs(labels), Some(*value));
            }
        }
        MetricType::Histogram => {
            for (labels, slots) in group_by_slot(series, b"le") {
                // Ruby's hash: declared buckets first (0.0), then other `le`s
                // as they appear; a later entry for the same `le` replaces.
                let mut hash: Vec<(Vec<u8>, f64)> = def
                    .buckets
                    .iter()
                    .map(|b| (b.as_bytes().to_vec(), 0.0))
                    .collect();
                for (le, v) in slots {
                    match hash.iter_mut().find(|(k, _)| *k == le) {
                        Some(slot) => slot.1 = v,
                        None => hash.push((le, v)),
                    }
                }
                // accumulate_buckets: cumulative over the declared buckets, the rest to +Inf.
                let mut acc = 0.0;
                for (_, value) in hash.iter_mut().take(def.buckets.len()) {
                    let own = *value;
                    *value += acc;
                    acc += own;
                }
                match hash.iter_mut().find(|(k, _)| k == b"+Inf") {
                    Some(inf) => inf.1 += acc,
                    None => hash.push((b"+Inf".to_vec(), acc)),
                }
                let bucket_name = format!("{}_bucket", def.name);
                let base = pairs(&labels);
                let mut sum = None;
                let mut count = 0.0;
                for (le, v) in &hash {
                    if le == b"sum" {
                        sum = Some(*v);
                        continue;
                    }
                    if le == b"+Inf" {
                        count = *v;
                    }
                    let mut with_le = base.clone();
                    with_le.push((b"le", le));
                    line(out, &bucket_name, &with_le, Some(*v));
                }
                // Without a `sum` entry, no `_sum` line (Ruby's has no value,
                // which Prometheus refuses).
                if sum.is_some() {
                    line(out, &format!("{}_sum", def.name), &base, sum);
                }
                line(out, &format!("{}_count", def.name), &base, Some(count));
            }
        }
        MetricType::Summary => {
            for (labels, slots) in group_by_slot(series, b"quantile") {
                let (mut sum, mut count) = (0.0, 0.0);
                for (q, v) in slots {
                    match &q[..] {
                        b"sum" => sum = v,
                        b"count" => count = v,
                        _ => {}
                    }
                }
                let base = pairs(&labels);
                line(out, &format!("{}_sum", def.name), &base, Some(sum));
                line(out, &format!("{}_count", def.name), &base, Some(count));
            }
        }
    }
}

/// The exposition client_ruby prints for the store in `dir`.
pub fn export(dir: &Path, registry: &Registry) -> Result<Vec<u8>> {
    if !dir.is_dir() {
        bail!("store directory {} does not exist", dir.display());
    }
    let mut out = Vec::new();
    for def in &registry.metrics {
        let entries =
            metric_entries(dir, &def.name).with_context(|| format!("metric {}", def.name))?;
        write_metric(&mut out, def, aggregate(entries, def.aggregation()));
    }
    Ok(out)
}

/// The first line of `text` a Prometheus text-format parser would refuse for
/// its series' name or labels, with why; `None` if every line is acceptable.
/// Checked, written out plainly: the text is UTF-8; each sample line is a
/// metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`), then optionally `{` label
/// pairs `name="value"` separated by `,` `}`, then a space and a value; a
/// label name is `[a-zA-Z_][a-zA-Z0-9_]*`, does not start with `__` and
/// appears once; a value escapes only `\\`, `\"` and `\n`.
pub fn exposition_fault(text: &[u8]) -> Option<String> {
    let Ok(text) = std::str::from_utf8(text) else {
        return Some("the exposition is not UTF-8".to_owned());
    };
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Err(why) = check_sample_line(line) {
            return Some(format!("line {}: {why}: {line:?}", n + 1));
        }
    }
    None
}

fn check_sample_line(line: &str) -> std::result::Result<(), String> {
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() && bytes[i] != b'{' && bytes[i] != b' ' {
        i += 1;
    }
    let name = &bytes[..i];
    let name_ok = !name.is_empty()
        && name.iter().enumerate().all(|(k, &c)| {
            c == b'_' || c == b':' || c.is_ascii_alphabetic() || (k > 0 && c.is_ascii_digit())
        });
    if !name_ok {
        return Err("bad metric name".to_owned());
    }
    let mut seen: Vec<&[u8]> = Vec::new();
    if bytes.get(i) == Some(&b'{') {
        i += 1;
        loop {
            if bytes.get(i) == Some(&b'}') {
                i += 1;
                break;
            }
            let start = i;
            while i < bytes.len() && bytes[i] != b'=' {
                i += 1;
            }
            let label = &bytes[start..i];
            if !valid_label_name(label) {
                return Err(format!(
                    "bad label name {:?}",
                    String::from_utf8_lossy(label)
                ));
            }
            if label.starts_with(b"__") {
                return Err("reserved label name".to_owned());
            }
            if seen.contains(&label) {
                return Err("repeated label name".to_owned());
            }
            seen.push(label);
            if bytes.get(i + 1) != Some(&b'"') {
                return Err("label value not quoted".to_owned());
            }
            i += 2;
            loop {
                match bytes.get(i) {
                    None => return Err("unterminated label value".to_owned()),
                    Some(b'"') => break,
                    Some(b'\\') => match bytes.get(i + 1) {
                        Some(b'\\' | b'"' | b'n') => i += 2,
                        _ => return Err("bad escape in a label value".to_owned()),
                    },
                    Some(b'\n') => return Err("newline in a label value".to_owned()),
                    Some(_) => i += 1,
                }
            }
            i += 1;
            match bytes.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => {}
                _ => return Err("expected , or } after a label".to_owned()),
            }
        }
    }
    if bytes.get(i) != Some(&b' ') || i + 1 >= bytes.len() {
        return Err("no value".to_owned());
    }
    Ok(())
}
