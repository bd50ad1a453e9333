//! promlab's lab: everything around the pipeline library that a performance
//! engineer runs — the command line, the `/metrics` and remote-write servers,
//! the paced feeder, the ablation harness with its peers and reports, and the
//! profilers. It depends on the `promlab` library; the library never depends on it.

pub mod cli;
pub mod cluster;
pub mod feed;
pub mod fixtures;
pub mod harness;
pub mod http_client;
pub mod machine;
pub mod profile;
pub mod servers;
pub mod verify;
