//! The two error types: a bad flag (`UsageError`, exit 2), and something the hook tried that
//! did not work (`Failure`: a warning or an unknown count; an exit only where `install` fails).
//! The socket table's dump wraps a `Failure` in whether it will last (`diag::DumpError`).

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
    pub(crate) name: &'static str,
    pub(crate) value: String,
    pub(crate) expected: String,
}

impl UsageError {
    pub(crate) fn new(name: &'static str, value: &str, expected: impl Into<String>) -> Self {
        UsageError { name, value: value.to_string(), expected: expected.into() }
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.value.escape_debug();
        write!(f, "invalid value '{value}' for {}: expected {}", self.name, self.expected)
    }
}

/// Something the hook tried at run time that did not work: a warning, or why a count is unknown
/// (a hook never exits on one; `install` does). Shown in the log's words.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Failure {
    /// `failed to GET http://127.0.0.1:15000/stats: connection refused`.
    Failed { verb: &'static str, object: String, cause: Box<Failure> },
    /// In words of its own: what an answer or a table lacks, or an OS error's cause.
    Said(String),
    /// Where one of several sources failed: `/clusters: <failure>`.
    In(&'static str, Box<Failure>),
    /// Every source tried, each with its failure, one after the other.
    Each(Vec<Failure>),
}

impl From<String> for Failure {
    fn from(said: String) -> Self {
        Failure::Said(said)
    }
}

impl From<&str> for Failure {
    fn from(said: &str) -> Self {
        Failure::Said(said.to_string())
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Failed { verb, object, cause } => {
                write!(f, "failed to {verb} {object}: {cause}")
            }
            Failure::Said(said) => f.write_str(said),
            Failure::In(source, failure) => write!(f, "{source}: {failure}"),
            Failure::Each(all) => {
                for (i, failure) in all.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "; " };
                    write!(f, "{sep}{failure}")?;
                }
                Ok(())
            }
        }
    }
}

/// A failure in one shape wherever it is shown: `failed to GET http://127.0.0.1:15000/stats:
/// connection refused`.
pub(crate) fn failed(
    verb: &'static str,
    object: impl fmt::Display,
    cause: impl Into<Failure>,
) -> Failure {
    Failure::Failed { verb, object: object.to_string(), cause: Box::new(cause.into()) }
}

/// What the tests ask of a failure's words.
#[cfg(test)]
impl Failure {
    pub(crate) fn contains(&self, part: &str) -> bool {
        self.to_string().contains(part)
    }

    pub(crate) fn starts_with(&self, part: &str) -> bool {
        self.to_string().starts_with(part)
    }

    pub(crate) fn ends_with(&self, part: &str) -> bool {
        self.to_string().ends_with(part)
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
        let failure = failed("read", "/proc/net/tcp", "not a regular file");
        assert_eq!(failure.to_string(), "failed to read /proc/net/tcp: not a regular file");
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
