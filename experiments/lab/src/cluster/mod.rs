//! Past one machine: closed windows' bins in a ClickHouse cluster, and N
//! receivers answering exactly as one (the operators' page is
//! `experiments/cluster/README.md`).
//!
//! - [`rowbinary`]: the `RowBinary` format, both ways (floats as bits);
//! - [`client`]: ClickHouse's HTTP interface through the lab's HTTP client;
//! - [`schema`]: the tables, their rows, and why a repeated insert never counts twice;
//! - [`export`]: `serve --clickhouse`: the bounded queue and its writer;
//! - [`query`]: `promlab query --clickhouse`: the SQL merge and the answer's bytes;
//! - [`shards`]: each shard's own node, the per-group read without a `Distributed` hop (measured beside it);
//! - [`hashmod`]: Prometheus's `hashmod`, for `feed --url U1 --url U2 …`;
//! - [`local`]: a local cluster of `clickhouse-server` processes (tests, `promlab cluster`);
//! - [`zookeeper`]: the ZooKeeper a local replicated cluster runs;
//! - [`process`]: a local server's process (its directory, its logs, its readiness);
//! - [`measure`]: `promlab cluster measure`, the costs side by side in one run.
//!
//! The merge itself — bins out of a pane, summed, back into a sketch, the
//! answer's bytes — is the pipeline library's (`promlab::ingest::bins`).

pub mod client;
pub mod export;
pub mod hashmod;
pub mod local;
pub mod measure;
pub mod process;
pub mod query;
pub mod rowbinary;
pub mod schema;
pub mod shards;
pub mod zookeeper;

/// The first HTTP port of the shipped local cluster (`experiments/cluster/local/`).
pub const LOCAL_BASE_PORT: u16 = 18123;
