//! Decoding remote-write bodies: the real Prometheus fixtures, the borrowed
//! walker against prost on valid, mutated and random bytes. (The offline
//! `promlab ingest` command is the lab's `tests/ingest_cli.rs`.)

use promlab::ingest::pipeline::Ingester;
use promlab::ingest::plan::Plan;
use promlab::ingest::wire::{self, Label, Sample, TimeSeries, WireError, WriteRequest};
use promlab::shared::strategy::{Stage, StrategySet};
use proptest::prelude::*;
use prost::Message;
use std::path::PathBuf;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/remote-write/prometheus-2.42")
}

fn fixture_bodies() -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixture_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect()
}

/// Owned and borrowed decoding agree (borrowed plus the UTF-8 check it defers).
fn assert_decoders_agree(raw: &[u8]) -> Option<usize> {
    let mut holder = WriteRequest::default();
    let owned = wire::decode_owned(raw, &mut holder);
    let borrowed = wire::decode_borrowed(raw).and_then(|b| {
        let utf8 = b
            .labels
            .iter()
            .all(|(n, v)| std::str::from_utf8(n).is_ok() && std::str::from_utf8(v).is_ok());
        if utf8 {
            Ok(b)
        } else {
            Err(WireError::Protobuf(
                "invalid string value: data is not UTF-8 encoded".into(),
            ))
        }
    });
    match (&owned, &borrowed) {
        (Ok(o), Ok(b)) => {
            assert_eq!(o.labels, b.labels);
            assert_eq!(
                o.samples
                    .iter()
                    .map(|s| (s.value.to_bits(), s.timestamp))
                    .collect::<Vec<_>>(),
                b.samples
                    .iter()
                    .map(|s| (s.value.to_bits(), s.timestamp))
                    .collect::<Vec<_>>()
            );
            assert_eq!(
                o.series
                    .iter()
                    .map(|s| (s.labels.clone(), s.samples.clone()))
                    .collect::<Vec<_>>(),
                b.series
                    .iter()
                    .map(|s| (s.labels.clone(), s.samples.clone()))
                    .collect::<Vec<_>>()
            );
            assert_eq!(o.metadata, b.metadata);
            Some(o.series.len())
        }
        (Err(_), Err(_)) => None,
        _ => panic!(
            "decoders disagree: owned {:?} vs borrowed {:?}",
            owned.as_ref().err(),
            borrowed.as_ref().err()
        ),
    }
}

#[test]
fn all_27_prometheus_requests_decode() {
    let bodies = fixture_bodies();
    assert_eq!(bodies.len(), 27);
    let mut metadata_only = 0;
    let mut samples = 0;
    for (name, body) in &bodies {
        let mut raw = Vec::new();
        wire::decompress(body, 32 << 20, &mut raw).unwrap();
        let series =
            assert_decoders_agree(&raw).unwrap_or_else(|| panic!("{name} does not decode"));
        let batch = wire::decode_borrowed(&raw).unwrap();
        if series == 0 {
            assert!(batch.metadata > 0, "{name}");
            metadata_only += 1;
        }
        samples += batch.samples.len();
        // Every label set is valid as Prometheus sends it.
        for combo in StrategySet::combinations(Stage::Ingest) {
            Ingester::new(Plan::default(), combo)
                .handle(body)
                .unwrap_or_else(|e| panic!("{name} with {combo}: {e}"));
        }
    }
    assert_eq!(metadata_only, 7);
    assert_eq!(samples, 7839);
}

#[test]
fn fixture_labels_keep_quotes_and_non_ascii() {
    let bodies = fixture_bodies();
    let mut raw = Vec::new();
    let batch = bodies
        .iter()
        .find_map(|(_, body)| {
            wire::decompress(body, 32 << 20, &mut raw).unwrap();
            (!wire::decode_borrowed(&raw).unwrap().series.is_empty()).then_some(())
        })
        .map(|()| wire::decode_borrowed(&raw).unwrap())
        .unwrap();
    assert!(batch
        .labels
        .iter()
        .any(|(n, v)| *n == b"replica" && *v == b"a\"b"));
    assert!(batch
        .labels
        .iter()
        .any(|(n, v)| *n == b"team" && *v == "café 日本".as_bytes()));
}

fn valid_request() -> impl Strategy<Value = Vec<u8>> {
    let label = ("[a-c_]{1,3}", "\\PC{0,4}").prop_map(|(name, value)| Label { name, value });
    let sample =
        (any::<f64>(), any::<i64>()).prop_map(|(value, timestamp)| Sample { value, timestamp });
    let series = (
        prop::collection::vec(label, 0..4),
        prop::collection::vec(sample, 0..3),
    )
        .prop_map(|(labels, samples)| TimeSeries { labels, samples });
    prop::collection::vec(series, 0..4).prop_map(|timeseries| {
        WriteRequest {
            timeseries,
            metadata: vec![],
        }
        .encode_to_vec()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn decoders_agree_on_random_bytes(raw in prop::collection::vec(any::<u8>(), 0..64)) {
        assert_decoders_agree(&raw);
    }

    #[test]
    fn decoders_agree_on_mutated_requests(
        raw in valid_request(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        prop_assert!(assert_decoders_agree(&raw).is_some());
        let mut mutated = raw.clone();
        if !mutated.is_empty() {
            for (at, byte) in &edits {
                let i = at.index(mutated.len());
                mutated[i] = *byte;
            }
        }
        assert_decoders_agree(&mutated);
        if !raw.is_empty() {
            assert_decoders_agree(&raw[..cut.index(raw.len())]);
        }
    }

    /// Whatever the bytes, every strategy combination answers the same, and nothing panics.
    #[test]
    fn every_combination_refuses_the_same_bytes(
        raw in prop::collection::vec(any::<u8>(), 0..48),
        raw2 in valid_request(),
        edit in (any::<prop::sample::Index>(), any::<u8>()),
    ) {
        let mut mutated = raw2.clone();
        if !mutated.is_empty() {
            let i = edit.0.index(mutated.len());
            mutated[i] = edit.1;
        }
        for bytes in [&raw[..], &raw2[..], &mutated[..]] {
            let outcomes: Vec<_> = StrategySet::combinations(Stage::Ingest)
                .into_iter()
                .map(|set| Ingester::new(Plan::default(), set).handle_decoded(bytes).map_err(|e| e.status()))
                .collect();
            prop_assert!(outcomes.windows(2).all(|w| w[0] == w[1]), "{:?}", outcomes);
            // Snappy garbage is refused with 400 (or 413 for a huge header), never a panic.
            let status = Ingester::new(Plan::default(), StrategySet::all()).handle(bytes).map_err(|e| e.status());
            prop_assert!(matches!(status, Ok(_) | Err(400) | Err(413)));
        }
    }
}
