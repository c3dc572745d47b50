//! How a run ends: the exit codes and the final summary line that must make sense on its own.

use crate::count::Count;
use std::time::Duration;

// Exit codes. 0/1/2 follow the usual shell convention (success, "did not happen", usage error,
// as linkerd-await and ripgrep use them); 130 and 143 are what a shell reports for a process
// killed by SIGINT (2) or SIGTERM (15), 128 + the signal number.
pub const EXIT_REACHED: i32 = 0;
pub const EXIT_DEADLINE: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_NOTHING_COUNTED: i32 = 3;
/// `install` could not copy the binary.
pub const EXIT_INSTALL_FAILED: i32 = 1;
pub const EXIT_SIGINT: i32 = 130;
pub const EXIT_SIGTERM: i32 = 143;

/// What the wait loop decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The count was at or below the threshold, after the min-drain and the settle time.
    Reached,
    /// The deadline passed; at least one count succeeded on the way.
    Deadline,
    /// The deadline passed and no source ever answered.
    NothingCounted,
    /// A signal arrived while waiting (SIGINT or SIGTERM).
    Interrupted(i32),
}

impl Outcome {
    pub fn exit_code(self) -> i32 {
        match self {
            Outcome::Reached => EXIT_REACHED,
            Outcome::Deadline => EXIT_DEADLINE,
            Outcome::NothingCounted => EXIT_NOTHING_COUNTED,
            Outcome::Interrupted(libc::SIGINT) => EXIT_SIGINT,
            Outcome::Interrupted(_) => EXIT_SIGTERM,
        }
    }
}

/// What a run has seen so far; enough to write the summary at any moment, also from the signal
/// thread.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// The newest successful count.
    pub last: Option<Count>,
    /// Set while the newest attempt to count failed: why.
    pub unknown: Option<String>,
}

/// The final line: outcome, elapsed time, count, source, and for a deadline what is still open.
pub fn summary(outcome: Outcome, elapsed: Duration, deadline: Duration, p: &Progress) -> String {
    let took = seconds(elapsed);
    let counted = match &p.last {
        Some(c) => format!("{} ({})", c.describe(), c.source.name()),
        None => "nothing counted".to_string(),
    };
    let stale = match (&p.last, &p.unknown) {
        (Some(_), Some(why)) => {
            format!("; the last count failed ({why}), so this is the last known count")
        }
        _ => String::new(),
    };
    match outcome {
        Outcome::Reached => format!("done after {took}: {counted}; the proxy may stop now"),
        Outcome::Deadline => format!(
            "deadline of {} passed after {took} with {counted} still open{}{stale}",
            humantime::format_duration(deadline),
            p.last.as_ref().map(|c| c.still_open()).unwrap_or_default()
        ),
        Outcome::NothingCounted => format!(
            "deadline of {} passed after {took} and nothing could be counted: {}",
            humantime::format_duration(deadline),
            p.unknown.as_deref().unwrap_or("no source answered")
        ),
        Outcome::Interrupted(sig) => format!(
            "interrupted by {} after {took} with {counted}{}{stale}",
            if sig == libc::SIGINT {
                "SIGINT"
            } else {
                "SIGTERM"
            },
            p.last.as_ref().map(|c| c.still_open()).unwrap_or_default()
        ),
    }
}

/// Seconds with one decimal, the precision a person reads in a log; rounded to the nearest tenth
/// in integers, which keeps float formatting out of the binary.
pub fn seconds(d: Duration) -> String {
    let tenths = d.as_millis().saturating_add(50) / 100;
    format!("{}.{}s", tenths / 10, tenths % 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_to_the_nearest_tenth() {
        for (ms, want) in [
            (0, "0.0s"),
            (49, "0.0s"),
            (50, "0.1s"),
            (1949, "1.9s"),
            (1950, "2.0s"),
            (25_000, "25.0s"),
        ] {
            assert_eq!(seconds(Duration::from_millis(ms)), want, "{ms} ms");
        }
        assert_eq!(
            seconds(Duration::MAX),
            "18446744073709551616.0s",
            "no overflow"
        );
    }
}
