//! `promlab feed`: sends the paced remote-write workload ([`promlab::ingest::feed`])
//! to a receiver over HTTP, one tick per second.

use anyhow::{bail, Context, Result};
use promlab::ingest::feed::{FeedReport, Workload};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Sends `ticks` to `url`, one tick per second from the first, `concurrency`
/// requests in flight. A feed split over several runs (`--first-tick`) sends
/// the same samples as one run would.
pub fn send(
    workload: &Workload,
    ticks: Range<u64>,
    url: &str,
    concurrency: usize,
) -> Result<FeedReport> {
    let target = HttpTarget::parse(url)?;
    let generator = workload.generator();
    let mut report = FeedReport::default();
    let began = Instant::now();
    let first = ticks.start;
    let mut clients: Vec<Option<HttpClient>> = (0..concurrency.max(1)).map(|_| None).collect();
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
            for slot in clients.iter_mut() {
                let (bodies, next, failed, target) = (&bodies, &next, &failed, &target);
                scope.spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(i) else { break };
                    if let Err(e) = post(slot, target, body) {
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

/// `http://host:port/path`.
struct HttpTarget {
    authority: String,
    path: String,
}

impl HttpTarget {
    fn parse(url: &str) -> Result<Self> {
        let Some(rest) = url.strip_prefix("http://") else {
            bail!("only http:// URLs are supported: {url}");
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let path = if path.is_empty() { "/" } else { path };
        Ok(HttpTarget {
            authority: authority.to_owned(),
            path: path.to_owned(),
        })
    }
}

/// A minimal keep-alive HTTP/1.1 client for one POST at a time.
struct HttpClient {
    reader: BufReader<TcpStream>,
}

fn post(slot: &mut Option<HttpClient>, target: &HttpTarget, body: &[u8]) -> Result<()> {
    // One retry on a fresh connection if a kept-alive one was closed by the server.
    for attempt in 0..2 {
        if slot.is_none() {
            let stream = TcpStream::connect(&target.authority)
                .with_context(|| format!("connecting to {}", target.authority))?;
            stream.set_nodelay(true)?;
            *slot = Some(HttpClient {
                reader: BufReader::new(stream),
            });
        }
        let client = slot.as_mut().expect("connected");
        match client.post(target, body) {
            Ok((status, _)) if (200..300).contains(&status) => return Ok(()),
            Ok((status, text)) => bail!("HTTP {status}: {}", text.trim()),
            Err(_) if attempt == 0 => *slot = None,
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns on its second attempt")
}

impl HttpClient {
    fn post(&mut self, target: &HttpTarget, body: &[u8]) -> Result<(u16, String)> {
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-protobuf\r\nContent-Encoding: snappy\r\n\
             X-Prometheus-Remote-Write-Version: 0.1.0\r\nUser-Agent: promlab-feed\r\nContent-Length: {}\r\n\r\n",
            target.path,
            target.authority,
            body.len()
        );
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            bail!("connection closed");
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line {line:?}"))?;
        let mut length = 0usize;
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().context("bad content-length")?;
                }
            }
        }
        let mut text = vec![0; length];
        self.reader.read_exact(&mut text)?;
        Ok((status, String::from_utf8_lossy(&text).into_owned()))
    }
}
