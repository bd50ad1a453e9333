//! VictoriaMetrics single-node (Debian's `victoria-metrics`), as the ingest
//! peer: the same paced feed into its Prometheus remote-write endpoint.

use super::remote_write::{self, FeedPlan, ReceiverSpec};
use super::{Peer, PeerContext, PeerOutcome};
use anyhow::Result;
use std::path::Path;

/// `peer:victoriametrics`; `plan` overrides the feed chosen by size.
#[derive(Default)]
pub struct VictoriaMetrics {
    pub plan: Option<FeedPlan>,
}

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

impl Peer for VictoriaMetrics {
    fn arm(&self) -> &'static str {
        SPEC.arm
    }

    fn runs(&self, scenario: &str) -> bool {
        scenario == "asap-1e5"
    }

    fn run(&self, cx: &PeerContext<'_>) -> Result<PeerOutcome> {
        let plan = self
            .plan
            .unwrap_or_else(|| FeedPlan::for_size(cx.quick, cx.repeats));
        remote_write::measure(cx, &SPEC, plan)
    }
}
