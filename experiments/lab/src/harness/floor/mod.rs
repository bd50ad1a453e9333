//! Each stage's floor: the least work its contract allows, run as one more arm
//! of the ablation, interleaved with the others on the same input, so every
//! arm's `ratio_to_floor` says how far it is from the limit on this machine.
//!
//! - write: the `flock` pair client_ruby's protocol holds around every
//!   observe and increment, alone ([`WriteFloor`]);
//! - export: one pass reading every store file's used region through a
//!   mapping (what a sidecar cannot avoid reading), plus writing the
//!   exposition as the render floor writes it: its text copied, each value
//!   formatted ([`ExportFloor`]), after the one syscall a scrape that must
//!   see a file created before it began cannot skip (a read of the store's
//!   inotify watch), its mappings read under the `SIGBUS` guard every reader
//!   of files other processes may truncate needs. A scrape whose values
//!   change cannot copy its exposition whole, so neither does the floor. It
//!   keeps as many files mapped as the exporter it is compared with, and
//!   reads the rest per scrape;
//! - render: prerendered lines copied, each value formatted (`itoa` for
//!   integers and integral floats, `ryu` for the others) ([`RenderFloor`]);
//! - ingest: snappy decode, a zero-copy protobuf walk, finding each series'
//!   group sketch with no more work than `series-cache` does (one compare of
//!   its label bytes with the series the sender sent next last time; a hash
//!   only when that misses; the labels read only when a series is first
//!   seen) and one sketch add per sample (the request's values of a group
//!   added as one slice, for the groups the request has) ([`IngestFloor`]),
//!   then every group's answer. It does no more than the fastest arm at any
//!   step: a new series is kept as the series cache keeps it (one buffer, its
//!   hash kept), checked once as the receiver must check it, its group first
//!   compared with the last new series' group; a sender-shaped series is
//!   walked by its lengths as `borrowed-decode` walks it; decompression
//!   reuses one buffer at its largest;
//! - query: a kept answer copied; one computed afresh, the quantile scan
//!   (`Ingester::quantile_scan`) and the answer written around its values
//!   (`query::AnswerFloor`, in the query workload: the answer's JSON is the
//!   contract's, not overhead).
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
