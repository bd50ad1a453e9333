//! A group's key: its group-by label values, quoted, escaped and joined;
//! what an aggregation finds a group by and reads its labels from.

use crate::format::text::{write_escaped, Escape};

/// A group's identity: its group-by label values, each quoted and escaped,
/// joined by `,` (a missing label is `""`, as Prometheus treats absent and empty alike).
pub fn write_group_key(out: &mut Vec<u8>, values: impl IntoIterator<Item = impl AsRef<[u8]>>) {
    for (i, v) in values.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'"');
        write_escaped(out, v.as_ref(), Escape::LabelValue);
        out.push(b'"');
    }
}

/// Where each value of a group key written by [`write_group_key`] stands in
/// it (between its quotes, still escaped).
pub fn group_key_values(key: &[u8]) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= key.len() {
            return None;
        }
        // Skip the opening quote (and a separating comma).
        i += if key[i] == b',' { 2 } else { 1 };
        let start = i;
        while i < key.len() && key[i] != b'"' {
            i += if key[i] == b'\\' { 2 } else { 1 };
        }
        let end = i.min(key.len());
        i += 1;
        Some(start..end)
    })
}

/// A value of a group key (as [`group_key_values`] finds it) unescaped, onto `out`.
pub fn unescape_group_value(out: &mut Vec<u8>, raw: &[u8]) {
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'\\' && i + 1 < raw.len() {
            i += 1;
            out.push(if raw[i] == b'n' { b'\n' } else { raw[i] });
        } else {
            out.push(raw[i]);
        }
        i += 1;
    }
}

/// The values of a group key written by [`write_group_key`], unescaped.
pub fn parse_group_key(key: &[u8]) -> Vec<Vec<u8>> {
    group_key_values(key)
        .map(|range| {
            let mut value = Vec::new();
            unescape_group_value(&mut value, &key[range]);
            value
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_keys_round_trip() {
        let values: [&[u8]; 4] = [b"g0", b"", b"a\"b,c\\d\ne", b"caf\xc3\xa9"];
        let mut key = Vec::new();
        write_group_key(&mut key, values);
        assert_eq!(
            parse_group_key(&key),
            values.iter().map(|v| v.to_vec()).collect::<Vec<_>>()
        );
    }
}
