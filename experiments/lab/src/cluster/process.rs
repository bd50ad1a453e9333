//! A server process of a local cluster (a ClickHouse node, ZooKeeper): run
//! in its own directory, its output kept there, dying with the thread that
//! started it, and waited for until it answers.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One server's process in `dir` (none until started).
pub struct Server {
    pub dir: PathBuf,
    /// What it is, for errors: "ClickHouse", "ZooKeeper".
    what: &'static str,
    child: Option<Child>,
}

impl Server {
    pub fn new(dir: &Path, what: &'static str) -> Server {
        Server {
            dir: dir.to_path_buf(),
            what,
            child: None,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Runs `command` in the server's directory (stdout and stderr to
    /// `stdout.log` and `stderr.log` there) and waits up to `within` until
    /// `ready` holds; an exit before then fails with the last lines of the
    /// first of `logs` (paths in the directory) that can be read.
    pub fn start(
        &mut self,
        mut command: Command,
        within: Duration,
        logs: &[&str],
        mut ready: impl FnMut() -> bool,
    ) -> Result<()> {
        if self.is_running() {
            return Ok(());
        }
        let out = std::fs::File::create(self.dir.join("stdout.log"))?;
        let err = std::fs::File::create(self.dir.join("stderr.log"))?;
        // The server dies with the thread that started it (a test, `promlab
        // cluster start`), however that ends: no server outlives its run.
        // SAFETY: prctl is async-signal-safe; nothing else runs before exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {} in {}", self.what, self.dir.display()))?;
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if ready() {
                return Ok(());
            }
            if !self.is_running() {
                let log = logs
                    .iter()
                    .find_map(|name| std::fs::read_to_string(self.dir.join(name)).ok())
                    .unwrap_or_default();
                let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join("\n");
                bail!(
                    "{} in {} exited at start: {tail}",
                    self.what,
                    self.dir.display()
                );
            }
            if started.elapsed() > within {
                self.kill();
                bail!(
                    "{} in {} did not answer within {within:?}",
                    self.what,
                    self.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within `within`.
    pub fn stop(&mut self, within: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: a signal to our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let started = Instant::now();
        while started.elapsed() < within {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGKILL, at once.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
