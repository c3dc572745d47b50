//! envoy-drain: a pod's two preStop hooks, `run` (the proxy's: until its last request is done) and
//! `hold` (the app's: until requests stop arriving). `main` only maps the command line to a
//! command and the command to an exit code.

use envoy_drain::cli::{self, Parsed};
use envoy_drain::outcome::EXIT_REACHED;
use envoy_drain::{hold, hook, install, run, signals, status};
use std::io::Write;
use std::time::Instant;

fn main() {
    // The deadline counts from here; a signal from here on waits for the wait's summary.
    let start = Instant::now();
    let blocked = signals::block();
    let args: Vec<_> = std::env::args_os().collect();
    let env = |k: &str| std::env::var(k).ok();
    let code = match cli::parse(&args, &|k| std::env::var_os(k)) {
        Parsed::Run(a) => hook::command(run::config::run_config(&a, &env), start, blocked),
        Parsed::Hold(a) => hook::command(hold::config::hold_config(&a, &env), start, blocked),
        // A command that does not wait keeps the signals' default actions.
        Parsed::Status(a) => {
            blocked.release();
            status::command(&a, &env)
        }
        Parsed::Install(a) => {
            blocked.release();
            install::command(&a)
        }
        Parsed::Disabled(setting) => hook::disabled(&setting),
        Parsed::Print(text) => {
            let _ = write!(std::io::stdout(), "{text}");
            EXIT_REACHED
        }
        Parsed::Usage(message) => cli::usage_error(&message),
    };
    std::process::exit(code);
}
