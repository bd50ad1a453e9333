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
            other => Err(format!("unknown key dialect `{other}` (expected cgi or uri)")),
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
            out.extend_from_slice(&[b'%', HEX_UPPER[usize::from(b >> 4)], HEX_UPPER[usize::from(b & 15)]]);
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
    for (i, (name, _)) in labels.iter().enumerate() {
        if name.is_empty() {
            let at = nth_piece_offset(raw, i);
            return Err(KeyError::EmptyLabelName { at });
        }
        if labels[..i].iter().any(|(other, _)| other == name) {
            return Err(KeyError::DuplicateLabelName { name: String::from_utf8_lossy(name).into_owned() });
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

/// Byte classes for the fast decoder.
const PLAIN: u8 = 0;
const SEPARATOR: u8 = 1; // `&` or `=`
const ESCAPE: u8 = 2; // `%` or `+`
const NON_ASCII: u8 = 3;

static CLASS: [u8; 256] = {
    let mut table = [PLAIN; 256];
    let mut b = 128;
    while b < 256 {
        table[b] = NON_ASCII;
        b += 1;
    }
    table[b'&' as usize] = SEPARATOR;
    table[b'=' as usize] = SEPARATOR;
    table[b'%' as usize] = ESCAPE;
    table[b'+' as usize] = ESCAPE;
    table
};

/// Decodes a raw key into labels with a table-driven scan, borrowing every
/// component that holds no escape. Same result as [`decode_key_reference`].
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

/// Scans one component from `start` to the next `&` (or `=` for a name).
/// Returns it and the offset of the byte that ended it.
#[inline]
fn component_fast(raw: &[u8], start: usize, is_name: bool) -> Result<(Cow<'_, [u8]>, usize), KeyError> {
    let mut i = start;
    let mut escaped = false;
    while i < raw.len() {
        match CLASS[usize::from(raw[i])] {
            PLAIN => {}
            SEPARATOR => {
                if raw[i] == b'&' || is_name {
                    break;
                }
            }
            ESCAPE => escaped = true,
            _ => return Err(KeyError::NotAscii { at: i }),
        }
        i += 1;
    }
    let s = &raw[start..i];
    if !escaped {
        return Ok((Cow::Borrowed(s), i));
    }
    match unescape_reference(s, start) {
        Ok(decoded) => Ok((Cow::Owned(decoded), i)),
        // The reference rejects a non-ASCII key before looking at escapes, so a
        // non-ASCII byte later in the key is the error to report.
        Err(err) => match raw[i..].iter().position(|b| !b.is_ascii()) {
            Some(at) => Err(KeyError::NotAscii { at: i + at }),
            None => Err(err),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(labels: Vec<Label<'_>>) -> Vec<(Vec<u8>, Vec<u8>)> {
        labels.into_iter().map(|(n, v)| (n.into_owned(), v.into_owned())).collect()
    }

    #[test]
    fn dialects_differ_only_in_tilde_and_star() {
        let mut cgi = Vec::new();
        encode_key(&mut cgi, [(&b"path"[..], &b"tilde~star* a&b=c%"[..])], Dialect::Cgi);
        assert_eq!(cgi, b"path=tilde~star%2A+a%26b%3Dc%25");
        let mut uri = Vec::new();
        encode_key(&mut uri, [(&b"path"[..], &b"tilde~star* a&b=c%"[..])], Dialect::Uri);
        assert_eq!(uri, b"path=tilde%7Estar*+a%26b%3Dc%25");
        assert_eq!(owned(decode_key_reference(&cgi).unwrap()), owned(decode_key_reference(&uri).unwrap()));
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
        assert_eq!(owned(decode_key_fast(b"a=b=c").unwrap()), vec![(b"a".to_vec(), b"b=c".to_vec())]);
    }

    #[test]
    fn fast_decoder_borrows_plain_components() {
        let labels = decode_key_fast(b"code=200&path=plain").unwrap();
        assert!(labels.iter().all(|(n, v)| matches!(n, Cow::Borrowed(_)) && matches!(v, Cow::Borrowed(_))));
    }
}
