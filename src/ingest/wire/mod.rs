//! Prometheus remote write 1.0 on the wire: snappy *block* format around a
//! protobuf `WriteRequest`.
//!
//! Two decoders fill the same [`Batch`] (label byte slices, samples, series
//! spans), so everything downstream is shared:
//! - [`decode_owned`]: the reference, `prost` into owned structs (`String`s);
//! - [`decode_borrowed`] (`borrowed.rs`): the `borrowed-decode` strategy, a
//!   walk over the decompressed buffer that hands labels on as slices of it.
//!   It accepts and rejects exactly what prost does (same wire rules, same
//!   recursion limit, last occurrence of a scalar field wins); UTF-8 of label
//!   names and values is checked later, at canonicalization, where the series
//!   cache can skip it for bytes it has already validated.

mod borrowed;
pub use borrowed::{
    decode_borrowed, decode_borrowed_deferred_into, decode_borrowed_into, parse_label_fields,
};

use crate::shared::seams::WireDecode;
use std::ops::Range;

/// `prometheus.WriteRequest` (only the fields remote write 1.0 uses; others are skipped).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
    #[prost(message, repeated, tag = "3")]
    pub metadata: Vec<MetricMetadata>,
}

/// `prometheus.TimeSeries` (exemplars = 3 and native histograms = 4 are skipped).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// One sample: a double and a timestamp in milliseconds.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct MetricMetadata {
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(string, tag = "2")]
    pub metric_family_name: String,
    #[prost(string, tag = "4")]
    pub help: String,
    #[prost(string, tag = "5")]
    pub unit: String,
}

/// Why a body could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("bad snappy block: {0}")]
    Snappy(String),
    #[error("decoded length {decoded} exceeds the limit of {limit} bytes")]
    TooLarge { decoded: usize, limit: usize },
    #[error("bad protobuf: {0}")]
    Protobuf(String),
}

/// The decoded length a snappy block's header announces, at most `limit`. A
/// header over snappy's own 4 GiB maximum is too large too, not malformed.
fn decoded_len(body: &[u8], limit: usize) -> Result<usize, WireError> {
    let len = match snap::raw::decompress_len(body) {
        Ok(len) => len,
        Err(snap::Error::TooBig { given, .. }) => usize::try_from(given).unwrap_or(usize::MAX),
        Err(e) => return Err(WireError::Snappy(e.to_string())),
    };
    if len > limit {
        return Err(WireError::TooLarge {
            decoded: len,
            limit,
        });
    }
    Ok(len)
}

/// Decompresses a snappy block into `out` (cleared first). The decoded length is
/// read from the block header and checked against `limit` before anything is
/// allocated.
pub fn decompress(body: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<(), WireError> {
    let len = decoded_len(body, limit)?;
    out.clear();
    out.resize(len, 0);
    let n = snap::raw::Decoder::new()
        .decompress(body, out)
        .map_err(|e| WireError::Snappy(e.to_string()))?;
    out.truncate(n);
    Ok(())
}

/// [`decompress`] into a buffer kept at its largest size, so its bytes are
/// zeroed only when it grows; returns the decoded bytes.
pub fn decompress_reusing<'b>(
    body: &[u8],
    limit: usize,
    buf: &'b mut Vec<u8>,
) -> Result<&'b [u8], WireError> {
    let len = decoded_len(body, limit)?;
    if buf.len() < len {
        buf.resize(len, 0);
    }
    let n = snap::raw::Decoder::new()
        .decompress(body, &mut buf[..len])
        .map_err(|e| WireError::Snappy(e.to_string()))?;
    Ok(&buf[..n])
}

/// Snappy block compression (what remote-write senders do).
pub fn compress(raw: &[u8]) -> Vec<u8> {
    snap::raw::Encoder::new()
        .compress_vec(raw)
        .expect("snappy compression of an in-memory buffer")
}

/// One series of a decoded request: ranges into [`Batch::labels`] and [`Batch::samples`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeriesSpan<'a> {
    pub labels: Range<u32>,
    pub samples: Range<u32>,
    /// The wire bytes of this series' label fields, when they are contiguous
    /// (only the borrowed walker knows them). The series cache keys on them.
    pub raw_labels: Option<&'a [u8]>,
    /// The label fields were stepped over, not parsed: `labels` is empty and
    /// [`parse_label_fields`] on `raw_labels` gives them (or the error prost would give).
    pub labels_deferred: bool,
}

/// A decoded request, flat: all label pairs, all samples, and per series its ranges.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch<'a> {
    pub labels: Vec<(&'a [u8], &'a [u8])>,
    pub samples: Vec<Sample>,
    pub series: Vec<SeriesSpan<'a>>,
    /// How many metadata entries the request carried (they are validated, then dropped).
    pub metadata: usize,
}

impl<'a> Batch<'a> {
    /// Empties the batch, keeping its buffers for a later request (of any lifetime).
    pub fn recycle<'b>(self) -> Batch<'b> {
        Batch {
            labels: recycle(self.labels),
            samples: recycle(self.samples),
            series: recycle(self.series),
            metadata: 0,
        }
    }

    pub fn series_labels(&self, s: &SeriesSpan<'a>) -> &[(&'a [u8], &'a [u8])] {
        &self.labels[s.labels.start as usize..s.labels.end as usize]
    }

    pub fn series_samples(&self, s: &SeriesSpan<'a>) -> &[Sample] {
        &self.samples[s.samples.start as usize..s.samples.end as usize]
    }
}

/// An empty `Vec<U>` in the allocation of `v` (in-place collect; `T` and `U`
/// differ only in lifetimes here, so the layout matches).
fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter()
        .map(|_| -> U { unreachable!("the vector is empty") })
        .collect()
}

/// The reference decoder: prost into owned structs, then a [`Batch`] borrowing them.
pub fn decode_owned<'a>(raw: &[u8], holder: &'a mut WriteRequest) -> Result<Batch<'a>, WireError> {
    let mut batch = Batch::default();
    decode_owned_into(raw, holder, &mut batch)?;
    Ok(batch)
}

/// [`decode_owned`] into a (cleared) batch whose buffers are reused.
pub fn decode_owned_into<'a>(
    raw: &[u8],
    holder: &'a mut WriteRequest,
    batch: &mut Batch<'a>,
) -> Result<(), WireError> {
    *holder = prost::Message::decode(raw)
        .map_err(|e: prost::DecodeError| WireError::Protobuf(e.to_string()))?;
    batch.metadata = holder.metadata.len();
    for ts in &holder.timeseries {
        let l0 = batch.labels.len() as u32;
        batch.labels.extend(
            ts.labels
                .iter()
                .map(|l| (l.name.as_bytes(), l.value.as_bytes())),
        );
        let s0 = batch.samples.len() as u32;
        batch.samples.extend_from_slice(&ts.samples);
        batch.series.push(SeriesSpan {
            labels: l0..batch.labels.len() as u32,
            samples: s0..batch.samples.len() as u32,
            raw_labels: None,
            labels_deferred: false,
        });
    }
    Ok(())
}

impl WireDecode {
    /// The decode seam: `raw` into a (cleared) batch whose buffers are reused;
    /// `holder` keeps the owned decoder's strings.
    pub fn decode_into<'a>(
        self,
        raw: &'a [u8],
        holder: &'a mut WriteRequest,
        batch: &mut Batch<'a>,
    ) -> Result<(), WireError> {
        match self {
            WireDecode::Owned => decode_owned_into(raw, holder, batch),
            WireDecode::Borrowed => decode_borrowed_into(raw, batch),
            WireDecode::BorrowedDeferred => decode_borrowed_deferred_into(raw, batch),
        }
    }
}

/// Appends a protobuf varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends one `Label` field (tag 1 of `TimeSeries`) as prost would encode it.
pub fn put_label(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    let inner = 1
        + varint_len(name.len() as u64)
        + name.len()
        + 1
        + varint_len(value.len() as u64)
        + value.len();
    out.push(0x0a);
    put_varint(out, inner as u64);
    out.push(0x0a);
    put_varint(out, name.len() as u64);
    out.extend_from_slice(name);
    out.push(0x12);
    put_varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

/// Appends one `TimeSeries` (tag 1 of `WriteRequest`) whose label fields are
/// already encoded in `labels`, with one sample.
pub fn put_series_one_sample(out: &mut Vec<u8>, labels: &[u8], value: f64, timestamp: i64) {
    let sample_len = 9 + 1 + varint_len(timestamp as u64);
    let inner = labels.len() + 1 + varint_len(sample_len as u64) + sample_len;
    out.push(0x0a);
    put_varint(out, inner as u64);
    out.extend_from_slice(labels);
    out.push(0x12);
    put_varint(out, sample_len as u64);
    out.push(0x09);
    out.extend_from_slice(&value.to_le_bytes());
    out.push(0x10);
    put_varint(out, timestamp as u64);
}

pub fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn req() -> WriteRequest {
        WriteRequest {
            timeseries: vec![TimeSeries {
                labels: vec![
                    Label {
                        name: "__name__".into(),
                        value: "data".into(),
                    },
                    Label {
                        name: "label_0".into(),
                        value: "g\"0".into(),
                    },
                ],
                samples: vec![
                    Sample {
                        value: 1.5,
                        timestamp: 1000,
                    },
                    Sample {
                        value: -2.0,
                        timestamp: -5,
                    },
                ],
            }],
            metadata: vec![MetricMetadata {
                r#type: 1,
                metric_family_name: "data".into(),
                help: "h".into(),
                unit: "".into(),
            }],
        }
    }

    #[test]
    fn borrowed_matches_owned_on_a_valid_request() {
        let raw = req().encode_to_vec();
        let mut holder = WriteRequest::default();
        let owned = decode_owned(&raw, &mut holder).unwrap();
        let borrowed = decode_borrowed(&raw).unwrap();
        assert_eq!(owned.labels, borrowed.labels);
        assert_eq!(owned.samples, borrowed.samples);
        assert_eq!(borrowed.metadata, 1);
        let raw_labels = borrowed.series[0].raw_labels.unwrap();
        let mut expect = Vec::new();
        put_label(&mut expect, b"__name__", b"data");
        put_label(&mut expect, b"label_0", b"g\"0");
        assert_eq!(raw_labels, &expect[..]);
    }

    #[test]
    fn recycled_batches_keep_their_buffers() {
        let raw = req().encode_to_vec();
        let mut batch = Batch::default();
        decode_borrowed_into(&raw, &mut batch).unwrap();
        let capacity = batch.labels.capacity();
        let again: Batch<'static> = batch.recycle();
        assert!(again.labels.is_empty());
        assert_eq!(again.labels.capacity(), capacity);
    }

    #[test]
    fn deferred_labels_parse_to_the_same() {
        let raw = req().encode_to_vec();
        let eager = decode_borrowed(&raw).unwrap();
        let mut deferred = Batch::default();
        decode_borrowed_deferred_into(&raw, &mut deferred).unwrap();
        assert!(deferred.labels.is_empty() && deferred.series[0].labels_deferred);
        assert_eq!(deferred.samples, eager.samples);
        let mut labels = Vec::new();
        parse_label_fields(deferred.series[0].raw_labels.unwrap(), &mut labels).unwrap();
        assert_eq!(labels, eager.labels);
    }

    #[test]
    fn hand_encoder_matches_prost() {
        let mut labels = Vec::new();
        put_label(&mut labels, b"__name__", b"data");
        let mut ours = Vec::new();
        put_series_one_sample(&mut ours, &labels, 2.5, 1_700_000_000_123);
        let theirs = WriteRequest {
            timeseries: vec![TimeSeries {
                labels: vec![Label {
                    name: "__name__".into(),
                    value: "data".into(),
                }],
                samples: vec![Sample {
                    value: 2.5,
                    timestamp: 1_700_000_000_123,
                }],
            }],
            metadata: vec![],
        }
        .encode_to_vec();
        assert_eq!(ours, theirs);
        for v in [0u64, 1, 127, 128, 16383, 16384, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v), "{v}");
        }
    }

    #[test]
    fn decompress_checks_the_header_length_first() {
        let body = compress(&[7u8; 1000]);
        let mut out = Vec::new();
        assert_eq!(
            decompress(&body, 999, &mut out),
            Err(WireError::TooLarge {
                decoded: 1000,
                limit: 999
            })
        );
        decompress(&body, 1000, &mut out).unwrap();
        assert_eq!(out, vec![7u8; 1000]);
        // A header claiming 4 GiB is refused without allocating it; so is one
        // past snappy's own maximum (2^32 and more: too large, not malformed).
        let bogus = [0xff, 0xff, 0xff, 0xff, 0x0f, 0x00];
        assert!(matches!(
            decompress(&bogus, 1 << 20, &mut out),
            Err(WireError::TooLarge { .. })
        ));
        for header in [
            &[0x80, 0x80, 0x80, 0x80, 0x10][..],
            &[0xff, 0xff, 0xff, 0xff, 0x7f],
        ] {
            assert!(
                matches!(
                    decompress(header, 1 << 20, &mut out),
                    Err(WireError::TooLarge { decoded, .. }) if decoded >= 1 << 32
                ),
                "{header:?}"
            );
        }
        assert!(matches!(
            decompress(b"\x05abc", 100, &mut out),
            Err(WireError::Snappy(_))
        ));
    }
}
