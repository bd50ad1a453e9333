//! Every combination of the four ingest strategies gives identical stats and
//! bit-identical quantiles for every (aggregation, group, window), and each
//! quantile is within the relative accuracy of the exact one.
//!
//! Rank definition (the crate's): for `n` values of a pane and `0 < q < 1`, the
//! exact quantile is the value at 0-based rank `floor(q · (n − 1))` of the values
//! sorted ascending; `q = 0` and `q = 1` are the exact minimum and maximum.

use promlab::ingest::lanes::LanedIngester;
use promlab::ingest::pipeline::Ingester;
use promlab::ingest::plan::{Aggregation, Plan};
use promlab::ingest::window::{PaneReport, Stats, STALE_NAN_BITS};
use promlab::ingest::wire::{self, Label, Sample, TimeSeries, WriteRequest};
use promlab::shared::strategy::{Stage, StrategySet};
use proptest::prelude::*;
use prost::Message;
use std::collections::BTreeMap;

const QUANTILES: [f64; 6] = [0.0, 0.25, 0.5, 0.9, 0.99, 1.0];

fn aggregation() -> impl Strategy<Value = Aggregation> {
    (
        prop::sample::select(vec!["m0", "m1"]),
        prop::sample::subsequence(vec!["a", "b", "c", "__name__"], 0..=2),
        prop::option::of(prop::sample::select(vec!["x", "y\"", ""])),
        prop::sample::select(vec![1u64, 2, 5]),
        prop::sample::select(vec![0.01, 0.05]),
    )
        .prop_map(
            |(metric, group_by, matcher, window_secs, alpha)| Aggregation {
                id: String::new(),
                metric: metric.into(),
                matchers: matcher
                    .map(|v| ("c".to_string(), v.to_string()))
                    .into_iter()
                    .collect(),
                group_by: group_by.into_iter().map(String::from).collect(),
                window_secs,
                relative_accuracy: alpha,
                quantiles: QUANTILES.to_vec(),
            },
        )
}

fn plan(keep_windows: impl Strategy<Value = usize>) -> impl Strategy<Value = Plan> {
    (
        0u64..3,
        keep_windows,
        prop::collection::vec(aggregation(), 1..4),
    )
        .prop_map(|(lateness_secs, keep_windows, aggs)| Plan {
            lateness_secs,
            keep_windows,
            aggregations: aggs
                .into_iter()
                .enumerate()
                .map(|(i, a)| Aggregation {
                    id: format!("agg{i}"),
                    ..a
                })
                .collect(),
        })
}

/// A label set: metric, and optional labels a, b, c (sorted by name).
fn series_labels() -> impl Strategy<Value = Vec<(String, String)>> {
    let value = prop::sample::select(vec!["x", "y\"", "z\\\n", "café", ""]);
    (
        prop::sample::select(vec!["m0", "m1", "m2"]),
        prop::option::of(value.clone()),
        prop::option::of(value.clone()),
        prop::option::of(value),
    )
        .prop_map(|(m, a, b, c)| {
            let mut labels = vec![("__name__".to_string(), m.to_string())];
            for (name, v) in [("a", a), ("b", b), ("c", c)] {
                if let Some(v) = v {
                    labels.push((name.to_string(), v.to_string()));
                }
            }
            labels
        })
}

fn value(finite_only: bool) -> BoxedStrategy<f64> {
    let finite = prop_oneof![
        4 => 1e-6f64..1e6,
        2 => -1e4f64..-1e-6,
        1 => Just(0.0),
        1 => (1.0f64..1e3).prop_map(|u| u.powf(-1.0 / 1.5).recip()),
    ];
    if finite_only {
        finite.boxed()
    } else {
        prop_oneof![
            10 => finite,
            1 => Just(f64::from_bits(STALE_NAN_BITS)),
            1 => Just(f64::NAN),
            1 => Just(f64::INFINITY),
        ]
        .boxed()
    }
}

/// Requests: each a list of (series index into the pool, samples as (offset ms, value)).
/// Offsets move forward with the request number but may go back (out of order, late).
/// One request: per series, its index into the pool and its (offset ms, value) samples.
type Request = Vec<(usize, Vec<(i64, f64)>)>;

#[derive(Clone, Debug)]
struct Scenario {
    plan: Plan,
    pool: Vec<Vec<(String, String)>>,
    requests: Vec<Request>,
    /// Request indexes to corrupt (invalid series), for the all-combinations test.
    corrupt: Vec<bool>,
}

fn scenario(finite_only: bool, keep: BoxedStrategy<usize>) -> impl Strategy<Value = Scenario> {
    scenario_of(value(finite_only), keep)
}

/// Values over the whole range the receiver accepts: normal magnitudes from
/// the smallest to the largest (both signs, both extremes), subnormals,
/// zeros, and ordinary values, so panes hold outliers far from the rest.
fn whole_range_value() -> BoxedStrategy<f64> {
    let normal =
        (-307.65f64..308.25).prop_map(|e| 10f64.powf(e).clamp(f64::MIN_POSITIVE, f64::MAX));
    prop_oneof![
        6 => 1.0f64..100.0,
        2 => normal.clone(),
        1 => normal.prop_map(|v| -v),
        1 => prop::sample::select(vec![f64::MAX, -f64::MAX, f64::MIN_POSITIVE, 1e20, 1e300, 1e-300]),
        1 => prop::num::f64::SUBNORMAL,
        1 => Just(0.0),
    ]
    .boxed()
}

fn scenario_of(
    value: BoxedStrategy<f64>,
    keep: BoxedStrategy<usize>,
) -> impl Strategy<Value = Scenario> {
    let sample = (-4_000i64..9_000, value);
    let series = (0usize..6, prop::collection::vec(sample, 1..5));
    let request = prop::collection::vec(series, 0..8);
    (
        plan(keep),
        prop::collection::vec(series_labels(), 6),
        prop::collection::vec(request, 1..7),
        prop::collection::vec(prop::bool::weighted(0.15), 7),
    )
        .prop_map(|(plan, pool, requests, corrupt)| Scenario {
            plan,
            pool,
            requests,
            corrupt,
        })
}

/// Series in the wide scenario's pool.
const WIDE_POOL: usize = 400;

/// Hundreds of label sets: `b` differs per series (so grouping by it gives
/// hundreds of groups), `a` and `c` cycle through a few values or are absent.
fn wide_pool() -> Vec<Vec<(String, String)>> {
    let few = ["x", "y\"", "", "café"];
    (0..WIDE_POOL)
        .map(|i| {
            let mut labels = vec![("__name__".to_string(), format!("m{}", i % 3))];
            if i % 4 != 0 {
                labels.push(("a".to_string(), few[i % 3].to_string()));
            }
            labels.push(("b".to_string(), format!("s{i}")));
            if i % 5 != 0 {
                labels.push(("c".to_string(), few[(i / 3) % 4].to_string()));
            }
            labels
        })
        .collect()
}

/// Requests of 50–300 series out of hundreds, one sample per series mostly (as
/// real senders send them), some values spread over 600 decades so that panes
/// collapse their lowest bins: batches, misses, evictions and collapses.
fn wide_scenario() -> impl Strategy<Value = Scenario> {
    let value = prop_oneof![
        6 => value(false),
        2 => (-300.0f64..300.0).prop_map(|e| 10f64.powf(e)),
        1 => (-300.0f64..300.0).prop_map(|e| -(10f64.powf(e))),
    ];
    let sample = (-4_000i64..9_000, value);
    let samples = prop_oneof![
        8 => prop::collection::vec(sample.clone(), 1..2),
        1 => prop::collection::vec(sample, 2..4),
    ];
    let request = prop::collection::vec((0usize..WIDE_POOL, samples), 50..300);
    (
        plan((1usize..4).boxed()),
        prop::collection::vec(request, 2..8),
        prop::collection::vec(prop::bool::weighted(0.15), 8),
    )
        .prop_map(|(plan, requests, corrupt)| Scenario {
            plan,
            pool: wide_pool(),
            requests,
            corrupt,
        })
}

fn encode(s: &Scenario, r: usize, corrupt: bool) -> Vec<u8> {
    let base = 1_700_000_000_000i64 + r as i64 * 3_000;
    let mut req = WriteRequest::default();
    for (series, samples) in &s.requests[r] {
        let mut labels: Vec<Label> = s.pool[*series]
            .iter()
            .map(|(n, v)| Label {
                name: n.clone(),
                value: v.clone(),
            })
            .collect();
        if corrupt {
            labels.reverse(); // unsorted (or, with only __name__, still fine)
            labels.push(Label {
                name: "__name__".into(),
                value: "dup".into(),
            });
        }
        req.timeseries.push(TimeSeries {
            labels,
            samples: samples
                .iter()
                .map(|&(off, value)| Sample {
                    value,
                    timestamp: base + off,
                })
                .collect(),
        });
    }
    wire::compress(&req.encode_to_vec())
}

type Outcome = (
    Vec<Result<Stats, String>>,
    Vec<PaneReport>,
    Vec<PaneReport>,
    String,
);

fn run(s: &Scenario, set: StrategySet, with_corruption: bool) -> Outcome {
    run_with_cache(s, set, with_corruption, 4)
}

fn run_with_cache(
    s: &Scenario,
    set: StrategySet,
    with_corruption: bool,
    cache_capacity: usize,
) -> Outcome {
    let mut ingester = Ingester::new(s.plan.clone(), set).with_cache_capacity(cache_capacity);
    let results = (0..s.requests.len())
        .map(|r| {
            let corrupt = with_corruption && s.corrupt[r] && !s.requests[r].is_empty();
            ingester
                .handle(&encode(s, r, corrupt))
                .map_err(|e| e.status().to_string())
        })
        .collect();
    let before = ingester.snapshot();
    let json = serde_json::to_string(&ingester.query_all()).unwrap();
    check_query_paths(&ingester, &s.plan, &before);
    ingester.flush();
    let after = ingester.snapshot();
    check_query_paths(&ingester, &s.plan, &after);
    (results, before, after, json)
}

/// Every way to ask a query gives `query`'s answer: the JSON encoded directly
/// (`encode_query`) and kept per closed window (`query_json`, asked twice) is
/// `serde_json`'s of the `QueryResult`, byte for byte, and the quantile scan
/// finds the same quantiles, bit for bit — for the last closed window, every
/// window with a pane, and one without; and every aggregation's at once
/// (`query_all_json`) is `serde_json`'s of `query_all`.
fn check_query_paths(ingester: &Ingester, plan: &Plan, panes: &[PaneReport]) {
    let mut windows: Vec<Option<i64>> = vec![None, Some(-1)];
    windows.extend(panes.iter().map(|p| Some(p.window_start_ms)));
    windows.dedup();
    for agg in &plan.aggregations {
        for &window in &windows {
            let reference = ingester.query(&agg.id, window).unwrap();
            let expected = serde_json::to_vec(&reference).unwrap();
            for _ in 0..2 {
                let mut got = Vec::new();
                assert!(ingester.query_json(&agg.id, window, &mut got));
                assert_eq!(
                    String::from_utf8_lossy(&got),
                    String::from_utf8_lossy(&expected)
                );
            }
            let mut fresh = Vec::new();
            assert!(ingester.encode_query(&agg.id, window, &mut fresh));
            assert_eq!(fresh, expected);
            let mut scan = Vec::new();
            let scanned = ingester
                .quantile_scan(&agg.id, window, &mut |qs| scan.extend_from_slice(qs))
                .unwrap();
            assert_eq!(scanned, reference.groups.len());
            let mut from_query: Vec<u64> = reference
                .groups
                .iter()
                .flat_map(|g| g.quantiles.0.iter().map(|(_, v)| v.to_bits()))
                .collect();
            let mut scan: Vec<u64> = scan.iter().map(|v| v.to_bits()).collect();
            // The scan goes in group-id order, the answer in label order.
            from_query.sort();
            scan.sort();
            assert_eq!(scan, from_query);
        }
    }
    assert!(!ingester.query_json("no such aggregation", None, &mut Vec::new()));
    let mut all = Vec::new();
    ingester.query_all_json(&mut all);
    assert_eq!(all, serde_json::to_vec(&ingester.query_all()).unwrap());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// All 16 combinations: same per-request result and stats, same panes, bit for bit.
    #[test]
    fn all_strategy_combinations_agree(s in scenario(false, (1usize..4).boxed())) {
        let combos = StrategySet::combinations(Stage::Ingest);
        assert_eq!(combos.len(), 16);
        let reference = run(&s, StrategySet::NONE, true);
        for &set in &combos[1..] {
            let got = run(&s, set, true);
            prop_assert_eq!(&got.0, &reference.0, "request results differ for {}", set);
            prop_assert_eq!(&got.1, &reference.1, "panes differ for {}", set);
            prop_assert_eq!(&got.2, &reference.2, "panes after flush differ for {}", set);
            prop_assert_eq!(&got.3, &reference.3, "query JSON differs for {}", set);
        }
    }

    /// The panes hold exactly the samples the window rules say, and every quantile
    /// is within the relative accuracy of the exact one.
    #[test]
    fn quantiles_within_relative_accuracy(s in scenario(true, Just(1000usize).boxed())) {
        let expected = model(&s);
        for set in [StrategySet::NONE, StrategySet::all()] {
            let (_, _, panes, _) = run(&s, set, false);
            let got: BTreeMap<_, _> = panes.iter().map(|p| ((p.aggregation.clone(), p.group.clone(), p.window_start_ms), p)).collect();
            prop_assert_eq!(got.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>());
            for (key, values) in &expected {
                let pane = got[key];
                prop_assert_eq!(pane.count, values.len() as u64);
                let alpha = s.plan.aggregations.iter().find(|a| a.id == key.0).unwrap().relative_accuracy;
                prop_assert_eq!(pane.quantile_bits.len(), QUANTILES.len());
                for (q, bits) in QUANTILES.iter().zip(&pane.quantile_bits) {
                    let estimate = f64::from_bits(bits.unwrap());
                    let exact = values[(q * (values.len() as f64 - 1.0)) as usize];
                    let bound = alpha * exact.abs() * (1.0 + 1e-9);
                    prop_assert!((estimate - exact).abs() <= bound, "q={} estimate {} exact {} (alpha {})", q, estimate, exact, alpha);
                }
            }
        }
    }
}

proptest! {
    // Each case replays up to seven requests of up to 300 series through 32 ingesters.
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Hundreds of series and groups per request, the series cache warm (and,
    /// with room for 100 entries, emptied between requests): all 16 combinations agree.
    #[test]
    fn all_strategy_combinations_agree_on_wide_requests(s in wide_scenario()) {
        let combos = StrategySet::combinations(Stage::Ingest);
        for capacity in [1 << 18, 100] {
            let reference = run_with_cache(&s, StrategySet::NONE, true, capacity);
            for &set in &combos[1..] {
                let got = run_with_cache(&s, set, true, capacity);
                prop_assert_eq!(&got.0, &reference.0, "request results differ for {}", set);
                prop_assert_eq!(&got.1, &reference.1, "panes differ for {}", set);
                prop_assert_eq!(&got.2, &reference.2, "panes after flush differ for {}", set);
                prop_assert_eq!(&got.3, &reference.3, "query JSON differs for {}", set);
            }
        }
    }
}

/// [`run_with_cache`] through a [`LanedIngester`] of `lanes` lanes, request
/// `r` on lane `r % lanes`; every query is also asked of the one ingester's
/// answer (`reference`, the same requests through an [`Ingester`]) byte for byte.
fn run_laned(
    s: &Scenario,
    set: StrategySet,
    lanes: usize,
    cache_capacity: usize,
    reference: &Ingester,
) -> Outcome {
    let ingester = LanedIngester::new(lanes, || {
        Ingester::new(s.plan.clone(), set).with_cache_capacity(cache_capacity)
    });
    let results = (0..s.requests.len())
        .map(|r| {
            let corrupt = s.corrupt[r] && !s.requests[r].is_empty();
            ingester
                .handle_on(r, &encode(s, r, corrupt))
                .map_err(|e| e.status().to_string())
        })
        .collect();
    let before = ingester.snapshot();
    let json = serde_json::to_string(&ingester.query_all()).unwrap();
    let mut windows: Vec<Option<i64>> = vec![None, Some(-1)];
    windows.extend(before.iter().map(|p| Some(p.window_start_ms)));
    for agg in &s.plan.aggregations {
        for &window in &windows {
            let (mut got, mut expected) = (Vec::new(), Vec::new());
            assert!(ingester.query_json(&agg.id, window, &mut got));
            assert!(reference.query_json(&agg.id, window, &mut expected));
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&expected)
            );
        }
    }
    assert_eq!(ingester.watermark(), reference.watermark());
    assert_eq!(ingester.totals(), reference.totals());
    ingester.flush();
    let after = ingester.snapshot();
    (results, before, after, json)
}

/// The one ingester after the scenario's requests (with corruption), not flushed.
fn one_ingester(s: &Scenario, set: StrategySet, cache_capacity: usize) -> Ingester {
    let mut ingester = Ingester::new(s.plan.clone(), set).with_cache_capacity(cache_capacity);
    for r in 0..s.requests.len() {
        let corrupt = s.corrupt[r] && !s.requests[r].is_empty();
        let _ = ingester.handle(&encode(s, r, corrupt));
    }
    ingester
}

proptest! {
    // Each case replays up to seven requests through 2 ingesters and 4 × 2 laned ones.
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// A laned ingester (1–4 lanes, requests taking turns) gives the one
    /// ingester's per-request results, panes (bit for bit), query answers
    /// (byte for byte, open windows too), watermark and totals, the series
    /// caches tiny or not.
    #[test]
    fn laned_ingester_agrees_with_one(s in scenario(false, (1usize..4).boxed())) {
        for set in [StrategySet::all(), StrategySet::NONE] {
            for capacity in [4, 1 << 18] {
                let reference = run_with_cache(&s, set, true, capacity);
                let one = one_ingester(&s, set, capacity);
                for lanes in 1..=4 {
                    let got = run_laned(&s, set, lanes, capacity, &one);
                    prop_assert_eq!(&got.0, &reference.0, "request results differ, {} lanes", lanes);
                    prop_assert_eq!(&got.1, &reference.1, "panes differ, {} lanes", lanes);
                    prop_assert_eq!(&got.2, &reference.2, "panes after flush differ, {} lanes", lanes);
                    prop_assert_eq!(&got.3, &reference.3, "query JSON differs, {} lanes", lanes);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// Hundreds of groups, each in panes on several lanes.
    #[test]
    fn laned_ingester_agrees_with_one_on_wide_requests(s in wide_scenario()) {
        let set = StrategySet::all();
        for capacity in [1 << 18, 100] {
            let reference = run_with_cache(&s, set, true, capacity);
            let one = one_ingester(&s, set, capacity);
            for lanes in 2..=4 {
                let got = run_laned(&s, set, lanes, capacity, &one);
                prop_assert_eq!(&got.0, &reference.0, "request results differ, {} lanes", lanes);
                prop_assert_eq!(&got.1, &reference.1, "panes differ, {} lanes", lanes);
                prop_assert_eq!(&got.2, &reference.2, "panes after flush differ, {} lanes", lanes);
                prop_assert_eq!(&got.3, &reference.3, "query JSON differs, {} lanes", lanes);
            }
        }
    }
}

proptest! {
    // Each case replays up to seven requests through 2 × 4 laned ingesters.
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// The DDSketch guarantee over the whole range the
    /// receiver accepts, with outliers, each group's samples split over 1–4
    /// lanes (requests take turns), both sketch seams: every pane holds the
    /// samples the window rules say, and every quantile is within α of the
    /// exact value at its rank (0 for a zero or subnormal; q = 0 and 1 exact).
    #[test]
    fn quantiles_within_alpha_over_the_whole_range_on_lanes(s in scenario_of(whole_range_value(), Just(1000usize).boxed())) {
        let expected = model(&s);
        for set in [StrategySet::NONE, StrategySet::all()] {
            for lanes in 1..=4 {
                let laned = LanedIngester::new(lanes, || Ingester::new(s.plan.clone(), set));
                for r in 0..s.requests.len() {
                    laned.handle_on(r, &encode(&s, r, false)).unwrap();
                }
                laned.flush();
                let panes = laned.snapshot();
                let got: BTreeMap<_, _> = panes.iter().map(|p| ((p.aggregation.clone(), p.group.clone(), p.window_start_ms), p)).collect();
                prop_assert_eq!(got.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>());
                for (key, values) in &expected {
                    let pane = got[key];
                    prop_assert_eq!(pane.count, values.len() as u64);
                    let alpha = s.plan.aggregations.iter().find(|a| a.id == key.0).unwrap().relative_accuracy;
                    for (q, bits) in QUANTILES.iter().zip(&pane.quantile_bits) {
                        let estimate = f64::from_bits(bits.unwrap());
                        let exact = values[(q * (values.len() as f64 - 1.0)) as usize];
                        if *q == 0.0 || *q == 1.0 {
                            prop_assert_eq!(estimate, exact);
                        } else if exact.abs() < f64::MIN_POSITIVE {
                            prop_assert_eq!(estimate, 0.0, "q={} exact {:e}", q, exact);
                        } else {
                            let bound = alpha * exact.abs() * (1.0 + 1e-9);
                            prop_assert!((estimate - exact).abs() <= bound, "q={} estimate {:e} exact {:e} (alpha {}, {} lanes, {})", q, estimate, exact, alpha, lanes, set);
                        }
                    }
                }
            }
        }
    }
}

type PaneKey = (String, Vec<(String, String)>, i64);

/// The window rules, written out plainly: the watermark moves between requests.
fn model(s: &Scenario) -> BTreeMap<PaneKey, Vec<f64>> {
    let mut panes: BTreeMap<PaneKey, Vec<f64>> = BTreeMap::new();
    let mut watermark = i64::MIN;
    for r in 0..s.requests.len() {
        let base = 1_700_000_000_000i64 + r as i64 * 3_000;
        let mut newest = None;
        for (series, samples) in &s.requests[r] {
            let labels: BTreeMap<&str, &str> = s.pool[*series]
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            let matched: Vec<&Aggregation> = s
                .plan
                .aggregations
                .iter()
                .filter(|a| {
                    labels["__name__"] == a.metric
                        && a.matchers
                            .iter()
                            .all(|(k, v)| labels.get(k.as_str()).copied().unwrap_or("") == v)
                })
                .collect();
            for &(off, v) in samples {
                let ts = base + off;
                if matched.is_empty() || !v.is_finite() {
                    continue;
                }
                newest = newest.max(Some(ts));
                for a in &matched {
                    let w = a.window_secs as i64 * 1000;
                    let start = ts.div_euclid(w) * w;
                    if start + w <= watermark {
                        continue;
                    }
                    let group = a
                        .group_by
                        .iter()
                        .filter_map(|g| {
                            labels
                                .get(g.as_str())
                                .filter(|v| !v.is_empty())
                                .map(|v| (g.clone(), v.to_string()))
                        })
                        .collect();
                    panes
                        .entry((a.id.clone(), group, start))
                        .or_default()
                        .push(v);
                }
            }
        }
        if let Some(n) = newest {
            watermark = watermark.max(n - s.plan.lateness_secs as i64 * 1000);
        }
    }
    for values in panes.values_mut() {
        values.sort_by(f64::total_cmp);
    }
    panes
}
