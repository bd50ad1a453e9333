//! Scenario generators.

pub mod ops;
pub mod rabbitmq;
pub mod scrape;
pub mod workload;
