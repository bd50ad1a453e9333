//! The receiver's laned ingester, as `promlab serve` runs it: 1–4 lanes, each
//! an [`Ingester`] built as the receiver builds one with its default flags
//! ([`Limits::serving`], bodies up to 32 MiB), requests in any order.
//!
//! Two ways of feeding, per exposition sequence:
//! - **concurrently**, the receiver's own path: the requests decompressed
//!   outside the lanes, then applied by `handle_decoded` from as many threads
//!   as lanes, each thread taking a free lane. Requests go in groups that may
//!   apply in any order and at once: no sample of a group falls in a window
//!   that the group's requests close (see [`concurrent_groups`]); so the
//!   outcome is the in-order one, whatever the interleaving. Every ingest
//!   strategy set is fed this way (the lanes merge panes through the sketch
//!   seam).
//! - **in seeded shuffled orders**, one request at a time, each on a lane
//!   drawn from the seed (`handle_on`): the shuffles move requests a few
//!   places or anywhere, so windows close early and later samples are late.
//!   The reference is run on the same order.
//!
//! Each run's panes must hold the reference's samples (counts, quantiles
//! within α), be the one ingester's bit for bit (fed the same order) up to
//! the sign of a zero extreme, and answer every query as the reference does
//! ([`super::query`]), counters included.

use super::{check_panes, IngestInput};
use promlab::ingest::feed::splitmix64;
use promlab::ingest::lanes::LanedIngester;
use promlab::ingest::pipeline::{Ingester, Limits};
use promlab::ingest::plan::Plan;
use promlab::ingest::window::PaneReport;
use promlab::ingest::wire;
use promlab::reference;
use promlab::shared::strategy::StrategySet;

/// The largest body `promlab serve` takes by default (`--max-body-bytes`).
const MAX_BODY_BYTES: usize = 32 << 20;

/// What the laned checks of one exposition sequence covered.
#[derive(Clone, Copy, Debug, Default)]
pub struct LanedReport {
    /// Laned ingesters fed and checked.
    pub runs: usize,
    /// Request orders (the sequence's own and the shuffles).
    pub orders: usize,
    /// Groups of requests applied at once.
    pub concurrent_groups: usize,
    /// Query answers compared with the reference's.
    pub answers: usize,
}

/// One lane as the receiver builds it (`servers::receiver::serve`).
fn receiver_lane(plan: &Plan, strategies: StrategySet) -> Ingester {
    Ingester::new(plan.clone(), strategies)
        .with_limits(Limits::serving())
        .with_max_decoded(MAX_BODY_BYTES)
}

/// Checks the laned ingester on `input` under every set of `ingests` (fed
/// concurrently, in order) and, in `shuffles` seeded orders, under the
/// baseline and every strategy. `Err` names the set, lanes and order.
pub fn check(
    input: &IngestInput,
    ingests: &[StrategySet],
    shuffles: usize,
    seed: u64,
) -> Result<LanedReport, String> {
    let mut report = LanedReport::default();
    let decompressed: Vec<Vec<u8>> = input
        .bodies
        .iter()
        .map(|body| {
            let mut raw = Vec::new();
            wire::decompress(body, MAX_BODY_BYTES, &mut raw).map(|()| raw)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| format!("a request does not decompress: {e}"))?;
    let groups = concurrent_groups(&input.decoded, &input.plan);
    let in_order: Vec<usize> = (0..input.bodies.len()).collect();
    let one = one_ingester(input, &in_order)?;
    for (k, &set) in ingests.iter().enumerate() {
        let lanes = 1 + k % 4;
        let mut laned = LanedIngester::new(lanes, || receiver_lane(&input.plan, set));
        for group in &groups {
            feed_at_once(&laned, group.iter().map(|&r| &decompressed[r][..]), lanes)
                .map_err(|e| format!("`{set}`, {lanes} lanes, fed at once: {e}"))?;
        }
        report.answers += compare(&mut laned, input, &input.reference, &one)
            .map_err(|e| format!("`{set}`, {lanes} lanes, fed at once: {e}"))?;
        report.runs += 1;
    }
    report.concurrent_groups = groups.len();
    report.orders = 1;
    let mut rng = seed;
    for shuffle in 0..shuffles {
        // A few places, then anywhere.
        let span = match shuffle % 3 {
            0 => 3,
            1 => 12,
            _ => input.bodies.len(),
        };
        let order = shuffled(input.bodies.len(), span, &mut rng);
        let decoded: Vec<_> = order.iter().map(|&r| input.decoded[r].clone()).collect();
        let outcome = reference::ingest::run(&decoded, &input.plan);
        let one = one_ingester(input, &order)?;
        for set in [StrategySet::NONE, StrategySet::all()] {
            for lanes in 1..=4 {
                let what = || format!("`{set}`, {lanes} lanes, order {order:?}");
                let mut laned = LanedIngester::new(lanes, || receiver_lane(&input.plan, set));
                for &r in &order {
                    let lane = (next(&mut rng) % lanes as u64) as usize;
                    laned
                        .handle_on(lane, &input.bodies[r])
                        .map_err(|e| format!("{}: request {r} refused: {e}", what()))?;
                }
                report.answers += compare(&mut laned, input, &outcome, &one)
                    .map_err(|e| format!("{}: {e}", what()))?;
                report.runs += 1;
            }
        }
        report.orders += 1;
    }
    Ok(report)
}

/// Panes against the reference and the one ingester, then every query.
fn compare(
    laned: &mut LanedIngester,
    input: &IngestInput,
    outcome: &reference::ingest::Outcome,
    one: &[PaneReport],
) -> Result<usize, String> {
    let panes = laned.snapshot();
    check_panes(&panes, &outcome.sorted(), &input.plan)?;
    if let Some(at) = (0..panes.len().max(one.len()))
        .find(|&i| panes.get(i).map(without_zero_sign) != one.get(i).map(without_zero_sign))
    {
        return Err(format!(
            "pane {at} differs from one ingester's: {:?} vs {:?}",
            panes.get(at),
            one.get(at)
        ));
    }
    super::query::check(laned, &input.plan, outcome)
}

/// The baseline's one ingester (as the receiver builds a lane), fed `order`: its panes.
fn one_ingester(input: &IngestInput, order: &[usize]) -> Result<Vec<PaneReport>, String> {
    let mut one = receiver_lane(&input.plan, StrategySet::NONE);
    for &r in order {
        one.handle(&input.bodies[r])
            .map_err(|e| format!("one ingester: request {r} refused: {e}"))?;
    }
    Ok(one.snapshot())
}

/// A pane with `-0.0` answers read as `0.0` (the lanes' documented exception).
fn without_zero_sign(pane: &PaneReport) -> PaneReport {
    let zero = |bits: &Option<u64>| bits.map(|b| if b == (-0.0f64).to_bits() { 0 } else { b });
    PaneReport {
        quantile_bits: pane.quantile_bits.iter().map(zero).collect(),
        ..pane.clone()
    }
}

/// Applies `requests` (decompressed) at once from `threads` threads, each
/// taking a free lane, as the receiver's handlers do.
fn feed_at_once<'a>(
    laned: &LanedIngester,
    requests: impl Iterator<Item = &'a [u8]>,
    threads: usize,
) -> Result<(), String> {
    let requests: Vec<&[u8]> = requests.collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.min(requests.len()))
            .map(|_| {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(raw) = requests.get(i) else {
                        return Ok(());
                    };
                    laned
                        .handle_decoded(raw)
                        .map_err(|e| format!("a request refused: {e}"))?;
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("a feeding thread panicked"))
    })
}

/// The requests cut into runs of consecutive ones that may apply in any
/// order, or at once, with the in-order outcome: no routed sample of a run
/// falls in a window that ends at or before the watermark the run's requests
/// reach (so none is late, whichever request lands first, and no window a
/// run closes holds any of its samples).
pub fn concurrent_groups(
    requests: &[Vec<reference::ingest::Series>],
    plan: &Plan,
) -> Vec<Vec<usize>> {
    let lateness = plan.lateness_secs as i64 * 1000;
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut watermark = i64::MIN;
    // The open group: its watermark and its samples' earliest window end.
    let (mut reached, mut earliest_end) = (i64::MIN, i64::MAX);
    for (r, request) in requests.iter().enumerate() {
        let (newest, end) = routed_span(request, plan);
        let after = newest.map_or(reached, |n| reached.max(watermark.max(n - lateness)));
        let fits = groups.last().is_some() && after < earliest_end.min(end);
        if !fits {
            watermark = watermark.max(reached);
            reached = newest.map_or(watermark, |n| watermark.max(n - lateness));
            earliest_end = end;
            groups.push(vec![r]);
        } else {
            reached = after;
            earliest_end = earliest_end.min(end);
            groups.last_mut().expect("a group").push(r);
        }
    }
    groups
}

/// A request's newest routed timestamp and the earliest end of a window its
/// routed samples fall in (the reference's routing rules).
fn routed_span(request: &[reference::ingest::Series], plan: &Plan) -> (Option<i64>, i64) {
    let (mut newest, mut end) = (None, i64::MAX);
    for series in request {
        let label = |name: &str| {
            series
                .labels
                .iter()
                .find(|(n, _)| n == name)
                .map_or("", |(_, v)| v.as_str())
        };
        for agg in &plan.aggregations {
            if label("__name__") != agg.metric || !agg.matchers.iter().all(|(k, v)| label(k) == v) {
                continue;
            }
            let width = agg.window_secs as i64 * 1000;
            for &(ts, v) in &series.samples {
                if v.is_finite() {
                    newest = newest.max(Some(ts));
                    end = end.min(ts.div_euclid(width) * width + width);
                }
            }
        }
    }
    (newest, end)
}

fn next(rng: &mut u64) -> u64 {
    *rng = rng.wrapping_add(1);
    splitmix64(*rng)
}

/// `0..n` shuffled: each index moved by a random amount below `span`.
fn shuffled(n: usize, span: usize, rng: &mut u64) -> Vec<usize> {
    let mut keyed: Vec<(usize, usize)> = (0..n)
        .map(|i| (i + (next(rng) % span.max(1) as u64) as usize, i))
        .collect();
    keyed.sort();
    keyed.into_iter().map(|(_, i)| i).collect()
}
