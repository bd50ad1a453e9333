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
//! Rendering runs on the blocking pool (a 630k-series scrape is tens of
//! milliseconds of CPU). Bodies are gzipped when the scraper asks, as
//! Prometheus does; at level 1 ("fast"), because the scrape's time to last byte
//! is what matters on loopback and level 1 already shrinks label-heavy text
//! about tenfold.

use anyhow::Result;
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use promlab::export::Exporter;
use promlab::render::rabbitmq::RabbitMqNode;
use promlab::strategy::StrategySet;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The text format's content type, as client_ruby and Prometheus name it.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Where scrapes come from.
pub enum Source {
    /// A client_ruby store directory, exported on every scrape.
    Store(Exporter),
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
    source: Mutex<Source>,
    /// Size of the last body, to size the next buffer in one allocation.
    last_len: AtomicUsize,
    /// The paths served, for 404 messages (without waiting for a scrape's lock).
    served: &'static str,
}

/// The router for a source (store: `/metrics`; scenario: the RabbitMQ endpoints).
pub fn app(source: Source) -> Router {
    let is_store = matches!(source, Source::Store(_));
    let served = if is_store {
        "/metrics"
    } else {
        "/metrics/per-object and /metrics/detailed?family=..."
    };
    let shared = Arc::new(Shared {
        source: Mutex::new(source),
        last_len: AtomicUsize::new(0),
        served,
    });
    let router = if is_store {
        Router::new().route("/metrics", get(store_metrics))
    } else {
        Router::new()
            .route("/metrics/per-object", get(per_object))
            .route("/metrics/detailed", get(detailed))
    };
    router.fallback(not_found).with_state(shared)
}

/// Serves `source` on `listen` until Ctrl-C or SIGTERM (blocking; builds its own runtime).
/// The first line it prints names the address and the strategies.
pub fn serve(
    listen: SocketAddr,
    source: Source,
    strategies: StrategySet,
    limits: super::ServerLimits,
) -> Result<()> {
    let described = source.describe();
    super::run(listen, None, app(source), limits, |addr| {
        eprintln!("promlab: serving {described} on http://{addr} (strategies: {strategies})")
    })
}

async fn store_metrics(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    scrape(shared, Page::Store, &headers).await
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
    let rendered = tokio::task::spawn_blocking(move || render_page(&shared, page, gzip)).await;
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
        Ok(Err(ScrapeError::Failed(err))) => text_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("scrape failed: {err:#}\n"),
        ),
        Err(join) => text_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("scrape failed: {join}\n"),
        ),
    }
}

enum ScrapeError {
    BadRequest(String),
    Failed(anyhow::Error),
}

/// Returns the body and whether it is gzipped.
fn render_page(shared: &Shared, page: Page, gzip: bool) -> Result<(Vec<u8>, bool), ScrapeError> {
    let last_len = shared.last_len.load(Ordering::Relaxed);
    let mut out = Vec::with_capacity(last_len + last_len / 8);
    {
        // A panic while rendering leaves nothing half-updated that matters; keep serving.
        let mut source = shared.source.lock().unwrap_or_else(|e| e.into_inner());
        match (&mut *source, page) {
            (Source::Store(exporter), Page::Store) => exporter
                .export_into(&mut out)
                .map_err(ScrapeError::Failed)?,
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
    }
    shared.last_len.store(out.len(), Ordering::Relaxed);
    if !gzip {
        return Ok((out, false));
    }
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(out.len() / 8),
        flate2::Compression::fast(),
    );
    let compressed = encoder
        .write_all(&out)
        .and_then(|()| encoder.finish())
        .map_err(|e| ScrapeError::Failed(e.into()))?;
    Ok((compressed, true))
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
    let decoded = promlab::formenc::decode_component(s.as_bytes())
        .map_err(|_| format!("bad percent-encoding in query: {s:?}\n"))?;
    String::from_utf8(decoded.into_owned())
        .map_err(|_| format!("query is not UTF-8 after decoding: {s:?}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
