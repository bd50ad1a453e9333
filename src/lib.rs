//! promlab: the Prometheus metrics path, end to end, with every speed-up behind
//! a strategy switch and proven to give identical output.
//!
//! One module per pipeline stage:
//! - [`store`]: **write**, the client_ruby-compatible multi-process file store;
//! - [`export`]: **export**, read every process's files, decode keys, aggregate;
//! - [`render`]: **render**, Prometheus text exposition exactly as client_ruby prints it;
//! - [`ingest`]: **ingest**, the remote-write receiver, routing into DDSketch windows
//!   (**aggregate & query**).
//!
//! Shared by them, so that no two stages import each other: [`storefile`], the
//! store file format (writer and exporter); [`values`], the aggregated values
//! an export hands the renderer; [`text`], the exposition encoder every writer
//! of the text format uses; [`formenc`], the form encoding of store keys.
//!
//! [`strategy`] is the switchboard that decides which strategies run;
//! [`seams`] is the one place a strategy set becomes every stage's seam values,
//! which each stage takes once, at construction.
//!
//! [`reference`] holds the naive references every strategy combination is
//! checked against; [`scrape`] turns an exposition into remote-write requests,
//! so the chain runs end to end (`promlab verify`).

pub mod export;
pub mod format;
#[cfg(feature = "reference")]
#[doc(hidden)]
pub mod fuzzing;
pub mod ingest;
#[cfg(any(test, feature = "reference"))]
pub mod reference;
pub mod render;
pub mod scenarios;
pub mod shared;
pub mod write;
