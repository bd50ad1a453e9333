//! Stage 4 and 5: remote-write ingest → DDSketch windows → quantiles.
//! (Being built: see issue "The second half".)

pub mod cli;
pub mod receiver;
