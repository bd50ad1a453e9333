//! Values of one label set, folded by the process aggregation's rule.

use super::*;

// ---------------------------------------------------------------------------
// Series: decoded label sets, grouped, and one scrape's aggregated values.

/// Values of one label set, folded as they arrive in file order (the fold,
/// `crate::export::fold`, folds exited processes' files by the same rule).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Aggregate {
    pub(crate) value: f64,
    pub(crate) timestamp: f64,
}

impl Aggregate {
    pub(crate) fn fold(&mut self, mode: ProcessAggregation, value: f64, timestamp: f64) {
        match mode {
            ProcessAggregation::Sum => self.value += value,
            // Ruby keeps the first of equal values. NaN: Ruby's `Array#max`
            // raises (the scrape fails); here a NaN loses to any number, as
            // in PromQL's `max`, so the result does not depend on file order.
            ProcessAggregation::Max if value > self.value || nan_replaced(self.value, value) => {
                self.value = value
            }
            ProcessAggregation::Min if value < self.value || nan_replaced(self.value, value) => {
                self.value = value
            }
            ProcessAggregation::MostRecent if timestamp > self.timestamp => {
                self.value = value;
                self.timestamp = timestamp;
            }
            _ => {}
        }
    }
}

/// Whether `min`/`max` replace `kept` by `value`: a NaN by a number.
pub(super) fn nan_replaced(kept: f64, value: f64) -> bool {
    kept.is_nan() && !value.is_nan()
}
