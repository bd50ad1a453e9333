//! Stages 4 and 5: remote-write ingest → DDSketch windows → quantiles.
//!
//! [`pipeline::Ingester`] is the one entry point (`handle(body)`), used by the
//! lab's HTTP receiver and offline by `promlab ingest`. Its four seams (decode,
//! canonicalize, route, sketch update) each have a reference and a strategy;
//! the ingester turns its [`crate::strategy::StrategySet`] into a
//! [`seams::Seams`] value once, when it is built, and nothing below asks which
//! strategies are on. [`seams`] has the table of seams, their variants, and the
//! one combined variant (and why).

pub mod bins;
pub mod distributed;
pub mod feed;
pub mod groups;
pub mod lanes;
pub mod pipeline;
pub mod plan;
pub mod query;
pub mod seams;
pub mod sketch;
pub mod window;
pub mod wire;
