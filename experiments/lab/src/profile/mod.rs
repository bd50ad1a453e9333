//! Sampling profiles of this process: `promlab flamegraph`, `promlab profiles`
//! and the benches' `--profile-time` hook.
//!
//! One [`Profiler`] records one or more *arms* (strategy sets) in slices that
//! the caller interleaves (A B A B …), so drift on a shared machine hits every
//! arm alike, as the ablation's rounds do. Each arm's profile comes back as
//! [`Folded`] stacks with the CPU time it covered, so its sampling rate can be
//! checked against the rate asked, and two arms can be compared per unit of
//! work ([`draw::Diff`]).
//!
//! Samplers, best first ([`choose`]):
//! - **perf**: the kernel's `cpu-clock` event through the `perf` tool, stacks
//!   unwound with DWARF ([`perf`] says why each choice); the asked rate.
//! - **pprof**: its `SIGPROF` timer, where perf events are not allowed or the
//!   tool is missing; tick-bound, so often far below the asked rate. The
//!   summary always names the sampler and the rate it achieved.

pub mod draw;
mod folded;
mod perf;
mod symbols;
mod timer;

pub use folded::Folded;
pub use perf::{access as perf_access, tool as perf_tool, Access};

use anyhow::{bail, Result};
use std::time::{Duration, Instant};

/// The frame every workload run passes through (`<X as Workload>::run`): the
/// root of a workload's profile, the frames above it being the same start-up
/// and loop in every sample.
pub const RUN_FRAME: &str = " as promlab_lab::harness::arms::Workload>::run";

/// Which sampler to use (`--sampler`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SamplerChoice {
    /// perf events where the kernel allows them and the `perf` tool runs; pprof otherwise.
    #[default]
    Auto,
    /// perf events, or an error saying why not.
    Perf,
    /// pprof's SIGPROF timer.
    Pprof,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SamplerKind {
    Perf,
    Pprof,
}

impl SamplerKind {
    pub fn name(self) -> &'static str {
        match self {
            SamplerKind::Perf => "perf",
            SamplerKind::Pprof => "pprof",
        }
    }
}

/// The sampler a profile is taken with, and how.
#[derive(Clone, Debug)]
pub struct Sampler {
    pub kind: SamplerKind,
    pub frequency_hz: u32,
    /// Whether kernel frames are sampled too (perf as root, or `perf_event_paranoid` ≤ 1).
    pub kernel: bool,
    /// Why perf was not used, when it was not.
    pub fallback: Option<String>,
}

impl Sampler {
    /// One line: what samples, at what rate, and why this sampler.
    pub fn describe(&self) -> String {
        match self.kind {
            SamplerKind::Perf => format!(
                "perf (cpu-clock at {} Hz of CPU time, {} frames, DWARF unwinding)",
                self.frequency_hz,
                if self.kernel {
                    "user and kernel"
                } else {
                    "user"
                }
            ),
            SamplerKind::Pprof => format!(
                "pprof (SIGPROF timer at {} Hz asked, tick-bound){}",
                self.frequency_hz,
                self.fallback
                    .as_ref()
                    .map_or(String::new(), |why| format!("; perf not used: {why}"))
            ),
        }
    }
}

/// Picks the sampler `choice` asks for, checking that perf events are allowed
/// and the `perf` tool runs when perf is wanted.
pub fn choose(choice: SamplerChoice, frequency_hz: u32) -> Result<Sampler> {
    if !(1..=100_000).contains(&frequency_hz) {
        bail!("--frequency must be 1 to 100,000 Hz, not {frequency_hz}");
    }
    let pprof = |fallback: String| Sampler {
        kind: SamplerKind::Pprof,
        frequency_hz,
        kernel: false,
        fallback: Some(fallback),
    };
    if choice == SamplerChoice::Pprof {
        return Ok(pprof("--sampler pprof".to_string()));
    }
    let refused = match perf::access() {
        Access::Denied(why) => Err(why),
        access => perf::tool().map(|_| access == Access::UserAndKernel),
    };
    match (choice, refused) {
        (_, Ok(kernel)) => Ok(Sampler {
            kind: SamplerKind::Perf,
            frequency_hz,
            kernel,
            fallback: None,
        }),
        (SamplerChoice::Perf, Err(why)) => bail!("--sampler perf: {why}"),
        (_, Err(why)) => Ok(pprof(why)),
    }
}

/// One arm's profile.
#[derive(Clone, Debug, Default)]
pub struct ArmProfile {
    pub folded: Folded,
    /// CPU time of this process during the arm's slices: user and system time
    /// when those are sampled, user time when only user frames are.
    pub cpu: Duration,
    pub wall: Duration,
}

impl ArmProfile {
    pub fn samples(&self) -> u64 {
        self.folded.samples()
    }

    /// Samples per second of the CPU time they cover.
    pub fn rate_hz(&self) -> f64 {
        self.samples() as f64 / self.cpu.as_secs_f64().max(1e-9)
    }
}

/// What a [`Profiler`] recorded.
pub struct Profiles {
    pub sampler: Sampler,
    pub arms: Vec<ArmProfile>,
    /// The sampler's warnings (perf's lost samples).
    pub warnings: Vec<String>,
}

/// A profiler of this process, recording arms slice by slice.
pub struct Profiler {
    sampler: Sampler,
    perf: Option<perf::Recorder>,
    arms: Vec<ArmProfile>,
    /// (start, end, arm) of every slice, `CLOCK_MONOTONIC` ns, in time order.
    windows: Vec<(u64, u64, usize)>,
    open: Option<OpenSlice>,
}

/// A slice begun and not yet ended.
struct OpenSlice {
    arm: usize,
    timer: Option<timer::Slice>,
    cpu: Duration,
    wall: Instant,
    start_ns: u64,
}

impl Profiler {
    /// Starts sampling (perf: attaches and enables; pprof: per slice).
    pub fn start(sampler: Sampler, arms: usize) -> Result<Profiler> {
        let perf = match sampler.kind {
            SamplerKind::Perf => Some(perf::Recorder::start(sampler.frequency_hz, sampler.kernel)?),
            SamplerKind::Pprof => None,
        };
        Ok(Profiler {
            sampler,
            perf,
            arms: vec![ArmProfile::default(); arms],
            windows: Vec::new(),
            open: None,
        })
    }

    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// CPU time arm `arm`'s slices have used so far.
    pub fn cpu(&self, arm: usize) -> Duration {
        self.arms[arm].cpu
    }

    /// Runs `work` as a slice of arm `arm`'s profile.
    pub fn slice<T>(&mut self, arm: usize, work: impl FnOnce() -> T) -> Result<T> {
        self.begin(arm)?;
        let out = work();
        self.end()?;
        Ok(out)
    }

    /// Starts a slice of arm `arm`'s profile (ends the open one, if any).
    pub fn begin(&mut self, arm: usize) -> Result<()> {
        self.end()?;
        let timer = match self.sampler.kind {
            SamplerKind::Pprof => Some(timer::Slice::start(self.sampler.frequency_hz)?),
            SamplerKind::Perf => None,
        };
        self.open = Some(OpenSlice {
            arm,
            timer,
            cpu: self.sampler.cpu_now(),
            wall: Instant::now(),
            start_ns: monotonic_ns(),
        });
        Ok(())
    }

    /// Ends the open slice, if any.
    pub fn end(&mut self) -> Result<()> {
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        let end_ns = monotonic_ns();
        let cpu = self.sampler.cpu_now().saturating_sub(open.cpu);
        let profile = &mut self.arms[open.arm];
        profile.wall += open.wall.elapsed();
        profile.cpu += cpu;
        if let Some(timer) = open.timer {
            profile.folded.merge(&timer.finish()?);
        }
        self.windows.push((open.start_ns, end_ns, open.arm));
        Ok(())
    }

    /// Stops sampling (ending the open slice); each arm's stacks, as recorded.
    pub fn finish(mut self) -> Result<Profiles> {
        self.end()?;
        let mut warnings = Vec::new();
        if let Some(recorder) = self.perf.take() {
            let (samples, perf_warnings) = recorder.finish()?;
            warnings = perf_warnings;
            let mut per_arm: Vec<Vec<&perf::Sample>> = vec![Vec::new(); self.arms.len()];
            for sample in &samples {
                // The last slice that began before the sample, if it had not ended.
                let i = self.windows.partition_point(|w| w.0 <= sample.time_ns);
                if let Some(&(_, end, arm)) = i.checked_sub(1).map(|i| &self.windows[i]) {
                    if sample.time_ns <= end {
                        per_arm[arm].push(sample);
                    }
                }
            }
            for (profile, samples) in self.arms.iter_mut().zip(per_arm) {
                profile.folded = perf::fold(samples.into_iter())?;
            }
        }
        Ok(Profiles {
            sampler: self.sampler,
            arms: self.arms,
            warnings,
        })
    }
}

/// `CLOCK_MONOTONIC`, in ns: the clock perf stamps its samples with (`-k monotonic`).
fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Sampler {
    /// The CPU time this process has used, of the kind the sampler samples:
    /// what a profile's length is measured in.
    pub fn cpu_now(&self) -> Duration {
        process_cpu(self.kind == SamplerKind::Perf && !self.kernel)
    }
}

/// CPU time this process has used: user and system, or user only.
fn process_cpu(user_only: bool) -> Duration {
    if !user_only {
        return Duration::from_nanos(clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID));
    }
    // SAFETY: a zeroed rusage is a valid one to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    Duration::from_secs(usage.ru_utime.tv_sec as u64)
        + Duration::from_micros(usage.ru_utime.tv_usec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RUN_FRAME names the harness's trait as the compiler does.
    #[test]
    fn run_frame_names_the_workload_trait() {
        let path = std::any::type_name::<dyn crate::harness::Workload>();
        assert_eq!(
            RUN_FRAME,
            format!(" as {}>::run", path.trim_start_matches("dyn "))
        );
    }
}
