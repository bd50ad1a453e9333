//! Scenario generators.

pub mod op_log;
pub mod per_process_layout;
pub mod rabbitmq;
pub mod scrape_to_remote_write;
pub mod store_workloads;
