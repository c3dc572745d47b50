//! envoy-drain's parts, in the order a run flows through them: the command line (cli) becomes a
//! checked configuration (config, run/config, hold/config, lists, preset); the sources (source/)
//! make a count (count); the wait turns counts and time into an outcome, asking the hook's end
//! rule (run/rule, hold/quiet); text words all of it; hook (both hooks: the same wait on two
//! rules), status and install are the commands; log, signals and error serve them. The fuzz
//! targets call the parsers and drive the wait directly.

pub mod cli;
pub mod config;
pub mod count;
pub(crate) mod drain;
pub(crate) mod error;
pub mod hold;
pub mod hook;
pub mod install;
pub mod lists;
pub(crate) mod log;
pub mod outcome;
pub mod preset;
pub(crate) mod record;
pub(crate) mod report;
pub mod run;
pub mod signals;
pub mod source;
pub mod status;
pub(crate) mod text;
pub mod wait;
