//! CPU per sample and RSS of the receiver at the feeder's paced rate.
//!
//! For each strategy set: start `promlab serve`, warm it with two ticks of
//! `promlab feed` (1,000 groups × 100 series at 1 sample/s = 1e5 samples/s;
//! the first tick meets every series for the first time), then feed `SECS`
//! more ticks, and read the receiver's user+system CPU time from /proc before
//! and after them, and its peak RSS. `--ingest-threads N` is passed to the
//! receiver (default: its own, one lane per core).
//!
//! ```text
//! cargo build --release && cargo run --release --example ingest_cpu -- \
//!     target/release/promlab 30 [--ingest-threads N] none all borrowed-decode series-cache batch-routing bulk-sketch
//! ```

use promlab_lab::machine::ProcessStats;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [bin, secs, rest @ ..] = &args[..] else {
        eprintln!("usage: ingest_cpu PROMLAB_BIN SECS [--ingest-threads N] STRATEGIES...");
        std::process::exit(2);
    };
    let (lanes, sets) = match rest {
        [flag, n, sets @ ..] if flag == "--ingest-threads" => (&n[..], sets),
        sets => ("0", sets),
    };
    let secs: u64 = secs.parse().expect("SECS");
    println!(
        "| strategies | samples (after warm-up) | receiver CPU s | CPU µs/sample | peak RSS MB |"
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    for set in sets {
        let mut server = Command::new(bin)
            .args(["serve", "--listen", "127.0.0.1:0", "--strategies", set])
            .args(["--ingest-threads", lanes])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn promlab serve");
        let mut line = String::new();
        BufReader::new(server.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .expect("address")
            .to_string();
        let start_ms = 1_700_000_000_000i64;
        let url = format!("http://{addr}/api/v1/write");
        let feed = |from_ms: i64, ticks: u64| {
            let status = Command::new(bin)
                .args(["feed", "--url", &url, "--duration-secs", &ticks.to_string()])
                .args(["--start-ms", &from_ms.to_string()])
                .status()
                .expect("run promlab feed");
            assert!(status.success(), "feed failed");
        };
        let pid = server.id();
        let stats = || ProcessStats::of(pid).expect("the receiver's /proc entry");
        feed(start_ms, 2);
        let warm = stats().cpu;
        feed(start_ms + 2_000, secs);
        let after = stats();
        let cpu = after.cpu.saturating_sub(warm).as_secs_f64();
        let hwm_kb = after.peak_rss_kib.unwrap_or(0) as f64;
        let samples = secs as f64 * 100_000.0;
        println!(
            "| {set} | {samples:.0} | {cpu:.2} | {:.3} | {:.0} |",
            cpu * 1e6 / samples,
            hwm_kb / 1024.0
        );
        let _ = server.kill();
        let _ = server.wait();
    }
}
