//! The two error shapes: a bad flag (`UsageError`, exit 2), and something the hook tried that
//! did not work (`failed`: a warning or an unknown count, never an exit).

use std::{fmt, io};

/// Keeps hostile text quoted in a message to one readable piece of a line.
pub(crate) fn shorten(text: &str) -> String {
    const MAX: usize = 80;
    match text.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

/// An I/O error in the words of the rest of the log: `connection refused`, without `(os error 111)`.
pub(crate) fn io_cause(e: &io::Error) -> String {
    let text = e.to_string();
    let text = text.split_once(" (os error ").map_or(text.as_str(), |(text, _)| text);
    // ASCII only: the OS's messages are, and Unicode's case tables would cost the binary 10 KB.
    let mut cause = text.to_string();
    if let Some(first) = cause.get_mut(..1) {
        first.make_ascii_lowercase();
    }
    cause
}

/// A value the user gave that cannot be used; anything else at run time is a warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError {
    /// The flag (`--deadline`).
    pub name: &'static str,
    pub(crate) value: String,
    pub(crate) expected: String,
}

impl UsageError {
    pub fn new(name: &'static str, value: &str, expected: impl Into<String>) -> Self {
        UsageError { name, value: value.to_string(), expected: expected.into() }
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.value.escape_debug();
        write!(f, "invalid value '{value}' for {}: expected {}", self.name, self.expected)
    }
}

/// A failure in one shape wherever it is shown: `failed to GET http://127.0.0.1:15000/stats:
/// connection refused`.
pub(crate) fn failed(
    verb: &str,
    object: impl std::fmt::Display,
    cause: impl std::fmt::Display,
) -> String {
    format!("failed to {verb} {object}: {cause}")
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
        let failure = failed("read", "/proc/net/tcp", "not a regular file");
        assert_eq!(failure, "failed to read /proc/net/tcp: not a regular file");
    }

    #[test]
    fn an_io_cause_reads_like_the_rest_of_the_log() {
        let missing = std::fs::File::open("/nonexistent/envoy-drain").unwrap_err();
        assert_eq!(io_cause(&missing), "no such file or directory");
        let refused = io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert_eq!(io_cause(&refused), "connection refused");
        let own = io::Error::other("Nothing here");
        assert_eq!(io_cause(&own), "nothing here");
    }
}
