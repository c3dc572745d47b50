//! Both hooks, `run` and `hold`, wired from their configuration (run/config.rs, hold/config.rs) to
//! the summary: the report (shared with the signal thread), the requests before the wait, the wait
//! with the sources it looks through, the request after it.

use crate::cli::usage_error;
use crate::config::{Address, HookConfig, Plan};
use crate::count::{Cost, REQUEST_TIMEOUT};
use crate::drain::Request;
use crate::error::{Failure, UsageError};
use crate::log::{Level, Logger};
use crate::outcome::{EXIT_REACHED, Outcome};
use crate::record::Identity;
use crate::report::Report;
use crate::signals::Blocked;
use crate::source::admin::Client;
use crate::source::sockets::Pod;
use crate::source::{Reading, Sources};
use crate::text;
use crate::wait::{App, Ask, End, Sight, Step, Wait};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `run` or `hold`, as configured, from start to summary; gives the exit code. The deadline
/// counts from `start`; the signals `blocked` then end the wait with the summary.
pub fn command(cfg: Result<HookConfig, UsageError>, start: Instant, blocked: Blocked) -> i32 {
    let cfg = match &cfg {
        Ok(cfg) => cfg,
        Err(e) => return usage_error(&e.to_string()),
    };
    let report = report(cfg, start, blocked);
    let mut sources = Sources::new(&cfg.counting, &cfg.rules.plan);
    // `run`'s agent (`--drain agent`, `--then-quit`); `hold` asks it nothing. Envoy's requests go
    // through the sources' client: an answer that is not Envoy's tells the socket table too.
    let agent = match &cfg.rules.plan {
        Plan::Run { agent, .. } => Some(Client::new(Address::Tcp(*agent))),
        Plan::Hold(_) => None,
    };
    // Whether the request got an answer; sent again, only an answer is told.
    let send = |s: &Sources, r: Request, again: bool| {
        let left = cfg.rules.deadline.saturating_sub(start.elapsed());
        let client = to(r, s, agent.as_ref());
        let (url, answer) = (client.url(r.path()), client.post(r.path(), left));
        if !again || answer.is_ok() {
            let (level, line) = text::posted(r, &url, &answer);
            report.line(level, &line);
        }
        answer.is_ok()
    };
    let urls: Vec<(Request, String)> =
        cfg.before.iter().map(|&r| (r, to(r, &sources, agent.as_ref()).url(r.path()))).collect();
    report.line(Level::Info, &text::start_line(cfg, &sources, &urls));
    let unsent = cfg.before.iter().copied().filter(|&r| !send(&sources, r, false)).collect();
    let drained_at = start.elapsed();
    let end = wait(cfg, (start, drained_at), &mut sources, unsent, &send, &report);
    if end.outcome == Outcome::AppExited || end.quit == Some(App::Gone) {
        report.line(Level::Info, &text::app_exited());
    }
    match (end.quit, &agent) {
        (Some(App::Gone), _) if end.delivering => report.line(Level::Warn, text::STILL_DELIVERING),
        // The summary first: the agent, the container's first process, may end the container
        // (and this hook) as soon as it has the request, before its answer is written.
        (Some(App::Gone), Some(agent)) => {
            let url = agent.url(Request::Quit.path());
            report.line(Level::Info, &text::quitting(&url));
            report.finish(end.outcome);
            let left = cfg.rules.deadline.saturating_sub(start.elapsed());
            let _ = agent.post(Request::Quit.path(), left);
            return end.outcome.exit_code();
        }
        (Some(App::NotSeen), _) => report.line(Level::Warn, text::APP_NOT_SEEN),
        (Some(_), _) => report.app_still_running(),
        (None, _) => {}
    }
    report.finish(end.outcome);
    end.outcome.exit_code()
}

/// The wait's loop, as Istio's agent drains: sleep, look, say what was seen, until it ends. The
/// requests before the wait that got no answer (`unsent`: Envoy stalled, restarting) are sent
/// again before each count until one comes, so that keep-alive clients still get
/// `connection: close`.
fn wait(
    cfg: &HookConfig,
    (start, drained_at): (Instant, Duration),
    sources: &mut Sources,
    mut unsent: Vec<Request>,
    send: &dyn Fn(&Sources, Request, bool) -> bool,
    report: &Report,
) -> End {
    let mut wait = Wait::new(&cfg.rules, drained_at);
    loop {
        // A waypoint counts from Envoy's admin API alone: one that is not Envoy never will.
        if cfg.counting.preset.waypoint && sources.admin.never_envoy() {
            return End { outcome: Outcome::NotEnvoy, quit: None, delivering: false };
        }
        let now = start.elapsed();
        let ask = match wait.next(now) {
            Step::Sleep(until) => {
                std::thread::sleep(until.saturating_sub(now));
                continue;
            }
            Step::Look(ask) => ask,
            Step::End(end) => return end,
        };
        // Never at the cost of the count's own time before the deadline.
        let left = cfg.rules.deadline.saturating_sub(now);
        if ask == Ask::Count && left >= REQUEST_TIMEOUT.saturating_mul(2) {
            unsent.retain(|&r| !send(sources, r, true));
        }
        // A request sent again is not part of what the count costs Envoy: the look is timed, and
        // given the time left, from after it.
        let (sight, reading, pod) =
            look(sources, cfg.rules.deadline.saturating_sub(start.elapsed()), ask);
        let seen = wait.saw(ask, (now, start.elapsed()), &sight);
        match (ask, reading, &pod) {
            (Ask::Count, Some(reading), _) => {
                report.counted(&reading, seen, sources.reader(), start.elapsed(), sight.cost);
            }
            (Ask::Exit, _, Some(pod)) => report.app(seen.app, pod),
            _ => {}
        }
    }
}

/// The run's report, taking the signals `blocked` to write its summary, with the config's warnings.
fn report(cfg: &HookConfig, start: Instant, blocked: Blocked) -> Arc<Report> {
    let mut logger = Logger::stderr();
    logger.set_format(cfg.log_format);
    if let Some(path) = &cfg.log_file {
        logger.add_file(path);
    }
    let who = Identity::of_this_pod(&|name| std::env::var(name).ok());
    let report = Arc::new(Report::new(logger, start, cfg, who));
    let on_signal = Arc::clone(&report);
    let caught = blocked.on_interrupt(move |sig| {
        let outcome = Outcome::Interrupted(sig);
        // When the wait has just ended, its own summary and exit code stand.
        if on_signal.finish(outcome) {
            std::process::exit(outcome.exit_code());
        }
    });
    if !caught {
        report.line(Level::Warn, text::SIGNALS_NOT_TAKEN);
    }
    for w in &cfg.counting.warnings {
        report.line(Level::Warn, &w.to_string());
    }
    report
}

/// Where request `r` goes: Istio's agent, or Envoy's admin API.
fn to<'a>(r: Request, sources: &'a Sources, agent: Option<&'a Client>) -> &'a Client {
    agent.filter(|_| r.to_agent()).unwrap_or(&sources.admin)
}

/// Either hook with the kill switch set: one line, and done.
pub fn disabled(setting: &str) -> i32 {
    Logger::stderr().line(Level::Info, &text::disabled(setting));
    EXIT_REACHED
}

/// The wait's eyes: each look goes to the sources. What a look found within `left`, what it cost
/// among it: the count (when asked for), the pod's sockets.
fn look(
    sources: &mut Sources,
    left: Duration,
    ask: Ask,
) -> (Sight, Option<Reading>, Option<Result<Pod, Failure>>) {
    let (reading, pod, cost) = match ask {
        Ask::Count => {
            let (reading, pod, cost) = sources.measure(left);
            (Some(reading), pod, cost)
        }
        Ask::App | Ask::Exit => (None, Some(sources.pod(left)), Cost::default()),
    };
    let count = reading.as_ref().and_then(|r| r.result.as_ref().ok());
    let sight = Sight {
        count: count.map(|c| c.total),
        arrivals: count.and_then(|c| c.arrivals),
        recounted: count.map_or(0, |c| c.recounted),
        opened: count.and_then(|c| c.opened),
        before: count.and_then(|c| c.before),
        newest: count.and_then(|c| c.newest),
        app: pod.as_ref().and_then(|p| p.as_ref().ok()).map(|p| !p.owners.is_empty()),
        busy: pod.as_ref().and_then(|p| p.as_ref().ok()).map(|p| p.busy),
        cost,
    };
    (sight, reading, pod)
}
