//! The fallback sampler, where the kernel refuses perf events or the `perf`
//! tool is missing: pprof's `SIGPROF` interval timer (`setitimer`), unwound in
//! the signal handler. It needs nothing from the kernel but signals, and is
//! bounded by the scheduler tick: on this VM 39 of 997 asked samples a second.

use super::Folded;
use anyhow::{Context, Result};

/// A running pprof profiler (one at a time per process).
pub struct Slice(pprof::ProfilerGuard<'static>);

impl Slice {
    pub fn start(frequency: u32) -> Result<Slice> {
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(frequency as i32)
            // Unwinding through these from a signal handler can deadlock (pprof's advice).
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
            .context("cannot start pprof's profiler")?;
        Ok(Slice(guard))
    }

    /// Stops the profiler; its samples folded, root first, the process's name
    /// as the root frame as perf's are.
    pub fn finish(self) -> Result<Folded> {
        let report = self
            .0
            .report()
            .build()
            .context("cannot build pprof's report")?;
        drop(self.0);
        let mut folded = Folded::default();
        let process = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "promlab".to_string());
        for (frames, count) in &report.data {
            let mut stack = process.clone();
            // Leaf first, each frame's inlined functions innermost first.
            for frame in frames.frames.iter().rev() {
                for symbol in frame.iter().rev() {
                    stack.push(';');
                    stack.push_str(&symbol.to_string().replace(';', ":"));
                }
            }
            folded.add(&stack, u64::try_from(*count).unwrap_or(0));
        }
        Ok(folded)
    }
}
