//! The receiver's good clients: the feeder (the asap-1e5 workload at
//! `--overload` × its paced rate) and the remote-write bodies every client
//! builds with the library's `wire` encoder.

use super::server::Server;
use super::tally::{timed, Outcome, Tallies};
use super::{Run, FEED_TIMEOUT};
use crate::http_client::Client;
use promlab::ingest::feed::FeedWorkload;
use promlab::ingest::wire;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub(super) const REMOTE_WRITE: [(&str, &str); 3] = [
    ("Content-Type", "application/x-protobuf"),
    ("Content-Encoding", "snappy"),
    ("X-Prometheus-Remote-Write-Version", "0.1.0"),
];
pub(super) const FEEDER: &str = "feeder (asap-1e5)";
pub(super) const CARDINALITY: &str = "cardinality (fresh label_0 values)";
pub(super) const PROBE: &str = "probe during slow clients";
pub(super) const WRITE_PROBE: &str = "write probe during slow clients";
pub(super) const SIDECAR_PROBE: &str = "sidecar probe during slow clients";

/// The timestamp of the feeder's current tick: what the other clients stamp their
/// valid samples with, so none is ahead of the feed (the feeder may fall behind the
/// wall clock under overload) and none is late.
pub(super) struct FeedClock(pub(super) std::sync::atomic::AtomicI64);

impl FeedClock {
    pub(super) fn now(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The feeder's workload at `overload` × its paced rate, as fast as the receiver takes it.
pub(super) fn feeder(
    run: &Run,
    rx: &Server,
    tallies: &Tallies,
    overload: u64,
    ticks: &AtomicU64,
    clock: &FeedClock,
) {
    let workload = FeedWorkload {
        samples_per_sec: overload.max(1),
        ..FeedWorkload::seed(clock.now())
    };
    let generator = workload.generator();
    let per_tick = workload.samples_per_tick();
    let batch = workload.batch_rows as u64;
    let client = Client::new(Some(FEED_TIMEOUT), 2);
    for t in 0.. {
        run.sleep((run.start + Duration::from_secs(t)).saturating_duration_since(Instant::now()));
        if run.over() {
            break;
        }
        clock.0.store(workload.timestamp(t, 0), Ordering::Relaxed);
        let bodies = generator.tick_bodies(t);
        let next = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(i) else { break };
                    if run.over() {
                        break;
                    }
                    let rows = batch.min(per_tick - i as u64 * batch);
                    let (result, elapsed) =
                        timed(|| client.post(&rx.url("/api/v1/write"), &REMOTE_WRITE, body));
                    tallies.record(FEEDER, &Outcome::of(&result), elapsed, rows);
                });
            }
        });
        ticks.fetch_add(1, Ordering::Relaxed);
    }
}

/// Remote-write bodies of one sample per series, `data{instance="i0", label_0=...}`.
pub(super) fn samples_body(groups: impl Iterator<Item = String>, timestamp: i64) -> (Vec<u8>, u64) {
    let mut raw = Vec::new();
    let mut n = 0;
    for group in groups {
        let mut labels = Vec::new();
        wire::put_label(&mut labels, b"__name__", b"data");
        wire::put_label(&mut labels, b"instance", b"i0");
        wire::put_label(&mut labels, b"label_0", group.as_bytes());
        wire::put_series_one_sample(&mut raw, &labels, 1.0, timestamp);
        n += 1;
    }
    (wire::compress(&raw), n)
}
