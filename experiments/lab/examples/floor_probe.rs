//! One arm of the render or export ablation, alone in a process, `N` times
//! after one untimed warm-up: for callgrind (instructions per run are the
//! difference between two `N`) and for `perf`.
//!
//! ```text
//! cargo build --release -p promlab-lab --example floor_probe
//! valgrind --tool=callgrind target/release/examples/floor_probe render prerender 3 1000
//! target/release/examples/floor_probe export floor 20
//! target/release/examples/floor_probe ingest all 3 1000000 1 5
//! ```
//! `render ARM N [QUEUES]`: the RabbitMQ per-object scrape (`ARM` a strategy
//! set, or `floor`); `export ARM N`: a long-lived exporter's warm scrape of
//! the large client_ruby fixture (`large-v5-uri`), or one of the experiments
//! on its key compare: `compare-catalogue` (every entry's padded key against
//! a copy of the distinct keys), `compare-previous` (the parts it shares with
//! the file's previous key against that key, the rest against the copy),
//! `compare-words` (against the copy, without `memcmp`); `ingest ARM N GROUPS
//! SERIES_PER_GROUP TICKS`: the feeder's bodies ingested, flushed and
//! answered as the ablation's ingest workload does (`ARM` a strategy set, or
//! `floor`); `scenario ARM N NAME [BETWEEN]`: one arm of a built-in
//! scenario at its full size (`NAME:quick`, its quick size), as the ablation builds it (`ARM` a strategy
//! set, `floor`, or an extra arm such as `floor-folded`), with another arm
//! run untimed before each timed run if `BETWEEN` names one. Prints wall and
//! thread CPU time per run (CPU time is the steadier on a shared machine).

use anyhow::{bail, Context, Result};
use promlab::scenarios::rabbitmq::RabbitMqNode;
use promlab::shared::strategy::{Stage, StrategySet};
use promlab_lab::harness::floor::{ExportFloor, RenderFloor};
use promlab_lab::harness::{all_arms, run_arm, ArmKind, Output, Workload};
use std::time::{Duration, Instant};

/// One entry of a compare experiment: where its padded key starts in the
/// file, where its copy starts in the distinct keys and its length, the
/// prefix and unpadded suffix it shares with the file's previous key, and
/// that key's unpadded length.
type Planned = (usize, usize, usize, usize, usize, usize);

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [stage, arm, n, rest @ ..] = args.as_slice() else {
        bail!("usage: floor_probe render|export|ingest|scenario ARM N [...]");
    };
    let n: usize = n.parse().context("N")?;
    // Untimed, before each timed run (`scenario … BETWEEN`).
    let mut between: Box<dyn FnMut()> = Box::new(|| {});
    let mut run: Box<dyn FnMut() -> usize> = match stage.as_str() {
        "render" => {
            let queues = rest.first().map_or(Ok(10_000), |q| q.parse())?;
            let node = RabbitMqNode::build(queues, true, StrategySet::NONE)?;
            if arm == "floor" {
                let mut body = Vec::new();
                node.render_per_object(&mut body);
                let mut floor = RenderFloor::new(&body);
                eprintln!("floor same_bytes={}", floor.same_bytes);
                Box::new(move || floor.run().len())
            } else {
                let set: StrategySet = arm.parse().map_err(anyhow::Error::msg)?;
                let node = RabbitMqNode::build(queues, true, set)?;
                let mut body = Vec::new();
                Box::new(move || {
                    node.render_per_object(&mut body);
                    body.len()
                })
            }
        }
        "export" => {
            let dir = tempfile::tempdir()?;
            let case = promlab_lab::fixtures::unpack_ruby_case("large-v5-uri", dir.path())?;
            let registry = promlab::format::registry::Registry::load(&case.join("registry.json"))?;
            let store = case.join("store");
            let text = promlab::export::export(&store, &registry, StrategySet::NONE)?;
            if arm == "compare-catalogue" || arm == "compare-previous" || arm == "compare-words" {
                // Experiments: every key compared with a copy of the distinct
                // keys (first-met order), or with the file's previous key.
                let mut maps = Vec::new();
                let mut paths: Vec<_> = std::fs::read_dir(&store)?
                    .map(|e| e.map(|e| e.path()))
                    .collect::<Result<_, _>>()?;
                paths.sort();
                for path in paths {
                    let file = std::fs::File::open(&path)?;
                    // SAFETY: nothing writes the unpacked fixture.
                    maps.push(unsafe { memmap2::Mmap::map(&file) }?);
                }
                let mut distinct: std::collections::HashMap<Vec<u8>, (usize, usize)> =
                    Default::default();
                let mut bytes = Vec::new();
                let mut plan: Vec<Vec<Planned>> = Vec::new();
                for map in &maps {
                    let used = i32::from_le_bytes(map[..4].try_into()?) as usize;
                    let mut per = Vec::new();
                    let mut prev: &[u8] = b"";
                    for entry in promlab::format::storefile::entries(map, used) {
                        let entry = entry?;
                        let key = entry.padded_key;
                        let at = entry.value_offset - key.len();
                        let span = *distinct.entry(key.to_vec()).or_insert_with(|| {
                            bytes.extend_from_slice(key);
                            (bytes.len() - key.len(), key.len())
                        });
                        let (a, b) = (promlab::format::storefile::strip_padding(prev), entry.key());
                        let p = a.iter().zip(b).take_while(|(x, y)| x == y).count();
                        let s = a[p..]
                            .iter()
                            .rev()
                            .zip(b[p..].iter().rev())
                            .take_while(|(x, y)| x == y)
                            .count();
                        per.push((at, span.0, span.1, p, s, a.len()));
                        prev = key;
                    }
                    plan.push(per);
                }
                let previous = arm == "compare-previous";
                let words = arm == "compare-words";
                let mut out = Vec::new();
                let mut first = true;
                Box::new(move || {
                    let _keep = &dir;
                    let mut same = 0usize;
                    for (map, per) in maps.iter().zip(&plan) {
                        let mut last = 8;
                        for &(at, start, len, p, s, prev_len) in per {
                            let key = &map[at..at + len];
                            let reference = &bytes[start..start + len];
                            if previous {
                                let kb = promlab::format::storefile::strip_padding(reference).len();
                                let prev = &map[last..last + prev_len];
                                same += (key[..p] == prev[..p]) as usize;
                                same += (key[kb - s..kb] == prev[prev_len - s..]) as usize;
                                same += (key[p..kb - s] == reference[p..kb - s]) as usize;
                                same += (key[kb..] == reference[kb..]) as usize;
                            } else if words {
                                same += same_bytes(key, reference) as usize;
                            } else {
                                same += (key == reference) as usize;
                            }
                            last = at;
                        }
                    }
                    if std::mem::replace(&mut first, false) {
                        eprintln!("{same} comparisons equal");
                    }
                    std::hint::black_box(same);
                    out.clear();
                    out.extend_from_slice(&text);
                    out.len()
                })
            } else if arm == "floor" {
                let mut floor = ExportFloor::new(&store, text)?;
                eprintln!("floor store_bytes={}", floor.store_bytes());
                Box::new(move || {
                    let _keep = &dir;
                    floor.run().expect("the store did not change").len()
                })
            } else {
                let set: StrategySet = arm.parse().map_err(anyhow::Error::msg)?;
                let mut exporter = promlab::export::Exporter::new(&store, registry, set);
                let mut out = Vec::new();
                exporter.export_into(&mut out)?;
                if out != text {
                    bail!("{set}: the exporter's first scrape is not the exposition");
                }
                Box::new(move || {
                    let _keep = &dir;
                    exporter.export_into(&mut out).expect("export");
                    out.len()
                })
            }
        }
        "ingest" => {
            // `ingest ARM N GROUPS SERIES_PER_GROUP TICKS`: the ablation's
            // ingest workload (the feeder's bodies into a fresh ingester, the
            // flush, every group's answer), or its floor.
            let [groups, per_group, ticks] = rest else {
                bail!("usage: floor_probe ingest ARM N GROUPS SERIES_PER_GROUP TICKS");
            };
            let mut workload = promlab_lab::harness::workloads::Ingest::feeder(
                groups.parse()?,
                per_group.parse()?,
                ticks.parse()?,
            )?;
            if arm == "floor" {
                Box::new(move || output_len(workload.floor().expect("floor")))
            } else {
                let set: StrategySet = arm.parse().map_err(anyhow::Error::msg)?;
                Box::new(move || output_len(workload.run(set).expect("ingest")))
            }
        }
        "scenario" => {
            // `scenario ARM N NAME [BETWEEN]`: BETWEEN, another arm, runs
            // untimed before each timed run, as other arms do in a round.
            let (name, between_arm) = match rest {
                [name] => (name, None),
                [name, between] => (name, Some(between)),
                _ => bail!("usage: floor_probe scenario ARM N NAME [BETWEEN]"),
            };
            let (name, quick) = match name.strip_suffix(":quick") {
                Some(name) => (name, true),
                None => (name.as_str(), false),
            };
            let scenario = promlab_lab::harness::load_scenario(name)?;
            let size = if quick {
                &scenario.quick
            } else {
                &scenario.full
            };
            let stage = size.params.stage();
            let mut workload = promlab_lab::harness::workloads::build(&size.params)?;
            workload.prepare_arms(StrategySet::all().restrict(stage))?;
            let timed = ScenarioArm::resolve(&*workload, stage, arm)?;
            let untimed = match between_arm {
                Some(other) => Some(ScenarioArm::resolve(&*workload, stage, other)?),
                None => None,
            };
            let workload = std::rc::Rc::new(std::cell::RefCell::new(workload));
            if let Some(other) = untimed {
                let workload = std::rc::Rc::clone(&workload);
                between = Box::new(move || {
                    other.run(&mut **workload.borrow_mut());
                });
            }
            Box::new(move || timed.run(&mut **workload.borrow_mut()))
        }
        other => bail!("unknown stage {other} (render, export, ingest or scenario)"),
    };
    run();
    // A profiler attaches here, past the setup (`perf record -p`).
    eprintln!("set up (pid {}); timing {n} runs", std::process::id());
    let (mut wall, mut cpu) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut bytes = 0;
    for _ in 0..n {
        between();
        let (start, start_cpu) = (Instant::now(), thread_cpu());
        bytes = run();
        wall.push(start.elapsed());
        cpu.push(thread_cpu() - start_cpu);
    }
    wall.sort();
    cpu.sort();
    if n > 0 {
        println!(
            "{stage} {arm}: {n} runs, wall median {:.2?} min {:.2?}, thread CPU median {:.2?} min {:.2?}, {bytes} bytes",
            wall[n / 2],
            wall[0],
            cpu[n / 2],
            cpu[0]
        );
    }
    Ok(())
}

/// A scenario's arm as the ablation runs it: an arm it measures by name
/// (its strategy set, the floor, an extra arm with the set the workload gives
/// it), else a strategy set; resolved once, outside the timed runs.
struct ScenarioArm {
    name: String,
    set: StrategySet,
    kind: ArmKind,
}

impl ScenarioArm {
    fn resolve(workload: &dyn Workload, stage: Stage, name: &str) -> Result<ScenarioArm> {
        let (set, kind) = match all_arms(stage, StrategySet::all(), workload)
            .into_iter()
            .find(|(arm, _, _)| arm == name)
        {
            Some((_, set, kind)) => (set, kind),
            None => (
                name.parse().map_err(anyhow::Error::msg)?,
                ArmKind::Strategies,
            ),
        };
        Ok(ScenarioArm {
            name: name.to_owned(),
            set,
            kind,
        })
    }

    /// One run; the length of its output.
    fn run(&self, workload: &mut dyn Workload) -> usize {
        output_len(run_arm(workload, self.kind, &self.name, self.set).expect("arm"))
    }
}

/// A workload's output as bytes (its length) or units (their number).
fn output_len(output: Output<'_>) -> usize {
    match output {
        Output::Bytes(bytes) => bytes.len(),
        Output::Units(n) => n as usize,
        Output::Store(_) | Output::StoreRead(..) => 0,
    }
}

/// This thread's CPU time: unlike wall time, not counting the time other
/// processes held the core (the machine is shared).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `a == b` by XOR/OR of 8-byte words, without an early exit (an
/// experiment: slower here than `memcmp`).
#[inline(never)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (ca, cb) = (a.chunks_exact(32), b.chunks_exact(32));
    let tail = ca.remainder() == cb.remainder();
    let mut diff = 0u64;
    for (x, y) in ca.zip(cb) {
        for i in 0..4 {
            let w = |s: &[u8]| u64::from_ne_bytes(s[i * 8..i * 8 + 8].try_into().unwrap());
            diff |= w(x) ^ w(y);
        }
    }
    diff == 0 && tail
}
