//! The wait loop on any rules (durations up to u64::MAX seconds, any threshold) and any script of
//! counts, costs and unknowns: no panic, it ends, and it never reports reaching the threshold on
//! a count above it.
#![no_main]

use envoy_drain::outcome::Outcome;
use envoy_drain::config::Rules;
use envoy_drain::wait::{Clock, wait};
use libfuzzer_sys::fuzz_target;
use std::cell::Cell;
use std::time::Duration;

struct Fake<'a>(&'a Cell<Duration>);

impl Clock for Fake<'_> {
    fn now(&self) -> Duration {
        self.0.get()
    }
    fn sleep(&mut self, d: Duration) {
        self.0.set(self.0.get().saturating_add(d));
    }
}

/// Counts a script may make before the fake clock jumps to the deadline.
const MAX_COUNTS: usize = 1000;

fuzz_target!(|data: &[u8]| {
    let Some((head, script)) = data.split_first_chunk::<45>() else {
        return;
    };
    let duration = |i: usize| {
        let mut secs = [0u8; 8];
        secs.copy_from_slice(&head[i..i + 8]);
        Duration::new(u64::from_le_bytes(secs), u32::from(head[i + 8]) * 3_900_000)
    };
    let deadline = duration(9);
    let rules = Rules {
        // As the configuration allows: a positive interval, a min-drain within the deadline.
        min_drain: duration(0).min(deadline),
        deadline,
        interval: duration(18).max(Duration::from_nanos(1)),
        settle: duration(27),
        exit_at: u64::from(head[36] % 4),
    };
    let now = Cell::new(Duration::ZERO);
    let mut last = None;
    let mut calls = 0;
    let outcome = wait(&rules, Duration::ZERO, &mut Fake(&now), |left| {
        assert!(now.get().saturating_add(left) <= rules.deadline);
        let step = script.get(calls).copied();
        calls += 1;
        let Some(b) = step.filter(|_| calls <= MAX_COUNTS) else {
            now.set(rules.deadline);
            last = None;
            return None;
        };
        now.set(now.get().saturating_add(Duration::from_millis(u64::from(b >> 4) * 100)).min(rules.deadline));
        last = (b & 0xf != 0xf).then_some(u64::from(b & 0x7));
        last
    });
    if outcome == Outcome::Reached {
        assert!(last.is_some_and(|n| n <= rules.exit_at), "reached on {last:?}");
    }
});
