//! Stages 4 and 5: remote-write ingest → DDSketch windows → quantiles.
//!
//! [`pipeline::Ingester`] is the one entry point (`handle(body)`), used by the
//! HTTP receiver ([`receiver`]) and offline by `promlab ingest`. Its four seams
//! (decode, canonicalize, route, sketch update) each have a reference and a
//! strategy, chosen by a [`crate::strategy::StrategySet`].

pub mod feed;
pub mod pipeline;
pub mod plan;
pub mod sketch;
pub mod window;
pub mod wire;
