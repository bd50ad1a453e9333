//! `promlab serve --store DIR --fold-exited`: the sidecar folds the files of
//! exited processes (`fold-exited`, `promlab::export::fold`) every `--fold-every`
//! seconds, on a thread of its own, beside the scrapes (a batch commits under
//! the store's fold lock, which a scrape holds shared). Interrupted folds are
//! finished or undone before the first scrape. What it did is counted at
//! `/metrics/promlab`.

use super::registry_follow::CurrentRegistry;
use promlab::export::fold::{fold_store, FoldConfig, FoldReport};
use promlab::format::text::FamilyEncoder;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the fold loop did, for `/metrics/promlab`.
#[derive(Default)]
pub struct FoldStats {
    runs_ok: AtomicU64,
    runs_failed: AtomicU64,
    /// Runs that found another fold of the store running (and did nothing).
    runs_busy: AtomicU64,
    files_folded: AtomicU64,
    fold_files_written: AtomicU64,
    batches_abandoned: AtomicU64,
    recovered: AtomicU64,
    /// Of the last fold: files with a live writer, with no lease to tell,
    /// and exited files left as they are.
    live_files: AtomicU64,
    unknown_files: AtomicU64,
    files_left: AtomicU64,
    /// Of the last fold (f64 bits): how long it took, how long the file it
    /// folded that waited longest had waited, and when it ended (Unix time).
    last_run_seconds: AtomicU64,
    lag_seconds: AtomicU64,
    last_run_end: AtomicU64,
}

impl FoldStats {
    fn add(&self, report: &FoldReport, took: Duration) {
        let add = |counter: &AtomicU64, n: u64| counter.fetch_add(n, Ordering::Relaxed);
        if report.another_running {
            add(&self.runs_busy, 1);
            return;
        }
        add(&self.runs_ok, 1);
        add(&self.files_folded, report.files_folded);
        add(&self.fold_files_written, report.fold_files_written);
        add(&self.batches_abandoned, report.batches_abandoned);
        add(&self.recovered, report.recovered);
        self.live_files.store(report.live_files, Ordering::Relaxed);
        self.unknown_files
            .store(report.unknown_files, Ordering::Relaxed);
        self.files_left.store(report.files_left, Ordering::Relaxed);
        let seconds = |counter: &AtomicU64, d: Duration| {
            counter.store(d.as_secs_f64().to_bits(), Ordering::Relaxed)
        };
        seconds(&self.last_run_seconds, took);
        seconds(&self.lag_seconds, report.lag.unwrap_or_default());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        seconds(&self.last_run_end, now);
    }

    /// The counters, in the text format, through the library's one encoder.
    pub fn render(&self, out: &mut Vec<u8>) {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        // (name, type, help, samples: (one label, value)).
        type Family<'a> = (
            &'a str,
            &'a str,
            &'a str,
            Vec<(Option<(&'a str, &'a str)>, u64)>,
        );
        let families: [Family; 6] = [
            (
                "promlab_fold_runs_total",
                "counter",
                "Folds of exited processes' files, by result (busy: another fold of the store was running, nothing done).",
                vec![
                    (Some(("result", "ok")), get(&self.runs_ok)),
                    (Some(("result", "failed")), get(&self.runs_failed)),
                    (Some(("result", "busy")), get(&self.runs_busy)),
                ],
            ),
            (
                "promlab_fold_files_folded_total",
                "counter",
                "Files of exited processes (and earlier fold files) folded away.",
                vec![(None, get(&self.files_folded))],
            ),
            (
                "promlab_fold_files_written_total",
                "counter",
                "Fold files written.",
                vec![(None, get(&self.fold_files_written))],
            ),
            (
                "promlab_fold_batches_abandoned_total",
                "counter",
                "Fold batches given up because a source changed or got a writer (rolled back when committed).",
                vec![(None, get(&self.batches_abandoned))],
            ),
            (
                "promlab_fold_recovered_total",
                "counter",
                "Interrupted fold batches finished or undone.",
                vec![(None, get(&self.recovered))],
            ),
            (
                "promlab_fold_store_files",
                "gauge",
                "Store files as the last fold found them: with a live writer, with no lease to tell (treated as live), exited but left as they are.",
                vec![
                    (Some(("state", "live")), get(&self.live_files)),
                    (Some(("state", "unknown")), get(&self.unknown_files)),
                    (Some(("state", "left")), get(&self.files_left)),
                ],
            ),
        ];
        for (name, kind, help, samples) in families {
            let mut family = FamilyEncoder::new(out, name.as_bytes(), kind, help.as_bytes());
            for (label, value) in samples {
                let mut sample = family.sample(b"");
                if let Some((name, value)) = label {
                    sample = sample.label(name.as_bytes(), value.as_bytes());
                }
                sample.value().integer(value);
            }
        }
        // How far behind the fold is (falling behind, it takes longer and
        // the files it folds have waited longer).
        for (name, help, counter) in [
            (
                "promlab_fold_last_run_seconds",
                "How long the last fold took.",
                &self.last_run_seconds,
            ),
            (
                "promlab_fold_lag_seconds",
                "Of the processes' files the last fold folded, the longest one had waited this long since its writer's last write (0 when it folded none).",
                &self.lag_seconds,
            ),
            (
                "promlab_fold_last_run_timestamp_seconds",
                "When the last fold ended (Unix time; 0 before the first).",
                &self.last_run_end,
            ),
        ] {
            FamilyEncoder::new(out, name.as_bytes(), "gauge", help.as_bytes())
                .sample(b"")
                .value()
                .ruby_float(f64::from_bits(get(counter)));
        }
    }
}

/// Finishes interrupted folds now, then folds every `every` on a thread of
/// its own, for as long as the process lives, each time by the registry in
/// force then (only the metrics it names: files of any other are left as they are).
pub fn start(
    dir: PathBuf,
    registry: Arc<CurrentRegistry>,
    every: Duration,
) -> anyhow::Result<Arc<FoldStats>> {
    let stats = Arc::new(FoldStats::default());
    let recovered = promlab::export::fold::recover(&dir)?;
    stats.recovered.fetch_add(recovered, Ordering::Relaxed);
    if recovered > 0 {
        eprintln!("promlab: finished or undid {recovered} interrupted fold batches");
    }
    let thread_stats = stats.clone();
    std::thread::Builder::new()
        .name("fold".into())
        .spawn(move || loop {
            let started = std::time::Instant::now();
            match fold_store(&dir, &registry.get(), &FoldConfig::default()) {
                Ok(report) => {
                    for skipped in &report.metrics_skipped {
                        eprintln!("promlab: fold left a metric for next time: {skipped}");
                    }
                    thread_stats.add(&report, started.elapsed());
                }
                Err(err) => {
                    thread_stats.runs_failed.fetch_add(1, Ordering::Relaxed);
                    eprintln!("promlab: fold failed: {err:#}");
                }
            }
            std::thread::sleep(every);
        })?;
    Ok(stats)
}
