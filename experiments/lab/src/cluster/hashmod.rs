//! Prometheus's `hashmod` relabel action, for sharding series over N
//! receivers as `write_relabel_configs` on N remote-write endpoints would:
//!
//! ```yaml
//! write_relabel_configs:          # on endpoint k of N
//!   - source_labels: [__name__, instance, label_0]
//!     modulus: N
//!     target_label: __tmp_shard
//!     action: hashmod
//!   - source_labels: [__tmp_shard]
//!     regex: "k"
//!     action: keep
//! ```
//!
//! The rule (Prometheus `model/relabel`): the source labels' values (a
//! missing label is `""`) joined by the separator (`;` by default), the MD5
//! of those bytes, its last 8 bytes read as a big-endian integer, modulo N.

use md5::{Digest, Md5};

/// The separator Prometheus joins source label values with unless told otherwise.
pub const DEFAULT_SEPARATOR: &[u8] = b";";

/// `hashmod` of the already joined source value.
pub fn hashmod(joined: &[u8], modulus: u64) -> u64 {
    let digest = Md5::digest(joined);
    let tail: [u8; 8] = digest[8..].try_into().expect("MD5 is 16 bytes");
    u64::from_be_bytes(tail) % modulus.max(1)
}

/// `hashmod` of a series: the values of `source_labels` among `labels`
/// (name, value pairs) joined by `separator`; `buf` is scratch.
pub fn shard_of(
    labels: &[(&[u8], &[u8])],
    source_labels: &[&[u8]],
    separator: &[u8],
    modulus: u64,
    buf: &mut Vec<u8>,
) -> u64 {
    buf.clear();
    for (i, name) in source_labels.iter().enumerate() {
        if i > 0 {
            buf.extend_from_slice(separator);
        }
        if let Some((_, value)) = labels.iter().find(|(n, _)| n == name) {
            buf.extend_from_slice(value);
        }
    }
    hashmod(buf, modulus)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values Prometheus's own relabel tests expect (`TestRelabel`, modulus 1000).
    #[test]
    fn prometheus_known_values() {
        assert_eq!(hashmod(b"baz", 1000), 976);
        assert_eq!(hashmod(b"foo\nbar", 1000), 734);
    }

    /// Values computed independently (Python's hashlib: the last 8 bytes of
    /// the MD5, big-endian, modulo N), and the join of source labels.
    #[test]
    fn joined_source_labels() {
        assert_eq!(hashmod(b"foo", 1000), 696);
        assert_eq!(hashmod(b"", 3), 1);
        let labels: [(&[u8], &[u8]); 3] = [
            (b"__name__", b"data"),
            (b"instance", b"i0"),
            (b"label_0", b"g0"),
        ];
        let mut buf = Vec::new();
        let source: [&[u8]; 3] = [b"__name__", b"instance", b"label_0"];
        assert_eq!(
            shard_of(&labels, &source, DEFAULT_SEPARATOR, 3, &mut buf),
            1
        );
        assert_eq!(buf, b"data;i0;g0");
        // A missing label joins as "".
        let source: [&[u8]; 2] = [b"nope", b"label_0"];
        shard_of(&labels, &source, DEFAULT_SEPARATOR, 3, &mut buf);
        assert_eq!(buf, b";g0");
    }
}
