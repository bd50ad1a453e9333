//! `promlab query --clickhouse URL --agg ID [--window START_MS]`: one
//! window's answer from the cluster, the bytes one receiver fed every sample
//! answers; with `--group`, one group's answers over its last K windows.
//!
//! A window's rows are one per (receiver incarnation, group), read through
//! the `Distributed` table with the window (or the group) in the sorting
//! key's prefix. The merge is in Rust: one row kept per (group, receiver,
//! incarnation) — a repeated insert — then the receivers' rows of each group
//! added bin by bin ([`merge_as_rows`]: integer sums, exact in any order, the
//! function the property test holds to the single pane). `sumMap` on the
//! server ([`server_merge_sql`]) would first have to keep one of any equal
//! rows (a `GROUP BY` of every row) and then sort its maps' keys; `promlab
//! cluster measure` times it beside this path. The library
//! encodes the answer with the receiver's own encoder
//! (`promlab::ingest::bins`).
//!
//! Never a silently partial quantile: a shard that does not answer fails
//! the query, naming it; a window some receiver has not written (it is
//! behind, it dropped the window past its queue's bound, or it died with the
//! window open) is answered with an `"incomplete"` list naming the receivers
//! and why, and the command fails after printing it.

use super::client::{literal, literal_bytes, ClickHouse, Error};
use super::rowbinary::Reader;
use super::schema::{Event, PaneRow, Schema, PANE_BINS_COLUMNS};
use super::shards::Shards;
use anyhow::{anyhow, bail, Result};
use promlab::ingest::bins::PaneBins;
use promlab::ingest::distributed::{encode_answer, merge_as_rows};
use promlab::ingest::plan::Aggregation;
use std::collections::{BTreeMap, BTreeSet};

/// Why part of a window may be missing, per receiver.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Incomplete {
    pub receiver: String,
    pub reason: String,
    /// Samples known to be missing, when known.
    pub samples_lost: Option<u64>,
}

/// One window's answer from the cluster.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The window answered (`None`: there is none).
    pub window_start: Option<i64>,
    /// The receiver's JSON, bytes for bytes, with `"incomplete"` added when not empty.
    pub json: Vec<u8>,
    pub incomplete: Vec<Incomplete>,
}

/// One `receivers` row.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct LogRow {
    receiver: String,
    incarnation: u64,
    event: i8,
    aggregation: String,
    window_start: i64,
    closed_through_ms: i64,
    samples: u64,
}

/// Per receiver its incarnations (in start order), and the `lost` and
/// `refused` rows of the aggregation asked about.
type Lives = (BTreeMap<String, Vec<(u64, Life)>>, Vec<LogRow>);

/// An incarnation's life, from its rows.
#[derive(Clone, Debug, Default)]
struct Life {
    closed_through: Option<i64>,
    stopped: bool,
    /// The first window of the aggregation it wrote.
    first_window: Option<i64>,
}

/// Runs `sql` through the node; a shard that does not answer (code 279, or
/// 210 for a refused connection) becomes an error naming every shard that
/// does not answer, each probed on its own.
fn select(ch: &ClickHouse, schema: &Schema, sql: &str) -> Result<Vec<u8>> {
    // Set here, not left to the user's profile: a shard skipped is a partial answer.
    match ch.execute(sql, &[("skip_unavailable_shards", "0")]) {
        Ok(body) => Ok(body),
        Err(
            e @ Error::Server {
                code: Some(279 | 210 | 209 | 159),
                ..
            },
        ) => {
            let down = unavailable_shards(ch, schema);
            if down.is_empty() {
                return Err(e.into());
            }
            Err(anyhow!(
                "{} of cluster `{}` did not answer, so no answer would be whole (skip_unavailable_shards is never set): {e}",
                down.join(", "),
                schema.cluster
            ))
        }
        Err(e) => Err(e.into()),
    }
}

/// The shards of the cluster none of whose replicas answer a trivial query,
/// each as `shard N (host:port, …)`, its replicas listed.
pub fn unavailable_shards(ch: &ClickHouse, schema: &Schema) -> Vec<String> {
    let Ok(replicas) = schema.shards(ch) else {
        return Vec::new();
    };
    let mut shards: BTreeMap<u32, (Vec<String>, bool)> = BTreeMap::new();
    for (n, addr) in replicas {
        let probe = format!("SELECT 1 FROM remote({}, system, one)", literal(&addr));
        let answers = ch.execute(&probe, &[]).is_ok();
        let shard = shards.entry(n).or_default();
        shard.0.push(addr);
        shard.1 |= answers;
    }
    shards
        .into_iter()
        .filter(|(_, (_, answers))| !answers)
        .map(|(n, (addrs, _))| format!("shard {n} ({})", addrs.join(", ")))
        .collect()
}

/// `agg`'s answer for `window` (`None`: the newest window every receiver has written).
pub fn answer(
    ch: &ClickHouse,
    schema: &Schema,
    agg: &Aggregation,
    window: Option<i64>,
) -> Result<Answer> {
    let window_ms = agg.window_ms();
    let rows_sql = |start: i64| {
        let filter = format!("window_start = {start}");
        panes_sql(&schema.table("pane_bins"), agg, None, &filter)
    };
    let mut json = Vec::new();
    let newest = |lives: &Lives| newest_written(ch, schema, agg, lives);
    let found =
        Tables::Distributed(ch).lives_and_rows(ch, schema, agg, window, rows_sql, newest)?;
    let Some((lives, start, panes)) = found else {
        // No such window: the receiver's answer for none (its start `null`).
        encode_answer(agg, 0, Vec::new(), 0, &mut json);
        return Ok(Answer {
            window_start: None,
            json,
            incomplete: Vec::new(),
        });
    };
    let groups = panes.into_iter().map(|((_, key), bins)| (key, bins));
    encode_answer(agg, start, groups, refused(&lives, start), &mut json);
    let incomplete = incomplete(&lives, start, window_ms);
    append_incomplete(&mut json, &incomplete)?;
    Ok(Answer {
        window_start: Some(start),
        json,
        incomplete,
    })
}

/// The server-side alternative to the merge in Rust, for `promlab cluster
/// measure` to time beside it: one row kept per (group, receiver,
/// incarnation), then `sumMap` of the bins per group, as `RowBinary` (not decoded).
pub fn server_merge_sql(schema: &Schema, agg: &Aggregation, start: i64) -> String {
    format!(
        "SELECT group_key, sumMap(pk, pc), sumMap(nk, nc), sum(pn), sum(pz), min(pmin), max(pmax), sum(pd) FROM (\
           SELECT group_key, any(positive_keys) AS pk, any(positive_counts) AS pc, \
                  any(negative_keys) AS nk, any(negative_counts) AS nc, any(n) AS pn, any(zero_n) AS pz, \
                  any(min_value) AS pmin, any(max_value) AS pmax, any(dropped) AS pd \
           FROM {} WHERE aggregation = {} AND window_start = {start} \
           GROUP BY group_key, receiver, incarnation) \
         GROUP BY group_key FORMAT RowBinary",
        schema.table("pane_bins"),
        literal(&agg.id)
    )
}

/// One group's answers over windows: per window, oldest first, what a
/// receiver fed every sample answers for it with only this group in it.
/// Given `shards`, the rows and the receivers' lives are read from each
/// shard's local tables (at once when told the newest window); without,
/// through the `Distributed` tables.
pub fn group_answers(
    ch: &ClickHouse,
    shards: Option<&Shards>,
    schema: &Schema,
    agg: &Aggregation,
    group_key: &[u8],
    newest: Option<i64>,
    windows: u64,
) -> Result<Vec<Answer>> {
    let window_ms = agg.window_ms();
    let span = window_ms.saturating_mul(windows.saturating_sub(1).min(i64::MAX as u64) as i64);
    let tables = shards.map_or(Tables::Distributed(ch), Tables::Local);
    let rows_sql = |newest: i64| {
        let table = tables.table(schema, "pane_bins");
        group_rows_sql(&table, agg, group_key, newest, windows)
    };
    let closed = |lives: &Lives| newest_closed(ch, schema, agg, lives);
    let found = tables.lives_and_rows(ch, schema, agg, newest, rows_sql, closed)?;
    let Some((lives, newest, panes)) = found else {
        return Ok(Vec::new());
    };
    let oldest = newest.saturating_sub(span);
    let mut panes = panes.into_iter().peekable();
    let mut out = Vec::new();
    let mut start = oldest;
    while start <= newest {
        let mut json = Vec::new();
        let pane = panes.next_if(|((w, _), _)| *w == start);
        let groups = pane.map(|((_, key), bins)| (key, bins));
        // The window-level refused count belongs to no group: left out here.
        encode_answer(agg, start, groups, 0, &mut json);
        let incomplete = incomplete(&lives, start, window_ms);
        append_incomplete(&mut json, &incomplete)?;
        out.push(Answer {
            window_start: Some(start),
            json,
            incomplete,
        });
        start += window_ms;
    }
    Ok(out)
}

/// The samples window `start` refused for groups without a pane, over receivers.
fn refused((_, rows): &Lives, start: i64) -> u64 {
    rows.iter()
        .filter(|r| r.event == Event::Refused as i8 && r.window_start == start)
        .map(|r| r.samples)
        .sum()
}

/// Adds the `"incomplete"` list to an answer's JSON when it is not empty.
fn append_incomplete(json: &mut Vec<u8>, incomplete: &[Incomplete]) -> Result<()> {
    if incomplete.is_empty() {
        return Ok(());
    }
    json.pop(); // the closing `}`
    json.extend_from_slice(b",\"incomplete\":[");
    for (i, inc) in incomplete.iter().enumerate() {
        if i > 0 {
            json.push(b',');
        }
        let mut entry = serde_json::json!({ "receiver": inc.receiver, "reason": inc.reason });
        if let Some(n) = inc.samples_lost {
            entry["samples_lost"] = n.into();
        }
        serde_json::to_writer(&mut *json, &entry)?;
    }
    json.extend_from_slice(b"]}");
    Ok(())
}

/// The `receivers` rows [`lives_of`] reads, from `table`.
fn lives_sql(table: &str, agg: &Aggregation) -> String {
    // Progress rows (one a close) collapse to their furthest per incarnation;
    // every other event's `closed_through_ms` is 0, and equal rows (repeats) one.
    format!(
        "SELECT receiver, incarnation, event, aggregation, window_start, max(closed_through_ms), samples \
         FROM {table} WHERE event IN ({}, {}, {}) OR aggregation = {} \
         GROUP BY receiver, incarnation, event, aggregation, window_start, samples FORMAT RowBinary",
        Event::Started as i8,
        Event::Progress as i8,
        Event::Stopped as i8,
        literal(&agg.id)
    )
}

/// The lives in the answers to [`lives_sql`] (one a shard, or one for the
/// whole cluster: rows repeated across them count once).
fn lives_of(
    ch: &ClickHouse,
    schema: &Schema,
    agg: &Aggregation,
    bodies: &[Vec<u8>],
) -> Result<Lives> {
    let mut rows = BTreeSet::new();
    for body in bodies {
        let mut r = Reader::new(body);
        while !r.is_done() {
            rows.insert(LogRow {
                receiver: String::from_utf8_lossy(r.string()?).into_owned(),
                incarnation: r.u64()?,
                event: r.i8()?,
                aggregation: String::from_utf8_lossy(r.string()?).into_owned(),
                window_start: r.i64()?,
                closed_through_ms: r.i64()?,
                samples: r.u64()?,
            });
        }
    }
    let mut lives: BTreeMap<String, BTreeMap<u64, Life>> = BTreeMap::new();
    let mut lost = Vec::new();
    for row in rows {
        let life = lives
            .entry(row.receiver.clone())
            .or_default()
            .entry(row.incarnation)
            .or_default();
        match Event::from_i8(row.event) {
            Some(Event::Progress) => {
                life.closed_through = life.closed_through.max(Some(row.closed_through_ms))
            }
            Some(Event::Stopped) => life.stopped = true,
            Some(Event::Lost | Event::Refused) if row.aggregation == agg.id => lost.push(row),
            _ => {}
        }
    }
    let mut lives: BTreeMap<String, Vec<(u64, Life)>> = lives
        .into_iter()
        .map(|(r, l)| (r, l.into_iter().collect()))
        .collect();
    // The first window written matters only for an incarnation that follows
    // an unclean stop; only those are looked up (no scan in the usual case).
    let after_unclean: Vec<String> = lives
        .iter()
        .flat_map(|(receiver, l)| {
            l.windows(2)
                .filter(|pair| !pair[0].1.stopped)
                .map(move |pair| {
                    format!(
                        "(receiver = {} AND incarnation = {})",
                        literal(receiver),
                        pair[1].0
                    )
                })
        })
        .collect();
    if !after_unclean.is_empty() {
        let sql = format!(
            "SELECT receiver, incarnation, min(window_start) FROM {} WHERE aggregation = {} \
             AND ({}) GROUP BY receiver, incarnation FORMAT RowBinary",
            schema.table("pane_bins"),
            literal(&agg.id),
            after_unclean.join(" OR ")
        );
        let body = select(ch, schema, &sql)?;
        let mut r = Reader::new(&body);
        while !r.is_done() {
            let receiver = String::from_utf8_lossy(r.string()?).into_owned();
            let (incarnation, start) = (r.u64()?, r.i64()?);
            if let Some((_, life)) = lives
                .get_mut(&receiver)
                .and_then(|l| l.iter_mut().find(|(i, _)| *i == incarnation))
            {
                life.first_window = Some(start);
            }
        }
    }
    Ok((lives, lost))
}

/// How far every receiver has written: the least, over receivers, of the
/// furthest any of its incarnations closed (a cleanly stopped receiver wrote
/// everything it had); `None` when a receiver has written no progress.
fn written_through(lives: &BTreeMap<String, Vec<(u64, Life)>>) -> Option<i64> {
    lives
        .values()
        .map(|incarnations| {
            if incarnations.last().is_some_and(|(_, l)| l.stopped) {
                Some(i64::MAX)
            } else {
                incarnations
                    .iter()
                    .filter_map(|(_, l)| l.closed_through)
                    .max()
            }
        })
        .min()
        .flatten()
}

/// The newest window of `agg` every receiver has written (closed and taken)
/// that holds a row. Looked for first among the [`RECENT_WINDOWS`] windows
/// before the newest progress a receiver reported, a read of their rows'
/// `window_start` alone; only if none of them holds a row, in all of
/// `pane_bins` (a read that grows with the history kept).
fn newest_written(
    ch: &ClickHouse,
    schema: &Schema,
    agg: &Aggregation,
    (lives, _): &Lives,
) -> Result<Option<i64>> {
    let Some(through) = written_through(lives) else {
        return Ok(None);
    };
    let w = agg.window_ms();
    let until = through.saturating_sub(w);
    // Every receiver stopped: windows to its last flush are written, past its last progress.
    let top = match through {
        i64::MAX => lives
            .values()
            .flat_map(|incarnations| incarnations.iter().filter_map(|(_, l)| l.closed_through))
            .max(),
        through => Some(through),
    };
    let newest_from = |from: Option<i64>| -> Result<Option<i64>> {
        let lower = from.map_or(String::new(), |from| format!(" AND window_start >= {from}"));
        let sql = format!(
            "SELECT max(window_start), count() FROM {} WHERE aggregation = {} AND window_start <= {until}{lower} FORMAT RowBinary",
            schema.table("pane_bins"),
            literal(&agg.id),
        );
        let body = select(ch, schema, &sql)?;
        let mut r = Reader::new(&body);
        let (newest, rows) = (r.i64()?, r.u64()?);
        Ok((rows > 0).then_some(newest))
    };
    if let Some(top) = top {
        let recent = top.saturating_sub(w.saturating_mul(RECENT_WINDOWS));
        if let Some(newest) = newest_from(Some(recent))? {
            return Ok(Some(newest));
        }
    }
    newest_from(None)
}

/// How many windows back from the receivers' newest progress
/// [`newest_written`] looks first.
const RECENT_WINDOWS: i64 = 16;

/// The newest window of `agg` every receiver has closed and written, for
/// one group's query: read off the receivers' progress, without a read of
/// `pane_bins` (it may hold no row of the group, or of any group: its
/// answer is then empty). When every receiver has stopped, their progress
/// names no end, and the newest window written is looked up
/// ([`newest_written`]).
fn newest_closed(
    ch: &ClickHouse,
    schema: &Schema,
    agg: &Aggregation,
    lives: &Lives,
) -> Result<Option<i64>> {
    match written_through(&lives.0) {
        None => Ok(None),
        Some(i64::MAX) => newest_written(ch, schema, agg, lives),
        Some(through) => {
            let w = agg.window_ms();
            // The newest start whose window ends at or before `through`.
            let newest = through.div_euclid(w).saturating_sub(1).saturating_mul(w);
            Ok((newest.saturating_add(w) <= through).then_some(newest))
        }
    }
}

/// Why window `start` may lack samples, per receiver.
fn incomplete((lives, lost): &Lives, start: i64, window_ms: i64) -> Vec<Incomplete> {
    let end = start.saturating_add(window_ms);
    let mut out = BTreeSet::new();
    for row in lost
        .iter()
        .filter(|r| r.window_start == start && r.event == Event::Lost as i8)
    {
        out.insert(Incomplete {
            receiver: row.receiver.clone(),
            reason: "dropped: its queue to ClickHouse was at its bound".into(),
            samples_lost: Some(row.samples),
        });
    }
    for (receiver, incarnations) in lives {
        for pair in incarnations.windows(2) {
            let ((_, dead), (_, next)) = (&pair[0], &pair[1]);
            let lost_from = dead.closed_through.unwrap_or(i64::MIN);
            if !dead.stopped && end > lost_from && next.first_window.is_none_or(|f| start <= f) {
                out.insert(Incomplete {
                    receiver: receiver.clone(),
                    reason: format!(
                        "restarted after an unclean stop: the windows it had open were lost (it had written through {})",
                        through_text(dead.closed_through)
                    ),
                    samples_lost: None,
                });
            }
        }
        let Some((_, last)) = incarnations.last() else {
            continue;
        };
        let through = incarnations
            .iter()
            .filter_map(|(_, l)| l.closed_through)
            .max();
        if !last.stopped && through.is_none_or(|t| t < end) {
            out.insert(Incomplete {
                receiver: receiver.clone(),
                reason: format!(
                    "has not written this window yet (written through {})",
                    through_text(through)
                ),
                samples_lost: None,
            });
        }
    }
    out.into_iter().collect()
}

fn through_text(through: Option<i64>) -> String {
    through.map_or("nothing".into(), |t| format!("{t} ms"))
}

/// A group's pane of a window, merged over receivers: ((window start, group key), bins).
type MergedPane = ((i64, Vec<u8>), PaneBins);

/// Where a query's reads go: through the `Distributed` tables from one
/// node, or to each shard's local tables.
#[derive(Clone, Copy)]
enum Tables<'a> {
    Distributed(&'a ClickHouse),
    Local(&'a Shards),
}

impl Tables<'_> {
    /// Table `name` (`pane_bins`, `receivers`) as these reads name it.
    fn table(self, schema: &Schema, name: &str) -> String {
        match self {
            Tables::Distributed(_) => schema.table(name),
            Tables::Local(_) => schema.table(&format!("{name}_local")),
        }
    }

    /// The receivers' lives of `agg`, a window, and the rows `rows_sql`
    /// selects for it. Told the window, the lives and the rows are read at
    /// once; else the lives first, then the rows of the window `find`
    /// picks from them (`None`: there is none, and nothing more is read).
    fn lives_and_rows(
        self,
        ch: &ClickHouse,
        schema: &Schema,
        agg: &Aggregation,
        told: Option<i64>,
        rows_sql: impl Fn(i64) -> String,
        find: impl FnOnce(&Lives) -> Result<Option<i64>>,
    ) -> Result<Option<(Lives, i64, Vec<MergedPane>)>> {
        let lives_sql = lives_sql(&self.table(schema, "receivers"), agg);
        if let Some(window) = told {
            let bodies = self.read_each(schema, &[&lives_sql, &rows_sql(window)])?;
            let lives = lives_of(ch, schema, agg, &bodies[0])?;
            return Ok(Some((lives, window, merged_panes_of(agg, &bodies[1])?)));
        }
        let lives = lives_of(ch, schema, agg, &self.read_each(schema, &[&lives_sql])?[0])?;
        let Some(window) = find(&lives)? else {
            return Ok(None);
        };
        let rows = self.read_each(schema, &[&rows_sql(window)])?;
        Ok(Some((lives, window, merged_panes_of(agg, &rows[0])?)))
    }

    /// Runs `statements`, all at once: per statement, the answers' bodies
    /// (the cluster's one, or one a shard).
    fn read_each(self, schema: &Schema, statements: &[&str]) -> Result<Vec<Vec<Vec<u8>>>> {
        match (self, statements) {
            (Tables::Local(shards), _) => shards.read_each(statements),
            (Tables::Distributed(ch), [sql]) => Ok(vec![vec![select(ch, schema, sql)?]]),
            (Tables::Distributed(ch), _) => std::thread::scope(|s| {
                let reads: Vec<_> = statements
                    .iter()
                    .map(|sql| s.spawn(move || select(ch, schema, sql)))
                    .collect();
                reads
                    .into_iter()
                    .map(|read| {
                        let body = read.join().map_err(|_| anyhow!("a reader panicked"))??;
                        Ok(vec![body])
                    })
                    .collect()
            }),
        }
    }
}

/// The `pane_bins` rows of `agg` in `table` that `filter` selects, those
/// `prewhere` lets by read first (ClickHouse reads the other columns only
/// of granules holding a row it keeps).
fn panes_sql(table: &str, agg: &Aggregation, prewhere: Option<&str>, filter: &str) -> String {
    let prewhere = prewhere.map_or(String::new(), |p| format!("PREWHERE {p} "));
    format!(
        "SELECT {PANE_BINS_COLUMNS} FROM {table} {prewhere}WHERE aggregation = {} AND {filter} FORMAT RowBinary",
        literal(&agg.id)
    )
}

/// The rows of one group in the `windows` windows of `agg` up to `newest`,
/// from `table` (`pane_bins`, or a shard's `pane_bins_local`).
pub fn group_rows_sql(
    table: &str,
    agg: &Aggregation,
    group_key: &[u8],
    newest: i64,
    windows: u64,
) -> String {
    let window_ms = agg.window_ms();
    let span = window_ms.saturating_mul(windows.saturating_sub(1).min(i64::MAX as u64) as i64);
    let mut starts = Vec::new();
    let mut start = newest.saturating_sub(span);
    while start <= newest {
        starts.push(start.to_string());
        start += window_ms;
    }
    // The windows listed, not a range: with `IN` the sorting key's prefix
    // (aggregation, window_start, group_key) narrows each window to the
    // group's granules (on 18.16 a range of windows read more of them). The
    // group first: a shard without its rows then reads no other column.
    let group = format!("group_key = {}", literal_bytes(group_key));
    let filter = format!("window_start IN ({})", starts.join(", "));
    panes_sql(table, agg, Some(&group), &filter)
}

/// The rows in the answers to [`panes_sql`] (one a shard, or one for the
/// whole cluster), merged over receivers, by (window, group key) ascending.
fn merged_panes_of(agg: &Aggregation, bodies: &[Vec<u8>]) -> Result<Vec<MergedPane>> {
    let mut rows = Vec::new();
    for body in bodies {
        let mut r = Reader::new(body);
        while !r.is_done() {
            let row = PaneRow::read(&mut r)?;
            if row.alpha != agg.relative_accuracy {
                bail!(
                    "window {} of `{}` was written with relative_accuracy {}, the plan says {}: its bins mean other values",
                    row.window_start,
                    agg.id,
                    row.alpha,
                    agg.relative_accuracy
                );
            }
            rows.push(row);
        }
    }
    fn id<'a>(row: &PaneRow<'a>) -> (i64, &'a [u8], &'a [u8], u64) {
        (
            row.window_start,
            row.group_key,
            row.receiver,
            row.incarnation,
        )
    }
    rows.sort_unstable_by(|a, b| id(a).cmp(&id(b)));
    // A repeated insert: rows equal key and all; one is kept.
    rows.dedup_by(|a, b| id(a) == id(b));
    rows.chunk_by(|a, b| (a.window_start, a.group_key) == (b.window_start, b.group_key))
        .map(|parts| {
            let merged = merge_as_rows(parts.iter().map(|row| &row.pane));
            let (start, key) = (parts[0].window_start, parts[0].group_key);
            let count: u64 = parts.iter().map(|row| row.count).sum();
            if merged.count() != count {
                bail!(
                    "group {} of window {start}: its bins count {} values, its rows say {count}",
                    String::from_utf8_lossy(key),
                    merged.count()
                );
            }
            Ok(((start, key.to_vec()), merged))
        })
        .collect()
}
