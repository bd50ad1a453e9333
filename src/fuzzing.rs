//! The bodies of the fuzz targets (`fuzz/fuzz_targets/*.rs`), one per parser
//! that sees outside bytes. Each takes arbitrary bytes and panics only on a
//! finding: a parser that panics, or two implementations (strategy seams, fast
//! path and reference) that disagree. `tests/fuzz_corpus.rs` replays the
//! committed corpus and regressions through them as an ordinary test.
//!
//! Not an API: the targets are thin calls into here so that what CI replays
//! is exactly what was fuzzed.

use crate::export::{export, Exporter};
use crate::format::formenc::{self, ComponentCache, Dialect};
use crate::format::registry::{MetricDef, MetricType, ProcessAggregation, Registry};
use crate::ingest::pipeline::{IngestError, Ingester};
use crate::ingest::plan::Plan;
use crate::ingest::query::QuantileParams;
use crate::ingest::wire;
use crate::shared::seams::Unescape;
use crate::shared::strategy::{Stage, StrategySet};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// The strategy sets every differential target runs: none, all, each of the
/// stage's strategies alone, and the stage's full set.
fn strategy_sets(stage: Stage) -> Vec<StrategySet> {
    let mut sets = vec![StrategySet::NONE, StrategySet::all()];
    for s in stage.strategies() {
        sets.push(StrategySet::NONE.with(s));
    }
    sets
}

// ---------------------------------------------------------------------------
// Store files.

/// A scratch store directory per thread (libFuzzer runs one; the test replay several).
struct ScratchDir(PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

thread_local! {
    static STORE_DIR: ScratchDir = {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("promlab-fuzz-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch store directory");
        ScratchDir(dir)
    };
}

/// The metric a fuzzed store file belongs to, chosen by the input's first byte.
fn store_metric(selector: u8) -> MetricDef {
    let (kind, aggregation) = match selector & 7 {
        0 => (MetricType::Counter, ProcessAggregation::Sum),
        1 => (MetricType::Gauge, ProcessAggregation::All),
        2 => (MetricType::Gauge, ProcessAggregation::Sum),
        3 => (MetricType::Gauge, ProcessAggregation::Max),
        4 => (MetricType::Gauge, ProcessAggregation::Min),
        5 => (MetricType::Gauge, ProcessAggregation::MostRecent),
        6 => (MetricType::Histogram, ProcessAggregation::Sum),
        _ => (MetricType::Summary, ProcessAggregation::Sum),
    };
    let mut def = MetricDef {
        name: "m".into(),
        kind,
        help: "fuzzed".into(),
        labels: vec![],
        aggregation: Some(aggregation),
        buckets: vec![],
    };
    if kind == MetricType::Histogram {
        def.buckets = crate::format::registry::DEFAULT_BUCKETS
            .iter()
            .map(|b| b.to_string())
            .collect();
    }
    def
}

/// Writes the store of a fuzz input into `dir`: byte 0 picks the metric's type
/// and aggregation (bits 0–2) and whether a second process wrote the same
/// file (bit 3); the rest is the file, as it lies on disk.
pub fn write_store(dir: &Path, data: &[u8]) -> Registry {
    let (selector, file) = data.split_first().unwrap_or((&0, &[]));
    for entry in std::fs::read_dir(dir).expect("scratch directory") {
        std::fs::remove_file(entry.expect("scratch entry").path()).expect("scratch file");
    }
    std::fs::write(dir.join("metric_m___1.bin"), file).expect("scratch file");
    if selector & 8 != 0 {
        std::fs::write(dir.join("metric_m___2.bin"), file).expect("scratch file");
    }
    Registry {
        metrics: vec![store_metric(*selector)],
    }
}

/// Store files: the exposition of a fuzzed store under every export seam is
/// the same (or every seam refuses it) and holds only lines Prometheus
/// accepts; a long-lived exporter scraping twice gives the same bytes twice;
/// and where both the exporter and the naive reference read the store, they
/// print the same bytes.
pub fn store_file(data: &[u8]) {
    STORE_DIR.with(|dir| {
        let dir = &dir.0;
        let registry = write_store(dir, data);
        let baseline = export(dir, &registry, StrategySet::NONE);
        for set in strategy_sets(Stage::Export) {
            let other = export(dir, &registry, set);
            match (&baseline, &other) {
                (Ok(a), Ok(b)) => assert!(a == b, "export under {set} differs from none"),
                (Err(_), Err(_)) => {}
                (a, b) => panic!(
                    "none and {set} disagree: {:?} vs {:?}",
                    a.as_ref().map(|_| "ok"),
                    b.as_ref().map(|_| "ok")
                ),
            }
        }
        if let Ok(text) = &baseline {
            let fault = crate::reference::exposition::exposition_fault(text);
            assert!(fault.is_none(), "invalid exposition: {fault:?}");
        }
        let mut kept = Exporter::new(dir, registry.clone(), StrategySet::all());
        let (mut first, mut second) = (Vec::new(), Vec::new());
        let first_ok = kept.export_into(&mut first).is_ok();
        let second_ok = kept.export_into(&mut second).is_ok();
        assert_eq!(first_ok, baseline.is_ok(), "a kept exporter's first scrape");
        assert_eq!(second_ok, first_ok, "a kept exporter's second scrape");
        if first_ok {
            assert!(first == second, "a kept exporter's scrapes differ");
        }
        if let (Ok(fast), Ok(naive)) = (
            &baseline,
            crate::reference::exposition::export(dir, &registry),
        ) {
            assert!(
                *fast == naive,
                "export and the reference differ:\n{}\nvs\n{}",
                String::from_utf8_lossy(fast),
                String::from_utf8_lossy(&naive)
            );
        }
    })
}

// ---------------------------------------------------------------------------
// Form-encoded keys.

fn owned(labels: Vec<formenc::Label<'_>>) -> Vec<(Vec<u8>, Vec<u8>)> {
    labels
        .into_iter()
        .map(|(n, v)| (n.into_owned(), v.into_owned()))
        .collect()
}

/// Form-encoded keys: the reference, fast and cached decoders agree (labels
/// and errors), and a decoded key encodes back to one that decodes the same.
pub fn form_key(data: &[u8]) {
    let reference = formenc::decode_key_reference(data).map(owned);
    let fast = formenc::decode_key_fast(data).map(owned);
    assert_eq!(reference, fast, "fast decoder");
    let mut cache = ComponentCache::default();
    for unescape in [Unescape::Reference, Unescape::Fast] {
        assert_eq!(
            reference,
            unescape.decode_key(data).map(owned),
            "{unescape:?}"
        );
        let cached = formenc::decode_key_cached(data, unescape, &mut cache).map(owned);
        assert_eq!(reference, cached, "cached {unescape:?}");
        // Again, through the now warm cache.
        let cached = formenc::decode_key_cached(data, unescape, &mut cache).map(owned);
        assert_eq!(reference, cached, "warm cached {unescape:?}");
    }
    for piece in data.split(|&b| b == b'&') {
        let component = formenc::decode_component(piece).map(Cow::into_owned);
        let naive = crate::reference::exposition::decode_component(piece);
        assert_eq!(component.is_ok(), naive.is_ok(), "component {piece:?}");
        if let (Ok(a), Ok(b)) = (component, naive) {
            assert_eq!(a, b, "component {piece:?}");
        }
    }
    if let Ok(labels) = reference {
        for dialect in [Dialect::Cgi, Dialect::Uri] {
            let mut encoded = Vec::new();
            formenc::encode_key(
                &mut encoded,
                labels.iter().map(|(n, v)| (n.as_slice(), v.as_slice())),
                dialect,
            );
            let again = formenc::decode_key_reference(&encoded).map(owned);
            assert_eq!(again.as_ref(), Ok(&labels), "round trip in {dialect:?}");
        }
    }
}

// ---------------------------------------------------------------------------
// Registry JSON.

/// Registry JSON: parsing never panics; a registry that loads survives
/// `to_json` and loads again the same; its bucket bounds parse; an empty
/// store exports the same under every seam and the reference.
pub fn registry_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(registry) = Registry::from_json(text) else {
        return;
    };
    let again = Registry::from_json(&registry.to_json()).expect("to_json loads again");
    // `to_json` writes the aggregation in force, declared or not.
    let effective = |r: &Registry| -> Vec<MetricDef> {
        r.metrics
            .iter()
            .map(|m| MetricDef {
                aggregation: Some(m.aggregation()),
                ..m.clone()
            })
            .collect()
    };
    assert_eq!(
        effective(&again),
        effective(&registry),
        "to_json round trip"
    );
    for def in &registry.metrics {
        let _ = def.bucket_bounds();
    }
    STORE_DIR.with(|dir| {
        let dir = &dir.0;
        write_store(dir, &[]);
        std::fs::remove_file(dir.join("metric_m___1.bin")).expect("scratch file");
        let baseline = export(dir, &registry, StrategySet::NONE).expect("an empty store exports");
        let all = export(dir, &registry, StrategySet::all()).expect("an empty store exports");
        assert!(baseline == all, "empty export under all");
        let naive = crate::reference::exposition::export(dir, &registry).expect("reference");
        assert!(baseline == naive, "empty export and the reference differ");
    })
}

// ---------------------------------------------------------------------------
// Plan TOML.

/// One remote-write request (uncompressed) that feeds every aggregation of
/// `plan`: a series per aggregation with its matchers and group-by labels,
/// at a few timestamps.
pub fn request_for(plan: &Plan) -> Vec<u8> {
    let mut raw = Vec::new();
    for (i, agg) in plan.aggregations.iter().enumerate() {
        let mut labels: std::collections::BTreeMap<&str, String> = Default::default();
        labels.insert("__name__", agg.metric.clone());
        for (k, v) in &agg.matchers {
            labels.insert(k, v.clone());
        }
        for g in &agg.group_by {
            labels.entry(g).or_insert_with(|| format!("g{i}"));
        }
        let mut encoded = Vec::new();
        for (k, v) in &labels {
            wire::put_label(&mut encoded, k.as_bytes(), v.as_bytes());
        }
        for (j, ts) in [0, 1_700_000_000_000, 1_700_000_061_000, i64::MAX / 2]
            .into_iter()
            .enumerate()
        {
            wire::put_series_one_sample(&mut raw, &encoded, 1.0 + j as f64, ts);
        }
    }
    raw
}

/// Plan TOML: parsing never panics, and a plan that loads can be used: a
/// request feeding each of its aggregations is handled under none and all
/// with the same outcome and the same windows.
pub fn plan_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(plan) = Plan::parse(text) else {
        return;
    };
    let raw = request_for(&plan);
    let body = wire::compress(&raw);
    let outcomes: Vec<_> = [StrategySet::NONE, StrategySet::all()]
        .into_iter()
        .map(|set| {
            let mut ingester = Ingester::new(plan.clone(), set);
            let first = ingester.handle(&body).map_err(|e| e.status());
            let second = ingester.handle(&body).map_err(|e| e.status());
            ingester.flush();
            for agg in &plan.aggregations {
                let _ = ingester.query(&agg.id, None);
            }
            (first, second, ingester.snapshot())
        })
        .collect();
    assert!(
        outcomes[0] == outcomes[1],
        "none and all disagree on a plan"
    );
}

// ---------------------------------------------------------------------------
// Remote-write requests.

/// The plan the remote-write target ingests under: the Prometheus captures'
/// plan, plus the feeder's `data` by `label_0`.
fn remote_write_plan() -> Plan {
    let mut plan = Plan::parse(include_str!(
        "../experiments/plans/prometheus-captures.toml"
    ))
    .expect("the captures' plan");
    plan.aggregations.extend(Plan::default().aggregations);
    plan
}

/// Remote-write requests: byte 0 says whether the rest is the body as sent
/// (even: a snappy block) or the `WriteRequest` to compress first (odd). Every
/// ingest strategy set answers alike (the same stats, or the same status),
/// twice in a row (the second time through warm caches), and ends with the
/// same windows, quantiles as bits.
pub fn remote_write(data: &[u8]) {
    let (mode, rest) = data.split_first().unwrap_or((&0, &[]));
    let compressed;
    let body = if mode & 1 == 0 {
        rest
    } else {
        compressed = wire::compress(rest);
        &compressed
    };
    let plan = remote_write_plan();
    let run = |set: StrategySet| {
        let mut ingester = Ingester::new(plan.clone(), set).with_max_decoded(1 << 20);
        let status = |r: Result<_, IngestError>| r.map_err(|e| e.status());
        let first = status(ingester.handle(body));
        let second = status(ingester.handle(body));
        let open = ingester.snapshot();
        ingester.flush();
        let queries = ingester.query_all();
        (first, second, open, ingester.snapshot(), queries)
    };
    let baseline = run(StrategySet::NONE);
    for set in strategy_sets(Stage::Ingest).into_iter().skip(1) {
        let other = run(set);
        assert_eq!(baseline.0, other.0, "first request under {set}");
        assert_eq!(baseline.1, other.1, "second request under {set}");
        assert!(baseline.2 == other.2, "open windows under {set}");
        assert!(baseline.3 == other.3, "closed windows under {set}");
        assert_eq!(
            format!("{:?}", baseline.4),
            format!("{:?}", other.4),
            "queries under {set}"
        );
    }
}

// ---------------------------------------------------------------------------
// The quantiles query string.

thread_local! {
    /// An ingester fed a request for each aggregation of its plan, windows closed.
    static QUERIED: Ingester = {
        let mut ingester = Ingester::new(remote_write_plan(), StrategySet::all());
        let raw = request_for(&ingester.plan().plan.clone());
        ingester.handle(&wire::compress(&raw)).expect("a request the plan feeds");
        ingester.flush();
        ingester
    };
}

/// The quantiles query string: parsing never panics, and whatever parses is
/// answered (found or not) with JSON that serializes.
pub fn quantiles_query(data: &[u8]) {
    let Ok(params) = QuantileParams::from_query(data) else {
        return;
    };
    QUERIED.with(|ingester| {
        if let Some(result) = ingester.query(&params.agg, params.window) {
            serde_json::to_vec(&result).expect("query results serialize");
        }
    });
}

/// A target's body.
pub type Target = fn(&[u8]);

/// Every target's body by name, for the corpus replay.
pub const TARGETS: [(&str, Target); 6] = [
    ("store_file", store_file),
    ("form_key", form_key),
    ("registry_json", registry_json),
    ("plan_toml", plan_toml),
    ("remote_write", remote_write),
    ("quantiles_query", quantiles_query),
];
