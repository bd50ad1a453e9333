//! The cluster's tables and their rows.
//!
//! Three tables, each a `*_local` `ReplacingMergeTree` on every node and a
//! `Distributed` table of the same columns over the cluster, which queries read:
//!
//! - `bins`: one row per (receiver incarnation, aggregation, window, group,
//!   sign, bin key) with the bin's count `n`;
//! - `panes`: one row per (receiver incarnation, aggregation, window, group)
//!   with the pane's count, zero count, min, max, samples refused and relative accuracy;
//! - `receivers`: each incarnation's life: started, progress (every window
//!   ending at or before `closed_through_ms` has been written), windows lost
//!   (dropped past the queue's bound, with their samples), samples a window
//!   refused for groups without a pane, stopped.
//!
//! A receiver writes to the local tables of the node it is pointed at.
//! Every column is in the sorting key but the counts (and `at_ms`), so a
//! retried or repeated insert writes rows equal to rows already there: the
//! engine keeps one of them when it merges parts, and the query keeps one
//! of them before it merges receivers (`any(n) … GROUP BY` the whole key), so
//! a repeat never counts twice wherever it lands. Receivers never share a
//! key: it holds the receiver's id and its incarnation (its start time, ns).

use super::client::{literal, ClickHouse, Error};
use super::rowbinary::Writer;
use promlab::ingest::distributed::PaneRows;

/// Where the tables live: a database on every node, and the cluster (a
/// `remote_servers` entry of each node's config) its `Distributed` tables span.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    pub database: String,
    pub cluster: String,
}

pub const DEFAULT_DATABASE: &str = "promlab";
pub const DEFAULT_CLUSTER: &str = "promlab";

pub const BINS_COLUMNS: &str =
    "aggregation, window_start, group_key, receiver, incarnation, sign, bin, n";
pub const PANES_COLUMNS: &str = "aggregation, window_start, group_key, receiver, incarnation, n, zero_n, min_value, max_value, dropped, alpha";
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
    /// EXISTS`: run on every node, as often as wanted).
    pub fn statements(&self) -> Vec<String> {
        let db = &self.database;
        let key = "aggregation, window_start, group_key, receiver, incarnation";
        let day = "PARTITION BY intDiv(window_start, 86400000)";
        let mut out = vec![format!("CREATE DATABASE IF NOT EXISTS {db}")];
        let tables = [
            (
                "bins",
                "aggregation String, window_start Int64, group_key String, receiver String, \
                 incarnation UInt64, sign Int8, bin Int32, n UInt64",
                format!("{day} ORDER BY ({key}, sign, bin)"),
            ),
            (
                "panes",
                "aggregation String, window_start Int64, group_key String, receiver String, \
                 incarnation UInt64, n UInt64, zero_n UInt64, min_value Float64, \
                 max_value Float64, dropped UInt64, alpha Float64",
                format!("{day} ORDER BY ({key})"),
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
            out.push(format!(
                "CREATE TABLE IF NOT EXISTS {db}.{name}_local ({columns}) \
                 ENGINE = ReplacingMergeTree() {order}"
            ));
            out.push(format!(
                "CREATE TABLE IF NOT EXISTS {db}.{name} AS {db}.{name}_local \
                 ENGINE = Distributed({}, {db}, {name}_local)",
                self.cluster
            ));
        }
        out
    }

    /// Creates what is missing on the node `ch`.
    pub fn create(&self, ch: &ClickHouse) -> Result<(), Error> {
        for statement in self.statements() {
            ch.execute(&statement, &[])?;
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

/// One close's rows, `RowBinary`, for the three local tables.
#[derive(Default)]
pub struct Batch {
    pub bins: Writer,
    pub panes: Writer,
    pub receivers: Writer,
    /// Rows in `bins` and `panes`.
    pub rows: u64,
    /// (aggregation, window start, samples) of each window in the batch.
    pub windows: Vec<(String, i64, u64)>,
    /// The `closed_through_ms` of its progress row, if it has one.
    pub progress: Option<i64>,
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
        self.bins.buf.len() + self.panes.buf.len() + self.receivers.buf.len()
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
        let mut count = pane.zero_count;
        for &(sign, bin, n) in &pane.bins {
            self.bins
                .string(aggregation.as_bytes())
                .i64(window_start)
                .string(group_key)
                .string(who.receiver.as_bytes())
                .u64(who.incarnation)
                .i8(sign)
                .i32(bin)
                .u64(n);
            count += n;
            self.rows += 1;
        }
        self.panes
            .string(aggregation.as_bytes())
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

    /// Inserts the batch into the node's local tables: bins and panes before
    /// the `receivers` rows that claim them, so a claim is never ahead of its rows.
    pub fn insert(&self, ch: &ClickHouse, schema: &Schema) -> Result<(), Error> {
        for (table, columns, rows) in [
            ("bins_local", BINS_COLUMNS, &self.bins),
            ("panes_local", PANES_COLUMNS, &self.panes),
            ("receivers_local", RECEIVERS_COLUMNS, &self.receivers),
        ] {
            if !rows.buf.is_empty() {
                ch.insert(&schema.table(table), columns, &rows.buf)?;
            }
        }
        Ok(())
    }
}
