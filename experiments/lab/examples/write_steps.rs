//! A small driver for counting the write step's instructions under callgrind
//! and timing it: a warm long-label writer (`store_workloads::LongLabelWriter`, what
//! the `write-long-label` scenario runs) takes `steps` more steps inside
//! `counted_steps`, the one function callgrind collects. The arm `floor` takes
//! the lock pair alone instead (`harness::floor::WriteFloor`, the ablation's
//! floor arm), so the two counts side by side say what the step adds to it.
//!
//! ```text
//! cargo build --release -p promlab-lab --example write_steps
//! valgrind --tool=callgrind --toggle-collect='*counted_steps*' \
//!     target/release/examples/write_steps all 1000
//! target/release/examples/write_steps floor 200000
//! ```
//! Divide the collected instructions by `steps` for a count per step. The
//! driver prints the wall time per step too (noisy on a loaded machine).

use promlab::scenarios::store_workloads::LongLabelWriter;
use promlab::shared::strategy::StrategySet;
use promlab_lab::harness::floor::WriteFloor;
use std::time::Instant;

/// The values the scenario cycles through (`harness::workloads::LongLabel`).
const VALUES: [f64; 4] = [0.003, 0.03, 0.3, 3.0];

enum Arm {
    Writer(LongLabelWriter),
    Floor(WriteFloor),
}

/// The steps callgrind counts (`--toggle-collect='*counted_steps*'`).
#[inline(never)]
fn counted_steps(arm: &mut Arm, steps: usize) -> anyhow::Result<()> {
    run(arm, steps)
}

#[inline(always)]
fn run(arm: &mut Arm, steps: usize) -> anyhow::Result<()> {
    match arm {
        Arm::Writer(writer) => {
            for i in 0..steps {
                writer.step(VALUES[i % 4])?;
            }
        }
        Arm::Floor(floor) => {
            floor.run(steps)?;
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "all".into());
    let steps: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let dir = tempfile::tempdir()?;
    let mut arm = if name == "floor" {
        Arm::Floor(WriteFloor::new()?)
    } else {
        let strategies: StrategySet = name.parse().map_err(anyhow::Error::msg)?;
        Arm::Writer(LongLabelWriter::new(dir.path(), strategies)?)
    };
    // Warm, not counted: every series exists, every cache is filled.
    run(&mut arm, 8)?;
    let start = Instant::now();
    counted_steps(&mut arm, steps)?;
    let elapsed = start.elapsed();
    println!(
        "{name}: {steps} steps, {:.1} ns a step",
        elapsed.as_nanos() as f64 / steps as f64
    );
    Ok(())
}
