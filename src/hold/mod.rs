//! `hold`, the app container's preStop: what is its own and not `run`'s.

pub mod config;
pub(crate) mod quiet;
