//! A local ClickHouse cluster: `clickhouse-server` processes on loopback
//! ports, each with its own directory and config, all named in every node's
//! `remote_servers` under one cluster: one shard a node, or (`replicas` > 1)
//! each shard's replicas on consecutive nodes, with a ZooKeeper
//! ([`super::zookeeper`]) and each node's `{shard}`/`{replica}` macros. What
//! the tests, `promlab cluster start` and `promlab cluster measure` run; the
//! configs it writes for the default ports are shipped in
//! `experiments/cluster/local/` (and `local-replicas/`).

use super::client::ClickHouse;
use super::process::Server;
use super::zookeeper::ZooKeeper;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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

/// The shipped replicated cluster's ZooKeeper port: `base + 300`.
pub fn zookeeper_port(base: u16) -> u16 {
    base + 300
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

/// How the nodes form the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Its name in every node's `remote_servers`.
    pub cluster: String,
    /// Nodes a shard: shard `s` (from 1) is nodes `(s-1)·replicas + 1 …
    /// s·replicas`. 1: one shard a node, no ZooKeeper.
    pub replicas: usize,
    /// ZooKeeper's `HOST:PORT`, needed when `replicas` > 1.
    pub zookeeper: Option<String>,
}

impl Layout {
    /// One shard a node (no replicas, no ZooKeeper).
    pub fn unreplicated(cluster: &str) -> Layout {
        Layout {
            cluster: cluster.to_string(),
            replicas: 1,
            zookeeper: None,
        }
    }

    /// Node `i`'s (from 0) shard and replica numbers, from 1.
    pub fn position(&self, i: usize) -> (usize, usize) {
        (i / self.replicas + 1, i % self.replicas + 1)
    }
}

/// Node `i`'s `config.xml`: its ports, data under its own directory (paths
/// relative to it: the server runs there), every node in the cluster; with
/// replicas, ZooKeeper, the `{shard}`/`{replica}` macros and `ON CLUSTER` DDL.
pub fn node_config(ports: &[NodePorts], i: usize, layout: &Layout) -> String {
    let p = ports[i];
    let cluster = &layout.cluster;
    let mut shards = String::new();
    let replicated = layout.replicas > 1;
    for shard in ports.chunks(layout.replicas) {
        if !replicated {
            shards.push_str(&format!(
                "      <shard><replica><host>127.0.0.1</host><port>{}</port></replica></shard>\n",
                shard[0].tcp
            ));
            continue;
        }
        // Internal replication: an insert goes to one replica, which hands it to the others.
        shards
            .push_str("      <shard>\n        <internal_replication>true</internal_replication>\n");
        for node in shard {
            shards.push_str(&format!(
                "        <replica><host>127.0.0.1</host><port>{}</port></replica>\n",
                node.tcp
            ));
        }
        shards.push_str("      </shard>\n");
    }
    let replication = match (&layout.zookeeper, replicated) {
        (Some(zookeeper), true) => {
            let (host, port) = zookeeper.rsplit_once(':').unwrap_or((zookeeper, "2181"));
            let (shard, replica) = layout.position(i);
            format!(
                r#"  <!-- Replicas: ZooKeeper keeps each shard's replicas in step, and runs `ON CLUSTER` DDL. -->
  <zookeeper>
    <node><host>{host}</host><port>{port}</port></node>
    <session_timeout_ms>10000</session_timeout_ms>
  </zookeeper>
  <distributed_ddl>
    <path>/clickhouse/task_queue/ddl</path>
  </distributed_ddl>
  <!-- This node: replica {replica} of shard {shard} (the replicated tables' ZooKeeper paths use them). -->
  <macros>
    <shard>{shard}</shard>
    <replica>node{node}</replica>
  </macros>
"#,
                node = i + 1,
            )
        }
        _ => String::new(),
    };
    let topology = if replicated {
        format!(
            "{} shards of {} replicas, ZooKeeper at {}",
            ports.len() / layout.replicas,
            layout.replicas,
            layout.zookeeper.as_deref().unwrap_or("?")
        )
    } else {
        "One shard per node, no replicas (for replicas, see experiments/cluster/README.md)"
            .to_string()
    };
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
{replication}  <!-- {topology}. -->
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
pub fn write_configs(dir: &Path, ports: &[NodePorts], layout: &Layout) -> Result<Vec<PathBuf>> {
    if layout.replicas == 0 || !ports.len().is_multiple_of(layout.replicas) {
        bail!(
            "{} nodes do not make shards of {} replicas",
            ports.len(),
            layout.replicas
        );
    }
    if layout.replicas > 1 && layout.zookeeper.is_none() {
        bail!("replicas need ZooKeeper");
    }
    let mut dirs = Vec::new();
    for i in 0..ports.len() {
        let node = dir.join(format!("node{}", i + 1));
        std::fs::create_dir_all(&node).with_context(|| format!("creating {}", node.display()))?;
        std::fs::write(node.join("config.xml"), node_config(ports, i, layout))?;
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

/// One node (its server started or not).
pub struct Node {
    pub ports: NodePorts,
    server: Server,
}

impl Node {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.http)
    }

    /// Its directory (config, data, logs).
    pub fn dir(&self) -> &Path {
        &self.server.dir
    }

    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    pub fn is_running(&mut self) -> bool {
        self.server.is_running()
    }

    /// Starts the server and waits (up to `within`) until it answers a query.
    pub fn start(&mut self, within: Duration) -> Result<()> {
        let mut command = server_command().context(
            "no ClickHouse server found (clickhouse-server, or clickhouse): apt-get install clickhouse-server",
        )?;
        command.arg("--config-file=config.xml");
        let ch = ClickHouse::new(&self.url(), Duration::from_secs(2))?;
        self.server
            .start(command, within, &["log/error.log", "stderr.log"], || {
                ch.execute("SELECT 1", &[]).is_ok()
            })
    }

    /// SIGTERM, then SIGKILL if it has not exited within `within`.
    pub fn stop(&mut self, within: Duration) {
        self.server.stop(within);
    }

    /// SIGKILL, at once.
    pub fn kill(&mut self) {
        self.server.kill();
    }
}

/// The nodes of one cluster (and the ZooKeeper it runs, if any); every
/// process stopped when dropped.
pub struct LocalCluster {
    pub nodes: Vec<Node>,
    pub layout: Layout,
    /// The ZooKeeper this cluster runs (none: unreplicated, or one of the operator's).
    pub zookeeper: Option<ZooKeeper>,
}

impl LocalCluster {
    /// One shard a node: writes the configs under `dir` and starts every node (each within `within`).
    pub fn start(dir: &Path, ports: &[NodePorts], cluster: &str, within: Duration) -> Result<Self> {
        Self::start_with(dir, ports, &Layout::unreplicated(cluster), None, within)
    }

    /// Writes the configs under `dir`, starts `zookeeper` (if given: it should
    /// be `layout`'s) and then every node (each within `within`).
    pub fn start_with(
        dir: &Path,
        ports: &[NodePorts],
        layout: &Layout,
        zookeeper: Option<ZooKeeper>,
        within: Duration,
    ) -> Result<Self> {
        let dirs = write_configs(dir, ports, layout)?;
        let mut local = LocalCluster {
            nodes: dirs
                .into_iter()
                .zip(ports)
                .map(|(dir, &ports)| Node {
                    ports,
                    server: Server::new(&dir, "ClickHouse"),
                })
                .collect(),
            layout: layout.clone(),
            zookeeper,
        };
        if let Some(zookeeper) = &mut local.zookeeper {
            zookeeper.start(within)?;
        }
        for node in &mut local.nodes {
            node.start(within)?;
        }
        Ok(local)
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// Stops every node (SIGTERM, then SIGKILL past `within` each), then ZooKeeper.
    pub fn stop(&mut self, within: Duration) {
        for node in &mut self.nodes {
            node.stop(within);
        }
        if let Some(zookeeper) = &mut self.zookeeper {
            zookeeper.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped configs are what this module writes for the default ports:
    /// `local/` one shard a node, `local-replicas/` three shards of two
    /// replicas with ZooKeeper (`zookeeper/zoo.cfg`).
    #[test]
    fn shipped_configs_are_current() {
        let base = super::super::LOCAL_BASE_PORT;
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cluster");
        let replicated = Layout {
            cluster: "promlab".into(),
            replicas: 2,
            zookeeper: Some(format!("127.0.0.1:{}", zookeeper_port(base))),
        };
        for (dir, layout, nodes) in [
            ("local", Layout::unreplicated("promlab"), 3),
            ("local-replicas", replicated, 6),
        ] {
            let ports = ports_from(base, nodes);
            let regenerate = format!(
                "regenerate with `promlab cluster config --dir experiments/cluster/{dir}{}`",
                if layout.replicas > 1 {
                    " --replicas 2"
                } else {
                    ""
                }
            );
            for i in 0..nodes {
                let node = shipped.join(dir).join(format!("node{}", i + 1));
                let config = std::fs::read_to_string(node.join("config.xml")).unwrap();
                assert_eq!(config, node_config(&ports, i, &layout), "{regenerate}");
                assert_eq!(
                    std::fs::read_to_string(node.join("users.xml")).unwrap(),
                    USERS_XML
                );
            }
            let zoo = std::fs::read_to_string(shipped.join(dir).join("zookeeper/zoo.cfg"));
            match layout.replicas {
                1 => assert!(zoo.is_err(), "{dir} has no ZooKeeper"),
                _ => assert_eq!(
                    zoo.unwrap(),
                    super::super::zookeeper::config(zookeeper_port(base)),
                    "{regenerate}"
                ),
            }
        }
        assert!(!shipped.join("local/node4").exists());
        assert!(!shipped.join("local-replicas/node7").exists());
    }

    #[test]
    fn replicas_are_consecutive_nodes_of_a_shard() {
        let ports = ports_from(20000, 4);
        let layout = Layout {
            cluster: "c".into(),
            replicas: 2,
            zookeeper: Some("127.0.0.1:2181".into()),
        };
        assert_eq!(
            (0..4).map(|i| layout.position(i)).collect::<Vec<_>>(),
            [(1, 1), (1, 2), (2, 1), (2, 2)]
        );
        let config = node_config(&ports, 2, &layout);
        assert!(config.contains("<shard>2</shard>\n    <replica>node3</replica>"));
        assert_eq!(config.matches("<internal_replication>true").count(), 2);
        assert!(config.contains("<host>127.0.0.1</host><port>2181</port>"));
        let single = node_config(&ports, 2, &Layout::unreplicated("c"));
        assert!(!single.contains("zookeeper") && !single.contains("macros"));
        assert_eq!(single.matches("<shard>").count(), 4);
        assert!(write_configs(Path::new("/nonexistent"), &ports_from(1, 3), &layout).is_err());
    }
}
