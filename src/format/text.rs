//! The Prometheus text format (0.0.4) as client_ruby prints it: escaping, and
//! the one exposition encoder every writer of the format uses (the store
//! renderer [`crate::render`], the live registries [`crate::render::live`],
//! and the lab servers' own metrics: the receiver's `/metrics`, the store
//! sidecar's `/metrics/promlab`).
//!
//! The encoder is a chain of small types writing bytes into a `Vec<u8>`, in
//! the style of prometheus/client_rust: [`FamilyEncoder`] writes `# TYPE` and
//! `# HELP` and hands out one [`SampleEncoder`] per sample, which writes the
//! name, then label pairs (a label encoder opens, separates and closes the
//! block), then the value through a [`ValueEncoder`]. A
//! sample's `name{labels} ` prefix can also be encoded once and copied on
//! every scrape ([`SampleEncoder::end_prefix`], [`FamilyEncoder::prerendered`]).
//!
//! Ruby escapes HELP with `/[\n\\]/` and label values with `/[\n\\"]/`,
//! replacing `\n` → `\n`, `\` → `\\`, `"` → `\"`. Nothing else is touched (no
//! UTF-8 validation, no other control characters).

use crate::format::rubyfloat;

/// What to escape: HELP text leaves `"` alone, label values do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Escape {
    Help,
    LabelValue,
}

/// Values shorter than this are scanned byte by byte ([`Escape::find`]).
const SHORT_SCAN: usize = 16;

impl Escape {
    #[inline]
    fn needs(self, b: u8) -> bool {
        match self {
            Escape::Help => b == b'\n' || b == b'\\',
            Escape::LabelValue => b == b'\n' || b == b'\\' || b == b'"',
        }
    }

    /// The first byte of `s` this mode escapes: the "needs escaping?" scan
    /// (SIMD; most values have none). A short value is looked at byte by
    /// byte: below a vector's width `memchr` sets up its search for nothing.
    #[inline]
    fn find(self, s: &[u8]) -> Option<usize> {
        if s.len() < SHORT_SCAN {
            return s.iter().position(|&b| self.needs(b));
        }
        match self {
            Escape::Help => memchr::memchr2(b'\n', b'\\', s),
            Escape::LabelValue => memchr::memchr3(b'\n', b'\\', b'"', s),
        }
    }
}

/// Appends `s` escaped. As tikv/rust-prometheus's `escape_string`, one scan
/// first asks "needs escaping?": most values do not, and are copied whole,
/// straight from the input. Otherwise runs between special bytes are found
/// with the same scan and copied whole.
#[inline]
pub fn write_escaped(out: &mut Vec<u8>, s: &[u8], mode: Escape) {
    let Some(mut i) = mode.find(s) else {
        out.extend_from_slice(s);
        return;
    };
    let mut rest = s;
    loop {
        out.extend_from_slice(&rest[..i]);
        out.push(b'\\');
        out.push(if rest[i] == b'\n' { b'n' } else { rest[i] });
        rest = &rest[i + 1..];
        match mode.find(rest) {
            Some(next) => i = next,
            None => {
                out.extend_from_slice(rest);
                return;
            }
        }
    }
}

/// Appends `s` escaped, looking at every byte: the reference for
/// [`write_escaped`], and the per-scrape shape of the live registries' baseline.
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

/// `a="x",b="y"`: label pairs with escaped values, without braces (what a
/// long-lived store exporter keeps per label set with `prerender`).
pub fn write_label_pairs<'a, I>(out: &mut Vec<u8>, labels: I)
where
    I: IntoIterator<Item = (&'a [u8], &'a [u8])>,
{
    let mut first = true;
    for (name, value) in labels {
        if !first {
            out.push(b',');
        }
        first = false;
        write_pair(out, name, value);
    }
}

/// `name="value"`, the value escaped.
#[inline]
fn write_pair(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b"=\"");
    write_escaped(out, value, Escape::LabelValue);
    out.push(b'"');
}

/// A family's `# TYPE name kind` and `# HELP name help` lines (help escaped).
pub fn write_family_header(out: &mut Vec<u8>, name: &[u8], kind: &str, help: &[u8]) {
    out.extend_from_slice(b"# TYPE ");
    out.extend_from_slice(name);
    out.push(b' ');
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\n# HELP ");
    out.extend_from_slice(name);
    out.push(b' ');
    write_escaped(out, help, Escape::Help);
    out.push(b'\n');
}

/// Writes one metric family: `# TYPE`, `# HELP`, then its samples.
pub struct FamilyEncoder<'o> {
    out: &'o mut Vec<u8>,
    name: &'o [u8],
}

impl<'o> FamilyEncoder<'o> {
    /// Writes the family's `# TYPE name kind` and `# HELP name help` lines.
    #[inline]
    pub fn new(out: &'o mut Vec<u8>, name: &'o [u8], kind: &str, help: &[u8]) -> Self {
        write_family_header(out, name, kind, help);
        FamilyEncoder { out, name }
    }

    /// Copies the family's header lines, written before by [`write_family_header`].
    #[inline]
    pub fn with_header(out: &'o mut Vec<u8>, name: &'o [u8], header: &[u8]) -> Self {
        out.extend_from_slice(header);
        FamilyEncoder { out, name }
    }

    /// A sample of this family, named `<name><suffix>` (`_bucket`, `_sum`, …).
    #[inline]
    pub fn sample(&mut self, suffix: &[u8]) -> SampleEncoder<'_> {
        SampleEncoder::new(self.out, self.name, suffix)
    }

    /// Room for `additional` more bytes, so the lines after it write
    /// without growing the buffer.
    #[inline]
    pub fn reserve(&mut self, additional: usize) {
        self.out.reserve(additional);
    }

    /// A sample whose `name{labels} ` prefix was encoded before (by
    /// [`SampleEncoder::end_prefix`]): the prefix is copied, the value follows.
    #[inline]
    pub fn prerendered(&mut self, prefix: &[u8]) -> ValueEncoder<'_> {
        self.out.extend_from_slice(prefix);
        ValueEncoder { out: self.out }
    }
}

impl FamilyEncoder<'_> {
    /// A whole sample line encoded elsewhere (by a [`SampleEncoder`] of its own buffer).
    #[inline]
    pub fn line(&mut self, line: &[u8]) {
        self.out.extend_from_slice(line);
    }
}

/// Writes one sample line: `name{k="v",…} value\n`.
pub struct SampleEncoder<'o> {
    out: &'o mut Vec<u8>,
    labels: LabelEncoder,
}

impl<'o> SampleEncoder<'o> {
    /// Starts a sample line in any buffer (a family's, or a line or prefix of its own).
    #[inline]
    pub fn new(out: &'o mut Vec<u8>, name: &[u8], suffix: &[u8]) -> Self {
        out.extend_from_slice(name);
        out.extend_from_slice(suffix);
        SampleEncoder {
            out,
            labels: LabelEncoder { open: false },
        }
    }

    /// One label pair, the value escaped (with the "needs escaping?" scan).
    #[inline]
    pub fn label(mut self, name: &[u8], value: &[u8]) -> Self {
        self.labels.pair(self.out, name, value);
        self
    }

    /// Label pairs, in order.
    #[inline]
    pub fn labels<'a>(mut self, pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Self {
        for (name, value) in pairs {
            self.labels.pair(self.out, name, value);
        }
        self
    }

    /// Label pairs, each value escaped byte by byte (the live registries'
    /// per-scrape baseline).
    #[inline]
    pub fn labels_escaped_bytewise<'a>(
        mut self,
        pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) -> Self {
        for (name, value) in pairs {
            self.labels.pair_bytewise(self.out, name, value);
        }
        self
    }

    /// Label pairs rendered before by [`write_label_pairs`]; empty adds nothing.
    #[inline]
    pub fn rendered_labels(mut self, pairs: &[u8]) -> Self {
        if !pairs.is_empty() {
            self.labels.separate(self.out);
            self.out.extend_from_slice(pairs);
        }
        self
    }

    /// Closes the label block and writes the space before the value: the
    /// sample's prefix is complete, to be kept and copied by
    /// [`FamilyEncoder::prerendered`].
    #[inline]
    pub fn end_prefix(self) {
        self.labels.close(self.out);
        self.out.push(b' ');
    }

    /// Closes the label block; the value comes next.
    #[inline]
    pub fn value(self) -> ValueEncoder<'o> {
        self.labels.close(self.out);
        self.out.push(b' ');
        ValueEncoder { out: self.out }
    }
}

/// Writes a label block: `{` before the first pair, `,` between, `}` at the end.
struct LabelEncoder {
    /// Whether a `{` has been written.
    open: bool,
}

impl LabelEncoder {
    #[inline]
    fn separate(&mut self, out: &mut Vec<u8>) {
        out.push(if self.open { b',' } else { b'{' });
        self.open = true;
    }

    #[inline]
    fn pair(&mut self, out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
        self.separate(out);
        write_pair(out, name, value);
    }

    #[inline]
    fn pair_bytewise(&mut self, out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
        self.separate(out);
        out.extend_from_slice(name);
        out.extend_from_slice(b"=\"");
        write_escaped_bytewise(out, value, Escape::LabelValue);
        out.push(b'"');
    }

    #[inline]
    fn close(self, out: &mut Vec<u8>) {
        if self.open {
            out.push(b'}');
        }
    }
}

/// Writes a sample's value and ends the line.
pub struct ValueEncoder<'o> {
    out: &'o mut Vec<u8>,
}

impl ValueEncoder<'_> {
    /// As Ruby's `Float#to_s`.
    #[inline]
    pub fn ruby_float(self, value: f64) {
        rubyfloat::write_line(self.out, value);
    }

    /// `Some` as [`ValueEncoder::ruby_float`]; `None` prints empty, as Ruby's `nil.to_s`.
    #[inline]
    pub fn ruby_float_or_empty(self, value: Option<f64>) {
        if let Some(value) = value {
            rubyfloat::write(self.out, value);
        }
        self.out.push(b'\n');
    }

    /// A whole number, in decimal.
    #[inline]
    pub fn integer(self, value: u64) {
        self.out
            .extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
        self.out.push(b'\n');
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
        let escaped = |s: &[u8], mode| {
            let mut out = Vec::new();
            write_escaped(&mut out, s, mode);
            out
        };
        assert_eq!(escaped(b"a\"b\\c\nd", Escape::LabelValue), br#"a\"b\\c\nd"#);
        assert_eq!(escaped(b"a\"b\\c\nd", Escape::Help), br#"a"b\\c\nd"#);
    }

    #[test]
    fn encodes_families_samples_and_labels() {
        let mut out = Vec::new();
        let mut family = FamilyEncoder::new(&mut out, b"h", "histogram", b"a\\b\n\"c\"");
        family
            .sample(b"_bucket")
            .label(b"a", b"x\"y")
            .label(b"le", b"+Inf")
            .value()
            .ruby_float(2.0);
        family.sample(b"_sum").value().ruby_float_or_empty(None);
        family
            .sample(b"_count")
            .rendered_labels(b"")
            .value()
            .integer(7);
        family
            .sample(b"")
            .rendered_labels(br#"a="1""#)
            .label(b"le", b"0.5")
            .value()
            .ruby_float(-0.0);
        let mut prefix = Vec::new();
        SampleEncoder::new(&mut prefix, b"h", b"")
            .labels_escaped_bytewise([(&b"q"[..], &b"\\"[..])])
            .end_prefix();
        family.prerendered(&prefix).ruby_float(1e20);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "# TYPE h histogram\n# HELP h a\\\\b\\n\"c\"\n\
             h_bucket{a=\"x\\\"y\",le=\"+Inf\"} 2.0\n\
             h_sum \n\
             h_count 7\n\
             h{a=\"1\",le=\"0.5\"} -0.0\n\
             h{q=\"\\\\\"} 1.0e+20\n"
        );
        let mut pairs = Vec::new();
        write_label_pairs(
            &mut pairs,
            [(&b"a"[..], &b"x\n"[..]), (&b"b"[..], &b""[..])],
        );
        assert_eq!(pairs, br#"a="x\n",b="""#);
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
                prop_assert_eq!(mode.find(&s), s.iter().position(|&b| mode.needs(b)));
            }
        }
    }
}
