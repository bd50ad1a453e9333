//! The scrape converter: a text exposition, read the way Prometheus's scraper
//! reads it, into remote-write requests, so an exposition can flow into ingest.
//!
//! - [`parse`]: each sample line's metric name, labels and value (comments and
//!   blank lines skipped; label values unescape `\\`, `\"`, `\n`; values parse
//!   as Go's `ParseFloat` does, `Infinity`/`NaN` included); [`parse_line`]: one line;
//! - [`requests`]: every sample of a sequence of scrapes stamped with its
//!   scrape's timestamp and given the target labels (`job`, `instance`; an
//!   exposed label of the same name becomes `exported_<name>`), as one
//!   one-sample series each (labels sorted by name, empty-valued labels dropped,
//!   as Prometheus stores them), cut into requests of at most
//!   `max_samples_per_send` samples in scrape order, as its remote-write queue sends them;
//! - [`body`]: a request as sent, protobuf in a snappy block.

use crate::ingest::wire::{self, Label, Sample, TimeSeries, WriteRequest};
use anyhow::{bail, Context, Result};
use prost::Message;

/// One sample line of an exposition.
#[derive(Clone, Debug, PartialEq)]
pub struct ScrapedSample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

fn is_name_byte(b: u8, first: bool) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b == b':' || (!first && b.is_ascii_digit())
}

/// Every sample of an exposition, in order.
pub fn parse(exposition: &[u8]) -> Result<Vec<ScrapedSample>> {
    let text = std::str::from_utf8(exposition).context("the exposition is not UTF-8")?;
    let mut samples = Vec::new();
    for (n, line) in text.split('\n').enumerate() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        samples.push(parse_line(line).with_context(|| format!("line {}: {line:?}", n + 1))?);
    }
    Ok(samples)
}

/// One sample line (not a comment, not blank), as Prometheus's text parser
/// reads it; an error says what it would reject.
pub fn parse_line(line: &str) -> Result<ScrapedSample> {
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() && is_name_byte(bytes[i], i == 0) {
        i += 1;
    }
    if i == 0 {
        bail!("no metric name");
    }
    let name = line[..i].to_string();
    let mut labels = Vec::new();
    if bytes.get(i) == Some(&b'{') {
        i += 1;
        loop {
            if bytes.get(i) == Some(&b'}') {
                i += 1;
                break;
            }
            let start = i;
            while i < bytes.len() && is_name_byte(bytes[i], i == start) && bytes[i] != b':' {
                i += 1;
            }
            if i == start || bytes.get(i) != Some(&b'=') || bytes.get(i + 1) != Some(&b'"') {
                bail!("bad label at byte {start}");
            }
            let label = line[start..i].to_string();
            i += 2;
            let mut value = Vec::new();
            loop {
                match bytes.get(i) {
                    None => bail!("unterminated label value"),
                    Some(b'"') => break,
                    Some(b'\\') => {
                        match bytes.get(i + 1) {
                            Some(b'n') => value.push(b'\n'),
                            Some(b'\\') => value.push(b'\\'),
                            Some(b'"') => value.push(b'"'),
                            Some(&other) => value.extend_from_slice(&[b'\\', other]),
                            None => bail!("unterminated label value"),
                        }
                        i += 2;
                    }
                    Some(&b) => {
                        value.push(b);
                        i += 1;
                    }
                }
            }
            i += 1; // closing quote
            labels.push((
                label,
                String::from_utf8(value).expect("split at ASCII bytes of UTF-8"),
            ));
            match bytes.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => {}
                _ => bail!("expected `,` or `}}` at byte {i}"),
            }
        }
    }
    if bytes.get(i) != Some(&b' ') {
        bail!("expected a space before the value");
    }
    let rest = &line[i + 1..];
    let value_text = rest.split(' ').next().unwrap_or("");
    let value = parse_value(value_text).with_context(|| format!("value {value_text:?}"))?;
    Ok(ScrapedSample {
        name,
        labels,
        value,
    })
}

/// Go's `strconv.ParseFloat`: decimal and exponent forms, `Inf`/`Infinity`/`NaN` in any case, signed.
fn parse_value(s: &str) -> Result<f64> {
    if s.is_empty() {
        bail!("empty value");
    }
    s.parse::<f64>().ok().context("not a float")
}

/// The requests a Prometheus remote-write queue sends for `scrapes`
/// (timestamp in ms, that scrape's samples), with `target` labels added.
pub fn requests(
    scrapes: &[(i64, Vec<ScrapedSample>)],
    target: &[(&str, &str)],
    max_samples_per_send: usize,
) -> Vec<WriteRequest> {
    let mut out = Vec::new();
    let mut current = WriteRequest::default();
    for (timestamp, samples) in scrapes {
        for s in samples {
            // `honor_labels: false`: an exposed label that a target label
            // also names is kept as `exported_<name>`.
            let exposed = s.labels.iter().map(|(n, v)| {
                let clashes = target.iter().any(|(t, _)| t == n);
                let name = if clashes {
                    format!("exported_{n}")
                } else {
                    n.clone()
                };
                (name, v.as_str())
            });
            let mut labels: Vec<Label> = std::iter::once(("__name__".to_string(), s.name.as_str()))
                .chain(exposed)
                .chain(target.iter().map(|(n, v)| (n.to_string(), *v)))
                .filter(|(_, v)| !v.is_empty())
                .map(|(name, v)| Label {
                    name,
                    value: v.to_string(),
                })
                .collect();
            labels.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
            current.timeseries.push(TimeSeries {
                labels,
                samples: vec![Sample {
                    value: s.value,
                    timestamp: *timestamp,
                }],
            });
            if current.timeseries.len() >= max_samples_per_send.max(1) {
                out.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.timeseries.is_empty() {
        out.push(current);
    }
    out
}

/// A request as sent: protobuf, then snappy's block format.
pub fn body(request: &WriteRequest) -> Vec<u8> {
    wire::compress(&request.encode_to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_client_ruby_prints() {
        let text = b"# TYPE a counter\n# HELP a h\\n\na{x=\"q\\\"b\\\\c\\nd\",y=\"\"} 1.0e+20\nb Infinity\nc_sum{le=\"+Inf\"} -0.0\nd NaN\n";
        let s = parse(text).unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(
            s[0].labels,
            vec![
                ("x".into(), "q\"b\\c\nd".into()),
                ("y".into(), String::new())
            ]
        );
        assert_eq!(s[0].value, 1e20);
        assert_eq!(s[1].value, f64::INFINITY);
        assert!(s[2].value == 0.0 && s[2].value.is_sign_negative());
        assert!(s[3].value.is_nan());
        let reqs = requests(&[(1000, s)], &[("job", "j")], 3);
        assert_eq!(reqs.len(), 2);
        let names: Vec<&str> = reqs[0].timeseries[0]
            .labels
            .iter()
            .map(|l| l.name.as_str())
            .collect();
        assert_eq!(names, ["__name__", "job", "x"]);
        assert!(parse(b"a{x=\"1} 2\n").is_err());
        assert!(parse(b"a 1\nb{} \n").is_err());
    }
}
