//! `promlab serve --store` / `--scenario`: the /metrics server (being built).
use anyhow::{bail, Result};

pub fn serve(_args: crate::cli::ServeArgs) -> Result<()> {
    bail!("the /metrics server is not built yet")
}
