//! A small driver for counting the write step's instructions under callgrind:
//! a warm long-label writer (`workload::LongLabelWriter`, what the
//! `write-long-label` scenario runs) takes `steps` more steps inside
//! `counted_steps`, the one function callgrind collects.
//!
//! ```text
//! cargo build --release --example write_steps
//! valgrind --tool=callgrind --toggle-collect='*counted_steps*' \
//!     target/release/examples/write_steps all 1000
//! ```
//! Divide the collected instructions by `steps` for a count per step.

use promlab::strategy::StrategySet;
use promlab::workload::LongLabelWriter;

/// The values the scenario cycles through (`harness::workloads::LongLabel`).
const VALUES: [f64; 4] = [0.003, 0.03, 0.3, 3.0];

#[inline(never)]
fn counted_steps(writer: &mut LongLabelWriter, steps: usize) -> anyhow::Result<()> {
    for i in 0..steps {
        writer.step(VALUES[i % 4])?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let strategies: StrategySet = args
        .next()
        .unwrap_or_else(|| "all".into())
        .parse()
        .map_err(anyhow::Error::msg)?;
    let steps: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let dir = tempfile::tempdir()?;
    let mut writer = LongLabelWriter::new(dir.path(), strategies)?;
    // Warm: every series exists, every cache is filled.
    for i in 0..8 {
        writer.step(VALUES[i % 4])?;
    }
    counted_steps(&mut writer, steps)?;
    println!("{strategies}: {steps} steps");
    Ok(())
}
