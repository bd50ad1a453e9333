//! promlab: the Prometheus metrics path, end to end, with every speed-up behind
//! a strategy switch and proven to give identical output.
//!
//! The stages, in pipeline order:
//! - [`write`]: the client_ruby-compatible multi-process file store;
//! - [`export`]: read every process's files, decode keys, aggregate (and the
//!   fold of exited processes' files, [`export::fold`]);
//! - [`render`]: Prometheus text exposition exactly as client_ruby prints it;
//! - [`ingest`]: the remote-write receiver, routing into DDSketch windows, and
//!   the quantiles answered from them (**aggregate & query**).
//!
//! Below them: [`format`], the formats they read and write (store files, key
//! encoding, the registry, Ruby's floats, the text exposition encoder), and
//! [`shared`], the small core: the strategy switchboard
//! ([`shared::strategy`]), the one place a strategy set becomes every stage's
//! seams ([`shared::seams`], which each stage takes once, at construction),
//! guarded file mappings, and the values an export hands the renderer. A stage
//! imports `format`, `shared` and the stages before it, never one after it,
//! with one exception: the export's `prerender` catalogue keeps lines that
//! [`render`] rendered.
//!
//! Beside them: [`scenarios`], the workload generators the lab, the benches
//! and the tests share; and, with the `reference` feature (test support, never
//! called by the pipeline), `reference`, the naive references every strategy
//! combination is checked against, and the fuzz targets' bodies.

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
