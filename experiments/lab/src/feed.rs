//! `promlab feed`: sends the paced remote-write workload ([`promlab::ingest::feed`])
//! to a receiver over HTTP, one tick per second.

use crate::http_client::Client;
use anyhow::{bail, Result};
use promlab::ingest::feed::{FeedReport, FeedWorkload};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const REMOTE_WRITE_HEADERS: [(&str, &str); 4] = [
    ("Content-Type", "application/x-protobuf"),
    ("Content-Encoding", "snappy"),
    ("X-Prometheus-Remote-Write-Version", "0.1.0"),
    ("User-Agent", "promlab-feed"),
];

/// Sends `ticks` to `url`, one tick per second from the first, `concurrency`
/// requests in flight. A feed split over several runs (`--first-tick`) sends
/// the same samples as one run would.
pub fn send(
    workload: &FeedWorkload,
    ticks: Range<u64>,
    url: &str,
    concurrency: usize,
) -> Result<FeedReport> {
    if !url.starts_with("http://") {
        bail!("only http:// URLs are supported: {url}");
    }
    let concurrency = concurrency.max(1);
    // One keep-alive pool shared by the request threads, a connection each.
    let client = Client::new(None, concurrency);
    let generator = workload.generator();
    let mut report = FeedReport::default();
    let began = Instant::now();
    let first = ticks.start;
    for t in ticks {
        let due = began + Duration::from_secs(t - first);
        let now = Instant::now();
        if now < due {
            std::thread::sleep(due - now);
        } else if t > first && now - due > Duration::from_millis(100) {
            report.late_ticks += 1;
        }
        let bodies = generator.tick_bodies(t);
        let next = AtomicUsize::new(0);
        let failed = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..concurrency {
                let (bodies, next, failed, client) = (&bodies, &next, &failed, &client);
                scope.spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(i) else { break };
                    if let Err(e) = post(client, url, body) {
                        eprintln!("promlab feed: tick {t} request {i}: {e:#}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        report.ticks += 1;
        report.requests += bodies.len() as u64;
        report.samples += workload.samples_per_tick();
        report.failed_requests += failed.into_inner() as u64;
    }
    Ok(report)
}

/// One remote-write request; a 2xx answer is success. One retry on a transport
/// error, since a kept-alive connection the server closed fails its next request.
fn post(client: &Client, url: &str, body: &[u8]) -> Result<()> {
    let response = match client.post(url, &REMOTE_WRITE_HEADERS, body) {
        Ok(response) => response,
        Err(_) => client.post(url, &REMOTE_WRITE_HEADERS, body)?,
    };
    if !(200..300).contains(&response.status) {
        bail!("HTTP {}: {}", response.status, response.text().trim());
    }
    Ok(())
}
