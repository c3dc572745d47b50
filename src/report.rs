//! What a run tells a person, and when: what the wait saw and made of it, and exactly one summary
//! line, also when a signal cuts the wait short. Every sentence comes from text.rs.

use crate::config::HookConfig;
use crate::count::{Basis, Busy, Cost, Count, SourceKind, Unit, Warning};
use crate::error::Failure;
use crate::log::{Format, Level, Logger};
use crate::outcome::{Outcome, Progress};
use crate::record::{self, Identity};
use crate::source::Reading;
use crate::source::sockets::{Pod, Reader};
use crate::text;
use crate::wait::{App, Seen};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Without a new count line for this long, a line says we are still waiting.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// One run's log and what it has said, shared with the signal thread.
pub(crate) struct Report {
    state: Mutex<Said>,
    start: Instant,
    cfg: HookConfig,
    who: Identity,
}

/// The log and what it has said, under one lock: a signal's summary knows what the log says.
struct Said {
    log: Logger,
    progress: Progress,
    /// The source and unit of the count in force.
    source: Option<(SourceKind, Unit)>,
    /// How the socket table told Envoy's sockets apart.
    basis: Option<Basis>,
    /// When the last count line was written, and whether it said requests were still arriving.
    line_at: Duration,
    arriving: bool,
    /// The time between counts (the interval until Envoy is slow).
    pace: Duration,
    /// Whether a look at the app alone (`--then-quit`) has been told of; its sockets at the last.
    app_told: bool,
    app: Option<BTreeMap<u32, u64>>,
    /// Said once each: parsers repeat theirs at every count.
    warned: HashSet<Warning>,
}

impl Report {
    pub(crate) fn new(log: Logger, start: Instant, cfg: &HookConfig, who: Identity) -> Report {
        let said = Said {
            log,
            progress: Progress::default(),
            source: None,
            basis: None,
            line_at: Duration::ZERO,
            arriving: false,
            pace: cfg.rules.interval,
            app_told: false,
            app: None,
            warned: HashSet::new(),
        };
        Report { state: Mutex::new(said), start, cfg: cfg.clone(), who }
    }

    /// A poisoned lock cannot happen with panic = "abort"; taking the value keeps this panic-free.
    fn said(&self) -> MutexGuard<'_, Said> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn line(&self, level: Level, message: &str) {
        self.said().log.line(level, message);
    }

    /// Writes the summary as the last line unless one was; says whether it wrote.
    pub(crate) fn finish(&self, outcome: Outcome) -> bool {
        let mut said = self.said();
        let level = match outcome {
            Outcome::Reached | Outcome::AppExited | Outcome::KeptAlive(_) => Level::Info,
            Outcome::NothingCounted | Outcome::NotEnvoy => Level::Error,
            Outcome::Deadline | Outcome::Interrupted(_) => Level::Warn,
        };
        // Timed once the lock is ours, so the line says when it was really written.
        let elapsed = self.start.elapsed();
        let line =
            text::summary(outcome, elapsed, &self.cfg.rules, &said.progress, said.log.dropped());
        let record = (said.log.format() == Format::Json).then(|| {
            let log = (said.log.dropped().0, said.log.warnings());
            record::members((outcome, elapsed), (&self.cfg, &said.progress, &self.who), log)
        });
        said.log.end_live();
        said.log.last_line(level, &line, record.as_deref().unwrap_or_default())
    }

    /// A look at the app alone, waiting for its exit: what holds the proxy, once.
    pub(crate) fn app(&self, app: App, pod: &Result<Pod, Failure>) {
        let mut said = self.said();
        said.app = pod.as_ref().ok().map(|p| p.owners.clone());
        if said.app_told || app == App::Leaving {
            return;
        }
        said.app_told = true;
        match (app, pod) {
            (App::Running, Ok(p)) => said.log.line(Level::Info, &text::waiting_for_app(&p.owners)),
            (App::Unknown, Err(why)) => said.log.line(Level::Warn, &text::app_unknown(why)),
            _ => {}
        }
    }

    /// A change of source or basis, said once: whether the source changed.
    fn switched(&self, said: &mut Said, reading: &Reading, count: &Count, proc: &Reader) -> bool {
        let in_force = Some((count.source, count.unit));
        let changed = said.source != in_force;
        let (plan, returning) = (&self.cfg.rules.plan, said.source.is_some());
        if changed
            && let Some((level, line)) =
                text::switched(count, reading, self.cfg.counting.unit, proc, returning, plan)
        {
            said.log.line(level, &line);
        }
        said.source = in_force;
        if let Some(b) = &count.basis
            && said.basis.as_ref() != Some(b)
        {
            let (level, line) = text::basis(b);
            said.log.line(level, &line);
            said.basis = Some(b.clone());
        }
        changed
    }

    /// `--then-quit` given up at the deadline, with the app's sockets at the last look.
    pub(crate) fn app_still_running(&self) {
        let mut said = self.said();
        let line = text::app_still_running(said.app.as_ref());
        said.log.line(Level::Warn, &line);
    }

    /// Tells a new pace where it changed by half or more, or came back to the interval.
    fn paced(&self, said: &mut Said, pace: Duration, cost: Cost) {
        let interval = self.cfg.rules.interval;
        let (low, high) = (said.pace.saturating_mul(2) / 3, said.pace.saturating_mul(3) / 2);
        if pace != said.pace && (pace <= low || pace >= high || pace == interval) {
            said.log.line(Level::Info, &text::pace(pace, interval, cost));
            said.pace = pace;
        }
    }

    /// A count at `now` and what the wait made of it: the pace when it changed by half or more,
    /// the count's warnings once, a change of source or basis, and the count itself when it is
    /// news, verbose or a heartbeat.
    pub(crate) fn counted(
        &self,
        reading: &Reading,
        seen: Seen,
        proc: &Reader,
        now: Duration,
        cost: Cost,
    ) {
        let mut said = self.said();
        self.paced(&mut said, seen.every, cost);
        let last_total = said.progress.last.as_ref().map(|c| c.total);
        let was_unknown = said.progress.unknown.take();
        if seen.arrived > 0 {
            said.progress.arrived_at = Some(now);
        }
        said.progress.pace = seen.pace.or(said.progress.pace);
        let count = match &reading.result {
            Ok(count) => count,
            Err(why) => {
                if was_unknown.as_ref() != Some(why) {
                    said.log.line(Level::Warn, &text::cannot_count(why));
                }
                said.progress.unknown = Some(why.clone());
                return;
            }
        };
        said.progress.last = Some(count.clone());
        for w in &count.warnings {
            if said.warned.insert(w.clone()) {
                said.log.line(Level::Warn, &w.to_string());
            }
        }
        let changed_source = self.switched(&mut said, reading, count, proc);
        let (arriving, low) = (seen.arrived > 0 && seen.low, seen.low);
        // A request awaiting its answer is told where it holds a count the threshold would end
        // (above it, the count says as much); an answer still on its way, always.
        let busy = seen.busy.map(|b| Busy { awaiting: if low { b.awaiting } else { 0 }, ..b });
        // Kept whatever else is news: a change of arrivals is news by itself.
        let was_arriving = std::mem::replace(&mut said.arriving, arriving);
        let was_busy = std::mem::replace(&mut said.progress.busy, busy);
        let news = was_unknown.is_some()
            || last_total != Some(count.total)
            || arriving != was_arriving
            || was_busy != busy;
        let worth_a_line = changed_source
            || news
            || self.cfg.verbose
            || now.saturating_sub(said.line_at) >= HEARTBEAT;
        let line = text::count_line(count, (arriving, busy), now, seen.drain_done, &self.cfg);
        said.log.waiting(&line, worth_a_line);
        if worth_a_line {
            said.line_at = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::RunArgs;
    use crate::count::COST_SPACING;
    use crate::count::{Count, Part};
    use crate::log::Out;
    use crate::log::testing::Captured;

    fn count(source: SourceKind, n: u64) -> Count {
        let name = match source {
            SourceKind::Stats => "0.0.0.0_15006",
            SourceKind::Proc => "port 15006",
            SourceKind::Clusters => "cluster inbound|8080||",
        };
        let part = Part { name: name.to_string(), active: n };
        Count::new(source, Unit::Connections, vec![part], vec![])
    }

    fn ok(c: Count, fallback: Option<&str>) -> Reading {
        Reading { result: Ok(c), fallback: fallback.map(Failure::from) }
    }

    fn unknown(why: &str) -> Reading {
        Reading {
            result: Err(Failure::from(why.to_string())),
            fallback: Some(Failure::from(why.to_string())),
        }
    }

    /// Feeds readings one second apart and returns the log and the last progress.
    fn watch(args: RunArgs, readings: Vec<Reading>) -> (String, Progress) {
        watch_costs(args, readings.into_iter().map(|r| (r, Cost::default())).collect())
    }

    /// Feeds readings, each with what its look cost, one second apart; returns the log and the
    /// last progress.
    fn watch_costs(args: RunArgs, looks: Vec<(Reading, Cost)>) -> (String, Progress) {
        let cfg = crate::run::config::run_config(&args, &|_| None).unwrap();
        let captured = Captured::default();
        let report = report_to(&captured, Duration::ZERO, &cfg);
        let proc = Reader::Text { dir: "/proc/net".into(), why: None };
        for (i, (r, cost)) in looks.into_iter().enumerate() {
            let now = Duration::from_secs(i as u64);
            // What the wait says of each count: its pace, the min-drain's end.
            let every = cfg.rules.interval.max(cost.paced().saturating_mul(COST_SPACING));
            let drain_done = crate::wait::drain_done(&cfg.rules, Duration::ZERO);
            let seen = Seen { every, drain_done, ..Seen::default() };
            report.counted(&r, seen, &proc, now, cost);
        }
        let p = report.said().progress.clone();
        (captured.text(), p)
    }

    #[test]
    fn the_pace_is_logged_when_long_counts_change_it_by_half_or_more() {
        let looks = [5, 250, 260, 400, 5, 6].map(|ms| {
            let cost = Cost {
                look: Duration::from_millis(ms),
                admin: Duration::from_millis(ms / 2),
                cpu: None,
            };
            (ok(count(SourceKind::Clusters, 1), None), cost)
        });
        let (text, _) = watch_costs(RunArgs::default(), looks.to_vec());
        let paces: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split('\t').nth(3))
            .filter(|m| m.starts_with("counting every"))
            .collect();
        assert_eq!(
            paces,
            [
                "counting every 5.0s instead of every 500ms: a count took 250ms (125ms of it \
                 Envoy's answers), and counting takes at most 1/20 of Envoy's main thread, which \
                 also runs its configuration, and of the proxy container's CPU",
                "counting every 8.0s instead of every 500ms: a count took 400ms (200ms of it \
                 Envoy's answers), and counting takes at most 1/20 of Envoy's main thread, which \
                 also runs its configuration, and of the proxy container's CPU",
                "counting every 500ms again: a count took 5ms (2ms of it Envoy's answers)",
            ]
        );
    }

    #[test]
    fn switching_to_proc_and_back_is_logged_once_each_way_with_the_reason() {
        let (log, _) = watch(
            RunArgs::default(),
            vec![
                ok(count(SourceKind::Stats, 3), None),
                ok(count(SourceKind::Proc, 3), Some("connection refused")),
                ok(count(SourceKind::Proc, 2), Some("connection refused")),
                ok(count(SourceKind::Stats, 2), None),
            ],
        );
        assert_eq!(log.matches("stats unavailable (connection refused); counting from /proc/net/tcp and tcp6 instead").count(), 1, "{log}");
        assert_eq!(log.matches("Envoy's stats answer again").count(), 1, "{log}");
    }

    #[test]
    fn an_unknown_count_is_none_is_logged_once_and_kept_for_the_summary() {
        let (log, p) = watch(
            RunArgs::default(),
            vec![
                ok(count(SourceKind::Stats, 1), None),
                unknown("stats: refused; proc: missing"),
                unknown("stats: refused; proc: missing"),
            ],
        );
        assert_eq!(log.matches("cannot count: stats: refused; proc: missing").count(), 1, "{log}");
        assert_eq!(p.last.map(|c| c.total), Some(1), "the last known count stays");
        assert_eq!(
            p.unknown.map(|f| f.to_string()).as_deref(),
            Some("stats: refused; proc: missing")
        );
    }

    #[test]
    fn an_unchanged_count_is_not_repeated_until_the_heartbeat() {
        let readings = (0..7).map(|_| ok(count(SourceKind::Stats, 2), None)).collect();
        let (log, _) = watch(RunArgs::default(), readings);
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 2, "first count, then a line after 5s: {log}");
        assert!(
            lines[1].ends_with("2 active connections (stats); 20.0s left before the deadline"),
            "{log}"
        );
    }

    #[test]
    fn verbose_logs_the_breakdown_at_every_count() {
        let readings = (0..3).map(|_| ok(count(SourceKind::Stats, 2), None)).collect();
        let (log, _) = watch(RunArgs { verbose: true, ..RunArgs::default() }, readings);
        assert_eq!(log.matches("listener 0.0.0.0_15006=2").count(), 3, "{log}");
        assert!(log.contains("min-drain ends in 4.0s"), "{log}");
    }

    #[test]
    fn a_request_count_that_falls_back_to_connections_says_which_count_is_in_force() {
        let args = RunArgs { count: Some("requests".to_string()), ..RunArgs::default() };
        let requests = || {
            let part = Part { name: "http inbound_0.0.0.0_8080".to_string(), active: 1 };
            Count::new(SourceKind::Stats, Unit::Requests, vec![part], vec![])
        };
        let no_rq = "Envoy does not report downstream_rq_active";
        let (log, p) = watch(
            args,
            vec![
                ok(requests(), None),
                ok(count(SourceKind::Stats, 2), Some(no_rq)),
                ok(count(SourceKind::Proc, 2), Some("connection refused")),
                ok(requests(), None),
            ],
        );
        let lines: Vec<&str> = log.lines().map(|l| l.split('\t').nth(3).unwrap()).collect();
        assert_eq!(
            lines,
            vec![
                "1 active request (stats); min-drain ends in 5.0s",
                "request stats unavailable (Envoy does not report downstream_rq_active); counting connections from Envoy's stats instead",
                "2 active connections (stats); min-drain ends in 4.0s",
                "stats unavailable (connection refused); counting connections from /proc/net/tcp and tcp6 instead",
                "2 active connections (proc); min-drain ends in 3.0s",
                "Envoy's stats report requests again; counting requests",
                "1 active request (stats); min-drain ends in 2.0s",
            ]
        );
        assert_eq!(p.last.map(|c| c.describe()), Some("1 active request".to_string()));
    }

    #[test]
    fn the_min_drain_a_count_line_tells_of_is_the_one_the_wait_keeps() {
        // A min-drain as long as the deadline ends one interval before it, so that a count can
        // still end the wait: the line once said 1.0s, and the wait ended after 0.5s.
        let args = RunArgs {
            deadline: Some("1s".to_string()),
            min_drain: Some("1s".to_string()),
            ..RunArgs::default()
        };
        let (log, _) = watch(args, vec![ok(count(SourceKind::Proc, 0), None)]);
        assert!(log.contains("0 active connections (proc); min-drain ends in 0.5s"), "{log}");
    }

    #[test]
    fn parser_warnings_are_logged_once_per_run() {
        let mut c = count(SourceKind::Stats, 0);
        let wrapped = Warning::Wrapped { n: 1, first: "listener.x".to_string() };
        c.warnings = vec![wrapped.clone(), wrapped, Warning::Unseen];
        let (log, _) = watch(RunArgs::default(), vec![ok(c.clone(), None), ok(c, None)]);
        assert_eq!(log.matches("1 gauge wrapped below zero").count(), 1, "{log}");
        assert_eq!(log.matches("PassiveOpens").count(), 1, "{log}");
    }

    /// A run configured as `cfg` whose log goes to `captured`, started `ago`.
    fn report_to(captured: &Captured, ago: Duration, cfg: &HookConfig) -> Report {
        let logger = Logger::new(Out::new(Box::new(captured.clone())), false);
        Report::new(logger, Instant::now() - ago, cfg, Identity { pod: None, namespace: None })
    }

    fn run_defaults() -> HookConfig {
        crate::run::config::run_config(&RunArgs::default(), &|_| None).unwrap()
    }

    #[test]
    fn the_summary_is_written_once_whoever_finishes_first() {
        let captured = Captured::default();
        let run = report_to(&captured, Duration::from_millis(1500), &run_defaults());
        run.said().progress.last = Some(count(SourceKind::Stats, 2));
        // The signal thread's summary, then the wait's own end: only the first is written.
        assert!(run.finish(Outcome::Interrupted(libc::SIGTERM)));
        assert!(!run.finish(Outcome::Reached));
        let log = captured.text();
        assert_eq!(log.lines().count(), 1, "{log}");
        let line = log.lines().next().unwrap();
        assert!(line.contains("\twarn\tenvoy-drain\t"), "{line}");
        assert!(
            line.ends_with("interrupted by SIGTERM after 1.5s with 2 active connections (stats): listener 0.0.0.0_15006=2"),
            "stated elapsed time from the run's start: {line}"
        );
    }

    /// The summary of a run started `secs` ago that ended with `outcome` after counting `last`.
    fn summary(secs: u64, last: Option<u64>, outcome: Outcome) -> String {
        let captured = Captured::default();
        let run = report_to(&captured, Duration::from_secs(secs), &run_defaults());
        run.said().progress.last = last.map(|n| count(SourceKind::Proc, n));
        assert!(run.finish(outcome));
        captured.text()
    }

    #[test]
    fn a_run_the_apps_exit_ended_says_so_and_what_it_left_open() {
        let none = summary(3, None, Outcome::AppExited);
        let one = summary(3, Some(1), Outcome::AppExited);
        let done = "\tinfo\tenvoy-drain\tdone after 3.0s: the app has exited";
        assert!(none.ends_with(&format!("{done}; the proxy may stop now\n")), "{none}");
        assert!(
            one.ends_with(&format!(
                "{done}, which leaves nothing to answer the 1 active connection (proc) still \
                 open; the proxy may stop now\n"
            )),
            "{one}"
        );
    }

    #[test]
    fn a_run_that_reached_zero_ends_with_an_info_line() {
        let log = summary(7, Some(0), Outcome::Reached);
        assert!(
            log.ends_with("\tinfo\tenvoy-drain\tdone after 7.0s: 0 active connections (proc); the proxy may stop now\n"),
            "{log}"
        );
    }
}
