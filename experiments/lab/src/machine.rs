//! What the lab measures on and with, read in one place: the build that made
//! this binary (recorded by `build.rs`), the host (`/proc`, read once per
//! call, never through a shell), and a process's CPU time and memory
//! (`/proc/<pid>/stat` and `status`), for the harness's `machine.txt`, the
//! ingest peers and the examples alike. Linux only, like the rest of the lab's
//! measurements; elsewhere the fields read as unknown.

use std::time::{Duration, SystemTime};

/// The build of this binary, as `build.rs` saw it.
#[derive(Clone, Copy, Debug)]
pub struct Build {
    /// `rustc --version` of the compiler cargo ran (`RUSTC`), not the one on `PATH`.
    pub rustc: &'static str,
    pub target: &'static str,
    /// Cargo's `PROFILE`: `release` (release and bench) or `debug`.
    pub profile: &'static str,
    pub opt_level: &'static str,
    /// `git describe --always --dirty` at build time.
    pub git_revision: &'static str,
}

pub const BUILD: Build = Build {
    rustc: env!("PROMLAB_RUSTC_VERSION"),
    target: env!("PROMLAB_TARGET"),
    profile: env!("PROMLAB_PROFILE"),
    opt_level: env!("PROMLAB_OPT_LEVEL"),
    git_revision: env!("PROMLAB_GIT_REVISION"),
};

/// The host, from `/proc`.
#[derive(Clone, Debug, Default)]
pub struct Host {
    /// The first CPU of `/proc/cpuinfo`: `model name`, family and model, and
    /// whether it has AVX-512 ([`cpu_description`]).
    pub cpu: Option<String>,
    /// CPUs this process may run on.
    pub cores: usize,
    /// `MemTotal` of `/proc/meminfo`.
    pub memory_kib: Option<u64>,
    /// `/proc/sys/kernel/osrelease`.
    pub kernel: Option<String>,
    /// `/proc/sys/kernel/hostname`.
    pub hostname: Option<String>,
}

impl Host {
    pub fn read() -> Host {
        let cpuinfo = read_proc("/proc/cpuinfo").unwrap_or_default();
        let meminfo = read_proc("/proc/meminfo").unwrap_or_default();
        Host {
            cpu: cpu_description(&cpuinfo),
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            memory_kib: field(&meminfo, "MemTotal").and_then(kib),
            kernel: read_proc("/proc/sys/kernel/osrelease").map(|s| s.trim().to_owned()),
            hostname: read_proc("/proc/sys/kernel/hostname").map(|s| s.trim().to_owned()),
        }
    }
}

/// The 1-, 5- and 15-minute load averages of `/proc/loadavg`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadAverage(pub [f64; 3]);

impl LoadAverage {
    pub fn read() -> Option<LoadAverage> {
        parse_loadavg(&read_proc("/proc/loadavg")?)
    }
}

impl std::fmt::Display for LoadAverage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [one, five, fifteen] = self.0;
        write!(f, "{one:.2} {five:.2} {fifteen:.2}")
    }
}

fn parse_loadavg(text: &str) -> Option<LoadAverage> {
    let mut fields = text.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some(LoadAverage([
        fields.next()??,
        fields.next()??,
        fields.next()??,
    ]))
}

/// A process's CPU time and memory, from `/proc/<pid>/stat` and `status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessStats {
    /// User + system CPU of all its threads, living and exited (clock-tick resolution).
    pub cpu: Duration,
    /// Peak resident set size (`VmHWM`), in KiB. Read this, not `ru_maxrss`:
    /// Linux carries `ru_maxrss` across `execve`.
    pub peak_rss_kib: Option<u64>,
    /// Resident set size now (`VmRSS`), in KiB.
    pub rss_kib: Option<u64>,
}

impl ProcessStats {
    /// Process `pid`; an error if it is gone or its `stat` is malformed.
    pub fn of(pid: u32) -> std::io::Result<ProcessStats> {
        Self::read(&format!("/proc/{pid}"))
    }

    /// This process.
    pub fn of_self() -> std::io::Result<ProcessStats> {
        Self::read("/proc/self")
    }

    fn read(dir: &str) -> std::io::Result<ProcessStats> {
        let stat = std::fs::read_to_string(format!("{dir}/stat"))?;
        let ticks = cpu_ticks(&stat).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("malformed {dir}/stat"),
            )
        })?;
        // SAFETY: sysconf only reads a configuration value.
        let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        let status = std::fs::read_to_string(format!("{dir}/status")).unwrap_or_default();
        Ok(ProcessStats {
            cpu: Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / per_sec),
            peak_rss_kib: field(&status, "VmHWM").and_then(kib),
            rss_kib: field(&status, "VmRSS").and_then(kib),
        })
    }
}

/// utime + stime of a `/proc/<pid>/stat` line, in clock ticks: fields 12 and 13
/// after the command name's closing parenthesis (the name may hold spaces and
/// parentheses, so count from the last one).
fn cpu_ticks(stat: &str) -> Option<u64> {
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime.saturating_add(stime))
}

fn read_proc(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// `AMD EPYC (family 25, model 17, AVX-512)`: a VM's `model name` alone
/// named two hosts alike whose ratios differed (libc's copy and compare run
/// AVX-512 code on one of them), so runs say which they had.
fn cpu_description(cpuinfo: &str) -> Option<String> {
    let name = field(cpuinfo, "model name")?;
    let mut details = Vec::new();
    if let (Some(family), Some(model)) = (field(cpuinfo, "cpu family"), field(cpuinfo, "model")) {
        details.push(format!("family {family}, model {model}"));
    }
    let flags = field(cpuinfo, "flags").unwrap_or_default();
    if flags.split_whitespace().any(|f| f == "avx512f") {
        details.push("AVX-512".to_owned());
    }
    Some(if details.is_empty() {
        name.to_owned()
    } else {
        format!("{name} ({})", details.join(", "))
    })
}

/// The value of the first `name: value` line (`/proc/cpuinfo`, `meminfo`, `status`).
fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim_end() == name).then(|| value.trim())
    })
}

/// `24684092 kB` → 24684092.
fn kib(value: &str) -> Option<u64> {
    value.trim_end_matches("kB").trim().parse().ok()
}

/// Now, as `2026-11-30T11:15:37Z`.
pub fn utc_now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// Today (UTC), as `2026-11-30`.
pub fn utc_date() -> String {
    utc_now()[..10].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_ticks_count_from_the_last_parenthesis() {
        let stat = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 170 30 0 0 20 0 1 0";
        assert_eq!(cpu_ticks(stat), Some(200));
        assert_eq!(cpu_ticks("4242 (x) S 1 2"), None);
        assert_eq!(cpu_ticks("no parenthesis"), None);
    }

    #[test]
    fn cpu_description_names_family_model_and_avx512() {
        let info = "processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512bw\n";
        assert_eq!(
            cpu_description(info).as_deref(),
            Some("AMD EPYC (family 25, model 17, AVX-512)")
        );
        let info = "cpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2\n";
        assert_eq!(
            cpu_description(info).as_deref(),
            Some("AMD EPYC (family 25, model 1)")
        );
        assert_eq!(cpu_description("flags: avx512f\n"), None);
    }

    #[test]
    fn fields_and_kib() {
        let status = "Name:\tpromlab\nVmPeak:\t  2000 kB\nVmHWM:\t  1234 kB\nVmRSS:\t   999 kB\n";
        assert_eq!(field(status, "VmHWM").and_then(kib), Some(1234));
        assert_eq!(field(status, "VmRSS").and_then(kib), Some(999));
        assert_eq!(field(status, "VmSwap"), None);
        let cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\n";
        assert_eq!(field(cpuinfo, "model name"), Some("AMD EPYC 7B13"));
    }

    #[test]
    fn loadavg_parses_three_averages() {
        assert_eq!(
            parse_loadavg("0.52 1.25 2.00 1/234 5678\n"),
            Some(LoadAverage([0.52, 1.25, 2.0]))
        );
        assert_eq!(parse_loadavg("0.52 x"), None);
        assert_eq!(LoadAverage([0.5, 1.0, 2.25]).to_string(), "0.50 1.00 2.25");
    }

    #[test]
    fn this_process_and_host_are_readable() {
        let stats = ProcessStats::of_self().unwrap();
        assert!(stats.peak_rss_kib.unwrap() >= stats.rss_kib.unwrap());
        assert!(ProcessStats::of(std::process::id())
            .unwrap()
            .peak_rss_kib
            .is_some());
        let host = Host::read();
        assert!(host.cores >= 1);
        assert!(host.memory_kib.unwrap() > 0);
        assert!(LoadAverage::read().is_some());
        assert_eq!(utc_date().len(), 10);
        assert!(BUILD.rustc.starts_with("rustc "), "{}", BUILD.rustc);
    }
}
