//! The ingest stage's seams, resolved once from a [`StrategySet`] when an
//! [`Ingester`](super::pipeline::Ingester) is built. Nothing below the
//! ingester's constructor asks which strategies are on: each seam holds the
//! variant it runs.
//!
//! | seam | variants | strategy that picks the fast one | where |
//! | --- | --- | --- | --- |
//! | [`Decode`] | `Owned` (prost), `Borrowed` (walk the buffer), `BorrowedDeferred` | `borrowed-decode` | `wire.rs` |
//! | [`Canonicalize`] | `PerRequest` (rebuilt per series per request), `Cached` | `series-cache` | `pipeline.rs` (`resolve`) |
//! | [`Route`] | `PerSample` (string keys into a `HashMap` of vectors), `Batched` (counting sort) | `batch-routing` | `pipeline.rs` |
//! | [`SketchUpdate`] | `PerSample` (`DDSketch::add`), `Runs` (one pane lookup and `BulkSketch::add_slice` per run) | `bulk-sketch` | `window.rs`, `sketch.rs` |
//!
//! Combined variants, and why they exist:
//! - `Decode::BorrowedDeferred` = `borrowed-decode` × `series-cache`: the cache
//!   keys on a series' raw label bytes, so the walker only steps over the label
//!   fields and they are parsed on a cache miss alone. The owned decoder has no
//!   raw bytes to key on (the cache re-encodes the labels instead), so there is
//!   no owned-deferred variant.
//! - None for the others. The two routers read the canonicalize seam's output
//!   through one interface (`Resolved`'s per-series views), so
//!   `series-cache` × `batch-routing` is not a path of its own: with the cache a
//!   series' destination ids are a slice of the cache, without it they are
//!   re-derived once per series per request.

use crate::strategy::{Strategy, StrategySet};

/// How a decompressed `WriteRequest` becomes a [`super::wire::Batch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decode {
    /// The reference: prost into owned structs.
    Owned,
    /// `borrowed-decode`: labels as slices of the buffer.
    Borrowed,
    /// `borrowed-decode` with `series-cache`: label fields stepped over, parsed on a cache miss.
    BorrowedDeferred,
}

/// How a request's series get their canonical form and destinations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Canonicalize {
    /// The reference: validated and canonicalized per series per request.
    PerRequest,
    /// `series-cache`: once per series, keyed by its raw label bytes.
    Cached,
}

/// How routed samples reach their destinations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The reference: per sample and aggregation, string keys into a `HashMap` of vectors.
    PerSample,
    /// `batch-routing`: destinations once per series, a counting sort per request.
    Batched,
}

/// How a destination's samples reach its panes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SketchUpdate {
    /// The reference: per sample, find the pane, `DDSketch::add`.
    PerSample,
    /// `bulk-sketch`: per run of samples in one window, one pane lookup and a slice add.
    Runs,
}

/// The ingest stage's four seams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seams {
    pub decode: Decode,
    pub canonicalize: Canonicalize,
    pub route: Route,
    pub sketch: SketchUpdate,
}

impl Seams {
    /// The only place the ingest stage reads a [`StrategySet`].
    pub fn new(strategies: StrategySet) -> Seams {
        let on = |s| strategies.contains(s);
        Seams {
            decode: match (on(Strategy::BorrowedDecode), on(Strategy::SeriesCache)) {
                (false, _) => Decode::Owned,
                (true, false) => Decode::Borrowed,
                (true, true) => Decode::BorrowedDeferred,
            },
            canonicalize: if on(Strategy::SeriesCache) {
                Canonicalize::Cached
            } else {
                Canonicalize::PerRequest
            },
            route: if on(Strategy::BatchRouting) {
                Route::Batched
            } else {
                Route::PerSample
            },
            sketch: if on(Strategy::BulkSketch) {
                SketchUpdate::Runs
            } else {
                SketchUpdate::PerSample
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::Stage;

    #[test]
    fn every_combination_resolves_to_distinct_seams() {
        let all: Vec<Seams> = StrategySet::combinations(Stage::Ingest)
            .into_iter()
            .map(Seams::new)
            .collect();
        for (i, a) in all.iter().enumerate() {
            assert!(all[i + 1..].iter().all(|b| a != b), "{a:?} twice");
        }
        assert_eq!(Seams::new(StrategySet::NONE).decode, Decode::Owned);
        assert_eq!(
            Seams::new(StrategySet::all()),
            Seams {
                decode: Decode::BorrowedDeferred,
                canonicalize: Canonicalize::Cached,
                route: Route::Batched,
                sketch: SketchUpdate::Runs,
            }
        );
    }
}
