//! The ingester's limits under every combination
//! of the ingest strategies: far-future samples are counted and cannot close
//! windows, groups, pane slots and bins stay bounded with every drop counted,
//! and on input within the limits the result is the unbounded one, bit for bit.

use promlab::ingest::budget::Capacity;
use promlab::ingest::lanes::LanedIngester;
use promlab::ingest::pipeline::{Ingester, Limits};
use promlab::ingest::plan::Plan;
use promlab::ingest::window::Stats;
use promlab::shared::strategy::{Stage, StrategySet};
#[path = "common/remote_write.rs"]
mod remote_write;
use remote_write::{body, body_of_instances};

/// The injected clock: 2026-12-01T00:00:00Z.
const NOW: i64 = 1_796_083_200_000;

fn fixed_clock() -> i64 {
    NOW
}

fn serving() -> Limits {
    Limits {
        clock: fixed_clock,
        ..Limits::serving()
    }
}

fn sets() -> Vec<StrategySet> {
    StrategySet::combinations(Stage::Ingest)
}

/// A plan that keeps one closed window, and limits with room for exactly one
/// pane of one value under `set` (bins are taken before they are held, so a
/// smaller limit admits no pane at all).
fn room_for_one_pane(set: StrategySet) -> (Plan, Limits) {
    let plan = Plan {
        lateness_secs: 0,
        keep_windows: 1,
        ..Plan::default()
    };
    let mut probe = Ingester::new(plan.clone(), set).with_limits(serving());
    probe.handle(&body(&[("a", NOW - 600_000, 1.0)])).unwrap();
    let mut limits = serving();
    limits.capacity.bins = probe.held().bins;
    (plan, limits)
}

#[test]
fn far_future_samples_are_counted_and_cannot_close_windows() {
    for set in sets() {
        let mut ingester = Ingester::new(Plan::default(), set).with_limits(serving());
        let year_2100 = 4_102_444_800_000;
        let ns_as_ms = NOW * 1_000_000;
        let stats = ingester
            .handle(&body(&[
                ("a", NOW, 1.0),
                ("a", year_2100, 2.0),
                ("b", ns_as_ms, 3.0),
            ]))
            .unwrap();
        assert_eq!((stats.accepted, stats.too_far_ahead), (1, 2), "{set}");
        // Within the bound, ahead of the clock: taken, and the watermark stays behind the clock.
        ingester
            .handle(&body(&[("a", NOW + 240_000, 4.0)]))
            .unwrap();
        assert!(ingester.watermark().unwrap() <= NOW, "{set}");
        let stats = ingester.handle(&body(&[("a", NOW - 1_000, 5.0)])).unwrap();
        assert_eq!((stats.accepted, stats.late), (1, 0), "{set}");
        assert_eq!(ingester.totals().too_far_ahead, 2);
    }
}

/// Without the policy (the library's default, for replays) the same request
/// moves the watermark as the timestamps say.
#[test]
fn without_the_policy_timestamps_are_taken_as_they_come() {
    let mut ingester = Ingester::new(Plan::default(), StrategySet::all());
    ingester
        .handle(&body(&[("a", NOW, 1.0), ("a", 4_102_444_800_000, 2.0)]))
        .unwrap();
    assert_eq!(ingester.totals().too_far_ahead, 0);
    assert_eq!(ingester.totals().accepted, 2);
}

#[test]
fn groups_pane_slots_and_bins_stay_bounded_and_every_drop_is_counted() {
    for set in sets() {
        let mut limits = serving();
        limits.capacity = Capacity {
            groups: 10,
            group_bytes: usize::MAX,
            pane_slots: 25,
            bins: 100_000,
        };
        let mut ingester = Ingester::new(Plan::default(), set).with_limits(limits);
        let names: Vec<String> = (0..30).map(|i| format!("g{i}")).collect();
        let samples: Vec<_> = names.iter().map(|g| (g.as_str(), NOW, 1.0)).collect();
        // 10 groups fill the limit; the next 20 go to the overflow group.
        let stats = ingester.handle(&body(&samples[..10])).unwrap();
        assert_eq!(stats.accepted, 10, "{set}");
        let stats = ingester.handle(&body(&samples[10..])).unwrap();
        assert_eq!((stats.accepted, stats.over_group_limit), (0, 20), "{set}");
        assert_eq!(ingester.held().groups, 10);
        // The kept groups in three more windows ahead: 10 slots each, 25 in all.
        let ahead: Vec<_> = (1..4)
            .flat_map(|w| {
                names[..10]
                    .iter()
                    .map(move |g| (g.as_str(), NOW + w * 60_000, 1.0))
            })
            .collect();
        let stats = ingester.handle(&body(&ahead)).unwrap();
        let held = ingester.held();
        assert!(held.pane_slots <= 25, "{set}: {held:?}");
        assert_eq!(
            stats.accepted + stats.over_pane_limit,
            30,
            "{set}: {stats:?}"
        );
        assert!(stats.over_pane_limit >= 10, "{set}: {stats:?}");
    }
}

#[test]
fn bins_at_their_limit_drop_samples_and_come_back_as_windows_expire() {
    for set in sets() {
        let (plan, limits) = room_for_one_pane(set);
        let mut ingester = Ingester::new(plan, set).with_limits(limits);
        let first = ingester
            .handle(&body(&[("a", NOW - 600_000, 1.0)]))
            .unwrap();
        assert_eq!(first.accepted, 1, "{set}");
        // Its window is still open: the bins are spent, nothing to give back,
        // and a new group's pane gets no sketch.
        let full = ingester
            .handle(&body(&[("c", NOW - 590_000, 1.0)]))
            .unwrap();
        assert_eq!(full.over_bin_limit, 1, "{set}: {full:?}");
        // This one closes the first window, but is dropped too (checked before).
        ingester
            .handle(&body(&[("b", NOW - 400_000, 1.0)]))
            .unwrap();
        // Now the closed window goes first, and the sample is taken.
        let last = ingester
            .handle(&body(&[("b", NOW - 300_000, 1.0)]))
            .unwrap();
        assert_eq!(last.accepted, 1, "{set}: {last:?}");
        let total: Stats = ingester.totals();
        assert_eq!(
            (total.accepted, total.over_bin_limit),
            (2, 2),
            "{set}: {total:?}"
        );
    }
}

/// A flood of new groups past the bin limit cannot starve the groups already
/// there: their panes keep taking samples, up to twice the limit.
#[test]
fn groups_already_there_keep_their_panes_past_the_bin_limit() {
    for set in sets() {
        let (plan, limits) = room_for_one_pane(set);
        let one_pane = limits.capacity.bins;
        let mut ingester = Ingester::new(plan, set).with_limits(limits);
        let first = ingester
            .handle(&body(&[("a", NOW - 600_000, 1.0)]))
            .unwrap();
        assert_eq!(first.accepted, 1, "{set}");
        // The limit is reached: new groups are dropped ...
        let flood: Vec<(String, i64, f64)> = (0..100)
            .map(|i| (format!("new{i}"), NOW - 595_000, 1.0))
            .collect();
        let flood: Vec<(&str, i64, f64)> =
            flood.iter().map(|(g, t, v)| (g.as_str(), *t, *v)).collect();
        let dropped = ingester.handle(&body(&flood)).unwrap();
        assert_eq!(dropped.over_bin_limit, 100, "{set}: {dropped:?}");
        // ... while the group already there keeps taking samples (same value, same bin).
        let kept = ingester
            .handle(&body(&[("a", NOW - 590_000, 1.0)]))
            .unwrap();
        assert_eq!(kept.accepted, 1, "{set}: {kept:?}");
        let held = ingester.held().bins;
        assert!(held <= 2 * one_pane, "{set}: {held} bins held");
    }
}

#[test]
fn too_many_samples_in_a_request_is_refused_whole() {
    let mut limits = serving();
    limits.max_samples_per_request = 2;
    let mut ingester = Ingester::new(Plan::default(), StrategySet::all()).with_limits(limits);
    let err = ingester
        .handle(&body(&[("a", NOW, 1.0), ("b", NOW, 1.0), ("c", NOW, 1.0)]))
        .unwrap_err();
    assert_eq!(err.status(), 413);
    assert_eq!(ingester.totals(), Stats::default());
}

/// A plan built in code skips validation; its window
/// arithmetic must not panic whatever the lengths.
#[test]
fn absurd_window_lengths_do_not_panic() {
    for secs in [0, 1 << 61, u64::MAX] {
        for set in sets() {
            let mut plan = Plan::default();
            plan.aggregations[0].window_secs = secs;
            plan.lateness_secs = u64::MAX;
            let mut ingester = Ingester::new(plan, set);
            ingester
                .handle(&body(&[
                    ("a", i64::MIN, 1.0),
                    ("a", i64::MAX, 2.0),
                    ("a", 0, 3.0),
                ]))
                .unwrap();
            ingester.flush();
            let _ = ingester.query_all();
        }
    }
}

/// Good input (within every limit, behind the clock) gives the unbounded
/// ingester's panes and stats, bit for bit, under every combination.
#[test]
fn within_the_limits_nothing_changes() {
    let requests: Vec<Vec<u8>> = (0..40)
        .map(|r| {
            let samples: Vec<(String, i64, f64)> = (0..50)
                .map(|i| {
                    let t = NOW - 3_600_000 + r * 7_000 + i * 13;
                    (format!("g{}", i % 7), t, ((r * 50 + i) as f64).sqrt())
                })
                .collect();
            let refs: Vec<(&str, i64, f64)> = samples
                .iter()
                .map(|(g, t, v)| (g.as_str(), *t, *v))
                .collect();
            body(&refs)
        })
        .collect();
    let run = |set: StrategySet, limits: Limits| {
        let mut ingester = Ingester::new(Plan::default(), set).with_limits(limits);
        for r in &requests {
            ingester.handle(r).unwrap();
        }
        (ingester.totals(), ingester.snapshot())
    };
    let reference = run(StrategySet::NONE, Limits::UNBOUNDED);
    assert!(reference.0.accepted > 1000);
    for set in sets() {
        assert_eq!(run(set, serving()), reference, "{set}");
    }
}

/// After a flood of new groups, none was ever admitted
/// again. A group is reclaimed once no window holds a pane of it (its last
/// window aged out of the `keep_windows` closed ones), so new groups come
/// back — on one lane and on two, every combination.
#[test]
fn groups_come_back_after_a_flood() {
    let t0 = (NOW - 600_000).div_euclid(60_000) * 60_000;
    for set in sets() {
        for lanes in [1, 2] {
            let plan = Plan {
                lateness_secs: 0,
                keep_windows: 2,
                ..Plan::default()
            };
            let mut limits = serving();
            limits.capacity.groups = 100;
            let laned = LanedIngester::new(lanes, || {
                Ingester::new(plan.clone(), set).with_limits(limits)
            });
            let what = format!("{set}, {lanes} lanes");
            laned.handle_on(0, &body(&[("good", t0, 1.0)])).unwrap();
            let flood: Vec<String> = (0..1_000).map(|i| format!("flood{i}")).collect();
            let flood: Vec<(&str, i64, f64)> =
                flood.iter().map(|g| (g.as_str(), t0 + 1, 2.0)).collect();
            let stats = laned.handle_on(1, &body(&flood)).unwrap();
            assert_eq!(
                (stats.accepted, stats.over_group_limit),
                (99, 901),
                "{what}"
            );
            let refused = laned
                .handle_on(0, &body(&[("newcomer", t0 + 2, 3.0)]))
                .unwrap();
            assert_eq!(refused.over_group_limit, 1, "{what}");
            // The good group goes on; the flood's window closes, then ages out.
            for w in 1..=3 {
                laned
                    .handle_on(w as usize, &body(&[("good", t0 + w * 60_000, 1.0)]))
                    .unwrap();
            }
            assert_eq!(laned.groups_reclaimed(), 99, "{what}");
            assert_eq!(laned.held().groups, 1, "{what}");
            let back = laned
                .handle_on(1, &body(&[("newcomer", t0 + 3 * 60_000 + 1, 3.0)]))
                .unwrap();
            assert_eq!((back.accepted, back.over_group_limit), (1, 0), "{what}");
            laned.flush();
            let answer = laned.query("data", None).unwrap();
            let names: Vec<&str> = answer
                .groups
                .iter()
                .map(|g| g.labels["label_0"].as_str())
                .collect();
            assert_eq!(names, ["good", "newcomer"], "{what}");
        }
    }
}

/// A flood first, then only new groups, each refused at the group limit:
/// the watermark moved with the refused samples and closed the flood's
/// window, but a window where every sample was refused was never made, so
/// no window closed after the flood's and it stayed the one kept for good,
/// its groups with it. A window of refused samples only is a window (it
/// closes, is kept and carries its `dropped`), so the flood's ages out.
#[test]
fn refused_samples_alone_age_a_flood_out() {
    let t0 = (NOW - 600_000).div_euclid(1_000) * 1_000;
    let plan = Plan {
        lateness_secs: 0,
        keep_windows: 1,
        aggregations: vec![promlab::ingest::plan::Aggregation {
            window_secs: 1,
            ..Plan::default().aggregations[0].clone()
        }],
    };
    for set in sets() {
        for lanes in [1, 2, 4] {
            let what = format!("{set}, {lanes} lanes");
            let mut limits = serving();
            limits.capacity.groups = 100;
            let laned = LanedIngester::new(lanes, || {
                Ingester::new(plan.clone(), set).with_limits(limits)
            });
            let flood: Vec<String> = (0..1_000).map(|i| format!("flood{i}")).collect();
            for (lane, chunk) in flood.chunks(250).enumerate() {
                let chunk: Vec<(&str, i64, f64)> =
                    chunk.iter().map(|g| (g.as_str(), t0 + 10, 1.0)).collect();
                laned.handle_on(lane, &body(&chunk)).unwrap();
            }
            assert_eq!(laned.held().groups, 100, "{what}");
            let mut admitted = None;
            for k in 1..=4i64 {
                let group = format!("newcomer{k}");
                let ts = t0 + k * 1_200;
                let stats = laned
                    .handle_on(k as usize, &body(&[(group.as_str(), ts, 2.0)]))
                    .unwrap();
                assert_eq!(laned.watermark(), Some(ts), "{what}: the watermark moves");
                if stats.accepted == 1 {
                    admitted = Some(k);
                    break;
                }
                assert_eq!(stats.over_group_limit, 1, "{what}");
            }
            assert_eq!(admitted, Some(3), "{what}: {:?}", laned.held());
            assert_eq!(laned.groups_reclaimed(), 100, "{what}");
            // The windows of refused samples say so.
            let refused = laned.query("data", Some(t0 + 2_000)).unwrap();
            assert_eq!((refused.dropped, refused.groups.len()), (1, 0), "{what}");
        }
    }
}

/// A new series of the group the new series before it resolved to skips the
/// group table; once groups are reclaimed, their destination ids
/// may be another group's, so that memory is forgotten with them. Here `x`
/// is reclaimed while `a` is the group remembered, and new series of `a`
/// keep coming, on one lane and on two, every combination.
#[test]
fn the_group_remembered_is_forgotten_when_groups_are_reclaimed() {
    let t0 = (NOW - 600_000).div_euclid(60_000) * 60_000;
    for set in sets() {
        for lanes in [1, 2] {
            let plan = Plan {
                lateness_secs: 0,
                keep_windows: 1,
                ..Plan::default()
            };
            let laned = LanedIngester::new(lanes, || {
                Ingester::new(plan.clone(), set).with_limits(serving())
            });
            let what = format!("{set}, {lanes} lanes");
            let lane = lanes - 1;
            let send = |samples: &[(&str, &str, i64, f64)]| {
                laned.handle_on(lane, &body_of_instances(samples)).unwrap()
            };
            send(&[("x", "i1", t0, 1.0), ("a", "i1", t0, 2.0)]);
            send(&[("a", "i1", t0 + 120_000, 3.0)]);
            send(&[("a", "i1", t0 + 240_000, 4.0)]);
            assert_eq!(laned.groups_reclaimed(), 1, "{what}");
            let stats = send(&[
                ("a", "i2", t0 + 241_000, 5.0),
                ("a", "i3", t0 + 242_000, 6.0),
            ]);
            assert_eq!(stats.accepted, 2, "{what}");
            laned.flush();
            let answer = laned.query("data", None).unwrap();
            let groups: Vec<(&str, u64)> = answer
                .groups
                .iter()
                .map(|g| (g.labels["label_0"].as_str(), g.count))
                .collect();
            assert_eq!(groups, [("a", 3)], "{what}");
        }
    }
}

/// Where a sample is refused past a limit, the answer says
/// so — `"dropped"` on the group whose pane missed it, and on the window for
/// groups that got no pane — and the quantiles of what was taken stay within
/// α: 1..100 plus one 1e300 that the bins cannot afford.
#[test]
fn refused_samples_are_flagged_in_the_answer() {
    let t0 = (NOW - 600_000).div_euclid(60_000) * 60_000;
    let plan = Plan {
        lateness_secs: 0,
        ..Plan::default()
    };
    let ordinary: Vec<(&str, i64, f64)> = (1..=100).map(|v| ("a", t0, f64::from(v))).collect();
    for set in sets() {
        // Room for the pane of 1..100 (twice that, for a pane that exists).
        let mut probe = Ingester::new(plan.clone(), set).with_limits(serving());
        probe.handle(&body(&ordinary)).unwrap();
        let mut limits = serving();
        limits.capacity.bins = probe.held().bins;
        let mut ingester = Ingester::new(plan.clone(), set).with_limits(limits);
        ingester.handle(&body(&ordinary)).unwrap();
        let stats = ingester
            .handle(&body(&[("a", t0 + 1, 1e300), ("b", t0 + 2, 5.0)]))
            .unwrap();
        assert_eq!(
            (stats.accepted, stats.over_bin_limit),
            (0, 2),
            "{set}: {stats:?}"
        );
        ingester.handle(&body(&[("a", t0 + 60_000, 1.0)])).unwrap();
        let mut json = Vec::new();
        assert!(ingester.query_json("data", Some(t0), &mut json));
        let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(json["dropped"], 1, "{set}: {json}");
        let a = &json["groups"][0];
        assert_eq!(
            (a["count"].as_u64(), a["dropped"].as_u64()),
            (Some(100), Some(1)),
            "{set}: {json}"
        );
        for (q, exact) in [("0.5", 50.0), ("0.9", 90.0), ("0.99", 99.0)] {
            let got = a["quantiles"][q].as_f64().unwrap();
            assert!(
                (got - exact).abs() <= 0.01 * exact * (1.0 + 1e-9),
                "{set}: p{q} = {got}"
            );
        }
        // The answer serde makes of `QueryResult` is the same.
        let result = ingester.query("data", Some(t0)).unwrap();
        assert_eq!((result.dropped, result.groups[0].dropped), (1, 1));
    }
}

/// One sample of 1e20 among 1..100 answered p50 = p90 =
/// p99 = 165.7; with 1e300, 1.65e282. Within the default limits every
/// combination answers within α and nothing is dropped.
#[test]
fn one_outlier_leaves_the_other_quantiles_within_alpha() {
    let t0 = (NOW - 600_000).div_euclid(60_000) * 60_000;
    for outlier in [1e20, 1e300, 1e-300, -1e300] {
        for set in sets() {
            let mut ingester = Ingester::new(Plan::default(), set).with_limits(serving());
            let mut samples: Vec<(&str, i64, f64)> =
                (1..=100).map(|v| ("a", t0, f64::from(v))).collect();
            samples.push(("a", t0, outlier));
            ingester.handle(&body(&samples)).unwrap();
            ingester.handle(&body(&[("a", t0 + 120_000, 1.0)])).unwrap();
            let answer = ingester.query("data", Some(t0)).unwrap();
            let mut sorted: Vec<f64> = samples.iter().map(|s| s.2).collect();
            sorted.sort_by(f64::total_cmp);
            let group = &answer.groups[0];
            assert_eq!((group.count, group.dropped, answer.dropped), (101, 0, 0));
            for (q, got) in &group.quantiles.0 {
                let exact = sorted[(q * 100.0) as usize];
                assert!(
                    (got - exact).abs() <= 0.01 * exact.abs() * (1.0 + 1e-9),
                    "{outlier:e} {set}: q {q} = {got} (exact {exact})"
                );
            }
        }
    }
}

/// `--max-ahead-secs 0` and one sample at now + 1 h
/// made every later real-time sample late. Without the drop, the watermark
/// still never passes the clock minus the lateness: the sample ahead is kept
/// in its window, and the real-time samples after it are on time.
#[test]
fn without_the_drop_the_watermark_still_waits_for_the_clock() {
    for set in sets() {
        let limits = Limits {
            max_ahead_ms: None,
            ..serving()
        };
        let mut ingester = Ingester::new(Plan::default(), set).with_limits(limits);
        let stats = ingester
            .handle(&body(&[("a", NOW + 3_600_000, 1.0), ("a", NOW, 2.0)]))
            .unwrap();
        assert_eq!((stats.accepted, stats.too_far_ahead), (2, 0), "{set}");
        assert!(ingester.watermark().unwrap() <= NOW, "{set}");
        let later = ingester.handle(&body(&[("a", NOW - 1_000, 3.0)])).unwrap();
        assert_eq!((later.accepted, later.late), (1, 0), "{set}");
    }
}

/// Which groups a full group limit lets in is decided by the requests'
/// order, never by a hash map's: every ingester's maps keyed by network
/// input are seeded at random (per process, per map), so several ingesters
/// of one set, and every set, must let in the same groups and answer the same.
#[test]
fn the_groups_a_full_limit_lets_in_do_not_depend_on_hash_seeds() {
    let mut limits = serving();
    limits.capacity.groups = 10;
    // 40 groups in a scrambled order; then the same groups again, later.
    let names: Vec<String> = (0..40).map(|i| format!("g{}", (i * 17) % 40)).collect();
    let requests: Vec<Vec<u8>> = (0..2)
        .map(|r| {
            let samples: Vec<(&str, i64, f64)> = names
                .iter()
                .enumerate()
                .map(|(i, g)| (g.as_str(), NOW - 60_000 + r * 1_000, i as f64))
                .collect();
            body(&samples)
        })
        .collect();
    let run = |set: StrategySet| {
        let mut ingester = Ingester::new(Plan::default(), set).with_limits(limits);
        for r in &requests {
            ingester.handle(r).unwrap();
        }
        let mut json = Vec::new();
        ingester.flush();
        assert!(ingester.query_json("data", None, &mut json));
        (ingester.totals(), ingester.snapshot(), json)
    };
    let first = run(StrategySet::NONE);
    // The first 10 groups in request order have panes; the other 30 overflow, twice.
    let kept: Vec<&str> = first.1.iter().map(|p| p.group[0].1.as_str()).collect();
    let mut expected: Vec<&str> = names[..10].iter().map(String::as_str).collect();
    expected.sort_unstable();
    let mut kept_sorted = kept.clone();
    kept_sorted.sort_unstable();
    assert_eq!(kept_sorted, expected);
    assert_eq!((first.0.accepted, first.0.over_group_limit), (20, 60));
    for set in sets() {
        for _ in 0..3 {
            assert!(run(set) == first, "{set}");
        }
    }
}

/// With room for one pane, the group a request touches first gets it, however
/// its series and the others' alternate after (the batched router counts a
/// run of series of one group at once; the first touch still decides).
#[test]
fn the_group_a_request_touches_first_gets_the_last_pane() {
    for set in sets() {
        let (plan, limits) = room_for_one_pane(set);
        for (order, first) in [
            (["b", "b", "a", "b", "a"], "b"),
            (["a", "b", "b", "a", "b"], "a"),
        ] {
            let mut ingester = Ingester::new(plan.clone(), set).with_limits(limits);
            let samples: Vec<(&str, i64, f64)> =
                order.iter().map(|&g| (g, NOW - 600_000, 1.0)).collect();
            let stats = ingester.handle(&body(&samples)).unwrap();
            let taken = order.iter().filter(|&&g| g == first).count() as u64;
            assert_eq!(
                (stats.accepted, stats.over_bin_limit),
                (taken, 5 - taken),
                "{set}, {order:?}: {stats:?}"
            );
            let groups: Vec<String> = ingester
                .snapshot()
                .iter()
                .filter(|p| p.count > 0)
                .map(|p| p.group[0].1.clone())
                .collect();
            assert_eq!(groups, vec![first.to_string()], "{set}, {order:?}");
        }
    }
}
