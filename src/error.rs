//! The two error types: a bad flag or environment variable (`UsageError`, exit 2), and something
//! the hook tried that did not work (`Failure`, a warning or an unknown count, never an exit).

use std::fmt;

/// A value the user gave that cannot be used. Everything else that can go wrong at run time is a
/// `Failure`, logged as a warning, because a preStop hook must keep waiting rather than fail.
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

/// A request, read or write that did not work, in one shape wherever it is shown:
/// `failed to <verb> <object>: <cause>`, such as `failed to GET http://127.0.0.1:15000/stats:
/// connection refused` or `failed to read /proc/net/tcp: not a regular file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub verb: &'static str,
    pub object: String,
    pub cause: String,
}

impl Failure {
    pub fn new(verb: &'static str, object: impl Into<String>, cause: impl Into<String>) -> Self {
        Failure {
            verb,
            object: object.into(),
            cause: cause.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "failed to {} {}: {}", self.verb, self.object, self.cause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_errors_read_as_promised() {
        let usage = UsageError::new("--deadline", "soon\n", "a duration like 25s");
        assert_eq!(
            usage.to_string(),
            "invalid value 'soon\\n' for --deadline: expected a duration like 25s"
        );
        let failure = Failure::new("read", "/proc/net/tcp", "not a regular file");
        assert_eq!(
            failure.to_string(),
            "failed to read /proc/net/tcp: not a regular file"
        );
    }
}
