//! The lanes workload: the ingest workload across cores.

use super::{churn_bodies_batched, write_counters, ArmKind, Output, Workload};
use anyhow::Result;
use promlab::shared::strategy::{Stage, StrategySet};

/// Ingest across cores: the feeder's workload through a laned ingester of
/// `lanes` lanes (`LanedIngester::handle`, as `promlab serve` takes a request
/// on a free lane), a fresh ingester per run, fed by `lanes` threads standing
/// for a sender's remote-write shards: Prometheus splits its series over
/// shards by hash, each shard sending its own series on its own connection,
/// so each thread sends the same share of every tick's requests (tick `t`'s
/// about [`LANE_SHARDS`] requests, request `r` by thread `r mod lanes`), as
/// fast as it can but never more than [`LAG_TICKS`] ticks ahead of the
/// slowest ([`ShardPacing`]; the lag stays under the plan's lateness, so no
/// sample is late). A lane stays
/// with its thread ([`LanedIngester`]'s free-lane choice), so each lane
/// learns its shard's series, not every series. The answer (every
/// aggregation's last closed window after the flush, and the counters) is
/// one ingester's, bit for bit: `asap` at the same sizes. The floor: `lanes`
/// threads each walking its shard's requests through the ingest floor
/// ([`super::floor::IngestFloor::run_bodies`]) — the least work spread over
/// as many cores, with nothing shared.
///
/// Threads do not take whichever request comes next, and do not meet at a
/// tick's end: a lane that learned every sender's series would pay for each
/// new series (several known ones' cost) once per lane, and a barrier would
/// hold both cores for the slower.
pub(super) struct Laned {
    plan: promlab::ingest::plan::Plan,
    /// Tick by tick, `per_tick` requests a tick.
    bodies: Vec<Vec<u8>>,
    per_tick: usize,
    lanes: usize,
    samples: u64,
    out: Vec<u8>,
    floors: Vec<super::floor::IngestFloor>,
}

/// Requests per tick of the lanes workload (about): the most lanes a ladder
/// has, so every thread sends a share.
const LANE_SHARDS: usize = 16;

/// How many ticks a shard may send ahead of the slowest: a sender at
/// saturation sends from its backlog without waiting for its other shards,
/// but not unboundedly ahead of them. Ticks are a second apart and the
/// plan's lateness is 5 s, so at 4 ticks no sample arrives late; the looser
/// the coupling, the less a stall of one core holds the other lane too
/// (Prometheus's shards do not wait for each other at all).
const LAG_TICKS: usize = 4;

/// The lanes workload's senders: each counts the ticks it has sent, and
/// waits before tick `t` while the slowest is more than [`LAG_TICKS`] behind.
pub struct ShardPacing {
    sent: std::sync::Mutex<Vec<usize>>,
    progress: std::sync::Condvar,
}

impl ShardPacing {
    pub fn new(shards: usize) -> ShardPacing {
        ShardPacing {
            sent: std::sync::Mutex::new(vec![0; shards]),
            progress: std::sync::Condvar::new(),
        }
    }

    pub fn wait_to_send(&self, tick: usize) {
        let sent = self.sent.lock().expect("pacing lock");
        let _sent = self
            .progress
            .wait_while(sent, |sent| {
                sent.iter().min().copied().unwrap_or(tick) + LAG_TICKS < tick
            })
            .expect("pacing lock");
    }

    pub fn sent(&self, shard: usize) {
        self.sent.lock().expect("pacing lock")[shard] += 1;
        self.progress.notify_all();
    }
}

impl Laned {
    pub(super) fn feeder(
        groups: u64,
        series_per_group: u64,
        ticks: u64,
        lanes: usize,
    ) -> Result<Laned> {
        anyhow::ensure!(
            (1..=LANE_SHARDS.min(promlab::ingest::lanes::MAX_LANES)).contains(&lanes),
            "lanes = {lanes}: 1 to {LANE_SHARDS}"
        );
        let series = (groups * series_per_group) as usize;
        anyhow::ensure!(
            series >= LANE_SHARDS,
            "{series} series: the lanes workload splits each tick into {LANE_SHARDS} requests"
        );
        let plan = promlab::ingest::plan::Plan::default();
        let (bodies, per_tick) = lanes_bodies(groups, series_per_group, ticks)?;
        Ok(Laned {
            per_tick,
            floors: (0..lanes)
                .map(|_| super::floor::IngestFloor::new(&plan))
                .collect::<Result<_>>()?,
            plan,
            bodies,
            lanes,
            samples: groups * series_per_group * ticks,
            out: Vec::new(),
        })
    }
}

/// Sender `i`'s requests of one tick of the lanes workload, of `lanes` senders.
pub fn lane_shard(tick: &[Vec<u8>], lanes: usize, i: usize) -> impl Iterator<Item = &[u8]> {
    tick.iter().skip(i).step_by(lanes).map(Vec::as_slice)
}

/// The lanes workload's request bodies, tick by tick (the feeder's, each
/// tick in about [`LANE_SHARDS`] requests), and the requests a tick.
pub fn lanes_bodies(
    groups: u64,
    series_per_group: u64,
    ticks: u64,
) -> Result<(Vec<Vec<u8>>, usize)> {
    let series = (groups * series_per_group) as usize;
    let batch_rows = series.div_ceil(LANE_SHARDS);
    let per_tick = series.div_ceil(batch_rows);
    let bodies: Vec<Vec<u8>> =
        churn_bodies_batched(groups, series_per_group, ticks, 0, batch_rows).collect();
    anyhow::ensure!(bodies.len() == ticks as usize * per_tick);
    Ok((bodies, per_tick))
}

/// The lanes workload's arm of every strategy on one lane (one thread
/// sending every request), measured in the same rounds as the point's lanes
/// so the speed-up of N lanes is a ratio of one run, not of two points run
/// one after the other while the machine drifts.
pub const ONE_LANE: &str = "all-one-lane";

impl Laned {
    /// Every request through `lanes` lanes, one sender thread each.
    fn run_lanes(&mut self, lanes: usize, strategies: StrategySet) -> Result<Output<'_>> {
        use promlab::ingest::lanes::LanedIngester;
        let laned = LanedIngester::with_plan(lanes, &self.plan, strategies);
        let (bodies, per_tick) = (&self.bodies, self.per_tick);
        let pacing = ShardPacing::new(lanes);
        std::thread::scope(|s| -> Result<()> {
            let senders: Vec<_> = (0..lanes)
                .map(|i| {
                    let (laned, pacing) = (&laned, &pacing);
                    s.spawn(move || -> Result<()> {
                        // A failed request is kept and the sender goes on,
                        // so the others never wait for it.
                        let mut failed = None;
                        for (t, tick) in bodies.chunks(per_tick).enumerate() {
                            pacing.wait_to_send(t);
                            for body in lane_shard(tick, lanes, i) {
                                if let Err(e) = laned.handle(body) {
                                    failed.get_or_insert(e);
                                }
                            }
                            pacing.sent(i);
                        }
                        failed.map_or(Ok(()), |e| Err(e.into()))
                    })
                })
                .collect();
            for sender in senders {
                sender.join().expect("a sender thread panicked")?;
            }
            Ok(())
        })?;
        laned.flush();
        let t = laned.totals();
        self.out.clear();
        // As the one-ingester workload answers (no `QueryResult` built): the
        // answer is written on one thread after the senders, where each
        // floor thread writes its own.
        laned.query_all_json(&mut self.out);
        write_counters(
            &mut self.out,
            [t.accepted, t.late, t.stale, t.rejected, t.unrouted],
        )?;
        Ok(Output::Bytes(&self.out))
    }
}

impl Workload for Laned {
    fn run(&mut self, strategies: StrategySet) -> Result<Output<'_>> {
        self.run_lanes(self.lanes, strategies)
    }

    fn units(&self) -> (u64, &'static str) {
        (self.samples, "samples")
    }

    fn extra_arms(&self, _all: StrategySet) -> Vec<(&'static str, StrategySet, ArmKind)> {
        vec![(
            ONE_LANE,
            StrategySet::all().restrict(Stage::Ingest),
            ArmKind::Extra,
        )]
    }

    fn run_extra(&mut self, name: &str, strategies: StrategySet) -> Result<Output<'_>> {
        anyhow::ensure!(name == ONE_LANE, "no extra arm `{name}` in this workload");
        self.run_lanes(1, strategies)
    }

    /// `all-one-lane` is held to no floor: the floor runs the point's threads.
    fn floor_of(&self, arm: &str, _strategies: StrategySet) -> &'static str {
        if arm == ONE_LANE {
            ""
        } else {
            super::FLOOR
        }
    }

    fn floor(&mut self) -> Result<Output<'_>> {
        let (lanes, bodies, per_tick) = (self.lanes, &self.bodies, self.per_tick);
        let walked = std::thread::scope(|s| -> Result<u64> {
            let threads: Vec<_> = self
                .floors
                .iter_mut()
                .enumerate()
                .map(|(i, floor)| {
                    s.spawn(move || {
                        let shard = bodies
                            .chunks(per_tick)
                            .flat_map(|tick| lane_shard(tick, lanes, i));
                        floor.run_bodies(shard)
                    })
                })
                .collect();
            let mut walked = 0;
            for thread in threads {
                walked += thread.join().expect("a floor thread panicked")?;
            }
            Ok(walked)
        })?;
        Ok(Output::Units(walked))
    }
}

#[cfg(test)]
mod tests {
    use super::super::build;
    use super::*;
    use crate::harness::Generator;

    #[test]
    fn lanes_and_one_lane_answer_as_one_ingester_and_the_floor_walks_every_sample() {
        let mut one = build(&Generator::Asap {
            groups: 4,
            series_per_group: 50,
            ticks: 70,
        })
        .unwrap();
        let all = StrategySet::all();
        let expected = one.run(all).unwrap().to_vec().unwrap();
        for lanes in [1, 2, 3] {
            let params = Generator::AsapLanes {
                groups: 4,
                series_per_group: 50,
                ticks: 70,
                lanes,
            };
            let mut laned = build(&params).unwrap();
            for set in [StrategySet::NONE, all] {
                let got = laned.run(set).unwrap().to_vec().unwrap();
                assert!(got == expected, "{lanes} lanes, {set}");
            }
            // The one-lane arm, run beside the point's lanes, answers alike.
            let extra = laned.extra_arms(all);
            let [(name, set, _)] = extra[..] else {
                panic!("one extra arm")
            };
            let got = laned.run_extra(name, set).unwrap().to_vec().unwrap();
            assert!(got == expected, "{name} at {lanes} lanes");
            match laned.floor().unwrap() {
                Output::Units(n) => assert_eq!(n, 4 * 50 * 70),
                _ => panic!("the floor counts samples"),
            }
        }
    }
}
