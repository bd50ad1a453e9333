//! `promlab serve [--plan FILE]`: the remote-write receiver.
//!
//! - `POST /api/v1/write`: 204; 400 for a bad snappy block, bad protobuf, or an
//!   invalid series (missing `__name__`, unsorted or duplicate label names); 415
//!   for a content type other than remote write 1.0's `application/x-protobuf`
//!   (optionally `;proto=prometheus.WriteRequest`; 2.0's
//!   `proto=io.prometheus.write.v2.Request` is named in the answer) or a content
//!   encoding other than `snappy`; 413 for a body over `--max-body-bytes`, a
//!   snappy header announcing more than that once decoded (checked before
//!   allocating), or more samples than `--max-samples-per-request`. A refused
//!   request changes nothing. Samples past the ingester's other limits (too far
//!   ahead of the clock, a new group past the group limit, no pane slot or bin
//!   left) are counted by reason in `/metrics` and dropped; the rest of the
//!   request is applied and answered 204.
//! - `GET /api/v1/quantiles?agg=ID[&window=START_MS]`: per group, the quantiles of
//!   the last closed window (or the named one), groups sorted by their labels.
//! - `GET /metrics`: the receiver's own counters.
//! - `POST /-/reload`: re-reads the plan file (bumps the plan generation); a
//!   file that is not a regular file of at most 16 MiB, or not a valid plan,
//!   is refused (400, with the reason) and the old plan keeps running.

use crate::cluster::export::{ExportConfig, Exporter};
use anyhow::Result;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use promlab::ingest::lanes::{LanedIngester, MAX_LANES};
use promlab::ingest::pipeline::{IngestError, Ingester, Limits};
use promlab::ingest::plan::Plan;
use promlab::ingest::window::Stats;
// Parsed here by axum's `Query` (serde_urlencoded), as the fuzz target parses it.
use promlab::format::text::FamilyEncoder;
use promlab::ingest::query::QuantileParams;
use promlab::ingest::window::closed_windows_generation;
use promlab::ingest::wire;
use promlab::shared::strategy::StrategySet;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The receiver's shared state.
pub struct Receiver {
    /// One lane per `--ingest-threads` (each request on a free one).
    pub ingester: LanedIngester,
    plan_path: Option<PathBuf>,
    max_body_bytes: usize,
    /// Requests answered, by status class.
    status_counts: [AtomicU64; STATUSES.len()],
    /// Per aggregation, its last closed window's answer, kept out of the
    /// ingester's lock (see [`KeptAnswers`]).
    answers: KeptAnswers,
    /// Request buffers kept for the next requests (see [`RequestBuffers`]).
    spare_buffers: Mutex<Vec<RequestBuffers>>,
    /// How many of them are kept: one per lane, and one for a request
    /// reading its body while every lane is busy (with fewer, each tick of a
    /// two-connection sender on one lane allocated and zeroed a fresh 3.6 MB).
    spare_limit: usize,
    /// Held while a reload reads and installs a plan: one at a time.
    reloading: Mutex<()>,
    /// `--clickhouse`: each closed window's bins to a ClickHouse node.
    pub cluster: std::sync::OnceLock<Arc<Exporter>>,
}

/// What the ClickHouse exporter reads closed windows from.
impl AsRef<LanedIngester> for Receiver {
    fn as_ref(&self) -> &LanedIngester {
        &self.ingester
    }
}

/// One request's buffers: its body as read, and that body decompressed.
/// Reused: fresh ones cost a page fault per 4 KiB written (the paced feed,
/// two 0.76 MB bodies a second: 3,700–7,100 faults in 20 s, 750–1,080 with
/// buffers kept). Kept per receiver, not per blocking-pool thread, so what is
/// held is bounded by the lanes, not by the 16 threads × `--max-body-bytes`.
#[derive(Default)]
struct RequestBuffers {
    body: Vec<u8>,
    decoded: Vec<u8>,
}

/// A kept buffer's largest capacity: what one large request needed is not
/// held for every later one (remote-write senders send 0.1–4 MB bodies).
const KEEP_BUFFER_BYTES: usize = 8 << 20;

/// Per aggregation, the answer to `/api/v1/quantiles?agg=ID` (the last closed
/// window) with the [`closed_windows_generation`] it was taken at. While the
/// generation stands the answer stands, so the query route serves it on the
/// runtime worker — a clone of shared bytes under a lock held for that long —
/// without waiting for the ingester's lock (held through each ingest) or a
/// blocking-pool thread. Holds only aggregations of the plan (taken when
/// found; cleared on reload), the latest answer of each.
#[derive(Default)]
struct KeptAnswers(Mutex<HashMap<String, (u64, Bytes)>>);

impl KeptAnswers {
    fn get(&self, agg: &str) -> Option<Bytes> {
        let generation = closed_windows_generation();
        let answers = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match answers.get(agg) {
            Some((taken, answer)) if *taken == generation => Some(answer.clone()),
            _ => None,
        }
    }

    /// Keeps `answer`, taken at `generation` under the ingester's lock (still held).
    fn keep(&self, agg: &str, generation: u64, answer: Bytes) {
        let mut answers = self.0.lock().unwrap_or_else(|p| p.into_inner());
        answers.retain(|_, (taken, _)| *taken == generation);
        answers.insert(agg.to_owned(), (generation, answer));
    }

    fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

const STATUSES: [u16; 6] = [204, 400, 408, 413, 415, 500];

impl Receiver {
    /// `ingester` as given (its limits and decode bound included:
    /// [`Limits::serving`] for `promlab serve`).
    pub fn new(
        ingester: LanedIngester,
        plan_path: Option<PathBuf>,
        max_body_bytes: usize,
    ) -> Arc<Self> {
        let receiver = Arc::new(Receiver {
            plan_path,
            max_body_bytes,
            status_counts: Default::default(),
            answers: KeptAnswers::default(),
            spare_buffers: Mutex::new(Vec::new()),
            reloading: Mutex::new(()),
            spare_limit: ingester.lanes() + 1,
            ingester,
            cluster: std::sync::OnceLock::new(),
        });
        start_clock(&receiver);
        receiver
    }

    fn take_buffers(&self) -> RequestBuffers {
        let mut spare = self.spare_buffers.lock().unwrap_or_else(|p| p.into_inner());
        spare.pop().unwrap_or_default()
    }

    /// Keeps `buffers` for a later request, up to `lanes + 1` sets, each
    /// buffer only up to [`KEEP_BUFFER_BYTES`]: at most `(lanes + 1) × 16 MiB` held.
    fn give_back(&self, mut buffers: RequestBuffers) {
        for buf in [&mut buffers.body, &mut buffers.decoded] {
            if buf.capacity() > KEEP_BUFFER_BYTES {
                *buf = Vec::new();
            }
            buf.clear();
        }
        let mut spare = self.spare_buffers.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < self.spare_limit {
            spare.push(buffers);
        }
    }

    fn count(&self, status: StatusCode) {
        if let Some(i) = STATUSES.iter().position(|&s| s == status.as_u16()) {
            self.status_counts[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Every [`CLOCK_TICK`], while the receiver lives, closes the windows the
/// clock has passed since samples stamped ahead of it came
/// ([`LanedIngester::advance_with_clock`]): a sender that stops after such
/// samples does not leave its last window open.
fn start_clock(receiver: &Arc<Receiver>) {
    let receiver = Arc::downgrade(receiver);
    let clock = move || loop {
        std::thread::sleep(CLOCK_TICK);
        let Some(receiver) = receiver.upgrade() else {
            return;
        };
        receiver.ingester.advance_with_clock();
    };
    if let Err(e) = std::thread::Builder::new()
        .name("promlab-clock".into())
        .spawn(clock)
    {
        eprintln!("promlab serve: no clock thread ({e}): windows close on requests alone");
    }
}

/// How often the clock may close a window.
const CLOCK_TICK: std::time::Duration = std::time::Duration::from_millis(100);

/// The router, for tests and for [`serve`].
pub fn app(receiver: Arc<Receiver>) -> Router {
    // No body limit layer: the write route reads its body itself, within
    // `--max-body-bytes` (`read_body`), and no other route reads one.
    Router::new()
        .route("/api/v1/write", post(write))
        .route("/api/v1/quantiles", get(quantiles))
        .route("/metrics", get(metrics))
        .route("/-/reload", post(reload))
        .route("/-/healthy", get(super::healthy))
        // The plan is loaded and the lanes built before the server listens,
        // so a receiver that answers can ingest.
        .route("/-/ready", get(|| async { super::ready(None) }))
        .with_state(receiver)
}

/// What `promlab serve` without `--store`/`--scenario` runs.
#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    pub listen: SocketAddr,
    /// The aggregation plan's file (reloaded by `POST /-/reload`); the default plan when none.
    pub plan: Option<PathBuf>,
    /// Largest accepted request body, compressed and decoded, in bytes.
    pub max_body_bytes: usize,
    pub strategies: StrategySet,
    /// What the ingester takes and holds.
    pub limits: Limits,
    /// What a client may hold of the server.
    pub server: super::ServerLimits,
    /// Lanes: requests ingesting at once, each on a whole ingester; 0: one per core.
    pub ingest_threads: usize,
    /// `--clickhouse`: where closed windows go, besides memory.
    pub clickhouse: Option<ExportConfig>,
}

/// Runs the receiver until Ctrl-C or SIGTERM (blocking; builds its own runtime).
pub fn serve(config: ReceiverConfig) -> Result<()> {
    let plan = Plan::load_or_default(config.plan.as_deref())?;
    let threads = match config.ingest_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .clamp(1, MAX_LANES);
    let lane = || {
        Ingester::new(plan.clone(), config.strategies)
            .with_limits(config.limits)
            .with_max_decoded(config.max_body_bytes)
    };
    let receiver = Receiver::new(
        LanedIngester::new(threads, lane),
        config.plan.clone(),
        config.max_body_bytes,
    );
    let exporter = match config.clickhouse.clone() {
        Some(export) => {
            let exporter = Exporter::start(export, receiver.clone())?;
            let _ = receiver.cluster.set(exporter.clone());
            Some(exporter)
        }
        None => None,
    };
    let strategies = config.strategies;
    let served = super::run(
        config.listen,
        Some(2),
        app(receiver),
        config.server,
        |addr| {
            eprintln!("promlab: remote-write receiver on http://{addr}/api/v1/write (strategies: {strategies}; ingest threads: {threads})")
        },
    );
    // A clean stop: the open windows and the queue to ClickHouse written, within the shutdown timeout.
    if let Some(exporter) = exporter {
        if !exporter.shutdown(config.server.shutdown_timeout) {
            eprintln!("promlab: ClickHouse: stopped with batches unwritten (the query flags their windows incomplete)");
        }
    }
    served
}

/// Remote write 1.0's media type, and the `proto` parameter naming it (optional).
const PROTOBUF: &str = "application/x-protobuf";
const PROTO_V1: &str = "prometheus.WriteRequest";
const PROTO_V2: &str = "io.prometheus.write.v2.Request";

/// Accepts remote write 1.0's content type, exactly: `application/x-protobuf`,
/// any case, with optional parameters of which `proto`, if given, must name 1.0.
fn check_content_type(content_type: &str) -> Result<(), String> {
    let mut parts = content_type.split(';');
    let media = parts.next().unwrap_or("").trim();
    if !media.eq_ignore_ascii_case(PROTOBUF) {
        return Err(format!(
            "expected Content-Type {PROTOBUF} (remote write 1.0), got {content_type:?}\n"
        ));
    }
    for param in parts {
        let (name, value) = param.split_once('=').unwrap_or((param, ""));
        if !name.trim().eq_ignore_ascii_case("proto") {
            continue;
        }
        match value.trim().trim_matches('"') {
            PROTO_V1 => {}
            PROTO_V2 => {
                return Err(format!(
                    "remote write 2.0 ({PROTO_V2}) is not supported; send 1.0 ({PROTOBUF};proto={PROTO_V1}), e.g. protobuf_message: prometheus.WriteRequest in Prometheus' remote_write\n"
                ))
            }
            other => {
                return Err(format!(
                    "unknown remote-write message proto={other:?}; this receiver takes {PROTO_V1}\n"
                ))
            }
        }
    }
    Ok(())
}

async fn write(State(rx): State<Arc<Receiver>>, headers: HeaderMap, body: Body) -> Response {
    let mut buffers = rx.take_buffers();
    let response = match read_body(body, rx.max_body_bytes, &mut buffers.body).await {
        Err(refused) => {
            rx.give_back(buffers);
            refused
        }
        Ok(()) => {
            let receiver = Arc::clone(&rx);
            let (response, buffers) = off_the_runtime(move || {
                let response = write_inner(&receiver, &headers, &mut buffers);
                (response, buffers)
            })
            .await;
            rx.give_back(buffers);
            response
        }
    };
    rx.count(response.0);
    response.into_response()
}

/// Reads the request body into `buf`, as it arrives (so each piece is copied
/// while still in cache, and hyper's read buffer is free to be reused); 413
/// past `limit`, told by `Content-Length` before anything is read.
async fn read_body(
    mut body: Body,
    limit: usize,
    buf: &mut Vec<u8>,
) -> Result<(), (StatusCode, String)> {
    use axum::body::HttpBody;
    use http_body_util::BodyExt;
    let too_large = |len: u64| {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body of {len} bytes or more exceeds {limit}\n"),
        )
    };
    let announced = body.size_hint().lower();
    if announced > limit as u64 {
        return Err(too_large(announced));
    }
    buf.reserve(announced as usize);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            let e = e.into_inner();
            if let Some(late) = e.downcast_ref::<super::BodyTimeout>() {
                return (StatusCode::REQUEST_TIMEOUT, format!("{late}\n"));
            }
            (
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {e}\n"),
            )
        })?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return Err(too_large((buf.len() + data.len()) as u64));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(())
}

/// Runs `work` on the blocking pool: ingesting takes CPU and the ingester's
/// lock (a baseline 50,000-row request, about a second), and on a runtime
/// worker it would stop that worker accepting and reading other connections
/// meanwhile — with two workers, a busy receiver would not read a new
/// client's headers for seconds.
async fn off_the_runtime<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

fn write_inner(
    rx: &Receiver,
    headers: &HeaderMap,
    buffers: &mut RequestBuffers,
) -> (StatusCode, String) {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if let Err(message) = check_content_type(content_type) {
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, message);
    }
    if let Some(encoding) = headers.get(header::CONTENT_ENCODING) {
        if !encoding.as_bytes().eq_ignore_ascii_case(b"snappy") {
            return (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("expected Content-Encoding snappy, got {encoding:?}\n"),
            );
        }
    }
    // The body is within `--max-body-bytes` (`read_body` refused it otherwise).
    // Decompressed outside the lanes' locks; a free lane applies it.
    let result: Result<Stats, IngestError> =
        match wire::decompress_reusing(&buffers.body, rx.max_body_bytes, &mut buffers.decoded) {
            Ok(decoded) => rx.ingester.handle_decoded(decoded),
            Err(e) => Err(e.into()),
        };
    match result {
        Ok(_) => (StatusCode::NO_CONTENT, String::new()),
        Err(e) => (
            StatusCode::from_u16(e.status()).expect("a valid status"),
            format!("{e}\n"),
        ),
    }
}

async fn quantiles(
    State(rx): State<Arc<Receiver>>,
    Query(params): Query<QuantileParams>,
) -> Response {
    const JSON: [(header::HeaderName, &str); 1] = [(header::CONTENT_TYPE, "application/json")];
    // The last closed window's answer, while it stands: no lock wait, no hop.
    if params.window.is_none() {
        if let Some(answer) = rx.answers.get(&params.agg) {
            return (JSON, answer).into_response();
        }
    }
    let agg = params.agg.clone();
    // Computing an answer takes up to milliseconds and the home lane's lock.
    let answer = off_the_runtime(move || {
        let mut json = Vec::new();
        // Taken before the answer: the answer is at least as new as its stamp.
        let generation = closed_windows_generation();
        if !rx.ingester.query_json(&agg, params.window, &mut json) {
            return None;
        }
        let json = Bytes::from(json);
        if params.window.is_none() {
            rx.answers.keep(&agg, generation, json.clone());
        }
        Some(json)
    })
    .await;
    match answer {
        Some(json) => (JSON, json).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no aggregation `{}` in the plan\n", params.agg),
        )
            .into_response(),
    }
}

/// `POST /-/reload`: reads the plan file on the blocking pool (a regular
/// file, opened without blocking, size-capped: `Plan::load`), one reload at
/// a time, so no file can stall a runtime worker; a plan that does not load
/// is refused with the reason (400) and the old one keeps running.
async fn reload(State(rx): State<Arc<Receiver>>) -> Response {
    let Some(path) = rx.plan_path.clone() else {
        return (StatusCode::BAD_REQUEST, "no --plan file to reload\n").into_response();
    };
    let receiver = Arc::clone(&rx);
    let loaded = off_the_runtime(move || {
        let _one_at_a_time = receiver.reloading.lock().unwrap_or_else(|p| p.into_inner());
        let plan = Plan::load(&path)?;
        let ingester = &receiver.ingester;
        ingester.set_plan(plan);
        // An aggregation the plan dropped has no answer now.
        receiver.answers.clear();
        anyhow::Ok(ingester.generation())
    })
    .await;
    match loaded {
        Ok(generation) => format!("plan generation {generation}\n").into_response(),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            format!("plan not reloaded, the previous one stays: {e:#}\n"),
        )
            .into_response(),
    }
}

async fn metrics(State(rx): State<Arc<Receiver>>) -> Response {
    let receiver = Arc::clone(&rx);
    let (counters, held, reclaimed) = off_the_runtime(move || {
        let ingester = &receiver.ingester;
        (
            ingester.counters(),
            ingester.held(),
            ingester.groups_reclaimed(),
        )
    })
    .await;
    let promlab::ingest::lanes::LaneCounters {
        totals,
        cache,
        footprint,
        generation,
        limits,
    } = counters;
    let lookups = cache.hits + cache.misses;
    let hit_rate = if lookups == 0 {
        0.0
    } else {
        cache.hits as f64 / lookups as f64
    };
    enum Sample {
        Integer(u64),
        Float(f64),
    }
    let families = [
        (
            "promlab_ingest_requests_total",
            "counter",
            "Write requests applied.",
            Sample::Integer(totals.requests),
        ),
        (
            "promlab_ingest_series_total",
            "counter",
            "Series in applied write requests.",
            Sample::Integer(totals.series),
        ),
        (
            "promlab_ingest_samples_total",
            "counter",
            "Samples in applied write requests.",
            Sample::Integer(totals.samples),
        ),
        (
            "promlab_ingest_samples_accepted_total",
            "counter",
            "(Sample, aggregation) pairs added to a window.",
            Sample::Integer(totals.accepted),
        ),
        (
            "promlab_ingest_samples_late_total",
            "counter",
            "(Sample, aggregation) pairs dropped because their window had closed.",
            Sample::Integer(totals.late),
        ),
        (
            "promlab_ingest_samples_rejected_total",
            "counter",
            "Samples rejected for a NaN or infinite value.",
            Sample::Integer(totals.rejected),
        ),
        (
            "promlab_ingest_samples_stale_total",
            "counter",
            "Stale markers skipped.",
            Sample::Integer(totals.stale),
        ),
        (
            "promlab_ingest_samples_unrouted_total",
            "counter",
            "Samples of series no aggregation matches.",
            Sample::Integer(totals.unrouted),
        ),
        (
            "promlab_ingest_metadata_total",
            "counter",
            "Metadata entries received (and dropped).",
            Sample::Integer(totals.metadata),
        ),
        (
            "promlab_series_cache_hits_total",
            "counter",
            "Series-cache lookups that hit.",
            Sample::Integer(cache.hits),
        ),
        (
            "promlab_series_cache_misses_total",
            "counter",
            "Series-cache lookups that missed.",
            Sample::Integer(cache.misses),
        ),
        (
            "promlab_series_cache_evicted_total",
            "counter",
            "Series-cache entries dropped because it was full.",
            Sample::Integer(cache.evicted),
        ),
        (
            "promlab_series_cache_invalidated_total",
            "counter",
            "Series-cache entries dropped by a plan change.",
            Sample::Integer(cache.invalidated),
        ),
        (
            "promlab_series_cache_entries",
            "gauge",
            "Series-cache entries.",
            Sample::Integer(cache.entries),
        ),
        (
            "promlab_series_cache_capacity",
            "gauge",
            "Series-cache bound (entries).",
            Sample::Integer(cache.capacity),
        ),
        (
            "promlab_series_cache_hit_ratio",
            "gauge",
            "Hits over lookups since start.",
            Sample::Float(hit_rate),
        ),
        (
            "promlab_plan_generation",
            "gauge",
            "Plan generation (bumped by every reload).",
            Sample::Integer(generation),
        ),
        (
            "promlab_sketch_panes",
            "gauge",
            "Sketch panes held (open and closed windows).",
            Sample::Integer(footprint.0 as u64),
        ),
        (
            "promlab_sketch_bins",
            "gauge",
            "Sketch bins held.",
            Sample::Integer(footprint.1 as u64),
        ),
    ];
    // The library's exposition encoder, as every other writer of the format.
    let mut out = Vec::new();
    for (name, kind, help, sample) in families {
        let mut family = FamilyEncoder::new(&mut out, name.as_bytes(), kind, help.as_bytes());
        let value = family.sample(b"").value();
        match sample {
            Sample::Integer(v) => value.integer(v),
            Sample::Float(v) => value.ruby_float(v),
        }
    }
    let mut family = FamilyEncoder::new(
        &mut out,
        b"promlab_receiver_samples_dropped_total",
        "counter",
        b"Samples (or sample, aggregation pairs) dropped past a limit, by reason; their requests were applied otherwise.",
    );
    for (reason, n) in [
        ("too_far_ahead", totals.too_far_ahead),
        ("group_limit", totals.over_group_limit),
        ("pane_limit", totals.over_pane_limit),
        ("bin_limit", totals.over_bin_limit),
    ] {
        family
            .sample(b"")
            .label(b"reason", reason.as_bytes())
            .value()
            .integer(n);
    }
    for (name, help, value, limit) in [
        (
            "groups",
            "Groups held, over all aggregations.",
            held.groups,
            limits.capacity.groups,
        ),
        (
            "pane_slots",
            "Pane slots held (per window, one per group id up to the highest with a pane).",
            held.pane_slots,
            limits.capacity.pane_slots,
        ),
        (
            "sketch_bins",
            "Sketch bins held, counted as the limit counts them.",
            held.bins,
            limits.capacity.bins,
        ),
    ] {
        let gauge = format!("promlab_receiver_{name}");
        FamilyEncoder::new(&mut out, gauge.as_bytes(), "gauge", help.as_bytes())
            .sample(b"")
            .value()
            .integer(value as u64);
        if limit != usize::MAX {
            let gauge = format!("promlab_receiver_{name}_limit");
            FamilyEncoder::new(&mut out, gauge.as_bytes(), "gauge", b"Its limit.")
                .sample(b"")
                .value()
                .integer(limit as u64);
        }
    }
    // Absent before the first close; i64::MAX once a shutdown closed every window.
    if let Some(through) = rx.ingester.closed_through() {
        FamilyEncoder::new(
            &mut out,
            b"promlab_receiver_closed_through_ms",
            "gauge",
            b"Every window ending at or before this instant (ms since the epoch) is closed: the watermark at the last close.",
        )
        .sample(b"")
        .value()
        .integer(through.max(0) as u64);
    }
    FamilyEncoder::new(
        &mut out,
        b"promlab_receiver_groups_reclaimed_total",
        "counter",
        b"Groups reclaimed because no window held a pane of theirs any more (their ids reused).",
    )
    .sample(b"")
    .value()
    .integer(reclaimed);
    super::write_connection_metrics(&mut out);
    let mut family = FamilyEncoder::new(
        &mut out,
        b"promlab_http_write_responses_total",
        "counter",
        b"Write responses by status.",
    );
    for (status, n) in STATUSES.iter().zip(&rx.status_counts) {
        family
            .sample(b"")
            .label(b"code", status.to_string().as_bytes())
            .value()
            .integer(n.load(Ordering::Relaxed));
    }
    if let Some(cluster) = rx.cluster.get() {
        cluster.encode_metrics(&mut out);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::HttpBody;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A body sent in pieces with no length announced (chunked).
    struct Pieces(Vec<&'static [u8]>);

    impl HttpBody for Pieces {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
            if self.0.is_empty() {
                return Poll::Ready(None);
            }
            let piece = self.0.remove(0);
            Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from_static(
                piece,
            )))))
        }
    }

    fn pieces() -> Body {
        Body::new(Pieces(vec![&[1; 40], &[2; 40], &[3; 40]]))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_or_refused_past_the_limit() {
        let mut buf = Vec::new();
        read_body(pieces(), 120, &mut buf).await.unwrap();
        assert_eq!(buf, [[1u8; 40], [2; 40], [3; 40]].concat());
        // No length announced: refused when the piece that crosses the limit arrives.
        let mut buf = Vec::new();
        let (status, message) = read_body(pieces(), 100, &mut buf).await.unwrap_err();
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(message.contains("exceeds 100"), "{message}");
        // Announced: refused before anything is read.
        let mut buf = Vec::new();
        let announced = Body::from(vec![0u8; 101]);
        assert_eq!(
            read_body(announced, 100, &mut buf).await.unwrap_err().0,
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(buf.capacity(), 0);
    }

    /// Kept buffers are bounded: one set per lane and one more, none past `KEEP_BUFFER_BYTES`.
    #[test]
    fn kept_buffers_are_one_set_a_lane_and_bounded_in_size() {
        let lane = || Ingester::new(Plan::default(), StrategySet::all());
        let rx = Receiver::new(LanedIngester::new(2, lane), None, 64 << 20);
        let mut sets: Vec<RequestBuffers> = (0..4).map(|_| rx.take_buffers()).collect();
        sets[0].body = Vec::with_capacity(KEEP_BUFFER_BYTES + 1);
        sets[0].decoded = vec![7; 1000];
        for set in sets {
            rx.give_back(set);
        }
        let spare = rx.spare_buffers.lock().unwrap();
        assert_eq!(spare.len(), 3);
        assert_eq!(spare[0].body.capacity(), 0, "too large to keep");
        assert!(spare[0].decoded.is_empty() && spare[0].decoded.capacity() >= 1000);
    }

    /// The content type was matched by prefix.
    #[test]
    fn content_type_is_matched_exactly() {
        for ok in [
            "application/x-protobuf",
            "Application/X-Protobuf",
            " application/x-protobuf ",
            "application/x-protobuf;proto=prometheus.WriteRequest",
            "application/x-protobuf; proto=\"prometheus.WriteRequest\"; charset=binary",
        ] {
            assert_eq!(check_content_type(ok), Ok(()), "{ok}");
        }
        for (bad, says) in [
            ("application/x-protobufXYZ", "expected Content-Type"),
            ("application/x-protobuf2", "expected Content-Type"),
            ("", "expected Content-Type"),
            ("text/plain", "expected Content-Type"),
            (
                "application/x-protobuf;proto=io.prometheus.write.v2.Request",
                "2.0",
            ),
            ("application/x-protobuf;proto=foo.Bar", "unknown"),
        ] {
            let err = check_content_type(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
