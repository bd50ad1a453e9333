//! The small shared core below every stage.

pub mod config_file;
pub(crate) mod event_probe;
pub mod mapguard;
pub mod metric_values;
pub mod seams;
pub mod strategy;
