//! Byte-level pieces of the Prometheus text format (0.0.4) as client_ruby
//! prints it: escaping of HELP text and label values, and label blocks.
//!
//! Ruby escapes HELP with `/[\n\\]/` and label values with `/[\n\\"]/`,
//! replacing `\n` → `\n`, `\` → `\\`, `"` → `\"`. Nothing else is touched (no
//! UTF-8 validation, no other control characters).

use std::borrow::Cow;

/// What to escape: HELP text leaves `"` alone, label values do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Escape {
    Help,
    LabelValue,
}

impl Escape {
    #[inline]
    fn needs(self, b: u8) -> bool {
        match self {
            Escape::Help => b == b'\n' || b == b'\\',
            Escape::LabelValue => b == b'\n' || b == b'\\' || b == b'"',
        }
    }
}

/// Whether `s` has any byte that `mode` escapes (a SIMD scan; most values have none).
#[inline]
pub fn needs_escaping(s: &[u8], mode: Escape) -> bool {
    match mode {
        Escape::Help => memchr::memchr2(b'\n', b'\\', s).is_some(),
        Escape::LabelValue => memchr::memchr3(b'\n', b'\\', b'"', s).is_some(),
    }
}

/// `s` escaped, borrowed when nothing needs escaping.
pub fn escaped(s: &[u8], mode: Escape) -> Cow<'_, [u8]> {
    if !needs_escaping(s, mode) {
        return Cow::Borrowed(s);
    }
    let mut out = Vec::with_capacity(s.len() + 8);
    write_escaped_bytewise(&mut out, s, mode);
    Cow::Owned(out)
}

/// Appends `s` escaped: runs without special bytes are found with a SIMD scan
/// and copied whole (one copy when nothing needs escaping).
#[inline]
pub fn write_escaped(out: &mut Vec<u8>, s: &[u8], mode: Escape) {
    let mut rest = s;
    loop {
        let found = match mode {
            Escape::Help => memchr::memchr2(b'\n', b'\\', rest),
            Escape::LabelValue => memchr::memchr3(b'\n', b'\\', b'"', rest),
        };
        let Some(i) = found else {
            out.extend_from_slice(rest);
            return;
        };
        out.extend_from_slice(&rest[..i]);
        out.push(b'\\');
        out.push(if rest[i] == b'\n' { b'n' } else { rest[i] });
        rest = &rest[i + 1..];
    }
}

/// Appends `s` escaped, looking at every byte (the per-scrape shape of the baseline).
pub fn write_escaped_bytewise(out: &mut Vec<u8>, s: &[u8], mode: Escape) {
    for &b in s {
        if mode.needs(b) {
            out.push(b'\\');
            out.push(if b == b'\n' { b'n' } else { b });
        } else {
            out.push(b);
        }
    }
}

/// Appends `{k1="v1",k2="v2"}` (nothing for an empty set), values escaped.
/// `a="x",b="y"`: label pairs with escaped values, without braces (what
/// `prerender` keeps per label set).
pub fn write_label_pairs<'a, I>(out: &mut Vec<u8>, labels: I)
where
    I: IntoIterator<Item = (&'a [u8], &'a [u8])>,
{
    for (i, (name, value)) in labels.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b"=\"");
        write_escaped(out, value, Escape::LabelValue);
        out.push(b'"');
    }
}

pub fn write_label_block<'a, I>(out: &mut Vec<u8>, labels: I)
where
    I: IntoIterator<Item = (&'a [u8], &'a [u8])>,
{
    let mut first = true;
    for (name, value) in labels {
        out.push(if first { b'{' } else { b',' });
        first = false;
        out.extend_from_slice(name);
        out.extend_from_slice(b"=\"");
        write_escaped(out, value, Escape::LabelValue);
        out.push(b'"');
    }
    if !first {
        out.push(b'}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_ruby() {
        for mode in [Escape::Help, Escape::LabelValue] {
            for s in [&b""[..], b"\"", b"a\\\n\"b\"\"", b"\n\n", b"plain text"] {
                let mut fast = Vec::new();
                write_escaped(&mut fast, s, mode);
                let mut reference = Vec::new();
                write_escaped_bytewise(&mut reference, s, mode);
                assert_eq!(fast, reference);
            }
        }
        assert_eq!(&*escaped(b"plain", Escape::LabelValue), b"plain");
        assert!(matches!(
            escaped(b"plain", Escape::LabelValue),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            &*escaped(b"a\"b\\c\nd", Escape::LabelValue),
            br#"a\"b\\c\nd"#
        );
        assert_eq!(&*escaped(b"a\"b\\c\nd", Escape::Help), br#"a"b\\c\nd"#);
        let mut out = Vec::new();
        write_label_block(
            &mut out,
            [(&b"a"[..], &b"x\"y"[..]), (&b"le"[..], &b"+Inf"[..])],
        );
        assert_eq!(out, br#"{a="x\"y",le="+Inf"}"#);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// The SIMD escaper against the byte-by-byte reference.
            #[test]
            fn scan_escaper_equals_bytewise(s in proptest::collection::vec(
                prop_oneof![Just(b'\n'), Just(b'\\'), Just(b'"'), any::<u8>()], 0..80), help in any::<bool>()) {
                let mode = if help { Escape::Help } else { Escape::LabelValue };
                let mut fast = Vec::new();
                write_escaped(&mut fast, &s, mode);
                let mut reference = Vec::new();
                write_escaped_bytewise(&mut reference, &s, mode);
                prop_assert_eq!(&fast, &reference);
                prop_assert_eq!(&*escaped(&s, mode), &reference[..]);
            }
        }
    }
}
