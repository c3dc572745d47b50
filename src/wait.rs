//! The wait: turns looks and time into an outcome, as plain data with no I/O (`Wait`): asked what
//! to do next at a time, it says sleep, look, or end, and takes what each look saw. The app's
//! exit is here; what ends the wait once the min-drain is over it asks of its end rule
//! (`EndRule`): `run`'s count (run/rule.rs), or `hold`'s quiet time (hold/quiet.rs). hook.rs
//! drives it with real time and looks, the tests with fake ones.

use crate::config::{Plan, Rules};
use crate::count::{Before, Busy, COST_SPACING, Cost, REQUEST_TIMEOUT};
use crate::hold::quiet::Quiet;
use crate::outcome::{Outcome, Pace};
use crate::run::rule::AtMost;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    Count,
    /// The app's sockets alone, between two counts: they have gone, and whether for good is
    /// told by looks close together (`APP_GONE`).
    App,
    /// The app's sockets alone: the count is reached, and `--then-quit` waits for the app's exit.
    Exit,
}

/// Time enough for a count before the deadline: the bound on one admin request.
pub const LAST_COUNT: Duration = REQUEST_TIMEOUT;

/// How long the app's sockets must stay gone, at looks at most `RECHECK` apart, before the app
/// counts as exited: an app that closed its listener, or a worker between two calls out, holds
/// none for a moment; a call that lasts longer than `RECHECK` is seen.
pub(crate) const APP_GONE: Duration = Duration::from_millis(800);

/// The time between two looks at the app's sockets (the socket table alone) while they are gone.
pub(crate) const RECHECK: Duration = Duration::from_millis(100);

/// The time from one count's start to the next: the interval, or more when a count cost more.
fn pause(interval: Duration, cost: Duration) -> Duration {
    interval.max(cost.saturating_mul(COST_SPACING))
}

/// What one look saw: the count (`None`: unknown, or not asked for), the request counter, and
/// whether the app holds a socket in the pod (`None`: unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sight {
    pub count: Option<u64>,
    pub arrivals: Option<u64>,
    /// Arrivals recounted so far: more than the counter said of a time it saw some (`hold` behind a
    /// sidecar: /clusters' requests on a connection the table showed once).
    pub recounted: u64,
    /// Of the arrivals, new connections so far (`None`: the source cannot tell).
    pub opened: Option<u64>,
    /// What the source remembers of arrivals before its first read.
    pub before: Option<Before>,
    /// How long ago the newest arrival came, where the source can tell.
    pub newest: Option<Duration>,
    pub app: Option<bool>,
    /// The connections the pod accepted that a request still keeps busy (`None`: unknown).
    pub busy: Option<Busy>,
    pub cost: Cost,
}

/// What the wait made of a look: the app's state, how many requests arrived since the last look
/// that could tell, and for `hold` the arrivals' pace (`Pace`) once any arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Seen {
    pub app: App,
    /// As the look's sight said.
    pub(crate) busy: Option<Busy>,
    pub arrived: u64,
    /// More that arrived earlier than this look, which a later read recounted.
    pub(crate) recounted: u64,
    pub(crate) pace: Option<Pace>,
    /// The count within `run`'s threshold, whatever keeps it busy (`hold`: always).
    pub(crate) low: bool,
    /// The time from this count's start to the next (`pause`), and when the min-drain ends.
    pub(crate) every: Duration,
    pub(crate) drain_done: Duration,
}

/// What the looks so far say of the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum App {
    /// The table could not be read.
    #[default]
    Unknown,
    /// No socket of the app seen yet: it cannot be told from one that has exited.
    NotSeen,
    Running,
    /// Its sockets have gone, for less than `APP_GONE` (or at looks too far apart to tell).
    Leaving,
    /// Its sockets have been gone for `APP_GONE`, at looks `RECHECK` apart: it has exited.
    Gone,
}

/// How a wait ended, and with `--then-quit` what it last saw of the app (`None`: not asked for,
/// or the wait did not reach the threshold): `Gone`, the proxy may stop unless `delivering`;
/// `NotSeen`, its exit cannot be told; else it was still there, or could not be seen, at the
/// deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    pub outcome: Outcome,
    pub quit: Option<App>,
    /// The app gone at the deadline, and an answer still on its way to a client: the proxy is
    /// left to its own shutdown, which gives it more time than a stop now.
    pub delivering: bool,
}

/// Follows the app (its sockets; when the last look ended) and the counter.
#[derive(Debug, Default)]
struct Follow {
    sockets: Sockets,
    last_look: Duration,
    requests: Option<u64>,
    recounted: u64,
}

impl Follow {
    /// What a look from `started` to `ended` says of the app: gone only when every look since
    /// they went missed them, each starting within two `RECHECK`s of the last one's end.
    fn app(&mut self, holds_sockets: Option<bool>, started: Duration, ended: Duration) -> App {
        let close = started.saturating_sub(self.last_look) <= RECHECK.saturating_mul(2);
        self.last_look = ended;
        let since = match (holds_sockets, self.sockets) {
            (None, Sockets::NeverSeen) => return App::Unknown,
            (None, _) => {
                self.sockets = Sockets::Held;
                return App::Unknown;
            }
            (Some(true), _) => {
                self.sockets = Sockets::Held;
                return App::Running;
            }
            (Some(false), Sockets::NeverSeen) => return App::NotSeen,
            (Some(false), Sockets::GoneSince(since)) if close => since,
            (Some(false), _) => started,
        };
        self.sockets = Sockets::GoneSince(since);
        if ended.saturating_sub(since) >= APP_GONE { App::Gone } else { App::Leaving }
    }

    /// How many requests arrived since the last look that could tell: what the counter moved
    /// by (one that went back belongs to a restarted Envoy: at least one).
    fn arrived(&mut self, now: Option<u64>) -> u64 {
        let Some(now) = now else { return 0 };
        let before = self.requests.replace(now);
        before.map_or(0, |b| now.checked_sub(b).unwrap_or(1))
    }

    fn see(&mut self, sight: &Sight, started: Duration, ended: Duration) -> Seen {
        let (app, arrived) = (self.app(sight.app, started, ended), self.arrived(sight.arrivals));
        // Only a look that could tell recounts.
        let recounted = sight.arrivals.map_or(0, |_| {
            sight.recounted.saturating_sub(std::mem::replace(&mut self.recounted, sight.recounted))
        });
        Seen { app, arrived, recounted, ..Seen::default() }
    }
}

/// What the looks have seen of the app's sockets: none yet, held, or gone since a time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Sockets {
    #[default]
    NeverSeen,
    Held,
    GoneSince(Duration),
}

/// When the min-drain ends: `min_drain` after the drain, `LAST_COUNT` before the deadline at most.
pub(crate) fn drain_done(rules: &Rules, drained_at: Duration) -> Duration {
    drained_at
        .saturating_add(rules.min_drain)
        .min(rules.deadline.saturating_sub(rules.interval.min(LAST_COUNT)))
}

/// What the wait does next (`Wait::next`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Sleep(Duration),
    /// A look now, whose sight goes to `Wait::saw`.
    Look(Ask),
    End(End),
}

/// Counts at once, then every interval, until the count has stayed at or below the threshold
/// at counts that saw no request arrive (`hold`: until no request has arrived, at counts that
/// could tell) for the settle time after the min-drain; or until the app has exited (nothing can
/// answer what is open), never before the min-drain; or the deadline. Each look is given the
/// time left; an unknown count never ends the wait and breaks the settle time. The min-drain ends
/// `LAST_COUNT` (or an interval) before the deadline at the latest, so a quiet pod still ends in
/// time; a count that may end the wait starts one look's time early, so its answer is in when
/// the min-drain ends. With `then_quit`, the wait then looks at the app until it has exited.
pub struct Wait<'r> {
    rules: &'r Rules,
    /// `run`'s `--then-quit`.
    then_quit: bool,
    follow: Follow,
    counts: Ending,
    /// No look before then.
    due: Duration,
    phase: Phase,
}

/// Where a wait is: counting; the count reached, and (`then_quit`) looking at the app until it
/// has exited; or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Counting,
    AwaitingExit,
    Ended(End),
}

impl<'r> Wait<'r> {
    /// The wait of `rules`, the min-drain counted from `drained_at`.
    pub fn new(rules: &'r Rules, drained_at: Duration) -> Wait<'r> {
        let (rule, then_quit) = match &rules.plan {
            Plan::Run { exit_at, then_quit, .. } => {
                (EndRule::AtMost(AtMost::new(*exit_at)), *then_quit)
            }
            Plan::Hold(h) => (EndRule::Quiet(Box::new(Quiet::new(h.propagation))), false),
        };
        let drain_done = drain_done(rules, drained_at);
        let (low_since, ends_at, next) = (None, None, Duration::ZERO);
        let (counted, arrived) = (false, false);
        let counts = Ending { drain_done, rule, low_since, ends_at, counted, arrived, next };
        let follow = Follow::default();
        Wait { rules, then_quit, follow, counts, due: Duration::ZERO, phase: Phase::Counting }
    }

    pub fn next(&mut self, now: Duration) -> Step {
        if now < self.due {
            return Step::Sleep(self.due);
        }
        match self.phase {
            Phase::Ended(end) => return Step::End(end),
            Phase::AwaitingExit => return Step::Look(Ask::Exit),
            Phase::Counting => {}
        }
        if now >= self.rules.deadline {
            // The last count's end at the deadline: none since could end the wait sooner.
            let reached = self.counts.ends_at.is_some_and(|t| t <= self.rules.deadline);
            let outcome = match self.counts.kept_alive(self.rules, now) {
                _ if !self.counts.counted => Outcome::NothingCounted,
                _ if reached => Outcome::Reached,
                Some(since) => Outcome::KeptAlive(since),
                None => Outcome::Deadline,
            };
            let end = End { outcome, quit: None, delivering: false };
            self.phase = Phase::Ended(end);
            return Step::End(end);
        }
        Step::Look(if now >= self.counts.next { Ask::Count } else { Ask::App })
    }

    /// What a look asked for `ask` from `started` to `now` saw, and what the wait made of it.
    pub fn saw(&mut self, ask: Ask, (started, now): (Duration, Duration), sight: &Sight) -> Seen {
        let rules = self.rules;
        if self.phase == Phase::AwaitingExit {
            return self.saw_exit((started, now), sight);
        }
        let counts = &mut self.counts;
        let mut seen = self.follow.see(sight, started, now);
        seen.every = pause(rules.interval, sight.cost.paced());
        seen.drain_done = counts.drain_done;
        if ask == Ask::Count {
            seen.pace = counts.rule.counted((rules, counts.drain_done), now, sight, &seen);
            seen.low = counts.rule.within(sight);
        }
        // The app's exit leaves nothing to answer, but what it answered is still delivered.
        let delivered = sight.busy.is_none_or(|b| b.delivering == 0);
        seen.busy = sight.busy;
        if seen.app == App::Gone && now >= counts.drain_done && delivered {
            let quit = self.then_quit.then_some(App::Gone);
            self.phase = Phase::Ended(End { outcome: Outcome::AppExited, quit, delivering: false });
            return seen;
        }
        if ask == Ask::Count
            && let Some((end, outcome)) = counts.add(rules, sight, seen.arrived > 0, (started, now))
        {
            self.due = end;
            self.phase = match self.then_quit {
                true => Phase::AwaitingExit,
                false => Phase::Ended(End { outcome, quit: None, delivering: false }),
            };
            return seen;
        }
        // Sockets gone, and the next count too late to tell by the min-drain's end: look closer.
        let mut next = counts.next;
        if matches!(self.follow.sockets, Sockets::GoneSince(_))
            && counts.next.saturating_add(APP_GONE) > counts.drain_done
        {
            next = next.min(now.saturating_add(RECHECK));
        }
        // A look can end past the deadline (a slow admin answer, a descheduled hook): then now.
        self.due = next.min(rules.deadline).max(now);
        seen
    }

    /// `--then-quit` once the count is reached: the app may still call out through the proxy,
    /// so it is stopped only once the app has exited. Looks every interval (every `RECHECK`
    /// while its sockets are gone) until the deadline; an app never seen is not waited for.
    fn saw_exit(&mut self, (started, now): (Duration, Duration), sight: &Sight) -> Seen {
        let app = self.follow.app(sight.app, started, now);
        let delivered = sight.busy.is_none_or(|b| b.delivering == 0);
        let pause = match app {
            App::Gone if !delivered => RECHECK,
            App::Gone | App::NotSeen => Duration::MAX,
            App::Leaving => RECHECK,
            App::Running | App::Unknown => self.rules.interval,
        };
        if self.rules.deadline.saturating_sub(now) <= pause {
            let delivering = app == App::Gone && !delivered;
            self.phase =
                Phase::Ended(End { outcome: Outcome::Reached, quit: Some(app), delivering });
        } else {
            self.due = now.saturating_add(pause);
        }
        Seen { app, busy: sight.busy, ..Seen::default() }
    }
}

/// What ends the wait once the min-drain is over, chosen once from the plan: `run`'s count
/// (run/rule.rs), or `hold`'s quiet time (hold/quiet.rs), the counter known.
enum EndRule {
    AtMost(AtMost),
    Quiet(Box<Quiet>),
}

impl EndRule {
    /// A count's sight, for `hold` told to its quiet rule: the arrivals' pace once any arrived.
    fn counted(
        &mut self,
        limits: (&Rules, Duration),
        now: Duration,
        sight: &Sight,
        seen: &Seen,
    ) -> Option<Pace> {
        let EndRule::Quiet(quiet) = self else { return None };
        sight.arrivals?;
        let told = (sight.before, sight.newest, sight.opened);
        quiet.count(limits, now, (seen.arrived, seen.recounted), told)
    }

    /// Whether a count could be read, and whether it allows the end (`idle`: no request busy).
    fn known_and_low(&self, sight: &Sight, idle: bool) -> (bool, bool) {
        match self {
            EndRule::AtMost(_) => (sight.count.is_some(), self.within(sight) && idle),
            EndRule::Quiet(_) => (sight.arrivals.is_some(), sight.arrivals.is_some()),
        }
    }

    /// Whether a count is within `run`'s threshold, whatever keeps it busy (`hold`: always).
    fn within(&self, sight: &Sight) -> bool {
        match self {
            EndRule::AtMost(rule) => rule.within(sight.count),
            EndRule::Quiet(_) => true,
        }
    }

    /// A count that ended at `now` saw requests arrive.
    fn arrived(&mut self, now: Duration) {
        if let EndRule::AtMost(rule) = self {
            rule.arrived(now);
        }
    }

    /// The end of the quiet time after the last arrival (zero: none arrived).
    fn quiet_until(&self) -> Duration {
        let until = match self {
            EndRule::AtMost(rule) => rule.until(),
            EndRule::Quiet(quiet) => quiet.until(),
        };
        until.unwrap_or(Duration::ZERO)
    }

    /// Whether a count that saw arrivals (`arrived`) or none may end the wait: one that saw
    /// arrivals never ends a hold (one after it tells the silence).
    fn may_end(&self, arrived: bool) -> bool {
        matches!(self, EndRule::AtMost(_)) || !arrived
    }

    /// Whether a count from `started` that ends just short of the end may decide it then: for
    /// `run` when no arrival came during it; `hold`'s silence needs a count that lasts until it
    /// ends.
    fn decides_early(&self, started: Duration) -> bool {
        match self {
            EndRule::AtMost(rule) => rule.decides_early(started),
            EndRule::Quiet(_) => false,
        }
    }

    /// For `hold` (`Quiet::kept_alive`): whether only kept-alive clients still send.
    fn kept_alive(&self, floor: Duration, from: Duration, now: Duration) -> Option<Duration> {
        match self {
            EndRule::AtMost(_) => None,
            EndRule::Quiet(quiet) => quiet.kept_alive(floor, from, now),
        }
    }
}

/// When the counts end the wait: what they saw so far, and when the next one is due.
struct Ending {
    drain_done: Duration,
    rule: EndRule,
    /// Since when the wait's end has held (the count low; for `hold`, the counter known).
    low_since: Option<Duration>,
    /// When the last count ends the wait if no count says otherwise before: the min-drain, the
    /// settle time and the quiet time over (none while it is not low, or for `hold` saw arrivals).
    ends_at: Option<Duration>,
    /// Whether any count could be read, and whether any saw a request arrive.
    counted: bool,
    arrived: bool,
    next: Duration,
}

impl Ending {
    /// A count from `started` to `now`: when the wait ends and why, if it does (`now`, or the
    /// moment a count that started early enough decides), and when the next count is due.
    fn add(
        &mut self,
        rules: &Rules,
        sight: &Sight,
        arrived: bool,
        (started, now): (Duration, Duration),
    ) -> Option<(Duration, Outcome)> {
        // A request not answered, or an answer not delivered, on a connection the pod accepted
        // holds the wait whatever the count says (a request to a host EDS removed is on none of
        // /clusters' hosts; one Envoy has read whole may still be on its way to its client).
        let idle = sight.busy.is_none_or(|b| b.delivering == 0 && b.awaiting == 0);
        let (known, low) = self.rule.known_and_low(sight, idle);
        self.counted |= known;
        self.arrived |= arrived;
        if arrived {
            self.rule.arrived(now);
        }
        self.low_since = if low { self.low_since.or(Some(now)) } else { None };
        let quiet_until = self.rule.quiet_until();
        self.ends_at = self
            .low_since
            .filter(|_| self.rule.may_end(arrived))
            .map(|since| self.drain_done.max(since.saturating_add(rules.settle)).max(quiet_until));
        let cost = sight.cost.look;
        let pause = pause(rules.interval, sight.cost.paced());
        self.next = started.saturating_add(pause);
        if let Some(done_at) = self.ends_at {
            if now >= done_at {
                return Some((now, Outcome::Reached));
            }
            // A count that ends within a quarter of its own time before the min-drain or the
            // settle time does decides then, rather than start another answer as long (its own
            // time, not an earlier count's: a quick count after a slow one is no look at what
            // comes next); the settle time needs a later count.
            let decides = self.rule.decides_early(started)
                && now.saturating_add(cost / 4) >= done_at
                && (rules.settle.is_zero() || self.low_since.is_some_and(|s| s <= started));
            if decides && done_at <= rules.deadline {
                return Some((done_at, Outcome::Reached));
            }
            // The next count ends when the min-drain or the settle time ends; not while requests
            // arrive, or slow counts would come at every quiet time instead of at the pace.
            if !arrived {
                self.next = self.next.min(done_at.saturating_sub(cost));
            }
        }
        // Past the propagation the mesh opens no connection here any more: requests only on
        // connections already open come from kept-alive clients, which waiting to the deadline
        // hands over no better than the app's shutdown does now (docs/holding.md).
        if let Some(since) = self.kept_alive(rules, now) {
            return Some((now, Outcome::KeptAlive(since)));
        }
        self.last_before_deadline(rules, (started, now), cost, pause);
        None
    }

    /// For `hold`, once requests arrived and none since its quiet time: how long no new
    /// connection had come at the last count, where only kept-alive clients still send.
    fn kept_alive(&self, rules: &Rules, now: Duration) -> Option<Duration> {
        let held = self.low_since.is_some() && self.arrived;
        self.rule.kept_alive(rules.settle, self.drain_done, now).filter(|_| held)
    }

    /// Brings the next count before the deadline where the pace would put it past it.
    fn last_before_deadline(
        &mut self,
        rules: &Rules,
        (started, now): (Duration, Duration),
        cost: Duration,
        pause: Duration,
    ) {
        // `hold` counts once more just before its deadline, so that what it says then (new
        // connections still coming, or requests on kept-alive ones alone) holds up to it.
        let last_look = rules.deadline.saturating_sub(cost.saturating_mul(2).max(RECHECK));
        let hold = matches!(self.rule, EndRule::Quiet(_));
        if hold && self.next > last_look && now < last_look {
            self.next = last_look;
        }
        // A paced wait with no count due before the deadline counts once more where one can end.
        let last_chance = rules.deadline.saturating_sub((now - started).saturating_mul(2));
        if pause > rules.interval && self.next >= rules.deadline && last_chance > now {
            self.next = last_chance;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{no_mesh, run_plan};
    use crate::hold::quiet::tests::remembered;
    use crate::run::rule::ARRIVALS_QUIET;

    use std::cell::Cell;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn rules() -> Rules {
        Rules {
            min_drain: ms(5000),
            deadline: ms(25000),
            interval: ms(500),
            settle: ms(0),
            plan: run_plan(0, false),
        }
    }

    fn counted(n: u64) -> Sight {
        Sight { count: Some(n), ..Sight::default() }
    }

    fn cost(n: u64) -> Cost {
        Cost { look: ms(n), ..Cost::default() }
    }

    /// The wait from `drained_at` on the fake clock `now`, with looks from `look` (given the
    /// time left and what is asked); what the wait made of each.
    fn wait_with(
        r: &Rules,
        drained_at: Duration,
        now: &Cell<Duration>,
        mut look: impl FnMut(Duration, Ask) -> Sight,
    ) -> (End, Vec<(Ask, Seen)>) {
        let mut wait = Wait::new(r, drained_at);
        let mut seen = Vec::new();
        for _ in 0..100_000 {
            match wait.next(now.get()) {
                Step::Sleep(until) => now.set(until),
                Step::Look(ask) => {
                    let started = now.get();
                    let sight = look(r.deadline.saturating_sub(started), ask);
                    seen.push((ask, wait.saw(ask, (started, now.get()), &sight)));
                }
                Step::End(end) => return (end, seen),
            }
        }
        panic!("the wait never ended");
    }

    /// The wait on a fake clock from 0, each look taking `step` ms and answered by `look` from
    /// the time it started. Returns the end, when it ended and the times looked at.
    fn ticking(
        r: &Rules,
        step: u64,
        mut look: impl FnMut(Duration) -> Sight,
    ) -> (End, Duration, Vec<Duration>) {
        let now = Cell::new(ms(0));
        let mut at = Vec::new();
        let (end, _) = wait_with(r, ms(0), &now, |_, _| {
            let t = now.get();
            at.push(t);
            now.set(t + ms(step));
            look(t)
        });
        (end, now.get(), at)
    }

    impl From<Option<u64>> for Sight {
        fn from(count: Option<u64>) -> Sight {
            Sight { count, ..Sight::default() }
        }
    }

    /// Runs the loop with (from time in ms, count or look) steps, each holding from then on and
    /// taking `cost` of fake time. Returns the outcome, when it ended and the times counted at.
    fn run(
        rules: &Rules,
        script: &[(u64, impl Copy + Into<Sight>)],
        cost: Duration,
    ) -> (Outcome, Duration, Vec<Duration>) {
        let sights: Vec<(u64, Sight)> = script.iter().map(|&(from, t)| (from, t.into())).collect();
        let (end, time, at, _) = run_steps(rules, &sights, cost);
        (end.outcome, time, at)
    }

    /// `run` with the whole end and what the wait made of each look.
    fn run_steps(
        rules: &Rules,
        script: &[(u64, Sight)],
        cost: Duration,
    ) -> (End, Duration, Vec<Duration>, Vec<(Ask, Seen)>) {
        let now = Cell::new(ms(0));
        let mut at = Vec::new();
        let (end, seen) = wait_with(rules, ms(0), &now, |left, _| {
            let t = now.get();
            at.push(t);
            assert!(t + left <= rules.deadline, "time left is bounded by the deadline");
            now.set(t + cost.min(left));
            match script.iter().rposition(|(from, _)| ms(*from) <= t) {
                Some(step) => script[step].1,
                None => Sight::default(),
            }
        });
        (end, now.get(), at, seen)
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
        let r = Rules { plan: run_plan(2, false), min_drain: ms(0), ..rules() };
        let (o, end, _) = run(&r, &[(0, Some(5)), (1000, Some(2))], ms(0));
        assert_eq!((o, end), (Outcome::Reached, ms(1000)));
    }

    #[test]
    fn settle_needs_the_count_to_stay_low_that_long() {
        let r = Rules { settle: ms(2000), min_drain: ms(0), ..rules() };
        // low at 1s, back up at 2s, low again from 3s: settles at 5s.
        let script = [(0, Some(2)), (1000, Some(0)), (2000, Some(1)), (3000, Some(0))];
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
    fn a_look_that_waited_on_a_stalled_envoy_but_cost_little_cpu_keeps_the_interval() {
        let r = Rules { min_drain: ms(0), ..rules() };
        // Envoy stopped for 2 s: each look waits a second on it, and costs 10 ms of CPU.
        let stalled = Sight {
            count: Some(1),
            cost: Cost { look: ms(1000), admin: ms(1000), cpu: Some(ms(10)) },
            ..Sight::default()
        };
        let (o, end, at) =
            run(&r, &[(0, stalled), (2000, counted(1)), (4000, counted(0))], ms(1000));
        assert_eq!(o, Outcome::Reached);
        assert_eq!(&at[..3], [0, 1000, 2000].map(ms), "no pause after the stalled looks: {at:?}");
        assert!(end <= ms(5000), "ended {end:?} after the count reached zero at 4 s: {at:?}");
        // Measured CPU as long as the look paces as the look did.
        let busy = Sight { cost: Cost { cpu: Some(ms(250)), ..stalled.cost }, ..stalled };
        let (_, _, at) = run(&r, &[(0, busy)], ms(1000));
        assert_eq!(at[..2], [0, 5000].map(ms), "{at:?}");
    }

    #[test]
    fn slow_answers_space_the_counts_and_one_last_count_comes_before_the_deadline() {
        let r = Rules { min_drain: ms(0), ..rules() };
        let slow = |count| Sight { count: Some(count), cost: cost(250), ..Sight::default() };
        // Each look takes 250 ms: a count every 5 s, and one at 24.5 s, where a count that takes
        // as long still ends before the 25 s deadline.
        let (o, end, at) = run(&r, &[(0, slow(1))], ms(250));
        assert_eq!((o, end), (Outcome::Deadline, ms(25000)));
        assert_eq!(at, [0, 5000, 10000, 15000, 20000, 24500].map(ms), "{at:?}");
        // A quick look keeps the interval.
        let quick = Sight { count: Some(1), cost: cost(20), ..Sight::default() };
        let (_, _, at) = run(&r, &[(0, quick)], ms(20));
        assert_eq!(at.len(), 50, "every 500 ms: {at:?}");
        // The count reaching zero is seen at the next paced count.
        let (o, end, _) = run(&r, &[(0, slow(1)), (12000, slow(0))], ms(250));
        assert_eq!((o, end), (Outcome::Reached, ms(15250)));
        // The bench's wait (min-drain 9 s, deadline 10 s), quiet: paced counts, one when the
        // min-drain ends, and no last count before the deadline beside it.
        let bench = Rules { min_drain: ms(9000), deadline: ms(10000), ..rules() };
        let (o, end, at) = run(&bench, &[(0, slow(0))], ms(250));
        assert_eq!((o, end), (Outcome::Reached, ms(9000)));
        assert_eq!(at, [0, 5000, 8750].map(ms), "the last one ends at 9 s");
    }

    #[test]
    fn an_unknown_count_breaks_the_settle_time_and_never_counts_as_zero() {
        let r = Rules { settle: ms(1000), min_drain: ms(0), ..rules() };
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
        assert_eq!(*at.last().unwrap(), ms(24500), "no count is started at the deadline");
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
        let bench = Rules { min_drain: ms(9000), deadline: ms(10000), ..rules() };
        // Each look's count and cost: the first, then every later one.
        let looks = |r: &Rules, counts: [u64; 2], costs: [u64; 2]| {
            let now = Cell::new(ms(0));
            let mut at = Vec::new();
            let (end, _) = wait_with(r, ms(0), &now, |left, _| {
                let i = at.len().min(1);
                let took = ms(costs[i]).min(left);
                at.push(now.get());
                now.set(now.get() + took);
                Sight {
                    count: Some(counts[i]),
                    cost: Cost { look: took, admin: took, cpu: None },
                    ..Sight::default()
                }
            });
            (end.outcome, now.get(), at)
        };
        let (o, end, at) = looks(&bench, [0, 0], [4000, 3500]);
        assert_eq!((o, end), (Outcome::Reached, ms(9000)));
        assert_eq!(at, [0, 5000].map(ms));
        // A count that takes longer than expected ends the wait when it ends.
        let (o, end, at) = looks(&bench, [0, 0], [4000, 4300]);
        assert_eq!((o, end, at.len()), (Outcome::Reached, ms(9300), 2));
        // A settle time needs a count after the one that began it, even when the count before
        // took long: 1 request, then none from the last count before the 30 s deadline on.
        let settle = Rules { min_drain: ms(0), deadline: ms(30000), settle: ms(500), ..rules() };
        let (o, end, at) = looks(&settle, [1, 0], [4000, 1000]);
        assert_eq!((o, end), (Outcome::Reached, ms(24000)));
        assert_eq!(at, [0, 22000, 23000].map(ms));
    }

    #[test]
    fn a_quick_count_after_a_slow_one_decides_nothing_ahead_of_its_own_time() {
        // Red-team of run, finding 4: /clusters held 3 s (Envoy's main thread busy with a push),
        // then answering at once; a 10 s request from 3.5 s. The quick count at 3 s took the
        // slow one's time for its own and decided the end at the min-drain (5 s) unseen.
        let now = Cell::new(ms(0));
        let mut at = Vec::new();
        let (end, _) = wait_with(&rules(), ms(0), &now, |_, _| {
            let t = now.get();
            at.push(t);
            let took = if t.is_zero() { ms(3000) } else { ms(1) };
            now.set(t + took);
            let count = u64::from(t >= ms(3500) && t < ms(13_500));
            Sight { count: Some(count), cost: cost(took.as_millis() as u64), ..Sight::default() }
        });
        assert_eq!(end.outcome, Outcome::Reached);
        assert!(now.get() >= ms(13_500), "ended at {:?}, the request in flight: {at:?}", now.get());
        assert!(at.iter().any(|t| *t > ms(3500) && *t <= ms(5000)), "a fresh look: {at:?}");
    }

    #[test]
    fn slow_counts_run_back_to_back_and_still_stop_at_the_deadline() {
        let (o, end, at) = run(&rules(), &[(0, Some(1))], ms(700));
        assert_eq!(o, Outcome::Deadline);
        assert_eq!(end, ms(25000), "the last count is cut short by the deadline");
        assert_eq!(at[1], ms(700), "the next count starts right after a slow one");
    }

    #[test]
    fn a_count_that_takes_the_rest_of_the_time_ends_at_the_deadline() {
        let r = Rules { deadline: ms(3000), min_drain: ms(0), ..rules() };
        let (o, end, at) = run(&r, &[(0, Some(1))], ms(3000));
        assert_eq!((o, end, at.len()), (Outcome::Deadline, ms(3000), 1));
    }

    #[test]
    fn a_look_that_ends_past_the_deadline_ends_the_wait_there() {
        // The drain's request hung for 1 s of a 1.5 s deadline, and the count after it for 0.6 s.
        let r = Rules { deadline: ms(1500), min_drain: ms(0), ..rules() };
        let now = Cell::new(ms(1000));
        let (end, seen) = wait_with(&r, ms(1000), &now, |_, _| {
            now.set(now.get() + ms(600));
            counted(1)
        });
        assert_eq!((end.outcome, now.get(), seen.len()), (Outcome::Deadline, ms(1600), 1));
    }

    #[test]
    fn settle_longer_than_what_is_left_ends_at_the_deadline() {
        let r = Rules { settle: ms(10000), min_drain: ms(0), deadline: ms(3000), ..rules() };
        let (o, end, _) = run(&r, &[(0, Some(0))], ms(0));
        assert_eq!((o, end), (Outcome::Deadline, ms(3000)));
    }

    #[test]
    fn the_largest_durations_that_parse_never_overflow() {
        let huge = Duration::from_secs(u64::MAX);
        // A settle time added to a count taken after the first second.
        let settle = Rules { settle: huge, plan: run_plan(5, false), ..rules() };
        let (o, end, _) = run(&settle, &[(0, Some(1))], ms(1500));
        assert_eq!((o, end), (Outcome::Deadline, ms(25000)));
        // An interval added to a count taken at 2 s, when the min-drain ended.
        let interval = Rules { interval: huge, min_drain: ms(2000), ..rules() };
        let (o, end, at) = run(&interval, &[(0, Some(0)), (1000, Some(3))], ms(0));
        assert_eq!((o, end, at), (Outcome::Deadline, ms(25000), vec![ms(0), ms(2000)]));
    }

    #[test]
    fn a_min_drain_as_long_as_the_deadline_still_lets_a_quiet_pod_end_before_it() {
        for drained_at in [ms(0), ms(40)] {
            let now = Cell::new(drained_at);
            let r = Rules { min_drain: ms(3000), deadline: ms(3000), ..rules() };
            let o = wait_with(&r, drained_at, &now, |_, _| counted(0)).0.outcome;
            assert_eq!(o, Outcome::Reached, "drained at {drained_at:?}");
            assert!(
                now.get() >= ms(2500) && now.get() < ms(3000),
                "ends in the last interval before the deadline: {:?}",
                now.get()
            );
        }
        let now = Cell::new(ms(0));
        let r = Rules { min_drain: ms(3000), deadline: ms(3000), ..rules() };
        let o = wait_with(&r, ms(0), &now, |_, _| counted(1)).0.outcome;
        assert_eq!(o, Outcome::Deadline, "an open connection still waits it out");
    }

    #[test]
    fn min_drain_counts_from_the_drain_not_from_the_start() {
        let now = Cell::new(ms(800));
        let r = Rules { min_drain: ms(1000), ..rules() };
        let o = wait_with(&r, ms(800), &now, |_, _| counted(0)).0.outcome;
        assert_eq!((o, now.get()), (Outcome::Reached, ms(1800)));
    }

    #[test]
    fn arrivals_hold_a_zero_count_until_none_has_come_for_a_while() {
        let r = rules();
        // Zero at every look, but a new request at every one up to 9 s: the endpoint has not yet
        // left the clients' lists.
        let script: Vec<(u64, Sight)> = (0..19)
            .map(|i| {
                let sight = Sight { arrivals: Some(40 + i), ..counted(0) };
                (i * 500, sight)
            })
            .collect();
        let (o, end, _) = run(&r, &script, ms(0));
        assert_eq!(
            (o, end),
            (Outcome::Reached, ms(9000) + ARRIVALS_QUIET),
            "ARRIVALS_QUIET after the count that saw the last"
        );
        // Without arrivals the same zeros end at the min-drain.
        let (o, end, _) = run(&r, &[(0, counted(0))], ms(0));
        assert_eq!((o, end), (Outcome::Reached, ms(5000)));
    }

    fn app(holds: Option<bool>, n: u64) -> Sight {
        Sight { app: holds, ..counted(n) }
    }

    #[test]
    fn the_app_gone_for_app_gone_ends_the_wait_whatever_is_open_but_never_before_the_min_drain() {
        let script = [(0, app(Some(true), 3)), (6000, app(Some(false), 3))];
        let (end, time, at, seen) = run_steps(&rules(), &script, ms(0));
        assert_eq!((end.outcome, time), (Outcome::AppExited, ms(6800)));
        assert_eq!(end.quit, None, "not asked to stop the proxy");
        let looks: Vec<Duration> = at.iter().copied().filter(|t| *t >= ms(6000)).collect();
        assert_eq!(looks, (60..=68).map(|i| ms(i * 100)).collect::<Vec<_>>());
        let apps: Vec<App> = seen.iter().map(|(_, s)| s.app).collect();
        assert_eq!(apps[apps.len() - 2..], [App::Leaving, App::Gone]);
        assert!(seen.iter().any(|(ask, _)| *ask == Ask::App), "looks at the app alone");
        // Gone from 1 s on: the wait still holds until the min-drain ends.
        let script = [(0, app(Some(true), 3)), (1000, app(Some(false), 3))];
        let (o, end, _) = run(&rules(), &script, ms(0));
        assert_eq!((o, end), (Outcome::AppExited, ms(5000)));
        // An app never seen, or a table that cannot be read, never ends the wait.
        for holds in [None, Some(false), Some(true)] {
            let (o, _, _) = run(&rules(), &[(0, app(holds, 1))], ms(0));
            assert_eq!(o, Outcome::Deadline, "{holds:?}");
        }
        // Nor do sockets gone for less than a second, or an unreadable table between.
        let script = [
            (0, app(Some(true), 1)),
            (6000, app(Some(false), 1)),
            (6500, app(None, 1)),
            (6600, app(Some(false), 1)),
            (7500, app(Some(true), 1)),
        ];
        let (o, _, _) = run(&rules(), &script, ms(0));
        assert_eq!(o, Outcome::Deadline);
    }

    /// A look's sight: the app's sockets, the count, and the connections busy delivering an
    /// answer and awaiting one.
    fn busy(holds: Option<bool>, n: u64, (delivering, awaiting): (u64, u64)) -> Sight {
        Sight { busy: Some(Busy { delivering, awaiting }), ..app(holds, n) }
    }

    #[test]
    fn an_answer_still_being_delivered_holds_the_proxy_whatever_the_app_and_the_count_say() {
        // Red-team of run, findings 1 and 2: the app handed a 3 MB answer to the kernel and
        // exited at 2 s; a slow client reads it until 9 s (bytes unacknowledged on the
        // connection Envoy accepted). And /clusters' request ends once Envoy has read the
        // backend's last byte, ahead of a slow client.
        let script = [(0, busy(Some(true), 1, (1, 0))), (2000, busy(Some(false), 1, (1, 0)))];
        let script = [&script[..], &[(9000, busy(Some(false), 1, (0, 0)))]].concat();
        let (end, time, _, _) = run_steps(&rules(), &script, ms(0));
        assert_eq!(end.outcome, Outcome::AppExited);
        assert!(time >= ms(9000) && time <= ms(9600), "{time:?}");
        // The count at zero, an answer still on its way, then a request to a host /clusters no
        // longer lists (EDS removed it) awaiting its answer until 12 s.
        let script = [
            (0, busy(Some(true), 0, (1, 0))),
            (6000, busy(Some(true), 0, (0, 1))),
            (12_000, busy(Some(true), 0, (0, 0))),
        ];
        let (end, time, _, _) = run_steps(&rules(), &script, ms(0));
        assert_eq!((end.outcome, time), (Outcome::Reached, ms(12_000)));
        // With --then-quit the proxy is stopped once the app is gone and the answer delivered.
        let r = Rules { plan: run_plan(0, true), ..rules() };
        let script = [
            (0, busy(Some(true), 0, (0, 0))),
            (6000, busy(Some(false), 0, (1, 0))),
            (8000, busy(Some(false), 0, (0, 0))),
        ];
        let (end, time, _, _) = run_steps(&r, &script, ms(0));
        assert_eq!((end.outcome, end.quit), (Outcome::Reached, Some(App::Gone)));
        assert!(!end.delivering && time >= ms(8000) && time <= ms(8200), "{time:?}");
        // Still delivering at the deadline (found by an outside read): the proxy is left to its
        // own shutdown, which gives the answer more time than a stop now.
        let script = [(0, busy(Some(true), 0, (0, 0))), (6000, busy(Some(false), 0, (1, 0)))];
        let (end, time, _, _) = run_steps(&r, &script, ms(0));
        assert_eq!((end.quit, end.delivering), (Some(App::Gone), true));
        let last = r.deadline.saturating_sub(RECHECK);
        assert!(time >= last && time <= r.deadline, "{time:?}");
    }

    #[test]
    fn a_worker_that_calls_out_now_and_then_is_not_taken_for_gone() {
        let r = Rules { plan: run_plan(0, true), ..rules() };
        // No listener; a 300 ms call out every 700 ms, or every second (in step with the
        // interval), the last one starting before 20 s; then nothing.
        for period in [700, 1000] {
            let (end, stopped, _) = ticking(&r, 0, |t| {
                let t = t.as_millis() as u64;
                app(Some(t < 20_000 && t % period < 300), 0)
            });
            let quit = Some(App::Gone);
            assert_eq!(end, End { outcome: Outcome::Reached, quit, delivering: false }, "{period}");
            let last_call_end = ms(19_999 / period * period + 300);
            assert!(
                stopped >= last_call_end + APP_GONE && stopped <= last_call_end + ms(1600),
                "{period}: stopped at {stopped:?}"
            );
        }
    }

    #[test]
    fn the_app_is_gone_only_after_it_was_seen_and_then_missed_for_app_gone_at_close_looks() {
        let mut f = Follow::default();
        let mut at = 0;
        let mut look = |holds, step| {
            at += step;
            f.app(holds, ms(at), ms(at))
        };
        assert_eq!(look(Some(false), 0), App::NotSeen);
        assert_eq!(look(Some(true), 500), App::Running);
        assert_eq!(look(Some(false), 500), App::Leaving);
        let close: Vec<App> = (0..8).map(|_| look(Some(false), 100)).collect();
        assert_eq!(close[6..], [App::Leaving, App::Gone], "{close:?}");
        assert_eq!(look(Some(true), 100), App::Running);
        // Looks too far apart start again; so does a look that could not read the table.
        let far: Vec<App> = (0..4).map(|_| look(Some(false), 500)).collect();
        assert_eq!(far, [App::Leaving; 4]);
        assert_eq!(look(None, 100), App::Unknown);
        assert_eq!(look(Some(false), 100), App::Leaving);
    }

    #[test]
    fn a_request_counter_that_moved_is_an_arrival() {
        let mut f = Follow::default();
        let requests = Some;
        assert_eq!(f.arrived(requests(40)), 0, "the first count has nothing to compare");
        assert_eq!(f.arrived(requests(40)), 0, "no new request");
        assert_eq!(f.arrived(requests(41)), 1, "a request, on a kept connection or a new one");
        assert_eq!(f.arrived(None), 0, "an unknown count or the stats tell nothing");
        assert_eq!(f.arrived(requests(45)), 4, "compared with the last counter");
        assert_eq!(f.arrived(requests(3)), 1, "a restarted Envoy's counter: at least one");
    }

    #[test]
    fn then_quit_stops_the_proxy_once_the_app_has_exited_after_the_count_is_reached() {
        let r = Rules { plan: run_plan(0, true), ..rules() };
        // Zero from 1 s; the app holds sockets until 7.2 s.
        let script =
            [(0, app(Some(true), 2)), (1000, app(Some(true), 0)), (7200, app(Some(false), 0))];
        let (end, time, _, seen) = run_steps(&r, &script, ms(0));
        assert_eq!(end.outcome, Outcome::Reached);
        assert_eq!(end.quit, Some(App::Gone));
        assert_eq!(time, ms(8300), "gone from the look at 7.5 s, and for APP_GONE");
        assert!(
            seen.iter().any(|(ask, s)| *ask == Ask::Exit && s.app == App::Running),
            "the app was looked at alone after the count was reached"
        );
        // The app's exit during the count stops the proxy too, once the min-drain is over.
        let script = [(0, app(Some(true), 2)), (2000, app(Some(false), 2))];
        let (end, time, _, _) = run_steps(&r, &script, ms(0));
        assert_eq!((end.outcome, end.quit), (Outcome::AppExited, Some(App::Gone)));
        assert_eq!(time, ms(5000));
    }

    #[test]
    fn then_quit_never_stops_the_proxy_under_an_app_it_cannot_see_go() {
        let r = Rules { plan: run_plan(0, true), ..rules() };
        // Never seen: its exit cannot be told; decided at once.
        let (end, time, _, _) = run_steps(&r, &[(0, app(Some(false), 0))], ms(0));
        assert_eq!((end.outcome, end.quit), (Outcome::Reached, Some(App::NotSeen)));
        assert_eq!(time, ms(5000));
        // Still there, or unknown, until the deadline: given up one interval before it.
        for (holds, seen) in [(Some(true), App::Running), (None, App::Unknown)] {
            let (end, time, _, _) = run_steps(&r, &[(0, app(holds, 0))], ms(0));
            assert_eq!((end.outcome, end.quit), (Outcome::Reached, Some(seen)), "{holds:?}");
            assert!(time >= ms(24500) && time <= ms(25000), "{time:?}");
        }
        // A wait that did not reach the threshold asks nothing more.
        let (end, _, _, _) = run_steps(&r, &[(0, app(Some(true), 1))], ms(0));
        assert_eq!((end.outcome, end.quit), (Outcome::Deadline, None));
    }

    /// `hold`'s rules: at least `min`, then `quiet` without an arrival, at most `deadline`;
    /// the propagation its default, 15 s, within the deadline.
    fn hold(min: u64, quiet: u64, deadline: u64) -> Rules {
        Rules {
            min_drain: ms(min),
            deadline: ms(deadline),
            settle: ms(quiet),
            plan: no_mesh(ms(deadline.min(15_000))),
            ..rules()
        }
    }

    /// A hold whose requests arrive at `times` (ms), read as a counter by every look, each look
    /// taking 20 ms; `unknown` (from, to) ms where the counter cannot be read. Returns the
    /// outcome and when it ended.
    fn hold_with(r: &Rules, times: &[u64], unknown: (u64, u64)) -> (Outcome, Duration) {
        let now = Cell::new(ms(0));
        let (end, seen) = wait_with(r, ms(0), &now, |_, _| {
            let t = now.get();
            now.set(t + ms(20));
            let arrived = times.iter().filter(|&&a| ms(a) <= t).count() as u64;
            let known = !(ms(unknown.0)..ms(unknown.1)).contains(&t);
            Sight {
                // In flight: what the hold does not wait for.
                count: Some(3),
                arrivals: if known { Some(arrived) } else { None },
                ..Sight::default()
            }
        });
        assert!(seen.iter().all(|(_, s)| s.app == App::Unknown), "a hold never looks at the app");
        (end.outcome, now.get())
    }

    #[test]
    fn a_hold_ends_a_quiet_time_after_the_look_that_saw_the_last_arrival_never_before_its_min() {
        let r = hold(5000, 2000, 20000);
        // Requests every 100 ms until 9.95 s: the look at 10 s sees the last, quiet until 12 s.
        let busy: Vec<u64> = (0..100).map(|i| i * 100 + 50).collect();
        let (o, end) = hold_with(&r, &busy, (0, 0));
        assert_eq!(o, Outcome::Reached);
        assert!(
            end >= ms(9950 + 2000) && end <= ms(9950 + 2000 + 600),
            "within the quiet time and one interval of the last arrival: {end:?}"
        );
        // Nothing arrives: the min holds it.
        let (o, end) = hold_with(&r, &[], (0, 0));
        assert!(o == Outcome::Reached && end >= ms(5000) && end <= ms(5100), "{end:?}");
        // One request every 1.5 s, less than the quiet time apart: it holds to the deadline.
        let slow: Vec<u64> = (0..20).map(|i| i * 1500).collect();
        assert_eq!(hold_with(&r, &slow, (0, 0)).0, Outcome::Deadline);
    }

    #[test]
    fn a_quiet_time_that_ends_at_the_deadline_is_reached_there() {
        // Every 3 s to 8.5 s, too few to tell their end before the propagation, which the
        // deadline cuts to 14 s: the quiet time ends at the deadline, the end is reached there,
        // whether or not the last count happens to end before it (CI, 2026-12-07).
        let r = Rules { interval: ms(3000), ..hold(12_000, 1000, 14_000) };
        assert_eq!(hold_with(&r, &[2500, 5500, 8500], (0, 0)), (Outcome::Reached, ms(14_000)));
    }

    #[test]
    fn a_silence_the_hold_watched_before_a_burst_is_a_pause_it_waits_twice_for() {
        // A batch client's 1 s bursts of 20 a second every 6 s, nothing remembered from before
        // the hold (issue 55): the first burst comes 4 s into the hold. Quiet for 0.5 s after it
        // would end the hold before the next; the 4 s silence counts as a pause, so the hold
        // sees the next burst, then waits twice the 5 s pause before it: to the propagation.
        let r = hold(5000, 500, 20000);
        let bursts: Vec<u64> =
            [4000, 10000].iter().flat_map(|s| (0..20).map(move |i| s + i * 50)).collect();
        let (o, end) = hold_with(&r, &bursts, (0, 0));
        assert_eq!(o, Outcome::Reached);
        assert!(end >= ms(15_000) && end <= ms(15_100), "held past the second burst: {end:?}");
        // One burst only: quiet for twice the 4 s before it, from its last request.
        let (o, end) = hold_with(&r, &bursts[..20], (0, 0));
        assert_eq!(o, Outcome::Reached);
        assert!(end >= ms(4950 + 8000) && end <= ms(4950 + 8000 + 1100), "{end:?}");
    }

    #[test]
    fn a_hold_held_by_kept_alive_clients_alone_ends_at_the_propagation_as_a_normal_end() {
        // Requests every 100 ms to the deadline; `opened(t)` new connections by t ms, the other
        // requests on connections already open.
        let outcome = |r: &Rules, opened: &dyn Fn(u64) -> u64| {
            let now = Cell::new(ms(0));
            let (end, _) = wait_with(r, ms(0), &now, |_, _| {
                let t = now.get();
                now.set(t + ms(20));
                let (n, t) = (t.as_millis() as u64 / 100, t.as_millis() as u64);
                Sight {
                    count: Some(2),
                    arrivals: Some(n),
                    opened: Some(opened(t)),
                    ..Sight::default()
                }
            });
            (end.outcome, now.get())
        };
        let r = hold(5000, 500, 20000);
        let every_100ms_until = |last: u64| move |t: u64| t.min(last) / 100;
        // No new connection since 6 s: at the first count from the propagation (15 s), as the
        // `sleep 15` it replaces, not at the deadline.
        let (kept, at) = outcome(&r, &every_100ms_until(6000));
        let Outcome::KeptAlive(since) = kept else { panic!("{kept:?}") };
        assert!(at >= ms(15_000) && at <= ms(15_600), "{at:?}");
        assert!(since >= ms(9_000) && since <= ms(9_600), "since 6 s: {since:?}");
        assert_eq!(kept.exit_code(), 0);
        // New connections that stop after the propagation (a node slower than it): once they
        // have stopped for their quiet time, before the deadline.
        let (kept, at) = outcome(&r, &every_100ms_until(16_000));
        assert!(matches!(kept, Outcome::KeptAlive(_)), "{kept:?}");
        assert!(at > ms(16_000) && at < ms(19_000), "{at:?}");
        // New connections still coming: clients the mesh still sends here; held to the end.
        assert_eq!(outcome(&r, &every_100ms_until(20_000)), (Outcome::Deadline, ms(20_000)));
        // Fewer, but still coming up to the propagation (one every 1.5 s until 14.5 s; red team
        // of issue 68): their own quiet time, not cut at the propagation; here to the deadline.
        let (late, at) = outcome(&r, &|t: u64| t.min(14_500) / 1500);
        assert_eq!((late, at), (Outcome::Deadline, ms(20_000)));
        // One at 14 s after none since 6 s: a client the mesh still sends here.
        let (late, _) = outcome(&r, &|t: u64| t.min(6000) / 100 + u64::from(t >= 14_000));
        assert_eq!(late, Outcome::Deadline);
        // Never before the min-drain, whatever the propagation.
        let r = Rules { plan: no_mesh(ms(2000)), min_drain: ms(10_000), ..r };
        let (kept, at) = outcome(&r, &every_100ms_until(1000));
        assert!(matches!(kept, Outcome::KeptAlive(_)) && at >= ms(10_000), "{kept:?} {at:?}");
    }

    #[test]
    fn a_hold_never_takes_an_unknown_counter_for_quiet() {
        let r = hold(1000, 2000, 20000);
        // Unreadable from 1 s to 6 s: the quiet time starts again when it reads again.
        let (o, end) = hold_with(&r, &[], (1000, 6000));
        assert_eq!(o, Outcome::Reached);
        assert!(end >= ms(8000) && end <= ms(8600), "{end:?}");
        // Never readable: nothing counted, at the deadline.
        assert_eq!(hold_with(&r, &[], (0, 30000)), (Outcome::NothingCounted, ms(20000)));
        // Requests that arrived while it could not read are seen when it reads again.
        let busy: Vec<u64> = (0..30).map(|i| i * 100 + 50).collect();
        let (_, end) = hold_with(&r, &busy, (2000, 4000));
        assert!(end >= ms(6000) && end <= ms(6600), "{end:?}");
    }

    #[test]
    fn a_busy_hold_ends_within_a_second_of_the_last_arrival() {
        // 20 requests a second until 10 s: mean gap 50 ms, 7 of them well under the floor.
        let r = hold(5000, 500, 20000);
        let busy: Vec<u64> = (0..200).map(|i| i * 50 + 25).collect();
        let (o, end) = hold_with(&r, &busy, (0, 0));
        assert_eq!(o, Outcome::Reached);
        assert!(end >= ms(9975 + 500) && end <= ms(9975 + 1000), "{end:?}");
    }

    #[test]
    fn a_hold_never_ends_between_two_arrivals_of_a_slow_stream() {
        // Red-team: one request every 4 s. With a 3 s quiet time the hold returned between two.
        // Three in 9 s tell too little to end sooner than the propagation: held to it, whatever
        // the deadline.
        let slow = [1000, 5000, 9000];
        for deadline in [20_000, 60_000] {
            let (o, end) = hold_with(&hold(5000, 500, deadline), &slow, (0, 0));
            assert_eq!(o, Outcome::Reached);
            assert!(end >= ms(15_000) && end <= ms(15_100), "{end:?}");
        }
        // Still coming closer than the quiet time apart at the propagation (every 100 ms until
        // 18 s): the mesh is slower than that, and the hold goes on until they stop.
        let late: Vec<u64> = (0..180).map(|i| i * 100 + 50).collect();
        let (o, end) = hold_with(&hold(5000, 500, 20000), &late, (0, 0));
        assert!(o == Outcome::Reached && end > ms(18_500) && end < ms(20_000), "{end:?}");
        let later: Vec<u64> = (0..200).map(|i| i * 100 + 50).collect();
        assert_eq!(hold_with(&hold(5000, 500, 20000), &later, (0, 0)).0, Outcome::Deadline);
    }

    #[test]
    fn a_hold_whose_first_look_was_slow_returns_only_on_a_look_that_lasted_its_quiet_time() {
        // 50,000 clusters: the first look (with /clusters) takes 2.7 s, the table's alone 1 ms;
        // requests arrive until 30 s, seen as bytes at most once every 100 ms.
        let r = hold(0, 500, 60000);
        let now = Cell::new(ms(0));
        let (end, _) = wait_with(&r, ms(0), &now, |_, _| {
            let t = now.get();
            now.set(t + if t.is_zero() { ms(2700) } else { ms(1) });
            // The table is read at the look's end.
            let read = now.get().min(ms(30_000));
            Sight {
                arrivals: Some(read.as_millis() as u64 / 100),
                cost: cost(if t.is_zero() { 2700 } else { 1 }),
                ..Sight::default()
            }
        });
        assert_eq!(end.outcome, Outcome::Reached);
        let after = now.get().saturating_sub(ms(30_000));
        assert!(after >= ms(500) && after <= ms(2200), "{after:?} after the last arrival");
    }

    #[test]
    fn pauses_before_the_first_count_are_not_taken_for_the_end_either() {
        // Bursts 3.5 s apart before the hold, 10 a second on the whole, the last 200 ms before
        // its first count; nothing after: the quiet time is twice that pause from the newest.
        let r = hold(1000, 500, 20000);
        let busy = remembered(600, 200, 3500);
        let (end, stopped, _) = ticking(&r, 20, |t| Sight {
            count: Some(0),
            arrivals: Some(0),
            before: (t == ms(0)).then_some(busy),
            ..Sight::default()
        });
        assert_eq!(end.outcome, Outcome::Reached);
        assert!(stopped >= ms(6800) && stopped < ms(6900), "{stopped:?}");
        // The same quiet time from longer ago; one past the propagation ends there, as nothing
        // arrived during the hold; and a sparse rate (10 in the minute) holds to it anyway.
        let cases = [(600, 4000, 4500, 5000), (600, 1000, 8000, 15000), (10, 200, 3500, 15000)];
        for (n, newest, pause, at) in cases {
            let before = remembered(n, newest, pause);
            let r = Rules { min_drain: ms(5000), ..hold(1000, 500, 20000) };
            let (end, stopped, _) = ticking(&r, 20, |t| Sight {
                count: Some(0),
                arrivals: Some(0),
                before: (t == ms(0)).then_some(before),
                ..Sight::default()
            });
            assert_eq!(end.outcome, Outcome::Reached, "{before:?}");
            assert!(stopped >= ms(at) && stopped < ms(at + 100), "{stopped:?} {before:?}");
        }
    }

    #[test]
    fn a_hold_on_slow_counts_keeps_the_pace_while_requests_arrive() {
        // 10,000 clusters: each count takes 250 ms, so counts are 5 s apart; requests every
        // 100 ms until 30 s, then none.
        let r = hold(0, 3000, 60000);
        let (end, stopped, at) = ticking(&r, 250, |t| Sight {
            count: Some(0),
            arrivals: Some(t.min(ms(30000)).as_millis() as u64 / 100),
            cost: cost(250),
            ..Sight::default()
        });
        assert_eq!(end.outcome, Outcome::Reached);
        // After the first count, which saw nothing arrive yet and wakes to end the quiet time.
        let busy: Vec<&Duration> = at.iter().skip(1).filter(|t| **t <= ms(30000)).collect();
        assert!(
            busy.windows(2).all(|w| *w[1] - *w[0] >= ms(5000)),
            "counted at the pace while requests arrived: {at:?}"
        );
        // The last arrival is seen by the first count after it, and a count one pace later
        // sees none: two paces at most.
        assert!(stopped <= ms(30000 + 2 * 5000 + 250), "{stopped:?} {at:?}");
    }

    #[test]
    fn arrivals_slower_than_one_a_count_still_hold_a_zero_count_until_they_stop() {
        // Red-team #2: one request every 1.2 s, each over before the next count: the count is 0
        // at every count, and one count in two sees none arrive.
        let r = Rules { min_drain: ms(2000), ..rules() };
        let (end, stopped, _) = ticking(&r, 10, |t| Sight {
            arrivals: Some(t.min(ms(12_000)).as_millis() as u64 / 1200),
            ..counted(0)
        });
        assert_eq!(end.outcome, Outcome::Reached);
        // The last at 12 s, seen by the count at 12 s: ARRIVALS_QUIET after it.
        let quiet = ms(12_000) + ARRIVALS_QUIET;
        assert!(stopped >= quiet && stopped <= quiet + ms(600), "{stopped:?}");
    }

    #[test]
    fn arrivals_long_over_never_delay_the_end_when_the_count_reaches_zero() {
        // Short requests until 2 s, long ones in flight until 8.3 s: the quiet time after the
        // last arrival was over long before, and the count at zero ends the wait at once.
        let (end, stopped, _) = ticking(&rules(), 10, |t| Sight {
            arrivals: Some(t.min(ms(2000)).as_millis() as u64 / 100),
            ..counted(if t < ms(8300) { 3 } else { 0 })
        });
        assert_eq!(end.outcome, Outcome::Reached);
        assert_eq!(stopped, ms(8510), "the first count at zero");
    }
}
