//! The long-running servers: `/metrics` for a store or the RabbitMQ scenario
//! ([`metrics`]) and the remote-write receiver ([`receiver`]). Each takes a typed
//! config; the command line builds it.

pub mod metrics;
pub mod receiver;

use anyhow::{Context, Result};
use axum::Router;
use std::net::SocketAddr;

/// Binds `listen`, tells `announce` the bound address (tests and scripts read
/// that line to learn the port of `--listen 127.0.0.1:0`), and serves `router`
/// until Ctrl-C or SIGTERM. Blocking: builds its own runtime, with
/// `worker_threads` workers (tokio's default, one per core, when `None`).
pub fn run(
    listen: SocketAddr,
    worker_threads: Option<usize>,
    router: Router,
    announce: impl FnOnce(SocketAddr),
) -> Result<()> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        builder.worker_threads(n);
    }
    let runtime = builder
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        announce(listener.local_addr()?);
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown_signal())
            .await
            .context("server failed")
    })
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
