//! A standalone ZooKeeper for a local replicated cluster: Debian's
//! `zookeeper` package (`/usr/share/java/zookeeper.jar`, its dependencies on
//! the jar's own class path) run by `java` on a loopback port, its data in
//! its own directory, no admin server, no systemd. What `promlab cluster
//! start --replicas 2` and the replica tests run.

use super::process::Server;
use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Debian's ZooKeeper jar (its manifest names every jar it needs).
pub const JAR: &str = "/usr/share/java/zookeeper.jar";

/// `java` on `PATH` (or `/usr/bin/java`) and the ZooKeeper jar, if both are there.
pub fn server_command() -> Option<Command> {
    if !Path::new(JAR).is_file() {
        return None;
    }
    let java = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("java"))
        .find(|p| p.is_file())?;
    let mut command = Command::new(java);
    // A small heap and a quick start: a test server holding a few hundred znodes.
    command.args([
        "-Xms32m",
        "-Xmx128m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-cp",
        JAR,
        "org.apache.zookeeper.server.ZooKeeperServerMain",
    ]);
    Some(command)
}

/// The server's `zoo.cfg`: loopback `port`, data in `data/` beside it (the
/// server runs in its directory), short ticks so sessions expire in seconds,
/// no admin HTTP server (it would take port 8080), `srvr` for the readiness probe.
pub fn config(port: u16) -> String {
    format!(
        "# promlab's local ZooKeeper: written by `promlab cluster config --replicas N`\n\
         # (experiments/lab/src/cluster/zookeeper.rs); run in this directory.\n\
         tickTime=500\n\
         dataDir=data\n\
         clientPort={port}\n\
         clientPortAddress=127.0.0.1\n\
         admin.enableServer=false\n\
         maxClientCnxns=0\n\
         4lw.commands.whitelist=srvr\n"
    )
}

/// Writes `dir/zoo.cfg`.
pub fn write_config(dir: &Path, port: u16) -> Result<()> {
    std::fs::create_dir_all(dir.join("data"))
        .with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("zoo.cfg"), config(port))?;
    Ok(())
}

/// Whether a ZooKeeper on 127.0.0.1:`port` serves requests: its `srvr`
/// answer is its status (`ruok` answers `imok` before it serves, and a
/// ClickHouse 18.16 whose first session is refused at start crashes).
pub fn is_serving(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    ) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut answer = Vec::new();
    s.write_all(b"srvr").is_ok()
        && s.read_to_end(&mut answer).is_ok()
        && answer.starts_with(b"Zookeeper version")
}

/// One ZooKeeper (killed when dropped).
pub struct ZooKeeper {
    pub port: u16,
    server: Server,
}

impl ZooKeeper {
    /// A server in `dir` (its `zoo.cfg` written there) on 127.0.0.1:`port`, not started.
    pub fn new(dir: &Path, port: u16) -> Result<Self> {
        write_config(dir, port)?;
        Ok(ZooKeeper {
            port,
            server: Server::new(dir, "ZooKeeper"),
        })
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Its directory (`zoo.cfg`, `data/`, logs).
    pub fn dir(&self) -> &Path {
        &self.server.dir
    }

    /// Starts the server (its data kept from any earlier run) and waits (up
    /// to `within`) until it serves.
    pub fn start(&mut self, within: Duration) -> Result<()> {
        let mut command = server_command().with_context(|| {
            format!("no ZooKeeper found (java and {JAR}): apt-get install zookeeper")
        })?;
        command.arg("zoo.cfg");
        let port = self.port;
        self.server
            .start(command, within, &["stderr.log"], || is_serving(port))
    }

    /// SIGKILL, at once.
    pub fn kill(&mut self) {
        self.server.kill();
    }
}
