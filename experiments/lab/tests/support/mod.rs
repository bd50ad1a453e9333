//! What the lab's binary tests share: `promlab serve` as a child process on a
//! free loopback port (killed and reaped on drop, its stderr drained and kept),
//! and one HTTP request through the lab's client.

#![allow(dead_code)] // each test binary uses its own part of this module

use promlab_lab::http_client::{Client, Response};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A child process killed (and reaped) when dropped, so no test leaves one behind.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running `promlab serve`; killed and reaped when dropped, so no test leaves one behind.
pub struct Served {
    child: Child,
    pub addr: SocketAddr,
    stderr: Arc<Mutex<Vec<String>>>,
}

/// `promlab serve ARGS --listen 127.0.0.1:0`.
pub fn serve(args: &[&str]) -> Served {
    start(args, None)
}

/// [`serve`] under an open-file limit of `max_files` (`ulimit -n`).
pub fn serve_with_max_files(args: &[&str], max_files: u64) -> Served {
    start(args, Some(max_files))
}

fn start(args: &[&str], max_files: Option<u64>) -> Served {
    let mut command = Command::new(env!("CARGO_BIN_EXE_promlab"));
    command
        .arg("serve")
        .args(args)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(n) = max_files {
        // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child before exec.
        unsafe {
            command.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = command.spawn().expect("spawn promlab serve");
    let stderr = child.stderr.take().unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let kept = lines.clone();
    let (tx, rx) = mpsc::channel();
    // Drain stderr for the life of the child (a full pipe would block it), echoing and keeping it.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[promlab serve] {line}");
            if let Some(addr) = announced_address(&line) {
                let _ = tx.send(addr);
            }
            kept.lock().unwrap().push(line);
        }
    });
    let mut served = Served {
        child,
        addr: "0.0.0.0:0".parse().unwrap(),
        stderr: lines,
    };
    served.addr = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| {
            panic!(
                "promlab serve did not report its address: {:?}",
                served.stderr_lines()
            )
        });
    served
}

/// The address in `... on http://ADDR[/path] ...`, the line `promlab serve` starts with.
fn announced_address(line: &str) -> Option<SocketAddr> {
    let (_, rest) = line.split_once(" on http://")?;
    rest.split(['/', ' ']).next()?.parse().ok()
}

impl Served {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every line it has written to stderr so far.
    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    pub fn assert_alive(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "promlab serve died: {:?}",
            self.child.try_wait()
        );
    }

    /// SIGTERM, then its exit within `within` (the test fails past it).
    pub fn terminate(&mut self, within: Duration) -> ExitStatus {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                started.elapsed() < within,
                "promlab serve ignored SIGTERM for {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `http(self.addr, …)`.
    pub fn http(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, String) {
        http(self.addr, method, path, headers, body)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real Prometheus (`binary`) with `config`, its data in `tsdb/` beside
/// the config, its web interface on a free loopback port (returned), its log
/// to `log`; killed and reaped when dropped.
pub fn prometheus(
    binary: &std::path::Path,
    config: &std::path::Path,
    log: Stdio,
) -> (Reaped, SocketAddr) {
    let web: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let data = config.with_file_name("tsdb");
    let child = Command::new(binary)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", data.display()))
        .arg(format!("--web.listen-address={web}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn prometheus");
    (Reaped(child), web)
}

/// A loopback port nothing listens on (as of now).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The lab's client with a 30 s bound on every request.
pub fn client() -> Client {
    Client::new(Some(Duration::from_secs(30)), 1)
}

/// One request: (status, body as text); panics if no answer came.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let url = format!("http://{addr}{path}");
    let response = client()
        .request(method, &url, headers, body)
        .unwrap_or_else(|e| panic!("{method} {url}: {e:#}"));
    (response.status, response.text())
}

/// `GET path` with `headers`; the whole response, or why there is none.
pub fn try_get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<Response> {
    client().get(&format!("http://{addr}{path}"), headers)
}

/// `GET path` with `headers`; panics if no answer came.
pub fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    try_get(addr, path, headers).unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e:#}"))
}
