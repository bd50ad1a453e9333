//! VictoriaMetrics single-node (Debian's `victoria-metrics`), as the ingest
//! peer: the same paced feed into its Prometheus remote-write endpoint.

use super::remote_write::{FeedPlan, Receiver, ReceiverSpec};
use anyhow::Result;
use std::path::Path;

fn args(port: u16, workdir: &Path) -> Result<Vec<String>> {
    Ok(vec![
        format!("-httpListenAddr=127.0.0.1:{port}"),
        format!("-storageDataPath={}", workdir.join("data").display()),
        // Fresh samples are searchable at once (default: 30 s behind), and no
        // response cache can hide them.
        "-search.latencyOffset=0s".into(),
        "-search.disableCache".into(),
        "-loggerLevel=WARN".into(),
    ])
}

pub const SPEC: ReceiverSpec = ReceiverSpec {
    arm: "peer:victoriametrics",
    binary: "victoria-metrics",
    install: "apt-get install -y victoria-metrics",
    args,
    ready_path: "/health",
    // It stores a value as decimal mantissa × 10^exponent, rounding once the
    // fraction is under 1e-12 of the mantissa (its lib/decimal conversionPrecision).
    stored_tolerance: 2e-12,
    note: "VictoriaMetrics 1.79 single-node: buffers then merges raw samples into compressed on-disk parts, indexes every series, answers exact quantiles from raw samples",
};

/// `peer:victoriametrics`; `plan` overrides the feed chosen by size.
pub fn peer(plan: Option<FeedPlan>) -> Receiver {
    Receiver { spec: &SPEC, plan }
}
