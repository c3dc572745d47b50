//! The wait loop on any rules (durations up to u64::MAX seconds, any threshold) and any script of
//! counts, costs, unknowns, arrivals and app states: no panic, it ends, it never reports reaching
//! the threshold on a count above it or one that saw a request arrive, and it never reports the
//! app's exit unless the last look saw it gone.
#![no_main]

use envoy_drain::outcome::Outcome;
use envoy_drain::config::Rules;
use envoy_drain::wait::{App, Clock, Tick, wait};
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
    let mut last = Tick::default();
    let mut calls = 0;
    let outcome = wait(&rules, Duration::ZERO, &mut Fake(&now), |left| {
        assert!(now.get().saturating_add(left) <= rules.deadline);
        let step = script.get(calls).copied();
        calls += 1;
        let Some(b) = step.filter(|_| calls <= MAX_COUNTS) else {
            now.set(rules.deadline);
            last = Tick::default();
            return last;
        };
        // The high nibble: what the look took, which also paces the next.
        let cost = Duration::from_millis(u64::from(b >> 4) * 100);
        now.set(now.get().saturating_add(cost).min(rules.deadline));
        // The low nibble: 0xf unknown, else a count of 0 to 7 and whether a request arrived; the
        // count's value also picks the app's state.
        let count = (b & 0xf != 0xf).then_some(u64::from(b & 0x7));
        let app = match b & 0x7 {
            0 => App::Gone,
            1 => App::Leaving,
            2 => App::NotSeen,
            3 => App::Unknown,
            _ => App::Running,
        };
        last = Tick {
            count,
            arrived: b & 0x8 != 0,
            app,
            cost,
        };
        last
    });
    match outcome {
        Outcome::Reached => assert!(
            last.count.is_some_and(|n| n <= rules.exit_at) && !last.arrived,
            "reached on {last:?}"
        ),
        Outcome::AppExited => assert_eq!(last.app, App::Gone, "app exit on {last:?}"),
        _ => {}
    }
});
