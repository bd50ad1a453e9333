//! Each stage's floor: the least work its contract allows, run as one more arm
//! of the ablation, interleaved with the others on the same input, so every
//! arm's `ratio_to_floor` says how far it is from the limit on this machine.
//!
//! - write: the `flock` pair client_ruby's protocol holds around every
//!   observe and increment, alone ([`WriteFloor`]);
//! - export: one pass reading every store file's used region through a
//!   mapping (what a sidecar cannot avoid reading), plus writing the
//!   exposition as the render floor writes it: its text copied, each value
//!   formatted ([`ExportFloor`]). Until issue 26 it copied the exposition
//!   whole, values included: a scrape whose values change cannot, so every
//!   exporter's ratio counted formatting as overhead (a quarter of `all`'s
//!   seed-repro scrape). Also until issue 26 it made no syscall, where
//!   every scrape that must see a file created before it began makes one
//!   (`ListingCheck`): on this machine a cold syscall is several
//!   microseconds, and a folded 504-file store's `all` measured 1.97–2.14×
//!   its floor with 64 MiB flushed before each scrape, 1.44–1.48× against
//!   the floor with its read (`cold_scrape`, same process). And until
//!   issue 26 it read its mappings unguarded, where a reader of files other
//!   processes may truncate needs a `SIGBUS` guard to live through one (an
//!   exporter's `mapguard`): 2 ns a file here, so `all` measured 1.19× of
//!   the floor on many-metrics' 400 one-entry files (Zen 4) and 1.04–1.08×
//!   once the floor paid it too;
//! - render: prerendered lines copied, each value formatted (`itoa` for
//!   integers and integral floats, `ryu` for the others) ([`RenderFloor`]);
//! - ingest: snappy decode, a zero-copy protobuf walk, finding each series'
//!   group sketch with no more work than `series-cache` does (one compare of
//!   its label bytes with the series the sender sent next last time; a hash
//!   only when that misses; the labels read only when a series is first
//!   seen) and one sketch add per sample (the request's values of a group
//!   added as one slice) ([`IngestFloor`]). Before issue 15 it hashed every
//!   series of every request, which `series-cache` does not, and `all`
//!   measured below it on a loaded machine (0.94× prometheus-captures, 0.90×
//!   asap-1e5); quiet, before and after side by side: asap-1e5 floor
//!   25.6–25.9 → 23.2–23.9 ms (`all` ÷ floor 1.11–1.12 → 1.23–1.25),
//!   prometheus-captures unchanged (`all` ÷ floor 1.2–1.3 both). Until
//!   issue 26 each new series cost it two allocations and two hashes where
//!   the series cache appends to one buffer and hashes once: `all` measured
//!   0.90× on prometheus-captures (27 requests, most of their series new);
//!   with the floor keeping series as the cache does, 1.04× (same run), and
//!   0.96× once the cache's own miss path stopped building upstream's
//!   by-products (the quiet run of 12:24; within noise of its floor). Also
//!   until issue 26 it visited every group's sketch after every request and
//!   answered nothing: at a million groups it measured slower than `all`'s
//!   ingest alone (2.7 s against 2.3 s), and `all`'s answer (flush, every
//!   group's quantiles, the JSON: 1.9 s) counted as overhead. It now adds the
//!   values of the groups a request has, and answers every group. Also in
//!   issue 26: a sender-shaped series (one-byte lengths, a value and a
//!   timestamp per sample) is walked as `borrowed-decode` walks it, by its
//!   lengths; its series index keeps each series' hash (it rehashed every
//!   series as it grew); a new group's sketch is cloned (a logarithm per
//!   series before). `all` had measured 0.88× of it at 1,000 groups × 1,000
//!   series alone in a process; after, the floor at 1k × 1000, 10k × 100 and
//!   100k × 10 groups × series: 1.12 → 0.78 s, 1.12 → 0.71 s, 1.49 → 1.10 s.
//!   It also zeroed a fresh buffer for every request it decompressed, where
//!   the receiver keeps one at its largest (callgrind at 1k × 1000: 9.32 →
//!   8.60 G instructions). And it checked no series, where the receiver
//!   refuses a request holding one Prometheus would refuse: it now checks
//!   each series once, when first seen (names, UTF-8 values, order, a
//!   `__name__`), in the walk that reads its labels (callgrind,
//!   `floor_probe ingest floor 1 100000 10 5`, a warm-up and a run of 1M
//!   new series each: 17.39 → 18.37 G, about 490 instructions a new series);
//!   and a new series' group is first compared with the group of the series
//!   first seen before it, as the receiver's series cache does since then (a
//!   sender sends a group's series together), before it is looked up by hash;
//! - query: a kept answer copied; one computed afresh, the quantile scan
//!   (`Ingester::quantile_scan`) and the answer written around its values
//!   (`query::AnswerFloor`, in the query workload; until issue 26 the scan
//!   alone).
//!
//! A floor's output is checked like an arm's where it is the stage's answer
//! (export; render when every value's shortest form is the exposition's),
//! otherwise by the units it handled (steps, lines, samples, groups): a lock
//! pair, a window-less sketch per group or bare quantiles are not the answer.

mod export;
mod ingest;
mod render;

pub use export::{map_budget, ExportFloor};
pub use ingest::IngestFloor;
pub use render::RenderFloor;

use anyhow::Result;
use promlab::shared::seams::StoreIo;
use promlab::write::StoreFile;
use std::hint::black_box;

/// Write: `steps` lock pairs on a real store file, as `Client::observe` takes them.
pub struct WriteFloor {
    _dir: tempfile::TempDir,
    file: StoreFile,
}

impl WriteFloor {
    pub fn new() -> Result<WriteFloor> {
        let dir = tempfile::tempdir()?;
        let file = StoreFile::open(&dir.path().join("metric_lock___4242.bin"), StoreIo::Mapped)?;
        Ok(WriteFloor { _dir: dir, file })
    }

    /// `steps` × (`flock(LOCK_EX)` + `flock(LOCK_UN)`); returns the pairs taken.
    pub fn run(&mut self, steps: usize) -> Result<u64> {
        for _ in 0..steps {
            self.file.with_lock(|f| Ok(black_box(f).used()))?;
        }
        Ok(steps as u64)
    }
}
