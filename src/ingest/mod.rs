//! Stages 4 and 5: remote-write ingest → DDSketch windows → quantiles.
//!
//! [`pipeline::Ingester`] is the one entry point (`handle(body)`), used by the
//! lab's HTTP receiver and offline by `promlab ingest`. Its four seams (wire
//! decode, canonicalize, route, sketch update) each have a reference and a
//! strategy; the ingester takes its [`crate::shared::seams::IngestSeams`] from
//! [`crate::shared::seams::Seams::resolve`] once, when it is built, and nothing below
//! asks which strategies are on. [`crate::shared::seams`] has the table of seams, their
//! variants, and the one combined variant (and why).

pub mod bins;
pub mod budget;
pub mod bulk_sketch;
pub mod distributed;
pub mod feed;
pub mod group_key;
pub mod groups;
mod hashing;
pub mod lanes;
pub mod pipeline;
pub mod plan;
mod prefetch;
pub mod query;
pub mod sketch;
pub mod window;
pub mod wire;
