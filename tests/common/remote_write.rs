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

/// A snappy-compressed `WriteRequest`: per (group, instance, timestamp,
/// value), one series `data{instance="instance",label_0="group"}` with that
/// one sample (series of one group told apart by their instance).
#[allow(dead_code)] // not every test crate that includes this module uses it
pub fn body_of_instances(samples: &[(&str, &str, i64, f64)]) -> Vec<u8> {
    let label = |name: &str, value: &str| Label {
        name: name.into(),
        value: value.into(),
    };
    let req = WriteRequest {
        timeseries: samples
            .iter()
            .map(|&(group, instance, timestamp, value)| TimeSeries {
                labels: vec![
                    label("__name__", "data"),
                    label("instance", instance),
                    label("label_0", group),
                ],
                samples: vec![Sample { value, timestamp }],
            })
            .collect(),
        metadata: vec![],
    };
    wire::compress(&req.encode_to_vec())
}
