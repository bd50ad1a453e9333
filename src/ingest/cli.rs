//! `promlab ingest` and `promlab feed`.

use anyhow::{bail, Result};

#[derive(clap::Args, Debug)]
pub struct IngestArgs {
    /// Request body files, replayed in name order.
    pub files: Vec<std::path::PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct FeedArgs {}

pub fn ingest(_args: IngestArgs) -> Result<()> {
    bail!("ingest is not built yet")
}

pub fn feed(_args: FeedArgs) -> Result<()> {
    bail!("feed is not built yet")
}
