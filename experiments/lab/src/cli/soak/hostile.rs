//! The receiver's hostile clients: malformed, mislabelled, oversized and
//! far-future requests (each with the statuses a correct receiver answers), a
//! cardinality flood of fresh groups, and a crowd of slow clients holding
//! connections open (to the receiver, then the sidecar) while probes check
//! that a scrape and a write are still answered in time.

use super::feeder::{
    now_ms, samples_body, FeedClock, CARDINALITY, PROBE, REMOTE_WRITE, SIDECAR_PROBE, WRITE_PROBE,
};
use super::server::Server;
use super::tally::{timed, Outcome, Tallies};
use super::{Run, CARDINALITY_BATCH, CARDINALITY_CAP, REQUEST_TIMEOUT, SLOW_CLIENTS};
use crate::http_client::Client;
use promlab::ingest::feed::splitmix64;
use promlab::ingest::wire;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One hostile request: what it sends and the statuses a correct receiver answers.
pub(super) struct HostileCase {
    pub(super) name: &'static str,
    method: &'static str,
    path: String,
    headers: Vec<(&'static str, &'static str)>,
    body: Vec<u8>,
    /// Valid samples in the body (counted as sent when answered 2xx).
    samples: u64,
    /// When set, the body is one valid sample built at send time, its timestamp this
    /// function of the feeder's current one (so a valid sample is never late by itself).
    one_sample_at: Option<fn(i64) -> i64>,
    pub(super) expected: &'static [u16],
    /// Whether the connection closed while sending counts as refused: a server may
    /// answer 413 and close before a body it will not take has been sent.
    pub(super) closed_is_refusal: bool,
    /// The fraction of the run it is sent in (the far-future cases go last: they
    /// would make the rest of the run's samples late on a receiver without the fix).
    window: (f64, f64),
}

pub(super) fn hostile_cases() -> Vec<HostileCase> {
    let rw = || REMOTE_WRITE.to_vec();
    let with_type = |t: &'static str| vec![("Content-Type", t), ("Content-Encoding", "snappy")];
    let mut unsorted = Vec::new();
    let mut labels = Vec::new();
    wire::put_label(&mut labels, b"label_0", b"g0");
    wire::put_label(&mut labels, b"__name__", b"data");
    wire::put_series_one_sample(&mut unsorted, &labels, 1.0, now_ms());
    let mut nameless = Vec::new();
    let mut labels = Vec::new();
    wire::put_label(&mut labels, b"label_0", b"g0");
    wire::put_series_one_sample(&mut nameless, &labels, 1.0, now_ms());
    let mut four_gb = Vec::new();
    wire::put_varint(&mut four_gb, 4 << 30);
    four_gb.extend_from_slice(&[0; 64]);
    let garbage: Vec<u8> = (0..4096u64).map(|i| splitmix64(i) as u8).collect();
    let all = (0.0, 1.0);
    let case = |name, headers, body, samples, expected, window| HostileCase {
        name,
        method: "POST",
        path: "/api/v1/write".into(),
        headers,
        body,
        samples,
        one_sample_at: None,
        expected,
        closed_is_refusal: false,
        window,
    };
    let fresh = |name, headers, at: fn(i64) -> i64, expected, window| HostileCase {
        one_sample_at: Some(at),
        ..case(name, headers, Vec::new(), 1, expected, window)
    };
    vec![
        case("malformed snappy", rw(), garbage.clone(), 0, &[400], all),
        case(
            "malformed protobuf",
            rw(),
            wire::compress(&garbage),
            0,
            &[400],
            all,
        ),
        case(
            "series without __name__",
            rw(),
            wire::compress(&nameless),
            0,
            &[400],
            all,
        ),
        case(
            "unsorted labels",
            rw(),
            wire::compress(&unsorted),
            0,
            &[400],
            all,
        ),
        fresh(
            "content type text/plain",
            with_type("text/plain"),
            |t| t,
            &[415],
            all,
        ),
        fresh(
            "content type application/x-protobufXYZ",
            with_type("application/x-protobufXYZ"),
            |t| t,
            &[415],
            all,
        ),
        fresh(
            "remote-write 2.0 content type",
            with_type("application/x-protobuf;proto=io.prometheus.write.v2.Request"),
            |t| t,
            &[415],
            all,
        ),
        fresh(
            "content encoding gzip",
            vec![
                ("Content-Type", "application/x-protobuf"),
                ("Content-Encoding", "gzip"),
            ],
            |t| t,
            &[415],
            all,
        ),
        HostileCase {
            closed_is_refusal: true,
            ..case("body of 33 MiB", rw(), vec![0; 33 << 20], 0, &[413], all)
        },
        case("snappy header of 4 GiB", rw(), four_gb, 0, &[413], all),
        case(
            "snappy bomb (40 MiB of zeros)",
            rw(),
            wire::compress(&vec![0; 40 << 20]),
            0,
            &[413],
            all,
        ),
        // A correct receiver takes these (204, the sample counted too far ahead) or refuses
        // them (400/422); the harm they do is checked by the late-samples check.
        fresh(
            "timestamp in year 2100",
            rw(),
            |_| 4_102_444_800_000,
            &[204, 400, 422],
            (0.8, 1.0),
        ),
        fresh(
            "timestamp in ns sent as ms",
            rw(),
            |t| t.saturating_mul(1_000_000),
            &[204, 400, 422],
            (0.8, 1.0),
        ),
        HostileCase {
            name: "quantiles query with a bad window",
            method: "GET",
            path: "/api/v1/quantiles?agg=data&window=%ZZ".into(),
            headers: Vec::new(),
            body: Vec::new(),
            samples: 0,
            one_sample_at: None,
            expected: &[400],
            closed_is_refusal: false,
            window: all,
        },
        HostileCase {
            name: "quantiles query of an unknown aggregation",
            method: "GET",
            path: "/api/v1/quantiles?agg=nope".into(),
            headers: Vec::new(),
            body: Vec::new(),
            samples: 0,
            one_sample_at: None,
            expected: &[404],
            closed_is_refusal: false,
            window: all,
        },
    ]
}

/// Sends the hostile cases in turn, one every 100 ms, pausing while the slow clients hold
/// the receiver's connections (the probe measures that window).
pub(super) fn hostile(
    run: &Run,
    rx: &Server,
    tallies: &Tallies,
    slow: &SlowState,
    clock: &FeedClock,
) {
    let cases = hostile_cases();
    let client = Client::new(Some(REQUEST_TIMEOUT), 1);
    for case in cases.iter().cycle() {
        if run.over() {
            break;
        }
        if !run.within(case.window.0, case.window.1) || slow.active.load(Ordering::Relaxed) {
            if slow.active.load(Ordering::Relaxed) {
                run.sleep(Duration::from_millis(100));
            }
            continue;
        }
        let body = match case.one_sample_at {
            Some(at) => samples_body(std::iter::once("g0".to_string()), at(clock.now())).0,
            None => case.body.clone(),
        };
        let (result, elapsed) =
            timed(|| client.request(case.method, &rx.url(&case.path), &case.headers, &body));
        tallies.record(case.name, &Outcome::of(&result), elapsed, case.samples);
        run.sleep(Duration::from_millis(100));
    }
}

/// Fresh groups, 10,000 a request, until [`CARDINALITY_CAP`], the receiver's RSS budget,
/// or 50 % of the run. Returns why it stopped.
pub(super) fn cardinality(
    run: &Run,
    rx: &Server,
    tallies: &Tallies,
    budget_mib: u64,
    groups: &AtomicU64,
    clock: &FeedClock,
) -> String {
    run.sleep(run.length.mul_f64(0.1));
    let client = Client::new(Some(REQUEST_TIMEOUT), 1);
    let mut next = 0u64;
    loop {
        if run.over() || Instant::now() >= run.at(0.5) {
            return "stopped at 50 % of the run".into();
        }
        if next >= CARDINALITY_CAP {
            return format!("stopped at its cap of {CARDINALITY_CAP} groups");
        }
        if let Some(rss) = rx.rss_kib() {
            if rss > budget_mib * 1024 {
                return format!(
                    "stopped: receiver RSS {} MiB over the budget of {budget_mib} MiB",
                    rss / 1024
                );
            }
        }
        let (body, n) = samples_body(
            (next..next + CARDINALITY_BATCH).map(|g| format!("c{g}")),
            clock.now(),
        );
        let (result, elapsed) =
            timed(|| client.post(&rx.url("/api/v1/write"), &REMOTE_WRITE, &body));
        tallies.record(CARDINALITY, &Outcome::of(&result), elapsed, n);
        next += CARDINALITY_BATCH;
        groups.store(next, Ordering::Relaxed);
    }
}

#[derive(Default)]
pub(super) struct SlowState {
    active: AtomicBool,
    opened: AtomicU64,
    refused: AtomicU64,
    /// Slow connections the server closed (a header or body deadline, or the
    /// connection cap evicting the slowest).
    closed_by_server: AtomicU64,
    held_secs: Mutex<f64>,
}

impl SlowState {
    pub(super) fn summary(&self) -> String {
        format!(
            "{} slow connections opened ({} refused; half trickling a request header, half a body, a byte a second each, reopened when closed, {} at once against the receiver, then the sidecar), held {:.0} s; the servers closed {} of them",
            self.opened.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
            SLOW_CLIENTS,
            self.held_secs.lock().unwrap(),
            self.closed_by_server.load(Ordering::Relaxed),
        )
    }
}

/// From 50 % to 80 % of the run: [`SLOW_CLIENTS`] connections, half sending a
/// request header and half a request body one byte a second (each reopened
/// when the server closes it), against the receiver from 50 % to 65 % and the
/// sidecar from 65 % to 80 %, while probes on fresh connections check that a
/// normal scrape and a normal write are still answered in time.
pub(super) fn slow_clients(
    run: &Run,
    rx: &Server,
    sidecar: &Server,
    tallies: &Tallies,
    clock: &FeedClock,
    slow: &SlowState,
) {
    run.sleep(run.at(0.5).saturating_duration_since(Instant::now()));
    if run.over() {
        return;
    }
    let began = Instant::now();
    slow.active.store(true, Ordering::Relaxed);
    for (server, from, until) in [(rx, 0.5, 0.65), (sidecar, 0.65, 0.8)] {
        let (start, window_end) = (run.at(from), run.at(until));
        run.sleep(start.saturating_duration_since(Instant::now()));
        if run.over() {
            break;
        }
        let is_receiver = std::ptr::eq(server, rx);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                // At least one probe per server, however late the window began.
                loop {
                    // A fresh connection every time: what a new legitimate client gets.
                    let client = Client::new(Some(REQUEST_TIMEOUT), 1);
                    let (result, elapsed) = timed(|| client.get(&server.url("/metrics"), &[]));
                    let name = if is_receiver { PROBE } else { SIDECAR_PROBE };
                    tallies.record(name, &Outcome::of(&result), elapsed, 0);
                    if is_receiver {
                        let (body, samples) =
                            samples_body(std::iter::once("slow-probe".to_owned()), clock.now());
                        let (result, elapsed) = timed(|| {
                            client.post(&server.url("/api/v1/write"), &REMOTE_WRITE, &body)
                        });
                        tallies.record(WRITE_PROBE, &Outcome::of(&result), elapsed, samples);
                    }
                    if Instant::now() >= window_end || run.over() {
                        break;
                    }
                    run.sleep(Duration::from_millis(500));
                }
            });
            hold_slow_connections(run, server, is_receiver, slow, window_end);
        });
    }
    *slow.held_secs.lock().unwrap() = began.elapsed().as_secs_f64();
    slow.active.store(false, Ordering::Relaxed);
}

/// What a slow connection sends first: a request header left open (then a
/// byte a second of more header), or a whole header announcing a body (then
/// the body a byte a second).
fn slow_start(trickle_body: bool, is_receiver: bool) -> &'static [u8] {
    match (trickle_body, is_receiver) {
        (false, _) => b"POST /api/v1/write HTTP/1.1\r\nHost: soak\r\n",
        (true, true) => b"POST /api/v1/write HTTP/1.1\r\nHost: soak\r\nContent-Type: application/x-protobuf\r\nContent-Encoding: snappy\r\nContent-Length: 1000000\r\n\r\n",
        (true, false) => b"POST /metrics HTTP/1.1\r\nHost: soak\r\nContent-Length: 1000000\r\n\r\n",
    }
}

/// Opens the slow connections and sends each a byte a second until `until`,
/// reopening those the server closed.
fn hold_slow_connections(
    run: &Run,
    server: &Server,
    is_receiver: bool,
    slow: &SlowState,
    until: Instant,
) {
    let Some(addr): Option<SocketAddr> = server
        .url("")
        .strip_prefix("http://")
        .and_then(|a| a.parse().ok())
    else {
        return;
    };
    let open = |i: usize| -> Option<TcpStream> {
        // Never past the window: a connect that hangs would eat the next server's window.
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1))) {
            Ok(mut s) => {
                let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
                if s.write_all(slow_start(i % 2 == 1, is_receiver)).is_err() {
                    slow.closed_by_server.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                slow.opened.fetch_add(1, Ordering::Relaxed);
                Some(s)
            }
            Err(_) => {
                slow.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    };
    let mut conns: Vec<Option<TcpStream>> = Vec::with_capacity(SLOW_CLIENTS);
    for i in 0..SLOW_CLIENTS {
        if Instant::now() >= until || run.over() {
            break;
        }
        conns.push(open(i));
    }
    let mut next_byte = Instant::now();
    while Instant::now() < until && !run.over() {
        if Instant::now() >= next_byte {
            for (i, conn) in conns.iter_mut().enumerate() {
                // `&TcpStream` is `Write`: a guard may not borrow `s` mutably.
                match conn {
                    Some(s) if (&*s).write_all(b"X").is_err() => {
                        slow.closed_by_server.fetch_add(1, Ordering::Relaxed);
                        *conn = None;
                    }
                    Some(_) => {}
                    // Closed by the server (or refused): try again, as a
                    // determined slow client does.
                    None if Instant::now() < until => *conn = open(i),
                    None => {}
                }
            }
            next_byte += Duration::from_secs(1);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
