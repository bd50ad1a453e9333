//! Prometheus 2.42's own remote-write receiver (Debian's `prometheus`), as the
//! ingest peer: the same paced feed, its CPU per sample, its exact quantiles.

use super::remote_write::{FeedPlan, Receiver, ReceiverSpec};
use anyhow::Result;
use std::path::Path;

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

/// `peer:prometheus`; `plan` overrides the feed chosen by size.
pub fn peer(plan: Option<FeedPlan>) -> Receiver {
    Receiver { spec: &SPEC, plan }
}
