//! envoy-drain's parts, one file per role: arguments become a config (cli, config); a source
//! becomes a count (admin and stats for Envoy; sockets reads the kernel's socket table, over
//! netlink with diag or as text, and procnet interprets it; source makes the one choice between
//! them); the wait turns counts and time into an outcome (wait, outcome); run,
//! status and install are the commands; log writes the lines. The binary is src/main.rs; the
//! fuzz targets in fuzz/ call the parsers directly.

pub mod admin;
pub mod cli;
pub mod clusters;
pub mod config;
pub mod count;
pub mod diag;
pub mod error;
pub mod install;
pub mod log;
pub mod outcome;
pub mod ports;
pub mod procnet;
pub mod run;
pub mod signals;
pub mod sockets;
pub mod source;
pub mod stats;
pub mod status;
pub mod wait;
