//! What one timestamp costs: `clock_gettime` through the vDSO for
//! `CLOCK_MONOTONIC` (client_ruby's clock, and the write stage's baseline) and
//! `CLOCK_MONOTONIC_COARSE` (`coarse-clock`), in CPU time of this process per
//! call, the two clocks interleaved round by round.
//!
//! ```text
//! cargo run --release -p promlab-lab --example clock_cost -- 10000000 5
//! ```

use std::hint::black_box;

fn read(clock: libc::clockid_t) -> libc::timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts
}

fn cpu_ns() -> f64 {
    let ts = read(libc::CLOCK_PROCESS_CPUTIME_ID);
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let calls: u64 = args
        .next()
        .map_or(10_000_000, |s| s.parse().expect("calls"));
    let rounds: u32 = args.next().map_or(5, |s| s.parse().expect("rounds"));
    let clocks = [
        ("CLOCK_MONOTONIC", libc::CLOCK_MONOTONIC),
        ("CLOCK_MONOTONIC_COARSE", libc::CLOCK_MONOTONIC_COARSE),
    ];
    for round in 1..=rounds {
        for (name, clock) in clocks {
            let start = cpu_ns();
            for _ in 0..calls {
                black_box(read(black_box(clock)));
            }
            let per_call = (cpu_ns() - start) / calls as f64;
            println!("round {round}: {name} {per_call:.1} ns a call (CPU time)");
        }
    }
}
