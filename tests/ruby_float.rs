//! Ruby's `Float#to_s` oracle: every line of `to_s.tsv` (IEEE-754 bits in hex,
//! then the text Ruby 3.1 printed) must match, for the fast path and the reference.

use promlab::format::rubyfloat;

#[test]
fn every_oracle_line_matches() {
    let oracle = include_str!("fixtures/ruby-float/to_s.tsv");
    let mut checked = 0;
    for (n, line) in oracle.lines().enumerate() {
        let (bits, expected) = line
            .split_once('\t')
            .unwrap_or_else(|| panic!("line {} has no tab", n + 1));
        let v = f64::from_bits(u64::from_str_radix(bits, 16).expect("hex bits"));
        let mut fast = Vec::new();
        rubyfloat::write(&mut fast, v);
        let mut reference = Vec::new();
        rubyfloat::write_reference(&mut reference, v);
        assert_eq!(
            String::from_utf8_lossy(&fast),
            expected,
            "fast path, line {} ({bits})",
            n + 1
        );
        assert_eq!(
            String::from_utf8_lossy(&reference),
            expected,
            "reference, line {} ({bits})",
            n + 1
        );
        checked += 1;
    }
    assert_eq!(checked, 10_119);
}

/// Every power of two, both signs, and its neighbours: at a power of two the
/// rounding interval is asymmetric (half as wide below), the one place where
/// the shortest round-trip digits and the correctly rounded ones can part.
#[test]
fn powers_of_two_and_neighbours_equal_reference() {
    let mut fast = Vec::new();
    let mut reference = Vec::new();
    for exponent in 0..2047u64 {
        let power = exponent << 52;
        for bits in [power.saturating_sub(1), power, power + 1] {
            for v in [f64::from_bits(bits), -f64::from_bits(bits)] {
                fast.clear();
                reference.clear();
                rubyfloat::write(&mut fast, v);
                rubyfloat::write_reference(&mut reference, v);
                assert_eq!(
                    String::from_utf8_lossy(&fast),
                    String::from_utf8_lossy(&reference),
                    "{v:e} (bits {bits:#x})"
                );
            }
        }
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// `v` by the fast path and by the reference.
    fn fast_and_reference(v: f64) -> (Vec<u8>, Vec<u8>) {
        let mut fast = Vec::new();
        rubyfloat::write(&mut fast, v);
        let mut reference = Vec::new();
        rubyfloat::write_reference(&mut reference, v);
        (fast, reference)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]
        /// The fast path (integer shortcut + ryu) equals the reference on any bits.
        #[test]
        fn fast_path_equals_reference(bits in any::<u64>()) {
            let v = f64::from_bits(bits);
            let (fast, reference) = fast_and_reference(v);
            prop_assert_eq!(fast, reference);
        }

        /// Quarters, halves and eighths of 16-digit integers: exact values
        /// halfway between two 17-digit decimals, where ryu and Ruby part.
        #[test]
        fn ties_equal_reference(m in (1u64 << 49)..(1u64 << 53), k in 1..=6i32, negative in any::<bool>()) {
            let v = m as f64 / f64::powi(2.0, k) * if negative { -1.0 } else { 1.0 };
            let (fast, reference) = fast_and_reference(v);
            prop_assert_eq!(fast, reference);
        }

        /// Decimal fractions across Ruby's fixed-notation range and both its
        /// edges (1e-5 .. 1e17): the values a metric holds, where the fast
        /// path copies ryu's text when its layout is Ruby's.
        #[test]
        fn fixed_range_equals_reference(m in -(1i64 << 53)..(1i64 << 53), scale in -22..=1i32) {
            let v = m as f64 * f64::powi(10.0, scale);
            let (fast, reference) = fast_and_reference(v);
            prop_assert_eq!(fast, reference);
        }

        /// A sample line's value: integers (written in place) and any bits.
        #[test]
        fn write_line_is_write_and_newline(i in -(1i64 << 54)..(1i64 << 54), bits in any::<u64>()) {
            for v in [i as f64, f64::from_bits(bits), -0.0] {
                let mut line = Vec::new();
                rubyfloat::write_line(&mut line, v);
                let mut expected = Vec::new();
                rubyfloat::write_reference(&mut expected, v);
                expected.push(b'\n');
                prop_assert_eq!(line, expected);
            }
        }

        #[test]
        fn integers_equal_reference(i in -(1i64 << 54)..(1i64 << 54)) {
            let v = i as f64;
            let (fast, reference) = fast_and_reference(v);
            prop_assert_eq!(fast, reference);
        }
    }
}
