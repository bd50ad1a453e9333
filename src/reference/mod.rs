//! Naive references, memchr-style: beside each fast path, the plainest code
//! that computes the same answer, written apart from the code under test
//! (nothing here calls `store`, `export`, `render`, `formenc`, `text` or the
//! ingest pipeline). The equivalence checks (`promlab verify`, the property
//! tests) compare every strategy combination against these, not only against
//! the baseline.
//!
//! - [`exposition`]: store directory + registry → exposition bytes, the way
//!   `../shared/fixtures/README.md` describes client_ruby's store and text
//!   format: entries walked with plain slicing, keys form-decoded byte by byte,
//!   values aggregated in `Vec`s, lines printed with plain loops. It must equal
//!   Ruby's `expected.prom` on the fixtures (`tests/reference.rs`).
//! - [`live`]: an in-memory registry's families as plain data → exposition
//!   bytes (the live renderer's reference), printed by `exposition`'s loops.
//! - [`store`]: op logs → each store file's bytes (timestamps zeroed): the
//!   writer's reference, so every write strategy is checked against it.
//! - [`ingest`]: decoded remote-write samples + plan → per aggregation, group
//!   and window, the raw values sorted (so the exact quantiles).
//! - [`quantile`]: the exact quantile at the DDSketch rank and the DDSketch
//!   guarantee (relative error α of the value at that rank, collapsed lowest
//!   bins and the zero bucket accounted for).

pub mod exposition;
pub mod first_difference;
pub mod ingest;
pub mod live;
pub mod quantile;
pub mod store;
