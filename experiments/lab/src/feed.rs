//! `promlab feed`: sends the paced remote-write workload ([`promlab::ingest::feed`])
//! to one receiver, or sharded over several, over HTTP, one tick per second.

use crate::cluster::hashmod;
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

/// How series are spread over several URLs: Prometheus's `hashmod` of these
/// labels' values joined by `;`, modulo the number of URLs (see
/// [`hashmod`]); series whose hash is `k` go to the `k`-th URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sharding {
    pub source_labels: Vec<String>,
}

impl Default for Sharding {
    fn default() -> Self {
        Sharding {
            source_labels: ["__name__", "instance", "label_0"]
                .map(String::from)
                .to_vec(),
        }
    }
}

impl Sharding {
    /// The URL index of each series of `workload`.
    pub fn shards(&self, workload: &FeedWorkload, urls: usize) -> Vec<u32> {
        let source: Vec<&[u8]> = self.source_labels.iter().map(|s| s.as_bytes()).collect();
        let mut buf = Vec::new();
        (0..workload.series())
            .map(|n| {
                let labels = workload.series_labels(n);
                let labels: Vec<(&[u8], &[u8])> = labels
                    .iter()
                    .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
                    .collect();
                let modulus = urls as u64;
                hashmod::shard_of(
                    &labels,
                    &source,
                    hashmod::DEFAULT_SEPARATOR,
                    modulus,
                    &mut buf,
                ) as u32
            })
            .collect()
    }
}

/// Sends `ticks` to `urls` (each series to one of them, by `sharding`), one
/// tick per second from the first unless `paced` is false (then as fast as
/// the receivers take them), `concurrency` requests in flight. A feed split
/// over several runs (`--first-tick`) sends the same samples as one run would.
pub fn send(
    workload: &FeedWorkload,
    ticks: Range<u64>,
    urls: &[String],
    sharding: &Sharding,
    concurrency: usize,
    paced: bool,
) -> Result<FeedReport> {
    if urls.is_empty() {
        bail!("no URL to send to");
    }
    if let Some(url) = urls.iter().find(|u| !u.starts_with("http://")) {
        bail!("only http:// URLs are supported: {url}");
    }
    let concurrency = concurrency.max(1);
    // One keep-alive pool shared by the request threads, a connection each.
    let client = Client::new(None, concurrency * urls.len());
    let generator = workload.generator();
    let shard_of = (urls.len() > 1).then(|| sharding.shards(workload, urls.len()));
    let mut report = FeedReport::default();
    let began = Instant::now();
    let first = ticks.start;
    for t in ticks {
        if paced {
            let due = began + Duration::from_secs(t - first);
            let now = Instant::now();
            if now < due {
                std::thread::sleep(due - now);
            } else if t > first && now - due > Duration::from_millis(100) {
                report.late_ticks += 1;
            }
        }
        // (url, body) of every request of the tick.
        let requests: Vec<(&str, Vec<u8>)> = match &shard_of {
            None => generator
                .tick_bodies(t)
                .into_iter()
                .map(|b| (urls[0].as_str(), b))
                .collect(),
            Some(shards) => urls
                .iter()
                .enumerate()
                .flat_map(|(k, url)| {
                    generator
                        .tick_raw_of(t, |n| shards[n as usize] as usize == k)
                        .into_iter()
                        .map(move |raw| (url.as_str(), promlab::ingest::wire::compress(&raw)))
                })
                .collect(),
        };
        let next = AtomicUsize::new(0);
        let failed = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..concurrency * urls.len() {
                let (requests, next, failed, client) = (&requests, &next, &failed, &client);
                scope.spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((url, body)) = requests.get(i) else {
                        break;
                    };
                    if let Err(e) = post(client, url, body) {
                        eprintln!("promlab feed: tick {t} request {i} to {url}: {e:#}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        report.ticks += 1;
        report.requests += requests.len() as u64;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every series goes to exactly one URL, by the hashmod of its labels,
    /// and three URLs each get a fair share of 3,000 series.
    #[test]
    fn series_shard_by_hashmod_of_their_labels() {
        let workload = FeedWorkload {
            groups: 30,
            series_per_group: 100,
            ..FeedWorkload::seed(0)
        };
        let shards = Sharding::default().shards(&workload, 3);
        // data;i0;g0: hashmod 1 of 3 (checked against Python's hashlib in hashmod.rs).
        assert_eq!(shards[0], 1);
        let mut per = [0usize; 3];
        for &s in &shards {
            per[s as usize] += 1;
        }
        assert!(per.iter().all(|&n| (800..1200).contains(&n)), "{per:?}");
        let generator = workload.generator();
        let rows = |raw: &[Vec<u8>]| -> usize {
            raw.iter()
                .map(|r| {
                    promlab::ingest::wire::decode_borrowed(r)
                        .unwrap()
                        .samples
                        .len()
                })
                .sum()
        };
        let split: usize = (0..3)
            .map(|k| rows(&generator.tick_raw_of(0, |n| shards[n as usize] as usize == k)))
            .sum();
        assert_eq!(split, rows(&generator.tick_raw(0)));
    }
}
