//! The query path, checked against the reference answers: what the receiver
//! serves at `/api/v1/quantiles` and what `promlab ablate` times.
//!
//! After a request sequence, while the stream runs (the windows the
//! watermark closed): every aggregation's `query_json` (the receiver's kept
//! answer), `encode_query` (`asap-query`'s `all-uncached` arm) and `query`
//! through serde (its `all-serde` arm), and `query_all` (what the ingest
//! scenarios serialize); then, once flushed, `query_all` again and the
//! counters (the ingest scenarios' answer). Each must be the reference's
//! answer ([`reference::ingest::answer`]: the reference panes' values through
//! the `sketches-ddsketch` crate), byte for byte.
//!
//! The laned ingester is held to the same answers up to the sign of a zero:
//! of the extremes `0.0` and `-0.0` (equal values) one ingester keeps the first
//! it saw and a merge of lanes the home's (`promlab::ingest::lanes`).

use promlab::ingest::lanes::LanedIngester;
use promlab::ingest::pipeline::Ingester;
use promlab::ingest::plan::Plan;
use promlab::ingest::window::Stats;
use promlab::reference;
use serde_json::Value;

/// What answers queries: one ingester, or the receiver's lanes.
pub(super) trait Answers {
    /// `query_json` of the last closed window, as the receiver serves it.
    fn query_json(&self, aggregation: &str) -> Option<Vec<u8>>;
    /// The same through the other paths, which must give the same bytes.
    fn other_paths(&self, _aggregation: &str) -> Vec<(&'static str, Vec<u8>)> {
        Vec::new()
    }
    fn query_all_json(&self) -> Vec<u8>;
    fn flush(&mut self);
    fn totals(&self) -> Stats;
    /// Whether the sign of a zero extreme may differ from the reference's.
    fn zero_sign_may_differ(&self) -> bool;
}

impl Answers for Ingester {
    fn query_json(&self, aggregation: &str) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        Ingester::query_json(self, aggregation, None, &mut out).then_some(out)
    }

    fn other_paths(&self, aggregation: &str) -> Vec<(&'static str, Vec<u8>)> {
        let mut uncached = Vec::new();
        self.encode_query(aggregation, None, &mut uncached);
        let serde = self
            .query(aggregation, None)
            .map(|r| serde_json::to_vec(&r).expect("a query result serializes"))
            .unwrap_or_default();
        vec![("encode_query", uncached), ("query + serde", serde)]
    }

    fn query_all_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.query_all()).expect("query results serialize")
    }

    fn flush(&mut self) {
        Ingester::flush(self)
    }

    fn totals(&self) -> Stats {
        Ingester::totals(self)
    }

    fn zero_sign_may_differ(&self) -> bool {
        false
    }
}

impl Answers for LanedIngester {
    fn query_json(&self, aggregation: &str) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        LanedIngester::query_json(self, aggregation, None, &mut out).then_some(out)
    }

    fn query_all_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.query_all()).expect("query results serialize")
    }

    fn flush(&mut self) {
        LanedIngester::flush(self)
    }

    fn totals(&self) -> Stats {
        LanedIngester::totals(self)
    }

    fn zero_sign_may_differ(&self) -> bool {
        self.lanes() > 1
    }
}

/// Checks every query path of `got` (fed the requests `outcome` was made
/// of) against the reference, then flushes it and checks again with the
/// counters. Returns how many answers were compared.
pub(super) fn check(
    got: &mut impl Answers,
    plan: &Plan,
    outcome: &reference::ingest::Outcome,
) -> Result<usize, String> {
    let mut answers = 0;
    for (a, agg) in plan.aggregations.iter().enumerate() {
        let want = reference::ingest::answer(outcome, plan, a, false);
        let served = got
            .query_json(&agg.id)
            .ok_or_else(|| format!("no aggregation `{}` to query", agg.id))?;
        compare(got, &format!("query_json({})", agg.id), &served, &want)?;
        for (path, bytes) in got.other_paths(&agg.id) {
            if bytes != served {
                return Err(format!(
                    "{path}({}) differs from query_json: {}",
                    agg.id,
                    promlab::reference::first_difference::first_difference(
                        &bytes,
                        &served,
                        path,
                        "query_json"
                    )
                ));
            }
        }
        answers += 1;
    }
    let want = reference::ingest::answers(outcome, plan, false);
    compare(got, "query_all", &got.query_all_json(), &want)?;
    got.flush();
    let want = reference::ingest::answers(outcome, plan, true);
    compare(
        got,
        "query_all after the flush",
        &got.query_all_json(),
        &want,
    )?;
    answers += 2 * plan.aggregations.len();
    let (t, c) = (got.totals(), outcome.counts);
    let counts =
        |accepted, late, stale, rejected, unrouted| [accepted, late, stale, rejected, unrouted];
    let (got_counts, want_counts) = (
        counts(t.accepted, t.late, t.stale, t.rejected, t.unrouted),
        counts(c.accepted, c.late, c.stale, c.rejected, c.unrouted),
    );
    if got_counts != want_counts {
        return Err(format!(
            "counters (accepted, late, stale, rejected, unrouted) {got_counts:?}, the reference's {want_counts:?}"
        ));
    }
    Ok(answers)
}

fn compare(got: &impl Answers, what: &str, bytes: &[u8], want: &Value) -> Result<(), String> {
    let want_bytes = serde_json::to_vec(want).expect("a JSON value serializes");
    if bytes == want_bytes {
        return Ok(());
    }
    if got.zero_sign_may_differ() {
        let parsed: Value =
            serde_json::from_slice(bytes).map_err(|e| format!("{what}: not JSON: {e}"))?;
        if same_up_to_zero_sign(&parsed, want) {
            return Ok(());
        }
    }
    Err(format!(
        "{what} differs from the reference answer {}",
        promlab::reference::first_difference::first_difference(
            bytes,
            &want_bytes,
            "promlab",
            "reference"
        )
    ))
}

/// Equal JSON, numbers compared as `f64`s (so `0.0 == -0.0`).
fn same_up_to_zero_sign(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_up_to_zero_sign(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((k, x), (l, y))| k == l && same_up_to_zero_sign(x, y))
        }
        (x, y) => x == y,
    }
}
