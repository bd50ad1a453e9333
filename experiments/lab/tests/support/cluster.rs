//! What the cluster tests share (`#[path]`-included beside `support`): the
//! plan and workload, the sharded feed, a receiver's own answer and
//! `/metrics`, and waiting for the exporter.

#![allow(dead_code)] // each cluster test uses its own part of this module

use crate::support::{get, serve, Served};
use promlab::ingest::feed::FeedWorkload;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// 2 s windows, 1 s lateness: a window closes every two ticks of an unpaced feed.
pub const PLAN: &str = "lateness_secs = 1\nkeep_windows = 1000\n[[aggregation]]\nid = \"data\"\nmetric = \"data\"\ngroup_by = [\"label_0\"]\nwindow_secs = 2\n";
pub const WINDOW_MS: i64 = 2_000;
pub const GROUPS: u64 = 20;
pub const SERIES_PER_GROUP: u64 = 10;

pub fn workload(start_ms: i64) -> FeedWorkload {
    FeedWorkload {
        groups: GROUPS,
        series_per_group: SERIES_PER_GROUP,
        ..FeedWorkload::seed(start_ms)
    }
}

/// The one receiver fed everything: no ClickHouse.
pub fn single_receiver(plan: &Path, strategies: &str) -> Served {
    serve(&[
        "--plan",
        plan.to_str().unwrap(),
        "--max-ahead-secs",
        "0",
        "--strategies",
        strategies,
    ])
}

pub fn write_url(served: &Served) -> String {
    format!("http://{}/api/v1/write", served.addr)
}

/// `promlab feed` of ticks `ticks`, unpaced, sharded over `urls`; whether every request was taken.
pub fn feed(urls: &[String], start_ms: i64, ticks: std::ops::Range<u64>) -> bool {
    let mut command = Command::new(env!("CARGO_BIN_EXE_promlab"));
    command.arg("feed");
    for url in urls {
        command.args(["--url", url]);
    }
    command.args([
        "--groups",
        &GROUPS.to_string(),
        "--series-per-group",
        &SERIES_PER_GROUP.to_string(),
    ]);
    command.args([
        "--start-ms",
        &start_ms.to_string(),
        "--first-tick",
        &ticks.start.to_string(),
    ]);
    command.args([
        "--duration-secs",
        &(ticks.end - ticks.start).to_string(),
        "--no-pacing",
    ]);
    command.status().expect("run promlab feed").success()
}

/// A receiver's own answer for `window`.
pub fn answer(single: &Served, window: i64) -> Vec<u8> {
    get(
        single.addr,
        &format!("/api/v1/quantiles?agg=data&window={window}"),
        &[],
    )
    .body
}

/// A sample of the receiver's `/metrics` (`None` if absent).
pub fn metric(served: &Served, name: &str) -> Option<f64> {
    let text = get(served.addr, "/metrics", &[]).text();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
}

/// Waits (up to 90 s) until `served` has written every window ending at or
/// before `through` and its queue is empty.
pub fn wait_written(served: &Served, through: i64) {
    wait_metrics(
        served,
        [
            "promlab_clickhouse_written_through_ms",
            "promlab_clickhouse_queue_batches",
        ],
        |[written, queued]| written >= Some(through as f64) && queued == Some(0.0),
    );
}

/// Polls `served`'s `/metrics` until `ready` holds of the named values (`None`
/// while one is missing, which no bound below satisfies): the inserter works on
/// its own thread, so a count read right after the feed may not have moved yet.
pub fn wait_metrics(served: &Served, names: [&str; 2], ready: impl Fn([Option<f64>; 2]) -> bool) {
    let started = Instant::now();
    loop {
        let values = names.map(|name| metric(served, name));
        if ready(values) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "receiver on {}: {names:?} = {values:?} after 90 s: {:?}",
            served.addr,
            served.stderr_lines()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The windows `ticks` ticks from `start_ms` close, with 1 s lateness: every
/// one ending at or before the last tick's timestamp minus a second.
pub fn closed_windows(start_ms: i64, ticks: u64) -> Vec<i64> {
    let watermark = start_ms + (ticks as i64 - 1) * 1000 - 1000;
    (0..)
        .map(|k| start_ms + k * WINDOW_MS)
        .take_while(|s| s + WINDOW_MS <= watermark)
        .collect()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
