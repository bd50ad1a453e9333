//! The ingest workload: remote-write bodies through a fresh ingester per run.

use super::{Output, Workload};
use anyhow::Result;
use promlab::shared::strategy::StrategySet;
use std::io::Write;

/// Ingest: remote-write request bodies through the receiver's handler, a new
/// ingester per run; the output is the quantiles of every aggregation's last
/// closed window (JSON) plus the counters, after the stream is flushed.
pub struct Ingest {
    plan: promlab::ingest::plan::Plan,
    bodies: Vec<Vec<u8>>,
    samples: u64,
    /// The last run's answer.
    out: Vec<u8>,
    floor: super::floor::IngestFloor,
}

/// The plan for Prometheus's own self-scrape: GC pause quantiles by `quantile`, 5 s windows.
const CAPTURES_PLAN: &str = "lateness_secs = 0\n[[aggregation]]\nid = \"gc\"\nmetric = \"go_gc_duration_seconds\"\ngroup_by = [\"quantile\"]\nwindow_secs = 5\n";

pub(in crate::harness) fn captures_plan() -> Result<promlab::ingest::plan::Plan> {
    promlab::ingest::plan::Plan::parse(CAPTURES_PLAN)
}

/// The 27 requests a real Prometheus 2.42 sent, `passes` times over.
pub(in crate::harness) fn captures_bodies(passes: usize) -> impl Iterator<Item = Vec<u8>> {
    (0..passes).flat_map(|_| crate::fixtures::PROMETHEUS_CAPTURES.map(<[u8]>::to_vec))
}

/// Where the ingest scenarios' feeder starts: its first tick, in ms.
pub(in crate::harness) const FEEDER_START_MS: i64 = 1_700_000_000_000;

/// The seed's feeder workload at `groups` × `series_per_group`, its first
/// tick at `start_ms`.
pub(in crate::harness) fn feeder_workload(
    start_ms: i64,
    groups: u64,
    series_per_group: u64,
) -> promlab::ingest::feed::FeedWorkload {
    promlab::ingest::feed::FeedWorkload {
        groups,
        series_per_group,
        ..promlab::ingest::feed::FeedWorkload::seed(start_ms)
    }
}

/// Its request bodies, `ticks` seconds of them.
pub(in crate::harness) fn feeder_bodies(
    start_ms: i64,
    groups: u64,
    series_per_group: u64,
    ticks: u64,
) -> impl Iterator<Item = Vec<u8>> {
    let generator = feeder_workload(start_ms, groups, series_per_group).generator();
    (0..ticks).flat_map(move |t| generator.tick_bodies(t))
}

/// The counters line of an ingest run's answer: accepted, late, stale,
/// rejected, unrouted.
pub(in crate::harness) fn write_counters(
    out: &mut Vec<u8>,
    counts: [u64; 5],
) -> std::io::Result<()> {
    let [accepted, late, stale, rejected, unrouted] = counts;
    writeln!(
        out,
        "\naccepted={accepted} late={late} stale={stale} rejected={rejected} unrouted={unrouted}"
    )
}

impl Ingest {
    /// The seed's feeder workload: `groups` × `series_per_group` series, one sample
    /// per series per tick, `ticks` ticks (seconds), in 50,000-row requests.
    pub fn feeder(groups: u64, series_per_group: u64, ticks: u64) -> Result<Ingest> {
        let workload = feeder_workload(FEEDER_START_MS, groups, series_per_group);
        let bodies = feeder_bodies(FEEDER_START_MS, groups, series_per_group, ticks).collect();
        let plan = promlab::ingest::plan::Plan::default();
        Ok(Ingest {
            floor: super::floor::IngestFloor::new(&plan)?,
            plan,
            bodies,
            samples: workload.samples_per_tick() * ticks,
            out: Vec::new(),
        })
    }

    /// `bodies` (the feeder's plan) holding `samples` samples.
    pub(super) fn from_bodies(bodies: Vec<Vec<u8>>, samples: u64) -> Result<Ingest> {
        let plan = promlab::ingest::plan::Plan::default();
        Ok(Ingest {
            floor: super::floor::IngestFloor::new(&plan)?,
            plan,
            bodies,
            samples,
            out: Vec::new(),
        })
    }

    /// The 27 requests a real Prometheus 2.42 sent, `passes` times over.
    pub(super) fn captures(passes: usize) -> Result<Ingest> {
        let bodies: Vec<Vec<u8>> = captures_bodies(passes).collect();
        let plan = captures_plan()?;
        let mut probe = promlab::ingest::pipeline::Ingester::new(plan.clone(), StrategySet::NONE);
        for body in &bodies {
            probe.handle(body)?;
        }
        Ok(Ingest {
            floor: super::floor::IngestFloor::new(&plan)?,
            plan,
            bodies,
            samples: probe.totals().samples,
            out: Vec::new(),
        })
    }
}

impl Workload for Ingest {
    /// Every request into a fresh ingester, the flush, and the query of every
    /// aggregation (as JSON, as the receiver serves it, with the counters).
    fn run(&mut self, strategies: StrategySet) -> Result<Output<'_>> {
        let mut ingester = promlab::ingest::pipeline::Ingester::new(self.plan.clone(), strategies);
        for body in &self.bodies {
            ingester.handle(body)?;
        }
        ingester.flush();
        let t = ingester.totals();
        self.out.clear();
        ingester.query_all_json(&mut self.out);
        let counts = [t.accepted, t.late, t.stale, t.rejected, t.unrouted];
        write_counters(&mut self.out, counts)?;
        Ok(Output::Bytes(&self.out))
    }

    fn units(&self) -> (u64, &'static str) {
        (self.samples, "samples")
    }

    /// Decode, walk, find each series as `series-cache` does, one sketch add per sample; checked
    /// by the samples it walked.
    fn floor(&mut self) -> Result<Output<'_>> {
        Ok(Output::Units(self.floor.run(&self.bodies)?))
    }
}

/// The feeder's workload with series churn, as request bodies: every tick
/// sends one sample of each of the `groups` × `series_per_group` series slots
/// (the feeder's labels, values and timestamps), and from the second tick on,
/// `new_series_per_tick` slots, taken in turn and wrapping, hold a new series
/// each tick — the same group, a new `instance` (`i<i>-<generation>`): a
/// deployment whose pods come and go. With no churn the bodies are the
/// feeder's own (`asap` at the same sizes); with churn equal to the series,
/// every series of every tick is new.
pub fn churn_bodies(
    groups: u64,
    series_per_group: u64,
    ticks: u64,
    new_series_per_tick: u64,
) -> impl Iterator<Item = Vec<u8>> {
    let batch_rows = promlab::ingest::feed::FeedWorkload::seed(0).batch_rows;
    churn_bodies_batched(
        groups,
        series_per_group,
        ticks,
        new_series_per_tick,
        batch_rows,
    )
}

/// [`churn_bodies`] in requests of `batch_rows` rows (the last of a tick holds the rest).
pub fn churn_bodies_batched(
    groups: u64,
    series_per_group: u64,
    ticks: u64,
    new_series_per_tick: u64,
    batch_rows: usize,
) -> impl Iterator<Item = Vec<u8>> {
    use promlab::ingest::wire;
    let workload = promlab::ingest::feed::FeedWorkload {
        groups,
        series_per_group,
        batch_rows,
        ..promlab::ingest::feed::FeedWorkload::seed(1_700_000_000_000)
    };
    let series = workload.series();
    let churn = new_series_per_tick.min(series);
    (0..ticks).flat_map(move |t| {
        let mut requests = Vec::new();
        let mut current = Vec::new();
        let mut labels = Vec::with_capacity(64);
        let mut rows = 0;
        for n in 0..series {
            let (g, i) = (n / series_per_group, n % series_per_group);
            labels.clear();
            wire::put_label(&mut labels, b"__name__", b"data");
            match churn_generation(n, t, churn, series) {
                0 => wire::put_label(&mut labels, b"instance", format!("i{i}").as_bytes()),
                generation => wire::put_label(
                    &mut labels,
                    b"instance",
                    format!("i{i}-{generation}").as_bytes(),
                ),
            }
            wire::put_label(&mut labels, b"label_0", format!("g{g}").as_bytes());
            let value = workload.value(n, t);
            wire::put_series_one_sample(&mut current, &labels, value, workload.timestamp(t, 0));
            rows += 1;
            if rows == workload.batch_rows {
                requests.push(wire::compress(&std::mem::take(&mut current)));
                rows = 0;
            }
        }
        if rows > 0 {
            requests.push(wire::compress(&current));
        }
        requests
    })
}

/// How many times series slot `n` (of `series`) was given a new series by
/// tick `t`, when each tick from the second renews `churn` slots in turn:
/// ticks 1..=t renew the positions `0..t·churn` of the slots laid end to end.
fn churn_generation(n: u64, t: u64, churn: u64, series: u64) -> u64 {
    let renewed = t * churn;
    if n < renewed {
        (renewed - n - 1) / series + 1
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn churn_renews_slots_in_turn() {
        // 10 slots, 3 new a tick: tick 1 renews 0..3, tick 2 3..6, tick 4 9, 0, 1.
        let generation = |n, t| churn_generation(n, t, 3, 10);
        assert_eq!((0..10).map(|n| generation(n, 0)).sum::<u64>(), 0);
        assert_eq!(generation(2, 1), 1);
        assert_eq!(generation(3, 1), 0);
        assert_eq!(generation(5, 2), 1);
        assert_eq!(
            (generation(9, 4), generation(0, 4), generation(2, 4)),
            (1, 2, 1)
        );
        // Every tick renews exactly `churn` slots.
        for t in 1..20 {
            let renewed: u64 = (0..10)
                .map(|n| generation(n, t) - generation(n, t - 1))
                .sum();
            assert_eq!(renewed, 3);
        }
        // Churn of every series: every slot new every tick.
        assert!((0..10).all(|n| churn_generation(n, 7, 10, 10) == 7));
    }

    #[test]
    fn no_churn_is_the_feeders_workload() {
        let feeder = promlab::ingest::feed::FeedWorkload {
            groups: 3,
            series_per_group: 7,
            batch_rows: 50_000,
            ..promlab::ingest::feed::FeedWorkload::seed(1_700_000_000_000)
        };
        let generator = feeder.generator();
        let expected: Vec<Vec<u8>> = (0..4).flat_map(|t| generator.tick_bodies(t)).collect();
        assert_eq!(churn_bodies(3, 7, 4, 0).collect::<Vec<_>>(), expected);
        assert_ne!(churn_bodies(3, 7, 4, 1).collect::<Vec<_>>(), expected);
    }
}
