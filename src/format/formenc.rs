//! Form encoding of store keys, as client_ruby writes and reads them.
//!
//! A key is a label set sorted by name and form-encoded: `name=value` pairs
//! joined by `&`, space as `+`, every byte outside the dialect's unreserved set
//! as `%XX` (uppercase). The two dialects differ in `~` and `*` only:
//! - [`Dialect::Cgi`] (client_ruby 4.2.5, `CGI.escape`) keeps `~`, writes `%2A`;
//! - [`Dialect::Uri`] (client_ruby 5.x, `URI.encode_www_form`) keeps `*`, writes `%7E`.
//!
//! Decoding follows `URI.decode_www_form_component` per component: the raw key
//! must be ASCII, `+` is a space, `%` must be followed by two hex digits. Both
//! dialects decode to the same labels, so 4.2.5 and 5.x files merge.
//!
//! Two decoders sit side by side: [`decode_key_reference`], which looks at
//! every byte and builds owned strings, and [`decode_key_fast`] (the
//! `fast-unescape` strategy), which scans with a byte table and borrows every
//! component that holds no escape. A property test checks they agree on every
//! input, errors included.

use crate::shared::event_probe::probe;
use crate::shared::seams::Unescape;
use std::borrow::Cow;
use std::fmt;

/// Which client_ruby version's escaping to write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// client_ruby 4.2.5: `CGI.escape`.
    Cgi,
    /// client_ruby 5.x: `URI.encode_www_form`.
    #[default]
    Uri,
}

impl std::str::FromStr for Dialect {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cgi" => Ok(Dialect::Cgi),
            "uri" => Ok(Dialect::Uri),
            other => Err(format!(
                "unknown key dialect `{other}` (expected cgi or uri)"
            )),
        }
    }
}

impl Dialect {
    #[inline]
    fn keeps(self, b: u8) -> bool {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-' => true,
            b'~' => self == Dialect::Cgi,
            b'*' => self == Dialect::Uri,
            _ => false,
        }
    }
}

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Appends one form-encoded component.
pub fn encode_component(out: &mut Vec<u8>, bytes: &[u8], dialect: Dialect) {
    for &b in bytes {
        if dialect.keeps(b) {
            out.push(b);
        } else if b == b' ' {
            out.push(b'+');
        } else {
            out.extend_from_slice(&[
                b'%',
                HEX_UPPER[usize::from(b >> 4)],
                HEX_UPPER[usize::from(b & 15)],
            ]);
        }
    }
}

/// Appends the key of a label set. `labels` must already be sorted by name.
pub fn encode_key<'a, I>(out: &mut Vec<u8>, labels: I, dialect: Dialect)
where
    I: IntoIterator<Item = (&'a [u8], &'a [u8])>,
{
    for (i, (name, value)) in labels.into_iter().enumerate() {
        if i > 0 {
            out.push(b'&');
        }
        encode_component(out, name, dialect);
        out.push(b'=');
        encode_component(out, value, dialect);
    }
}

/// Why a raw key could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyError {
    NotAscii { at: usize },
    InvalidEscape { at: usize },
    EmptyLabelName { at: usize },
    DuplicateLabelName { name: String },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::NotAscii { at } => write!(f, "non-ASCII byte at key offset {at}"),
            KeyError::InvalidEscape { at } => write!(f, "invalid %-escape at key offset {at}"),
            KeyError::EmptyLabelName { at } => write!(f, "empty label name at key offset {at}"),
            KeyError::DuplicateLabelName { name } => write!(f, "label name {name:?} appears twice"),
        }
    }
}

impl std::error::Error for KeyError {}

/// A decoded label: name and value bytes, borrowed from the raw key when unescaped.
pub type Label<'a> = (Cow<'a, [u8]>, Cow<'a, [u8]>);

/// Decodes a raw key into labels, in key order, looking at every byte.
pub fn decode_key_reference(raw: &[u8]) -> Result<Vec<Label<'static>>, KeyError> {
    if let Some(at) = raw.iter().position(|b| !b.is_ascii()) {
        return Err(KeyError::NotAscii { at });
    }
    let mut labels = Vec::new();
    let mut start = 0;
    for piece in raw.split(|&b| b == b'&') {
        let piece_start = start;
        start += piece.len() + 1;
        // Ruby's `each_line('&')` yields no piece after a trailing `&`.
        if piece.is_empty() && piece_start == raw.len() {
            break;
        }
        let (name, value, value_at) = match piece.iter().position(|&b| b == b'=') {
            Some(eq) => (&piece[..eq], &piece[eq + 1..], piece_start + eq + 1),
            None => (piece, &piece[piece.len()..], piece_start + piece.len()),
        };
        let name = unescape_reference(name, piece_start)?;
        let value = unescape_reference(value, value_at)?;
        labels.push((Cow::Owned(name), Cow::Owned(value)));
    }
    check_names(&labels, raw)?;
    Ok(labels)
}

fn unescape_reference(s: &[u8], offset: usize) -> Result<Vec<u8>, KeyError> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => {
                let hi = s.get(i + 1).and_then(|&b| hex_value(b));
                let lo = s.get(i + 2).and_then(|&b| hex_value(b));
                match (hi, lo) {
                    (Some(hi), Some(lo)) => out.push(hi << 4 | lo),
                    _ => return Err(KeyError::InvalidEscape { at: offset + i }),
                }
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(out)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Rejects what Ruby would turn into a nonsense label set: an empty name, or a
/// name twice (CGI.parse and URI.decode_www_form disagree on which one wins).
fn check_names(labels: &[Label<'_>], raw: &[u8]) -> Result<(), KeyError> {
    // Few labels: compare with the earlier ones. Many: a set, so a key of
    // 100k labels is checked in linear time, not 5·10⁹ comparisons.
    let mut seen = (labels.len() > 32).then(|| {
        std::collections::HashSet::with_capacity_and_hasher(
            labels.len(),
            foldhash::fast::FixedState::default(),
        )
    });
    for (i, (name, _)) in labels.iter().enumerate() {
        if name.is_empty() {
            let at = nth_piece_offset(raw, i);
            return Err(KeyError::EmptyLabelName { at });
        }
        let repeated = match &mut seen {
            Some(seen) => !seen.insert(&**name),
            None => labels[..i].iter().any(|(other, _)| other == name),
        };
        if repeated {
            return Err(KeyError::DuplicateLabelName {
                name: String::from_utf8_lossy(name).into_owned(),
            });
        }
    }
    Ok(())
}

fn nth_piece_offset(raw: &[u8], n: usize) -> usize {
    raw.iter()
        .enumerate()
        .filter(|(_, &b)| b == b'&')
        .nth(n.wrapping_sub(1))
        .map_or(0, |(i, _)| i + 1)
}

/// The unescape seam ([`crate::shared::seams::Unescape`]): what each decoder is.
impl Unescape {
    /// Decodes a whole raw key with this decoder.
    #[inline]
    pub fn decode_key(self, raw: &[u8]) -> Result<Vec<Label<'_>>, KeyError> {
        match self {
            Unescape::Reference => {
                probe!("export.unescape.reference");
                decode_key_reference(raw)
            }
            Unescape::Fast => {
                probe!("export.unescape.fast");
                decode_key_fast(raw)
            }
        }
    }
}

/// Decoded components by their raw bytes. With `decode-once`, an export
/// decodes each distinct component once: a histogram's raw keys differ only in
/// `le`, so without this its (long) label values would be decoded once per bucket.
#[derive(Default)]
pub struct ComponentCache {
    decoded: std::collections::HashMap<Box<[u8]>, Vec<u8>, foldhash::fast::FixedState>,
}

impl ComponentCache {
    /// The component `s` (at key offset `offset`) decoded by `unescape`; only
    /// successful decodings are kept, so an error is always reported with its
    /// own offset.
    fn decode(&mut self, s: &[u8], offset: usize, unescape: Unescape) -> Result<Vec<u8>, KeyError> {
        if let Some(decoded) = self.decoded.get(s) {
            return Ok(decoded.clone());
        }
        let decoded = match unescape {
            Unescape::Fast => {
                probe!("export.unescape.fast");
                match memchr::memchr2(b'%', b'+', s) {
                    None => s.to_vec(),
                    Some(first) => unescape_from(s, first, offset)?,
                }
            }
            Unescape::Reference => {
                probe!("export.unescape.reference");
                unescape_reference(s, offset)?
            }
        };
        self.decoded.insert(s.into(), decoded.clone());
        Ok(decoded)
    }
}

/// Decodes a raw key component by component through `cache`, each component
/// by `unescape`. Same labels and same errors as [`decode_key_reference`].
pub fn decode_key_cached(
    raw: &[u8],
    unescape: Unescape,
    cache: &mut ComponentCache,
) -> Result<Vec<Label<'static>>, KeyError> {
    if !raw.is_ascii() {
        // The whole-key decoders report where; they check ASCII first too.
        return decode_key_reference(raw);
    }
    let mut labels = Vec::new();
    // Pieces between `&`s, found with memchr (keys run to thousands of bytes).
    let ends = memchr::memchr_iter(b'&', raw).chain(std::iter::once(raw.len()));
    let mut piece_start = 0;
    for end in ends {
        let piece = &raw[piece_start..end];
        if piece.is_empty() && piece_start == raw.len() {
            break;
        }
        let (name, value, value_at) = match memchr::memchr(b'=', piece) {
            Some(eq) => (&piece[..eq], &piece[eq + 1..], piece_start + eq + 1),
            None => (piece, &piece[piece.len()..], piece_start + piece.len()),
        };
        let name = cache.decode(name, piece_start, unescape)?;
        let value = cache.decode(value, value_at, unescape)?;
        labels.push((Cow::Owned(name), Cow::Owned(value)));
        piece_start = end + 1;
    }
    check_names(&labels, raw)?;
    Ok(labels)
}

/// One `application/x-www-form-urlencoded` component decoded (`+` is a space,
/// `%` takes two hex digits), borrowed when it holds no escape. Bytes are not
/// checked for ASCII: that is the key decoders' rule, not the component's.
pub fn decode_component(s: &[u8]) -> Result<Cow<'_, [u8]>, KeyError> {
    match memchr::memchr2(b'%', b'+', s) {
        None => Ok(Cow::Borrowed(s)),
        Some(first) => unescape_from(s, first, 0).map(Cow::Owned),
    }
}

/// Hex digit values; 0xFF marks a byte that is not a hex digit.
static HEX: [u8; 256] = {
    let mut table = [0xFF; 256];
    let mut d = 0;
    while d < 10 {
        table[b'0' as usize + d] = d as u8;
        d += 1;
    }
    let mut d = 0;
    while d < 6 {
        table[b'a' as usize + d] = 10 + d as u8;
        table[b'A' as usize + d] = 10 + d as u8;
        d += 1;
    }
    table
};

/// Decodes a raw key into labels, borrowing every component that holds no
/// escape: SIMD scans (`memchr`, `is_ascii`) find each component's end and
/// whether it needs decoding, and a table decodes `%XX`. Same result as
/// [`decode_key_reference`], errors included.
pub fn decode_key_fast(raw: &[u8]) -> Result<Vec<Label<'_>>, KeyError> {
    let mut labels = Vec::with_capacity(4);
    let mut pos = 0;
    while pos < raw.len() {
        let (name, next) = component_fast(raw, pos, true)?;
        let (value, next) = if raw.get(next) == Some(&b'=') {
            component_fast(raw, next + 1, false)?
        } else {
            (Cow::Borrowed(&raw[next..next]), next)
        };
        labels.push((name, value));
        // `next` is at `&` or the end.
        pos = next + 1;
    }
    check_names(&labels, raw)?;
    Ok(labels)
}

/// One component from `start` to the next `&` (or `=` for a name); returns it
/// and the offset of the byte that ended it.
#[inline]
fn component_fast(
    raw: &[u8],
    start: usize,
    is_name: bool,
) -> Result<(Cow<'_, [u8]>, usize), KeyError> {
    let rest = &raw[start..];
    let len = if is_name {
        memchr::memchr2(b'&', b'=', rest)
    } else {
        memchr::memchr(b'&', rest)
    };
    let end = start + len.unwrap_or(rest.len());
    let s = &raw[start..end];
    if !s.is_ascii() {
        let at = s.iter().position(|b| !b.is_ascii()).expect("not ASCII");
        return Err(KeyError::NotAscii { at: start + at });
    }
    let Some(first) = memchr::memchr2(b'%', b'+', s) else {
        return Ok((Cow::Borrowed(s), end));
    };
    match unescape_from(s, first, start) {
        Ok(decoded) => Ok((Cow::Owned(decoded), end)),
        // The reference rejects a non-ASCII key before looking at escapes, so a
        // non-ASCII byte later in the key is the error to report.
        Err(err) => match raw[end..].iter().position(|b| !b.is_ascii()) {
            Some(at) => Err(KeyError::NotAscii { at: end + at }),
            None => Err(err),
        },
    }
}

/// Decodes `s`, whose first escape is at `first`, writing by index into a
/// buffer the size of the input (decoding never grows it).
fn unescape_from(s: &[u8], first: usize, offset: usize) -> Result<Vec<u8>, KeyError> {
    let mut out = vec![0u8; s.len()];
    out[..first].copy_from_slice(&s[..first]);
    let (mut i, mut w) = (first, first);
    while i < s.len() {
        out[w] = match s[i] {
            b'+' => {
                i += 1;
                b' '
            }
            b'%' => {
                let hi = HEX[usize::from(*s.get(i + 1).unwrap_or(&0))];
                let lo = HEX[usize::from(*s.get(i + 2).unwrap_or(&0))];
                if hi == 0xFF || lo == 0xFF {
                    return Err(KeyError::InvalidEscape { at: offset + i });
                }
                i += 3;
                hi << 4 | lo
            }
            b => {
                i += 1;
                b
            }
        };
        w += 1;
    }
    out.truncate(w);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(labels: Vec<Label<'_>>) -> Vec<(Vec<u8>, Vec<u8>)> {
        labels
            .into_iter()
            .map(|(n, v)| (n.into_owned(), v.into_owned()))
            .collect()
    }

    #[test]
    fn dialects_differ_only_in_tilde_and_star() {
        let mut cgi = Vec::new();
        encode_key(
            &mut cgi,
            [(&b"path"[..], &b"tilde~star* a&b=c%"[..])],
            Dialect::Cgi,
        );
        assert_eq!(cgi, b"path=tilde~star%2A+a%26b%3Dc%25");
        let mut uri = Vec::new();
        encode_key(
            &mut uri,
            [(&b"path"[..], &b"tilde~star* a&b=c%"[..])],
            Dialect::Uri,
        );
        assert_eq!(uri, b"path=tilde%7Estar*+a%26b%3Dc%25");
        assert_eq!(
            owned(decode_key_reference(&cgi).unwrap()),
            owned(decode_key_reference(&uri).unwrap())
        );
    }

    #[test]
    fn decoders_agree_on_edge_cases() {
        for raw in [
            &b""[..],
            b"a=1",
            b"a=1&",
            b"a",
            b"a=&b=",
            b"a=1&&b=2",
            b"&a=1",
            b"a=%zz",
            b"a=%4",
            b"a=%41%42+c",
            b"a=1&a=2",
            b"a=\xc3\xa9",
            b"a=%4\xc3",
            b"a=b=c",
            b"=x",
        ] {
            let reference = decode_key_reference(raw).map(owned);
            let fast = decode_key_fast(raw).map(owned);
            assert_eq!(reference, fast, "key {:?}", String::from_utf8_lossy(raw));
        }
        assert_eq!(
            owned(decode_key_fast(b"a=b=c").unwrap()),
            vec![(b"a".to_vec(), b"b=c".to_vec())]
        );
    }

    #[test]
    fn fast_decoder_borrows_plain_components() {
        let labels = decode_key_fast(b"code=200&path=plain").unwrap();
        assert!(labels
            .iter()
            .all(|(n, v)| matches!(n, Cow::Borrowed(_)) && matches!(v, Cow::Borrowed(_))));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn key_bytes() -> impl Strategy<Value = Vec<u8>> {
            // Mostly key-like bytes, so both decoders get past the first byte.
            proptest::collection::vec(
                prop_oneof![
                    4 => prop::sample::select(b"ab=&%+2F7e~*".to_vec()),
                    1 => any::<u8>(),
                ],
                0..40,
            )
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4096))]

            /// `fast-unescape` against the reference on arbitrary bytes, errors included.
            #[test]
            fn fast_decoder_equals_reference(raw in key_bytes()) {
                prop_assert_eq!(decode_key_fast(&raw).map(owned), decode_key_reference(&raw).map(owned));
            }

            /// The component-cached decoder (`decode-once`) against the reference,
            /// with one cache shared across keys, for both component decoders.
            #[test]
            fn cached_decoder_equals_reference(keys in proptest::collection::vec(key_bytes(), 1..6), fast in any::<bool>()) {
                let unescape = if fast { Unescape::Fast } else { Unescape::Reference };
                let mut cache = ComponentCache::default();
                for raw in &keys {
                    prop_assert_eq!(
                        decode_key_cached(raw, unescape, &mut cache).map(owned),
                        decode_key_reference(raw).map(owned)
                    );
                }
            }

            /// One component, borrowed when plain, against the reference's component decoder.
            #[test]
            fn component_decoder_equals_reference(raw in key_bytes()) {
                let decoded = decode_component(&raw).map(|c| c.into_owned());
                prop_assert_eq!(decoded, unescape_reference(&raw, 0));
                if !raw.contains(&b'%') && !raw.contains(&b'+') {
                    prop_assert!(matches!(decode_component(&raw), Ok(Cow::Borrowed(_))));
                }
            }

            /// Encoding in either dialect decodes back to the labels.
            #[test]
            fn decode_inverts_encode(
                labels in proptest::collection::btree_map("[a-z_]{1,6}", ".*", 0..4),
                cgi in any::<bool>(),
            ) {
                let dialect = if cgi { Dialect::Cgi } else { Dialect::Uri };
                let pairs: Vec<(&[u8], &[u8])> = labels.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())).collect();
                let mut key = Vec::new();
                encode_key(&mut key, pairs.iter().copied(), dialect);
                let expected: Vec<(Vec<u8>, Vec<u8>)> = pairs.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
                prop_assert_eq!(owned(decode_key_reference(&key).unwrap()), expected.clone());
                prop_assert_eq!(owned(decode_key_fast(&key).unwrap()), expected);
            }
        }
    }
}
