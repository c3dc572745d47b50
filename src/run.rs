//! The `run` command: its configuration, logger and signals; the drain, the wait and, with
//! --then-quit, the agent's /quitquitquit; and exactly one summary line, also when a signal cuts
//! the wait short. Every sentence comes from text.rs.

use crate::cli::{RunArgs, usage_error};
use crate::config::{self, AGENT_DRAIN_PATH, Drain, RunConfig};
use crate::count::{Arrivals, Basis, Count, SourceKind, Unit};
use crate::log::{Level, Logger};
use crate::outcome::{EXIT_REACHED, Outcome, Progress};
use crate::source::admin::{Client, HEALTHCHECK_FAIL_PATH};
use crate::source::sockets::{Pod, Reader};
use crate::source::{Reading, Sources};
use crate::text;
use crate::wait::{self, App, Clock, Tick};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Without a new count line for this long, a line says we are still waiting.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// A poisoned lock cannot happen with panic = "abort"; taking the value keeps this panic-free.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The command. `start` is when the process started: the deadline counts from it. `env` looks
/// up an environment variable (MINIMUM_DRAIN_DURATION).
pub fn command(args: &RunArgs, env: &dyn Fn(&str) -> Option<String>, start: Instant) -> i32 {
    let cfg = match config::run_config(args, env) {
        Ok(c) => c,
        Err(e) => return usage_error(&e.to_string()),
    };
    let mut logger = Logger::stderr();
    if let Some(path) = &cfg.log_file {
        logger.add_file(path);
    }
    let run = Arc::new(Run::new(logger, start, cfg.rules.deadline));
    let on_signal = Arc::clone(&run);
    let caught = crate::signals::on_interrupt(move |sig| {
        let outcome = Outcome::Interrupted(sig);
        // When the wait has just ended, its own summary and exit code stand.
        if on_signal.finish(outcome) {
            std::process::exit(outcome.exit_code());
        }
    });
    if !caught {
        lock(&run.log).warn(text::SIGNALS_NOT_TAKEN);
    }
    let outcome = run.wait(&cfg);
    run.finish(outcome);
    outcome.exit_code()
}

/// `run` with the kill switch set: one line, and done.
pub fn disabled(setting: &str) -> i32 {
    Logger::stderr().info(&text::disabled(setting));
    EXIT_REACHED
}

/// One run, shared with the signal thread: the log, what has been counted so far, and whether
/// the summary has been written.
pub struct Run {
    log: Mutex<Logger>,
    progress: Mutex<Progress>,
    finished: AtomicBool,
    start: Instant,
    deadline: Duration,
}

struct RealClock(Instant);

impl Clock for RealClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
    fn sleep(&mut self, d: Duration) {
        std::thread::sleep(d);
    }
}

impl Run {
    pub fn new(log: Logger, start: Instant, deadline: Duration) -> Run {
        Run {
            log: Mutex::new(log),
            progress: Mutex::new(Progress::default()),
            finished: AtomicBool::new(false),
            start,
            deadline,
        }
    }

    /// Drains, waits and, with --then-quit, asks the agent to stop the proxy. The summary is
    /// left to `finish`, which a signal may call first.
    pub fn wait(&self, cfg: &RunConfig) -> Outcome {
        let mut sources = Sources::new(&cfg.counting);
        let mut clock = RealClock(self.start);
        let left = |clock: &RealClock| cfg.rules.deadline.saturating_sub(clock.now());
        for w in &cfg.warnings {
            lock(&self.log).warn(w);
        }
        lock(&self.log).info(&text::start_line(cfg, &sources));
        if cfg.fail_healthcheck {
            self.post(
                &sources.admin,
                HEALTHCHECK_FAIL_PATH,
                left(&clock),
                "Envoy fails its health checks now (/ready answers 503)",
                "fail Envoy's health checks (draining anyway)",
            );
        }
        if let Some(path) = cfg.drain.path() {
            let done = "Envoy accepted the drain";
            self.post(
                &sources.admin,
                path,
                left(&clock),
                done,
                "drain listeners (waiting anyway)",
            );
        }
        if cfg.drain == Drain::Agent {
            let done = "the Istio agent accepted the drain";
            let what = "ask the Istio agent to drain (waiting anyway)";
            self.post(
                &Client::new(cfg.agent),
                AGENT_DRAIN_PATH,
                left(&clock),
                done,
                what,
            );
        }
        let mut watch = Watch::new(&self.log, &self.progress, cfg, clock.now());
        let outcome = wait::wait(&cfg.rules, watch.drained_at, &mut clock, |left| {
            let asked = Instant::now();
            let (reading, pod) = sources.tick(left);
            let cost = Cost {
                look: asked.elapsed(),
                admin: sources.admin_time(),
            };
            watch.observe(reading, pod, sources.reader(), self.start.elapsed(), cost)
        });
        let quit = match outcome {
            Outcome::AppExited => true,
            Outcome::Reached => {
                cfg.quit_agent.is_some()
                    && self.app_gone(&mut sources, &mut watch.follow, cfg, &mut clock)
            }
            _ => false,
        };
        if quit && let Some(agent) = cfg.quit_agent {
            let done = "asked the Istio agent to stop the proxy now";
            let what = "ask the Istio agent to stop the proxy";
            self.post(
                &Client::new(agent),
                "/quitquitquit",
                left(&clock),
                done,
                what,
            );
        }
        outcome
    }

    /// With --then-quit, once the count is reached: waits until the app has exited, as the
    /// socket table shows it (an app that is still shutting down may still call out through the
    /// proxy). Looks every interval until the deadline; false when the app is still there or
    /// unknown then, or was never seen (an app without sockets cannot be told from one that has
    /// exited).
    fn app_gone(
        &self,
        sources: &mut Sources,
        follow: &mut Follow,
        cfg: &RunConfig,
        clock: &mut RealClock,
    ) -> bool {
        let mut said = false;
        loop {
            let left = cfg.rules.deadline.saturating_sub(clock.now());
            let pod = sources.pod(left);
            let app = follow.app(&pod);
            let others = pod.as_ref().ok().map(|p| &p.others);
            match (app, &pod) {
                (App::Gone, _) => return true,
                (App::NotSeen, _) => {
                    lock(&self.log).warn(text::APP_NOT_SEEN);
                    return false;
                }
                (App::Running, Ok(p)) if !said => {
                    lock(&self.log).info(&text::waiting_for_app(&p.others))
                }
                (App::Unknown, Err(why)) if !said => lock(&self.log).warn(&text::app_unknown(why)),
                _ => {}
            }
            said |= app != App::Leaving;
            let left = cfg.rules.deadline.saturating_sub(clock.now());
            let pause = if app == App::Leaving {
                wait::RECHECK
            } else {
                cfg.rules.interval
            };
            if left <= pause {
                lock(&self.log).warn(&text::app_still_running(others));
                return false;
            }
            clock.sleep(pause);
        }
    }

    /// Writes the summary as the last line, unless one was written already; says whether it
    /// wrote.
    pub fn finish(&self, outcome: Outcome) -> bool {
        if self.finished.swap(true, Ordering::SeqCst) {
            return false;
        }
        let level = match outcome {
            Outcome::Reached | Outcome::AppExited => Level::Info,
            Outcome::NothingCounted => Level::Error,
            Outcome::Deadline | Outcome::Interrupted(_) => Level::Warn,
        };
        let mut log = lock(&self.log);
        // Timed once the logger is ours, so the line says when it was really written.
        let line = text::summary(
            outcome,
            self.start.elapsed(),
            self.deadline,
            &lock(&self.progress),
            log.dropped(),
        );
        log.end_live();
        log.last_line(level, &line);
        true
    }

    /// One POST, one log line: `done` on a 200, else the failure to do `what`. Whatever happens,
    /// the hook goes on.
    fn post(&self, client: &Client, path: &str, left: Duration, done: &str, what: &str) {
        let url = client.url(path);
        match client.post(path, left) {
            Ok(r) if r.status == 200 => lock(&self.log).info(&text::posted(done, &url, &r)),
            Ok(r) => lock(&self.log).warn(&text::post_failed(
                what,
                &url,
                &format!("answered {}", r.describe()),
            )),
            Err(f) => lock(&self.log).warn(&text::post_failed(what, &url, &f.cause)),
        }
    }
}

/// Turns readings into log lines and into the progress the summary is made from.
struct Watch<'a> {
    log: &'a Mutex<Logger>,
    progress: &'a Mutex<Progress>,
    cfg: &'a RunConfig,
    drained_at: Duration,
    /// The source and unit of the count in force, as the log last said.
    source: Option<(SourceKind, Unit)>,
    /// How the socket table last told Envoy's sockets apart, as the log last said.
    basis: Option<Basis>,
    line_at: Duration,
    follow: Follow,
    /// Whether the last count line said that new ones were still arriving.
    arriving: bool,
    /// The time between counts, as the log last said (the interval until Envoy is slow).
    pace: Duration,
}

/// What one look took: all of it, and the part spent waiting on Envoy's admin API.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cost {
    pub look: Duration,
    pub admin: Duration,
}

/// Follows the app and what arrives, from one look at the pod to the next.
#[derive(Debug, Default)]
struct Follow {
    app_seen: bool,
    /// The last look found none of the app's sockets.
    app_missing: bool,
    /// The last known request counter.
    requests: Arrivals,
}

impl Follow {
    /// What this look says of the app.
    fn app(&mut self, pod: &Result<Pod, String>) -> App {
        let missing = match pod {
            Err(_) => {
                self.app_missing = false;
                return App::Unknown;
            }
            Ok(p) => p.others.is_empty(),
        };
        let was_missing = std::mem::replace(&mut self.app_missing, missing);
        match (missing, self.app_seen, was_missing) {
            (false, ..) => {
                self.app_seen = true;
                App::Running
            }
            (true, false, _) => App::NotSeen,
            (true, true, false) => App::Leaving,
            (true, true, true) => App::Gone,
        }
    }

    /// Whether a request arrived since the last count that could tell.
    fn arrived(&mut self, count: Option<&Count>) -> bool {
        match count.map(|c| c.arrivals) {
            Some(now @ Arrivals::Requests(_)) => {
                now.since(std::mem::replace(&mut self.requests, now))
            }
            _ => false,
        }
    }
}

impl<'a> Watch<'a> {
    fn new(
        log: &'a Mutex<Logger>,
        progress: &'a Mutex<Progress>,
        cfg: &'a RunConfig,
        drained_at: Duration,
    ) -> Watch<'a> {
        Watch {
            log,
            progress,
            cfg,
            drained_at,
            source: None,
            basis: None,
            line_at: Duration::ZERO,
            follow: Follow::default(),
            arriving: false,
            pace: cfg.rules.interval,
        }
    }

    /// Records the look, says what is worth saying, and gives the wait what it needs.
    fn observe(
        &mut self,
        reading: Reading,
        pod: Result<Pod, String>,
        proc: &Reader,
        now: Duration,
        cost: Cost,
    ) -> Tick {
        self.pace(cost);
        let app = self.follow.app(&pod);
        let arrived = self.follow.arrived(reading.result.as_ref().ok());
        if app == App::Gone {
            lock(self.log).info(text::APP_EXITED);
        }
        Tick {
            count: self.count(reading, arrived, proc, now),
            arrived,
            app,
            cost: cost.look,
        }
    }

    /// Says when the time between counts changes by half or more, and why: counts took long,
    /// or are quick again.
    fn pace(&mut self, cost: Cost) {
        let pace = wait::pause(self.cfg.rules.interval, cost.look);
        let (low, high) = (
            self.pace.saturating_mul(2) / 3,
            self.pace.saturating_mul(3) / 2,
        );
        if pace != self.pace && (pace <= low || pace >= high || pace == self.cfg.rules.interval) {
            lock(self.log).info(&text::pace(pace, self.cfg.rules.interval, cost));
            self.pace = pace;
        }
    }

    /// Records the reading and logs its count.
    fn count(
        &mut self,
        reading: Reading,
        arrived: bool,
        proc: &Reader,
        now: Duration,
    ) -> Option<u64> {
        // Progress first: a signal's summary must know what the log already says.
        let (before, failing) = {
            let mut p = lock(self.progress);
            let before = (p.last.as_ref().map(|c| c.total), p.unknown.clone());
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
                let arriving = arrived && count.total <= self.cfg.rules.exit_at;
                let news = failing.is_some()
                    || before != Some(count.total)
                    || arriving != std::mem::replace(&mut self.arriving, arriving);
                self.counted(count, &reading, proc, news, arriving, now);
                Some(count.total)
            }
            Err(why) => {
                if failing.as_deref() != Some(why.as_str()) {
                    lock(self.log).warn(&text::cannot_count(why));
                }
                None
            }
        }
    }

    /// The lines a count is worth: its warnings once, a change of source or of how Envoy's
    /// sockets are told apart, and the count itself when it is `news`, verbose or a heartbeat.
    fn counted(
        &mut self,
        count: &Count,
        reading: &Reading,
        proc: &Reader,
        news: bool,
        arriving: bool,
        now: Duration,
    ) {
        let mut log = lock(self.log);
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
        let min_drain_end = self.drained_at.saturating_add(self.cfg.rules.min_drain);
        log.waiting(
            &text::count_line(count, arriving, now, min_drain_end, self.cfg),
            worth_a_line,
        );
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
        let part = Part {
            name: name.to_string(),
            active: n,
        };
        Count::new(source, vec![part], vec![])
    }

    fn ok(c: Count, fallback: Option<&str>) -> Reading {
        Reading {
            result: Ok(c),
            fallback: fallback.map(str::to_string),
        }
    }

    fn unknown(why: &str) -> Reading {
        Reading {
            result: Err(why.to_string()),
            fallback: Some(why.to_string()),
        }
    }

    /// Feeds readings one second apart and returns the log and the last progress.
    fn watch(readings: Vec<Reading>, verbose: bool) -> (String, Progress, Vec<Option<u64>>) {
        watch_with(
            RunArgs {
                verbose,
                ..RunArgs::default()
            },
            readings,
        )
    }

    fn watch_with(args: RunArgs, readings: Vec<Reading>) -> (String, Progress, Vec<Option<u64>>) {
        let looks = readings.into_iter().map(|r| (r, Cost::default())).collect();
        let (log, progress, ticks) = watch_costs(args, looks);
        (log, progress, ticks.iter().map(|t| t.count).collect())
    }

    /// Feeds readings, each with what its look cost, one second apart; returns the log, the last
    /// progress and the ticks.
    fn watch_costs(args: RunArgs, looks: Vec<(Reading, Cost)>) -> (String, Progress, Vec<Tick>) {
        let cfg = crate::config::run_config(&args, &|_| None).unwrap();
        let sink = Sink::default();
        let log = Mutex::new(Logger::new(Out::new(Box::new(sink.clone())), false));
        let progress = Mutex::new(Progress::default());
        let mut w = Watch::new(&log, &progress, &cfg, Duration::ZERO);
        let proc = Reader::Text {
            dir: "/proc/net".into(),
            why: None,
        };
        let ticks = looks
            .into_iter()
            .enumerate()
            .map(|(i, (r, cost))| {
                let table = Err("not read in this test".to_string());
                w.observe(r, table, &proc, Duration::from_secs(i as u64), cost)
            })
            .collect();
        let p = lock(&progress).clone();
        (sink.text(), p, ticks)
    }

    #[test]
    fn the_pace_is_logged_when_long_counts_change_it_by_half_or_more() {
        let looks = [5, 250, 260, 400, 5, 6].map(|ms| {
            let cost = Cost {
                look: Duration::from_millis(ms),
                admin: Duration::from_millis(ms / 2),
            };
            (ok(count(SourceKind::Clusters, 1), None), cost)
        });
        let (text, _, ticks) = watch_costs(RunArgs::default(), looks.to_vec());
        for (tick, (_, cost)) in ticks.iter().zip(&looks) {
            assert_eq!(tick.cost, cost.look, "the wait paces by it");
        }
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
        let (log, _, totals) = watch(
            vec![
                ok(count(SourceKind::Stats, 3), None),
                ok(count(SourceKind::Proc, 3), Some("connection refused")),
                ok(count(SourceKind::Proc, 2), Some("connection refused")),
                ok(count(SourceKind::Stats, 2), None),
            ],
            false,
        );
        assert_eq!(totals, vec![Some(3), Some(3), Some(2), Some(2)]);
        assert_eq!(log.matches("stats unavailable (connection refused); counting from /proc/net/tcp and tcp6 instead").count(), 1, "{log}");
        assert_eq!(
            log.matches("Envoy's stats answer again").count(),
            1,
            "{log}"
        );
    }

    #[test]
    fn an_unknown_count_is_none_is_logged_once_and_kept_for_the_summary() {
        let (log, p, totals) = watch(
            vec![
                ok(count(SourceKind::Stats, 1), None),
                unknown("stats: refused; proc: missing"),
                unknown("stats: refused; proc: missing"),
            ],
            false,
        );
        assert_eq!(totals, vec![Some(1), None, None]);
        assert_eq!(
            log.matches("cannot count: stats: refused; proc: missing")
                .count(),
            1,
            "{log}"
        );
        assert_eq!(
            p.last.map(|c| c.total),
            Some(1),
            "the last known count stays"
        );
        assert_eq!(p.unknown.as_deref(), Some("stats: refused; proc: missing"));
    }

    #[test]
    fn an_unchanged_count_is_not_repeated_until_the_heartbeat() {
        let readings = (0..7)
            .map(|_| ok(count(SourceKind::Stats, 2), None))
            .collect();
        let (log, _, _) = watch(readings, false);
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 2, "first count, then a line after 5s: {log}");
        assert!(
            lines[1].ends_with("2 active connections (stats); 20.0s left before the deadline"),
            "{log}"
        );
    }

    #[test]
    fn verbose_logs_the_breakdown_at_every_count() {
        let readings = (0..3)
            .map(|_| ok(count(SourceKind::Stats, 2), None))
            .collect();
        let (log, _, _) = watch(readings, true);
        assert_eq!(log.matches("listener 0.0.0.0_15006=2").count(), 3, "{log}");
        assert!(log.contains("min-drain ends in 4.0s"), "{log}");
    }

    #[test]
    fn a_request_count_that_falls_back_to_connections_says_which_count_is_in_force() {
        let args = RunArgs {
            count: Some("requests".to_string()),
            ..RunArgs::default()
        };
        let requests = || {
            let part = Part {
                name: "http inbound_0.0.0.0_8080".to_string(),
                active: 1,
            };
            Count::requests(vec![part], vec![])
        };
        let no_rq = "Envoy does not report downstream_rq_active";
        let (log, p, _) = watch_with(
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
        assert_eq!(
            p.last.map(|c| c.describe()),
            Some("1 active request".to_string())
        );
    }

    #[test]
    fn parser_warnings_are_logged_once_per_run() {
        let mut c = count(SourceKind::Stats, 0);
        c.warnings = vec!["gauge wrapped".to_string()];
        let (log, _, _) = watch(vec![ok(c.clone(), None), ok(c, None)], false);
        assert_eq!(log.matches("gauge wrapped").count(), 1, "{log}");
    }

    /// A run whose log goes to `sink`, started `ago`.
    fn run_logging_to(sink: &Sink, ago: Duration) -> Run {
        let logger = Logger::new(Out::new(Box::new(sink.clone())), false);
        Run::new(logger, Instant::now() - ago, Duration::from_secs(25))
    }

    #[test]
    fn the_summary_is_written_once_whoever_finishes_first() {
        let sink = Sink::default();
        let run = run_logging_to(&sink, Duration::from_millis(1500));
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

    #[test]
    fn a_run_the_apps_exit_ended_says_so_and_what_it_left_open() {
        let sink = Sink::default();
        let run = run_logging_to(&sink, Duration::from_secs(3));
        assert!(run.finish(Outcome::AppExited));
        let sink2 = Sink::default();
        let run2 = run_logging_to(&sink2, Duration::from_secs(3));
        lock(&run2.progress).last = Some(count(SourceKind::Proc, 1));
        assert!(run2.finish(Outcome::AppExited));
        assert!(
            sink.text().contains(
                "\tinfo\tenvoy-drain\tdone after 3.0s: the app has exited; the proxy may stop now"
            ),
            "{}",
            sink.text()
        );
        assert!(
            sink2.text().contains("\tinfo\tenvoy-drain\tdone after 3.0s: the app has exited, which leaves nothing to answer the 1 active connection (proc) still open; the proxy may stop now"),
            "{}",
            sink2.text()
        );
    }

    #[test]
    fn a_run_that_reached_zero_ends_with_an_info_line() {
        let sink = Sink::default();
        let run = run_logging_to(&sink, Duration::from_secs(7));
        lock(&run.progress).last = Some(count(SourceKind::Proc, 0));
        assert!(run.finish(Outcome::Reached));
        let log = sink.text();
        assert!(
            log.contains("\tinfo\tenvoy-drain\tdone after 7.0s: 0 active connections (proc); the proxy may stop now"),
            "{log}"
        );
    }

    fn pod(others: &[(u32, u64)]) -> Result<Pod, String> {
        Ok(Pod {
            others: others.iter().copied().collect(),
        })
    }

    #[test]
    fn the_app_is_gone_only_after_it_was_seen_and_then_missed_twice_in_a_row() {
        let mut f = Follow::default();
        let apps: Vec<App> = [
            pod(&[]),
            pod(&[(1000, 2)]),
            pod(&[]),
            pod(&[(1000, 1)]),
            pod(&[]),
            Err("dump failed".to_string()),
            pod(&[]),
            pod(&[]),
        ]
        .iter()
        .map(|p| f.app(p))
        .collect();
        assert_eq!(
            apps,
            vec![
                App::NotSeen,
                App::Running,
                App::Leaving,
                App::Running,
                App::Leaving,
                App::Unknown,
                App::Leaving,
                App::Gone
            ]
        );
    }

    #[test]
    fn a_request_counter_that_moved_is_an_arrival() {
        let mut f = Follow::default();
        let requests = |n| {
            Count::of(SourceKind::Clusters, Unit::Requests, vec![], vec![])
                .with_arrivals(Arrivals::Requests(n))
        };
        assert!(
            !f.arrived(Some(&requests(40))),
            "the first count has nothing to compare"
        );
        assert!(!f.arrived(Some(&requests(40))), "no new request");
        assert!(
            f.arrived(Some(&requests(41))),
            "a request, on a kept connection or a new one"
        );
        assert!(!f.arrived(None), "an unknown count tells nothing");
        let stats = Count::new(SourceKind::Stats, vec![], vec![]);
        assert!(!f.arrived(Some(&stats)), "stats cannot tell");
        assert!(
            !f.arrived(Some(&requests(41))),
            "compared with the last counter"
        );
        assert!(f.arrived(Some(&requests(3))), "a restarted Envoy's counter");
    }
}
