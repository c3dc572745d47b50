//! The `run` command: drain Envoy, wait for its connections to close or the deadline to pass,
//! report, and (with --then-quit) tell the Istio agent to stop the proxy.

use crate::admin::Client;
use crate::config::{AGENT_DRAIN_PATH, Drain, Mode, RunConfig};
use crate::count::{Basis, Count, SourceKind, Unit};
use crate::log::{Level, Logger};
use crate::outcome::{self, Outcome, Progress, seconds};
use crate::source::{Reading, Sources};
use crate::wait::{self, Clock};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Without a new count line for this long, a line says we are still waiting.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// A poisoned lock cannot happen with panic = "abort"; taking the value keeps this panic-free.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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

/// Drains, waits and reports. `start` is when the process started: the deadline counts from it.
/// The final summary line is left to the caller, which also prints it on a signal.
pub fn run(
    cfg: &RunConfig,
    log: &Mutex<Logger>,
    progress: &Mutex<Progress>,
    start: Instant,
) -> Outcome {
    let mut sources = Sources::new(&cfg.counting);
    let mut clock = RealClock(start);
    let left = |clock: &RealClock| cfg.rules.deadline.saturating_sub(clock.now());
    for w in &cfg.warnings {
        lock(log).warn(w);
    }
    lock(log).info(&start_line(cfg, &sources));
    if let Some(path) = cfg.drain.path() {
        let (done, what) = (
            "Envoy accepted the drain",
            "drain listeners (waiting anyway)",
        );
        post(&sources.admin, path, left(&clock), log, done, what);
    }
    if cfg.drain == Drain::Agent {
        let (done, what) = (
            "the Istio agent accepted the drain",
            "ask the Istio agent to drain (waiting anyway)",
        );
        let agent = Client::new(cfg.agent);
        post(&agent, AGENT_DRAIN_PATH, left(&clock), log, done, what);
    }
    let mut watch = Watch::new(log, progress, cfg, sources.proc_names(), clock.now());
    let outcome = wait::wait(&cfg.rules, watch.drained_at, &mut clock, |left| {
        watch.observe(sources.count(left), start.elapsed())
    });
    if outcome == Outcome::Reached
        && let Some(agent) = cfg.quit_agent
    {
        let done = "asked the Istio agent to stop the proxy now";
        let what = "ask the Istio agent to stop the proxy";
        post(
            &Client::new(agent),
            "/quitquitquit",
            left(&clock),
            log,
            done,
            what,
        );
    }
    outcome
}

/// Set by the first summary: a signal that arrives as the wait ends must not add a second one.
static SUMMARY_WRITTEN: AtomicBool = AtomicBool::new(false);

/// Writes the summary as the last line, unless one was written already; says whether it wrote.
pub fn finish(
    outcome: Outcome,
    log: &Mutex<Logger>,
    progress: &Mutex<Progress>,
    start: Instant,
    deadline: Duration,
) -> bool {
    if SUMMARY_WRITTEN.swap(true, Ordering::SeqCst) {
        return false;
    }
    let level = match outcome {
        Outcome::Reached => Level::Info,
        Outcome::NothingCounted => Level::Error,
        Outcome::Deadline | Outcome::Interrupted(_) => Level::Warn,
    };
    let mut log = lock(log);
    // Timed once the logger is ours, so the line says when it was really written.
    let mut line = outcome::summary(outcome, start.elapsed(), deadline, &lock(progress));
    let dropped = log.dropped();
    if dropped > 0 {
        line += &format!(
            "; {dropped} earlier log line{} dropped, as writing {} would have blocked",
            if dropped == 1 { " was" } else { "s were" },
            if dropped == 1 { "it" } else { "them" }
        );
    }
    log.end_live();
    log.last_line(level, &line);
    true
}

fn start_line(cfg: &RunConfig, sources: &Sources) -> String {
    let r = &cfg.rules;
    let drain = match cfg.drain {
        Drain::Inbound | Drain::All => {
            let what = if cfg.drain == Drain::All {
                "all"
            } else {
                "inbound"
            };
            let url = sources.admin.url(cfg.drain.path().unwrap_or_default());
            format!("draining {what} listeners (POST {url})")
        }
        Drain::Agent => format!(
            "asking the Istio agent to drain (POST {})",
            Client::new(cfg.agent).url(AGENT_DRAIN_PATH)
        ),
        Drain::None => "not draining (--drain none)".to_string(),
    };
    let target = if r.settle.is_zero() {
        format!("at most {}", r.exit_at)
    } else {
        format!(
            "at most {} for {}",
            r.exit_at,
            humantime::format_duration(r.settle)
        )
    };
    let what_count = match sources.unit {
        Unit::Connections => "active connections",
        Unit::Requests => "active requests (and non-HTTP connections)",
    };
    let stats = match sources.unit {
        Unit::Connections => format!("Envoy's stats ({})", sources.stats_url()),
        Unit::Requests => format!(
            "Envoy's stats ({}), else its /clusters",
            sources.stats_url()
        ),
    };
    let from = match sources.mode {
        Mode::Auto => format!("{stats}, else {}", sources.proc_names()),
        Mode::Stats => stats,
        Mode::Proc => sources.proc_names(),
    };
    format!(
        "{drain}, then waiting up to {} (at least {} after the drain) for {target} {what_count}, counting every {} from {from}",
        humantime::format_duration(r.deadline),
        humantime::format_duration(r.min_drain),
        humantime::format_duration(r.interval),
    )
}

/// One POST, one log line: `done` on a 200, else `failed to <what>` with the cause. Whatever
/// happens, the hook goes on.
fn post(client: &Client, path: &str, left: Duration, log: &Mutex<Logger>, done: &str, what: &str) {
    let url = client.url(path);
    match client.post(path, left) {
        Ok(r) if r.status == 200 => {
            lock(log).info(&format!("{done}: POST {url} answered {}", r.describe()))
        }
        Ok(r) => lock(log).warn(&format!(
            "failed to {what}: POST {url} answered {}",
            r.describe()
        )),
        Err(e) => lock(log).warn(&format!("failed to {what}: POST {url}: {e}")),
    }
}

/// Turns readings into log lines and into the progress the summary is made from.
struct Watch<'a> {
    log: &'a Mutex<Logger>,
    progress: &'a Mutex<Progress>,
    cfg: &'a RunConfig,
    proc_names: String,
    drained_at: Duration,
    /// The source and unit of the last successful count.
    source: Option<(SourceKind, Unit)>,
    total: Option<u64>,
    /// Why the last attempt failed, while it keeps failing.
    unknown: Option<String>,
    /// How the last socket-table count told Envoy's sockets apart.
    basis: Option<Basis>,
    line_at: Duration,
}

impl<'a> Watch<'a> {
    fn new(
        log: &'a Mutex<Logger>,
        progress: &'a Mutex<Progress>,
        cfg: &'a RunConfig,
        proc_names: String,
        drained_at: Duration,
    ) -> Watch<'a> {
        Watch {
            log,
            progress,
            cfg,
            proc_names,
            drained_at,
            source: None,
            total: None,
            unknown: None,
            basis: None,
            line_at: Duration::ZERO,
        }
    }

    fn observe(&mut self, reading: Reading, now: Duration) -> Option<u64> {
        match reading.result {
            Ok(count) => {
                let total = count.total;
                self.counted(count, reading.fallback, now);
                Some(total)
            }
            Err(why) => {
                // Progress first: a signal's summary must know what the log already says.
                lock(self.progress).unknown = Some(why.clone());
                if self.unknown.as_deref() != Some(why.as_str()) {
                    lock(self.log).warn(&format!(
                        "cannot count: {why}; still waiting (an unknown count never ends the wait)"
                    ));
                }
                self.unknown = Some(why);
                self.total = None;
                None
            }
        }
    }

    fn counted(&mut self, count: Count, fallback: Option<String>, now: Duration) {
        // Progress first: a signal's summary must know what the log already says.
        {
            let mut p = lock(self.progress);
            p.last = Some(count.clone());
            p.unknown = None;
        }
        let mut log = lock(self.log);
        for w in &count.warnings {
            log.warn_once(w);
        }

        let wanted = self.cfg.counting.unit;
        // Which count is in force: a change of source or of unit gets a line, with the reason.
        let changed_source = self.source != Some((count.source, count.unit));
        if changed_source {
            match (count.source, fallback) {
                (SourceKind::Proc, Some(why)) => log.warn(&format!(
                    "stats unavailable ({why}); counting {}from {} instead",
                    if wanted == Unit::Requests { "connections " } else { "" },
                    self.proc_names
                )),
                (SourceKind::Clusters, Some(why)) => log.warn(&format!(
                    "request stats unavailable ({why}); counting requests in flight from Envoy's /clusters instead"
                )),
                (SourceKind::Stats, Some(why)) => log.warn(&format!(
                    "request stats unavailable ({why}); counting connections from Envoy's stats instead"
                )),
                (SourceKind::Stats, None) if self.source.is_some() => log.info(match wanted {
                    Unit::Connections => "Envoy's stats answer again; counting from them",
                    Unit::Requests => "Envoy's stats report requests again; counting requests",
                }),
                _ => {}
            }
        }
        if count.basis.is_some() && count.basis != self.basis {
            if let Some(b) = &count.basis {
                log.line(if b.degraded { Level::Warn } else { Level::Info }, &b.text);
            }
            self.basis = count.basis.clone();
        }
        let worth_a_line = changed_source
            || self.unknown.is_some()
            || self.total != Some(count.total)
            || self.cfg.verbose
            || now.saturating_sub(self.line_at) >= HEARTBEAT;
        log.waiting(&self.count_line(&count, now), worth_a_line);
        drop(log);
        if worth_a_line {
            self.line_at = now;
        }
        self.source = Some((count.source, count.unit));
        self.total = Some(count.total);
        self.unknown = None;
    }

    /// `3 active connections (stats); 21.5s left before the deadline`
    fn count_line(&self, count: &Count, now: Duration) -> String {
        let r = &self.cfg.rules;
        let breakdown = if self.cfg.verbose {
            count.still_open()
        } else {
            String::new()
        };
        let min_drain_end = self.drained_at.saturating_add(r.min_drain);
        let when = if now < min_drain_end {
            format!("min-drain ends in {}", seconds(min_drain_end - now))
        } else {
            format!(
                "{} left before the deadline",
                seconds(r.deadline.saturating_sub(now))
            )
        };
        format!(
            "{} ({}){breakdown}; {when}",
            count.describe(),
            count.source.name()
        )
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
        let cfg = crate::config::run_config(&args, &|_| None).unwrap();
        let sink = Sink::default();
        let log = Mutex::new(Logger::new(Out::new(Box::new(sink.clone())), false));
        let progress = Mutex::new(Progress::default());
        let mut w = Watch::new(
            &log,
            &progress,
            &cfg,
            "/proc/net/tcp and tcp6".to_string(),
            Duration::ZERO,
        );
        let totals = readings
            .into_iter()
            .enumerate()
            .map(|(i, r)| w.observe(r, Duration::from_secs(i as u64)))
            .collect();
        let p = lock(&progress).clone();
        (sink.text(), p, totals)
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
}
