//! The small shared core below every stage.

pub mod config_file;
pub mod mapguard;
pub(crate) mod probe;
pub mod seams;
pub mod strategy;
pub mod values;
