//! `promlab query --clickhouse URL --agg ID [--window START_MS]`: one
//! window's answer from the cluster, the bytes one receiver fed every sample
//! answers.
//!
//! The merge is two `GROUP BY`s through the `Distributed` tables: the inner
//! keeps one of any equal rows (`any(n)` per whole key: a repeated insert),
//! the outer adds the receivers' rows of each group and bin (`sum`, and
//! `min`/`max` of the extremes) — integer sums, exact in any order. The
//! library turns each group's summed bins back into a sketch and encodes the
//! answer with the receiver's own encoder (`promlab::ingest::bins`).
//!
//! Never a silently partial quantile: a shard that does not answer fails
//! the query, naming it; a window some receiver has not written (it is
//! behind, it dropped the window past its queue's bound, or it died with the
//! window open) is answered with an `"incomplete"` list naming the receivers
//! and why, and the command fails after printing it.

use super::client::{literal, ClickHouse, Error};
use super::rowbinary::Reader;
use super::schema::{Event, Schema};
use anyhow::{anyhow, bail, Context, Result};
use promlab::ingest::bins::{Bins, PaneBins};
use promlab::ingest::distributed::encode_answer;
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

/// The shards of the cluster that do not answer a trivial query, each as `shard N (host:port)`.
pub fn unavailable_shards(ch: &ClickHouse, schema: &Schema) -> Vec<String> {
    let Ok(shards) = schema.shards(ch) else {
        return Vec::new();
    };
    shards
        .into_iter()
        .filter(|(_, addr)| {
            let probe = format!("SELECT 1 FROM remote({}, system, one)", literal(addr));
            ch.execute(&probe, &[]).is_err()
        })
        .map(|(n, addr)| format!("shard {n} ({addr})"))
        .collect()
}

/// `agg`'s answer for `window` (`None`: the newest window every receiver has written).
pub fn answer(
    ch: &ClickHouse,
    schema: &Schema,
    agg: &Aggregation,
    window: Option<i64>,
) -> Result<Answer> {
    let lives = lives(ch, schema, agg)?;
    let window_ms = agg.window_ms();
    let start = match window {
        Some(start) => Some(start),
        None => newest_written(ch, schema, agg, &lives)?,
    };
    let mut json = Vec::new();
    let Some(start) = start else {
        // No such window: the receiver's answer for none (its start `null`).
        encode_answer(agg, 0, Vec::new(), 0, &mut json);
        return Ok(Answer {
            window_start: None,
            json,
            incomplete: Vec::new(),
        });
    };
    let groups = merged_bins(ch, schema, agg, start)?;
    // The samples the window refused for groups without a pane, over receivers.
    let refused: u64 = lives
        .1
        .iter()
        .filter(|r| r.event == Event::Refused as i8 && r.window_start == start)
        .map(|r| r.samples)
        .sum();
    encode_answer(agg, start, groups, refused, &mut json);
    let incomplete = incomplete(&lives, start, window_ms);
    if !incomplete.is_empty() {
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
            serde_json::to_writer(&mut json, &entry)?;
        }
        json.extend_from_slice(b"]}");
    }
    Ok(Answer {
        window_start: Some(start),
        json,
        incomplete,
    })
}

/// Every receiver's incarnations (in start order), and the lost rows of `agg`.
fn lives(ch: &ClickHouse, schema: &Schema, agg: &Aggregation) -> Result<Lives> {
    let sql = format!(
        "SELECT receiver, incarnation, event, aggregation, window_start, closed_through_ms, samples \
         FROM {} FORMAT RowBinary",
        schema.table("receivers")
    );
    let body = select(ch, schema, &sql)?;
    let mut rows = BTreeSet::new();
    let mut r = Reader::new(&body);
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
    let sql = format!(
        "SELECT receiver, incarnation, min(window_start) FROM {} WHERE aggregation = {} \
         GROUP BY receiver, incarnation FORMAT RowBinary",
        schema.table("panes"),
        literal(&agg.id)
    );
    let body = select(ch, schema, &sql)?;
    let mut first: BTreeMap<(String, u64), i64> = BTreeMap::new();
    let mut r = Reader::new(&body);
    while !r.is_done() {
        let receiver = String::from_utf8_lossy(r.string()?).into_owned();
        first.insert((receiver, r.u64()?), r.i64()?);
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
    for ((receiver, incarnation), start) in first {
        if let Some(life) = lives
            .get_mut(&receiver)
            .and_then(|l| l.get_mut(&incarnation))
        {
            life.first_window = Some(start);
        }
    }
    let lives = lives
        .into_iter()
        .map(|(r, l)| (r, l.into_iter().collect()))
        .collect();
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

/// The newest window of `agg` every receiver has written (closed and taken).
fn newest_written(
    ch: &ClickHouse,
    schema: &Schema,
    agg: &Aggregation,
    (lives, _): &Lives,
) -> Result<Option<i64>> {
    let Some(through) = written_through(lives) else {
        return Ok(None);
    };
    let sql = format!(
        "SELECT max(window_start), count() FROM {} WHERE aggregation = {} AND window_start <= {} FORMAT RowBinary",
        schema.table("panes"),
        literal(&agg.id),
        through.saturating_sub(agg.window_ms())
    );
    let body = select(ch, schema, &sql)?;
    let mut r = Reader::new(&body);
    let (newest, rows) = (r.i64()?, r.u64()?);
    Ok((rows > 0).then_some(newest))
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

/// Every group's bins of window `start`, summed over receivers as the SQL sums them.
fn merged_bins(
    ch: &ClickHouse,
    schema: &Schema,
    agg: &Aggregation,
    start: i64,
) -> Result<BTreeMap<Vec<u8>, PaneBins>> {
    let filter = format!(
        "aggregation = {} AND window_start = {start}",
        literal(&agg.id)
    );
    let panes_sql = format!(
        "SELECT group_key, sum(pn), sum(pz), min(pmin), max(pmax), sum(pd), min(pa), max(pa) FROM (\
           SELECT group_key, receiver, incarnation, any(n) AS pn, any(zero_n) AS pz, \
                  any(min_value) AS pmin, any(max_value) AS pmax, any(dropped) AS pd, any(alpha) AS pa \
           FROM {} WHERE {filter} GROUP BY group_key, receiver, incarnation) \
         GROUP BY group_key FORMAT RowBinary",
        schema.table("panes")
    );
    let bins_sql = format!(
        "SELECT group_key, sign, bin, sum(bn) FROM (\
           SELECT group_key, receiver, incarnation, sign, bin, any(n) AS bn \
           FROM {} WHERE {filter} GROUP BY group_key, receiver, incarnation, sign, bin) \
         GROUP BY group_key, sign, bin FORMAT RowBinary",
        schema.table("bins")
    );
    // Per group: its pane's summary and (sign, key) → count, keys ascending.
    #[allow(clippy::type_complexity)]
    let mut groups: BTreeMap<Vec<u8>, (PaneBins, u64, BTreeMap<(i8, i32), u64>)> = BTreeMap::new();
    let body = select(ch, schema, &panes_sql)?;
    let mut r = Reader::new(&body);
    while !r.is_done() {
        let key = r.string()?.to_vec();
        let (count, zero_count, min, max) = (r.u64()?, r.u64()?, r.f64()?, r.f64()?);
        let dropped = r.u64()?;
        let (alpha_lo, alpha_hi) = (r.f64()?, r.f64()?);
        if alpha_lo != agg.relative_accuracy || alpha_hi != agg.relative_accuracy {
            bail!(
                "window {start} of `{}` was written with relative_accuracy {alpha_lo}{}, the plan says {}: its bins mean other values",
                agg.id,
                if alpha_hi != alpha_lo { format!(" to {alpha_hi}") } else { String::new() },
                agg.relative_accuracy
            );
        }
        let bins = PaneBins {
            zero_count,
            min,
            max,
            dropped,
            ..PaneBins::default()
        };
        groups.insert(key, (bins, count, BTreeMap::new()));
    }
    let body = select(ch, schema, &bins_sql)?;
    let mut r = Reader::new(&body);
    while !r.is_done() {
        let key = r.string()?;
        let (sign, bin, n) = (r.i8()?, r.i32()?, r.u64()?);
        let (_, _, sums) = groups.get_mut(key).with_context(|| {
            format!(
                "group {} of window {start} has bins but no pane row",
                String::from_utf8_lossy(key)
            )
        })?;
        if sign != 1 && sign != -1 {
            bail!("a bin row of sign {sign}");
        }
        sums.insert((sign, bin), n);
    }
    groups
        .into_iter()
        .map(|(key, (mut bins, count, sums))| {
            let of_sign = |s: i8| {
                Bins::from_sorted(
                    sums.range((s, i32::MIN)..=(s, i32::MAX))
                        .map(|(&(_, k), &n)| (k, n)),
                )
            };
            bins.positive = of_sign(1);
            bins.negative = of_sign(-1);
            if bins.count() != count {
                bail!(
                    "group {} of window {start}: its bins count {} values, its panes {count}",
                    String::from_utf8_lossy(&key),
                    bins.count()
                );
            }
            Ok((key, bins))
        })
        .collect()
}
