//! The soak's child processes: each server spawned on a loopback port with its
//! open files limited, watched (an exit that was not asked for is counted and
//! the server restarted), shut down (SIGTERM, then SIGKILL after a grace) and
//! killed on drop; and [`Reaped`], a writer run killed and reaped when dropped.

use super::{FD_LIMIT, SHUTDOWN_GRACE};
use crate::machine::ProcessStats;
use anyhow::{bail, Context, Result};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

pub(super) struct Server {
    name: &'static str,
    exe: PathBuf,
    args: Vec<String>,
    running: Mutex<Option<Running>>,
    base_url: RwLock<String>,
    /// Every exit that was not asked for, described.
    exits: Mutex<Vec<String>>,
    peak_rss_kib: AtomicU64,
}

struct Running {
    child: Child,
    /// The last lines it wrote to stderr, for the report of a crash.
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

/// How a server ended.
pub(super) struct ServerEnd {
    pub(super) name: &'static str,
    pub(super) exits: Vec<String>,
    pub(super) peak_rss_kib: u64,
    /// `Some(true)`: exited within the grace after SIGTERM; `Some(false)`: had to be killed.
    pub(super) graceful: Option<bool>,
}

impl Server {
    pub(super) fn start(name: &'static str, exe: &Path, args: Vec<String>) -> Result<Server> {
        let server = Server {
            name,
            exe: exe.to_owned(),
            args,
            running: Mutex::new(None),
            base_url: RwLock::new(String::new()),
            exits: Mutex::new(Vec::new()),
            peak_rss_kib: AtomicU64::new(0),
        };
        let (running, addr) = server.spawn()?;
        *server.running.lock().unwrap() = Some(running);
        *server.base_url.write().unwrap() = format!("http://{addr}");
        Ok(server)
    }

    /// Starts the child on an ephemeral loopback port, its open files limited to
    /// [`FD_LIMIT`], and reads the address it announces.
    fn spawn(&self) -> Result<(Running, SocketAddr)> {
        let mut command = Command::new(&self.exe);
        command
            .args(&self.args)
            .args(["--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: only async-signal-safe calls (getrlimit, setrlimit) between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                let mut limit = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                    limit.rlim_cur = limit.rlim_max.min(FD_LIMIT);
                    libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start the {}", self.name))?;
        let stderr = child.stderr.take().expect("piped stderr");
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let tail = tail.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(addr) = announced_address(&line) {
                        let _ = tx.send(addr);
                    }
                    let mut tail = tail.lock().unwrap();
                    if tail.len() == 5 {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            });
        }
        let running = Running {
            child,
            stderr_tail: tail,
        };
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => Ok((running, addr)),
            Err(_) => {
                let mut running = running;
                let _ = running.child.kill();
                let _ = running.child.wait();
                bail!(
                    "the {} did not announce its address: {}",
                    self.name,
                    running.tail()
                )
            }
        }
    }

    pub(super) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url.read().unwrap())
    }

    fn pid(&self) -> Option<u32> {
        self.running.lock().unwrap().as_ref().map(|r| r.child.id())
    }

    /// Resident set size now, in KiB.
    pub(super) fn rss_kib(&self) -> Option<u64> {
        ProcessStats::of(self.pid()?).ok()?.rss_kib
    }

    /// Samples the peak RSS; counts and restarts a child that exited.
    pub(super) fn watch(&self) {
        let mut running = self.running.lock().unwrap();
        let Some(r) = running.as_mut() else { return };
        if let Some(peak) = ProcessStats::of(r.child.id())
            .ok()
            .and_then(|s| s.peak_rss_kib)
        {
            self.peak_rss_kib.fetch_max(peak, Ordering::Relaxed);
        }
        let Ok(Some(status)) = r.child.try_wait() else {
            return;
        };
        let what = format!("{}; stderr: {}", describe(status), r.tail());
        eprintln!("promlab soak: the {} exited: {what}", self.name);
        self.exits.lock().unwrap().push(what);
        *running = None;
        match self.spawn() {
            Ok((fresh, addr)) => {
                *running = Some(fresh);
                *self.base_url.write().unwrap() = format!("http://{addr}");
            }
            Err(e) => self
                .exits
                .lock()
                .unwrap()
                .push(format!("restart failed: {e:#}")),
        }
    }

    /// SIGTERM, then SIGKILL after [`SHUTDOWN_GRACE`].
    pub(super) fn shut_down(&self) -> ServerEnd {
        self.watch();
        let mut graceful = None;
        if let Some(mut r) = self.running.lock().unwrap().take() {
            let pid = r.child.id();
            if let Some(peak) = ProcessStats::of(pid).ok().and_then(|s| s.peak_rss_kib) {
                self.peak_rss_kib.fetch_max(peak, Ordering::Relaxed);
            }
            // SAFETY: signalling our own child, which has not been reaped.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + SHUTDOWN_GRACE;
            let mut exited = false;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = r.child.try_wait() {
                    exited = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if !exited {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
            graceful = Some(exited);
        }
        ServerEnd {
            name: self.name,
            exits: self.exits.lock().unwrap().clone(),
            peak_rss_kib: self.peak_rss_kib.load(Ordering::Relaxed),
            graceful,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut r) = self.running.get_mut().ok().and_then(Option::take) {
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
    }
}

impl Running {
    fn tail(&self) -> String {
        let tail = self.stderr_tail.lock().unwrap();
        tail.iter().cloned().collect::<Vec<_>>().join(" | ")
    }
}

/// The address in `... on http://ADDR[/path] ...`, the line `promlab serve` starts with.
fn announced_address(line: &str) -> Option<SocketAddr> {
    let (_, rest) = line.split_once(" on http://")?;
    rest.split(['/', ' ']).next()?.parse().ok()
}

pub(super) fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal} ({})", signal_name(signal)),
        _ => status.to_string(),
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGBUS => "SIGBUS",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        _ => "other",
    }
}

/// A child killed (and reaped) when dropped.
pub(super) struct Reaped(pub(super) Child);

impl Reaped {
    /// Its exit status and stderr, or `None` (and killed) if it runs past `limit`.
    pub(super) fn wait_within(mut self, limit: Duration) -> Option<(ExitStatus, String)> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.0.try_wait() {
                let mut stderr = String::new();
                if let Some(mut e) = self.0.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
                }
                return Some((status, stderr));
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            announced_address("promlab: remote-write receiver on http://127.0.0.1:4242/api/v1/write (strategies: all)"),
            Some("127.0.0.1:4242".parse().unwrap())
        );
        assert_eq!(
            announced_address(
                "promlab: serving /metrics (store) on http://127.0.0.1:9 (strategies: all)"
            ),
            Some("127.0.0.1:9".parse().unwrap())
        );
    }
}
