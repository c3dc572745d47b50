//! `run`'s end, which the wait asks at each count once the min-drain is over: the count at most
//! `--exit-at`, no request busy, and no request arriving lately.

use std::time::Duration;

/// How long after the last arrival seen `run` waits at least, whatever the count.
pub(crate) const ARRIVALS_QUIET: Duration = Duration::from_secs(2);

/// The count at most `n`, and `ARRIVALS_QUIET` after `arrived_at`, the end of the last count
/// that saw a request arrive (the request came before it).
#[derive(Debug)]
pub(crate) struct AtMost {
    n: u64,
    arrived_at: Option<Duration>,
}

impl AtMost {
    pub(crate) fn new(n: u64) -> AtMost {
        AtMost { n, arrived_at: None }
    }

    /// Whether a count is at most `n`, whatever keeps it busy.
    pub(crate) fn within(&self, count: Option<u64>) -> bool {
        count.is_some_and(|c| c <= self.n)
    }

    /// A count that ended at `now` saw requests arrive.
    pub(crate) fn arrived(&mut self, now: Duration) {
        self.arrived_at = Some(now);
    }

    /// The end of the quiet time after the last arrival, once any arrived.
    pub(crate) fn until(&self) -> Option<Duration> {
        // Saturating: durations up to u64::MAX seconds parse, and must not overflow.
        self.arrived_at.map(|t| t.saturating_add(ARRIVALS_QUIET))
    }

    /// Whether a count from `started` that ends just short of the end may decide it then: when
    /// no arrival came during it.
    pub(crate) fn decides_early(&self, started: Duration) -> bool {
        self.arrived_at.is_none_or(|t| t <= started)
    }
}
