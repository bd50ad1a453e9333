//! Prometheus 2.42's own remote-write receiver (Debian's `prometheus`), as the
//! ingest peer: the same paced feed, its CPU per sample, its exact quantiles.

use super::remote_write::{self, FeedPlan, ReceiverSpec};
use super::{Peer, PeerContext, PeerOutcome};
use anyhow::Result;
use std::path::Path;

/// `peer:prometheus`; `plan` overrides the feed chosen by size (tests feed seconds, not minutes).
#[derive(Default)]
pub struct Prometheus {
    pub plan: Option<FeedPlan>,
}

/// No scrape targets, no rules: only what the remote-write receiver brings.
const CONFIG: &str = "global:\n  scrape_interval: 1m\nscrape_configs: []\n";

fn args(port: u16, workdir: &Path) -> Result<Vec<String>> {
    let config = workdir.join("prometheus.yml");
    std::fs::write(&config, CONFIG)?;
    Ok(vec![
        format!("--config.file={}", config.display()),
        format!("--storage.tsdb.path={}", workdir.join("data").display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
        "--web.enable-remote-write-receiver".into(),
    ])
}

pub const SPEC: ReceiverSpec = ReceiverSpec {
    arm: "peer:prometheus",
    binary: "prometheus",
    install: "apt-get install -y prometheus",
    args,
    ready_path: "/-/ready",
    // Its TSDB keeps float64 samples losslessly (Gorilla XOR chunks).
    stored_tolerance: 0.0,
    note: "Prometheus 2.42 TSDB: appends every raw sample to a WAL and compressed in-memory chunks, indexes every series, answers exact quantiles from raw samples",
};

impl Peer for Prometheus {
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
