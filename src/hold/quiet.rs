//! `hold`'s end rule: the quiet time after the last arrival that the arrivals' own rate asks
//! (docs/holding.md, "The quiet time"), and whether only kept-alive clients still send at the
//! propagation. The wait (wait.rs) asks it at each count; it reads no clock: each count brings its time.

use crate::config::Rules;
use crate::count::Before;
use crate::outcome::Pace;
use std::time::Duration;

/// How far back the hold's own counts tell the arrivals' rate: long enough for a few arrivals of
/// a slow stream, short enough to follow one that slows down.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// The most weight what the source remembers from before the hold gets, in seconds of counts: the
/// kernel's memory of closed connections is a minute (TIME_WAIT); a pod's life is longer, and
/// its rate long ago need not be its rate now.
const PRIOR: f64 = 60.0;

/// The chance a hold may take of ending while requests still come: half the one in a thousand of
/// deletions that may lose one, the rest for what the rate, told from few arrivals, gets wrong.
const RISK: f64 = 0.0005;

/// When the hold's quiet ends, and what tells it: the reads' arrivals (docs/holding.md, "The
/// quiet time").
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// `--quiet`: the least silence, a whole read.
    floor: Duration,
    /// The min-drain's end: silences are tried from then on.
    from: Duration,
    /// `--propagation`: by then the mesh has stopped sending here, unless arrivals come later.
    propagation: Duration,
    deadline: Duration,
}

/// What counts saw arrive lately, for `hold`'s quiet time.
#[derive(Debug, Default)]
struct Rate {
    /// When counts could first tell arrivals.
    since: Option<Duration>,
    /// What the first count told of arrivals before it.
    before: Option<Before>,
    reads: Vec<Sample>,
    /// As of the last count that saw any (or the first, where arrivals came before it): their
    /// pace, when the last came, and the span their rate was measured over.
    pace: Option<Pace>,
    last: Option<Duration>,
    measured: Option<(Duration, Duration)>,
}

impl Rate {
    /// A count that ended at `now` and saw `arrived` (and `recounted` more of earlier counts),
    /// the newest of them `newest` ago where the source tells (else at `now`; never before the
    /// count before); the first, what the source remembered from `before` it.
    fn add(
        &mut self,
        now: Duration,
        (arrived, recounted): (u64, u64),
        newest: Option<Duration>,
        limits: &Limits,
    ) {
        let Some(since) = self.since else {
            self.since = Some(now);
            // Arrivals remembered from before: the silence runs from the newest, or, where the
            // source cannot tell when it came, from now.
            let before = self.before.filter(|b| b.arrivals > 0);
            self.last = before.map(|_| now);
            let ago = before.and_then(|b| b.recent).map_or(Duration::ZERO, |r| r.0);
            self.pace = before.map(|_| self.pace(&[], (now, now), (now, ago), limits));
            return;
        };
        let was = self.reads.last().map_or(since, |r| r.at);
        self.reads.push(Sample { at: now, arrived, recounted });
        // Measured up to the count that saw the last arrival: the silence that follows must not
        // lengthen it. A later recount (/clusters' requests on a connection the table saw once)
        // tells how many came then, and measures it again.
        let (from, to, last) = match (arrived, self.measured, self.last) {
            (0, Some((from, to)), Some(last)) if recounted > 0 => (from, to, last),
            (0, _, _) => return,
            _ => {
                let from = since.max(now.saturating_sub(WINDOW));
                self.reads.retain(|r| r.at > from);
                (from, now, newest.map_or(now, |age| now.saturating_sub(age).max(was)))
            }
        };
        (self.last, self.measured) = (Some(last), Some((from, to)));
        let reads = std::mem::take(&mut self.reads);
        self.pace = Some(self.pace(&reads, (from, to), (last, Duration::ZERO), limits));
        self.reads = reads;
    }

    /// The pace of `reads` from `from` to `now`, the last arrival at `last` (or `ago` before it,
    /// before the first count), and the quiet time after `last`: until ending then risks less than `RISK` of a request still to come
    /// (`risk`), and at least `limits.floor` and twice the longest pause (counts between saw
    /// none), so that bursts with pauses between them are not the end; among them the pauses
    /// before the first count, and the silence from `from` to the first arrival after it, which
    /// the counts watched. Counts are at least what arrived (a connection that received bytes is
    /// one arrival however many requests it carried), so the rate is also told from how many
    /// counts saw none: with a share f of counts L apart seeing some, arrivals at rate r give
    /// f = 1 - e^(-rL).
    fn pace(
        &self,
        reads: &[Sample],
        (from, now): (Duration, Duration),
        (last, ago): (Duration, Duration),
        limits: &Limits,
    ) -> Pace {
        let (alpha, beta) = self.rate(reads, (from, now));
        let before = self.before.filter(|b| !b.span.is_zero());
        let recent = before.and_then(|b| b.recent).filter(|_| from == self.since.unwrap_or(from));
        let pause = longest_pause(reads, from, recent);
        // By the propagation the mesh has stopped sending here (nothing more is expected), unless
        // an arrival came after it: then it is slower than that, and only the deadline ends.
        let late = last >= limits.propagation;
        let horizon = if late { limits.deadline } else { limits.propagation };
        let tries = horizon.saturating_sub(limits.from).as_secs_f64();
        let enough = |t: Duration| {
            quiet_enough(
                alpha,
                beta,
                t.saturating_sub(last).saturating_add(ago).as_secs_f64(),
                tries,
            )
        };
        // The silence asked only shrinks as it grows: halve to 10 ms.
        let (mut low, mut high) = (now.max(last), horizon.max(now).max(last));
        if !enough(high) {
            // A look may end far past the deadline (the hook descheduled): never before `last`.
            high = if late { limits.deadline.saturating_add(WINDOW).max(last) } else { high };
            low = high;
        }
        while high.saturating_sub(low) > Duration::from_millis(10) {
            let mid = low + (high - low) / 2;
            if enough(mid) { high = mid } else { low = mid }
        }
        let paused = last.saturating_add(pause.saturating_mul(2)).saturating_sub(ago).min(horizon);
        let end = high.max(paused);
        let secs = |s: f64| Duration::try_from_secs_f64(s).unwrap_or(WINDOW);
        let gap = if alpha > 0.0 { secs(beta / alpha) } else { WINDOW };
        Pace { gap, quiet: limits.floor.max(end.saturating_sub(last)) }
    }

    /// The arrivals' rate as a Gamma law's shape and rate (arrivals, seconds): what the counts
    /// from `from` to `now` saw, with what was remembered from before while they agree with it.
    fn rate(&self, reads: &[Sample], (from, now): (Duration, Duration)) -> (f64, f64) {
        let span = now.saturating_sub(from).as_secs_f64();
        let n: u64 = reads
            .iter()
            .map(|r| r.arrived.saturating_add(r.recounted))
            .fold(0, u64::saturating_add);
        let busy = reads.iter().filter(|r| r.arrived > 0).count() as f64;
        let all = reads.len() as f64;
        // Half a count more than seen, so that counts that all saw some still give a rate.
        let by_share = if busy > 0.0 { all * ((all + 0.5) / (all + 0.5 - busy)).ln() } else { 0.0 };
        let before = self.before.filter(|b| !b.span.is_zero());
        let (alpha, beta) = before.map_or((0.0, 0.0), |b| {
            let weight = b.span.as_secs_f64().min(PRIOR);
            (b.arrivals as f64 * weight / b.span.as_secs_f64(), weight)
        });
        // What was remembered counts while the counts agree with it, within five standard
        // deviations of what it expects (chance alone seldom goes further, and a rate told
        // from the counts alone only where it did would be told too high): a rate since then
        // far higher or lower is the rate now.
        let (n, expected) = ((n as f64).max(by_share), alpha / beta.max(f64::MIN_POSITIVE) * span);
        let agrees = (n - expected).abs() <= 5.0 * expected.max(1.0).sqrt() + 5.0;
        if agrees { (alpha + n, beta + span) } else { (n, span) }
    }
}

/// The longest pause between arrivals the counts `reads` saw since `from`, at least the one the
/// kernel remembered (`recent`: the newest arrival's age and the longest pause before it).
fn longest_pause(
    reads: &[Sample],
    from: Duration,
    recent: Option<(Duration, Duration)>,
) -> Duration {
    let mut pause = recent.map_or(Duration::ZERO, |r| r.1);
    let (mut seen, mut silent) = (None, false);
    for &Sample { at: t, arrived, .. } in reads {
        if arrived == 0 {
            silent = true;
            continue;
        }
        let gap = match seen {
            Some(was) if silent => t.saturating_sub(was),
            // A silence watched from the first count (or the window's start) up to an
            // arrival: a pause at least that long; longer by the newest arrival before.
            None if silent => {
                t.saturating_sub(from).saturating_add(recent.map_or(Duration::ZERO, |r| r.0))
            }
            _ => Duration::ZERO,
        };
        pause = pause.max(gap);
        (seen, silent) = (Some(t), false);
    }
    pause
}

/// Whether a hold ending after a silence of `s` seconds risks less than `RISK` of ending while
/// requests still come: arrivals at random at a rate told by `alpha` of them in `beta` seconds (a
/// Gamma law, which keeps the doubt a few arrivals leave), each silence before the end a try
/// (`tries` seconds of them). At a rate r a silence so long comes, while they still arrive, with
/// chance e^(-rs), at 1 + r * tries silences; over the law, E[(1 + r * tries) e^(-rs)] is
/// (1 + tries * alpha / (beta + s)) (beta / (beta + s))^alpha, compared here in logarithms.
fn quiet_enough(alpha: f64, beta: f64, s: f64, tries: f64) -> bool {
    let log = |x: f64| (1.0 + x).ln();
    alpha <= 0.0 || log(tries * alpha / (beta + s)) - alpha * log(s / beta) <= RISK.ln()
}

/// One count of `Rate`: when it ended, how many it saw arrive, and how many more it recounted.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    arrived: u64,
    recounted: u64,
}

/// `hold`: the new connections among the arrivals. From the propagation, none for the quiet
/// time their own rate asks while requests came on connections already open means kept-alive
/// clients: ones the mesh no longer sends here, which the app's shutdown hands over by closing
/// them (docs/holding.md, "Exit codes").
#[derive(Debug, Default)]
struct Opened {
    counter: Option<u64>,
    /// The end of the last count that told arrivals, where it told these too.
    told_at: Option<Duration>,
    rate: Rate,
    /// Whether a count after the last that saw a new connection saw requests arrive.
    reused: bool,
}

impl Opened {
    fn add(&mut self, now: Duration, (counter, arrived): (Option<u64>, u64), limits: &Limits) {
        self.told_at = counter.map(|_| now);
        let Some(n) = counter else { return };
        let new = self.counter.replace(n).map_or(0, |was| n.saturating_sub(was));
        self.reused = new == 0 && (self.reused || arrived > 0);
        self.rate.add(now, (new, 0), None, limits);
    }

    /// How long no new connection had come at the last count, where that is their quiet time
    /// at least and requests came on old ones since.
    fn stopped(&self, floor: Duration) -> Option<Duration> {
        if !self.reused {
            return None;
        }
        let quiet = self.rate.pace.map_or(floor, |p| p.quiet);
        let since = self.told_at?.saturating_sub(self.rate.last.unwrap_or(Duration::ZERO));
        (since >= quiet).then_some(since)
    }
}

/// `hold`'s end rule, which the wait asks at each count that told arrivals: when the last
/// arrival came and how long a silence after it ends the hold (`Rate`), and from the
/// propagation whether only kept-alive connections still carry requests (`Opened`).
#[derive(Debug, Default)]
pub(crate) struct Quiet {
    /// `--propagation`: by then the mesh has stopped sending here.
    propagation: Duration,
    rate: Rate,
    opened: Opened,
}

impl Quiet {
    pub(crate) fn new(propagation: Duration) -> Quiet {
        Quiet { propagation, ..Quiet::default() }
    }

    /// A count of `rules`' hold that ended at `now` and told arrivals (`arrived`, `recounted`,
    /// the newest `newest` ago, new connections `opened` so far; the first, what the source
    /// remembered from `before` it), the min-drain ending at `drain_done`: the arrivals' pace,
    /// once any arrived.
    pub(crate) fn count(
        &mut self,
        (rules, drain_done): (&Rules, Duration),
        now: Duration,
        (arrived, recounted): (u64, u64),
        (before, newest, opened): (Option<Before>, Option<Duration>, Option<u64>),
    ) -> Option<Pace> {
        let limits = Limits {
            floor: rules.settle,
            from: drain_done,
            propagation: self.propagation,
            deadline: rules.deadline,
        };
        if self.rate.since.is_none() {
            self.rate.before = before;
        }
        self.rate.add(now, (arrived, recounted), newest, &limits);
        // New connections still coming at the propagation are clients the mesh still sends
        // here, however few: their silence is tried up to the deadline, never cut at the
        // propagation as the arrivals' is.
        let late = Limits { propagation: limits.deadline, ..limits };
        self.opened.add(now, (opened, arrived), &late);
        self.rate.pace
    }

    /// The end of the quiet time after the last arrival, once any arrived.
    pub(crate) fn until(&self) -> Option<Duration> {
        let (pace, last) = self.rate.pace.zip(self.rate.last)?;
        Some(last.saturating_add(pace.quiet))
    }

    /// From the propagation on (and the min-drain's end, `from`): how long no new connection had
    /// come at the last count, where that is their quiet time at least (`floor`), so that only
    /// kept-alive clients still send.
    pub(crate) fn kept_alive(
        &self,
        floor: Duration,
        from: Duration,
        now: Duration,
    ) -> Option<Duration> {
        self.opened.stopped(floor).filter(|_| now >= self.propagation.max(from))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// What the kernel remembered: `n` arrivals in the minute before, the newest `newest` ms
    /// before the first count, the longest pause of the last 10 s `pause` ms.
    pub(crate) fn remembered(n: u64, newest: u64, pause: u64) -> Before {
        Before { arrivals: n, span: ms(60_000), recent: Some((ms(newest), ms(pause))) }
    }

    /// The limits of `hold`'s defaults (`--quiet` 500 ms, `--propagation` 15 s, `--deadline`
    /// 20 s), silences tried from `from` ms.
    fn limits(from: u64) -> Limits {
        Limits { floor: ms(500), from: ms(from), propagation: ms(15_000), deadline: ms(20_000) }
    }

    /// A `Rate` after counts (at ms, arrivals seen), the first remembering `before`.
    fn rate(counts: &[(u64, u64)], before: Option<Before>, limits: &Limits) -> Rate {
        let mut rate = Rate { before, ..Rate::default() };
        for &(t, n) in counts {
            rate.add(ms(t), (n, 0), None, limits);
        }
        rate
    }

    #[test]
    fn bursts_with_pauses_between_them_ask_for_twice_the_longest_pause() {
        // 50 requests in each of the counts at 0.5 s and 1 s, then none until 4 s, 50 again.
        let counts = [(0, 0), (500, 50), (1000, 50), (1500, 0), (2000, 0), (4000, 50)];
        let r = rate(&counts, None, &limits(0));
        let pace = r.pace.expect("arrivals seen");
        assert_eq!(pace.gap.as_millis(), 4000 / 150, "150 requests in 4 s");
        assert_eq!(pace.quiet, ms(6000), "twice the 3 s pause, more than the rate asks");
        // Only the window counts: a burst long gone no longer asks for anything; one arrival in
        // the 10 s since tells too little to end before the propagation.
        let r = rate(&[&counts[..], &[(14_000, 1)]].concat(), None, &limits(0));
        assert_eq!(r.pace.map(|p| p.quiet), Some(ms(1000)), "until 15 s");
    }

    #[test]
    fn a_count_that_ends_far_past_the_deadline_with_an_arrival_asks_a_quiet_time_not_a_panic() {
        // Found by an outside read: the hook descheduled, its count ending 40 s after a 20 s
        // deadline, having seen one more arrival. The silence asked is measured from that
        // arrival, never from before it.
        let r = rate(&[(0, 0), (500, 3), (60_000, 1)], None, &limits(0));
        assert!(r.pace.is_some_and(|p| p.quiet >= ms(500)), "{:?}", r.pace);
    }

    #[test]
    fn a_connection_busy_at_every_count_gives_a_rate_though_it_counts_once_a_count() {
        // The socket table's view of one kept-alive connection: bytes at every count, one arrival
        // each, 20 counts in 10 s. The count alone says a gap of 500 ms; that none of 20 counts
        // missed says less than 200 ms.
        let counts: Vec<(u64, u64)> = (0..=20).map(|i| (i * 500, u64::from(i > 0))).collect();
        let pace = rate(&counts, None, &limits(0)).pace.expect("arrivals seen");
        assert!(pace.gap < ms(200) && pace.quiet < ms(2500), "{pace:?}");
    }

    #[test]
    fn a_recount_of_what_the_table_saw_once_a_count_shortens_the_quiet_time_to_its_floor() {
        // The same connection at 40 requests a second, /clusters recounting each 2 s what the
        // table saw: the mean gap is 25 ms, the quiet time its floor.
        let mut rate = Rate::default();
        for i in 0..=20 {
            let recounted = if i % 4 == 0 { 76 } else { 0 };
            rate.add(ms(i * 500), (u64::from(i > 0), recounted), None, &limits(0));
        }
        let pace = rate.pace.expect("arrivals seen");
        assert!(pace.gap < ms(30) && pace.quiet == ms(500), "{pace:?}");
        // A recount after the arrivals stopped tells how many came then, and only shortens the
        // quiet time already running (behind a sidecar /clusters answers at its own pace: the
        // table's one arrival of a pooled connection alone would ask for the propagation).
        let mut sparse = Rate::default();
        for (t, n, again) in [(0, 0, 0), (500, 1, 0), (1000, 0, 0), (1500, 0, 40)] {
            sparse.add(ms(t), (n, again), None, &limits(0));
            if t == 1000 {
                let quiet = sparse.pace.map(|p| p.quiet);
                assert_eq!(quiet, Some(ms(14_500)), "one arrival: to the propagation");
            }
        }
        let quiet = sparse.pace.map(|p| p.quiet);
        assert!(quiet.is_some_and(|q| q < ms(2500)), "41 in 0.5 s: {quiet:?}");
        assert_eq!(sparse.last, Some(ms(500)), "the silence runs on from the last arrival");
    }

    #[test]
    fn a_pause_up_to_the_first_burst_counts_from_the_newest_arrival_before_the_hold() {
        // Bursts 3.5 s apart before the hold, the newest 200 ms before its first count; the next
        // burst 4 s after it: the pause up to it is 4.2 s, the quiet time twice that.
        let counts: Vec<(u64, u64)> = (0..8).map(|i| (i * 500, 0)).chain([(4000, 10)]).collect();
        let r = rate(&counts, Some(remembered(600, 200, 3500)), &limits(0));
        assert_eq!(r.pace.map(|p| p.quiet), Some(ms(8400)));
    }
}
