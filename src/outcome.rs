//! How a run ends: the outcome, its exit code, and what the run has seen so far.

use crate::count::Count;
use crate::error::Failure;

// Exit codes: 0/1/2 as linkerd-await and ripgrep use them (success, "did not happen", usage
// error); 128 + the signal, as a shell reports a process a signal killed (143 SIGTERM).
pub const EXIT_REACHED: i32 = 0;
const EXIT_DEADLINE: i32 = 1;
pub(crate) const EXIT_USAGE: i32 = 2;
pub(crate) const EXIT_NOTHING_COUNTED: i32 = 3;
/// `install` could not copy the binary.
pub(crate) const EXIT_INSTALL_FAILED: i32 = 1;

/// The signals, by name, that end a wait with its summary (signals.rs): those that end a process.
pub(crate) const SIGNALS: [(i32, &str); 7] = [
    (libc::SIGHUP, "SIGHUP"),
    (libc::SIGINT, "SIGINT"),
    (libc::SIGQUIT, "SIGQUIT"),
    (libc::SIGUSR1, "SIGUSR1"),
    (libc::SIGUSR2, "SIGUSR2"),
    (libc::SIGALRM, "SIGALRM"),
    (libc::SIGTERM, "SIGTERM"),
];

/// The name of signal `sig`, one of `SIGNALS`.
pub(crate) fn signal_name(sig: i32) -> &'static str {
    SIGNALS.iter().find(|(n, _)| *n == sig).map_or("a signal", |(_, name)| name)
}

/// What the wait loop decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The count was at or below the threshold, after the min-drain and the settle time.
    Reached,
    /// The app has exited: what is still open, nothing can answer.
    AppExited,
    /// The deadline passed; at least one count succeeded on the way.
    Deadline,
    /// `hold`: the propagation passed with requests arriving only on connections kept alive, no
    /// new one for this long, their quiet time at least: the app's shutdown hands them over.
    KeptAlive(std::time::Duration),
    /// The deadline passed and no source ever answered.
    NothingCounted,
    /// `--preset waypoint`: what answers at the admin address is not Envoy (an agentgateway
    /// waypoint): nothing there to drain or count, so no deadline to wait out.
    NotEnvoy,
    /// A signal of `SIGNALS` arrived while waiting.
    Interrupted(i32),
}

impl Outcome {
    pub(crate) fn exit_code(self) -> i32 {
        match self {
            Outcome::Reached | Outcome::AppExited | Outcome::KeptAlive(_) => EXIT_REACHED,
            Outcome::Deadline => EXIT_DEADLINE,
            Outcome::NothingCounted | Outcome::NotEnvoy => EXIT_NOTHING_COUNTED,
            Outcome::Interrupted(sig) => 128 + sig,
        }
    }
}

/// What a run has seen so far; enough to write the summary at any moment, also from the signal
/// thread.
#[derive(Debug, Clone, Default)]
pub(crate) struct Progress {
    /// The newest successful count.
    pub(crate) last: Option<Count>,
    /// Set while the newest attempt to count failed: why.
    pub(crate) unknown: Option<Failure>,
    /// When a count last saw a request arrive, from the start of the run.
    pub(crate) arrived_at: Option<std::time::Duration>,
    /// `hold`: how far apart arrivals came at that count, and the quiet time they asked for.
    pub(crate) pace: Option<Pace>,
    /// The connections the pod accepted that a request kept busy at the last count.
    pub(crate) busy: Option<crate::count::Busy>,
}

/// How far apart `hold`'s arrivals come lately (their mean gap), and the quiet time that tells
/// they stopped (hold/quiet.rs, `Rate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pace {
    pub(crate) gap: std::time::Duration,
    pub(crate) quiet: std::time::Duration,
}
