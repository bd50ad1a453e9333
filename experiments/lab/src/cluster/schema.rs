//! The cluster's tables and their rows.
//!
//! Two tables, each a `*_local` `ReplacingMergeTree` on every node (in a
//! replicated cluster `ReplicatedReplacingMergeTree`, one ZooKeeper path a
//! shard) and a `Distributed` table of the same columns over the cluster,
//! which queries read:
//!
//! - `pane_bins`: one row per (receiver incarnation, aggregation, window,
//!   group): the pane's count, zero count, min, max, samples refused,
//!   relative accuracy, and its bins as arrays (per sign, the keys ascending
//!   and their counts) — the granularity a query reads, one row a group;
//! - `receivers`: each incarnation's life: started, progress (every window
//!   ending at or before `closed_through_ms` has been written), windows lost
//!   (dropped past the queue's bound, with their samples), samples a window
//!   refused for groups without a pane, stopped.
//!
//! A receiver writes to the local tables of the node it is pointed at.
//! An incarnation writes a group's pane of a window once, so a retried or
//! repeated insert writes rows equal to rows already there, key and all: the
//! engine keeps one of them when it merges parts, and the query keeps one
//! per key before it merges receivers, so a repeat never counts twice
//! wherever it lands. Receivers never share a key: it holds the receiver's
//! id and its incarnation (its start time, ns).
//!
//! ClickHouse releases: these statements, the `RowBinary` rows and the
//! queries of [`super::query`] are one dialect, run unchanged on ClickHouse
//! 18.16 (the cluster tests' servers) and on a current release (26.9, chDB's
//! engine; tests/cluster_current.rs checks the answers equal; the replicated
//! statements have met 18.16 only, tests/cluster_replicas.rs). The
//! one difference met is outside the SQL: a current release refuses to
//! create a `Distributed` table whose cluster is not in the node's
//! `remote_servers` (code 701), so a node's config names the cluster before
//! the tables are created. A per-release variant of a statement, if one is
//! ever needed, belongs here.
//!
//! Earlier releases wrote a row per bin (`bins`, `panes`); those tables are
//! left alone and no longer read.

use super::client::{literal, ClickHouse, Error};
use super::rowbinary::{ReadError, Reader, Writer};
use promlab::ingest::distributed::PaneRows;
use std::time::Duration;

/// Where the tables live: a database on every node, and the cluster (a
/// `remote_servers` entry of each node's config) its `Distributed` tables span.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    pub database: String,
    pub cluster: String,
}

/// Rows of `pane_bins` a primary-key mark covers (ClickHouse's default is
/// 8,192). One group's query reads, per window it asks for, the granule(s)
/// holding that group: at 8,192 rows that read 30 granules of 8,192 rows
/// for 10 windows on 3 shards (278,022 rows, 55 MB, ~35 ms on 18.16), at
/// 256 rows 7,680 rows (1.5 MB, ~7 ms, of which ~4 ms is the `Distributed`
/// round itself). A whole window reads its rows either way, as fast. The
/// price is a primary index 32 times as large: one key (about 60 bytes)
/// held in memory per 256 rows. Tables created before keep the granularity
/// they were created with.
pub const PANE_BINS_GRANULE: u32 = 256;

pub const DEFAULT_DATABASE: &str = "promlab";
pub const DEFAULT_CLUSTER: &str = "promlab";

pub const PANE_BINS_COLUMNS: &str = "aggregation, window_start, group_key, receiver, incarnation, n, zero_n, min_value, max_value, dropped, alpha, positive_keys, positive_counts, negative_keys, negative_counts";
pub const RECEIVERS_COLUMNS: &str =
    "receiver, incarnation, event, at_ms, aggregation, window_start, closed_through_ms, samples";

/// What a `receivers` row says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i8)]
pub enum Event {
    /// The incarnation started (`at_ms`).
    Started = 0,
    /// Every window ending at or before `closed_through_ms` is written.
    Progress = 1,
    /// The window (`aggregation`, `window_start`) was dropped past the queue's
    /// bound; `samples` of it are missing from the answer.
    Lost = 2,
    /// Stopped cleanly: every window, open ones included, was written.
    Stopped = 3,
    /// `samples` of the window (`aggregation`, `window_start`) were refused for
    /// groups that got no pane there (past a receiver limit): the answer's
    /// window-level `"dropped"`.
    Refused = 4,
}

impl Event {
    pub fn from_i8(v: i8) -> Option<Event> {
        [
            Event::Started,
            Event::Progress,
            Event::Lost,
            Event::Stopped,
            Event::Refused,
        ]
        .into_iter()
        .find(|e| *e as i8 == v)
    }
}

/// Which DDL [`Schema::statements`] gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ddl {
    /// `ReplacingMergeTree` tables, run on each node (one shard a node).
    PerNode,
    /// `ReplicatedReplacingMergeTree` tables (ZooKeeper path
    /// `/clickhouse/tables/{shard}/DATABASE/TABLE`, the node's `{replica}`),
    /// run on one node.
    ReplicatedNode,
    /// The replicated tables, each statement `ON CLUSTER`: run once, through any node.
    OnCluster,
}

/// Whether the node at `ch` is a replica: it has both the `{shard}` and
/// `{replica}` macros. A node that cannot tell (no `system.macros`) is not.
pub fn is_replicated(ch: &ClickHouse) -> Result<bool, Error> {
    let sql =
        "SELECT count() FROM system.macros WHERE macro IN ('shard', 'replica') FORMAT TabSeparated";
    match ch.execute(sql, &[]) {
        Ok(body) => Ok(String::from_utf8_lossy(&body).trim() == "2"),
        Err(e @ Error::Transport { .. }) => Err(e),
        Err(Error::Server { .. }) => Ok(false),
    }
}

impl Default for Schema {
    fn default() -> Self {
        Schema {
            database: DEFAULT_DATABASE.into(),
            cluster: DEFAULT_CLUSTER.into(),
        }
    }
}

impl Schema {
    pub fn table(&self, name: &str) -> String {
        format!("{}.{name}", self.database)
    }

    /// Every statement that creates what is missing, in order (each `IF NOT
    /// EXISTS`: run as often as wanted), for `ddl`.
    pub fn statements(&self, ddl: Ddl) -> Vec<String> {
        let db = &self.database;
        let key = "aggregation, window_start, group_key, receiver, incarnation";
        let day = "PARTITION BY intDiv(window_start, 86400000)";
        let on_cluster = match ddl {
            Ddl::OnCluster => format!(" ON CLUSTER {}", self.cluster),
            Ddl::PerNode | Ddl::ReplicatedNode => String::new(),
        };
        let mut out = vec![format!("CREATE DATABASE IF NOT EXISTS {db}{on_cluster}")];
        let tables = [
            (
                "pane_bins",
                "aggregation String, window_start Int64, group_key String, receiver String, \
                 incarnation UInt64, n UInt64, zero_n UInt64, min_value Float64, \
                 max_value Float64, dropped UInt64, alpha Float64, \
                 positive_keys Array(Int32), positive_counts Array(UInt64), \
                 negative_keys Array(Int32), negative_counts Array(UInt64)",
                format!("{day} ORDER BY ({key}) SETTINGS index_granularity = {PANE_BINS_GRANULE}"),
            ),
            (
                "receivers",
                "receiver String, incarnation UInt64, event Int8, at_ms Int64, \
                 aggregation String, window_start Int64, closed_through_ms Int64, samples UInt64",
                "ORDER BY (receiver, incarnation, event, aggregation, window_start, closed_through_ms)"
                    .to_string(),
            ),
        ];
        for (name, columns, order) in tables {
            let engine = match ddl {
                Ddl::PerNode => "ReplacingMergeTree()".to_string(),
                // One ZooKeeper path per shard and table; the node's own replica name.
                Ddl::ReplicatedNode | Ddl::OnCluster => format!(
                    "ReplicatedReplacingMergeTree({}, '{{replica}}')",
                    literal(&format!("/clickhouse/tables/{{shard}}/{db}/{name}_local"))
                ),
            };
            out.push(format!(
                "CREATE TABLE IF NOT EXISTS {db}.{name}_local{on_cluster} ({columns}) \
                 ENGINE = {engine} {order}"
            ));
            out.push(format!(
                "CREATE TABLE IF NOT EXISTS {db}.{name}{on_cluster} AS {db}.{name}_local \
                 ENGINE = Distributed({}, {db}, {name}_local)",
                self.cluster
            ));
        }
        out
    }

    /// Creates what is missing on the node `ch` alone (what a receiver does
    /// for its node): replicated tables if the node has the `{shard}` and
    /// `{replica}` macros of a replicated cluster, else unreplicated ones.
    /// Never `ON CLUSTER`, which waits for every node: a replica down must
    /// not stop a receiver writing to the one up.
    pub fn create(&self, ch: &ClickHouse) -> Result<(), Error> {
        let ddl = if is_replicated(ch)? {
            Ddl::ReplicatedNode
        } else {
            Ddl::PerNode
        };
        for statement in self.statements(ddl) {
            ch.execute(&statement, &[])?;
        }
        Ok(())
    }

    /// Creates what is missing on every node of a replicated cluster, each
    /// statement once `ON CLUSTER` through the node `ch`; a node that has not
    /// run one within `timeout` fails it (ClickHouse names the node).
    pub fn create_on_cluster(&self, ch: &ClickHouse, timeout: Duration) -> Result<(), Error> {
        let secs = timeout.as_secs().max(1).to_string();
        for statement in self.statements(Ddl::OnCluster) {
            ch.execute(&statement, &[("distributed_ddl_task_timeout", &secs)])?;
        }
        Ok(())
    }

    /// The cluster's shards as the node `ch` knows them: (shard number, host:port).
    pub fn shards(&self, ch: &ClickHouse) -> Result<Vec<(u32, String)>, Error> {
        let sql = format!(
            "SELECT shard_num, host_name, port FROM system.clusters WHERE cluster = {} \
             ORDER BY shard_num, replica_num FORMAT TabSeparated",
            literal(&self.cluster)
        );
        let text = String::from_utf8_lossy(&ch.execute(&sql, &[])?).into_owned();
        Ok(text
            .lines()
            .filter_map(|line| {
                let mut f = line.split('\t');
                let shard = f.next()?.parse().ok()?;
                Some((shard, format!("{}:{}", f.next()?, f.next()?)))
            })
            .collect())
    }
}

/// One close's rows, `RowBinary`, for the two local tables.
#[derive(Default)]
pub struct Batch {
    pub panes: Writer,
    pub receivers: Writer,
    /// Rows in `panes` (one a group's pane).
    pub rows: u64,
    /// (aggregation, window start, samples) of each window in the batch.
    pub windows: Vec<(String, i64, u64)>,
    /// The `closed_through_ms` of its progress row, if it has one.
    pub progress: Option<i64>,
}

/// A `pane_bins` row read back ([`PANE_BINS_COLUMNS`], `RowBinary`).
pub struct PaneRow<'a> {
    pub aggregation: &'a [u8],
    pub window_start: i64,
    pub group_key: &'a [u8],
    pub receiver: &'a [u8],
    pub incarnation: u64,
    /// Values in the pane (its bins' counts and its zero count).
    pub count: u64,
    pub alpha: f64,
    pub pane: PaneRows,
}

/// Why a `pane_bins` row could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RowError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("a pane_bins row with {0} bin keys and {1} counts")]
    Unpaired(usize, usize),
}

impl<'a> PaneRow<'a> {
    /// The next row of `r`, as [`Batch::pane`] writes it.
    pub fn read(r: &mut Reader<'a>) -> Result<PaneRow<'a>, RowError> {
        let (aggregation, window_start) = (r.string()?, r.i64()?);
        let (group_key, receiver, incarnation) = (r.string()?, r.string()?, r.u64()?);
        let (count, zero_count, min, max) = (r.u64()?, r.u64()?, r.f64()?, r.f64()?);
        let (dropped, alpha) = (r.u64()?, r.f64()?);
        let mut pane = PaneRows {
            zero_count,
            min,
            max,
            dropped,
            ..PaneRows::default()
        };
        for bins in [&mut pane.positive, &mut pane.negative] {
            let keys = (0..r.len(4)?)
                .map(|_| r.i32())
                .collect::<Result<Vec<_>, _>>()?;
            let n = r.len(8)?;
            if n != keys.len() {
                return Err(RowError::Unpaired(keys.len(), n));
            }
            for key in keys {
                bins.push((key, r.u64()?));
            }
        }
        Ok(PaneRow {
            aggregation,
            window_start,
            group_key,
            receiver,
            incarnation,
            count,
            alpha,
            pane,
        })
    }
}

/// Who writes: a receiver's id and its incarnation.
#[derive(Clone, Debug)]
pub struct Origin {
    pub receiver: String,
    pub incarnation: u64,
}

impl Batch {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.panes.buf.len() + self.receivers.buf.len()
    }

    /// One group's pane of a window.
    pub fn pane(
        &mut self,
        who: &Origin,
        aggregation: &str,
        window_start: i64,
        group_key: &[u8],
        alpha: f64,
        pane: &PaneRows,
    ) {
        let count = pane.zero_count
            + pane
                .positive
                .iter()
                .chain(&pane.negative)
                .map(|b| b.1)
                .sum::<u64>();
        let w = &mut self.panes;
        w.string(aggregation.as_bytes())
            .i64(window_start)
            .string(group_key)
            .string(who.receiver.as_bytes())
            .u64(who.incarnation)
            .u64(count)
            .u64(pane.zero_count)
            .f64(pane.min)
            .f64(pane.max)
            .u64(pane.dropped)
            .f64(alpha);
        for bins in [&pane.positive, &pane.negative] {
            w.len(bins.len());
            for &(key, _) in bins {
                w.i32(key);
            }
            w.len(bins.len());
            for &(_, n) in bins {
                w.u64(n);
            }
        }
        self.rows += 1;
    }

    /// A `receivers` row.
    #[allow(clippy::too_many_arguments)]
    pub fn event(
        &mut self,
        who: &Origin,
        event: Event,
        at_ms: i64,
        aggregation: &str,
        window_start: i64,
        closed_through_ms: i64,
        samples: u64,
    ) {
        if event == Event::Progress {
            self.progress = Some(closed_through_ms);
        }
        self.receivers
            .string(who.receiver.as_bytes())
            .u64(who.incarnation)
            .i8(event as i8)
            .i64(at_ms)
            .string(aggregation.as_bytes())
            .i64(window_start)
            .i64(closed_through_ms)
            .u64(samples);
    }

    /// Inserts the batch into the node's local tables: panes before the
    /// `receivers` rows that claim them, so a claim is never ahead of its rows.
    pub fn insert(&self, ch: &ClickHouse, schema: &Schema) -> Result<(), Error> {
        for (table, columns, rows) in [
            ("pane_bins_local", PANE_BINS_COLUMNS, &self.panes),
            ("receivers_local", RECEIVERS_COLUMNS, &self.receivers),
        ] {
            if !rows.buf.is_empty() {
                ch.insert(&schema.table(table), columns, &rows.buf)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicated_ddl_is_the_same_tables_on_a_replicated_engine() {
        let schema = Schema::default();
        let single = schema.statements(Ddl::PerNode);
        let node = schema.statements(Ddl::ReplicatedNode);
        let on_cluster = schema.statements(Ddl::OnCluster);
        assert_eq!(single.len(), 5);
        assert_eq!((node.len(), on_cluster.len()), (5, 5));
        assert!(single
            .iter()
            .all(|s| !s.contains("Replicated") && !s.contains("ON CLUSTER")));
        assert!(on_cluster.iter().all(|s| s.contains(" ON CLUSTER promlab")));
        assert!(node[1].contains(
            "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/promlab/pane_bins_local', '{replica}') PARTITION BY"
        ));
        // Each the unreplicated statement but for the engine (and ON CLUSTER).
        let tables = ["", "pane_bins_local", "", "receivers_local", ""];
        for (((s, n), c), table) in single.iter().zip(&node).zip(&on_cluster).zip(tables) {
            let replicated = format!(
                "ReplicatedReplacingMergeTree('/clickhouse/tables/{{shard}}/promlab/{table}', '{{replica}}')"
            );
            assert_eq!(&s.replace("ReplacingMergeTree()", &replicated), n);
            let name = n.split(' ').find(|w| w.starts_with("promlab")).unwrap();
            let on = n.replacen(name, &format!("{name} ON CLUSTER promlab"), 1);
            assert_eq!(&on, c);
        }
    }

    #[test]
    fn a_pane_row_reads_back_as_written() {
        let who = Origin {
            receiver: "r1".into(),
            incarnation: 7,
        };
        let pane = PaneRows {
            positive: vec![(-3, 2), (5, 1), (300, 9)],
            negative: vec![(4, 4)],
            zero_count: 3,
            min: -2.5,
            max: f64::MAX,
            dropped: 1,
        };
        let mut batch = Batch::default();
        batch.pane(&who, "data", 60_000, b"\"g\"", 0.01, &pane);
        batch.pane(&who, "data", 120_000, b"", 0.01, &PaneRows::default());
        let mut r = Reader::new(&batch.panes.buf);
        let row = PaneRow::read(&mut r).unwrap();
        assert_eq!(
            (
                row.aggregation,
                row.window_start,
                row.group_key,
                row.receiver
            ),
            (&b"data"[..], 60_000, &b"\"g\""[..], &b"r1"[..])
        );
        assert_eq!((row.incarnation, row.count, row.alpha), (7, 19, 0.01));
        assert_eq!(row.pane, pane);
        let empty = PaneRow::read(&mut r).unwrap();
        assert_eq!((empty.count, empty.pane), (0, PaneRows::default()));
        assert!(r.is_done());
        // Cut anywhere, the row is an error, never a panic.
        for cut in 0..batch.panes.buf.len() / 2 {
            assert!(PaneRow::read(&mut Reader::new(&batch.panes.buf[..cut])).is_err());
        }
    }
}
