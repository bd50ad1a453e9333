//! The laned ingester on the 27 real Prometheus requests,
//! fed from several threads at once, and under the receiver's limits. (Random
//! request sequences against the one ingester: `tests/ingest_equivalence.rs`,
//! `laned_ingester_agrees_with_one*`.)

use promlab::ingest::budget::Capacity;
use promlab::ingest::feed::FeedWorkload;
use promlab::ingest::lanes::LanedIngester;
use promlab::ingest::pipeline::{Ingester, Limits};
use promlab::ingest::plan::{Aggregation, Plan};
use promlab::ingest::window::Stats;
use promlab::ingest::wire::{self, WriteRequest};
use promlab::shared::strategy::StrategySet;
use prost::Message;
use std::path::PathBuf;
#[path = "common/remote_write.rs"]
mod remote_write;
use remote_write::body;

fn capture_bodies() -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/remote-write/prometheus-2.42");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 27);
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// Per metric name: all its series (10 s windows), and grouped by its first
/// series' labels (30 s windows): hundreds of groups over the shards.
fn captures_plan(bodies: &[Vec<u8>], keep_windows: usize) -> Plan {
    let mut aggregations = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for body in bodies {
        let mut raw = Vec::new();
        wire::decompress(body, 64 << 20, &mut raw).unwrap();
        let request = WriteRequest::decode(&raw[..]).unwrap();
        for series in &request.timeseries {
            let name = &series
                .labels
                .iter()
                .find(|l| l.name == "__name__")
                .unwrap()
                .value;
            if !seen.insert(name.clone()) {
                continue;
            }
            let agg = |id: String, group_by: Vec<String>, window_secs| Aggregation {
                id,
                metric: name.clone(),
                matchers: Default::default(),
                group_by,
                window_secs,
                relative_accuracy: 0.01,
                quantiles: vec![0.0, 0.5, 0.9, 0.99, 1.0],
            };
            aggregations.push(agg(name.clone(), Vec::new(), 10));
            let by = series
                .labels
                .iter()
                .map(|l| l.name.clone())
                .filter(|n| n != "__name__")
                .collect();
            aggregations.push(agg(format!("{name}/by"), by, 30));
        }
    }
    Plan {
        lateness_secs: 5,
        keep_windows,
        aggregations,
    }
}

#[test]
fn prometheus_captures_give_the_one_ingesters_answers() {
    let bodies = capture_bodies();
    for keep in [1, 1 << 20] {
        let plan = captures_plan(&bodies, keep);
        for set in [StrategySet::all(), StrategySet::NONE] {
            let mut one = Ingester::new(plan.clone(), set);
            let stats: Vec<Stats> = bodies.iter().map(|b| one.handle(b).unwrap()).collect();
            assert!(one.totals().accepted > 10_000, "{:?}", one.totals());
            for lanes in 1..=4 {
                let laned = LanedIngester::with_plan(lanes, &plan, set);
                for (r, (body, expected)) in bodies.iter().zip(&stats).enumerate() {
                    let got = laned.handle_on(r, body).unwrap();
                    assert_eq!(&got, expected, "{lanes} lanes");
                }
                assert_eq!(laned.snapshot(), one.snapshot(), "{lanes} lanes, {set}");
                for agg in &plan.aggregations {
                    let (mut got, mut expected) = (Vec::new(), Vec::new());
                    assert!(laned.query_json(&agg.id, None, &mut got));
                    assert!(one.query_json(&agg.id, None, &mut expected));
                    assert_eq!(got, expected, "{} with {lanes} lanes", agg.id);
                }
                assert_eq!(laned.watermark(), one.watermark());
                assert_eq!(laned.totals(), one.totals());
            }
        }
    }
}

/// The injected clock: 2026-12-01T00:00:00Z.
const NOW: i64 = 1_796_083_200_000;

fn fixed_clock() -> i64 {
    NOW
}

fn limits(capacity: Capacity) -> Limits {
    Limits {
        clock: fixed_clock,
        capacity,
        ..Limits::serving()
    }
}

/// With limits: the lanes together hold no more than them (not each
/// lane up to them), every (sample, aggregation) pair is
/// accepted, late or counted as dropped, once, and one lane is the one
/// ingester exactly, drops included.
#[test]
fn limits_hold_on_every_lane_and_every_drop_is_counted() {
    let capacity = Capacity {
        groups: 40,
        group_bytes: usize::MAX,
        pane_slots: 100,
        bins: 2_000,
    };
    let requests: Vec<Vec<u8>> = (0..6)
        .map(|r| {
            let groups: Vec<String> = (0..80).map(|g| format!("g{g}")).collect();
            let samples: Vec<(&str, i64, f64)> = (0..80)
                .map(|g| {
                    let ts = NOW - 300_000 + r * 60_000 + g as i64;
                    (groups[g].as_str(), ts, 1.5f64.powi((g % 40) as i32))
                })
                .chain([("far", NOW + 3_600_000, 1.0), ("nan", NOW, f64::NAN)])
                .collect();
            body(&samples)
        })
        .collect();
    let mut one = Ingester::new(Plan::default(), StrategySet::all()).with_limits(limits(capacity));
    for lanes in 1..=4 {
        let laned = LanedIngester::new(lanes, || {
            Ingester::new(Plan::default(), StrategySet::all()).with_limits(limits(capacity))
        });
        for (r, request) in requests.iter().enumerate() {
            let stats = laned.handle_on(r, request).unwrap();
            let dropped = stats.over_group_limit + stats.over_pane_limit + stats.over_bin_limit;
            assert_eq!(
                stats.accepted + stats.late + dropped,
                80,
                "{lanes}: {stats:?}"
            );
            assert_eq!((stats.too_far_ahead, stats.rejected), (1, 1), "{lanes}");
            let held = laned.held();
            assert!(held.groups <= capacity.groups, "{lanes}: {held:?}");
            assert!(held.pane_slots <= capacity.pane_slots, "{lanes}: {held:?}");
            assert!(held.bins <= 2 * capacity.bins, "{lanes}: {held:?}");
            if lanes == 1 {
                assert_eq!(stats, one.handle(request).unwrap(), "request {r}");
            }
        }
        assert!(laned.totals().over_group_limit > 0, "{lanes}");
        if lanes == 1 {
            assert_eq!(laned.snapshot(), one.snapshot());
        }
    }
}

#[test]
fn too_many_samples_are_refused_whole_and_bad_bodies_change_nothing() {
    let laned = LanedIngester::new(3, || {
        Ingester::new(Plan::default(), StrategySet::all()).with_limits(Limits {
            max_samples_per_request: 10,
            ..limits(Capacity::UNBOUNDED)
        })
    });
    let groups: Vec<String> = (0..11).map(|g| format!("g{g}")).collect();
    let big: Vec<(&str, i64, f64)> = groups.iter().map(|g| (g.as_str(), NOW, 1.0)).collect();
    let e = laned.handle(&body(&big)).unwrap_err();
    assert_eq!(e.status(), 413);
    assert_eq!(laned.handle(b"not snappy").unwrap_err().status(), 400);
    assert_eq!(laned.totals(), Stats::default());
    assert_eq!(laned.held().groups, 0);
    let stats = laned.handle(&body(&big[..10])).unwrap();
    assert_eq!(stats.accepted, 10);
}

/// The feeder's workload at 40 groups × 25 series, 100 rows a request, and
/// its first `ticks` ticks' request bodies.
fn feeder_ticks(ticks: u64) -> (FeedWorkload, Vec<Vec<Vec<u8>>>) {
    feeder(40, 25, 100, ticks)
}

/// The feeder's workload of `groups` × `series_per_group`, `batch_rows`
/// rows a request, and its first `ticks` ticks' request bodies.
fn feeder(
    groups: u64,
    series_per_group: u64,
    batch_rows: usize,
    ticks: u64,
) -> (FeedWorkload, Vec<Vec<Vec<u8>>>) {
    let workload = FeedWorkload {
        groups,
        series_per_group,
        batch_rows,
        ..FeedWorkload::seed(1_700_000_000_000)
    };
    let generator = workload.generator();
    let bodies = (0..ticks).map(|t| generator.tick_bodies(t)).collect();
    (workload, bodies)
}

/// The laned ingester's counters, panes and answer are the one ingester's.
fn assert_as_one(laned: &LanedIngester, one: &Ingester, what: &str) {
    assert_eq!(laned.totals(), one.totals(), "{what}");
    assert_eq!(laned.snapshot(), one.snapshot(), "{what}");
    let (mut got, mut expected) = (Vec::new(), Vec::new());
    assert!(laned.query_json("data", None, &mut got));
    assert!(one.query_json("data", None, &mut expected));
    assert_eq!(got, expected, "{what}");
}

/// Requests fed by several threads at once, each tick's requests racing (its
/// samples within the lateness of each other) and windows closing meanwhile:
/// every pane and answer is the one ingester's, fed in order.
#[test]
fn threads_feeding_at_once_give_the_one_ingesters_panes() {
    let (_, ticks) = feeder_ticks(150);
    for set in [StrategySet::all(), StrategySet::NONE] {
        let mut one = Ingester::new(Plan::default(), set);
        for body in ticks.iter().flatten() {
            one.handle(body).unwrap();
        }
        for lanes in [2, 3] {
            let laned = LanedIngester::with_plan(lanes, &Plan::default(), set);
            for tick in &ticks {
                let next = std::sync::atomic::AtomicUsize::new(0);
                std::thread::scope(|s| {
                    for _ in 0..lanes {
                        s.spawn(|| {
                            while let Some(body) =
                                tick.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                            {
                                laned.handle(body).unwrap();
                            }
                        });
                    }
                });
            }
            assert_as_one(&laned, &one, &format!("{lanes} lanes, {set}"));
        }
    }
}

/// Windows of more panes than a close converts on one thread (each lane's
/// then on a thread of its own): the panes and answer are still the one
/// ingester's.
#[test]
fn lanes_closing_large_windows_on_threads_give_the_one_ingesters_panes() {
    let (_, ticks) = feeder(1_500, 2, 500, 130);
    for set in [StrategySet::all(), StrategySet::NONE] {
        let mut one = Ingester::new(Plan::default(), set);
        let laned = LanedIngester::with_plan(3, &Plan::default(), set);
        for (i, body) in ticks.iter().flatten().enumerate() {
            one.handle(body).unwrap();
            laned.handle_on(i, body).unwrap();
        }
        one.flush();
        laned.flush();
        assert_as_one(&laned, &one, &set.to_string());
        let mut every = Vec::new();
        laned.query_all_json(&mut every);
        assert_eq!(
            every,
            serde_json::to_vec(&one.query_all()).unwrap(),
            "{set}"
        );
    }
}

/// Every sample of a request has one fate: the counters add up.
fn assert_accounted(t: &Stats, what: &str) {
    let fates = t.accepted
        + t.late
        + t.over_group_limit
        + t.over_pane_limit
        + t.over_bin_limit
        + t.too_far_ahead
        + t.rejected
        + t.stale
        + t.unrouted;
    assert_eq!(fates, t.samples, "{what}: {t:?}");
}

/// `--max-groups 1000 --ingest-threads 4` held 3,950
/// groups after 5,000 new ones from 8 connections, and the counters did not
/// add up. Eight threads at once, each sending new groups (and outliers that
/// need many bins): at every moment the lanes together hold no more than the
/// limits, and at the end `accepted + dropped (+ late, ...) = ingested`, for
/// 1, 2 and 4 lanes and both sketch seams.
#[test]
fn limits_are_the_ingesters_whatever_the_lanes_and_senders() {
    let capacity = Capacity {
        groups: 1_000,
        group_bytes: usize::MAX,
        pane_slots: 30_000,
        bins: 400_000,
    };
    const SENDERS: usize = 8;
    for set in [StrategySet::all(), StrategySet::NONE] {
        for lanes in [1, 2, 4] {
            let laned = LanedIngester::new(lanes, || {
                Ingester::new(Plan::default(), set).with_limits(limits(capacity))
            });
            std::thread::scope(|s| {
                for sender in 0..SENDERS {
                    let laned = &laned;
                    s.spawn(move || {
                        for r in 0..10 {
                            // 5,000 new groups over the senders' first five
                            // requests, then the same ones again, in three
                            // windows, one sample in fifty far out of range.
                            let groups: Vec<String> = (0..125)
                                .map(|g| format!("s{sender}r{}g{g}", r % 5))
                                .collect();
                            let samples: Vec<(&str, i64, f64)> = groups
                                .iter()
                                .enumerate()
                                .map(|(g, name)| {
                                    let ts = NOW - 180_000 + (r as i64 % 3) * 60_000;
                                    let v = if g % 50 == 7 { 1e300 } else { 1.0 + g as f64 };
                                    (name.as_str(), ts, v)
                                })
                                .collect();
                            laned.handle(&body(&samples)).unwrap();
                            let held = laned.held();
                            assert!(held.groups <= capacity.groups, "{held:?}");
                            assert!(held.pane_slots <= capacity.pane_slots, "{held:?}");
                            assert!(held.bins <= 2 * capacity.bins, "{held:?}");
                        }
                    });
                }
            });
            let what = format!("{lanes} lanes, {set}");
            let totals = laned.totals();
            assert_eq!(totals.samples, (SENDERS * 10 * 125) as u64, "{what}");
            assert_accounted(&totals, &what);
            assert_eq!(laned.held().groups, capacity.groups, "{what}");
            assert!(totals.over_group_limit > 0, "{what}: {totals:?}");
            laned.flush();
            let after = laned.totals();
            assert_eq!(after, totals, "{what}: closing changes no count");
            let held = laned.held();
            assert!(held.pane_slots <= capacity.pane_slots && held.bins <= 2 * capacity.bins);
            // The closed windows' answers name what was refused.
            let answer = laned.query("data", None).unwrap();
            let listed: u64 = answer.groups.iter().map(|g| g.count + g.dropped).sum();
            assert!(listed + answer.dropped > 0, "{what}: {answer:?}");
        }
    }
}

/// A sender's shards each keep their lane across window closes: a close holds
/// every lane and releases them one by one, and a thread that took another's
/// lane then (the first released) made both lanes learn each other's series
/// again. With a window a tick long every tick closes one; each of the
/// workload's series is still learned once, by one lane.
#[test]
fn shards_keep_their_lanes_across_window_closes() {
    let (workload, ticks) = feeder_ticks(120);
    let mut plan = Plan::default();
    plan.aggregations[0].window_secs = 1;
    let (lanes, series) = (2, workload.groups * workload.series_per_group);
    for round in 0..5 {
        let laned = LanedIngester::with_plan(lanes, &plan, StrategySet::all());
        let tick_end = std::sync::Barrier::new(lanes);
        std::thread::scope(|s| {
            for i in 0..lanes {
                let (laned, ticks, tick_end) = (&laned, &ticks, &tick_end);
                s.spawn(move || {
                    for tick in ticks {
                        for body in tick.iter().skip(i).step_by(lanes) {
                            laned.handle(body).unwrap();
                        }
                        tick_end.wait();
                    }
                });
            }
        });
        let counters = laned.counters();
        assert_eq!(counters.totals.late, 0, "round {round}");
        assert_eq!(
            counters.cache.misses, series,
            "round {round}: series learned again"
        );
    }
}
