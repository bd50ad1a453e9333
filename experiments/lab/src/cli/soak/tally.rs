//! Tallies: requests answered per status, latency, samples in 2xx answers, and
//! what a client saw go wrong.

use crate::http_client::Response;
use anyhow::Result;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Default)]
pub(super) struct Tally {
    outcomes: BTreeMap<String, u64>,
    latencies_us: Vec<u64>,
    /// Samples in requests answered 2xx.
    pub(super) samples_ok: u64,
    /// Scrapes whose good counter was outside what the writers can have written.
    pub(super) out_of_bounds: u64,
    /// Scrapes with an exposition line Prometheus would reject.
    pub(super) invalid: u64,
    /// The last problem seen, for the report.
    pub(super) note: String,
}

impl Tally {
    /// The first problem of a phase is its own; later ones may be the next phase's.
    pub(super) fn note_first(&mut self, note: String) {
        if self.note.is_empty() {
            self.note = note;
        }
    }

    pub(super) fn requests(&self) -> u64 {
        self.outcomes.values().sum()
    }

    pub(super) fn count(&self, pred: impl Fn(&str) -> bool) -> u64 {
        self.outcomes
            .iter()
            .filter(|(k, _)| pred(k))
            .map(|(_, n)| n)
            .sum()
    }

    pub(super) fn p99_ms(&self) -> f64 {
        self.quantile_ms(0.99)
    }

    /// The latency at quantile `q` (nearest rank; 1.0 is the slowest), in ms.
    pub(super) fn quantile_ms(&self, q: f64) -> f64 {
        let mut l = self.latencies_us.clone();
        if l.is_empty() {
            return 0.0;
        }
        l.sort_unstable();
        let rank = ((l.len() as f64 * q).ceil() as usize).clamp(1, l.len());
        l[rank - 1] as f64 / 1000.0
    }

    pub(super) fn outcomes_text(&self) -> String {
        self.outcomes
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[derive(Default)]
pub(super) struct Tallies(Mutex<BTreeMap<String, Tally>>);

impl Tallies {
    pub(super) fn record(&self, name: &str, outcome: &Outcome, elapsed: Duration, samples: u64) {
        let mut all = self.0.lock().unwrap();
        let tally = all.entry(name.to_owned()).or_default();
        *tally.outcomes.entry(outcome.key()).or_default() += 1;
        tally.latencies_us.push(elapsed.as_micros() as u64);
        if outcome.is_success() {
            tally.samples_ok += samples;
        }
        if let Outcome::Failed(e) = outcome {
            tally.note_first(e.clone());
        }
    }

    pub(super) fn with(&self, name: &str, f: impl FnOnce(&mut Tally)) {
        f(self.0.lock().unwrap().entry(name.to_owned()).or_default());
    }

    pub(super) fn into_inner(self) -> BTreeMap<String, Tally> {
        self.0.into_inner().unwrap()
    }
}

/// What a request got: an HTTP status, or no answer.
pub(super) enum Outcome {
    Status(u16),
    Timeout,
    Failed(String),
}

impl Outcome {
    pub(super) fn of(result: &Result<Response>) -> Outcome {
        match result {
            Ok(r) => Outcome::Status(r.status),
            Err(e) => {
                let text = format!("{e:#}");
                let lower = text.to_ascii_lowercase();
                if lower.contains("timeout") || lower.contains("timed out") {
                    Outcome::Timeout
                } else {
                    Outcome::Failed(text)
                }
            }
        }
    }

    fn key(&self) -> String {
        match self {
            Outcome::Status(s) => s.to_string(),
            Outcome::Timeout => "timeout".into(),
            Outcome::Failed(_) => "no answer".into(),
        }
    }

    fn is_success(&self) -> bool {
        matches!(self, Outcome::Status(200..=299))
    }
}

pub(super) fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed())
}
