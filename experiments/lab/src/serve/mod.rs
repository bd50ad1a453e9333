//! The long-running servers: `/metrics` for a store or the RabbitMQ scenario
//! ([`metrics`]) and the remote-write receiver ([`receiver`]). Each takes a typed
//! config; the command line builds it. Both run on [`run`], which bounds what a
//! client can hold: connections, time to send headers, time per request, and
//! time to shut down.

pub mod fold;
pub mod metrics;
pub mod receiver;

use anyhow::{Context, Result};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// What one client may hold of a server, and how long shutdown may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections served at once; more wait in the listen backlog. Also kept
    /// under the process's open-file limit (see [`ServerLimits::connection_cap`]).
    pub max_connections: usize,
    /// Time for a request's headers to arrive, counted from when the server
    /// starts waiting for them (so it is also a keep-alive idle timeout).
    pub header_timeout: Duration,
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

/// Threads of the blocking pool, where requests do their work.
const BLOCKING_THREADS: usize = 16;

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
/// at once. At the cap, the connection that has waited longest without
/// sending a whole request is closed to make room, once it has waited a
/// tenth of `header_timeout` (a client served promptly sends its headers
/// well within that): otherwise clients that trickle their headers (up to
/// `header_timeout` each) would keep every slot and every legitimate client
/// waiting behind them in the backlog. On a
/// shutdown signal, stops accepting, asks every connection to finish, and
/// closes those still open after `shutdown_timeout`.
async fn serve_connections(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: ServerLimits,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let cap = limits.connection_cap();
    let slots = Arc::new(tokio::sync::Semaphore::new(cap));
    let waiting = Arc::new(WaitingForRequest::default());
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
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if waiting.evict_oldest(limits.header_timeout / 10) {
                    evictions += 1;
                    if evictions.is_power_of_two() {
                        eprintln!(
                            "promlab: {cap} connections open; closed the one waiting longest \
                             for its request ({evictions} so far)"
                        );
                    }
                }
                tokio::select! {
                    slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
                    _ = &mut shutdown => break,
                }
            }
        };
        let (id, evicted) = waiting.add();
        let inner = TowerToHyperService::new(router.clone());
        let first_request = Arc::clone(&waiting);
        let service = hyper::service::service_fn(move |request| {
            first_request.remove(id);
            hyper::service::Service::call(&inner, request)
        });
        let mut closing = closing_rx.clone();
        let waiting = Arc::clone(&waiting);
        connections.spawn(async move {
            let _slot = slot;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let shutting_down = tokio::select! {
                _ = connection.as_mut() => false,
                // Dropping the connection closes the socket.
                _ = evicted.notified() => false,
                _ = closing.wait_for(|&closing| closing) => true,
            };
            if shutting_down {
                connection.as_mut().graceful_shutdown();
                let _ = connection.await;
            }
            waiting.remove(id);
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

/// Connections that have not yet sent a whole request, oldest first, each
/// with when it was accepted and the signal that closes it.
#[derive(Default)]
struct WaitingForRequest {
    connections: std::sync::Mutex<(u64, std::collections::BTreeMap<u64, Waiting>)>,
}

struct Waiting {
    since: std::time::Instant,
    evicted: Arc<tokio::sync::Notify>,
}

impl WaitingForRequest {
    fn add(&self) -> (u64, Arc<tokio::sync::Notify>) {
        let mut guard = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        let (next, waiting) = &mut *guard;
        let id = *next;
        *next += 1;
        let evicted = Arc::new(tokio::sync::Notify::new());
        waiting.insert(
            id,
            Waiting {
                since: std::time::Instant::now(),
                evicted: Arc::clone(&evicted),
            },
        );
        (id, evicted)
    }

    fn remove(&self, id: u64) {
        let mut guard = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        guard.1.remove(&id);
    }

    /// Closes the connection that has waited longest, if it has waited at
    /// least `min_wait`; false when none has.
    fn evict_oldest(&self, min_wait: Duration) -> bool {
        let mut guard = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        let waiting = &mut guard.1;
        match waiting.first_entry() {
            Some(oldest) if oldest.get().since.elapsed() >= min_wait => {
                // A stored permit: the connection closes even if it is not yet polling.
                oldest.remove().evicted.notify_one();
                true
            }
            _ => false,
        }
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
