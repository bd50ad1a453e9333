//! The live registry renders the same bytes with and without `prerender`, and
//! both match an independent reference written the obvious way.

use promlab::format::registry::MetricType;
use promlab::render::live::LiveRegistry;
use promlab::scenarios::rabbitmq::{self, RabbitMqNode, SERIES_PER_QUEUE};
use promlab::shared::strategy::{Stage, Strategy as Optimization, StrategySet};
use proptest::prelude::*;
use std::collections::HashSet;

type FamilySpec = promlab::reference::live::Family;

/// Every set the proptest walks: each combination of the render stage's
/// strategies, plus everything on (other stages' strategies must not matter).
fn strategy_sets() -> Vec<StrategySet> {
    let mut sets = StrategySet::combinations(Stage::Render);
    sets.push(StrategySet::all());
    sets.push(StrategySet::all().without(Optimization::Prerender));
    sets
}

fn render(families: &[FamilySpec], strategies: StrategySet) -> Vec<u8> {
    let mut reg = LiveRegistry::new(strategies);
    for f in families {
        let labels: Vec<&str> = f.label_names.iter().map(String::as_str).collect();
        let id = reg.register(&f.name, f.kind, &f.help, &labels).unwrap();
        for (values, v) in &f.series {
            let values: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            let s = reg.series(id, &values).unwrap();
            reg.set(s, *v);
        }
    }
    let mut out = b"stale bytes that render_into must clear".to_vec();
    reg.render_into(&mut out);
    out
}

/// client_ruby's text format, spelled out ([`promlab::reference::live`]).
fn reference(families: &[FamilySpec]) -> Vec<u8> {
    promlab::reference::live::render(families)
}

/// Label values and help text: plain names, the characters that need escaping, non-ASCII.
fn awkward_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"\"".to_vec()),
        Just(b"\\".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\\n".to_vec()),
        Just("é日本→".as_bytes().to_vec()),
        Just(b"/".to_vec()),
        Just(vec![0xff, 0xc3]), // not UTF-8: escaping is bytewise, nothing is validated
        "[a-z0-9_.<>-]{1,12}".prop_map(String::into_bytes),
        any::<char>().prop_map(|c| c.to_string().into_bytes()),
    ];
    prop::collection::vec(piece, 0..5).prop_map(|pieces| pieces.concat())
}

fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        Just(-0.0),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(f64::NAN),
        Just(f64::MIN_POSITIVE),
        Just(-5e-324),
        (1u64..1 << 52).prop_map(f64::from_bits), // subnormals
        Just(9_007_199_254_740_992.0),
        Just(1e16),
        (-1_000_000i64..1_000_000).prop_map(|i| i as f64),
        any::<f64>(),
    ]
}

fn family(index: usize) -> impl Strategy<Value = FamilySpec> {
    (
        "[a-zA-Z_:][a-zA-Z0-9_:]{0,10}",
        prop::bool::ANY,
        awkward_bytes(),
        prop::collection::vec("[a-zA-Z][a-zA-Z0-9_]{0,6}", 0..4),
    )
        .prop_flat_map(move |(name, counter, help, labels)| {
            let mut seen = HashSet::new();
            let labels: Vec<String> = labels
                .into_iter()
                .filter(|l| seen.insert(l.clone()))
                .collect();
            let k = labels.len();
            let series =
                prop::collection::vec((prop::collection::vec(awkward_bytes(), k), value()), 0..12);
            (Just(name), Just(counter), Just(help), Just(labels), series)
        })
        .prop_map(move |(name, counter, help, labels, series)| {
            // Unique label sets (the registry is get-or-create) and valid UTF-8 help (a &str API).
            let mut seen = HashSet::new();
            let series = series
                .into_iter()
                .filter(|(values, _)| seen.insert(values.clone()))
                .collect();
            FamilySpec {
                name: format!("{name}_{index}"),
                kind: if counter {
                    MetricType::Counter
                } else {
                    MetricType::Gauge
                },
                help: String::from_utf8_lossy(&help).into_owned(),
                label_names: labels,
                series,
            }
        })
}

fn families() -> impl Strategy<Value = Vec<FamilySpec>> {
    (0usize..4).prop_flat_map(|n| (0..n).map(family).collect::<Vec<_>>())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn prerender_is_byte_identical_to_baseline_and_reference(families in families()) {
        let expected = reference(&families);
        for set in strategy_sets() {
            let out = render(&families, set);
            prop_assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&expected),
                "strategies {}", set
            );
            prop_assert_eq!(&out, &expected);
        }
    }
}

#[test]
fn rabbitmq_scenario_is_identical_under_every_render_strategy() {
    let queues = 40;
    let mut outputs = Vec::new();
    for set in strategy_sets() {
        let mut scenario = RabbitMqNode::build(queues, true, set).unwrap();
        let mut first = Vec::new();
        scenario.render_per_object(&mut first);
        scenario.advance();
        let mut second = Vec::new();
        scenario.render_per_object(&mut second);
        let mut detailed = Vec::new();
        scenario
            .render_detailed(
                ["queue_coarse_metrics", "queue_consumer_count"],
                &mut detailed,
            )
            .unwrap();
        outputs.push((set, first, second, detailed));
    }
    let (_, first, second, detailed) = &outputs[0];
    let samples = |text: &[u8]| {
        text.split(|&b| b == b'\n')
            .filter(|l| !l.is_empty() && l[0] != b'#')
            .count()
    };
    assert_eq!(samples(first), SERIES_PER_QUEUE * queues);
    assert_eq!(samples(detailed), 5 * queues);
    assert_ne!(first, second, "values move between scrapes");
    assert!(
        first.windows(3).any(|w| w == b"\\\"p"),
        "awkward names are escaped"
    );
    for (set, f, s, d) in &outputs[1..] {
        assert!(
            f == first && s == second && d == detailed,
            "strategies {set} differ from the baseline"
        );
    }
    assert_eq!(
        &rabbitmq::render_once(queues, true, StrategySet::all()).unwrap(),
        first
    );
    // The reference renderer on the node's families as plain data.
    assert!(*first == reference(&rabbitmq::contents(queues, true, 1)));
    assert!(*second == reference(&rabbitmq::contents(queues, true, 2)));
    let names = rabbitmq::selected_names(["queue_coarse_metrics", "queue_consumer_count"]).unwrap();
    let selected: Vec<FamilySpec> = rabbitmq::contents(queues, true, 2)
        .into_iter()
        .filter(|f| names.contains(&f.name))
        .collect();
    assert_eq!(selected.len(), 5);
    assert!(*detailed == reference(&selected));
}

#[test]
fn counters_never_decrease_between_scrapes() {
    let mut scenario = RabbitMqNode::build(5, false, StrategySet::NONE).unwrap();
    let reg_values = |s: &RabbitMqNode| -> Vec<(MetricType, Vec<f64>)> {
        let mut out = Vec::new();
        s.render_per_object(&mut out);
        let text = String::from_utf8(out).unwrap();
        let mut families = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let kind = if rest.ends_with(" counter") {
                    MetricType::Counter
                } else {
                    MetricType::Gauge
                };
                families.push((kind, Vec::new()));
            } else if !line.starts_with('#') {
                let v: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
                families.last_mut().unwrap().1.push(v);
            }
        }
        families
    };
    let before = reg_values(&scenario);
    scenario.advance();
    let after = reg_values(&scenario);
    // Compared family by family, series by series: the same shape, and not empty.
    assert_eq!(before.len(), after.len());
    let mut counters = 0;
    for ((kind, b), (kind_after, a)) in before.iter().zip(&after) {
        assert_eq!((kind, b.len()), (kind_after, a.len()));
        if *kind == MetricType::Counter {
            for (b, a) in b.iter().zip(a) {
                assert!(a >= b, "{a} after {b}");
                counters += 1;
            }
        }
    }
    // 5 queues: 10 counter families of queues, channels and connections.
    assert!(counters >= 5 * 10, "{counters} counter series compared");
    // And the node's values are the scenario's definition, rendered by the reference.
    assert!(
        scenario_bytes(&scenario) == reference(&rabbitmq::contents(5, false, 2)),
        "after two moves"
    );
}

fn scenario_bytes(scenario: &RabbitMqNode) -> Vec<u8> {
    let mut out = Vec::new();
    scenario.render_per_object(&mut out);
    out
}
