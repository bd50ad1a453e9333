//! Ruby's `Float#to_s`, byte for byte.
//!
//! Ruby prints the shortest digit string that round-trips (David Gay's dtoa,
//! mode 0), then lays it out by the decimal exponent `decpt` (the value is
//! `0.DIGITS × 10^decpt`):
//! - `0 < decpt <= 15`, or `decpt == 16` with a fractional digit: fixed
//!   notation, always with a fraction (`1.0`, `123.45`, `2195515681897517.5`);
//! - `-4 < decpt <= 0`: fixed notation with leading zeros (`0.0001`);
//! - otherwise: `D.DDDe±XX`, at least two exponent digits (`1.0e+20`, `1.0e-05`).
//!
//! [`write_reference`] gets the digits from Rust's `{:e}` formatting (also
//! shortest round-trip, and like dtoa it breaks an exact tie between two
//! shortest candidates to even); [`write`] is the fast path used on hot paths:
//! an integer shortcut, then `ryu`. Ryu breaks such ties upward, so its output
//! is used as is when it has at most 15 significant digits (a double's rounding
//! interval is narrower than the gap between two 15-digit decimals, so the
//! shortest candidate is then unique and no tie can arise), or when an exact
//! check on `v`'s bits ([`needs_exact_rounding`]) shows `v` is not halfway between two
//! 16- or 17-digit decimals; only the rare tie is formatted the slow way. `tests/ruby_float.rs` checks both against the
//! 10,119-line oracle Ruby printed, and a property test checks them against each
//! other.

/// Largest `decpt` printed in fixed notation when the value has a fraction (`DBL_DIG + 1`).
const MAX_FIXED_DECPT: i32 = 16;
/// Largest `decpt` printed in fixed notation when the value is integral (`DBL_DIG`).
const MAX_FIXED_DECPT_INTEGRAL: i32 = 15;
/// Integral values below this print as `<integer>.0` (decpt <= 15).
const INTEGER_FAST_PATH_LIMIT: f64 = 1e15;
/// Most significant digits of a ryu output that cannot be a tie (see above).
const MAX_UNIQUE_DIGITS: usize = 15;
/// Smallest `decpt` printed in fixed notation.
const MIN_FIXED_DECPT: i32 = -3;
/// The least value printed in fixed notation (decpt -3).
const MIN_FIXED_FRACTION: f64 = 1e-4;
/// 2^52: every double from here up is an integer.
const MIN_INTEGRAL: f64 = 4_503_599_627_370_496.0;

/// The longest a value and its newline print (`-2.2250738585072014e-308` and `\n`:
/// 25 bytes), with a byte to spare; a hint for reserving, not a bound relied on.
pub const MAX_LINE_END: usize = 26;

/// Appends Ruby's `Float#to_s` of `v` and a newline to `out`: a sample
/// line's end. An integral value's line (most of a store's: counts, buckets)
/// takes two appends. Inlined into the caller's loop: with a call per line a
/// prerendered scrape of 63k series took 1.17x the render floor's time,
/// inlined 1.14x (alternated three times).
#[inline(always)]
pub fn write_line(out: &mut Vec<u8>, v: f64) {
    match small_integer(v) {
        // -0.0 is integral too, but prints its sign: `write_other` has it.
        Some(n) if v.to_bits() != (-0.0f64).to_bits() => write_integral_line(out, n),
        _ => {
            write_other(out, v);
            out.push(b'\n');
        }
    }
}

/// `v` as an integer, if it is one below 1e15: Ruby prints those as
/// `<integer>.0`. (A cast round trip tests integrality without calling
/// libm's `trunc`.)
#[inline]
fn small_integer(v: f64) -> Option<i64> {
    (v.abs() < INTEGER_FAST_PATH_LIMIT && (v as i64) as f64 == v).then_some(v as i64)
}

/// `<n>.0\n`: itoa's digits, then the fraction and the newline (itoa's
/// digits are faster than laying them out in place from a digit count).
#[inline]
fn write_integral_line(out: &mut Vec<u8>, n: i64) {
    let mut buf = itoa::Buffer::new();
    out.extend_from_slice(buf.format(n).as_bytes());
    out.extend_from_slice(b".0\n");
}

/// Appends Ruby's `Float#to_s` of `v` to `out` (fast path). An integral
/// value (most of a store's: counts, buckets) is written in line, so the
/// common case costs no call; any other by a call.
#[inline(always)]
pub fn write(out: &mut Vec<u8>, v: f64) {
    match small_integer(v) {
        Some(n) if v.to_bits() != (-0.0f64).to_bits() => {
            let mut buf = itoa::Buffer::new();
            out.extend_from_slice(buf.format(n).as_bytes());
            out.extend_from_slice(b".0");
        }
        _ => write_other(out, v),
    }
}

/// [`write`] of a value that is not a small integer (or is -0.0).
#[inline(never)]
fn write_other(out: &mut Vec<u8>, v: f64) {
    if v.to_bits() == (-0.0f64).to_bits() {
        out.extend_from_slice(b"-0.0");
        return;
    }
    if !v.is_finite() {
        write_non_finite(out, v);
        return;
    }
    let mut buf = ryu::Buffer::new();
    let text = buf.format_finite(v);
    // A value with a fraction, of at least 1e-4: ryu and Ruby both print it
    // in fixed notation (decpt -3..=16), so only a tie could part their
    // digits, and if none can, ryu's text is Ruby's without a look at it
    // (most values a store prints that are not integers: sums, averages).
    if (MIN_FIXED_FRACTION..MIN_INTEGRAL).contains(&v.abs())
        && (v as i64) as f64 != v
        && !needs_exact_rounding(v, MAX_UNIQUE_DIGITS + 1..=17)
    {
        out.extend_from_slice(text.as_bytes());
        return;
    }
    if let Some(digits) = ryu_fixed_digits(text.as_bytes()) {
        // Ryu laid it out as Ruby does; only a tie could change the digits.
        if digits <= MAX_UNIQUE_DIGITS || !needs_exact_rounding(v, digits..=digits) {
            out.extend_from_slice(text.as_bytes());
            return;
        }
    }
    let (negative, digits, decpt) = split_decimal(text);
    if digits.len > MAX_UNIQUE_DIGITS && needs_exact_rounding(v, digits.len..=digits.len) {
        // Ryu says the shortest has 16 or 17 digits, and `v` lies exactly
        // halfway between two such decimals: take the correctly rounded
        // (half-to-even) 16-digit decimal if it parses back to `v`, else the
        // 17-digit one.
        let mut text = StackText::new();
        if !text.format_round_trips(v, 15) {
            text.format_round_trips(v, 16);
        }
        let (negative, digits, decpt) = split_decimal(text.as_str());
        layout(out, negative, &digits, decpt);
        return;
    }
    layout(out, negative, &digits, decpt);
}

/// The significant digits of ryu's output of a non-integral value (or one of
/// at least 1e15: [`write`] prints smaller integers itself) when ryu laid it
/// out as Ruby does, else `None`. Ryu writes fixed notation for
/// `-5 < decpt <= 16` and Ruby for `-4 < decpt <= 16` (fraction) or `<= 15`
/// (integral); they part on `0.0000…` (decpt -4: Ruby `1.0e-05`), on an
/// integral value's `…0.0` (decpt 16: Ruby `1.0e+15`), and on every exponent
/// form (`1e30`: Ruby `1.0e+30`).
#[inline]
fn ryu_fixed_digits(text: &[u8]) -> Option<usize> {
    let unsigned = text.strip_prefix(b"-").unwrap_or(text);
    // `0.…` is fixed notation (an exponent form starts with a digit other
    // than 0), so most fractions need no scan for an `e`.
    if let Some(fraction) = unsigned.strip_prefix(b"0.") {
        let zeros = fraction.iter().take_while(|&&d| d == b'0').count();
        // decpt = -zeros; Ruby's fixed notation stops at decpt -3.
        return (zeros <= (-MIN_FIXED_DECPT) as usize).then_some(fraction.len() - zeros);
    }
    if unsigned.ends_with(b".0") || unsigned.contains(&b'e') {
        return None;
    }
    // `D….D…`: every byte but the point is a significant digit (ryu prints no
    // trailing zero in a fraction).
    Some(unsigned.len() - 1)
}

/// Whether ryu's shortest output of `v`, were it of a number of digits in
/// `digits` (16 or 17), might not be the correctly rounded decimal Ruby
/// prints. Two cases:
/// - `v` is a power of two: its rounding interval is half as wide below, so
///   ryu may find a shortest candidate on the wide side while the correctly
///   rounded one, on the narrow side, does not round-trip (Ruby then prints
///   17 digits: `7.1202363472230444e-307`, where ryu has 16);
/// - `v`'s exact decimal value has `n + 1` significant digits ending in 5,
///   for an `n` in `digits`: it lies halfway between two decimals of `n`
///   digits, where ryu (ties upward) and dtoa (ties to even) part.
///
/// `v = m × 2^e` with `m` odd. For `e >= 0`, `v` is an even integer or an
/// integer below 2^53 (at most 16 digits): no tie at 16 or 17 digits. For
/// `e < 0`, `v = m × 5^-e / 10^-e`, whose significant digits are those of
/// `m × 5^-e`; past `-e = 27` that has more than 18 digits, so no tie.
fn needs_exact_rounding(v: f64, digits: std::ops::RangeInclusive<usize>) -> bool {
    let bits = v.to_bits();
    let exponent_bits = ((bits >> 52) & 0x7ff) as i32;
    let mut m = bits & ((1 << 52) - 1);
    let mut e = if exponent_bits == 0 {
        -1074
    } else {
        m |= 1 << 52;
        exponent_bits - 1075
    };
    if m == 1 << 52 && exponent_bits > 1 {
        return true;
    }
    if m == 0 {
        return false;
    }
    let zeros = m.trailing_zeros();
    m >>= zeros;
    e += zeros as i32;
    if !(-27..0).contains(&e) {
        return false;
    }
    let exact = m as u128 * 5u128.pow((-e) as u32);
    exact % 10 == 5 && digits.contains(&(exact.ilog10() as usize))
}

/// A stack buffer for `{:.Ne}` formatting, without allocating.
struct StackText {
    buf: [u8; 40],
    len: usize,
}

impl StackText {
    fn new() -> Self {
        StackText {
            buf: [0; 40],
            len: 0,
        }
    }

    /// Formats `v` correctly rounded (half to even) to `precision + 1`
    /// significant digits; returns whether that parses back to `v`.
    fn format_round_trips(&mut self, v: f64, precision: usize) -> bool {
        use std::io::Write;
        let mut cursor = std::io::Cursor::new(&mut self.buf[..]);
        write!(cursor, "{:.*e}", precision, v).expect("40 bytes hold any {:.16e}");
        self.len = cursor.position() as usize;
        self.as_str().parse::<f64>() == Ok(v)
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).expect("ASCII")
    }
}

/// Appends Ruby's `Float#to_s` of `v`, the obviously-correct way: the fewest
/// significant digits whose correctly rounded (half-to-even) decimal parses
/// back to `v`, as dtoa's mode 0 finds them.
pub fn write_reference(out: &mut Vec<u8>, v: f64) {
    if !v.is_finite() {
        write_non_finite(out, v);
        return;
    }
    let text = (0..17)
        .map(|precision| format!("{:.*e}", precision, v))
        .find(|text| text.parse::<f64>() == Ok(v))
        .expect("17 significant digits always round-trip");
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.as_str()),
    };
    let (mantissa, exponent) = rest.split_once('e').expect("{:e} always has an exponent");
    let mut digits: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).collect();
    while digits.len() > 1 && digits.last() == Some(&b'0') {
        digits.pop();
    }
    let exponent: i32 = exponent.parse().expect("{:e} exponent is an integer");
    // Zero prints as `0e0`: one digit, decpt 1.
    layout(out, negative, &digits, exponent + 1);
}

/// Ruby's `Float#to_s` as a `String` (convenience for tests and tools).
pub fn to_s(v: f64) -> String {
    let mut out = Vec::with_capacity(24);
    write(&mut out, v);
    String::from_utf8(out).expect("float text is ASCII")
}

fn write_non_finite(out: &mut Vec<u8>, v: f64) {
    out.extend_from_slice(if v.is_nan() {
        b"NaN".as_slice()
    } else if v > 0.0 {
        b"Infinity".as_slice()
    } else {
        b"-Infinity".as_slice()
    });
}

/// Splits ryu's or `{:e}`'s output (`1.5`, `1e20`, `1.5e-7`, `0.001`, `-12.0`,
/// `1.25e15`) into sign,
/// significant digits (no leading/trailing zeros, at least one digit) and `decpt`.
fn split_decimal(text: &str) -> (bool, DigitBuf, i32) {
    let bytes = text.as_bytes();
    let (negative, bytes) = match bytes.first() {
        Some(b'-') => (true, &bytes[1..]),
        _ => (false, bytes),
    };
    let (mantissa, exponent) = match bytes.iter().position(|&b| b == b'e') {
        Some(i) => (&bytes[..i], parse_exponent(&bytes[i + 1..])),
        None => (bytes, 0),
    };
    let mut digits = DigitBuf::new();
    // Position of the decimal point within the mantissa's digits.
    let mut point = None;
    for &b in mantissa {
        if b == b'.' {
            point = Some(digits.len);
        } else {
            digits.push(b);
        }
    }
    let int_digits = point.unwrap_or(digits.len) as i32;
    // Strip leading zeros (each moves the point left) and trailing zeros.
    let leading = digits.as_slice().iter().take_while(|&&d| d == b'0').count();
    let decpt = int_digits - leading as i32 + exponent;
    digits.drop_front(leading);
    while digits.len > 1 && digits.as_slice()[digits.len - 1] == b'0' {
        digits.len -= 1;
    }
    if digits.len == 0 {
        digits.push(b'0');
        return (negative, digits, 1);
    }
    (negative, digits, decpt)
}

fn parse_exponent(bytes: &[u8]) -> i32 {
    let (negative, bytes) = match bytes.first() {
        Some(b'-') => (true, &bytes[1..]),
        _ => (false, bytes),
    };
    let magnitude = bytes
        .iter()
        .fold(0i32, |acc, &b| acc * 10 + i32::from(b - b'0'));
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

/// A small stack buffer of decimal digits (a double never needs more than 17).
struct DigitBuf {
    buf: [u8; 32],
    len: usize,
}

impl DigitBuf {
    fn new() -> Self {
        DigitBuf {
            buf: [0; 32],
            len: 0,
        }
    }
    fn push(&mut self, d: u8) {
        self.buf[self.len] = d;
        self.len += 1;
    }
    fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
    fn drop_front(&mut self, n: usize) {
        self.buf.copy_within(n..self.len, 0);
        self.len -= n;
    }
}

impl std::ops::Deref for DigitBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

/// Lays out significant `digits` with decimal exponent `decpt` the way Ruby does.
fn layout(out: &mut Vec<u8>, negative: bool, digits: &[u8], decpt: i32) {
    if negative {
        out.push(b'-');
    }
    let n = digits.len() as i32;
    let fixed_limit = if n > decpt {
        MAX_FIXED_DECPT
    } else {
        MAX_FIXED_DECPT_INTEGRAL
    };
    if decpt > 0 && decpt <= fixed_limit {
        if n <= decpt {
            out.extend_from_slice(digits);
            out.resize(out.len() + (decpt - n) as usize, b'0');
            out.extend_from_slice(b".0");
        } else {
            out.extend_from_slice(&digits[..decpt as usize]);
            out.push(b'.');
            out.extend_from_slice(&digits[decpt as usize..]);
        }
    } else if (MIN_FIXED_DECPT..=0).contains(&decpt) {
        out.extend_from_slice(b"0.");
        out.resize(out.len() + (-decpt) as usize, b'0');
        out.extend_from_slice(digits);
    } else {
        out.push(digits[0]);
        out.push(b'.');
        if n > 1 {
            out.extend_from_slice(&digits[1..]);
        } else {
            out.push(b'0');
        }
        let e = decpt - 1;
        out.push(b'e');
        out.push(if e < 0 { b'-' } else { b'+' });
        let magnitude = e.unsigned_abs();
        if magnitude < 10 {
            out.push(b'0');
        }
        let mut buf = itoa::Buffer::new();
        out.extend_from_slice(buf.format(magnitude).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(v: f64) -> String {
        let mut reference = Vec::new();
        write_reference(&mut reference, v);
        let fast = to_s(v);
        assert_eq!(
            fast.as_bytes(),
            reference.as_slice(),
            "fast vs reference for {v:?}"
        );
        fast
    }

    #[test]
    fn known_values() {
        assert_eq!(both(0.0), "0.0");
        assert_eq!(both(-0.0), "-0.0");
        assert_eq!(both(1.0), "1.0");
        assert_eq!(both(1e20), "1.0e+20");
        assert_eq!(both(1e16), "1.0e+16");
        assert_eq!(both(1e15), "1.0e+15");
        assert_eq!(both(1e14), "100000000000000.0");
        assert_eq!(both(2195515681897517.5), "2195515681897517.5");
        assert_eq!(
            both(f64::from_bits(0xc310_3361_b868_0e31)),
            "-1140023606510476.2"
        );
        assert_eq!(both(1e-5), "1.0e-05");
        assert_eq!(both(1e-4), "0.0001");
        assert_eq!(both(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(both(6.800000000000001), "6.800000000000001");
        assert_eq!(both(1152921504606846976.0), "1.152921504606847e+18");
        assert_eq!(both(f64::INFINITY), "Infinity");
        assert_eq!(both(f64::NEG_INFINITY), "-Infinity");
        assert_eq!(both(f64::NAN), "NaN");
        assert_eq!(both(5e-324), "5.0e-324");
        assert_eq!(both(1.7976931348623157e308), "1.7976931348623157e+308");
        assert_eq!(both(123456.789), "123456.789");
        assert_eq!(both(-2.5e-7), "-2.5e-07");
    }
}
