//! The sharded ingester (issue 15, item 3) on the 27 real Prometheus requests
//! and under the receiver's limits. (Random request sequences against the one
//! ingester: `tests/ingest_equivalence.rs`, `sharded_ingester_agrees_with_one*`.)

use promlab::ingest::pipeline::{Ingester, Limits};
use promlab::ingest::plan::{Aggregation, Plan};
use promlab::ingest::sharded::ShardedIngester;
use promlab::ingest::window::{Capacity, Stats};
use promlab::ingest::wire::{self, Label, Sample, TimeSeries, WriteRequest};
use promlab::strategy::StrategySet;
use prost::Message;
use std::path::PathBuf;

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
            for shards in 1..=4 {
                let mut sharded = ShardedIngester::new(plan.clone(), set, shards);
                for (body, expected) in bodies.iter().zip(&stats) {
                    assert_eq!(&sharded.handle(body).unwrap(), expected, "{shards} shards");
                }
                assert_eq!(sharded.snapshot(), one.snapshot(), "{shards} shards, {set}");
                for agg in &plan.aggregations {
                    let (mut got, mut expected) = (Vec::new(), Vec::new());
                    assert!(sharded.query_json(&agg.id, None, &mut got));
                    assert!(one.query_json(&agg.id, None, &mut expected));
                    assert_eq!(got, expected, "{} with {shards} shards", agg.id);
                }
                assert_eq!(sharded.watermark(), one.watermark());
            }
        }
    }
}

/// The injected clock: 2026-12-01T00:00:00Z.
const NOW: i64 = 1_796_083_200_000;

fn fixed_clock() -> i64 {
    NOW
}

fn body(samples: &[(String, i64, f64)]) -> Vec<u8> {
    let req = WriteRequest {
        timeseries: samples
            .iter()
            .map(|(group, timestamp, value)| TimeSeries {
                labels: vec![
                    Label {
                        name: "__name__".into(),
                        value: "data".into(),
                    },
                    Label {
                        name: "label_0".into(),
                        value: group.clone(),
                    },
                ],
                samples: vec![Sample {
                    value: *value,
                    timestamp: *timestamp,
                }],
            })
            .collect(),
        metadata: vec![],
    };
    wire::compress(&req.encode_to_vec())
}

fn limits(capacity: Capacity) -> Limits {
    Limits {
        clock: fixed_clock,
        capacity,
        ..Limits::serving()
    }
}

/// With limits: each shard holds its part of the capacity (the whole stays
/// within it), every (sample, aggregation) pair is accepted or counted as
/// dropped, the per-sample outcomes are counted once (not once per shard),
/// and one shard is the one ingester exactly, drops included.
#[test]
fn limits_hold_over_the_shards_and_every_drop_is_counted() {
    let capacity = Capacity {
        groups: 40,
        group_bytes: usize::MAX,
        pane_slots: 100,
        bins: 2_000,
    };
    let requests: Vec<Vec<u8>> = (0..6)
        .map(|r| {
            let samples: Vec<(String, i64, f64)> = (0..80)
                .map(|g| {
                    let ts = NOW - 300_000 + r * 60_000 + g;
                    (format!("g{g}"), ts, 1.5f64.powi((g % 40) as i32))
                })
                .chain([
                    ("far".to_string(), NOW + 3_600_000, 1.0),
                    ("nan".to_string(), NOW, f64::NAN),
                ])
                .collect();
            body(&samples)
        })
        .collect();
    let mut one = Ingester::new(Plan::default(), StrategySet::all()).with_limits(limits(capacity));
    for shards in 1..=4 {
        let mut sharded = ShardedIngester::new(Plan::default(), StrategySet::all(), shards)
            .with_limits(limits(capacity));
        for (r, request) in requests.iter().enumerate() {
            let stats = sharded.handle(request).unwrap();
            let dropped = stats.over_group_limit + stats.over_pane_limit + stats.over_bin_limit;
            assert_eq!(
                stats.accepted + stats.late + dropped,
                80,
                "{shards}: {stats:?}"
            );
            assert_eq!((stats.too_far_ahead, stats.rejected), (1, 1), "{shards}");
            let held = sharded.held();
            assert!(held.groups <= capacity.groups, "{shards}: {held:?}");
            assert!(held.pane_slots <= capacity.pane_slots, "{shards}: {held:?}");
            assert!(held.bins <= 2 * capacity.bins, "{shards}: {held:?}");
            if shards == 1 {
                assert_eq!(stats, one.handle(request).unwrap(), "request {r}");
            }
        }
        assert!(sharded.totals().over_group_limit > 0, "{shards}");
        if shards == 1 {
            assert_eq!(sharded.snapshot(), one.snapshot());
        }
    }
}

#[test]
fn too_many_samples_are_refused_whole_and_bad_bodies_change_nothing() {
    let mut sharded =
        ShardedIngester::new(Plan::default(), StrategySet::all(), 3).with_limits(Limits {
            max_samples_per_request: 10,
            ..limits(Capacity::UNBOUNDED)
        });
    let big: Vec<(String, i64, f64)> = (0..11).map(|g| (format!("g{g}"), NOW, 1.0)).collect();
    let e = sharded.handle(&body(&big)).unwrap_err();
    assert_eq!(e.status(), 413);
    assert_eq!(sharded.handle(b"not snappy").unwrap_err().status(), 400);
    assert_eq!(sharded.totals(), Stats::default());
    assert_eq!(sharded.held().groups, 0);
    let stats = sharded.handle(&body(&big[..10])).unwrap();
    assert_eq!(stats.accepted, 10);
}
