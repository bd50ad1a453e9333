//! Stage 3, render (stub, being written).
pub mod server;
