//! `promlab serve --clickhouse URL`: each closed window's panes, as bins, to
//! the node at URL, without ingest ever waiting on it. Given several URLs (the
//! replicas of the receiver's shard), the writer keeps to one while it takes
//! the batches and moves to the next when an insert fails.
//!
//! Two threads. The *collector* wakes when any window closes (the library's
//! closed-windows generation moves), takes the home lane's lock for as long
//! as it takes to encode the windows closed since it last looked (the
//! receiver keeps `keep_windows` closed windows, so none is gone before it
//! looks), and queues them as one batch with a progress row. The *writer*
//! inserts the batches in order, retrying each (on the next URL, and with
//! backoff, 100 ms doubling to 5 s, once every URL failed) until a node takes it. The queue is bounded in bytes: a batch
//! that does not fit is dropped and counted, and in its place goes a row per
//! window saying it was lost (with its samples), so the query flags them
//! instead of answering a silently partial quantile.
//!
//! On a clean stop every open window is closed and written too, and a
//! `stopped` row ends the incarnation: a restarted receiver adds its part of
//! the window it restarted in, and nothing is lost. On SIGKILL the open
//! windows die with the process; the restarted incarnation's `started` row
//! lets the query flag the windows the dead one had open.

use super::client::{ClickHouse, Error};
use super::schema::{Batch, Event, Origin, Schema};
use promlab::format::text::FamilyEncoder;
use promlab::ingest::distributed::{group_key, PaneRows};
use promlab::ingest::lanes::LanedIngester;
use promlab::ingest::window::closed_windows_generation;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What `serve --clickhouse` was told.
#[derive(Clone, Debug)]
pub struct ExportConfig {
    /// The HTTP interfaces of the nodes written to (a shard's replicas), in
    /// the order they are tried.
    pub urls: Vec<String>,
    pub schema: Schema,
    /// This receiver's id, the same across its restarts.
    pub receiver: String,
    /// Bytes of encoded batches held while the node does not take them.
    pub queue_bytes: usize,
    /// One insert's deadline.
    pub timeout: Duration,
}

/// The default bound of the queue: about twenty windows of 1,000 groups
/// (12 MB a window of the seed's workload on one receiver).
pub const DEFAULT_QUEUE_BYTES: usize = 256 << 20;

/// Counters for `/metrics`.
#[derive(Default)]
pub struct ExportStats {
    pub batches_written: AtomicU64,
    pub rows_written: AtomicU64,
    pub windows_written: AtomicU64,
    pub bytes_written: AtomicU64,
    pub insert_failures: AtomicU64,
    pub batches_dropped: AtomicU64,
    pub windows_dropped: AtomicU64,
    pub rows_dropped: AtomicU64,
    pub samples_dropped: AtomicU64,
    /// The latest progress row written: every window ending at or before it is in the node.
    pub written_through_ms: AtomicI64,
}

struct Queue {
    batches: VecDeque<Batch>,
    /// Bytes of the batches queued and of the one being inserted.
    bytes: usize,
    /// The writer holds a batch (popped, still counted in `bytes`).
    in_flight: bool,
}

struct Shared {
    origin: Origin,
    config: ExportConfig,
    queue: Mutex<Queue>,
    /// Signalled when a batch is queued, or one is written, or on stop.
    changed: Condvar,
    stop_collector: AtomicBool,
    /// The writer gives up retrying at this instant (set on stop).
    writer_deadline: Mutex<Option<Instant>>,
    stats: ExportStats,
}

/// A running exporter (see the module doc).
pub struct Exporter {
    shared: Arc<Shared>,
    ingester: Arc<dyn AsRef<LanedIngester> + Send + Sync>,
    collector: Mutex<Option<std::thread::JoinHandle<Collector>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// What the collector remembers between looks.
#[derive(Default)]
struct Collector {
    /// Per aggregation id, the newest window start queued.
    queued_through: HashMap<String, i64>,
    /// The `closed_through` of the last progress row queued.
    progress: Option<i64>,
}

fn now_ms() -> i64 {
    promlab::ingest::pipeline::system_clock_ms()
}

impl Exporter {
    /// Starts both threads for the receiver whose ingester `ingester` gives,
    /// and queues this incarnation's `started` row.
    pub fn start(
        config: ExportConfig,
        ingester: Arc<dyn AsRef<LanedIngester> + Send + Sync>,
    ) -> anyhow::Result<Arc<Exporter>> {
        if config.urls.is_empty() {
            anyhow::bail!("no ClickHouse URL to write to");
        }
        let nodes = config
            .urls
            .iter()
            .map(|url| ClickHouse::new(url, config.timeout))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let origin = Origin {
            receiver: config.receiver.clone(),
            incarnation,
        };
        let mut started = Batch::default();
        started.event(&origin, Event::Started, now_ms(), "", 0, 0, 0);
        let shared = Arc::new(Shared {
            origin,
            queue: Mutex::new(Queue {
                bytes: started.bytes(),
                batches: VecDeque::from([started]),
                in_flight: false,
            }),
            config,
            changed: Condvar::new(),
            stop_collector: AtomicBool::new(false),
            writer_deadline: Mutex::new(None),
            stats: ExportStats {
                written_through_ms: AtomicI64::new(i64::MIN),
                ..ExportStats::default()
            },
        });
        let writer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("clickhouse-writer".into())
                .spawn(move || write_loop(&shared, &nodes))?
        };
        let collector = {
            let (shared, ingester) = (Arc::clone(&shared), Arc::clone(&ingester));
            std::thread::Builder::new()
                .name("clickhouse-collector".into())
                .spawn(move || collect_loop(&shared, (*ingester).as_ref()))?
        };
        Ok(Arc::new(Exporter {
            shared,
            ingester,
            collector: Mutex::new(Some(collector)),
            writer: Mutex::new(Some(writer)),
        }))
    }

    pub fn stats(&self) -> &ExportStats {
        &self.shared.stats
    }

    pub fn origin(&self) -> &Origin {
        &self.shared.origin
    }

    /// (batches, bytes) queued, the one in flight included.
    pub fn queued(&self) -> (usize, usize) {
        let q = lock(&self.shared.queue);
        (q.batches.len() + usize::from(q.in_flight), q.bytes)
    }

    /// A clean stop: closes every open window, queues it with a `stopped`
    /// row, and gives the writer until `within` from now to write everything.
    /// Returns whether everything was written.
    pub fn shutdown(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        self.shared.stop_collector.store(true, Ordering::Release);
        self.shared.changed.notify_all();
        let collector = lock(&self.collector).take().and_then(|h| h.join().ok());
        let ingester = (*self.ingester).as_ref();
        ingester.flush();
        if let Some(mut collector) = collector {
            let mut batch = collect(&self.shared, ingester, &mut collector).unwrap_or_default();
            batch.event(&self.shared.origin, Event::Stopped, now_ms(), "", 0, 0, 0);
            enqueue(&self.shared, batch);
        }
        *lock(&self.shared.writer_deadline) = Some(deadline);
        self.shared.changed.notify_all();
        if let Some(writer) = lock(&self.writer).take() {
            let _ = writer.join();
        }
        self.queued().0 == 0
    }

    /// The exporter's families, appended to a `/metrics` answer.
    pub fn encode_metrics(&self, out: &mut Vec<u8>) {
        let s = &self.shared.stats;
        let (batches, bytes) = self.queued();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let counters = [
            (
                "batches_written_total",
                "Batches (one per window close) the node took.",
                load(&s.batches_written),
            ),
            (
                "rows_written_total",
                "Pane rows (one per group of each window) the node took.",
                load(&s.rows_written),
            ),
            (
                "windows_written_total",
                "Closed windows the node took (per aggregation).",
                load(&s.windows_written),
            ),
            (
                "bytes_written_total",
                "RowBinary bytes the node took.",
                load(&s.bytes_written),
            ),
            (
                "insert_failures_total",
                "Inserts that failed and were retried.",
                load(&s.insert_failures),
            ),
            (
                "batches_dropped_total",
                "Batches dropped because the queue was at its bound.",
                load(&s.batches_dropped),
            ),
            (
                "windows_dropped_total",
                "Closed windows dropped with them (flagged lost in the cluster).",
                load(&s.windows_dropped),
            ),
            (
                "rows_dropped_total",
                "Rows dropped with them.",
                load(&s.rows_dropped),
            ),
            (
                "samples_dropped_total",
                "Samples of the windows dropped.",
                load(&s.samples_dropped),
            ),
        ];
        for (name, help, value) in counters {
            let name = format!("promlab_clickhouse_{name}");
            FamilyEncoder::new(out, name.as_bytes(), "counter", help.as_bytes())
                .sample(b"")
                .value()
                .integer(value);
        }
        let through = s.written_through_ms.load(Ordering::Relaxed);
        let gauges = [
            (
                "queue_batches",
                "Batches waiting for the node (the one being inserted included).",
                batches as u64,
            ),
            ("queue_bytes", "Bytes they hold.", bytes as u64),
            (
                "queue_bytes_limit",
                "The bound on those bytes (--clickhouse-queue-bytes).",
                self.shared.config.queue_bytes as u64,
            ),
        ];
        for (name, help, value) in gauges {
            let name = format!("promlab_clickhouse_{name}");
            FamilyEncoder::new(out, name.as_bytes(), "gauge", help.as_bytes())
                .sample(b"")
                .value()
                .integer(value);
        }
        let mut family = FamilyEncoder::new(
            out,
            b"promlab_clickhouse_written_through_ms",
            "gauge",
            b"Every window ending at or before this (ms since the epoch) is in the node; -1 before the first.",
        );
        let value = family.sample(b"").value();
        if through == i64::MIN {
            value.ruby_float(-1.0);
        } else {
            value.integer(through as u64);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Polls the closed-windows generation (every 50 ms) and queues what closed.
fn collect_loop(shared: &Shared, ingester: &LanedIngester) -> Collector {
    let mut collector = Collector::default();
    let mut seen = u64::MAX;
    while !shared.stop_collector.load(Ordering::Acquire) {
        let generation = closed_windows_generation();
        if generation != seen {
            seen = generation;
            if let Some(batch) = collect(shared, ingester, &mut collector) {
                enqueue(shared, batch);
            }
        }
        let q = lock(&shared.queue);
        let _ = shared
            .changed
            .wait_timeout(q, Duration::from_millis(50))
            .map(drop);
    }
    collector
}

/// The windows closed since the collector last looked, and a progress row,
/// as one batch (`None` when nothing changed).
fn collect(shared: &Shared, ingester: &LanedIngester, collector: &mut Collector) -> Option<Batch> {
    let origin = &shared.origin;
    ingester.with_home(|home, closed_through| {
        let mut batch = Batch::default();
        for agg in &home.plan().plan.aggregations {
            let after = collector.queued_through.get(&agg.id).copied();
            let Some(windows) = home.closed_bins_after(&agg.id, after) else {
                continue;
            };
            for window in windows {
                let mut samples = 0;
                for (labels, bins) in &window.groups {
                    samples += bins.count();
                    let key = group_key(agg, labels);
                    let rows = PaneRows::of(bins);
                    batch.pane(
                        origin,
                        &agg.id,
                        window.start,
                        &key,
                        agg.relative_accuracy,
                        &rows,
                    );
                }
                if window.dropped > 0 {
                    let at = now_ms();
                    batch.event(
                        origin,
                        Event::Refused,
                        at,
                        &agg.id,
                        window.start,
                        0,
                        window.dropped,
                    );
                }
                batch.windows.push((agg.id.clone(), window.start, samples));
                collector
                    .queued_through
                    .insert(agg.id.clone(), window.start);
            }
        }
        if let Some(through) = closed_through.filter(|_| closed_through != collector.progress) {
            batch.event(origin, Event::Progress, now_ms(), "", 0, through, 0);
            collector.progress = closed_through;
        }
        (!batch.windows.is_empty() || !batch.receivers.buf.is_empty()).then_some(batch)
    })
}

/// Queues `batch`; when the queue has no room for it, queues in its place
/// only its `receivers` rows and a `lost` row for each of its windows (with
/// their samples), counted. Those small rows go past the bound, merged into
/// one batch while the node is away, at most [`MAX_LOST_ROWS`] of them: the
/// cluster learns what it lacks, and the claims of progress still arrive.
fn enqueue(shared: &Shared, batch: Batch) {
    let mut q = lock(&shared.queue);
    let batch = if q.bytes + batch.bytes() <= shared.config.queue_bytes || batch.windows.is_empty()
    {
        batch
    } else {
        let s = &shared.stats;
        s.batches_dropped.fetch_add(1, Ordering::Relaxed);
        s.windows_dropped
            .fetch_add(batch.windows.len() as u64, Ordering::Relaxed);
        s.rows_dropped.fetch_add(batch.rows, Ordering::Relaxed);
        let samples: u64 = batch.windows.iter().map(|w| w.2).sum();
        s.samples_dropped.fetch_add(samples, Ordering::Relaxed);
        let mut small = Batch {
            receivers: batch.receivers,
            progress: batch.progress,
            ..Batch::default()
        };
        for (agg, start, samples) in &batch.windows {
            small.event(
                &shared.origin,
                Event::Lost,
                now_ms(),
                agg,
                *start,
                0,
                *samples,
            );
        }
        // Into the last queued batch if it holds only such rows (and is not too many).
        let added = small.bytes();
        if let Some(last) = q.batches.back_mut().filter(|b| b.windows.is_empty()) {
            if last.receivers.buf.len() + added <= MAX_LOST_ROWS * 64 {
                last.receivers.buf.extend_from_slice(&small.receivers.buf);
                last.progress = last.progress.max(small.progress);
                q.bytes += added;
            }
            return;
        }
        small
    };
    q.bytes += batch.bytes();
    q.batches.push_back(batch);
    shared.changed.notify_all();
}

/// How many `lost` rows (about 64 bytes each) wait at most past the queue's bound.
const MAX_LOST_ROWS: usize = 100_000;

/// Inserts the queued batches in order, each until it is taken (on the next
/// node after a failure, with backoff once every node failed), until stopped
/// and the queue is empty or the deadline passed.
fn write_loop(shared: &Shared, nodes: &[ClickHouse]) {
    let mut schema_ready = vec![false; nodes.len()];
    let mut backoff = Duration::from_millis(100);
    // The node written to, and how many failed in a row.
    let (mut current, mut failed_in_a_row) = (0, 0);
    loop {
        let batch = {
            let mut q = lock(&shared.queue);
            loop {
                if let Some(batch) = q.batches.pop_front() {
                    q.in_flight = true;
                    break batch;
                }
                if lock(&shared.writer_deadline).is_some() {
                    return;
                }
                q = shared
                    .changed
                    .wait_timeout(q, Duration::from_millis(200))
                    .map_or_else(|p| p.into_inner().0, |r| r.0);
            }
        };
        let ch = &nodes[current];
        let result = (|| -> Result<(), Error> {
            if !schema_ready[current] {
                shared.config.schema.create(ch)?;
                schema_ready[current] = true;
            }
            batch.insert(ch, &shared.config.schema)
        })();
        let mut q = lock(&shared.queue);
        q.in_flight = false;
        match result {
            Ok(()) => {
                q.bytes -= batch.bytes();
                let s = &shared.stats;
                s.batches_written.fetch_add(1, Ordering::Relaxed);
                s.rows_written.fetch_add(batch.rows, Ordering::Relaxed);
                s.windows_written
                    .fetch_add(batch.windows.len() as u64, Ordering::Relaxed);
                s.bytes_written
                    .fetch_add(batch.bytes() as u64, Ordering::Relaxed);
                if let Some(through) = batch.progress {
                    s.written_through_ms.fetch_max(through, Ordering::Relaxed);
                }
                backoff = Duration::from_millis(100);
                failed_in_a_row = 0;
                shared.changed.notify_all();
            }
            Err(e) => {
                shared.stats.insert_failures.fetch_add(1, Ordering::Relaxed);
                // A node whose tables went away (wiped, replaced) gets them again.
                if matches!(e.code(), Some(60 | 81)) {
                    schema_ready[current] = false;
                }
                // The next node takes the batch (a replica of the shard: an
                // insert that had in fact landed is the same rows again).
                current = (current + 1) % nodes.len();
                failed_in_a_row += 1;
                q.batches.push_front(batch);
                q.in_flight = false;
                let deadline = *lock(&shared.writer_deadline);
                if deadline.is_some_and(|d| Instant::now() + backoff > d) {
                    eprintln!(
                        "promlab: ClickHouse: giving up at shutdown with {} batches unwritten: {e}",
                        q.batches.len()
                    );
                    return;
                }
                if shared
                    .stats
                    .insert_failures
                    .load(Ordering::Relaxed)
                    .is_power_of_two()
                {
                    eprintln!(
                        "promlab: ClickHouse insert failed (retrying, {} batches queued): {e}",
                        q.batches.len()
                    );
                }
                drop(q);
                if failed_in_a_row >= nodes.len() {
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    failed_in_a_row = 0;
                }
            }
        }
    }
}
