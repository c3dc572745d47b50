//! What a run tells a person, and when: the lines of what the wait saw and made of it (a count
//! worth a line, a change of source or pace, the app's exit), the progress a summary is made
//! from, and exactly one summary line, also when a signal cuts the wait short. Every sentence
//! comes from text.rs.

use crate::config::{Rules, RunConfig, Until};
use crate::count::{Basis, Count, SourceKind, Unit};
use crate::drain::Request;
use crate::error::Failure;
use crate::log::{Level, Logger};
use crate::outcome::{Outcome, Progress};
use crate::source::Reading;
use crate::source::admin::Reply;
use crate::source::sockets::{Pod, Reader};
use crate::text;
use crate::wait::{self, App, Cost, Seen};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Without a new count line for this long, a line says we are still waiting.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// A poisoned lock cannot happen with panic = "abort"; taking the value keeps this panic-free.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One run's log and progress, shared with the signal thread.
pub struct Report {
    log: Mutex<Logger>,
    progress: Mutex<Progress>,
    start: Instant,
    rules: Rules,
}

impl Report {
    pub fn new(log: Logger, start: Instant, rules: Rules) -> Report {
        Report { log: Mutex::new(log), progress: Mutex::new(Progress::default()), start, rules }
    }

    pub fn line(&self, level: Level, message: &str) {
        lock(&self.log).line(level, message);
    }

    /// A request's answer, in one line.
    pub fn posted(&self, r: Request, url: &str, answer: &Result<Reply, Failure>) {
        let (line, failed) = text::posted(r, url, answer);
        self.line(if failed { Level::Warn } else { Level::Info }, &line);
    }

    /// Writes the summary as the last line, unless one was written already; says whether it
    /// wrote.
    pub fn finish(&self, outcome: Outcome) -> bool {
        let mut log = lock(&self.log);
        if log.closed() {
            return false;
        }
        let level = match outcome {
            Outcome::Reached | Outcome::AppExited => Level::Info,
            Outcome::NothingCounted => Level::Error,
            Outcome::Deadline | Outcome::Interrupted(_) => Level::Warn,
        };
        // Timed once the logger is ours, so the line says when it was really written.
        let line = text::summary(
            outcome,
            self.start.elapsed(),
            &self.rules,
            &lock(&self.progress),
            log.dropped(),
        );
        log.end_live();
        log.last_line(level, &line);
        true
    }
}

/// Turns what the wait saw and made of it into log lines, and into the progress the summary is
/// made from.
pub struct Watch<'a> {
    report: &'a Report,
    cfg: &'a RunConfig,
    drained_at: Duration,
    /// The source and unit of the count in force, as the log last said.
    source: Option<(SourceKind, Unit)>,
    /// How the socket table last told Envoy's sockets apart, as the log last said.
    basis: Option<Basis>,
    line_at: Duration,
    /// Whether the last count line said that new ones were still arriving.
    arriving: bool,
    /// The time between counts, as the log last said (the interval until Envoy is slow).
    pace: Duration,
    /// Whether a look at the app alone (`--then-quit`) has been told of.
    app_told: bool,
}

impl<'a> Watch<'a> {
    pub fn new(report: &'a Report, cfg: &'a RunConfig, drained_at: Duration) -> Watch<'a> {
        Watch {
            report,
            cfg,
            drained_at,
            source: None,
            basis: None,
            line_at: Duration::ZERO,
            arriving: false,
            pace: cfg.rules.interval,
            app_told: false,
        }
    }

    /// A count and what the wait made of it: the pace when it changed, and the count's own lines.
    pub fn counted(
        &mut self,
        reading: Reading,
        seen: Seen,
        proc: &Reader,
        now: Duration,
        cost: Cost,
    ) {
        self.pace(cost);
        self.count(reading, seen.arrived, proc, now);
    }

    /// A look at the app alone, waiting for its exit: what holds the proxy, once.
    pub fn app(&mut self, app: App, pod: &Result<Pod, String>) {
        if self.app_told || app == App::Leaving {
            return;
        }
        self.app_told = true;
        match (app, pod) {
            (App::Running, Ok(p)) => {
                self.report.line(Level::Info, &text::waiting_for_app(&p.others))
            }
            (App::Unknown, Err(why)) => self.report.line(Level::Warn, &text::app_unknown(why)),
            _ => {}
        }
    }

    /// Says when the time between counts changes by half or more, and why: counts took long,
    /// or are quick again.
    fn pace(&mut self, cost: Cost) {
        let pace = wait::pause(self.cfg.rules.interval, cost.paced());
        let (low, high) = (self.pace.saturating_mul(2) / 3, self.pace.saturating_mul(3) / 2);
        if pace != self.pace && (pace <= low || pace >= high || pace == self.cfg.rules.interval) {
            let line = text::pace(pace, self.cfg.rules.interval, cost);
            self.report.line(Level::Info, &line);
            self.pace = pace;
        }
    }

    /// Records the reading and logs its count.
    fn count(&mut self, reading: Reading, arrived: bool, proc: &Reader, now: Duration) {
        // Progress first: a signal's summary must know what the log already says.
        let (before, failing) = {
            let mut p = lock(&self.report.progress);
            let before = (p.last.as_ref().map(|c| c.total), p.unknown.clone());
            if arrived {
                p.arrived_at = Some(now);
            }
            match &reading.result {
                Ok(count) => {
                    p.last = Some(count.clone());
                    p.unknown = None;
                }
                Err(why) => p.unknown = Some(why.clone()),
            }
            before
        };
        match &reading.result {
            Ok(count) => {
                let arriving = match self.cfg.rules.until {
                    Until::AtMost(n) => arrived && count.total <= n,
                    Until::Quiet => arrived,
                };
                let news = failing.is_some()
                    || before != Some(count.total)
                    || arriving != std::mem::replace(&mut self.arriving, arriving);
                self.lines(count, &reading, proc, news, arriving, now);
            }
            Err(why) => {
                if failing.as_deref() != Some(why.as_str()) {
                    self.report.line(Level::Warn, &text::cannot_count(why));
                }
            }
        }
    }

    /// The lines a count is worth: its warnings once, a change of source or of how Envoy's
    /// sockets are told apart, and the count itself when it is `news`, verbose or a heartbeat.
    fn lines(
        &mut self,
        count: &Count,
        reading: &Reading,
        proc: &Reader,
        news: bool,
        arriving: bool,
        now: Duration,
    ) {
        let mut log = lock(&self.report.log);
        for w in &count.warnings {
            log.warn_once(w);
        }
        let in_force = Some((count.source, count.unit));
        let changed_source = self.source != in_force;
        if changed_source
            && let Some((line, warn)) = text::switched(
                count,
                reading,
                self.cfg.counting.unit,
                proc,
                self.source.is_some(),
                self.cfg.rules.until == Until::Quiet,
            )
        {
            log.line(if warn { Level::Warn } else { Level::Info }, &line);
        }
        if count.basis.is_some() && count.basis != self.basis {
            if let Some(b) = &count.basis {
                let (line, degraded) = text::basis(b);
                log.line(if degraded { Level::Warn } else { Level::Info }, &line);
            }
            self.basis = count.basis.clone();
        }
        let worth_a_line = changed_source
            || news
            || self.cfg.verbose
            || now.saturating_sub(self.line_at) >= HEARTBEAT;
        let min_drain_end = wait::drain_done(&self.cfg.rules, self.drained_at);
        log.waiting(&text::count_line(count, arriving, now, min_drain_end, self.cfg), worth_a_line);
        drop(log);
        if worth_a_line {
            self.line_at = now;
        }
        self.source = in_force;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::RunArgs;
    use crate::count::Part;
    use crate::log::Out;
    use crate::log::testing::Sink;

    fn count(source: SourceKind, n: u64) -> Count {
        let name = match source {
            SourceKind::Stats => "0.0.0.0_15006",
            SourceKind::Proc => "port 15006",
            SourceKind::Clusters => "cluster inbound|8080||",
        };
        let part = Part { name: name.to_string(), active: n };
        Count::new(source, vec![part], vec![])
    }

    fn ok(c: Count, fallback: Option<&str>) -> Reading {
        Reading { result: Ok(c), fallback: fallback.map(str::to_string) }
    }

    fn unknown(why: &str) -> Reading {
        Reading { result: Err(why.to_string()), fallback: Some(why.to_string()) }
    }

    /// Feeds readings one second apart and returns the log and the last progress.
    fn watch(args: RunArgs, readings: Vec<Reading>) -> (String, Progress) {
        watch_costs(args, readings.into_iter().map(|r| (r, Cost::default())).collect())
    }

    /// Feeds readings, each with what its look cost, one second apart; returns the log and the
    /// last progress.
    fn watch_costs(args: RunArgs, looks: Vec<(Reading, Cost)>) -> (String, Progress) {
        let cfg = crate::config::run_config(&args, &|_| None).unwrap();
        let sink = Sink::default();
        let report = report_to(&sink, Duration::ZERO);
        let mut w = Watch::new(&report, &cfg, Duration::ZERO);
        let proc = Reader::Text { dir: "/proc/net".into(), why: None };
        for (i, (r, cost)) in looks.into_iter().enumerate() {
            let seen = Seen::default();
            w.counted(r, seen, &proc, Duration::from_secs(i as u64), cost);
        }
        let p = lock(&report.progress).clone();
        (sink.text(), p)
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
        assert_eq!(p.unknown.as_deref(), Some("stats: refused; proc: missing"));
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
            Count::requests(vec![part], vec![])
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
        c.warnings = vec!["gauge wrapped".to_string()];
        let (log, _) = watch(RunArgs::default(), vec![ok(c.clone(), None), ok(c, None)]);
        assert_eq!(log.matches("gauge wrapped").count(), 1, "{log}");
    }

    /// A run whose log goes to `sink`, started `ago`.
    fn report_to(sink: &Sink, ago: Duration) -> Report {
        let logger = Logger::new(Out::new(Box::new(sink.clone())), false);
        let rules = crate::config::run_config(&RunArgs::default(), &|_| None).unwrap().rules;
        Report::new(logger, Instant::now() - ago, rules)
    }

    #[test]
    fn the_summary_is_written_once_whoever_finishes_first() {
        let sink = Sink::default();
        let run = report_to(&sink, Duration::from_millis(1500));
        lock(&run.progress).last = Some(count(SourceKind::Stats, 2));
        // The signal thread's summary, then the wait's own end: only the first is written.
        assert!(run.finish(Outcome::Interrupted(libc::SIGTERM)));
        assert!(!run.finish(Outcome::Reached));
        let log = sink.text();
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
        let sink = Sink::default();
        let run = report_to(&sink, Duration::from_secs(secs));
        lock(&run.progress).last = last.map(|n| count(SourceKind::Proc, n));
        assert!(run.finish(outcome));
        sink.text()
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
