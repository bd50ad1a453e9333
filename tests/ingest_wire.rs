//! Decoding remote-write bodies: the real Prometheus fixtures, the borrowed
//! walker against prost on valid, mutated and random bytes, and the offline
//! `promlab ingest` command.

use promlab::ingest::pipeline::Ingester;
use promlab::ingest::plan::Plan;
use promlab::ingest::wire::{self, Label, Sample, TimeSeries, WireError, WriteRequest};
use promlab::strategy::{Stage, StrategySet};
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

#[test]
fn ingest_command_prints_identical_json_for_every_combination() {
    let files: Vec<PathBuf> = std::fs::read_dir(fixture_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.toml");
    std::fs::write(
        &plan,
        "lateness_secs = 0\n[[aggregation]]\nid = \"gc\"\nmetric = \"go_gc_duration_seconds\"\ngroup_by = [\"quantile\"]\nwindow_secs = 5\n",
    )
    .unwrap();
    let mut outputs = Vec::new();
    for set in [
        "none",
        "borrowed-decode,bulk-sketch",
        "series-cache,batch-routing",
        "all",
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_promlab"))
            .args(["ingest", "--strategies", set, "--plan"])
            .arg(&plan)
            .args(&files)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        outputs.push(out.stdout);
    }
    assert!(outputs.windows(2).all(|w| w[0] == w[1]));
    let json: serde_json::Value = serde_json::from_slice(&outputs[0]).unwrap();
    let gc = &json[0];
    assert_eq!(gc["aggregation"], "gc");
    assert!(gc["window_start_ms"].as_i64().unwrap() > 1_700_000_000_000);
    let groups = gc["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 5, "{gc}");
    assert_eq!(groups[0]["labels"]["quantile"], "0");
    assert!(groups
        .iter()
        .all(|g| g["count"].as_u64().unwrap() > 0 && g["quantiles"]["0.99"].is_number()));
}

#[test]
fn feeder_out_files_replay_offline() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_promlab"))
        .args([
            "feed",
            "--groups",
            "3",
            "--series-per-group",
            "4",
            "--samples-per-sec",
            "2",
            "--duration-secs",
            "70",
        ])
        .args(["--start-ms", "0", "--batch-rows", "5", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 70 * 5); // 24 rows per tick in requests of 5
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_promlab"))
        .arg("ingest")
        .args(&files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Ticks 0..70 s, lateness 5 s: the window [0, 60 s) closed, with 60 ticks × 2 samples × 4 series per group.
    assert_eq!(json[0]["window_start_ms"], 0);
    let groups = json[0]["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 3);
    assert_eq!(groups[1]["labels"]["label_0"], "g1");
    assert!(groups.iter().all(|g| g["count"] == 480));
}
