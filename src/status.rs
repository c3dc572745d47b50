//! The `status` command: looks at every source once and prints what counts, what does not and
//! why, and what `run` would count (the one decision `run` makes, `source::decide`). It changes
//! nothing.

use crate::cli::{StatusArgs, usage_error};
use crate::config::{self, Mode};
use crate::outcome::{EXIT_NOTHING_COUNTED, EXIT_REACHED};
use crate::source::admin::{READY_PATH, REQUEST_TIMEOUT};
use crate::source::{self, Sources};
use std::io::Write;
use std::time::Duration;

/// The most one look may take: each request is bounded as in `run` (a second), except /clusters,
/// which a proxy with tens of thousands of clusters takes seconds to answer.
const LOOK: Duration = Duration::from_secs(10);

/// Prints the report; exits 0 when the source `run` would use can count now, else 3.
pub fn command(args: &StatusArgs) -> i32 {
    let counting = match config::status_config(args) {
        Ok(c) => c,
        Err(e) => return usage_error(&e.to_string()),
    };
    for w in &counting.warnings {
        let _ = writeln!(std::io::stdout(), "warning: {w}\n");
    }
    let mut sources = Sources::new(&counting);
    let ready =
        (counting.mode != Mode::Proc).then(|| sources.admin.get(READY_PATH, REQUEST_TIMEOUT));
    let look = sources.look(LOOK, true);
    let reading = source::decide(&look);
    let _ = write!(
        std::io::stdout(),
        "{}",
        crate::text::status(&look, &reading, &sources, ready.as_ref())
    );
    if reading.result.is_ok() { EXIT_REACHED } else { EXIT_NOTHING_COUNTED }
}
