//! Proptest generators shared by the store/export property tests
//! (`tests/equivalence_store.rs`) and the end-to-end ones
//! (`experiments/lab/tests/verify.rs`): label values with everything that needs
//! escaping somewhere, and values with every float the formats treat apart.

use proptest::prelude::*;

/// Label values: empty, plain, and concatenations of pieces that need
/// form-encoding (`&`, `=`, `%`, `+`, `~`, `*`), exposition escaping (`"`, `\`,
/// newline), or more than one byte a character.
pub fn label_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9 ]{1,12}",
        prop::collection::vec(
            prop_oneof![
                prop::sample::select(vec![
                    "&", "=", "%", "+", "~", "*", "\"", "\\", "\n", " ", "é日", "%2B", "\\n"
                ])
                .prop_map(String::from),
                "[a-zA-Z0-9_.-]{1,4}",
                any::<char>().prop_map(|c| c.to_string()),
            ],
            1..8
        )
        .prop_map(|parts| parts.concat()),
    ]
}

/// Values: zeros of both signs, infinities, NaN, the smallest subnormal and
/// normal, huge and tiny magnitudes, decimal fractions, and any bit pattern.
pub fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        1 => Just(0.0),
        1 => Just(-0.0),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => Just(f64::NAN),
        1 => Just(5e-324),
        1 => Just(2.2250738585072014e-308),
        1 => Just(1e20),
        1 => Just(1e300),
        1 => Just(1e-300),
        1 => Just(0.1),
        4 => (-7.0f64..7.0).prop_map(|e| 10f64.powf(e)),
        2 => -1e6f64..1e6,
        1 => any::<f64>(),
    ]
}
