//! The ingest floor ([`IngestFloor`]): decode, walk, find each series' sketch, add, answer.

use anyhow::{bail, Context, Result};
use promlab::ingest::bulk_sketch::BulkSketch;
use promlab::ingest::wire;
use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::hint::black_box;

/// Ingest: per request, snappy decode and a zero-copy walk of the protobuf;
/// per series, its sketch found from its label bytes (as they came) as
/// `series-cache` finds them — one compare with the series after the last one
/// found, a hash only when that misses — the labels themselves read only the
/// first time a series is seen, to match the metric name and take the group's
/// label value; per sample, one sketch add (a group's values of a request in
/// one slice, for the groups the request has); then the answer: every group's
/// quantiles from its sketch, written as text with its label value and count.
/// No windows, no validation, no canonical series key: what is left is the
/// decoding, the lookup, the arithmetic and the answer no receiver can skip.
/// It visits only the groups a request has (not every group's sketch after
/// every request), and answers every group, as every arm does.
pub struct IngestFloor {
    metric: Vec<u8>,
    group_label: Vec<u8>,
    /// A new group's sketch, cloned: `BulkSketch::new` takes a logarithm,
    /// which the compiler hoisted to the top of the per-series walk (one
    /// `ln` per series, where the receiver takes one per pane).
    empty: BulkSketch,
    quantiles: Vec<f64>,
    raw: Vec<u8>,
    /// The last run's answer.
    answer: Vec<u8>,
}

type BytesMap<V> = HashMap<Box<[u8]>, V, foldhash::fast::RandomState>;

/// One run's state: the series seen, in order of first sight, each with its
/// group's sketch (`None`: not the metric); per sketch the request's values,
/// added in one slice per request.
#[derive(Default)]
struct IngestState {
    /// Every series' label bytes, back to back (one buffer, as the series
    /// cache keeps them: no allocation per series).
    labels: Vec<u8>,
    /// Per series: where its label bytes are in `labels`, and its sketch.
    series: Vec<(std::ops::Range<usize>, Option<usize>)>,
    /// Label bytes (by hash) → (hash, index in `series`), for when the
    /// guess misses. The hash is kept, as the series cache keeps it, so the
    /// table grows without hashing every series again.
    index: hashbrown::HashTable<(u64, usize)>,
    hasher: foldhash::fast::RandomState,
    /// The series tried first: the one after the last found. Senders repeat
    /// their series in the same order, so this is one compare and no hash —
    /// what `series-cache` does, and no receiver needs less.
    next_guess: usize,
    groups: BytesMap<usize>,
    /// Every group's label value, back to back, in sketch order, ending at
    /// `group_ends`.
    group_values: Vec<u8>,
    group_ends: Vec<usize>,
    sketches: Vec<BulkSketch>,
    pending: Vec<Vec<f64>>,
    /// The sketches the request being walked has values for.
    touched: Vec<usize>,
    /// The sketch of the group a series was last first seen in.
    last_group: Option<usize>,
}

impl IngestState {
    /// The sketch of the series with label bytes `key`, if it was seen; else
    /// the key's hash, for [`IngestState::insert`].
    #[inline]
    fn lookup(&mut self, key: &[u8]) -> Result<Option<usize>, u64> {
        let i = match self.series.get(self.next_guess) {
            Some((guess, _)) if self.labels[guess.clone()] == *key => self.next_guess,
            _ => {
                let hash = self.hasher.hash_one(key);
                let (labels, series) = (&self.labels, &self.series);
                self.index
                    .find(hash, |&(h, i)| {
                        h == hash && labels[series[i].0.clone()] == *key
                    })
                    .ok_or(hash)?
                    .1
            }
        };
        self.next_guess = i + 1;
        Ok(self.series[i].1)
    }

    /// A value for sketch `i` (non-finite values are left out, as the
    /// receiver leaves them out), added with the request's others.
    #[inline]
    fn add(&mut self, i: usize, value: f64) {
        if value.is_finite() {
            if self.pending[i].is_empty() {
                self.touched.push(i);
            }
            self.pending[i].push(value);
        }
    }

    /// Sketch `i`'s group label value.
    fn group_value(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.group_ends[i - 1] };
        &self.group_values[start..self.group_ends[i]]
    }

    fn insert(&mut self, key: &[u8], hash: u64, sketch: Option<usize>) {
        let start = self.labels.len();
        self.labels.extend_from_slice(key);
        self.series.push((start..self.labels.len(), sketch));
        self.index
            .insert_unique(hash, (hash, self.series.len() - 1), |&(h, _)| h);
        self.next_guess = self.series.len();
    }
}

/// A sample's value. Senders write `value` (field 1) then `timestamp` (field
/// 2, one varint): that layout is read in place; any other is walked field by
/// field (a repeated field's last value wins, as in protobuf).
#[inline]
fn sample_value(sample: &[u8]) -> Result<f64> {
    if let Some(value) = value_as_sent(sample) {
        return Ok(value);
    }
    let mut value = 0.0;
    let mut fields = Fields::new(sample);
    while let Some((f, b)) = fields.next_field()? {
        if f == 1 && b.len() == 8 {
            value = f64::from_le_bytes(b.try_into().expect("8 bytes"));
        }
    }
    Ok(value)
}

/// The value of a sample laid out as senders write it (a double, then at
/// most one timestamp varint ending the sample); `None` for any other layout.
#[inline]
fn value_as_sent(sample: &[u8]) -> Option<f64> {
    let [0x09, rest @ ..] = sample else {
        return None;
    };
    let (value, after) = rest.split_first_chunk::<8>()?;
    let one_timestamp = match after {
        [] => true,
        [0x10, varint @ .., last] => *last < 0x80 && varint.iter().all(|&b| b >= 0x80),
        _ => false,
    };
    one_timestamp.then(|| f64::from_le_bytes(*value))
}

impl IngestFloor {
    /// For a plan's first aggregation (its metric, its first group-by label).
    pub fn new(plan: &promlab::ingest::plan::Plan) -> Result<IngestFloor> {
        let agg = plan
            .aggregations
            .first()
            .context("the plan has no aggregation")?;
        Ok(IngestFloor {
            metric: agg.metric.as_bytes().to_vec(),
            group_label: agg
                .group_by
                .first()
                .cloned()
                .unwrap_or_default()
                .into_bytes(),
            empty: BulkSketch::new(agg.sketch_config()),
            quantiles: agg.quantiles.clone(),
            raw: Vec::new(),
            answer: Vec::new(),
        })
    }

    /// The last run's answer: per group, its label value, count and quantiles.
    pub fn answer(&self) -> &[u8] {
        &self.answer
    }

    /// Every body through the floor into fresh sketches; returns the samples walked.
    pub fn run(&mut self, bodies: &[Vec<u8>]) -> Result<u64> {
        self.run_bodies(bodies.iter().map(Vec::as_slice))
    }

    /// `bodies` through the floor into fresh sketches: one of N floors
    /// walking its share of a workload on N cores. Returns the samples walked.
    pub fn run_bodies<'b>(&mut self, bodies: impl Iterator<Item = &'b [u8]>) -> Result<u64> {
        let mut state = IngestState::default();
        let mut samples = 0;
        // Decompressed into a buffer kept at its largest, as the receiver
        // does (zeroing it for every request was ~8 % of the floor).
        let mut buf = std::mem::take(&mut self.raw);
        for body in bodies {
            let raw = wire::decompress_reusing(body, 64 << 20, &mut buf)?;
            let mut request = Fields::new(raw);
            while let Some((field, series)) = request.next_field()? {
                if field == 1 {
                    samples += self.series(series, &mut state)?;
                }
            }
            for &i in &state.touched {
                state.sketches[i].add_slice(&state.pending[i]);
                state.pending[i].clear();
            }
            state.touched.clear();
        }
        self.raw = buf;
        self.write_answer(&state);
        Ok(samples)
    }

    /// Every group's label value, count and quantiles, a line each.
    fn write_answer(&mut self, state: &IngestState) {
        let (out, mut values) = (&mut self.answer, Vec::with_capacity(self.quantiles.len()));
        out.clear();
        let mut floats = ryu::Buffer::new();
        let mut start = 0;
        for (sketch, &end) in state.sketches.iter().zip(&state.group_ends) {
            out.extend_from_slice(&state.group_values[start..end]);
            start = end;
            out.push(b' ');
            out.extend_from_slice(itoa::Buffer::new().format(sketch.count()).as_bytes());
            values.clear();
            sketch.quantiles_into(&self.quantiles, &mut values);
            for &v in &values {
                out.push(b' ');
                out.extend_from_slice(floats.format(v).as_bytes());
            }
            out.push(b'\n');
        }
        black_box(&out);
    }

    fn series(&self, series: &[u8], state: &mut IngestState) -> Result<u64> {
        if let Some(samples) = self.series_as_sent(series, state)? {
            return Ok(samples);
        }
        // The labels' bytes: from the first label field to the end of the last.
        let mut labels = (usize::MAX, 0);
        let mut sketch = None;
        let mut samples = 0;
        let mut fields = Fields::new(series);
        loop {
            let at = fields.at;
            let Some((field, bytes)) = fields.next_field()? else {
                break;
            };
            match field {
                1 => labels = (labels.0.min(at), fields.at),
                2 => {
                    if samples == 0 {
                        let key = series.get(labels.0..labels.1).unwrap_or_default();
                        sketch = self.sketch_of(key, state)?;
                    }
                    samples += 1;
                    // A series no aggregation takes: its samples are counted, not read.
                    let Some(i) = sketch else { continue };
                    state.add(i, sample_value(bytes)?);
                }
                _ => {}
            }
        }
        Ok(samples)
    }

    /// A series as senders write it — label fields with one-byte lengths,
    /// then samples of one-byte length each a value and one timestamp — its
    /// labels found by their lengths alone and each value read in place, as
    /// `borrowed-decode` walks it (a floor walking every field would do more
    /// than that arm); `None` for any other shape, which
    /// [`IngestFloor::series`] walks.
    #[inline]
    fn series_as_sent(&self, series: &[u8], state: &mut IngestState) -> Result<Option<u64>> {
        let mut pos = 0;
        while series.get(pos) == Some(&0x0a) {
            match series.get(pos + 1) {
                Some(&len) if len < 0x80 => pos += 2 + len as usize,
                _ => return Ok(None),
            }
        }
        let Some(labels) = series.get(..pos) else {
            return Ok(None);
        };
        let sample_at = |at: usize| match (series.get(at), series.get(at + 1)) {
            (Some(0x12), Some(&len)) if len < 0x80 => {
                let sample = series.get(at + 2..at + 2 + len as usize)?;
                value_as_sent(sample).map(|value| (value, at + 2 + len as usize))
            }
            _ => None,
        };
        // The shape first, then the work: nothing is added from a series
        // the full walk then takes.
        let (mut at, mut samples) = (pos, 0);
        while at < series.len() {
            let Some((_, next)) = sample_at(at) else {
                return Ok(None);
            };
            (at, samples) = (next, samples + 1);
        }
        if samples == 0 {
            return Ok(Some(0));
        }
        let Some(i) = self.sketch_of(labels, state)? else {
            return Ok(Some(samples));
        };
        let mut at = pos;
        while let Some((value, next)) = sample_at(at) {
            state.add(i, value);
            at = next;
        }
        Ok(Some(samples))
    }

    /// The sketch of the series with label bytes `key` (`None`: not the
    /// aggregation's metric), found or, the first time, made.
    #[inline]
    fn sketch_of(&self, key: &[u8], state: &mut IngestState) -> Result<Option<usize>> {
        Ok(match state.lookup(key) {
            Ok(found) => found,
            Err(hash) => {
                let found = self.first_sight(key, state)?;
                state.insert(key, hash, found);
                found
            }
        })
    }

    /// A series seen for the first time: its labels read and checked, its
    /// group's sketch found or made (`None` when it is not the aggregation's
    /// metric). The receiver refuses a request holding a series Prometheus
    /// would refuse (a name that is not a label name, a value that is not
    /// UTF-8, names unsorted or repeated, no `__name__`), so each series is
    /// checked once, the first time, in the walk that reads it: the check is
    /// the contract's, not overhead.
    fn first_sight(&self, labels: &[u8], state: &mut IngestState) -> Result<Option<usize>> {
        let (mut matches, mut named, mut group): (bool, bool, &[u8]) = (false, false, b"");
        let mut previous: Option<&[u8]> = None;
        let mut fields = Fields::new(labels);
        while let Some((_, bytes)) = fields.next_field()? {
            let (mut name, mut value): (&[u8], &[u8]) = (b"", b"");
            let mut label = Fields::new(bytes);
            while let Some((f, b)) = label.next_field()? {
                match f {
                    1 => name = b,
                    2 => value = b,
                    _ => {}
                }
            }
            if !label_is_valid(previous, name, value) {
                bail!(
                    "invalid series: label `{}`",
                    String::from_utf8_lossy(name).escape_debug()
                );
            }
            previous = Some(name);
            if name == b"__name__" {
                named = !value.is_empty();
                matches = value == self.metric.as_slice();
            } else if name == self.group_label.as_slice() {
                group = value;
            }
        }
        if !named {
            bail!("invalid series: no `__name__` label");
        }
        if !matches {
            return Ok(None);
        }
        // The group of the series first seen before, as the receiver's
        // `series-cache` tries it (a sender sends a group's series together):
        // one compare, no hash.
        if let Some(i) = state.last_group.filter(|&i| state.group_value(i) == group) {
            return Ok(Some(i));
        }
        let i = match state.groups.get(group) {
            Some(&i) => i,
            None => {
                state.sketches.push(self.empty.clone());
                state.pending.push(Vec::new());
                state.group_values.extend_from_slice(group);
                state.group_ends.push(state.group_values.len());
                state.groups.insert(group.into(), state.sketches.len() - 1);
                state.sketches.len() - 1
            }
        };
        state.last_group = Some(i);
        Ok(Some(i))
    }
}

/// A label as Prometheus takes it, after the label `previous`: a valid name
/// sorted after the one before, and a UTF-8 value (ASCII, the usual, in one
/// pass).
#[inline]
fn label_is_valid(previous: Option<&[u8]>, name: &[u8], value: &[u8]) -> bool {
    previous.is_none_or(|p| p < name)
        && promlab::format::registry::is_label_name(name)
        && (value.is_ascii() || std::str::from_utf8(value).is_ok())
}

/// A protobuf message's fields: (number, payload) for length-delimited and
/// 64-bit fields, varints and 32-bit fields skipped (payload empty).
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8]) -> Fields<'a> {
        Fields { bytes, at: 0 }
    }

    /// One byte inline (keys, lengths), longer ones out of line — as the
    /// receiver's own reader (`wire`) does.
    #[inline(always)]
    fn varint(&mut self) -> Result<u64> {
        match self.bytes.get(self.at) {
            Some(&b) if b < 0x80 => {
                self.at += 1;
                Ok(u64::from(b))
            }
            _ => self.varint_long(),
        }
    }

    #[inline(never)]
    fn varint_long(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.bytes.get(self.at) else {
                bail!("truncated varint")
            };
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        bail!("varint too long")
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            bail!("truncated field")
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    #[inline]
    fn next_field(&mut self) -> Result<Option<(u64, &'a [u8])>> {
        if self.at >= self.bytes.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let payload = match key & 7 {
            0 => {
                self.varint()?;
                &[][..]
            }
            1 => self.take(8)?,
            2 => {
                let n = self.varint()? as usize;
                self.take(n)?
            }
            5 => {
                self.take(4)?;
                &[][..]
            }
            wire_type => bail!("wire type {wire_type}"),
        };
        Ok(Some((key >> 3, payload)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_value_reads_the_usual_layout_in_place_and_any_other_as_protobuf() {
        use prost::Message;
        let encode = |value: f64, timestamp: i64| {
            promlab::ingest::wire::Sample { value, timestamp }.encode_to_vec()
        };
        for (value, timestamp) in [(1.5, 1_700_000_000_000), (-2.5, 0), (f64::MAX, -1)] {
            let bytes = encode(value, timestamp);
            assert_eq!(sample_value(&bytes).unwrap().to_bits(), value.to_bits());
        }
        // A repeated value field: the last one wins, as in protobuf.
        let mut repeated = encode(1.0, 5);
        repeated.push(0x09);
        repeated.extend_from_slice(&2.0f64.to_le_bytes());
        assert_eq!(sample_value(&repeated).unwrap(), 2.0);
        // No value field: protobuf's default, 0.
        assert_eq!(sample_value(&encode(0.0, 9)).unwrap(), 0.0);
        assert!(sample_value(&[0x09, 1, 2]).is_err());
    }

    #[test]
    fn ingest_floor_walks_every_sample_of_the_feeder() {
        let workload = promlab::ingest::feed::FeedWorkload {
            groups: 3,
            series_per_group: 4,
            ..promlab::ingest::feed::FeedWorkload::seed(1_700_000_000_000)
        };
        let generator = workload.generator();
        let bodies: Vec<Vec<u8>> = (0..2).flat_map(|t| generator.tick_bodies(t)).collect();
        let mut floor = IngestFloor::new(&promlab::ingest::plan::Plan::default()).unwrap();
        assert_eq!(floor.run(&bodies).unwrap(), workload.samples_per_tick() * 2);
        assert!(floor.run(&[b"\x05garbage".to_vec()]).is_err());
    }

    #[test]
    fn ingest_floor_refuses_the_series_the_receiver_refuses() {
        let plan = promlab::ingest::plan::Plan::default();
        let agg = &plan.aggregations[0];
        let body = |labels: &[(&[u8], &[u8])]| {
            let mut encoded = Vec::new();
            for &(name, value) in labels {
                wire::put_label(&mut encoded, name, value);
            }
            let mut raw = Vec::new();
            wire::put_series_one_sample(&mut raw, &encoded, 1.5, 1_700_000_000_000);
            wire::compress(&raw)
        };
        let (metric, group) = (agg.metric.as_bytes(), agg.group_by[0].as_bytes());
        let cases: [&[(&[u8], &[u8])]; 8] = [
            &[(b"__name__", metric), (group, b"a")],
            &[(b"__name__", metric), (group, "é".as_bytes())],
            &[(b"__name__", b"other"), (b"job", b"x")],
            &[(b"__name__", metric), (group, b"\xc3x")],
            &[(group, b"a"), (b"__name__", metric)],
            &[(b"__name__", metric), (group, b"a"), (group, b"b")],
            &[(b"__name__", metric), (b"0bad", b"a")],
            &[(group, b"a")],
        ];
        // The first three are valid, the rest each break one rule.
        for (i, labels) in cases.into_iter().enumerate() {
            let body = body(labels);
            let mut receiver = promlab::ingest::pipeline::Ingester::new(
                plan.clone(),
                promlab::shared::strategy::StrategySet::all(),
            );
            let refused = receiver.handle(&body).is_err();
            assert_eq!(refused, i >= 3, "case {i}");
            let mut floor = IngestFloor::new(&plan).unwrap();
            assert_eq!(floor.run(&[body]).is_err(), refused, "case {i}");
        }
    }
}
