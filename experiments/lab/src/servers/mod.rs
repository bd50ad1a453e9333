//! The long-running servers: `/metrics` for a store or the RabbitMQ scenario
//! ([`metrics`]) and the remote-write receiver ([`receiver`]). Each takes a typed
//! config; the command line builds it. Both run on [`run`], which bounds what a
//! client can hold: connections (the slowest closed at the cap), time to send
//! headers, time to send a body, time per request, and time to shut down.

pub mod fold_loop;
pub mod metrics;
pub mod receiver;
pub mod registry_follow;

use anyhow::{Context as _, Result};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// What one client may hold of a server, and how long shutdown may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections served at once; more wait in the listen backlog. Also kept
    /// under the process's open-file limit (see [`ServerLimits::connection_cap`]).
    /// At the cap, the connection sending slowest is closed to make room
    /// (see [`serve_connections`]).
    pub max_connections: usize,
    /// Time for a request's headers to arrive, counted from when the server
    /// starts waiting for them (so it is also a keep-alive idle timeout).
    pub header_timeout: Duration,
    /// Time for a request's body to arrive once its headers have (408 past it).
    pub body_timeout: Duration,
    /// Time for the body to arrive and the answer to be made (408 past it).
    pub request_timeout: Duration,
    /// After SIGTERM or Ctrl-C, time for open connections to finish before they are closed.
    pub shutdown_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(10),
        }
    }
}

impl ServerLimits {
    /// `max_connections`, but at most three quarters of the open-file limit, so
    /// that files the server opens (store files, the plan) still find a descriptor.
    pub fn connection_cap(&self) -> usize {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given, nothing else.
        let files = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
            usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
        } else {
            1024
        };
        self.max_connections.min(files / 4 * 3).max(1)
    }
}

/// What the accept loop did to slow clients, since start (for `/metrics`).
#[derive(Debug, Default)]
pub struct ConnectionStats {
    /// Connections closed at the cap while waiting for (or sending) a request's headers.
    pub evicted_headers: AtomicU64,
    /// Connections closed at the cap while sending a request's body.
    pub evicted_body: AtomicU64,
    /// Bodies not complete within `body_timeout` (answered 408).
    pub body_timeouts: AtomicU64,
}

/// The process's [`ConnectionStats`] (one server runs per process).
pub fn connection_stats() -> &'static ConnectionStats {
    static STATS: std::sync::OnceLock<ConnectionStats> = std::sync::OnceLock::new();
    STATS.get_or_init(ConnectionStats::default)
}

/// The [`connection_stats`] as exposition families, onto `out`.
pub fn write_connection_metrics(out: &mut Vec<u8>) {
    use promlab::format::text::FamilyEncoder;
    let stats = connection_stats();
    let mut family = FamilyEncoder::new(
        out,
        b"promlab_http_connections_evicted_total",
        "counter",
        b"Connections closed at the connection cap for sending slowest, by what they were sending.",
    );
    for (phase, n) in [
        ("headers", &stats.evicted_headers),
        ("body", &stats.evicted_body),
    ] {
        family
            .sample(b"")
            .label(b"phase", phase.as_bytes())
            .value()
            .integer(n.load(Ordering::Relaxed));
    }
    FamilyEncoder::new(
        out,
        b"promlab_http_body_timeouts_total",
        "counter",
        b"Request bodies not complete within --body-timeout-secs (answered 408).",
    )
    .sample(b"")
    .value()
    .integer(stats.body_timeouts.load(Ordering::Relaxed));
}

/// Threads of the blocking pool, where requests do their work.
const BLOCKING_THREADS: usize = 16;

/// How long a connection is left to send before it may be closed at the cap
/// (so a client is never closed before it had a moment to speak).
const EVICTION_MIN_AGE: Duration = Duration::from_millis(200);

/// Binds `listen`, tells `announce` the bound address (tests and scripts read
/// that line to learn the port of `--listen 127.0.0.1:0`), and serves `router`
/// within `limits` until Ctrl-C or SIGTERM. Blocking: builds its own runtime,
/// with `worker_threads` workers (tokio's default, one per core, when `None`).
pub fn run(
    listen: SocketAddr,
    worker_threads: Option<usize>,
    router: Router,
    limits: ServerLimits,
    announce: impl FnOnce(SocketAddr),
) -> Result<()> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        builder.worker_threads(n);
    }
    // Ingests and scrapes run on the blocking pool, each thread with its own
    // reused buffers: a bounded pool bounds those too (more requests wait).
    builder.max_blocking_threads(BLOCKING_THREADS);
    let runtime = builder
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let result = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        announce(listener.local_addr()?);
        let router = router.layer(axum::middleware::from_fn_with_state(
            limits.request_timeout,
            deadline,
        ));
        serve_connections(listener, router, limits).await;
        Ok(())
    });
    // Work still running on the blocking pool (a scrape stuck in a read) must not hold the exit.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result
}

/// The accept loop: one task per connection, at most [`ServerLimits::connection_cap`]
/// at once. Every connection's progress is tracked ([`Connection`]): whether
/// it is sending a request (its headers, or its body) or has one being
/// answered, and how many bytes it sent since. At the cap, the connection
/// that is sending slowest (fewest bytes a second in its current request,
/// the longest waiting first; an idle keep-alive connection counts as
/// sending nothing) is closed to make room, once it has had
/// [`EVICTION_MIN_AGE`]; a connection whose request is being answered is
/// never closed. So clients that trickle their headers or their bodies (up
/// to `header_timeout` and `body_timeout` each) cannot keep every slot and
/// every legitimate client waiting behind them in the backlog: the backlog
/// drains at the rate the slow ones are closed. On a shutdown signal, stops
/// accepting, asks every connection to finish, and closes those still open
/// after `shutdown_timeout`.
async fn serve_connections(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: ServerLimits,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let cap = limits.connection_cap();
    let slots = Arc::new(tokio::sync::Semaphore::new(cap));
    let open = Arc::new(Connections::default());
    let (closing_tx, closing_rx) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let mut accept_failures = 0u64;
    let mut evictions = 0u64;
    loop {
        while connections.try_join_next().is_some() {}
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // Answers go out whole at once: no Nagle wait on their last segment.
                    let _ = stream.set_nodelay(true);
                    stream
                }
                Err(e) => {
                    // Out of descriptors (EMFILE) or a connection reset before accept: wait, retry.
                    accept_failures += 1;
                    if accept_failures.is_power_of_two() {
                        eprintln!("promlab: accept failed ({accept_failures} times so far): {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let slot = loop {
            if let Ok(slot) = slots.clone().try_acquire_owned() {
                break Some(slot);
            }
            if open.evict_slowest(EVICTION_MIN_AGE) {
                evictions += 1;
                if evictions.is_power_of_two() {
                    eprintln!(
                        "promlab: {cap} connections open; closed the one sending slowest \
                         ({evictions} so far)"
                    );
                }
            }
            // The closed connection's slot, or another's; else try again
            // when more of them have had their moment.
            tokio::select! {
                slot = slots.clone().acquire_owned() => break Some(slot.expect("the semaphore is never closed")),
                _ = tokio::time::sleep(EVICTION_MIN_AGE / 4) => {}
                _ = &mut shutdown => break None,
            }
        };
        let Some(slot) = slot else {
            break;
        };
        let (id, tracked) = open.add();
        let inner = TowerToHyperService::new(router.clone());
        let conn = Arc::clone(&tracked);
        let body_timeout = limits.body_timeout;
        let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
            let has_body = !hyper::body::Body::is_end_stream(request.body());
            // Sending its body, or waiting for the answer.
            conn.start(!has_body);
            let body_conn = Arc::clone(&conn);
            let request = request.map(|body| {
                axum::body::Body::new(TrackedBody {
                    inner: body,
                    connection: body_conn,
                    deadline: Box::pin(tokio::time::sleep(body_timeout)),
                    timeout: body_timeout,
                })
            });
            let answered = hyper::service::Service::call(&inner, request);
            let conn = Arc::clone(&conn);
            async move {
                let response = answered.await;
                // Waiting for the next request (while the answer is written).
                conn.start(false);
                response
            }
        });
        let mut closing = closing_rx.clone();
        let open = Arc::clone(&open);
        connections.spawn(async move {
            let _slot = slot;
            let io = TokioIo::new(CountingStream {
                inner: stream,
                connection: Arc::clone(&tracked),
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(io, service);
            tokio::pin!(connection);
            let shutting_down = tokio::select! {
                _ = connection.as_mut() => false,
                // Dropping the connection closes the socket.
                _ = tracked.evicted.notified() => false,
                _ = closing.wait_for(|&closing| closing) => true,
            };
            if shutting_down {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
            }
            open.remove(id);
        });
    }
    drop(listener);
    let _ = closing_tx.send(true);
    let drained = tokio::time::timeout(limits.shutdown_timeout, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        eprintln!(
            "promlab: {} connections still open {:?} after the shutdown signal; closing them",
            connections.len(),
            limits.shutdown_timeout
        );
        connections.shutdown().await;
    }
}

/// One connection's progress, as the accept loop judges it.
struct Connection {
    /// When the server started: the clock of `since_ms`.
    epoch: Instant,
    /// Whether its request is being answered (then it is never closed at the cap).
    answering: AtomicBool,
    /// Whether it has sent a request's headers and is sending its body.
    in_body: AtomicBool,
    /// When its current phase started, in ms since `epoch`.
    since_ms: AtomicU64,
    /// Bytes read from it since then.
    bytes: AtomicU64,
    /// Whether a request of it has been answered: a client that completed a
    /// request and waits on its keep-alive connection is closed at the cap
    /// only after every connection that never completed one (closing a
    /// good sender's idle connection races its next request).
    answered_once: AtomicBool,
    /// Notified to close it.
    evicted: tokio::sync::Notify,
}

impl Connection {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A new phase: `answering` a request, or (false) receiving one.
    fn start(&self, answering: bool) {
        if !answering && self.answering.load(Ordering::Acquire) {
            self.answered_once.store(true, Ordering::Relaxed);
        }
        self.since_ms.store(self.now_ms(), Ordering::Relaxed);
        self.bytes.store(0, Ordering::Relaxed);
        self.in_body.store(false, Ordering::Relaxed);
        self.answering.store(answering, Ordering::Release);
    }
}

/// The open connections, by id.
struct Connections {
    epoch: Instant,
    open: std::sync::Mutex<(u64, HashMap<u64, Arc<Connection>>)>,
}

impl Default for Connections {
    fn default() -> Self {
        Connections {
            epoch: Instant::now(),
            open: std::sync::Mutex::new((0, HashMap::new())),
        }
    }
}

impl Connections {
    fn add(&self) -> (u64, Arc<Connection>) {
        let connection = Arc::new(Connection {
            epoch: self.epoch,
            answering: AtomicBool::new(false),
            in_body: AtomicBool::new(false),
            since_ms: AtomicU64::new(self.epoch.elapsed().as_millis() as u64),
            bytes: AtomicU64::new(0),
            answered_once: AtomicBool::new(false),
            evicted: tokio::sync::Notify::new(),
        });
        let mut guard = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let (next, open) = &mut *guard;
        let id = *next;
        *next += 1;
        open.insert(id, Arc::clone(&connection));
        (id, connection)
    }

    fn remove(&self, id: u64) {
        let mut guard = self.open.lock().unwrap_or_else(|e| e.into_inner());
        guard.1.remove(&id);
    }

    /// Closes the connection sending slowest — fewest bytes a second since
    /// its current request began, the one waiting longest among equals —
    /// among those receiving a request for at least `min_age`, those that
    /// never had a request answered first; false when there is none.
    fn evict_slowest(&self, min_age: Duration) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        let min_age = min_age.as_millis() as u64;
        let mut guard = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let slowest = guard
            .1
            .iter()
            .filter(|(_, c)| !c.answering.load(Ordering::Acquire))
            .filter_map(|(&id, c)| {
                let age = now.saturating_sub(c.since_ms.load(Ordering::Relaxed));
                (age >= min_age).then(|| {
                    let rate = c.bytes.load(Ordering::Relaxed) as f64 / age as f64;
                    let served = c.answered_once.load(Ordering::Relaxed);
                    (served, rate, std::cmp::Reverse(age), id)
                })
            })
            .min_by(|a, b| a.partial_cmp(b).expect("rates are finite"));
        let Some((_, _, _, id)) = slowest else {
            return false;
        };
        let connection = guard.1.remove(&id).expect("found above");
        let stats = connection_stats();
        if connection.in_body.load(Ordering::Relaxed) {
            stats.evicted_body.fetch_add(1, Ordering::Relaxed);
        } else {
            stats.evicted_headers.fetch_add(1, Ordering::Relaxed);
        }
        // A stored permit: the connection closes even if it is not yet polling.
        connection.evicted.notify_one();
        true
    }
}

/// A connection's socket, counting the bytes read from it.
struct CountingStream {
    inner: tokio::net::TcpStream,
    connection: Arc<Connection>,
}

impl tokio::io::AsyncRead for CountingStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if read > 0 {
            self.connection
                .bytes
                .fetch_add(read as u64, Ordering::Relaxed);
        }
        polled
    }
}

impl tokio::io::AsyncWrite for CountingStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A request body that marks its connection as answering once it has all
/// arrived, and fails with [`BodyTimeout`] when it has not within the body
/// deadline.
struct TrackedBody {
    inner: hyper::body::Incoming,
    connection: Arc<Connection>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

/// A request body not complete within `--body-timeout-secs`.
#[derive(Debug)]
pub struct BodyTimeout(pub Duration);

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "request body not complete within {:?}", self.0)
    }
}

impl std::error::Error for BodyTimeout {}

impl axum::body::HttpBody for TrackedBody {
    type Data = axum::body::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.connection.start(true);
                Poll::Ready(None)
            }
            Poll::Ready(Some(frame)) => {
                this.connection.in_body.store(true, Ordering::Relaxed);
                Poll::Ready(Some(frame.map_err(Into::into)))
            }
            Poll::Pending => {
                this.connection.in_body.store(true, Ordering::Relaxed);
                if this.deadline.as_mut().poll(cx).is_ready() {
                    connection_stats()
                        .body_timeouts
                        .fetch_add(1, Ordering::Relaxed);
                    return Poll::Ready(Some(Err(Box::new(BodyTimeout(this.timeout)))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Answers 408 when the body has not arrived, or the answer is not made, in time.
async fn deadline(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            format!("request not complete within {limit:?}\n"),
        )
            .into_response(),
    }
}

/// `/-/healthy`, as Prometheus answers it: the process serves requests.
pub async fn healthy() -> Response {
    plain(StatusCode::OK, "promlab is Healthy.\n".to_owned())
}

/// `/-/ready`: 200 when `not_ready` is `None`, else 503 saying why.
pub fn ready(not_ready: Option<String>) -> Response {
    match not_ready {
        None => plain(StatusCode::OK, "promlab is Ready.\n".to_owned()),
        Some(why) => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("promlab is not ready: {why}\n"),
        ),
    }
}

fn plain(status: StatusCode, body: String) -> Response {
    (
        status,
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// Ctrl-C or SIGTERM, whichever comes first.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        let _ = ctrl_c.await;
        return;
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term.recv() => {},
    }
}
