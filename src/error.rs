//! The one error type: a bad flag or environment variable, kept with the value and what was expected.

use std::fmt;

/// A value the user gave that cannot be used. Everything else that can go wrong at run time is a
/// warning in the log, because a preStop hook must keep waiting rather than fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError {
    /// The flag (`--deadline`) or environment variable (`MINIMUM_DRAIN_DURATION`).
    pub name: &'static str,
    pub value: String,
    pub expected: String,
}

impl UsageError {
    pub fn new(name: &'static str, value: &str, expected: impl Into<String>) -> Self {
        UsageError {
            name,
            value: value.to_string(),
            expected: expected.into(),
        }
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid value '{}' for {}: expected {}",
            self.value.escape_debug(),
            self.name,
            self.expected
        )
    }
}
