//! `promlab serve --store` / `--scenario`: the /metrics server.
//!
//! - Store mode serves `/metrics`: the exposition of a client_ruby store
//!   directory, through one long-lived [`Exporter`] (a drop-in exporter sidecar
//!   for Ruby apps).
//! - Scenario mode (`--scenario rabbitmq`) serves RabbitMQ's endpoints:
//!   `/metrics/per-object` (every family) and
//!   `/metrics/detailed?family=...&family=...` (the named groups only); values
//!   move before every scrape.
//!
//! A store scrape never fails for one file: bad, vanished, locked or growing
//! files and bad entries are left out (see [`Exporter`]), logged to stderr
//! (once per file and reason until it changes), and counted at
//! `/metrics/promlab` (`promlab_store_files_skipped_total{reason}`,
//! `promlab_store_entries_skipped_total{reason}`,
//! `promlab_store_scrapes_total{result}`); `/metrics` itself stays
//! byte-identical to client_ruby's exposition. A scrape is bounded in time
//! ([`SCRAPE_BUDGET`]); a request that finds another scrape running waits
//! [`SCRAPE_WAIT`] at most, then gets 503. Error bodies never name files or
//! keys; the log does.
//!
//! Rendering runs off the async workers' other tasks (a 630k-series scrape
//! is tens of milliseconds of CPU). Bodies are gzipped when the scraper asks,
//! as Prometheus does; at level 1 ("fast"), because the scrape's time to last
//! byte is what matters on loopback and level 1 already shrinks label-heavy
//! text about tenfold. A store's export is made on every scrape, into a
//! reused buffer served without a copy; the gzip of an export byte for byte
//! the last one compressed is served again ([`ServedBody`]).
//!
//! Both modes answer `/-/healthy` and `/-/ready`; a store sidecar follows its
//! registry file and counts the store files it does not name
//! ([`super::registry_follow`]).

use super::registry_follow::{self, FollowStats, Follower};
use anyhow::Result;
use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use promlab::export::{EntrySkip, Exporter, FileSkip};
use promlab::format::text::FamilyEncoder;
use promlab::scenarios::rabbitmq::RabbitMqNode;
use promlab::shared::strategy::StrategySet;
use std::collections::HashSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The text format's content type, as client_ruby and Prometheus name it.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long a store scrape may read files before the rest are skipped
/// (Prometheus's default scrape timeout is 10 s).
pub const SCRAPE_BUDGET: Duration = Duration::from_secs(8);
/// How long a request waits for a scrape in progress before a 503.
pub const SCRAPE_WAIT: Duration = Duration::from_secs(10);

/// The outcome of a `/metrics` request (the `result` of `promlab_store_scrapes_total`).
#[derive(Clone, Copy)]
enum ScrapeResult {
    Ok = 0,
    Partial = 1,
    Failed = 2,
    Busy = 3,
}

const SCRAPE_RESULTS: [(ScrapeResult, &str); 4] = [
    (ScrapeResult::Ok, "ok"),
    (ScrapeResult::Partial, "partial"),
    (ScrapeResult::Failed, "failed"),
    (ScrapeResult::Busy, "busy"),
];

/// The sidecar's own counters.
#[derive(Default)]
struct Counters {
    files_skipped: [AtomicU64; FileSkip::ALL.len()],
    entries_skipped: [AtomicU64; EntrySkip::ALL.len()],
    scrapes: [AtomicU64; SCRAPE_RESULTS.len()],
}

impl Counters {
    fn scrape(&self, result: ScrapeResult) {
        self.scrapes[result as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The exposition of these counters, through the library's one encoder.
    fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let files = FileSkip::ALL.iter().map(|r| r.name());
        let entries = EntrySkip::ALL.iter().map(|r| r.name());
        let results = SCRAPE_RESULTS.iter().map(|(_, name)| *name);
        for (name, help, label, values, counts) in [
            (
                "promlab_store_files_skipped_total",
                "Store files left out of a scrape, by reason.",
                "reason",
                files.collect::<Vec<_>>(),
                &self.files_skipped[..],
            ),
            (
                "promlab_store_entries_skipped_total",
                "Store entries left out of a scrape, by reason.",
                "reason",
                entries.collect(),
                &self.entries_skipped[..],
            ),
            (
                "promlab_store_scrapes_total",
                "/metrics requests, by result.",
                "result",
                results.collect(),
                &self.scrapes[..],
            ),
        ] {
            let mut family =
                FamilyEncoder::new(&mut out, name.as_bytes(), "counter", help.as_bytes());
            for (value, count) in values.iter().zip(counts) {
                family
                    .sample(b"")
                    .label(label.as_bytes(), value.as_bytes())
                    .value()
                    .integer(count.load(Ordering::Relaxed));
            }
        }
        out
    }
}

/// Where scrapes come from.
pub enum Source {
    /// A client_ruby store directory, exported on every scrape (boxed: an
    /// exporter is much larger than the other source).
    Store(Box<Exporter>),
    /// The RabbitMQ per-object scenario.
    Scenario(RabbitMqNode),
}

impl Source {
    fn describe(&self) -> String {
        match self {
            Source::Store(_) => "/metrics (store)".to_owned(),
            Source::Scenario(s) => {
                format!(
                    "/metrics/per-object and /metrics/detailed (rabbitmq, {} series)",
                    s.series_count()
                )
            }
        }
    }
}

/// What one request asks for.
enum Page {
    /// `/metrics` of a store.
    Store,
    PerObject,
    Detailed(Vec<String>),
}

struct Shared {
    source: Arc<tokio::sync::Mutex<Source>>,
    counters: Counters,
    /// The files skipped by the last scrape, so each is logged when it starts
    /// being skipped, not on every scrape.
    logged: Mutex<HashSet<(PathBuf, FileSkip)>>,
    /// Size of the last body, to size the next buffer in one allocation.
    last_len: AtomicUsize,
    /// A store's last body (see [`ServedBody`]).
    served_body: Mutex<ServedBody>,
    /// The paths served, for 404 messages (without waiting for a scrape's lock).
    served: &'static str,
    /// `--fold-exited`: what the fold loop did.
    fold: Option<Arc<super::fold_loop::FoldStats>>,
    /// What the registry follower did.
    follow: Option<Arc<FollowStats>>,
    /// The store directory (for `/-/ready`).
    store_dir: Option<PathBuf>,
}

/// What a store sidecar runs beside its scrapes.
#[derive(Default)]
pub struct StoreExtras {
    /// `--fold-exited`: the fold loop's counters.
    pub fold: Option<Arc<super::fold_loop::FoldStats>>,
    /// The registry follower, started with the server.
    pub follow: Option<Follower>,
}

/// The router for a source (store: `/metrics`; scenario: the RabbitMQ endpoints).
pub fn app(source: Source) -> Router {
    app_with(source, StoreExtras::default()).expect("nothing to start")
}

/// [`app`], with what runs beside a store's scrapes (their counters at
/// `/metrics/promlab`); starts the registry follower's thread.
pub fn app_with(source: Source, extras: StoreExtras) -> Result<Router> {
    let is_store = matches!(source, Source::Store(_));
    let store_dir = match &source {
        Source::Store(exporter) => Some(exporter.dir().to_path_buf()),
        Source::Scenario(_) => None,
    };
    let served = if is_store {
        "/metrics, /metrics/promlab, /-/healthy and /-/ready"
    } else {
        "/metrics/per-object, /metrics/detailed?family=..., /-/healthy and /-/ready"
    };
    let source = match source {
        Source::Store(exporter) => {
            Source::Store(Box::new(exporter.with_scrape_budget(SCRAPE_BUDGET)))
        }
        scenario => scenario,
    };
    let shared = Arc::new(Shared {
        source: Arc::new(tokio::sync::Mutex::new(source)),
        counters: Counters::default(),
        logged: Mutex::new(HashSet::new()),
        last_len: AtomicUsize::new(0),
        served_body: Mutex::new(ServedBody::default()),
        served,
        fold: extras.fold,
        follow: extras.follow.as_ref().map(|f| f.stats.clone()),
        store_dir,
    });
    if let Some(follower) = extras.follow {
        let source = shared.source.clone();
        let swap = move |exporter: Exporter| {
            // The follower's own thread waits for the lock, between two scrapes.
            let mut served = source.blocking_lock();
            *served = Source::Store(Box::new(exporter.with_scrape_budget(SCRAPE_BUDGET)));
        };
        registry_follow::start(follower, Box::new(swap))?;
    }
    let router = if is_store {
        Router::new()
            .route("/metrics", get(store_metrics))
            .route("/metrics/promlab", get(own_metrics))
    } else {
        Router::new()
            .route("/metrics/per-object", get(per_object))
            .route("/metrics/detailed", get(detailed))
    };
    Ok(router
        .route("/-/healthy", get(super::healthy))
        .route("/-/ready", get(ready))
        .fallback(not_found)
        .with_state(shared))
}

/// Serves `source` on `listen` until Ctrl-C or SIGTERM (blocking; builds its own runtime).
/// The first line it prints names the address and the strategies.
pub fn serve(
    listen: SocketAddr,
    source: Source,
    strategies: StrategySet,
    limits: super::ServerLimits,
    extras: StoreExtras,
) -> Result<()> {
    let described = source.describe();
    super::run(listen, None, app_with(source, extras)?, limits, |addr| {
        eprintln!("promlab: serving {described} on http://{addr} (strategies: {strategies})")
    })
}

async fn store_metrics(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    scrape(shared, Page::Store, &headers).await
}

async fn own_metrics(State(shared): State<Arc<Shared>>) -> Response {
    let mut text = shared.counters.render();
    if let Some(fold) = &shared.fold {
        fold.render(&mut text);
    }
    if let Some(follow) = &shared.follow {
        follow.render(&mut text);
    }
    let mut response = Response::new(Body::from(text));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    response
}

/// Ready once the store can be served: its directory is there to read
/// (a scenario is always ready).
async fn ready(State(shared): State<Arc<Shared>>) -> Response {
    match &shared.store_dir {
        Some(dir) => match std::fs::read_dir(dir) {
            Ok(_) => super::ready(None),
            Err(e) => super::ready(Some(format!("cannot read the store directory: {e}"))),
        },
        None => super::ready(None),
    }
}

async fn per_object(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    scrape(shared, Page::PerObject, &headers).await
}

async fn detailed(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    match families_of_query(query.as_deref().unwrap_or("")) {
        Ok(families) => scrape(shared, Page::Detailed(families), &headers).await,
        Err(message) => text_response(StatusCode::BAD_REQUEST, message),
    }
}

async fn not_found(uri: Uri, State(shared): State<Arc<Shared>>) -> Response {
    text_response(
        StatusCode::NOT_FOUND,
        format!(
            "not found: {}; this server serves {}\n",
            uri.path(),
            shared.served
        ),
    )
}

/// Renders the page on the blocking pool, then compresses it if asked.
async fn scrape(shared: Arc<Shared>, page: Page, headers: &HeaderMap) -> Response {
    let gzip = accepts_gzip(headers);
    let is_store = matches!(page, Page::Store);
    // A scrape in progress holds the source; wait for it a bounded time.
    let Ok(source) = tokio::time::timeout(SCRAPE_WAIT, shared.source.clone().lock_owned()).await
    else {
        if is_store {
            shared.counters.scrape(ScrapeResult::Busy);
        }
        return text_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "another scrape is still running\n".to_owned(),
        );
    };
    let task_shared = shared.clone();
    let rendered = if is_store {
        // A store's export is a fraction of a millisecond to tens of them:
        // made on this worker's thread, handing its other tasks to another,
        // rather than on a blocking-pool thread (two thread switches per
        // scrape, a good part of a small scrape on a 2-core machine).
        Ok(tokio::task::block_in_place(move || {
            render_page(&task_shared, source, page, gzip)
        }))
    } else {
        tokio::task::spawn_blocking(move || render_page(&task_shared, source, page, gzip)).await
    };
    match rendered {
        Ok(Ok((body, gzipped))) => {
            let mut response = Response::new(Body::from(body));
            let h = response.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
            h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
            if gzipped {
                h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            }
            response
        }
        Ok(Err(ScrapeError::BadRequest(message))) => {
            text_response(StatusCode::BAD_REQUEST, message)
        }
        Ok(Err(ScrapeError::Failed(err))) => {
            // The details name paths and keys: the log gets them, not the scraper.
            eprintln!("promlab: scrape failed: {err:#}");
            if is_store {
                shared.counters.scrape(ScrapeResult::Failed);
            }
            text_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "scrape failed; the server's log says why\n".to_owned(),
            )
        }
        Err(join) => {
            eprintln!("promlab: scrape failed: {join}");
            if is_store {
                shared.counters.scrape(ScrapeResult::Failed);
            }
            text_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "scrape failed; the server's log says why\n".to_owned(),
            )
        }
    }
}

/// Counts and logs what a store scrape left out.
fn account(shared: &Shared, exporter: &Exporter) {
    let report = exporter.last_report();
    let c = &shared.counters;
    for file in &report.files {
        let i = FileSkip::ALL
            .iter()
            .position(|&r| r == file.reason)
            .expect("listed");
        c.files_skipped[i].fetch_add(1, Ordering::Relaxed);
    }
    for (i, reason) in EntrySkip::ALL.iter().enumerate() {
        if let Some(n) = report.entries.get(reason) {
            c.entries_skipped[i].fetch_add(*n, Ordering::Relaxed);
        }
    }
    c.scrape(if report.is_clean() {
        ScrapeResult::Ok
    } else {
        ScrapeResult::Partial
    });
    let now: HashSet<(PathBuf, FileSkip)> = report
        .files
        .iter()
        .map(|f| (f.path.clone(), f.reason))
        .collect();
    let mut logged = shared.logged.lock().unwrap_or_else(|e| e.into_inner());
    for file in &report.files {
        if !logged.contains(&(file.path.clone(), file.reason)) {
            eprintln!(
                "promlab: skipping store file {} ({}): {}",
                file.path.display(),
                file.reason.name(),
                file.error
            );
        }
    }
    // Entry errors are logged while they last, a few per scrape.
    for (path, detail) in report.entry_details.iter().take(4) {
        eprintln!("promlab: skipping an entry of {}: {detail}", path.display());
    }
    *logged = now;
}

enum ScrapeError {
    BadRequest(String),
    Failed(anyhow::Error),
}

/// A store's bodies: each scrape exports into a buffer of its own, served
/// as it is (no copy) and given back for a later export once the answer is
/// written ([`ExportBuffers`]). The gzip of the last body compressed is
/// kept with that body: a gzip scrape whose fresh export is byte for byte
/// that body serves the kept gzip, so an unchanged store is not compressed
/// again. The export is always made and, for gzip, compared: what is served
/// is always what an export gives now.
#[derive(Default)]
struct ServedBody {
    buffers: Arc<ExportBuffers>,
    /// The body the kept gzip was made of, and that gzip.
    gzipped: Option<(Bytes, Bytes)>,
}

impl ServedBody {
    /// The store's exposition now, as a body to serve.
    fn export(&mut self, exporter: &mut Exporter) -> Result<Bytes> {
        let mut buffer = self.buffers.take();
        exporter.export_into(&mut buffer)?;
        Ok(Bytes::from_owner(ExportBuffer {
            bytes: buffer,
            home: Arc::clone(&self.buffers),
        }))
    }

    /// `body` gzipped: the kept gzip when `body` is the one it was made of.
    fn gzip_of(&mut self, body: Bytes) -> std::io::Result<Bytes> {
        if let Some((source, gzip)) = &self.gzipped {
            if source[..] == body[..] {
                return Ok(gzip.clone());
            }
        }
        // Give the old source back before the new gzip is made.
        self.gzipped = None;
        let gzip = Bytes::from(gzip_fast(&body)?);
        self.gzipped = Some((body, gzip.clone()));
        Ok(gzip)
    }
}

/// Export buffers not in use: at most [`ExportBuffers::KEPT`], each as large
/// as the largest export it held, so an export reuses pages already mapped
/// rather than growing a fresh buffer.
#[derive(Default)]
struct ExportBuffers {
    free: Mutex<Vec<Vec<u8>>>,
    /// Size of the last export, to size a fresh buffer in one allocation.
    last_len: AtomicUsize,
}

impl ExportBuffers {
    /// One scrape writing while another's answer is still being sent (the
    /// kept gzip's source is a third, held by [`ServedBody`]).
    const KEPT: usize = 2;

    fn take(&self) -> Vec<u8> {
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        free.unwrap_or_else(|| {
            let last = self.last_len.load(Ordering::Relaxed);
            Vec::with_capacity(last + last / 8)
        })
    }

    fn give_back(&self, buffer: Vec<u8>) {
        self.last_len.store(buffer.len(), Ordering::Relaxed);
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < Self::KEPT {
            free.push(buffer);
        }
    }
}

/// An export, served as a body's bytes; its buffer goes back to its
/// [`ExportBuffers`] when the body is dropped.
struct ExportBuffer {
    bytes: Vec<u8>,
    home: Arc<ExportBuffers>,
}

impl AsRef<[u8]> for ExportBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for ExportBuffer {
    fn drop(&mut self) {
        self.home.give_back(std::mem::take(&mut self.bytes));
    }
}

/// `body` gzipped at level 1 ("fast"; see the module doc).
fn gzip_fast(body: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 8),
        flate2::Compression::fast(),
    );
    encoder.write_all(body)?;
    encoder.finish()
}

/// Returns the body and whether it is gzipped.
fn render_page(
    shared: &Shared,
    mut source: tokio::sync::OwnedMutexGuard<Source>,
    page: Page,
    gzip: bool,
) -> Result<(Bytes, bool), ScrapeError> {
    if let (Source::Store(exporter), Page::Store) = (&mut *source, &page) {
        // Under the source's lock: no other scrape holds this one.
        let mut served = shared.served_body.lock().unwrap_or_else(|e| e.into_inner());
        let body = served.export(exporter).map_err(ScrapeError::Failed)?;
        account(shared, exporter);
        if !gzip {
            return Ok((body, false));
        }
        return served
            .gzip_of(body)
            .map(|gzipped| (gzipped, true))
            .map_err(|e| ScrapeError::Failed(e.into()));
    }
    let last_len = shared.last_len.load(Ordering::Relaxed);
    let mut out = Vec::with_capacity(last_len + last_len / 8);
    match (&mut *source, page) {
        (Source::Scenario(scenario), Page::PerObject) => {
            scenario.advance();
            scenario.render_per_object(&mut out);
        }
        (Source::Scenario(scenario), Page::Detailed(families)) => {
            // Refuse before moving any value.
            let selected = scenario
                .select(families.iter().map(String::as_str))
                .map_err(|e| ScrapeError::BadRequest(format!("{e}\n")))?;
            scenario.advance();
            scenario
                .registry()
                .render_families_into(&selected, &mut out);
        }
        _ => {
            return Err(ScrapeError::Failed(anyhow::anyhow!(
                "page does not match the source"
            )))
        }
    }
    // Compress without holding the source.
    drop(source);
    shared.last_len.store(out.len(), Ordering::Relaxed);
    if !gzip {
        return Ok((Bytes::from(out), false));
    }
    let compressed = gzip_fast(&out).map_err(|e| ScrapeError::Failed(e.into()))?;
    Ok((Bytes::from(compressed), true))
}

fn text_response(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message,
    )
        .into_response()
}

/// Whether `Accept-Encoding` allows gzip (`gzip` or `x-gzip`, not refused with `q=0`).
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            (coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip"))
                && parts.all(|param| {
                    let param = param.trim();
                    let q = param
                        .strip_prefix("q=")
                        .or_else(|| param.strip_prefix("Q="));
                    q.and_then(|q| q.trim().parse::<f32>().ok())
                        .is_none_or(|q| q > 0.0)
                })
        })
}

/// The `family=` values of a query string; any other parameter is refused.
pub fn families_of_query(query: &str) -> Result<Vec<String>, String> {
    let mut families = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = percent_decode(key)?;
        if key != "family" {
            return Err(format!(
                "unsupported query parameter `{key}` (only family=... is supported)\n"
            ));
        }
        families.push(percent_decode(value)?);
    }
    Ok(families)
}

/// Decodes `application/x-www-form-urlencoded` text (`+` is a space), with
/// the library's component decoder.
fn percent_decode(s: &str) -> Result<String, String> {
    let decoded = promlab::format::formenc::decode_component(s.as_bytes())
        .map_err(|_| format!("bad percent-encoding in query: {s:?}\n"))?;
    String::from_utf8(decoded.into_owned())
        .map_err(|_| format!("query is not UTF-8 after decoding: {s:?}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sidecar's own counters, byte for byte as before they went through
    /// the library's encoder, and readable by the library's parser.
    #[test]
    fn own_counters_exposition() {
        let counters = Counters::default();
        counters.files_skipped[2].fetch_add(3, Ordering::Relaxed);
        counters.scrape(ScrapeResult::Partial);
        let out = counters.render();
        let text = String::from_utf8(out.clone()).unwrap();
        let mut expected = String::from(
            "# TYPE promlab_store_files_skipped_total counter\n\
             # HELP promlab_store_files_skipped_total Store files left out of a scrape, by reason.\n",
        );
        for (i, reason) in FileSkip::ALL.iter().enumerate() {
            let n = if i == 2 { 3 } else { 0 };
            expected += &format!(
                "promlab_store_files_skipped_total{{reason=\"{}\"}} {n}\n",
                reason.name()
            );
        }
        expected += "# TYPE promlab_store_entries_skipped_total counter\n\
             # HELP promlab_store_entries_skipped_total Store entries left out of a scrape, by reason.\n";
        for reason in EntrySkip::ALL {
            expected += &format!(
                "promlab_store_entries_skipped_total{{reason=\"{}\"}} 0\n",
                reason.name()
            );
        }
        expected += "# TYPE promlab_store_scrapes_total counter\n\
             # HELP promlab_store_scrapes_total /metrics requests, by result.\n\
             promlab_store_scrapes_total{result=\"ok\"} 0\n\
             promlab_store_scrapes_total{result=\"partial\"} 1\n\
             promlab_store_scrapes_total{result=\"failed\"} 0\n\
             promlab_store_scrapes_total{result=\"busy\"} 0\n";
        assert_eq!(text, expected);
        let samples = promlab::scenarios::scrape_to_remote_write::parse(&out).unwrap();
        assert_eq!(
            samples.len(),
            FileSkip::ALL.len() + EntrySkip::ALL.len() + SCRAPE_RESULTS.len()
        );
    }

    #[test]
    fn gzip_negotiation() {
        let mut h = HeaderMap::new();
        assert!(!accepts_gzip(&h));
        h.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(accepts_gzip(&h));
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("deflate, GZIP;q=0.5"),
        );
        assert!(accepts_gzip(&h));
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("gzip;q=0, identity"),
        );
        assert!(!accepts_gzip(&h));
        h.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("br"));
        assert!(!accepts_gzip(&h));
    }

    #[test]
    fn query_families() {
        assert_eq!(
            families_of_query("family=a&family=b%5Fc").unwrap(),
            ["a", "b_c"]
        );
        assert_eq!(families_of_query("").unwrap(), Vec::<String>::new());
        assert!(families_of_query("vhost=%2F")
            .unwrap_err()
            .contains("unsupported query parameter `vhost`"));
        assert!(families_of_query("family=%zz").is_err());
    }
}
