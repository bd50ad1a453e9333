//! Checking what the servers expose: each line of the sidecar's scrapes read by
//! the library's parser (`promlab::scenarios::scrape_to_remote_write`, the way Prometheus's scraper reads
//! the text format), the good counter's total, and the receiver's own counters
//! from its `/metrics`.

use super::server::Server;
use super::{truncate, GOOD_COUNTER};
use crate::http_client::Client;
use anyhow::Result;
use promlab::scenarios::scrape_to_remote_write::{self, ScrapedSample};
use std::collections::BTreeMap;
use std::time::Duration;

/// What the receiver counted, from its own /metrics, against what the clients saw.
pub(super) struct Accounting {
    /// `promlab_ingest_samples_total`, every `promlab_ingest_samples_<reason>_total`
    /// and `promlab_receiver_samples_dropped_total` (samples counted and dropped
    /// past a limit, summed over reasons).
    pub(super) counters: BTreeMap<String, f64>,
    /// `promlab_receiver_samples_dropped_total` by its `reason` label.
    pub(super) dropped_by_reason: BTreeMap<String, f64>,
    pub(super) error: Option<String>,
}

pub(super) fn receiver_accounting(rx: &Server) -> Accounting {
    rx.watch();
    let client = Client::new(Some(Duration::from_secs(10)), 1);
    match client.get(&rx.url("/metrics"), &[]) {
        Ok(r) if r.status == 200 => {
            let text = r.text();
            let mut counters = parse_flat(&text, "promlab_ingest_samples_");
            counters.extend(parse_flat(&text, "promlab_receiver_samples_dropped_"));
            Accounting {
                counters,
                dropped_by_reason: dropped_by_reason(&text),
                error: None,
            }
        }
        Ok(r) => Accounting {
            counters: BTreeMap::new(),
            dropped_by_reason: BTreeMap::new(),
            error: Some(format!("/metrics answered {}", r.status)),
        },
        Err(e) => Accounting {
            counters: BTreeMap::new(),
            dropped_by_reason: BTreeMap::new(),
            error: Some(format!("/metrics: {e:#}")),
        },
    }
}

/// The samples of an exposition's lines that parse (the others are left out).
fn samples(text: &str) -> impl Iterator<Item = ScrapedSample> + '_ {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| scrape_to_remote_write::parse_line(l).ok())
}

/// `promlab_receiver_samples_dropped_total{reason="…"}`, by reason.
fn dropped_by_reason(text: &str) -> BTreeMap<String, f64> {
    samples(text)
        .filter(|s| s.name == "promlab_receiver_samples_dropped_total")
        .filter_map(|s| match &s.labels[..] {
            [(name, reason)] if name == "reason" => Some((reason.clone(), s.value)),
            _ => None,
        })
        .collect()
}

/// Every sample of the families whose name starts with `prefix` and ends in
/// `_total`, summed over their labels.
fn parse_flat(text: &str, prefix: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for s in samples(text).filter(|s| s.name.starts_with(prefix) && s.name.ends_with("_total")) {
        *out.entry(s.name).or_default() += s.value;
    }
    out
}

/// One scrape of the sidecar, checked.
pub(super) struct ScrapeCheck {
    /// The good counter's value, if it was served.
    pub(super) good_total: Option<f64>,
    /// The first line Prometheus would reject, and why.
    pub(super) invalid: Option<String>,
}

/// Reads every line of a scrape with the library's parser
/// ([`scrape_to_remote_write::parse_line`]): the good counter's value, and the first line
/// Prometheus would reject (an exposition that is not UTF-8 is rejected whole).
pub(super) fn check_scrape(body: &[u8]) -> ScrapeCheck {
    let text = match std::str::from_utf8(body) {
        Ok(text) => text,
        Err(e) => {
            return ScrapeCheck {
                good_total: None,
                invalid: Some(format!("not UTF-8: {e}")),
            }
        }
    };
    let mut check = ScrapeCheck {
        good_total: None,
        invalid: None,
    };
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        match scrape_to_remote_write::parse_line(line) {
            Ok(s) if is_good_series(&s) => check.good_total = Some(s.value),
            Ok(_) => {}
            Err(e) if check.invalid.is_none() => {
                check.invalid = Some(format!("invalid line {:?}: {e:#}", truncate(line, 80)));
            }
            Err(_) => {}
        }
    }
    check
}

/// The good counter: `soak_jobs_total{queue="default"}`.
fn is_good_series(s: &ScrapedSample) -> bool {
    s.name == GOOD_COUNTER && s.labels == [("queue".to_owned(), "default".to_owned())]
}

/// After the run: one scrape of the clean store (10 s timeout), the good counter's total.
pub(super) fn final_total(sidecar: &Server) -> Result<f64, String> {
    sidecar.watch();
    let client = Client::new(Some(Duration::from_secs(10)), 1);
    match client.get(&sidecar.url("/metrics"), &[]) {
        Ok(r) if r.status == 200 => check_scrape(&r.body)
            .good_total
            .ok_or_else(|| "the good series is missing".into()),
        Ok(r) => Err(format!("{}: {}", r.status, truncate(r.text().trim(), 160))),
        Err(e) => Err(format!("{e:#}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the hand-written validator this replaced accepted and refused.
    #[test]
    fn scrapes_are_read_as_prometheus_reads_them() {
        let invalid = |text: &[u8]| check_scrape(text).invalid;
        assert_eq!(invalid(b"# HELP a b\n# TYPE a counter\n"), None);
        assert_eq!(invalid(b"a_total 1.0\n"), None);
        assert_eq!(invalid(br#"a{k="v",l="x\"y\\z\n"} 1"#), None);
        for bad in [
            &br#"a{co de="x"} 1"#[..],
            br#"a{k="v} 1"#,
            b"a",
            b"1a 1",
            b"a one",
            b"a{k=\"\xff\"} 1",
        ] {
            assert!(invalid(bad).is_some(), "{:?}", String::from_utf8_lossy(bad));
        }
        let check = check_scrape(
            b"# TYPE soak_jobs_total counter\nsoak_jobs_total{queue=\"default\"} 40000.0\nsoak_jobs_total{queue=\"other\"} 3.0\n",
        );
        assert_eq!(check.good_total, Some(40000.0));
        assert_eq!(check.invalid, None);
    }

    #[test]
    fn receiver_counters() {
        let text = "# TYPE promlab_ingest_samples_total counter\npromlab_ingest_samples_total 10\npromlab_ingest_samples_dropped_total{reason=\"a\"} 2\npromlab_ingest_samples_dropped_total{reason=\"b\"} 3\npromlab_sketch_bins 9\npromlab_receiver_samples_dropped_total{reason=\"groups\"} 4\n";
        let counters = parse_flat(text, "promlab_ingest_samples_");
        assert_eq!(counters["promlab_ingest_samples_total"], 10.0);
        assert_eq!(counters["promlab_ingest_samples_dropped_total"], 5.0);
        assert_eq!(counters.len(), 2);
        assert_eq!(
            dropped_by_reason(text),
            BTreeMap::from([("groups".to_owned(), 4.0)])
        );
    }
}
