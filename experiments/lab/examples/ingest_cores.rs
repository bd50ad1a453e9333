//! Ingest throughput at saturation on 1 vs 2 cores, in process.
//!
//! Request bodies are encoded before the clock starts (the feeder's workload:
//! 1,000 groups × 100 series, `ROWS` rows a request, `TICKS` ticks of 1e5
//! samples after two untimed ticks of warm-up), then fed as fast as the ingester takes them by `CONNS` threads
//! standing for the receiver's connections, each doing what the receiver does
//! per request: one ingester: decompress outside the lock, decode and apply
//! under it; laned: all of it on a free lane (`LanedIngester::handle`). Each arm runs in its own process pinned with `taskset`, the
//! arms alternated, `REPEATS` times; it prints samples/s (wall), CPU ns a
//! sample (user + system, `getrusage`), the cores that makes (a loaded machine
//! may give a process less than its cores whatever its threads), and a hash of the flushed query
//! answers (equal in every arm: the same quantiles, bit for bit; requests of
//! two connections may apply in either order, which the 5 s lateness absorbs).
//!
//! ```text
//! cargo run --release --example ingest_cores -- [REPEATS [TICKS [ROWS]]]
//! ```

use promlab::ingest::feed::FeedWorkload;
use promlab::ingest::lanes::LanedIngester;
use promlab::ingest::pipeline::Ingester;
use promlab::ingest::plan::Plan;
use promlab::ingest::wire;
use promlab::shared::strategy::StrategySet;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// (name, cpus for taskset, lanes (0: one ingester behind a lock), connections)
const ARMS: [(&str, &str, usize, usize); 4] = [
    ("one ingester, 1 core", "0", 0, 1),
    ("2 lanes, 1 core, 2 conns", "0", 2, 2),
    ("one ingester, 2 cores, 2 conns", "0,1", 0, 2),
    ("2 lanes, 2 cores, 2 conns", "0,1", 2, 2),
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("child") {
        let n = |i: usize| args[i].parse::<usize>().expect("a number");
        child(n(1), n(2), n(3), n(4), n(5));
        return;
    }
    let n = |i: usize, default: usize| {
        args.get(i)
            .map_or(default, |a| a.parse().expect("a number"))
    };
    let (repeats, ticks, rows) = (n(0, 3), n(1, 30), n(2, 10_000));
    let exe = std::env::current_exe().expect("own path");
    let mut results: Vec<Vec<(f64, f64, String)>> = vec![Vec::new(); ARMS.len()];
    for r in 0..repeats {
        for (a, &(name, cpus, lanes, conns)) in ARMS.iter().enumerate() {
            let out = Command::new("taskset")
                .args(["-c", cpus])
                .arg(&exe)
                .args(["child", &lanes.to_string(), &conns.to_string()])
                .args([ticks.to_string(), rows.to_string(), r.to_string()])
                .output()
                .expect("taskset");
            let text = String::from_utf8_lossy(&out.stdout);
            let mut f = text.split_whitespace();
            let rate: f64 = f.next().expect("rate").parse().unwrap();
            let cpu_ns: f64 = f.next().expect("cpu").parse().unwrap();
            let hash = f.next().expect("hash").to_string();
            eprintln!(
                "run {r} {name}: {:.2} M samples/s, {cpu_ns:.1} CPU ns/sample, answer {hash}",
                rate / 1e6
            );
            results[a].push((rate, cpu_ns, hash));
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = median(results[0].iter().map(|r| r.0).collect());
    // Cores used = samples/s × CPU s a sample: what the process got of the machine.
    println!("| arm | M samples/s (median of {repeats}) | × one ingester on 1 core | CPU ns/sample | cores used | answers |");
    println!("| --- | ---: | ---: | ---: | ---: | --- |");
    for (a, &(name, ..)) in ARMS.iter().enumerate() {
        let rate = median(results[a].iter().map(|r| r.0).collect());
        let cpu = median(results[a].iter().map(|r| r.1).collect());
        let mut hashes: Vec<&str> = results[a].iter().map(|r| r.2.as_str()).collect();
        hashes.dedup();
        println!(
            "| {name} | {:.2} | {:.2}× | {cpu:.1} | {:.2} | {} |",
            rate / 1e6,
            rate / base,
            rate * cpu / 1e9,
            hashes.join(" ")
        );
    }
}

fn cpu_seconds() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(usage.ru_utime) + t(usage.ru_stime)
}

fn child(lanes: usize, conns: usize, ticks: usize, rows: usize, _repeat: usize) {
    let workload = FeedWorkload {
        batch_rows: rows,
        ..FeedWorkload::seed(1_700_000_000_000)
    };
    let generator = workload.generator();
    // Two ticks of warm-up (each meets every series), untimed: on one
    // ingester both; on two lanes one each, so every lane's cache has met every series.
    let warm: Vec<Vec<Vec<u8>>> = (0..2).map(|t| generator.tick_bodies(t)).collect();
    let bodies: Vec<Vec<u8>> = (2..2 + ticks as u64)
        .flat_map(|t| generator.tick_bodies(t))
        .collect();
    let samples = ticks as f64 * workload.samples_per_tick() as f64;
    let set = StrategySet::all();
    let next = AtomicUsize::new(0);
    let (cpu0, t0);
    let measured;
    let answer = if lanes == 0 {
        let mut one = Ingester::new(Plan::default(), set);
        for body in warm.iter().flatten() {
            one.handle(body).unwrap();
        }
        let ingester = Mutex::new(one);
        (cpu0, t0) = (cpu_seconds(), Instant::now());
        std::thread::scope(|s| {
            for _ in 0..conns {
                s.spawn(|| {
                    let mut raw = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(body) = bodies.get(i) else { break };
                        let decoded = wire::decompress_reusing(body, 64 << 20, &mut raw).unwrap();
                        ingester.lock().unwrap().handle_decoded(decoded).unwrap();
                    }
                });
            }
        });
        measured = (t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
        let mut ingester = ingester.into_inner().unwrap();
        ingester.flush();
        serde_json::to_string(&ingester.snapshot()).unwrap()
    } else {
        let laned = LanedIngester::with_plan(lanes, &Plan::default(), set);
        for (t, tick) in warm.iter().enumerate() {
            for body in tick {
                laned.handle_on(t, body).unwrap();
            }
        }
        (cpu0, t0) = (cpu_seconds(), Instant::now());
        std::thread::scope(|s| {
            for _ in 0..conns {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(i) else { break };
                    laned.handle(body).unwrap();
                });
            }
        });
        measured = (t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
        laned.flush();
        serde_json::to_string(&laned.snapshot()).unwrap()
    };
    let (wall, cpu) = measured;
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&answer, &mut hasher);
    let hash = std::hash::Hasher::finish(&hasher);
    println!("{} {} {hash:016x}", samples / wall, cpu / samples * 1e9);
}
