//! The full-rate sampler: the kernel's software `cpu-clock` event, recorded by
//! the `perf` tool attached to this process, stacks unwound from a copy of
//! each sample's user stack with the binary's DWARF call-frame information.
//!
//! Why these choices:
//! - `cpu-clock` is a per-task high-resolution timer: it fires after every
//!   1/F seconds of the task's own CPU time, at the asked rate (pprof's
//!   `setitimer(ITIMER_PROF)` is bounded by the scheduler tick and gave 39 Hz
//!   of 997 on this VM). It needs no hardware counters, so it works in VMs.
//! - DWARF unwinding (`--call-graph dwarf`) rather than frame pointers: the
//!   release and bench profiles keep no frame pointers, and building with them
//!   would profile a different binary than the one the ablation times. The
//!   kernel copies the top of the user stack with each sample (a few µs, in
//!   the sampled task's timer interrupt, not in user frames); `perf script`
//!   unwinds it with `.eh_frame`.
//! - `perf` itself runs as another process: reading the ring buffer, writing
//!   perf.data and unwinding cost nothing in the profiled process's frames.
//! - Events start disabled and are enabled through perf's control FIFOs once
//!   the workload is built and warm (`--control`, `-D -1`); each sample's
//!   `CLOCK_MONOTONIC` time then tells which of the caller's windows (an arm's
//!   slice of runs) it belongs to, so arms can be interleaved in one recording.
//! - `perf script --no-inline`, with inline frames added by [`super::symbols`]:
//!   perf 6.1 asks binutils' `addr2line` for every address (10 s for 3,700
//!   samples here), the addr2line crate takes well under a second.

use super::symbols::Symbolizer;
use super::Folded;
use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bytes of user stack copied with each sample: enough for the deepest stack
/// from a workload's `run` down (`Folded::rooted_at` counts the ones that reach it).
const STACK_BYTES: u32 = 16 * 1024;

/// How long perf may take to start, acknowledge a command or write its data.
const PERF_TIMEOUT: Duration = Duration::from_secs(60);

/// What the kernel lets this process sample with perf events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// User and kernel frames (root, or `perf_event_paranoid` ≤ 1).
    UserAndKernel,
    /// User frames of its own processes (`perf_event_paranoid` = 2).
    UserOnly,
    /// None; why.
    Denied(String),
}

/// `perf_event_attr` as far as its first published size (`PERF_ATTR_SIZE_VER0`,
/// 64 bytes), which every kernel accepts; enough to ask whether `cpu-clock`
/// may be opened.
#[repr(C)]
struct EventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

/// Asks the kernel (`perf_event_open` on this thread) whether a sampling
/// `cpu-clock` event may be opened, with kernel frames or without.
pub fn access() -> Access {
    const PERF_TYPE_SOFTWARE: u32 = 1;
    const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
    const DISABLED: u64 = 1;
    const EXCLUDE_KERNEL: u64 = 1 << 5;
    const EXCLUDE_HV: u64 = 1 << 6;
    const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
    let open = |exclude_kernel: bool| {
        let attr = EventAttr {
            kind: PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<EventAttr>() as u32,
            config: PERF_COUNT_SW_CPU_CLOCK,
            sample_period: 1_000_000,
            sample_type: 0,
            read_format: 0,
            flags: DISABLED | EXCLUDE_HV | if exclude_kernel { EXCLUDE_KERNEL } else { 0 },
            wakeup_events: 0,
            bp_type: 0,
            config1: 0,
        };
        // SAFETY: a valid attr of the size it states; this thread, any CPU, no group.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &attr as *const EventAttr,
                0 as libc::pid_t,
                -1 as libc::c_int,
                -1 as libc::c_int,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the descriptor was just opened here.
        unsafe { libc::close(fd as libc::c_int) };
        Ok(())
    };
    if open(false).is_ok() {
        return Access::UserAndKernel;
    }
    match open(true) {
        Ok(()) => Access::UserOnly,
        Err(err) => {
            let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
                .map(|s| format!("kernel.perf_event_paranoid = {}", s.trim()))
                .unwrap_or_else(|_| "no /proc/sys/kernel/perf_event_paranoid".to_string());
            Access::Denied(format!("perf_event_open(cpu-clock): {err} ({paranoid})"))
        }
    }
}

/// The `perf` program that runs here (`perf version` succeeds): `$PROMLAB_PERF`,
/// else `perf` on `PATH`, else the newest `/usr/bin/perf_<version>`. Debian's
/// `/usr/bin/perf` may be a wrapper that refuses to run when no perf matches
/// the running kernel's version, though a perf of another version would
/// sample it (the `cpu-clock` event and the perf.data format do not change).
/// Found once; the error says what was tried.
fn program() -> std::result::Result<&'static (PathBuf, String), String> {
    static FOUND: std::sync::OnceLock<std::result::Result<(PathBuf, String), String>> =
        std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            let version = |perf: &Path| match Command::new(perf).arg("version").output() {
                Err(err) => Err(format!("cannot run `{}`: {err}", perf.display())),
                Ok(out) if !out.status.success() => Err(format!(
                    "`{} version` failed ({}): {}",
                    perf.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
                Ok(out) => Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
            };
            if let Some(perf) = std::env::var_os("PROMLAB_PERF") {
                let perf = PathBuf::from(perf);
                return version(&perf).map(|v| (perf, v));
            }
            let mut tried = Vec::new();
            let mut candidates = vec![PathBuf::from("perf")];
            let mut versioned: Vec<PathBuf> = std::fs::read_dir("/usr/bin")
                .map(|dir| {
                    dir.filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|p| {
                            p.file_name()
                                .and_then(|n| n.to_str())
                                .is_some_and(|n| n.starts_with("perf_"))
                        })
                        .collect()
                })
                .unwrap_or_default();
            versioned.sort();
            candidates.extend(versioned.into_iter().rev());
            for perf in candidates {
                match version(&perf) {
                    Ok(v) => return Ok((perf, v)),
                    Err(why) => tried.push(why),
                }
            }
            Err(tried.join("; "))
        })
        .as_ref()
        .map_err(|why| why.clone())
}

/// Whether the `perf` tool runs here: its version and path, or why not
/// (missing, or only a wrapper that finds no perf for the running kernel).
pub fn tool() -> std::result::Result<String, String> {
    program().map(|(perf, version)| format!("{version} ({})", perf.display()))
}

/// `perf record` attached to this process, its events enabled.
pub struct Recorder {
    child: Option<Child>,
    dir: tempfile::TempDir,
    ctl: File,
    ack: File,
}

impl Recorder {
    /// Starts `perf record` on this process and enables its events; from the
    /// return on, every `frequency` Hz of CPU time of this process is sampled.
    pub fn start(frequency: u32, kernel: bool) -> Result<Recorder> {
        let dir = tempfile::Builder::new()
            .prefix("promlab-perf-")
            .tempdir()
            .context("cannot create a directory for perf's data")?;
        let (ctl_path, ack_path) = (dir.path().join("ctl"), dir.path().join("ack"));
        for fifo in [&ctl_path, &ack_path] {
            mkfifo(fifo)?;
        }
        let log = File::create(dir.path().join("record.log"))?;
        let event = if kernel { "cpu-clock" } else { "cpu-clock:u" };
        let (perf, _) = program().map_err(|why| anyhow::anyhow!("no usable perf: {why}"))?;
        let child = Command::new(perf)
            .arg("record")
            .args(["-e", event, "-F", &frequency.to_string()])
            .args(["--call-graph", &format!("dwarf,{STACK_BYTES}")])
            .args(["-p", &std::process::id().to_string()])
            // Sample times on the clock the windows are measured with.
            .args(["-k", "monotonic"])
            .args(["-D", "-1", "--control"])
            .arg(format!(
                "fifo:{},{}",
                ctl_path.display(),
                ack_path.display()
            ))
            // 8 MiB of ring buffer: perf keeps up on a busy machine (unprivileged
            // users get what perf_event_mlock_kb allows; lost samples are reported).
            .args(["-m", if kernel { "2048" } else { "128" }])
            // No build-id collection or cache: the binary does not change
            // before `perf script` reads it, and ~/.debug would fill with builds.
            .args(["--no-buildid", "--no-buildid-cache", "--quiet", "-o"])
            .arg(dir.path().join("perf.data"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot run `{}`", perf.display()))?;
        let mut child = Some(child);
        let opened = wait_for_reader(&ctl_path, &mut child, dir.path());
        let ctl = match opened {
            Ok(ctl) => ctl,
            Err(err) => {
                stop_child(&mut child);
                return Err(err);
            }
        };
        let ack = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&ack_path)?;
        let mut recorder = Recorder {
            child,
            dir,
            ctl,
            ack,
        };
        recorder.command("enable")?;
        Ok(recorder)
    }

    /// Sends a control command and waits for perf's `ack`.
    fn command(&mut self, command: &str) -> Result<()> {
        self.ctl
            .write_all(format!("{command}\n").as_bytes())
            .with_context(|| format!("cannot send `{command}` to perf"))?;
        let deadline = Instant::now() + PERF_TIMEOUT;
        let mut got = Vec::new();
        loop {
            let mut poll = libc::pollfd {
                fd: self.ack.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut poll, 1, 100) };
            let mut buf = [0u8; 64];
            match self.ack.read(&mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e).context("cannot read perf's acknowledgement"),
            }
            if got.windows(4).any(|w| w == b"ack\n") {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!(
                    "perf record exited ({status}) instead of acknowledging `{command}`: {}",
                    log_tail(self.dir.path())
                );
            }
            if Instant::now() > deadline {
                bail!("perf record did not acknowledge `{command}` within {PERF_TIMEOUT:?}");
            }
        }
    }

    /// Stops the recording; returns the samples as `perf script` prints them,
    /// one per [`Sample`], with inline frames added, and perf's warnings about
    /// lost samples (a ring buffer that overflowed), if any.
    pub fn finish(mut self) -> Result<(Vec<Sample>, Vec<String>)> {
        self.command("disable")?;
        self.command("stop")?;
        let mut child = self.child.take().expect("a running perf record");
        let deadline = Instant::now() + PERF_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("perf record did not stop within {PERF_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if !status.success() {
            bail!(
                "perf record failed ({status}): {}",
                log_tail(self.dir.path())
            );
        }
        let samples = script(&self.dir.path().join("perf.data"), self.dir.path())?;
        let mut warnings = Vec::new();
        for log in ["record.log", "script.log"] {
            let text = std::fs::read_to_string(self.dir.path().join(log)).unwrap_or_default();
            warnings.extend(
                text.lines()
                    .filter(|l| l.to_ascii_lowercase().contains("lost"))
                    .map(|l| format!("perf: {}", l.trim())),
            );
        }
        Ok((samples, warnings))
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}

fn stop_child(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn mkfifo(path: &Path) -> Result<()> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("cannot create the FIFO {}", path.display()));
    }
    Ok(())
}

/// Opens the control FIFO for writing once perf has opened it (before that
/// a non-blocking open fails with `ENXIO`); fails if perf exits first.
fn wait_for_reader(path: &Path, child: &mut Option<Child>, dir: &Path) -> Result<File> {
    let deadline = Instant::now() + PERF_TIMEOUT;
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
        {
            Ok(file) => return Ok(file),
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {}
            Err(e) => return Err(e).context("cannot open perf's control FIFO"),
        }
        if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            bail!(
                "perf record exited ({status}) before it started: {}",
                log_tail(dir)
            );
        }
        if Instant::now() > deadline {
            bail!("perf record did not start within {PERF_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The end of perf record's messages, for an error.
fn log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("record.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(6)..].join(" / ")
}

/// One sample: when it was taken (`CLOCK_MONOTONIC`, ns) and its stack in
/// `perf script`'s text form (the event line, then one line per frame, leaf
/// first), inline frames included.
pub struct Sample {
    pub time_ns: u64,
    pub text: String,
}

/// Runs `perf script` on `data` and adds inline frames; also reports lost samples.
fn script(data: &Path, dir: &Path) -> Result<Vec<Sample>> {
    let log = File::create(dir.join("script.log"))?;
    let (perf, _) = program().map_err(|why| anyhow::anyhow!("no usable perf: {why}"))?;
    let mut child = Command::new(perf)
        .arg("script")
        .arg("-i")
        .arg(data)
        .args(["--no-inline", "--ns"])
        .args(["-F", "comm,tid,time,event,ip,sym,dso"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot run `{} script`", perf.display()))?;
    let stdout = child.stdout.take().expect("piped");
    let parsed = parse_script(BufReader::new(stdout), &mut Symbolizer::default());
    let status = child.wait()?;
    let samples = parsed?;
    if !status.success() {
        let log = std::fs::read_to_string(dir.join("script.log")).unwrap_or_default();
        bail!("perf script failed ({status}): {}", log.trim());
    }
    Ok(samples)
}

/// Splits `perf script` output into samples, adding inline frames below each
/// frame of a binary with DWARF line tables.
fn parse_script(input: impl BufRead, symbolizer: &mut Symbolizer) -> Result<Vec<Sample>> {
    let mut samples = Vec::new();
    let mut current: Option<Sample> = None;
    let mut frame_index = 0;
    for line in input.lines() {
        let line = line.context("cannot read perf script's output")?;
        if line.trim().is_empty() {
            if let Some(sample) = current.take() {
                samples.push(sample);
            }
            continue;
        }
        if !line.starts_with(char::is_whitespace) {
            // An event line: `comm tid time: event:` (a LOST record has no time field of ours).
            if let Some(sample) = current.take() {
                samples.push(sample);
            }
            if let Some(time_ns) = event_time_ns(&line) {
                current = Some(Sample {
                    time_ns,
                    text: format!("{line}\n"),
                });
                frame_index = 0;
            }
            continue;
        }
        let Some(sample) = current.as_mut() else {
            continue;
        };
        let leaf = frame_index == 0;
        frame_index += 1;
        if let Some((address, dso)) = frame_address(&line) {
            for inlined in symbolizer.inlined(dso, address, leaf) {
                sample
                    .text
                    .push_str(&format!("\t{address:x} {inlined} ({dso})\n"));
            }
        }
        // inferno splits a frame at `->` (Java's inlining marker); Rust names
        // of closures and fn pointers hold it (`call_once<fn() -> T>`).
        sample.text.push_str(&line.replace("->", "→"));
        sample.text.push('\n');
    }
    if let Some(sample) = current.take() {
        samples.push(sample);
    }
    Ok(samples)
}

/// The time of an event line (`promlab 1234 577.808370123: cpu-clock:`), in ns.
fn event_time_ns(line: &str) -> Option<u64> {
    line.split_whitespace().find_map(|token| {
        let time = token.strip_suffix(':')?;
        let (secs, frac) = time.split_once('.')?;
        let secs: u64 = secs.parse().ok()?;
        if frac.is_empty() || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let scale = 10u64.pow(9 - frac.len() as u32);
        Some(secs * 1_000_000_000 + frac.parse::<u64>().ok()? * scale)
    })
}

/// A frame line's address (relative to its file, as perf prints it) and file:
/// `\t  6f4907 promlab::format::formenc::decode_key_reference+0x277 (/path/promlab)`.
fn frame_address(line: &str) -> Option<(u64, &str)> {
    let line = line.trim();
    let (address, rest) = line.split_once(' ')?;
    let address = u64::from_str_radix(address, 16).ok()?;
    let dso = rest.rsplit_once(" (")?.1.strip_suffix(')')?;
    Some((address, dso))
}

/// Folds samples (their `perf script` text) with inferno's perf collapser.
pub fn fold<'a>(samples: impl Iterator<Item = &'a Sample>) -> Result<Folded> {
    let mut text = String::new();
    for sample in samples {
        text.push_str(&sample.text);
        text.push('\n');
    }
    let mut options = inferno::collapse::perf::Options::default();
    options.nthreads = 1;
    let mut folder = inferno::collapse::perf::Folder::from(options);
    let mut out = Vec::new();
    inferno::collapse::Collapse::collapse(&mut folder, text.as_bytes(), &mut out)
        .context("cannot fold perf's stacks")?;
    Folded::parse(&String::from_utf8_lossy(&out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_event_times_and_frames() {
        assert_eq!(
            event_time_ns("promlab 12495   577.808370123: cpu-clock: "),
            Some(577_808_370_123)
        );
        assert_eq!(
            event_time_ns("my comm 7 12.5: cpu-clock:u: "),
            Some(12_500_000_000)
        );
        assert_eq!(event_time_ns("no time here"), None);
        assert_eq!(
            frame_address(
                "\t          6f4907 promlab::format::formenc::decode_key_reference+0x277 (/work/promlab)"
            ),
            Some((0x6f4907, "/work/promlab"))
        );
        assert_eq!(
            frame_address("\t  7b15f3 <&dyn Fn<(), Output = i32> as FnOnce<()>>::call_once+0x4c3 (/a b/promlab)"),
            Some((0x7b15f3, "/a b/promlab"))
        );
        assert_eq!(
            frame_address("\tffffffff8226e979 _raw_spin_unlock+0x19 ([kernel.kallsyms])"),
            Some((0xffffffff8226e979, "[kernel.kallsyms]"))
        );
    }

    #[test]
    fn splits_samples_and_folds_them() {
        let script = "promlab 1 1.000000001: cpu-clock: \n\
                      \t 10 leaf+0x1 ([unknown])\n\
                      \t 20 main+0x2 ([unknown])\n\
                      \n\
                      promlab 1 1.000000002: cpu-clock: \n\
                      \t 10 leaf+0x1 ([unknown])\n\
                      \t 20 main+0x2 ([unknown])\n\n";
        let samples = parse_script(script.as_bytes(), &mut Symbolizer::default()).unwrap();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[1].time_ns, 1_000_000_002);
        let folded = fold(samples.iter()).unwrap();
        assert_eq!(folded.to_text(), "promlab;main;leaf 2\n");
    }
}
