//! Remote-write request bodies for the ingest tests.

use promlab::ingest::wire::{self, Label, Sample, TimeSeries, WriteRequest};
use prost::Message;

/// A snappy-compressed `WriteRequest`: per (group, timestamp, value), one
/// series `data{label_0="group"}` with that one sample.
pub fn body(samples: &[(&str, i64, f64)]) -> Vec<u8> {
    let req = WriteRequest {
        timeseries: samples
            .iter()
            .map(|&(group, timestamp, value)| TimeSeries {
                labels: vec![
                    Label {
                        name: "__name__".into(),
                        value: "data".into(),
                    },
                    Label {
                        name: "label_0".into(),
                        value: group.into(),
                    },
                ],
                samples: vec![Sample { value, timestamp }],
            })
            .collect(),
        metadata: vec![],
    };
    wire::compress(&req.encode_to_vec())
}
