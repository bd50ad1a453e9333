//! `promlab serve [--plan FILE]`: the remote-write receiver (being built).
use anyhow::{bail, Result};

pub fn serve(_args: crate::cli::ServeArgs) -> Result<()> {
    bail!("the remote-write receiver is not built yet")
}
