//! A long-lived exporter beside a store that is being folded, as
//! `serve --store --fold-exited` runs them: writers (promlab's, one per
//! simulated process, its files open while it lives, pids reused) come and
//! go (some growing their files from a header's length, past the mappings
//! readers made), folds and scrapes run at the same time, interleaved at
//! random by seed. The writers write client_ruby's layout (a file per metric
//! per process), its `poc_file_per_process` branch's (a file per process,
//! flocked while an observe updates it, as the branch's writer does), or,
//! as in a rolling deploy between the two, both at once (a reused pid may
//! come back in the other layout).
//! Every scrape of every exporter must be non-decreasing on every counter,
//! histogram bucket, count and sum (what writers only increase), and once the
//! writers stop, the next scrape must equal a fresh export and the sums
//! written.
//!
//! `PROMLAB_FOLD_SEEDS=N` runs N seeds (8 by default), `PROMLAB_FOLD_MS` the
//! writing time of each (800 ms), `PROMLAB_FOLD_WRITE_STRATEGIES=all` gives
//! the writers every write strategy.

use promlab::export::fold::{fold_store, FoldConfig};
use promlab::export::Exporter;
use promlab::format::formenc::Dialect;
use promlab::format::registry::Registry;
use promlab::ingest::feed::splitmix64;
use promlab::shared::strategy::{Stage, Strategy, StrategySet};
use promlab::write::{Client, ClientConfig, Layout};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const REGISTRY: &str = r#"{"metrics": [
    {"name": "jobs_total", "type": "counter", "help": "Jobs", "labels": ["queue"]},
    {"name": "job_seconds", "type": "histogram", "help": "Job time", "labels": ["queue"], "buckets": ["0.01", "0.1", "1"]},
    {"name": "queue_depth", "type": "gauge", "help": "Depth", "labels": ["queue"], "aggregation": "sum"},
    {"name": "rss_peak", "type": "gauge", "help": "Peak", "labels": ["queue"], "aggregation": "max"},
    {"name": "last_job", "type": "gauge", "help": "Last", "labels": ["queue"], "aggregation": "most_recent"}
]}"#;

const QUEUES: [&str; 3] = ["default", "mailers", "low"];
/// Observations exact in binary, so every order of adding them gives one sum.
const OBSERVED: [f64; 4] = [0.0078125, 0.0625, 0.5, 4.0];
/// Short-lived writers alive at once, and pids they take (reused in turn).
const SHORT_LIVED: usize = 6;
const PIDS: u32 = 40;

/// Which layouts the writers write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Writers {
    PerMetric,
    PerProcess,
    /// Each process either, by seed (the long-lived ones one each).
    Mixed,
}

impl Writers {
    /// The layout of the next process (`nth` long-lived one, or short-lived).
    fn layout(self, rng: &mut Rng, nth: Option<u32>) -> Layout {
        match self {
            Writers::PerMetric => Layout::PerMetric,
            Writers::PerProcess => Layout::PerProcess,
            Writers::Mixed => match nth.map_or_else(|| rng.below(2), u64::from) {
                0 => Layout::PerMetric,
                _ => Layout::PerProcess,
            },
        }
    }
}

/// A seeded stream, so a failing seed replays its choices.
struct Rng(u64, u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed, 0)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.1 += 1;
        splitmix64(self.0 ^ splitmix64(self.1)) % n
    }
}

/// What was written: per series (metric line name and labels as printed), its total.
#[derive(Default)]
struct Written {
    totals: BTreeMap<String, f64>,
}

impl Written {
    fn add(&mut self, series: String, by: f64) {
        *self.totals.entry(series).or_default() += by;
    }
}

/// One write of a job: every metric, one queue.
fn write_job(client: &mut Client, rng: &mut Rng, written: &Mutex<Written>) {
    let queue = QUEUES[rng.below(3) as usize];
    let labels = [("queue", queue)];
    let value = OBSERVED[rng.below(4) as usize];
    let id = |name: &str| client.metric(name).unwrap();
    let (jobs, seconds, depth, peak, last) = (
        id("jobs_total"),
        id("job_seconds"),
        id("queue_depth"),
        id("rss_peak"),
        id("last_job"),
    );
    client.increment(jobs, &labels, 1.0).unwrap();
    client.observe(seconds, &labels, value).unwrap();
    client.increment(depth, &labels, 1.0).unwrap();
    client.set(peak, &labels, rng.below(1000) as f64).unwrap();
    client.set(last, &labels, rng.below(1000) as f64).unwrap();
    let mut w = written.lock().unwrap();
    w.add(format!("jobs_total{{queue=\"{queue}\"}}"), 1.0);
    w.add(format!("queue_depth{{queue=\"{queue}\"}}"), 1.0);
    w.add(format!("job_seconds_sum{{queue=\"{queue}\"}}"), value);
    w.add(format!("job_seconds_count{{queue=\"{queue}\"}}"), 1.0);
    for (le, bound) in [
        ("0.01", 0.01),
        ("0.1", 0.1),
        ("1", 1.0),
        ("+Inf", f64::INFINITY),
    ] {
        if value <= bound {
            w.add(
                format!("job_seconds_bucket{{queue=\"{queue}\",le=\"{le}\"}}"),
                1.0,
            );
        }
    }
}

/// The writers' strategies: none, or with `PROMLAB_FOLD_WRITE_STRATEGIES=all`
/// every write strategy (mapped files, cached keys and pid).
fn write_strategies() -> StrategySet {
    match std::env::var("PROMLAB_FOLD_WRITE_STRATEGIES").as_deref() {
        Ok("all") => StrategySet::all().restrict(Stage::Write),
        _ => StrategySet::NONE,
    }
}

fn client(dir: &Path, registry: &Registry, pid: u32, layout: Layout) -> Client {
    let config = ClientConfig {
        dialect: Dialect::Uri,
        strategies: write_strategies(),
        pid_override: Some(pid),
    };
    Client::new_in_layout(dir, registry, config, layout).unwrap()
}

/// Files of `pid` made a header long, where it has none: its writer grows
/// each (doubling it) as it writes, past the mapping readers made of it.
fn small_files(dir: &Path, registry: &Registry, pid: u32, layout: Layout) {
    use promlab::format::storefile::{file_path, process_file_path};
    use std::io::Write;
    let paths: Vec<_> = match layout {
        Layout::PerMetric => registry
            .metrics
            .iter()
            .map(|def| file_path(dir, &def.name, pid))
            .collect(),
        Layout::PerProcess => vec![process_file_path(dir, &pid.to_string())],
    };
    for path in paths {
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path);
        if let Ok(mut file) = created {
            let bytes = promlab::format::storefile::file_bytes(std::iter::empty());
            file.write_all(&bytes).unwrap();
        }
    }
}

/// The series writers only increase, by name and labels as printed, with their values.
fn monotone_series(exposition: &[u8]) -> HashMap<String, f64> {
    let text = std::str::from_utf8(exposition).unwrap();
    text.lines()
        .filter(|l| {
            ["jobs_total{", "job_seconds_", "queue_depth{"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse().unwrap())
        })
        .collect()
}

/// The exporters a sidecar may run: every listing and read seam, with and
/// without leases and plans.
fn strategy_sets() -> Vec<StrategySet> {
    use Strategy::*;
    let all = StrategySet::all();
    vec![
        all.restrict(Stage::Export),
        all.restrict(Stage::Export).without(DecodeOnce),
        all.restrict(Stage::Export).without(Prerender),
        StrategySet::NONE.with(FoldExited),
        StrategySet::NONE,
    ]
}

/// One seed: writers, `folders` folds (sidecars folding one store) and
/// scrapes at once for `ms`, then the check of the quiet store. Returns what
/// went wrong, if anything.
fn run(seed: u64, ms: u64, folders: u64, writers: Writers) -> Vec<String> {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let registry = Registry::from_json(REGISTRY).unwrap();
    let written = Arc::new(Mutex::new(Written::default()));
    let writing = Arc::new(AtomicBool::new(true));
    let deadline = Instant::now() + Duration::from_millis(ms);
    let mut problems = Vec::new();
    std::thread::scope(|s| {
        // Writers: two live all along, the rest come and go, pids reused.
        let writer = s.spawn(|| {
            let mut rng = Rng::new(seed);
            let mut long: Vec<Client> = (0..2)
                .map(|i| {
                    let layout = writers.layout(&mut rng, Some(i));
                    client(&dir, &registry, 90 + i, layout)
                })
                .collect();
            let mut short: Vec<(u32, Client)> = Vec::new();
            let mut next_pid = 0u32;
            while Instant::now() < deadline {
                while short.len() < SHORT_LIVED {
                    let pid = loop {
                        next_pid = (next_pid + 1) % PIDS;
                        let pid = 1000 + next_pid;
                        if short.iter().all(|(p, _)| *p != pid) {
                            break pid;
                        }
                    };
                    let layout = writers.layout(&mut rng, None);
                    if rng.below(3) == 0 {
                        small_files(&dir, &registry, pid, layout);
                    }
                    short.push((pid, client(&dir, &registry, pid, layout)));
                }
                let i = rng.below(short.len() as u64) as usize;
                match rng.below(10) {
                    0..=2 => drop(short.swap_remove(i)),
                    _ => {
                        for _ in 0..=rng.below(4) {
                            write_job(&mut short[i].1, &mut rng, &written);
                        }
                    }
                }
                let l = rng.below(2) as usize;
                write_job(&mut long[l], &mut rng, &written);
                if rng.below(8) == 0 {
                    std::thread::sleep(Duration::from_micros(rng.below(500)));
                }
            }
            drop(short);
            drop(long);
            writing.store(false, Ordering::Release);
        });
        // The folds: small batches (fold files replaced batch by batch), the
        // sidecar's grace (a shorter one lets a writer whose `open` of a
        // reused pid's file stalls past it write into a folded source: the
        // hazard strategies/fold-exited.md names).
        let folders: Vec<_> = (0..folders)
            .map(|f| {
                let (dir, registry, writing) = (&dir, &registry, &writing);
                s.spawn(move || {
                    let mut rng = Rng::new(seed ^ 0xf01d ^ (f << 32));
                    let mut failures = Vec::new();
                    while writing.load(Ordering::Acquire) {
                        let config = FoldConfig {
                            max_batch: [1, 2, 3, 8, 1024][rng.below(5) as usize],
                            durable: false,
                            ..FoldConfig::default()
                        };
                        match fold_store(dir, registry, &config) {
                            Ok(report) => failures.extend(
                                report.metrics_skipped.iter().map(|m| format!("fold: {m}")),
                            ),
                            Err(err) => failures.push(format!("fold: {err:#}")),
                        }
                        std::thread::sleep(Duration::from_micros(rng.below(3000)));
                    }
                    failures
                })
            })
            .collect();
        // Scrapes: each exporter's series never go down.
        let scraper = s.spawn(|| {
            let mut rng = Rng::new(seed ^ 0x5c4a);
            let mut exporters: Vec<(StrategySet, Exporter, HashMap<String, f64>)> = strategy_sets()
                .into_iter()
                .map(|set| {
                    (
                        set,
                        Exporter::new(&dir, registry.clone(), set),
                        HashMap::new(),
                    )
                })
                .collect();
            let mut found = Vec::new();
            let mut out = Vec::new();
            let mut scrapes = 0;
            while writing.load(Ordering::Acquire) {
                let i = rng.below(exporters.len() as u64) as usize;
                let (set, exporter, last) = &mut exporters[i];
                exporter.export_into(&mut out).unwrap();
                scrapes += 1;
                let now = monotone_series(&out);
                for (series, before) in last.iter() {
                    match now.get(series) {
                        Some(v) if v >= before => {}
                        got => found.push(format!(
                            "{set}, scrape {scrapes}: {series} went from {before} to {got:?}"
                        )),
                    }
                }
                *last = now;
            }
            (exporters, found, scrapes)
        });
        writer.join().unwrap();
        for folder in folders {
            problems.extend(folder.join().unwrap());
        }
        let (mut exporters, found, scrapes) = scraper.join().unwrap();
        problems.extend(found);
        assert!(scrapes > 10, "seed {seed}: only {scrapes} scrapes");
        // Quiet: one more fold, then every exporter's next scrape is exact.
        let config = FoldConfig {
            durable: false,
            ..FoldConfig::default()
        };
        fold_store(&dir, &registry, &config).unwrap();
        problems.extend(missing_fold_files(&dir, writers));
        let totals = written.lock().unwrap().totals.clone();
        let mut out = Vec::new();
        for (set, exporter, last) in &mut exporters {
            let fresh = promlab::export::export(&dir, &registry, *set).unwrap();
            exporter.export_into(&mut out).unwrap();
            if out != fresh {
                problems.push(format!(
                    "{set}: the scrape after the writers stopped is not a fresh export's: {}",
                    promlab::reference::first_difference::first_difference(
                        &out, &fresh, "scrape", "fresh"
                    )
                ));
            }
            let now = monotone_series(&out);
            for (series, total) in &totals {
                if now.get(series) != Some(total) {
                    problems.push(format!(
                        "{set}: {series} is {:?}, {total} was written",
                        now.get(series)
                    ));
                }
            }
            for (series, before) in last.iter() {
                if now.get(series).is_none_or(|v| v < before) {
                    problems.push(format!("{set}: {series} went from {before} at the end"));
                }
            }
        }
    });
    problems
}

/// The layouts `writers` write that have no fold file in `dir` (a seed whose
/// folds never folded that layout tested nothing of it).
fn missing_fold_files(dir: &Path, writers: Writers) -> Vec<String> {
    use promlab::format::storefile::{is_fold_id, parse_file_name, parse_process_file_name};
    let (mut per_metric, mut per_process) = (false, false);
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name();
        let name = name.as_encoded_bytes();
        per_metric |= parse_file_name(name).is_some_and(|(_, id)| is_fold_id(id));
        per_process |= parse_process_file_name(name).is_some_and(is_fold_id);
    }
    let wanted = match writers {
        Writers::PerMetric => [true, false],
        Writers::PerProcess => [false, true],
        Writers::Mixed => [true, true],
    };
    [("per-metric", per_metric), ("per-process", per_process)]
        .into_iter()
        .zip(wanted)
        .filter(|((_, found), wanted)| *wanted && !found)
        .map(|((layout, _), _)| format!("no {layout} fold file: nothing of it was folded"))
        .collect()
}

/// Runs the seeds (`PROMLAB_FOLD_SEEDS`, `PROMLAB_FOLD_MS`) with `folders`
/// folds at once; fails naming the seeds that went wrong.
fn run_seeds(folders: u64, default_seeds: u64, writers: Writers) {
    let seeds: u64 = std::env::var("PROMLAB_FOLD_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_seeds);
    let ms: u64 = std::env::var("PROMLAB_FOLD_MS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(800);
    let mut failed = Vec::new();
    for seed in 0..seeds {
        let problems = run(seed, ms, folders, writers);
        if !problems.is_empty() {
            eprintln!("{writers:?} seed {seed}: {} problems", problems.len());
            let mut shown = std::collections::BTreeSet::new();
            for p in &problems {
                // The first of each exporter's kind of problem.
                let kind = p.split(['{', ':']).next().unwrap_or("").to_owned()
                    + if p.contains("scrape ") {
                        " (while writing)"
                    } else {
                        " (quiet)"
                    };
                if shown.insert(kind) {
                    eprintln!("  {p}");
                }
            }
            failed.push(seed);
        }
    }
    assert!(
        failed.is_empty(),
        "{writers:?}: seeds {failed:?} failed (details above)"
    );
}

#[test]
fn scrapes_never_go_backwards_while_the_store_is_folded() {
    run_seeds(1, 8, Writers::PerMetric);
}

/// The one-file-per-process layout: one group, every metric's series in
/// each file, aggregated metric by metric.
#[test]
fn scrapes_never_go_backwards_while_a_per_process_store_is_folded() {
    run_seeds(1, 6, Writers::PerProcess);
}

/// Both layouts in one store, each folded as a group of its own.
#[test]
fn scrapes_never_go_backwards_while_a_mixed_store_is_folded() {
    run_seeds(1, 4, Writers::Mixed);
}

/// Two sidecars folding one store (or a sidecar and `promlab fold`) undid
/// and finished each other's batches: sources gone from under a commit,
/// `prev` files in the way, journals left behind. One fold runs at a time;
/// the other finds it running and leaves the store to it.
#[test]
fn two_folds_of_one_store_take_turns() {
    run_seeds(2, 3, Writers::PerMetric);
}

/// The same in a store of both layouts.
#[test]
fn two_folds_of_a_mixed_store_take_turns() {
    run_seeds(2, 2, Writers::Mixed);
}
