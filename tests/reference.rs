//! The naive references against what real software wrote: the reference
//! exporter must print Ruby's `expected.prom` byte for byte from every
//! client_ruby store fixture, and the reference writer must give the fixture
//! stores' bytes (timestamps aside) from their op logs.

mod common;

use promlab::format::formenc::Dialect;
use promlab::format::registry::Registry;
use promlab::reference;
use promlab::scenarios::op_log::OpLog;
use std::path::Path;

fn assert_reference_export(case: &Path) {
    let registry = Registry::load(&case.join("registry.json")).unwrap();
    let expected = std::fs::read(case.join("expected.prom")).unwrap();
    let got = reference::exposition::export(&case.join("store"), &registry).unwrap();
    assert!(
        got == expected,
        "{}: {}",
        case.display(),
        promlab::reference::first_difference::first_difference(
            &got,
            &expected,
            "reference",
            "ruby"
        )
    );
}

#[test]
fn the_reference_exporter_prints_rubys_exposition() {
    for (case, _) in common::RUBY_CASES {
        assert_reference_export(&common::fixtures().join("ruby-dfs").join(case));
    }
    let (_tmp, large) = common::unpack_large();
    assert_reference_export(&large);
}

#[test]
fn the_reference_writer_gives_rubys_store_bytes() {
    for (case, dialect) in common::RUBY_CASES {
        let dir = common::fixtures().join("ruby-dfs").join(case);
        let registry = Registry::load(&dir.join("registry.json")).unwrap();
        let dialect: Dialect = dialect.parse().unwrap();
        let processes: Vec<(Dialect, OpLog)> = common::op_logs(&dir)
            .iter()
            .map(|p| (dialect, OpLog::load(p).unwrap()))
            .collect();
        let expected = reference::store::read_dir(&dir.join("store")).unwrap();
        let got = reference::store::files(&registry, &processes).unwrap();
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "{case}"
        );
        for (name, bytes) in &expected {
            assert!(
                &got[name] == bytes,
                "{case}/{name}: {}",
                promlab::reference::first_difference::first_difference(
                    &got[name],
                    bytes,
                    "reference",
                    "ruby"
                )
            );
        }
    }
}

/// The reference key decoder on cases whose answers Ruby gave
/// (`ruby -ruri -e 'p URI.decode_www_form(s)'`, `URI.decode_www_form_component`).
#[test]
fn the_reference_key_decoder_reads_keys_as_ruby_does() {
    let decode = |key: &[u8]| {
        reference::exposition::decode_key(key).map(|labels| {
            labels
                .into_iter()
                .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
                .collect::<Vec<_>>()
        })
    };
    let pairs = |p: &[(&str, &str)]| -> Vec<(String, String)> {
        p.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    };
    for (key, ruby) in [
        (&b"a=1&"[..], &[("a", "1")][..]),
        (b"a", &[("a", "")]),
        (b"a=b=c", &[("a", "b=c")]),
        (b"%41+%2b=x", &[("A +", "x")]),
        (b"", &[]),
        (b"a=1&&b=2", &[("a", "1"), ("", ""), ("b", "2")]),
        (b"&", &[("", "")]),
        (b"&a=1", &[("", ""), ("a", "1")]),
        (b"=x", &[("", "x")]),
        (
            b"path=tilde~star*+a%26b%3Dc%25",
            &[("path", "tilde~star* a&b=c%")],
        ),
    ] {
        assert_eq!(
            decode(key).unwrap(),
            pairs(ruby),
            "{:?}",
            String::from_utf8_lossy(key)
        );
    }
    for bad in [&b"a=%zz"[..], b"a=%4", b"%=1", b"a=\xc3\xa9"] {
        assert!(decode(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
    }
}

mod decoders {
    use promlab::format::formenc::{self, KeyError};
    use promlab::reference::exposition as naive;
    use proptest::prelude::*;

    type Owned = Vec<(Vec<u8>, Vec<u8>)>;

    fn owned(labels: Vec<formenc::Label<'_>>) -> Owned {
        labels
            .into_iter()
            .map(|(n, v)| (n.into_owned(), v.into_owned()))
            .collect()
    }

    /// Mostly key-like bytes, so decoding gets past the first byte.
    fn key_bytes() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(
            prop_oneof![
                6 => prop::sample::select(b"ab_=&%+2F7e~*".to_vec()),
                1 => any::<u8>(),
            ],
            0..40,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// The reference decoder (written from the format's rules) against
        /// `formenc`'s decoders, on arbitrary bytes: the same labels where
        /// `formenc` decodes, and where it refuses, a refusal or (for what it
        /// refuses beyond the format: empty and repeated names) labels that
        /// have one.
        #[test]
        fn the_reference_decoder_agrees_with_formenc(raw in key_bytes()) {
            let naive = naive::decode_key(&raw);
            let mut cache = formenc::ComponentCache::default();
            for decoded in [
                formenc::decode_key_reference(&raw).map(owned),
                formenc::decode_key_fast(&raw).map(owned),
                formenc::decode_key_cached(&raw, promlab::shared::seams::Unescape::Fast, &mut cache).map(owned),
            ] {
                match (&decoded, &naive) {
                    (Ok(labels), Ok(want)) => prop_assert_eq!(labels, want),
                    (Err(KeyError::NotAscii { .. } | KeyError::InvalidEscape { .. }), Err(_)) => {}
                    (Err(KeyError::EmptyLabelName { .. }), Ok(want)) => {
                        prop_assert!(want.iter().any(|(n, _)| n.is_empty()), "{:?}", want)
                    }
                    (Err(KeyError::DuplicateLabelName { .. }), Ok(want)) => prop_assert!(
                        want.iter().enumerate().any(|(i, (n, _))| want[..i].iter().any(|(m, _)| m == n)),
                        "{:?}", want
                    ),
                    (got, want) => prop_assert!(false, "formenc {:?}, reference {:?}", got, want),
                }
            }
            // Each component alone, as the fuzz target compares them.
            for piece in raw.split(|&b| b == b'&') {
                let fast = formenc::decode_component(piece).map(|c| c.into_owned());
                let plain = naive::decode_component(piece);
                prop_assert_eq!(fast.is_ok(), plain.is_ok(), "{:?}", piece);
                if let (Ok(a), Ok(b)) = (fast, plain) {
                    prop_assert_eq!(a, b);
                }
            }
        }
    }
}
