//! A local ClickHouse cluster: N `clickhouse-server` processes on loopback
//! ports, each with its own directory and config, one shard each, all named
//! in every node's `remote_servers` under one cluster. What the tests, `promlab
//! cluster start` and `promlab cluster measure` run; the configs it writes
//! for the default ports are shipped in `experiments/cluster/local/`.

use super::client::ClickHouse;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One node's ports, all on 127.0.0.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodePorts {
    pub http: u16,
    pub tcp: u16,
    pub interserver: u16,
}

/// The ports of `nodes` nodes from `base`: HTTP `base + i`, native TCP
/// `base + 100 + i`, interserver `base + 200 + i` (node `i` from 0).
pub fn ports_from(base: u16, nodes: usize) -> Vec<NodePorts> {
    (0..nodes as u16)
        .map(|i| NodePorts {
            http: base + i,
            tcp: base + 100 + i,
            interserver: base + 200 + i,
        })
        .collect()
}

/// `n` ports free on 127.0.0.1 right now (bound, then released).
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("bound").port())
        .collect()
}

/// `nodes` nodes' ports, each free right now.
pub fn free_node_ports(nodes: usize) -> Vec<NodePorts> {
    free_ports(3 * nodes)
        .chunks(3)
        .map(|p| NodePorts {
            http: p[0],
            tcp: p[1],
            interserver: p[2],
        })
        .collect()
}

/// Node `i`'s `config.xml`: its ports, data under its own directory (paths
/// relative to it: the server runs there), every node in the cluster `cluster`.
pub fn node_config(ports: &[NodePorts], i: usize, cluster: &str) -> String {
    let p = ports[i];
    let mut shards = String::new();
    for node in ports {
        shards.push_str(&format!(
            "      <shard><replica><host>127.0.0.1</host><port>{}</port></replica></shard>\n",
            node.tcp
        ));
    }
    format!(
        r#"<?xml version="1.0"?>
<!-- promlab's local ClickHouse cluster, node {node} of {n}: written by `promlab cluster config`
     (experiments/lab/src/cluster/local.rs). Paths are relative to this directory: the server
     runs here, given this file as its config file. -->
<yandex>
  <logger>
    <level>warning</level>
    <log>log/server.log</log>
    <errorlog>log/error.log</errorlog>
    <size>10M</size>
    <count>2</count>
  </logger>
  <listen_host>127.0.0.1</listen_host>
  <http_port>{http}</http_port>
  <tcp_port>{tcp}</tcp_port>
  <interserver_http_port>{interserver}</interserver_http_port>
  <interserver_http_host>127.0.0.1</interserver_http_host>
  <path>data/</path>
  <tmp_path>tmp/</tmp_path>
  <user_files_path>user_files/</user_files_path>
  <users_config>users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <timezone>UTC</timezone>
  <keep_alive_timeout>10</keep_alive_timeout>
  <max_concurrent_queries>100</max_concurrent_queries>
  <!-- Small caches: a test cluster, not a production server. -->
  <mark_cache_size>67108864</mark_cache_size>
  <uncompressed_cache_size>67108864</uncompressed_cache_size>
  <!-- One shard per node, no replicas (production adds replicas and ZooKeeper: experiments/cluster/README.md). -->
  <remote_servers>
    <{cluster}>
{shards}    </{cluster}>
  </remote_servers>
</yandex>
"#,
        node = i + 1,
        n = ports.len(),
        http = p.http,
        tcp = p.tcp,
        interserver = p.interserver,
    )
}

/// Every node's `users.xml`: the `default` user, no password, loopback only.
pub const USERS_XML: &str = r#"<?xml version="1.0"?>
<!-- promlab's local ClickHouse cluster: the default user, no password, loopback only. -->
<yandex>
  <profiles>
    <default></default>
  </profiles>
  <users>
    <default>
      <password></password>
      <networks>
        <ip>127.0.0.1</ip>
        <ip>::1</ip>
      </networks>
      <profile>default</profile>
      <quota>default</quota>
    </default>
  </users>
  <quotas>
    <default></default>
  </quotas>
</yandex>
"#;

/// Writes every node's directory (`node1/config.xml`, `node1/users.xml`, …) under `dir`.
pub fn write_configs(dir: &Path, ports: &[NodePorts], cluster: &str) -> Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    for i in 0..ports.len() {
        let node = dir.join(format!("node{}", i + 1));
        std::fs::create_dir_all(&node).with_context(|| format!("creating {}", node.display()))?;
        std::fs::write(node.join("config.xml"), node_config(ports, i, cluster))?;
        std::fs::write(node.join("users.xml"), USERS_XML)?;
        dirs.push(node);
    }
    Ok(dirs)
}

/// The ClickHouse server binary: `clickhouse-server` (Debian's), on `PATH` or
/// in `/usr/sbin` (not on a plain user's `PATH`), else `clickhouse server`.
pub fn server_command() -> Option<Command> {
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    };
    if let Some(path) = on_path("clickhouse-server") {
        return Some(Command::new(path));
    }
    on_path("clickhouse").map(|path| {
        let mut c = Command::new(path);
        c.arg("server");
        c
    })
}

/// One running node.
pub struct Node {
    pub dir: PathBuf,
    pub ports: NodePorts,
    child: Option<Child>,
}

impl Node {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.http)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Starts the server and waits (up to `within`) until it answers `/ping`.
    pub fn start(&mut self, within: Duration) -> Result<()> {
        if self.is_running() {
            return Ok(());
        }
        let mut command = server_command().context(
            "no ClickHouse server found (clickhouse-server, or clickhouse): apt-get install clickhouse-server",
        )?;
        let out = std::fs::File::create(self.dir.join("stdout.log"))?;
        let err = std::fs::File::create(self.dir.join("stderr.log"))?;
        // The node dies with the thread that started it (a test, `promlab
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
            .arg("--config-file=config.xml")
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting ClickHouse in {}", self.dir.display()))?;
        self.child = Some(child);
        let ch = ClickHouse::new(&self.url(), Duration::from_secs(2))?;
        let started = Instant::now();
        loop {
            if ch.execute("SELECT 1", &[]).is_ok() {
                return Ok(());
            }
            if !self.is_running() {
                let log = std::fs::read_to_string(self.dir.join("log/error.log"))
                    .or_else(|_| std::fs::read_to_string(self.dir.join("stderr.log")))
                    .unwrap_or_default();
                let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join("\n");
                bail!(
                    "ClickHouse in {} exited at start: {tail}",
                    self.dir.display()
                );
            }
            if started.elapsed() > within {
                self.kill();
                bail!(
                    "ClickHouse in {} did not answer within {within:?}",
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

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// N nodes, one shard each, in one cluster; every node stopped when dropped.
pub struct LocalCluster {
    pub nodes: Vec<Node>,
    pub cluster: String,
}

impl LocalCluster {
    /// Writes the configs under `dir` and starts every node (each within `within`).
    pub fn start(dir: &Path, ports: &[NodePorts], cluster: &str, within: Duration) -> Result<Self> {
        let dirs = write_configs(dir, ports, cluster)?;
        let mut local = LocalCluster {
            nodes: dirs
                .into_iter()
                .zip(ports)
                .map(|(dir, &ports)| Node {
                    dir,
                    ports,
                    child: None,
                })
                .collect(),
            cluster: cluster.to_string(),
        };
        for node in &mut local.nodes {
            node.start(within)?;
        }
        Ok(local)
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// Stops every node (SIGTERM, then SIGKILL past `within` each).
    pub fn stop(&mut self, within: Duration) {
        for node in &mut self.nodes {
            node.stop(within);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped configs are what this module writes for the default ports.
    #[test]
    fn shipped_configs_are_current() {
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cluster/local");
        let ports = ports_from(super::super::LOCAL_BASE_PORT, 3);
        for i in 0..3 {
            let node = shipped.join(format!("node{}", i + 1));
            let config = std::fs::read_to_string(node.join("config.xml")).unwrap();
            assert_eq!(
                config,
                node_config(&ports, i, "promlab"),
                "regenerate with `promlab cluster config --dir experiments/cluster/local`"
            );
            assert_eq!(
                std::fs::read_to_string(node.join("users.xml")).unwrap(),
                USERS_XML
            );
        }
    }
}
