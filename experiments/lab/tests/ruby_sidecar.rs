//! promlab's Ruby supervisor (`ruby/lib/promlab/sidecar.rb`, what the Puma
//! plugin and `promlab-sidecar` run) with the real binary: it waits for the
//! registry, starts the sidecar, starts it again after a SIGKILL, backs off
//! when the binary keeps failing, is not stopped by a forked worker, and
//! stops it on `stop`; the plain launcher serves until SIGTERM. About 3 s.
//! Without Ruby it is skipped with a notice,
//! and fails under `CI`.

#[path = "../../../tests/common/mod.rs"]
mod common;
mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

struct Driver {
    /// Killed and reaped with the driver.
    _child: support::Reaped,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Driver {
    fn start(store: &Path, listen: SocketAddr, binary: &str) -> Driver {
        let mut child = Command::new("ruby")
            .arg("-I")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ruby/lib"))
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/sidecar_driver.rb"))
            .env("PROMLAB_STORE", store)
            .env("PROMLAB_LISTEN", listen.to_string())
            .env("PROMLAB_BIN", binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("ruby");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut driver = Driver {
            _child: support::Reaped(child),
            stdin,
            stdout,
        };
        driver.expect("started");
        driver
    }

    /// Sends `command`, returns the first line that is no log line.
    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
        self.answer()
    }

    fn answer(&mut self) -> String {
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "the driver exited"
            );
            eprintln!("[driver] {}", line.trim_end());
            if !line.starts_with("log ") {
                return line.trim_end().to_string();
            }
        }
    }

    fn expect(&mut self, want: &str) {
        assert_eq!(self.answer(), want);
    }

    fn starts(&mut self) -> u64 {
        let line = self.ask("starts");
        line.strip_prefix("starts ").unwrap().parse().unwrap()
    }
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn serving(addr: SocketAddr) -> bool {
    support::try_get(addr, "/metrics", &[]).is_ok_and(|r| r.status == 200)
}

fn have_ruby() -> bool {
    let found = Command::new("ruby").arg("-v").output().is_ok();
    if !found {
        common::skip(
            "ruby, so the Ruby supervisor is not run",
            "apt-get install ruby",
        );
    }
    found
}

fn sidecar_pid(store: &Path) -> i32 {
    std::fs::read_to_string(store.join(".promlab-serve.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A scratch store directory (in the returned temporary directory), or
/// `None` without Ruby (the skip said).
fn scratch_store() -> Option<(tempfile::TempDir, PathBuf)> {
    if !have_ruby() {
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    std::fs::create_dir(&store).unwrap();
    Some((tmp, store))
}

#[test]
fn the_supervisor_restarts_the_sidecar_and_stops_it() {
    let Some((_tmp, store)) = scratch_store() else {
        return;
    };
    let addr = free_addr();
    let mut driver = Driver::start(&store, addr, env!("CARGO_BIN_EXE_promlab"));
    // No registry yet: nothing started.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(driver.starts(), 0);
    std::fs::write(
        store.join("registry.json"),
        r#"{"metrics": [{"name": "jobs_total", "type": "counter", "help": "Jobs"}]}"#,
    )
    .unwrap();
    wait_for("the sidecar", Duration::from_secs(20), || serving(addr));
    assert_eq!(driver.starts(), 1);

    // Killed: started again (after the first backoff, 0.5 s).
    let first = sidecar_pid(&store);
    // SAFETY: kill on the sidecar's pid, which this test's driver started.
    unsafe { libc::kill(first, libc::SIGKILL) };
    wait_for("the sidecar again", Duration::from_secs(20), || {
        sidecar_pid(&store) != first && serving(addr)
    });
    assert_eq!(driver.starts(), 2);

    // A forked worker's stop is no stop.
    assert_eq!(driver.ask("fork-stop"), "forked");
    std::thread::sleep(Duration::from_millis(300));
    assert!(serving(addr));

    // Stopped, and not started again.
    assert_eq!(driver.ask("stop"), "stopped");
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err());
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(driver.starts(), 2);
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err());
}

#[test]
fn a_failing_binary_is_restarted_with_backoff() {
    let Some((_tmp, store)) = scratch_store() else {
        return;
    };
    std::fs::write(store.join("registry.json"), r#"{"metrics": []}"#).unwrap();
    // `false` exits at once with status 1: the backoff doubles from 0.5 s.
    let mut driver = Driver::start(&store, free_addr(), "false");
    std::thread::sleep(Duration::from_millis(2500));
    let starts = driver.starts();
    // Runs at 0, 0.5, 1.5 s (then 3.5 s): three, give or take a slow start.
    assert!((2..=4).contains(&starts), "{starts} starts in 2.5 s");
    assert_eq!(driver.ask("stop"), "stopped");
}

/// `ruby/exe/promlab-sidecar`, the plain launcher: serves with its flags,
/// and SIGTERM stops it and its sidecar.
#[test]
fn the_launcher_serves_until_sigterm() {
    let Some((_tmp, store)) = scratch_store() else {
        return;
    };
    std::fs::write(store.join("registry.json"), r#"{"metrics": []}"#).unwrap();
    let addr = free_addr();
    let mut launcher = support::Reaped(
        Command::new("ruby")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ruby/exe/promlab-sidecar"))
            .arg("--store")
            .arg(&store)
            .args([
                "--listen",
                &addr.to_string(),
                "--fold-exited",
                "--fold-every",
                "1",
            ])
            .args(["--binary", env!("CARGO_BIN_EXE_promlab")])
            .spawn()
            .expect("ruby"),
    );
    wait_for("the launcher's sidecar", Duration::from_secs(20), || {
        serving(addr)
    });
    let own = support::get(addr, "/metrics/promlab", &[]).text();
    assert!(own.contains("promlab_fold_runs_total"), "{own}");
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(launcher.0.id() as i32, libc::SIGTERM) };
    let status = launcher.0.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err());
}
