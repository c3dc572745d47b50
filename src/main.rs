//! envoy-drain: keeps an Envoy sidecar alive until its last connection is done. `main` only maps
//! the command line to a command and the command to an exit code.

use envoy_drain::cli::{self, Parsed};
use envoy_drain::outcome::EXIT_REACHED;
use envoy_drain::{config, install, run, status};
use std::io::Write;
use std::time::Instant;

fn main() {
    // The deadline counts from here.
    let start = Instant::now();
    let args: Vec<_> = std::env::args_os().collect();
    let env = |k: &str| std::env::var(k).ok();
    let code = match cli::parse(&args, &|k| std::env::var_os(k)) {
        Parsed::Run(a) => run::command(config::run_config(&a, &env), start),
        Parsed::Hold(a) => run::command(config::hold_config(&a, &env), start),
        Parsed::Status(a) => status::command(&a, &env),
        Parsed::Install(a) => install::command(&a),
        Parsed::Disabled(setting) => run::disabled(&setting),
        Parsed::Print(text) => {
            let _ = write!(std::io::stdout(), "{text}");
            EXIT_REACHED
        }
        Parsed::Usage(message) => cli::usage_error(&message),
    };
    std::process::exit(code);
}
