//! Each shard's own node, for reads that skip the `Distributed` table.
//!
//! A read through a `Distributed` table costs its initiator a round of
//! remote queries on top of the shards' own work; one group's rows are a few
//! granules a shard, so that overhead is most of the read. Given a node of
//! every shard (`--clickhouse` once per node, any order, replicas included),
//! [`Shards`] maps each to its shard once (each node's `system.clusters`
//! says which of the cluster's shards it is, `is_local`), and
//! [`Shards::read_each`] sends a statement on the `*_local` tables to every
//! shard at once: one replica a shard, the next of that shard when one does
//! not answer, and a shard none of whose nodes answers fails the read,
//! named as the `Distributed` path names it.
//!
//! `promlab query --group` given a node of every shard reads this way, and
//! `promlab cluster measure` times it beside the `Distributed` read (the
//! answers checked equal): one group over ten windows in 16–18 ms against
//! 20–33 ms on the 3-node local cluster (`experiments/cluster/README.md`).

use super::client::{literal, ClickHouse, Error};
use super::schema::Schema;
use anyhow::{anyhow, Result};
use std::collections::BTreeMap;

/// One shard: its number, its replicas' addresses (`host:port`, as the
/// cluster lists them) and the nodes given that serve it.
#[derive(Clone, Debug)]
struct Shard {
    number: u32,
    addrs: Vec<String>,
    nodes: Vec<ClickHouse>,
}

/// Every shard of the cluster, each with at least one node given.
#[derive(Clone, Debug)]
pub struct Shards {
    cluster: String,
    shards: Vec<Shard>,
}

impl Shards {
    /// Maps `nodes` to the shards of `schema`'s cluster (each node asked
    /// once, all at once). `None` when some shard has no node that answered
    /// among them: the caller reads through the `Distributed` table instead.
    pub fn resolve(nodes: &[ClickHouse], schema: &Schema) -> Option<Shards> {
        let sql = format!(
            "SELECT shard_num, host_name, port, is_local FROM system.clusters WHERE cluster = {} \
             ORDER BY shard_num, replica_num FORMAT TabSeparated",
            literal(&schema.cluster)
        );
        let answers: Vec<Option<String>> = std::thread::scope(|s| {
            let asks: Vec<_> = nodes
                .iter()
                .map(|ch| s.spawn(|| ch.execute(&sql, &[]).ok()))
                .collect();
            asks.into_iter()
                .map(|a| a.join().ok().flatten())
                .map(|body| body.map(|b| String::from_utf8_lossy(&b).into_owned()))
                .collect()
        });
        let mut shards: BTreeMap<u32, Shard> = BTreeMap::new();
        let mut listed = false;
        for (ch, text) in nodes.iter().zip(&answers) {
            let Some(text) = text else { continue };
            for line in text.lines() {
                let f: Vec<&str> = line.split('\t').collect();
                let [number, host, port, local] = f[..] else {
                    continue;
                };
                let Ok(number) = number.parse() else { continue };
                let shard = shards.entry(number).or_insert_with(|| Shard {
                    number,
                    addrs: Vec::new(),
                    nodes: Vec::new(),
                });
                if !listed {
                    shard.addrs.push(format!("{host}:{port}"));
                }
                if local == "1" && !shard.nodes.iter().any(|n| n.url() == ch.url()) {
                    shard.nodes.push(ch.clone());
                }
            }
            listed = true;
        }
        let whole = !shards.is_empty() && shards.values().all(|s| !s.nodes.is_empty());
        whole.then(|| Shards {
            cluster: schema.cluster.clone(),
            shards: shards.into_values().collect(),
        })
    }

    /// Runs each of `statements` on every shard, all at once: per statement,
    /// the shards' answers (in shard order). A node that does not answer
    /// gives way to the next of its shard; an error the node answered with
    /// (a missing table, bad SQL) fails the read as it is.
    pub fn read_each(&self, statements: &[&str]) -> Result<Vec<Vec<Vec<u8>>>> {
        let answers: Vec<Vec<Result<Vec<u8>>>> = std::thread::scope(|s| {
            let reads: Vec<Vec<_>> = statements
                .iter()
                .map(|sql| {
                    self.shards
                        .iter()
                        .map(|shard| s.spawn(move || self.read_shard(shard, sql)))
                        .collect()
                })
                .collect();
            reads
                .into_iter()
                .map(|r| {
                    r.into_iter()
                        .map(|h| {
                            h.join()
                                .unwrap_or_else(|_| Err(anyhow!("a shard's reader panicked")))
                        })
                        .collect()
                })
                .collect()
        });
        answers
            .into_iter()
            .map(|per_shard| per_shard.into_iter().collect())
            .collect()
    }

    fn read_shard(&self, shard: &Shard, sql: &str) -> Result<Vec<u8>> {
        let mut failure = None;
        for node in &shard.nodes {
            match node.execute(sql, &[]) {
                Ok(body) => return Ok(body),
                // Not there (or refusing connections): the next replica.
                Err(
                    e @ (Error::Transport { .. }
                    | Error::Server {
                        code: Some(210 | 209 | 159),
                        ..
                    }),
                ) => failure = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        Err(anyhow!(
            "shard {} ({}) of cluster `{}` did not answer, so no answer would be whole: {}",
            shard.number,
            shard.addrs.join(", "),
            self.cluster,
            failure.map_or_else(|| "no node of it given".to_string(), |e| e.to_string())
        ))
    }
}
