//! `run`, the proxy container's preStop: what is its own and not `hold`'s.

pub mod config;
pub(crate) mod rule;
