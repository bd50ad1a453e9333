//! One arm of an export scenario (what `promlab ablate` times: a warm scrape
//! of a long-lived exporter), alone in a process, `N` times after the
//! verified first run: for callgrind, where instructions per scrape are the
//! difference between two `N` (the setup is the same), and for `perf`.
//!
//! ```text
//! cargo build --release -p promlab-lab --example scrape_probe
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/a.out \
//!     target/release/examples/scrape_probe seed-repro all 1
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/b.out \
//!     target/release/examples/scrape_probe seed-repro all 11
//! target/release/examples/scrape_probe many-processes none 20 --full
//! ```
//! `SCENARIO ARM N [--full]`: a built-in export scenario (quick size unless
//! `--full`), `ARM` a strategy set or `floor`. Prints wall and process CPU
//! time per run.

use anyhow::{bail, Context, Result};
use promlab::shared::strategy::StrategySet;
use promlab_lab::harness::{self, ArmKind};
use std::time::Instant;

fn cpu_now() -> std::time::Duration {
    // SAFETY: clock_gettime fills the timespec it is given.
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [scenario, arm, n, rest @ ..] = args.as_slice() else {
        bail!("usage: scrape_probe SCENARIO ARM N [--full]");
    };
    let n: usize = n.parse().context("N")?;
    let scenario = harness::load_scenario(scenario)?;
    let size = scenario.size(!rest.iter().any(|a| a == "--full"));
    let (kind, set) = match arm.as_str() {
        "floor" => (ArmKind::Floor, StrategySet::NONE),
        set => (
            ArmKind::Strategies,
            set.parse::<StrategySet>().map_err(anyhow::Error::msg)?,
        ),
    };
    let mut workload = harness::workloads::build(&size.params)?;
    let first = harness::run_arm(workload.as_mut(), kind, arm, set)?;
    if let harness::Output::Bytes(bytes) = first {
        let got = harness::digest(bytes);
        if !size.expected.is_empty() && got != size.expected {
            bail!("{arm}: digest {got}, {} expected", size.expected);
        }
    }
    let (wall, cpu) = (Instant::now(), cpu_now());
    for _ in 0..n {
        std::hint::black_box(
            harness::run_arm(workload.as_mut(), kind, arm, set)?
                .bytes()?
                .len(),
        );
    }
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e3 / n.max(1) as f64;
    println!(
        "{} {arm}: {n} runs, {:.3} ms wall, {:.3} ms CPU per run",
        scenario.name,
        per(wall.elapsed()),
        per(cpu_now() - cpu)
    );
    Ok(())
}
