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

/// Whether `s` has any byte that `mode` escapes (a fast scan; most values have none).
#[inline]
pub fn needs_escaping(s: &[u8], mode: Escape) -> bool {
    s.iter().any(|&b| mode.needs(b))
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

/// Appends `s` escaped: a scan first, then one copy when nothing needs escaping.
#[inline]
pub fn write_escaped(out: &mut Vec<u8>, s: &[u8], mode: Escape) {
    if needs_escaping(s, mode) {
        write_escaped_bytewise(out, s, mode);
    } else {
        out.extend_from_slice(s);
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
        assert_eq!(&*escaped(b"plain", Escape::LabelValue), b"plain");
        assert!(matches!(escaped(b"plain", Escape::LabelValue), Cow::Borrowed(_)));
        assert_eq!(&*escaped(b"a\"b\\c\nd", Escape::LabelValue), br#"a\"b\\c\nd"#);
        assert_eq!(&*escaped(b"a\"b\\c\nd", Escape::Help), br#"a"b\\c\nd"#);
        let mut out = Vec::new();
        write_label_block(&mut out, [(&b"a"[..], &b"x\"y"[..]), (&b"le"[..], &b"+Inf"[..])]);
        assert_eq!(out, br#"{a="x\"y",le="+Inf"}"#);
    }
}
