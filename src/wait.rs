//! The wait: turns counts and time into an outcome. Time is injected, so the rules (min-drain,
//! settle, arrivals, the app's exit, threshold, deadline, unknown counts) are tested with a fake
//! clock and scripted looks.

use crate::config::Rules;
use crate::outcome::Outcome;
use std::time::Duration;

/// Time since the run started, and a way to let it pass.
pub trait Clock {
    fn now(&self) -> Duration;
    fn sleep(&mut self, d: Duration);
}

/// Time enough for a count before the deadline: the bound on one admin request.
pub const LAST_COUNT: Duration = crate::source::admin::REQUEST_TIMEOUT;

/// How soon the pod is looked at again when the app's sockets have just gone: an app between
/// closing its listener and a last call out holds none for a moment.
pub const RECHECK: Duration = Duration::from_millis(100);

/// Two counts start at least this many times the last one's time apart, so that counting takes
/// at most 1/PACE (5%) of the time of what it runs on: Envoy's main thread, which answers the
/// admin API and also applies its configuration, and the proxy container's CPU, which the hook
/// shares with Envoy (a preStop runs in its container).
pub const PACE: u32 = 20;

/// The time from the start of one count to the next: the interval, or more when a count took
/// long (a sidecar or gateway with thousands of clusters, whose /clusters answer runs to hundreds
/// of megabytes; a gateway with 100,000 connections in its socket table).
pub fn pause(interval: Duration, cost: Duration) -> Duration {
    interval.max(cost.saturating_mul(PACE))
}

/// What one look gave the wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tick {
    /// The count; `None` when nothing could be counted.
    pub count: Option<u64>,
    /// A request arrived since the last look: the pod is still in some client's endpoints, even
    /// when the count is at zero between two requests.
    pub arrived: bool,
    pub app: App,
    /// How long the look took, which paces the next count.
    pub cost: Duration,
}

/// What the socket table says of the app: its sockets are those of other users than the proxy's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum App {
    /// The table could not be read.
    #[default]
    Unknown,
    /// No socket of the app seen yet: an app that holds none cannot be told from one that has
    /// exited.
    NotSeen,
    Running,
    /// Its sockets have gone, at one look: the next one, shortly after, tells.
    Leaving,
    /// Its sockets have gone, at two looks in a row: it has exited, and nothing is left that
    /// could answer a request.
    Gone,
}

/// Counts at once, then every interval, until the count has stayed at or below the threshold,
/// at counts that saw no new request arrive, for the settle time after the min-drain; or until the app has
/// exited (whatever is still open, nothing can answer it); or the deadline passes. `look` is
/// given the time left (to bound its own I/O); a count of `None` (nothing could be counted) never
/// ends the wait early and breaks the settle time, as an arrival does. The min-drain ends `LAST_COUNT` (or one interval, if
/// shorter) before the deadline at the latest, so that a count can still see a quiet pod and end
/// the wait in time: a min-drain as long as the deadline (a short --deadline, or
/// MINIMUM_DRAIN_DURATION set for Istio) would otherwise end after it and turn every quiet
/// shutdown into a deadline. A count that may end the wait starts one look's time before the
/// min-drain (or the settle time) ends, so that its answer, seconds long on the largest proxies,
/// is in by then.
pub fn wait(
    rules: &Rules,
    drained_at: Duration,
    clock: &mut impl Clock,
    mut look: impl FnMut(Duration) -> Tick,
) -> Outcome {
    let drain_done = drained_at.saturating_add(rules.min_drain).min(
        rules
            .deadline
            .saturating_sub(rules.interval.min(LAST_COUNT)),
    );
    let mut low_since: Option<Duration> = None;
    let mut counted = false;
    // The last look's time: a count meant to end at a given moment starts this long before it.
    let mut lead = Duration::ZERO;
    loop {
        let started = clock.now();
        if started >= rules.deadline {
            break;
        }
        let tick = look(rules.deadline - started);
        let now = clock.now();
        counted |= tick.count.is_some();
        if tick.app == App::Gone {
            return Outcome::AppExited;
        }
        match tick.count {
            Some(n) if n <= rules.exit_at && !tick.arrived => {
                low_since.get_or_insert(now);
            }
            _ => low_since = None,
        }
        let pause = pause(rules.interval, tick.cost);
        let mut next = started.saturating_add(pause);
        if tick.app == App::Leaving {
            next = next.min(now.saturating_add(RECHECK));
        }
        let ahead = std::mem::replace(&mut lead, tick.cost).max(tick.cost);
        if let Some(since) = low_since {
            // Saturating: durations up to u64::MAX seconds parse, and must not overflow here.
            let done_at = drain_done.max(since.saturating_add(rules.settle));
            if now >= done_at {
                return Outcome::Reached;
            }
            // A count started so that it ends when the min-drain or the settle time does
            // decides then: counting again would start another answer that takes as long (at
            // 50,000 clusters, seconds of Envoy's main thread). The settle time needs a count
            // after the one that began it.
            let decides = started.saturating_add(ahead) >= done_at
                && (rules.settle.is_zero() || since <= started);
            if decides && done_at <= rules.deadline {
                clock.sleep(done_at - now);
                return Outcome::Reached;
            }
            // Wake so that the next count ends when the min-drain or the settle time ends, not
            // at the next tick.
            next = next.min(done_at.saturating_sub(tick.cost));
        }
        // A paced wait with no count due before the deadline counts once more where a count
        // can still end before it.
        let last_chance = rules
            .deadline
            .saturating_sub((now - started).saturating_mul(2));
        if pause > rules.interval && next >= rules.deadline && last_chance > now {
            next = last_chance;
        }
        if now >= rules.deadline {
            break;
        }
        clock.sleep(next.clamp(now, rules.deadline) - now);
    }
    if counted {
        Outcome::Deadline
    } else {
        Outcome::NothingCounted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::cell::Cell;

    /// Fake time, shared with the scripted counter so that a count can take time too.
    struct FakeClock<'a>(&'a Cell<Duration>);

    impl Clock for FakeClock<'_> {
        fn now(&self) -> Duration {
            self.0.get()
        }
        fn sleep(&mut self, d: Duration) {
            self.0.set(self.0.get() + d);
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn rules() -> Rules {
        Rules {
            min_drain: ms(5000),
            deadline: ms(25000),
            interval: ms(500),
            settle: ms(0),
            exit_at: 0,
        }
    }

    fn counted(n: u64) -> Tick {
        Tick {
            count: Some(n),
            ..Tick::default()
        }
    }

    /// Runs the loop with counts given as (from time in ms, count) steps; each count takes
    /// `cost` of fake time. Returns the outcome, when it ended and the times counted at.
    fn run(
        rules: &Rules,
        script: &[(u64, Option<u64>)],
        cost: Duration,
    ) -> (Outcome, Duration, Vec<Duration>) {
        let ticks: Vec<(u64, Tick)> = script
            .iter()
            .map(|&(from, count)| {
                let tick = Tick {
                    count,
                    ..Tick::default()
                };
                (from, tick)
            })
            .collect();
        run_ticks(rules, &ticks, cost)
    }

    /// `run` with whole looks: each (from time in ms, look) step holds from then on, except
    /// that an arrival is seen only at the first look of its step.
    fn run_ticks(
        rules: &Rules,
        script: &[(u64, Tick)],
        cost: Duration,
    ) -> (Outcome, Duration, Vec<Duration>) {
        let now = Cell::new(ms(0));
        let mut last_step = None;
        let mut at = Vec::new();
        let outcome = wait(rules, ms(0), &mut FakeClock(&now), |left| {
            let t = now.get();
            at.push(t);
            assert!(
                t + left <= rules.deadline,
                "time left is bounded by the deadline"
            );
            now.set(t + cost.min(left));
            let Some(step) = script.iter().rposition(|(from, _)| ms(*from) <= t) else {
                return Tick::default();
            };
            let mut tick = script[step].1;
            tick.arrived &= last_step != Some(step);
            last_step = Some(step);
            tick
        });
        (outcome, now.get(), at)
    }

    #[test]
    fn zero_from_the_start_exits_when_the_min_drain_ends_not_before() {
        let (o, end, at) = run(&rules(), &[(0, Some(0))], ms(0));
        assert_eq!(o, Outcome::Reached);
        assert_eq!(end, ms(5000));
        assert_eq!(at.first(), Some(&ms(0)), "counts at once");
        assert_eq!(at.len(), 11, "every 500ms up to 5s: {at:?}");
    }

    #[test]
    fn waits_for_the_count_to_reach_zero_after_the_min_drain() {
        let (o, end, _) = run(&rules(), &[(0, Some(3)), (7200, Some(0))], ms(0));
        assert_eq!(o, Outcome::Reached);
        assert_eq!(end, ms(7500), "first count at or after 7.2s is at 7.5s");
    }

    #[test]
    fn threshold_above_zero() {
        let r = Rules {
            exit_at: 2,
            min_drain: ms(0),
            ..rules()
        };
        let (o, end, _) = run(&r, &[(0, Some(5)), (1000, Some(2))], ms(0));
        assert_eq!((o, end), (Outcome::Reached, ms(1000)));
    }

    #[test]
    fn settle_needs_the_count_to_stay_low_that_long() {
        let r = Rules {
            settle: ms(2000),
            min_drain: ms(0),
            ..rules()
        };
        // low at 1s, back up at 2s, low again from 3s: settles at 5s.
        let script = [
            (0, Some(2)),
            (1000, Some(0)),
            (2000, Some(1)),
            (3000, Some(0)),
        ];
        let (o, end, _) = run(&r, &script, ms(0));
        assert_eq!((o, end), (Outcome::Reached, ms(5000)));
    }

    #[test]
    fn the_pause_between_counts_is_twenty_times_envoys_answer_never_less_than_the_interval() {
        assert_eq!(pause(ms(500), ms(5)), ms(500), "a small pod: the interval");
        assert_eq!(pause(ms(500), ms(25)), ms(500));
        assert_eq!(pause(ms(500), ms(240)), ms(4800), "10,000 clusters");
        assert_eq!(pause(ms(500), ms(1500)), ms(30000), "50,000 clusters");
        let most = Duration::from_secs(u64::MAX);
        assert_eq!(pause(ms(500), most), Duration::MAX, "saturates");
    }

    #[test]
    fn slow_answers_space_the_counts_and_one_last_count_comes_before_the_deadline() {
        let r = Rules {
            min_drain: ms(0),
            ..rules()
        };
        let slow = |count| Tick {
            count: Some(count),
            cost: ms(250),
            ..Tick::default()
        };
        // Each look takes 250 ms: a count every 5 s, and one at 24.5 s, where a count that takes
        // as long still ends before the 25 s deadline.
        let (o, end, at) = run_ticks(&r, &[(0, slow(1))], ms(250));
        assert_eq!((o, end), (Outcome::Deadline, ms(25000)));
        assert_eq!(at, [0, 5000, 10000, 15000, 20000, 24500].map(ms), "{at:?}");
        // A quick look keeps the interval.
        let quick = Tick {
            count: Some(1),
            cost: ms(20),
            ..Tick::default()
        };
        let (_, _, at) = run_ticks(&r, &[(0, quick)], ms(20));
        assert_eq!(at.len(), 50, "every 500 ms: {at:?}");
        // The count reaching zero is seen at the next paced count.
        let (o, end, _) = run_ticks(&r, &[(0, slow(1)), (12000, slow(0))], ms(250));
        assert_eq!((o, end), (Outcome::Reached, ms(15250)));
        // The bench's wait (min-drain 9 s, deadline 10 s), quiet: paced counts, one when the
        // min-drain ends, and no last count before the deadline beside it.
        let bench = Rules {
            min_drain: ms(9000),
            deadline: ms(10000),
            ..rules()
        };
        let (o, end, at) = run_ticks(&bench, &[(0, slow(0))], ms(250));
        assert_eq!((o, end), (Outcome::Reached, ms(9000)));
        assert_eq!(at, [0, 5000, 8750].map(ms), "the last one ends at 9 s");
    }

    #[test]
    fn an_unknown_count_breaks_the_settle_time_and_never_counts_as_zero() {
        let r = Rules {
            settle: ms(1000),
            min_drain: ms(0),
            ..rules()
        };
        let script = [(0, Some(0)), (500, None), (1000, Some(0))];
        let (o, end, _) = run(&r, &script, ms(0));
        assert_eq!((o, end), (Outcome::Reached, ms(2000)));
        let all_unknown = run(&rules(), &[(0, None)], ms(0));
        assert_eq!(all_unknown.0, Outcome::NothingCounted);
        assert_eq!(all_unknown.1, ms(25000));
    }

    #[test]
    fn deadline_with_connections_open_is_a_deadline_and_is_not_overrun() {
        let (o, end, at) = run(&rules(), &[(0, Some(1))], ms(0));
        assert_eq!((o, end), (Outcome::Deadline, ms(25000)));
        assert_eq!(
            *at.last().unwrap(),
            ms(24500),
            "no count is started at the deadline"
        );
    }

    #[test]
    fn counted_once_then_unknown_is_a_deadline_not_nothing_counted() {
        let (o, _, _) = run(&rules(), &[(0, Some(4)), (1000, None)], ms(0));
        assert_eq!(o, Outcome::Deadline);
    }

    #[test]
    fn a_count_of_seconds_starts_early_enough_to_end_the_min_drain_and_is_not_repeated() {
        // 50,000 clusters: the first count takes 4 s, the next 3.5 s. A quiet pod: the second
        // count starts at 5 s so that it ends by the min-drain's end at 9 s, and decides then.
        let bench = Rules {
            min_drain: ms(9000),
            deadline: ms(10000),
            ..rules()
        };
        // Each look's count and cost: the first, then every later one.
        let looks = |r: &Rules, counts: [u64; 2], costs: [u64; 2]| {
            let now = Cell::new(ms(0));
            let mut at = Vec::new();
            let outcome = wait(r, ms(0), &mut FakeClock(&now), |left| {
                let i = at.len().min(1);
                let cost = ms(costs[i]).min(left);
                at.push(now.get());
                now.set(now.get() + cost);
                Tick {
                    count: Some(counts[i]),
                    cost,
                    ..Tick::default()
                }
            });
            (outcome, now.get(), at)
        };
        let (o, end, at) = looks(&bench, [0, 0], [4000, 3500]);
        assert_eq!((o, end), (Outcome::Reached, ms(9000)));
        assert_eq!(at, [0, 5000].map(ms));
        // A count that takes longer than expected ends the wait when it ends.
        let (o, end, at) = looks(&bench, [0, 0], [4000, 4300]);
        assert_eq!((o, end, at.len()), (Outcome::Reached, ms(9300), 2));
        // A settle time needs a count after the one that began it, even when the count before
        // took long: 1 request, then none from the last count before the 30 s deadline on.
        let settle = Rules {
            min_drain: ms(0),
            deadline: ms(30000),
            settle: ms(500),
            ..rules()
        };
        let (o, end, at) = looks(&settle, [1, 0], [4000, 1000]);
        assert_eq!((o, end), (Outcome::Reached, ms(24000)));
        assert_eq!(at, [0, 22000, 23000].map(ms));
    }

    #[test]
    fn slow_counts_run_back_to_back_and_still_stop_at_the_deadline() {
        let (o, end, at) = run(&rules(), &[(0, Some(1))], ms(700));
        assert_eq!(o, Outcome::Deadline);
        assert_eq!(
            end,
            ms(25000),
            "the last count is cut short by the deadline"
        );
        assert_eq!(
            at[1],
            ms(700),
            "the next count starts right after a slow one"
        );
    }

    #[test]
    fn a_count_that_takes_the_rest_of_the_time_ends_at_the_deadline() {
        let r = Rules {
            deadline: ms(3000),
            min_drain: ms(0),
            ..rules()
        };
        let (o, end, at) = run(&r, &[(0, Some(1))], ms(3000));
        assert_eq!((o, end, at.len()), (Outcome::Deadline, ms(3000), 1));
    }

    #[test]
    fn settle_longer_than_what_is_left_ends_at_the_deadline() {
        let r = Rules {
            settle: ms(10000),
            min_drain: ms(0),
            deadline: ms(3000),
            ..rules()
        };
        let (o, end, _) = run(&r, &[(0, Some(0))], ms(0));
        assert_eq!((o, end), (Outcome::Deadline, ms(3000)));
    }

    #[test]
    fn the_largest_durations_that_parse_never_overflow() {
        let huge = Duration::from_secs(u64::MAX);
        // A settle time added to a count taken after the first second.
        let settle = Rules {
            settle: huge,
            exit_at: 5,
            ..rules()
        };
        let (o, end, _) = run(&settle, &[(0, Some(1))], ms(1500));
        assert_eq!((o, end), (Outcome::Deadline, ms(25000)));
        // An interval added to a count taken at 2 s, when the min-drain ended.
        let interval = Rules {
            interval: huge,
            min_drain: ms(2000),
            ..rules()
        };
        let (o, end, at) = run(&interval, &[(0, Some(0)), (1000, Some(3))], ms(0));
        assert_eq!(
            (o, end, at),
            (Outcome::Deadline, ms(25000), vec![ms(0), ms(2000)])
        );
    }

    #[test]
    fn a_min_drain_as_long_as_the_deadline_still_lets_a_quiet_pod_end_before_it() {
        for drained_at in [ms(0), ms(40)] {
            let now = Cell::new(drained_at);
            let r = Rules {
                min_drain: ms(3000),
                deadline: ms(3000),
                ..rules()
            };
            let o = wait(&r, drained_at, &mut FakeClock(&now), |_| counted(0));
            assert_eq!(o, Outcome::Reached, "drained at {drained_at:?}");
            assert!(
                now.get() >= ms(2500) && now.get() < ms(3000),
                "ends in the last interval before the deadline: {:?}",
                now.get()
            );
        }
        let now = Cell::new(ms(0));
        let r = Rules {
            min_drain: ms(3000),
            deadline: ms(3000),
            ..rules()
        };
        let o = wait(&r, ms(0), &mut FakeClock(&now), |_| counted(1));
        assert_eq!(
            o,
            Outcome::Deadline,
            "an open connection still waits it out"
        );
    }

    #[test]
    fn min_drain_counts_from_the_drain_not_from_the_start() {
        let now = Cell::new(ms(800));
        let r = Rules {
            min_drain: ms(1000),
            ..rules()
        };
        let o = wait(&r, ms(800), &mut FakeClock(&now), |_| counted(0));
        assert_eq!((o, now.get()), (Outcome::Reached, ms(1800)));
    }

    #[test]
    fn arrivals_hold_a_zero_count_until_a_count_sees_none() {
        let r = rules();
        let arriving = Tick {
            arrived: true,
            ..counted(0)
        };
        // Zero at every look, but a new request at every one up to 9 s: the endpoint has not yet
        // left the clients' lists.
        let script: Vec<(u64, Tick)> = (0..19).map(|i| (i * 500, arriving)).collect();
        let (o, end, _) = run_ticks(&r, &script, ms(0));
        assert_eq!((o, end), (Outcome::Reached, ms(9500)));
        // Without arrivals the same zeros end at the min-drain.
        let (o, end, _) = run_ticks(&r, &[(0, counted(0))], ms(0));
        assert_eq!((o, end), (Outcome::Reached, ms(5000)));
    }

    #[test]
    fn the_app_gone_ends_the_wait_at_once_whatever_is_open_and_is_checked_twice() {
        let leaving = Tick {
            app: App::Leaving,
            ..counted(3)
        };
        let gone = Tick {
            app: App::Gone,
            ..counted(3)
        };
        let script = [(0, counted(3)), (2000, leaving), (2100, gone)];
        let (o, end, at) = run_ticks(&rules(), &script, ms(0));
        assert_eq!((o, end), (Outcome::AppExited, ms(2100)));
        assert_eq!(
            &at[at.len() - 2..],
            &[ms(2000), ms(2100)],
            "looks again 100ms after the sockets went"
        );
        // Before the min-drain too: nothing is left to serve.
        let (o, end, _) = run_ticks(&rules(), &[(0, counted(0)), (1000, gone)], ms(0));
        assert_eq!((o, end), (Outcome::AppExited, ms(1000)));
        // An app never seen, or a table that cannot be read, never ends the wait.
        for app in [App::NotSeen, App::Unknown, App::Running, App::Leaving] {
            let tick = Tick { app, ..counted(1) };
            let (o, _, _) = run_ticks(&rules(), &[(0, tick)], ms(0));
            assert_eq!(o, Outcome::Deadline, "{app:?}");
        }
    }
}
