//! The wait on any rules (durations up to u64::MAX seconds, any threshold, with and without
//! --then-quit) and any script of counts, costs, unknowns, request counters and app sockets: no
//! panic, it ends, it never reports reaching the threshold on a count above it or one that saw a
//! request arrive (`hold`: on a look that could not read arrivals, or saw one) or a connection
//! still delivering or awaiting an answer, and it never reports the app's exit, nor stops the
//! proxy, unless the last look saw it gone with nothing left to deliver, nor before the min-drain.
#![no_main]

use envoy_drain::config::{ArrivalRule, Hold, Holding, Plan, Rules};
use envoy_drain::count::{Before, Busy, Cost};
use envoy_drain::outcome::Outcome;
use envoy_drain::wait::{App, Ask, LAST_COUNT, Seen, Step, Sight, Wait};
use libfuzzer_sys::fuzz_target;
use std::cell::Cell;
use std::net::SocketAddr;
use std::time::Duration;

/// Looks a script may make before the fake clock jumps to the deadline.
const MAX_LOOKS: usize = 1000;

/// Where the fake clock stops when a look overruns the deadline.
const CLOCK_END: Duration = Duration::from_secs(u64::MAX / 2);

/// Each byte of the script is one look: the high nibble what it took (which also paces the
/// next), the low one 0xf for an unknown count, else a count of 0 to 7 and whether the request
/// counter moved; the count's value also picks whether the app holds sockets.
struct Script<'a> {
    now: &'a Cell<Duration>,
    deadline: Duration,
    bytes: &'a [u8],
    looks: usize,
    requests: u64,
    last: Sight,
    seen: Seen,
}

impl Script<'_> {
    fn sight(&mut self, left: Duration, _: Ask) -> Sight {
        assert!(left <= self.deadline.saturating_sub(self.now.get()));
        let step = self.bytes.get(self.looks).copied();
        self.looks += 1;
        let Some(b) = step.filter(|_| self.looks <= MAX_LOOKS) else {
            self.now.set(self.now.get().max(self.deadline));
            self.last = Sight::default();
            return self.last;
        };
        // A look may end past the deadline, as a slow answer or a descheduled hook makes it; the
        // clock stays short of Duration::MAX, as a real one does, where saturated times meet.
        let took = Duration::from_millis(u64::from(b >> 4) * 100);
        self.now.set(self.now.get().saturating_add(took).min(CLOCK_END.max(self.deadline)));
        self.requests += u64::from(b & 0x8 != 0);
        self.last = Sight {
            count: (b & 0xf != 0xf).then_some(u64::from(b & 0x7)),
            arrivals: Some(self.requests),
            // A recount that grows with the arrivals, as /clusters' beside the socket table's.
            recounted: self.requests.saturating_mul(u64::from(b >> 4)),
            // New connections among the arrivals, where the source tells them.
            opened: (b & 0x40 == 0).then_some(self.requests / 2),
            // What the kernel remembers of arrivals before the first look.
            before: (self.looks == 1).then(|| Before {
                arrivals: u64::from(b & 0x3f),
                span: Duration::from_millis(u64::from(b) * 400),
                recent: (b & 0x80 != 0).then(|| {
                    let newest = Duration::from_millis(u64::from(b & 0xf) * 700);
                    (newest, Duration::from_millis(u64::from(b >> 4) * 900))
                }),
            }),
            // How long ago the newest arrival came, where told.
            newest: (b & 0x20 != 0).then(|| Duration::from_millis(u64::from(b & 0x1f) * 60)),
            // What the accepted connections still deliver and await, where told.
            busy: (b & 0x10 != 0).then_some(Busy {
                delivering: u64::from(b >> 7),
                awaiting: u64::from((b >> 6) & 1),
            }),
            app: match b & 0x3 {
                0 => None,
                1 => Some(true),
                _ => Some(false),
            },
            cost: Cost {
                look: took,
                admin: took,
                // What the look cost in CPU, where it was measured: none, or part of its time.
                cpu: (b & 0x4 != 0).then_some(took / 4),
            },
        };
        self.last
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((head, bytes)) = data.split_first_chunk::<45>() else {
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
        plan: match head[36] % 5 {
            4 => Plan::Hold(Box::new(Hold {
                holding: Holding::NoMesh,
                propagation: Duration::from_millis(u64::from(head[39]) * 100).min(deadline),
                arrivals: ArrivalRule::default(),
            })),
            n => Plan::Run {
                exit_at: u64::from(n),
                then_quit: head[37] & 1 == 1,
                agent: SocketAddr::from(([127, 0, 0, 1], 15020)),
            },
        },
    };
    // The drain's request may have taken any part of the deadline, or more.
    let drained_at = Duration::from_millis(u64::from(head[38]) * 100);
    let now = Cell::new(drained_at);
    let mut script = Script {
        now: &now,
        deadline,
        bytes,
        looks: 0,
        requests: 0,
        last: Sight::default(),
        seen: Seen::default(),
    };
    let mut wait = Wait::new(&rules, drained_at);
    // Every step sleeps to a later time, looks (at most MAX_LOOKS before the clock jumps to the
    // deadline) or ends: bounded.
    let end = loop {
        match wait.next(now.get()) {
            Step::Sleep(until) => {
                assert!(until > now.get(), "a sleep to {until:?} at {:?}", now.get());
                now.set(until);
            }
            Step::Look(ask) => {
                let started = now.get();
                let sight = script.sight(deadline.saturating_sub(started), ask);
                script.seen = wait.saw(ask, (started, now.get()), &sight);
            }
            Step::End(end) => break end,
        }
    };
    let (last, seen) = (script.last, script.seen);
    match end.outcome {
        Outcome::Reached if end.quit.is_none() => assert!(
            match rules.plan {
                Plan::Run { exit_at: most, .. } =>
                    last.count.is_some_and(|n| n <= most)
                        && seen.arrived == 0
                        && last.busy.is_none_or(|b| b == Busy::default()),
                Plan::Hold(_) =>
                    last.arrivals != None && (seen.arrived == 0 || rules.settle.is_zero()),
            },
            "reached on {last:?}, {seen:?}"
        ),
        Outcome::AppExited => {
            assert_eq!(seen.app, App::Gone, "app exit on {last:?}");
            assert!(last.busy.is_none_or(|b| b.delivering == 0), "app exit on {last:?}");
            let drain_done = drained_at
                .saturating_add(rules.min_drain)
                .min(deadline.saturating_sub(rules.interval.min(LAST_COUNT)));
            assert!(now.get() >= drain_done, "app exit at {:?}", now.get());
        }
        Outcome::KeptAlive(since) => {
            assert!(matches!(rules.plan, Plan::Hold(_)), "kept alive on {last:?}");
            assert!(now.get() >= deadline, "kept alive at {:?}", now.get());
            assert!(since <= now.get(), "no new connection for {since:?} at {:?}", now.get());
        }
        _ => {}
    }
    if end.quit == Some(App::Gone) {
        assert!(matches!(rules.plan, Plan::Run { then_quit: true, .. }));
        assert_eq!(seen.app, App::Gone, "proxy stopped on {last:?}");
        let delivering = last.busy.is_some_and(|b| b.delivering > 0);
        assert_eq!(end.delivering, delivering, "proxy stopped on {last:?}");
    }
});
