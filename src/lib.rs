//! envoy-drain's parts, in the order a run flows through them: the command line (cli) becomes a
//! checked configuration (config, lists, and preset for each proxy's defaults); the sources (source/: the admin client, the parsers of
//! Envoy's stats and /clusters, the socket table read over netlink or as text and the rule that
//! counts it, and the one decision between them) make a count (count); the wait (wait) turns
//! counts and time into an outcome (outcome); text words all of it; run (and hold), status and install are
//! the commands; log, signals and error serve them. The binary is src/main.rs; the fuzz targets in
//! fuzz/ call the parsers directly.

pub mod cli;
pub mod config;
pub mod count;
pub mod drain;
pub mod error;
pub mod install;
pub mod lists;
pub mod log;
pub mod outcome;
pub mod preset;
pub mod report;
pub mod run;
pub mod signals;
pub mod source;
pub mod status;
pub mod text;
pub mod wait;
