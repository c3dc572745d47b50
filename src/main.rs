//! envoy-drain: keeps an Envoy sidecar alive until its last connection is done. `main` only turns
//! the command line into a command and its result into an exit code.

use argh::FromArgs;
use envoy_drain::cli::{Cli, Command, InstallArgs, RunArgs, StatusArgs};
use envoy_drain::log::Logger;
use envoy_drain::{config, install, outcome, run, signals, source, status};
use outcome::{
    EXIT_INSTALL_FAILED, EXIT_NOTHING_COUNTED, EXIT_REACHED, EXIT_USAGE, Outcome, Progress,
};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

fn main() {
    let start = Instant::now();
    std::process::exit(dispatch(start));
}

fn dispatch(start: Instant) -> i32 {
    let args: Vec<String> = match std::env::args_os().map(|a| a.into_string()).collect() {
        Ok(a) => a,
        Err(bad) => return usage(&format!("argument {bad:?} is not UTF-8")),
    };
    let strs: Vec<&str> = args.iter().map(String::as_str).collect();
    // The kill switch wins over everything, bad flags included: operators flip it to get a pod
    // out of trouble without a new image.
    if strs.get(1) == Some(&"run")
        && let Some(v) = std::env::var_os(config::ENV_DISABLED).filter(|v| !v.is_empty())
    {
        Logger::stderr().info(&format!(
            "{}={} is set: not draining and not waiting",
            config::ENV_DISABLED,
            v.to_string_lossy()
        ));
        return EXIT_REACHED;
    }
    let cli = match Cli::from_args(&["envoy-drain"], strs.get(1..).unwrap_or_default()) {
        Ok(cli) => cli,
        Err(early) if early.status.is_ok() => {
            let _ = write!(std::io::stdout(), "{}", early.output);
            return EXIT_REACHED;
        }
        Err(early) => return usage(early.output.trim_end()),
    };
    if cli.version {
        let _ = writeln!(
            std::io::stdout(),
            "envoy-drain {}",
            env!("CARGO_PKG_VERSION")
        );
        return EXIT_REACHED;
    }
    match cli.command {
        Some(Command::Run(a)) => run_command(&a, start),
        Some(Command::Status(a)) => status_command(&a),
        Some(Command::Install(a)) => install_command(&a),
        None => usage("no command given: expected run, status or install (see envoy-drain --help)"),
    }
}

fn usage(message: &str) -> i32 {
    let _ = writeln!(std::io::stderr(), "envoy-drain: {message}");
    EXIT_USAGE
}

fn run_command(a: &RunArgs, start: Instant) -> i32 {
    let mut logger = Logger::stderr();
    let cfg = match config::run_config(a, &|k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => return usage(&e.to_string()),
    };
    if let Some(path) = &cfg.log_file {
        logger.add_file(path);
    }
    let log = Arc::new(Mutex::new(logger));
    let progress = Arc::new(Mutex::new(Progress::default()));
    let deadline = cfg.rules.deadline;
    let (sig_log, sig_progress) = (Arc::clone(&log), Arc::clone(&progress));
    let caught = signals::on_interrupt(move |sig| {
        let outcome = Outcome::Interrupted(sig);
        // When the wait has just ended, its own summary and exit code stand.
        if run::finish(outcome, &sig_log, &sig_progress, start, deadline) {
            std::process::exit(outcome.exit_code());
        }
    });
    if !caught {
        run::lock(&log).warn(
            "failed to take over SIGINT and SIGTERM; a signal will end the wait without a summary",
        );
    }
    let outcome = run::run(&cfg, &log, &progress, start);
    let _ = run::finish(outcome, &log, &progress, start, deadline);
    outcome.exit_code()
}

fn status_command(a: &StatusArgs) -> i32 {
    let counting = match config::status_config(a) {
        Ok(c) => c,
        Err(e) => return usage(&e.to_string()),
    };
    let (text, counted) = status::report(&mut source::Sources::new(&counting));
    let _ = write!(std::io::stdout(), "{text}");
    if counted {
        EXIT_REACHED
    } else {
        EXIT_NOTHING_COUNTED
    }
}

fn install_command(a: &InstallArgs) -> i32 {
    match install::install(std::path::Path::new(&a.dest)) {
        Ok((path, size)) => {
            let _ = writeln!(
                std::io::stdout(),
                "installed {} ({size} bytes, envoy-drain {})",
                path.display(),
                env!("CARGO_PKG_VERSION")
            );
            EXIT_REACHED
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "envoy-drain: {e}");
            EXIT_INSTALL_FAILED
        }
    }
}
