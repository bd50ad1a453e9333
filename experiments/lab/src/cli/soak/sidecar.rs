//! The sidecar's load: writer processes (`promlab replay-one`) adding a known
//! number of increments to the good counter, run after run, and scrapers that
//! check every scrape against what the writers can have written.

use super::churner::ChurnState;
use super::exposition::check_scrape;
use super::server::{describe, Reaped, Server};
use super::tally::{timed, Outcome, Tallies};
use super::{truncate, Run, INCREMENTS_PER_RUN, PHASE_CHANGE, REQUEST_TIMEOUT};
use crate::http_client::Client;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// One writer run's op log: [`INCREMENTS_PER_RUN`] increments of the good counter.
pub(super) fn writer_ops(pid: u32) -> String {
    let line = format!(
        "{{\"pid\":{pid},\"metric\":\"soak_jobs_total\",\"op\":\"inc\",\"value\":1,\"labels\":{{\"queue\":\"default\"}}}}\n"
    );
    line.repeat(INCREMENTS_PER_RUN as usize)
}

#[derive(Default)]
pub(super) struct WriterState {
    started: AtomicU64,
    completed: AtomicU64,
    failures: Mutex<Vec<String>>,
}

impl WriterState {
    pub(super) fn summary(&self) -> (u64, u64, Vec<String>) {
        (
            self.started.load(Ordering::Relaxed),
            self.completed.load(Ordering::Relaxed),
            self.failures.lock().unwrap().clone(),
        )
    }
}

/// Runs `promlab replay-one` on its op log again and again until the run ends; each
/// run adds exactly [`INCREMENTS_PER_RUN`] to the good counter.
pub(super) fn writer(
    run: &Run,
    exe: &Path,
    registry: &Path,
    store: &Path,
    strategies: &str,
    ops: &Path,
    state: &WriterState,
) {
    while !run.over() {
        state.started.fetch_add(1, Ordering::Relaxed);
        let spawned = Command::new(exe)
            .arg("replay-one")
            .arg("--registry")
            .arg(registry)
            .arg("--store")
            .arg(store)
            .args(["--strategies", strategies, "--dialect", "uri"])
            .arg(ops)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        let child = match spawned {
            Ok(child) => Reaped(child),
            Err(e) => {
                state.failures.lock().unwrap().push(format!("spawn: {e}"));
                return;
            }
        };
        match child.wait_within(Duration::from_secs(60)) {
            Some((status, _)) if status.success() => {
                state.completed.fetch_add(1, Ordering::Relaxed);
            }
            Some((status, stderr)) => state.failures.lock().unwrap().push(format!(
                "{}: {}",
                describe(status),
                stderr.trim()
            )),
            None => state
                .failures
                .lock()
                .unwrap()
                .push("hung for 60 s, killed".into()),
        }
    }
}

/// Scrapes `/metrics` until the run ends, tallied by churn phase: status, latency,
/// whether the good counter is within what the writers can have written, and whether
/// every line is exposition Prometheus accepts.
pub(super) fn scraper(
    run: &Run,
    sidecar: &Server,
    scrapes: &Tallies,
    writers: &WriterState,
    churn: &ChurnState,
) {
    let client = Client::new(Some(REQUEST_TIMEOUT), 1);
    while !run.over() {
        let phase = churn.phase_name();
        let low = writers.completed.load(Ordering::Relaxed) * INCREMENTS_PER_RUN;
        let (result, elapsed) = timed(|| client.get(&sidecar.url("/metrics"), &[]));
        let high = writers.started.load(Ordering::Relaxed) * INCREMENTS_PER_RUN;
        // A scrape that spans a change of phase may have seen either phase's files.
        let phase = if churn.phase_name() == phase {
            phase
        } else {
            PHASE_CHANGE
        };
        let outcome = Outcome::of(&result);
        scrapes.record(phase, &outcome, elapsed, 0);
        if let Outcome::Failed(_) = outcome {
            // Refused: the sidecar is down (the watcher restarts it); no busy loop.
            std::thread::sleep(Duration::from_millis(20));
        }
        match &result {
            Ok(r) if r.status == 200 => {
                let check = check_scrape(&r.body);
                let total = check.good_total;
                let in_bounds = match total {
                    Some(v) => v >= low as f64 && v <= high as f64,
                    None => low == 0,
                };
                scrapes.with(phase, |t| {
                    if !in_bounds {
                        t.out_of_bounds += 1;
                        t.note_first(format!(
                            "good counter {total:?}, writers had written {low}..={high}"
                        ));
                    }
                    if let Some(invalid) = check.invalid {
                        t.invalid += 1;
                        t.note_first(invalid);
                    }
                });
            }
            Ok(r) => {
                let body = truncate(r.text().trim(), 120);
                scrapes.with(phase, |t| t.note_first(format!("{}: {body}", r.status)));
            }
            Err(_) => {}
        }
    }
}
