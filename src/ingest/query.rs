//! The query string of `GET /api/v1/quantiles?agg=ID[&window=START_MS]`.
//!
//! Here rather than in the lab's receiver so that the fuzz targets (`fuzz/`)
//! and the corpus replay (`tests/fuzz_corpus.rs`) parse exactly what the
//! receiver parses: the receiver extracts it with axum's `Query`, which is
//! `serde_urlencoded`, as [`QuantileParams::from_query`] is.

/// `agg` (an aggregation id of the plan) and an optional window start.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct QuantileParams {
    pub agg: String,
    pub window: Option<i64>,
}

impl QuantileParams {
    /// Parses a query string (the part after `?`), as axum's `Query` does.
    pub fn from_query(query: &[u8]) -> Result<QuantileParams, serde_urlencoded::de::Error> {
        serde_urlencoded::from_bytes(query)
    }
}
