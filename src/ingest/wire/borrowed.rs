//! The `borrowed-decode` strategy's decoder: a walk over the decompressed
//! buffer that hands labels on as slices of it (see the [module](super) doc).

use super::{Batch, Sample, SeriesSpan, WireError};

// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;
/// prost's recursion limit, mirrored so both decoders reject the same nesting.
const RECURSION_LIMIT: u32 = 100;

fn err(msg: &str) -> WireError {
    WireError::Protobuf(msg.to_owned())
}

/// A cursor over one message's bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// A varint of at most 10 bytes; the tenth may only carry the top bit (as prost).
    #[inline(always)]
    fn varint(&mut self) -> Result<u64, WireError> {
        match self.buf.get(self.pos) {
            Some(&b) if b < 0x80 => {
                self.pos += 1;
                Ok(u64::from(b))
            }
            _ => self.varint_slow(),
        }
    }

    #[inline(never)]
    fn varint_slow(&mut self) -> Result<u64, WireError> {
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(err("invalid varint"));
            };
            self.pos += 1;
            if i == 9 && b >= 0x02 {
                return Err(err("invalid varint"));
            }
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(value);
            }
        }
        Err(err("invalid varint"))
    }

    /// A field key: (field number, wire type).
    #[inline(always)]
    fn key(&mut self) -> Result<(u32, u8), WireError> {
        let key = self.varint()?;
        if key > u64::from(u32::MAX) {
            return Err(err("invalid key"));
        }
        let wire_type = (key & 7) as u8;
        if wire_type > FIXED32 {
            return Err(err("invalid wire type"));
        }
        let tag = (key as u32) >> 3;
        if tag == 0 {
            return Err(err("invalid tag 0"));
        }
        Ok((tag, wire_type))
    }

    #[inline(always)]
    fn take(&mut self, n: u64) -> Result<&'a [u8], WireError> {
        if n > (self.buf.len() - self.pos) as u64 {
            return Err(err("buffer underflow"));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    #[inline(always)]
    fn bytes(&mut self, wire_type: u8) -> Result<&'a [u8], WireError> {
        if wire_type != LEN {
            return Err(err("invalid wire type for a length-delimited field"));
        }
        let n = self.varint()?;
        self.take(n)
    }

    /// Skips an unknown field the way prost does (groups included, depth-limited).
    fn skip(&mut self, wire_type: u8, tag: u32, depth: u32) -> Result<(), WireError> {
        if depth == 0 {
            return Err(err("recursion limit reached"));
        }
        let n = match wire_type {
            VARINT => {
                self.varint()?;
                0
            }
            FIXED32 => 4,
            FIXED64 => 8,
            LEN => self.varint()?,
            START_GROUP => loop {
                let (inner_tag, inner_type) = self.key()?;
                if inner_type == END_GROUP {
                    if inner_tag != tag {
                        return Err(err("unexpected end group tag"));
                    }
                    break 0;
                }
                self.skip(inner_type, inner_tag, depth - 1)?;
            },
            _ => return Err(err("unexpected end group tag")),
        };
        self.take(n).map(|_| ())
    }
}

/// Enter a nested message: prost checks the limit, then decodes inside with one less.
fn nested(depth: u32) -> Result<u32, WireError> {
    if depth == 0 {
        return Err(err("recursion limit reached"));
    }
    Ok(depth - 1)
}

/// The `borrowed-decode` strategy: walks the protobuf in `raw`, no owned strings.
pub fn decode_borrowed(raw: &[u8]) -> Result<Batch<'_>, WireError> {
    let mut batch = Batch::default();
    decode_borrowed_into(raw, &mut batch)?;
    Ok(batch)
}

/// [`decode_borrowed`] into a (cleared) batch whose buffers are reused.
pub fn decode_borrowed_into<'a>(raw: &'a [u8], batch: &mut Batch<'a>) -> Result<(), WireError> {
    walk_request(raw, batch, false)
}

/// [`decode_borrowed_into`], but the label fields of a series whose labels are
/// contiguous are only stepped over (`labels_deferred`): a series cache that
/// finds the raw bytes never needs them parsed.
pub fn decode_borrowed_deferred_into<'a>(
    raw: &'a [u8],
    batch: &mut Batch<'a>,
) -> Result<(), WireError> {
    walk_request(raw, batch, true)
}

/// The labels of a deferred series, parsed as [`decode_borrowed`] would have.
pub fn parse_label_fields<'a>(
    raw_labels: &'a [u8],
    out: &mut Vec<(&'a [u8], &'a [u8])>,
) -> Result<(), WireError> {
    let start = out.len();
    if parse_labels_as_sent(raw_labels, out) {
        return Ok(());
    }
    out.truncate(start);
    parse_label_fields_fully(raw_labels, out)
}

/// Labels as senders write them — each label a field of one-byte length
/// holding its name field and then its value field, both of one-byte
/// length — read by their lengths alone (a series cache miss reads every
/// new series' labels).
/// `false` for any other shape, which [`parse_label_fields_fully`] reads.
#[inline]
fn parse_labels_as_sent<'a>(raw_labels: &'a [u8], out: &mut Vec<(&'a [u8], &'a [u8])>) -> bool {
    let mut rest = raw_labels;
    while let [0x0a, len, after @ ..] = rest {
        let len = *len as usize;
        if len >= 0x80 || after.len() < len {
            return false;
        }
        let (label, next) = after.split_at(len);
        let [0x0a, name_len, label @ ..] = label else {
            return false;
        };
        let name_len = *name_len as usize;
        if name_len >= 0x80 || label.len() < name_len {
            return false;
        }
        let (name, value_field) = label.split_at(name_len);
        // The value's one-byte length is the rest of the label exactly (under
        // 0x80, as the label's own length is).
        match value_field {
            [0x12, value_len, value @ ..] if *value_len as usize == value.len() => {
                out.push((name, value));
            }
            _ => return false,
        }
        rest = next;
    }
    rest.is_empty()
}

/// [`parse_label_fields`] for any encoding prost reads: the reference walk.
fn parse_label_fields_fully<'a>(
    raw_labels: &'a [u8],
    out: &mut Vec<(&'a [u8], &'a [u8])>,
) -> Result<(), WireError> {
    let mut r = Reader::new(raw_labels);
    // The depth inside a `Label` of a `TimeSeries` of the `WriteRequest`.
    let depth = RECURSION_LIMIT - 1;
    while !r.done() {
        let (tag, wire_type) = r.key()?;
        debug_assert_eq!(tag, 1, "a deferred span holds only label fields");
        let label = r.bytes(wire_type)?;
        out.push(walk_label(label, nested(depth)?)?);
    }
    Ok(())
}

fn walk_request<'a>(
    raw: &'a [u8],
    batch: &mut Batch<'a>,
    defer_labels: bool,
) -> Result<(), WireError> {
    // Room for the common shape (one sample, a few labels per ~64 bytes) up front.
    let series = raw.len() / 64;
    batch.series.reserve(series);
    batch.labels.reserve(series * 3);
    batch.samples.reserve(series);
    let batch = &mut *batch;
    let mut r = Reader::new(raw);
    let depth = RECURSION_LIMIT;
    while !r.done() {
        let (tag, wire_type) = r.key()?;
        match tag {
            1 => {
                let body = r.bytes(wire_type)?;
                walk_series(body, nested(depth)?, batch, defer_labels)?;
            }
            3 => {
                let body = r.bytes(wire_type)?;
                walk_metadata(body, nested(depth)?)?;
                batch.metadata += 1;
            }
            _ => r.skip(wire_type, tag, depth)?,
        }
    }
    Ok(())
}

#[inline]
fn walk_series<'a>(
    body: &'a [u8],
    depth: u32,
    batch: &mut Batch<'a>,
    defer_labels: bool,
) -> Result<(), WireError> {
    if defer_labels && walk_series_as_sent(body, batch) {
        return Ok(());
    }
    walk_series_fully(body, depth, batch, defer_labels)
}

/// The walk of any series (see [`walk_series_as_sent`] for the usual one).
fn walk_series_fully<'a>(
    body: &'a [u8],
    depth: u32,
    batch: &mut Batch<'a>,
    defer_labels: bool,
) -> Result<(), WireError> {
    let mut r = Reader::new(body);
    let l0 = batch.labels.len() as u32;
    let s0 = batch.samples.len() as u32;
    // The span of label fields, and whether anything else came between them.
    let mut label_span: Option<(usize, usize)> = None;
    let mut contiguous = true;
    while !r.done() {
        let field_start = r.pos;
        let (tag, wire_type) = r.key()?;
        match tag {
            1 => {
                let label = r.bytes(wire_type)?;
                let inner = nested(depth)?;
                if !defer_labels {
                    batch.labels.push(walk_label(label, inner)?);
                }
                label_span = match label_span {
                    None => Some((field_start, r.pos)),
                    Some((start, end)) => {
                        contiguous &= end == field_start;
                        Some((start, r.pos))
                    }
                };
            }
            2 => {
                let sample = r.bytes(wire_type)?;
                batch.samples.push(walk_sample(sample, nested(depth)?)?);
            }
            _ => r.skip(wire_type, tag, depth)?,
        }
    }
    let raw_labels = match label_span {
        Some((start, end)) if contiguous => Some(&body[start..end]),
        None => Some(&body[..0]),
        _ => None,
    };
    if defer_labels && raw_labels.is_none() {
        // Interleaved with other fields: no span to defer to, parse them now.
        let mut r = Reader::new(body);
        while !r.done() {
            let (tag, wire_type) = r.key()?;
            match tag {
                1 => {
                    let label = r.bytes(wire_type)?;
                    batch.labels.push(walk_label(label, nested(depth)?)?);
                }
                _ => r.skip(wire_type, tag, depth)?,
            }
        }
    }
    batch.series.push(SeriesSpan {
        labels: l0..batch.labels.len() as u32,
        samples: s0..batch.samples.len() as u32,
        raw_labels,
        labels_deferred: defer_labels && raw_labels.is_some(),
    });
    Ok(())
}

/// The series as senders write it, with deferred labels: label fields
/// (key `0x0a`, one-byte lengths), then sample fields (key `0x12`, one-byte
/// length) each holding exactly a double (`0x09`) then a timestamp varint
/// (`0x10`) ending the sample. Pushes what the full walk would and returns
/// true; for anything else (or a malformed series) pushes nothing and
/// returns false, and the full walk takes the series. Sender-shaped series
/// are the hot path: this does about a third of the full walk's work.
#[inline]
fn walk_series_as_sent<'a>(body: &'a [u8], batch: &mut Batch<'a>) -> bool {
    let mut pos = 0;
    while body.get(pos) == Some(&0x0a) {
        match body.get(pos + 1) {
            Some(&len) if len < 0x80 => pos += 2 + len as usize,
            _ => return false,
        }
    }
    if pos > body.len() {
        return false;
    }
    let labels_end = pos;
    let s0 = batch.samples.len();
    while pos < body.len() {
        let sample = match (body[pos], body.get(pos + 1)) {
            (0x12, Some(&len)) if (11..0x80).contains(&len) => {
                body.get(pos + 2..pos + 2 + len as usize)
            }
            _ => None,
        };
        let Some(sample) = sample.filter(|s| s[0] == 0x09 && s[9] == 0x10) else {
            batch.samples.truncate(s0);
            return false;
        };
        let Some(timestamp) = varint_exact(&sample[10..]) else {
            batch.samples.truncate(s0);
            return false;
        };
        let value = f64::from_le_bytes(sample[1..9].try_into().expect("8 bytes"));
        batch.samples.push(Sample {
            value,
            timestamp: timestamp as i64,
        });
        pos += 2 + sample.len();
    }
    let l0 = batch.labels.len() as u32;
    batch.series.push(SeriesSpan {
        labels: l0..l0,
        samples: s0 as u32..batch.samples.len() as u32,
        raw_labels: Some(&body[..labels_end]),
        labels_deferred: true,
    });
    true
}

/// `bytes` as one varint that ends exactly at its end, valid as
/// [`Reader::varint`] reads one (at most 10 bytes; the tenth carries only the top bit).
#[inline]
fn varint_exact(bytes: &[u8]) -> Option<u64> {
    let (&last, init) = bytes.split_last()?;
    if last >= 0x80 || bytes.len() > 10 || (bytes.len() == 10 && last >= 0x02) {
        return None;
    }
    let mut value = 0u64;
    let mut continued = 0x80;
    for (i, &b) in init.iter().enumerate() {
        continued &= b;
        value |= u64::from(b & 0x7f) << (7 * i);
    }
    (continued != 0).then_some(value | u64::from(last) << (7 * init.len()))
}

#[inline]
fn walk_label(body: &[u8], depth: u32) -> Result<(&[u8], &[u8]), WireError> {
    let mut r = Reader::new(body);
    let (mut name, mut value): (&[u8], &[u8]) = (b"", b"");
    while !r.done() {
        let (tag, wire_type) = r.key()?;
        match tag {
            1 => name = r.bytes(wire_type)?,
            2 => value = r.bytes(wire_type)?,
            _ => r.skip(wire_type, tag, depth)?,
        }
    }
    Ok((name, value))
}

#[inline]
fn walk_sample(body: &[u8], depth: u32) -> Result<Sample, WireError> {
    let mut r = Reader::new(body);
    let mut sample = Sample {
        value: 0.0,
        timestamp: 0,
    };
    while !r.done() {
        let (tag, wire_type) = r.key()?;
        match tag {
            1 => {
                if wire_type != FIXED64 {
                    return Err(err("invalid wire type for a double"));
                }
                let b = r.take(8)?;
                sample.value = f64::from_le_bytes(b.try_into().expect("8 bytes"));
            }
            2 => {
                if wire_type != VARINT {
                    return Err(err("invalid wire type for an int64"));
                }
                sample.timestamp = r.varint()? as i64;
            }
            _ => r.skip(wire_type, tag, depth)?,
        }
    }
    Ok(sample)
}

fn walk_metadata(body: &[u8], depth: u32) -> Result<(), WireError> {
    let mut r = Reader::new(body);
    while !r.done() {
        let (tag, wire_type) = r.key()?;
        match tag {
            1 => {
                if wire_type != VARINT {
                    return Err(err("invalid wire type for an enum"));
                }
                r.varint()?;
            }
            2 | 4 | 5 => {
                let s = r.bytes(wire_type)?;
                std::str::from_utf8(s)
                    .map_err(|_| err("invalid string value: data is not UTF-8 encoded"))?;
            }
            _ => r.skip(wire_type, tag, depth)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::wire::{put_varint, Label, TimeSeries};
    use prost::Message;

    /// A length-delimited field: its one-byte key, its length as a varint, `body`.
    fn length_delimited(key: u8, body: &[u8]) -> Vec<u8> {
        let mut f = vec![key];
        put_varint(&mut f, body.len() as u64);
        f.extend_from_slice(body);
        f
    }

    /// One field of a series body, for the sender-shape walk's property test.
    fn series_field() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let varint = |v: u64, pad: usize| {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            if pad > 0 {
                // Non-minimal: extra 0x80 continuation groups before a final 0.
                *out.last_mut().unwrap() |= 0x80;
                out.extend(std::iter::repeat_n(0x80, pad - 1));
                out.push(0);
            }
            out
        };
        prop_oneof![
            // A label field, short or with a two-byte length.
            prop::collection::vec(any::<u8>(), 0..140).prop_map(|b| length_delimited(0x0a, &b)),
            // A sample: value, timestamp (padded or not), in either order, or one missing.
            (any::<f64>(), any::<i64>(), 0usize..5, 0u8..4).prop_map(move |(v, t, pad, shape)| {
                let value: Vec<u8> = [&[0x09][..], &v.to_le_bytes()].concat();
                let ts: Vec<u8> = [&[0x10][..], &varint(t as u64, pad)].concat();
                let body = match shape {
                    0 | 1 => [value, ts].concat(),
                    2 => [ts, value].concat(),
                    _ => value,
                };
                length_delimited(0x12, &body)
            }),
            // Anything else: an unknown varint field, or bytes.
            (3u8..20, any::<u64>()).prop_map(move |(tag, v)| {
                let mut f = Vec::new();
                put_varint(&mut f, u64::from(tag) << 3);
                put_varint(&mut f, v);
                f
            }),
            prop::collection::vec(any::<u8>(), 1..4),
        ]
    }

    /// prost's encoding of a series is the sender shape, a negative
    /// timestamp's ten-byte varint included (a zero one is left out by prost,
    /// and such a sample takes the full walk).
    #[test]
    fn prost_series_take_the_sender_shape_walk() {
        for timestamp in [1, 1_700_000_000_123, -1] {
            let series = TimeSeries {
                labels: vec![Label {
                    name: "__name__".into(),
                    value: "up".into(),
                }],
                samples: vec![
                    Sample {
                        value: 1.5,
                        timestamp,
                    };
                    2
                ],
            };
            let body = series.encode_to_vec();
            let mut batch = Batch::default();
            assert!(walk_series_as_sent(&body, &mut batch), "{timestamp}");
            assert_eq!(batch.samples[1].timestamp, timestamp);
        }
    }

    /// One label field of a series, for the sender-shape label parse's
    /// property test, holding a name and a value field (either possibly
    /// missing, repeated, swapped or of a two-byte length) or a few stray bytes.
    fn label_field() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let field = |key: u8| {
            prop::collection::vec(any::<u8>(), 0..130).prop_map(move |b| length_delimited(key, &b))
        };
        let label_body = prop_oneof![
            (field(0x0a), field(0x12)).prop_map(|(n, v)| [n, v].concat()),
            (field(0x12), field(0x0a)).prop_map(|(v, n)| [v, n].concat()),
            field(0x0a),
            prop::collection::vec(field(0x0a), 0..3).prop_map(|f| f.concat()),
            prop::collection::vec(any::<u8>(), 0..4),
        ];
        // A deferred span holds only label fields (tag 1).
        label_body.prop_map(|b| length_delimited(0x0a, &b))
    }

    /// prost's encoding of labels (as senders write them) takes the
    /// sender-shape parse; an empty value (left out by prost) does not.
    #[test]
    fn prost_labels_take_the_sender_shape_parse() {
        let series = |value: &str| TimeSeries {
            labels: vec![
                Label {
                    name: "__name__".into(),
                    value: "up".into(),
                },
                Label {
                    name: "job".into(),
                    value: value.into(),
                },
            ],
            samples: vec![],
        };
        let mut labels = Vec::new();
        let body = series("x").encode_to_vec();
        assert!(parse_labels_as_sent(&body, &mut labels));
        assert_eq!(labels, [(&b"__name__"[..], &b"up"[..]), (b"job", b"x")]);
        labels.clear();
        assert!(!parse_labels_as_sent(
            &series("").encode_to_vec(),
            &mut labels
        ));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Whatever label bytes it is given, the sender-shape parse declines
        /// or gives exactly the labels of the full walk.
        #[test]
        fn the_sender_shape_label_parse_is_the_full_walk(
            fields in proptest::collection::vec(label_field(), 0..5),
            cut in proptest::option::of(0usize..300),
        ) {
            let mut raw = fields.concat();
            if let Some(cut) = cut {
                raw.truncate(cut);
            }
            let mut fast = Vec::new();
            let mut full = Vec::new();
            let full_result = parse_label_fields_fully(&raw, &mut full);
            if parse_labels_as_sent(&raw, &mut fast) {
                proptest::prop_assert!(full_result.is_ok());
                proptest::prop_assert_eq!(&fast, &full);
            }
            let mut both = Vec::new();
            proptest::prop_assert_eq!(
                parse_label_fields(&raw, &mut both).map_err(|e| e.to_string()),
                full_result.map_err(|e| e.to_string())
            );
            proptest::prop_assert_eq!(both, full);
        }

        /// Whatever series body it is given, the sender-shape walk pushes
        /// nothing and declines, or pushes exactly what the full walk does.
        #[test]
        fn the_sender_shape_walk_is_the_full_walk(
            fields in proptest::collection::vec(series_field(), 0..6),
            cut in proptest::option::of(0usize..200),
        ) {
            let mut body = fields.concat();
            if let Some(cut) = cut {
                body.truncate(cut);
            }
            let mut fast = Batch::default();
            if walk_series_as_sent(&body, &mut fast) {
                let mut full = Batch::default();
                proptest::prop_assert!(walk_series_fully(&body, 99, &mut full, true).is_ok());
                // Debug, not ==: a NaN value is the same bits in both.
                proptest::prop_assert_eq!(format!("{fast:?}"), format!("{full:?}"));
            } else {
                proptest::prop_assert_eq!(fast, Batch::default());
            }
        }
    }
}
