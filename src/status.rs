//! The `status` command: looks at every source once and prints what counts and why. It changes nothing.

use crate::cli::{StatusArgs, usage_error};
use crate::config::Mode;
use crate::count::REQUEST_TIMEOUT;
use crate::outcome::{EXIT_NOTHING_COUNTED, EXIT_REACHED};
use crate::source::admin::READY_PATH;
use crate::source::{self, Sources};
use std::io::Write;
use std::time::Duration;

/// The most one look may take: /clusters of tens of thousands of clusters takes seconds.
const LOOK: Duration = Duration::from_secs(10);

/// Prints the report; exits 0 when the source `run` would use can count now, else 3.
pub fn command(args: &StatusArgs, env: &crate::config::Env<'_>) -> i32 {
    let (counting, plan) = match crate::run::config::run_config(&args.0, env) {
        Ok(c) => (c.counting, c.rules.plan),
        Err(e) => return usage_error(&e.to_string()),
    };
    for w in &counting.warnings {
        let _ = writeln!(std::io::stdout(), "warning: {w}\n");
    }
    let mut sources = Sources::new(&counting, &plan);
    let ready =
        (counting.mode != Mode::Proc).then(|| sources.admin.get(READY_PATH, REQUEST_TIMEOUT));
    let look = sources.look(LOOK, true);
    let reading = source::decide(&look);
    let report = crate::text::status(&look, &reading, &sources, ready.as_ref());
    let _ = write!(std::io::stdout(), "{report}");
    if reading.result.is_ok() { EXIT_REACHED } else { EXIT_NOTHING_COUNTED }
}
