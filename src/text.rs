//! The sentences of a run and of `status` that are built from data: the start, each count, the
//! summary, the status tables, and each warning (`count::Warning`, found where its cause is).

use crate::cli::{ANNOTATION_PREFIX, ENV_LOG_FORMAT, ENV_NODE_IPS};
use crate::config::{
    ConfigWarning, DEFAULT_MIN_DRAIN, ENV_MIN_DRAIN, Hold, Holding, HookConfig, Mode, Plan, Rules,
};
use crate::count::{Basis, Busy, COST_SPACING, Cost, Count, NON_HTTP, SourceKind, Unit, Warning};
use crate::drain::Request;
use crate::error::Failure;
use crate::log::Level;
use crate::outcome::{Outcome, Progress, signal_name};
use crate::run::rule::ARRIVALS_QUIET;
use crate::source::admin::{READY_PATH, Reply};
use crate::source::clusters::{self, CLUSTERS_PATH};
use crate::source::sockets::Reader;
use crate::source::stats::Hcm;
use crate::source::{Look, Reading, Sources};
use crate::wait::{APP_GONE, RECHECK, drain_done};
use humantime::format_duration;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

/// Seconds with one decimal, rounded in integers (no float formatting in the binary).
pub(crate) fn seconds(d: Duration) -> String {
    let tenths = d.as_millis().saturating_add(50) / 100;
    format!("{}.{}s", tenths / 10, tenths % 10)
}

/// Milliseconds below a second, else `seconds`.
fn brief(d: Duration) -> String {
    if d < Duration::from_secs(1) { format!("{}ms", d.as_millis()) } else { seconds(d) }
}

/// `1 request`, `2 requests`.
fn plural(n: u64, one: &str) -> String {
    format!("{n} {one}{}", if n == 1 { "" } else { "s" })
}

/// `stats`, `proc` or `clusters`, as `--source` and `status` name them.
impl std::fmt::Display for SourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&format!("{self:?}").to_ascii_lowercase())
    }
}

impl Count {
    /// `3 active connections`, or `2 active requests and 1 non-HTTP connection`.
    pub(crate) fn describe(&self) -> String {
        match self.unit {
            Unit::Connections => plural(self.total, "active connection"),
            Unit::Requests => {
                let tcp = self.parts.iter().find(|p| p.name == NON_HTTP).map_or(0, |p| p.active);
                let requests = plural(self.total.saturating_sub(tcp), "active request");
                if tcp == 0 {
                    requests
                } else {
                    format!("{requests} and {}", plural(tcp, "non-HTTP connection"))
                }
            }
        }
    }

    /// `listener 0.0.0.0_15006=2, listener [__1]_15007=1`: the non-zero parts.
    pub(crate) fn breakdown(&self) -> String {
        let label = |name: &str| match (self.unit, self.source) {
            (Unit::Connections, SourceKind::Stats) => format!("listener {name}"),
            _ => name.to_string(),
        };
        let open = self.parts.iter().filter(|p| p.active > 0);
        open.map(|p| format!("{}={}", label(&p.name), p.active)).collect::<Vec<_>>().join(", ")
    }

    /// `: listener 0.0.0.0_15006=2`, or nothing when no part is open.
    fn still_open(&self) -> String {
        let b = self.breakdown();
        if b.is_empty() { b } else { format!(": {b}") }
    }
}

pub(crate) fn reader(r: &Reader) -> String {
    match r {
        Reader::Netlink => "the kernel's socket table (netlink sock_diag)".to_string(),
        Reader::Text { dir, .. } => format!("{}/tcp and tcp6", dir.display()),
    }
}

/// How Envoy's sockets were told apart; a warning where they cannot be.
pub(crate) fn basis(b: &Basis) -> (Level, String) {
    let line = match b {
        Basis::Process { pid, uid, admin } => format!(
            "counting what Envoy accepted: Envoy is pid {pid} (uid {uid}), which holds the admin \
             listener {admin}"
        ),
        Basis::Owner { uid, admin, why } => format!(
            "counting what Envoy accepted, telling its sockets by their owner, uid {uid}, the \
             owner of the admin listener {admin} ({why})"
        ),
        Basis::Unknown { admin, not_envoy } => {
            let said = match not_envoy {
                None => format!("nothing listens on Envoy's admin address {admin}"),
                Some(why) => format!(
                    "what listens on Envoy's admin address {admin} is not taken as Envoy ({why})"
                ),
            };
            let line = format!(
                "{said}, so Envoy's sockets cannot be told apart: counting what any listener of \
                 the pod accepted"
            );
            return (Level::Warn, line);
        }
    };
    (Level::Info, line)
}

/// A request as the start line announces it, as a 200 confirms it, and as its failure names it.
fn request_words(r: Request) -> (&'static str, &'static str, &'static str) {
    match r {
        Request::FailHealthcheck => (
            "failing Envoy's health checks",
            "Envoy fails its health checks now (/ready answers 503)",
            "fail Envoy's health checks (draining anyway)",
        ),
        Request::DrainListeners { all } => (
            if all { "draining all listeners" } else { "draining inbound listeners" },
            "Envoy accepted the drain",
            "drain listeners (waiting anyway)",
        ),
        Request::AgentDrain => (
            "asking the Istio agent to drain",
            "the Istio agent accepted the drain",
            "ask the Istio agent to drain (waiting anyway)",
        ),
        Request::Quit => (
            "asking the Istio agent to stop the proxy",
            "asked the Istio agent to stop the proxy now",
            "ask the Istio agent to stop the proxy",
        ),
    }
}

/// The line before the summary with `--then-quit`: the request to stop the proxy follows it,
/// its answer unwritten (the agent may end the container first).
pub(crate) fn quitting(url: &str) -> String {
    format!("asking the Istio agent to stop the proxy after this summary: POST {url}")
}

/// The line a request's answer is worth: the hook goes on either way.
pub(crate) fn posted(r: Request, url: &str, answer: &Result<Reply, Failure>) -> (Level, String) {
    let (_, done, what) = request_words(r);
    let failed = |why: String| (Level::Warn, format!("failed to {what}: POST {url}: {why}"));
    match answer {
        Ok(reply) if reply.status == 200 => {
            (Level::Info, format!("{done}: POST {url} answered {}", reply.describe()))
        }
        Ok(reply) => failed(format!("answered {}", reply.describe())),
        // No answer: hook.rs sends it again before each count; the quit is the last request.
        Err(why) if r != Request::Quit => {
            failed(format!("{why}; sending it again before each count"))
        }
        Err(why) => failed(why.to_string()),
    }
}

/// The run's first line: what it sends (each request with its URL), and how long it may wait.
pub(crate) fn start_line(
    cfg: &HookConfig,
    sources: &Sources,
    requests: &[(Request, String)],
) -> String {
    let (r, d) = (&cfg.rules, format_duration);
    let exit_at = match &r.plan {
        Plan::Run { exit_at, .. } => *exit_at,
        Plan::Hold(hold) => return hold_start_line(cfg, hold, sources),
    };
    let announce = |(q, url): &(Request, String)| {
        let (announced, _, _) = request_words(*q);
        format!("{announced} (POST {url})")
    };
    let mut sent: Vec<String> = requests.iter().map(announce).collect();
    if !requests.iter().any(|(q, _)| q.drains()) {
        sent.push("not draining (--drain none)".to_string());
    }
    let settle = if r.settle.is_zero() { String::new() } else { format!(" for {}", d(r.settle)) };
    let stats = format!("Envoy's stats ({})", sources.stats_url());
    let (what, stats) = match sources.unit {
        Unit::Connections => ("active connections", stats),
        // A waypoint's stats never tell its requests (source/stats.rs).
        Unit::Requests if cfg.counting.preset.waypoint && sources.mode == Mode::Auto => {
            ("active requests", format!("Envoy's /clusters ({})", sources.admin.url(CLUSTERS_PATH)))
        }
        Unit::Requests => {
            ("active requests (and non-HTTP connections)", stats + ", else its /clusters")
        }
    };
    let proc = reader(sources.reader());
    let from = match sources.mode {
        Mode::Auto => format!("{stats}, else {proc}"),
        Mode::Stats => stats,
        Mode::Proc => proc,
    };
    format!(
        "{}, then waiting up to {} (at least {}) for at most {exit_at}{settle} {what}, counting every {} from {from}",
        sent.join(", then "),
        d(r.deadline),
        least(r, " after the drain"),
        d(r.interval),
    )
}

/// The min-drain, and what the deadline cuts it to (wait.rs `drain_done`) where it does.
fn least(r: &Rules, after: &str) -> String {
    let (min, cut) = (format_duration(r.min_drain), drain_done(r, Duration::ZERO));
    match cut < r.min_drain {
        true => format!("{min}{after}, cut to {} by the deadline", seconds(cut)),
        false => format!("{min}{after}"),
    }
}

/// What `hold` takes for an arrival in the socket table: `connections to ports 8080, never
/// from 169.254.7.127 (the kubelet's probes)`.
fn doors(rule: &crate::config::ArrivalRule) -> String {
    let from: Vec<String> = rule.probes.iter().map(|a| a.to_canonical().to_string()).collect();
    let mut said = match &rule.ports.only {
        Some(ports) => format!("connections to ports {ports}"),
        None => "connections to every port that listens in the pod".to_string(),
    };
    let from = from.join(", ");
    let probes = match rule.probe_periods.as_deref() {
        None => format!("; never from {from} (the kubelet's probes)"),
        Some([]) => format!("; from {from} too (no readiness probe of the pod connects)"),
        Some(periods) => {
            let every: Vec<String> = periods.iter().map(|p| seconds(*p)).collect();
            format!(
                "; not as many as the pod's readiness probes make (one every {}) from {from} \
                 (the kubelet's probes) or that left no socket",
                every.join(", ")
            )
        }
    };
    for (when, clause) in [
        (!rule.ports.ignore.is_empty(), format!(" but {}", rule.ports.ignore)),
        (true, ", new or receiving bytes (not a poll's, after 5s of silence)".to_string()),
        (rule.passive_opens, "; and those accepted that left no socket (PassiveOpens)".to_string()),
        (!rule.probes.is_empty(), probes),
    ] {
        if when {
            said += &clause;
        }
    }
    said
}

/// `hold`'s first line: what ends the hold, and where arrivals are read.
fn hold_start_line(cfg: &HookConfig, hold: &Hold, sources: &Sources) -> String {
    let (r, d) = (&cfg.rules, format_duration);
    let mut from = format!("{}: {}", reader(sources.reader()), doors(&hold.arrivals));
    if let Holding::Sidecar(preset) = hold.holding {
        from += &format!(
            "; and Envoy's /clusters ({}) as often as it takes at most 1/{COST_SPACING} of Envoy's main thread: clusters {}",
            sources.admin.url(CLUSTERS_PATH),
            preset.inbound_clusters.join(", ")
        );
    }
    let (quiet, min, most, every) = (d(r.settle), least(r, ""), d(r.deadline), d(r.interval));
    let propagation = d(hold.propagation);
    format!(
        "holding the app's SIGTERM until requests have stopped arriving: none for {quiet}, longer where they come further apart, until their rate tells they stopped and for twice their longest pause between reads, and none after {propagation} unless they still come then (at least {min}, at most {most}), reading arrivals every {every} from {from}"
    )
}

/// `3 active connections (stats); 21.5s left before the deadline`; verbose: with the breakdown.
pub(crate) fn count_line(
    count: &Count,
    (arriving, busy): (bool, Option<Busy>),
    now: Duration,
    min_drain_end: Duration,
    cfg: &HookConfig,
) -> String {
    let breakdown = if cfg.verbose { count.still_open() } else { String::new() };
    let hold = matches!(cfg.rules.plan, Plan::Hold(_));
    let when = if now < min_drain_end && hold {
        format!("at least {} more", seconds(min_drain_end - now))
    } else if now < min_drain_end {
        format!("min-drain ends in {}", seconds(min_drain_end - now))
    } else {
        format!("{} left before the deadline", seconds(cfg.rules.deadline.saturating_sub(now)))
    };
    let arriving = match (arriving, hold) {
        (true, _) => ", and new requests still arriving",
        (false, true) if count.arrivals.is_none() => ", and arrivals unknown",
        (false, true) => ", and no new request",
        (false, false) => "",
    };
    let busy = busy.map(busy_words).unwrap_or_default();
    format!("{} ({}){breakdown}{arriving}{busy}; {when}", count.describe(), count.source)
}

/// What keeps the pod's accepted connections busy, where anything does: `, 1 connection still
/// delivering an answer, 2 awaiting one`.
fn busy_words(b: Busy) -> String {
    let n = |k: u64| if k == 1 { "1 connection".to_string() } else { format!("{k} connections") };
    let mut w = String::new();
    if b.delivering > 0 {
        w += &format!(", {} still delivering an answer", n(b.delivering));
    }
    if b.awaiting > 0 {
        let first =
            if w.is_empty() { format!("{} ", n(b.awaiting)) } else { format!("{} ", b.awaiting) };
        w += &format!(", {first}awaiting one");
    }
    w
}

/// When the count in force changes source or unit, the line that says so and why.
pub(crate) fn switched(
    count: &Count,
    reading: &Reading,
    wanted: Unit,
    proc: &Reader,
    returning: bool,
    plan: &Plan,
) -> Option<(Level, String)> {
    let Some(why) = &reading.fallback else {
        let back = match wanted {
            Unit::Connections => "Envoy's stats answer again; counting from them",
            Unit::Requests => "Envoy's stats report requests again; counting requests",
        };
        return (count.source == SourceKind::Stats && returning)
            .then(|| (Level::Info, back.to_string()));
    };
    let line = match count.source {
        SourceKind::Proc if matches!(plan, Plan::Hold(_)) => format!(
            "{why}; reading arrivals from {} instead{}",
            reader(proc),
            match proc {
                Reader::Netlink =>
                    ": new connections accepted in the pod, and the bytes each received",
                Reader::Text { .. } => ", which shows no bytes received",
            }
        ),
        source => {
            let (lost, what, from) = match source {
                SourceKind::Proc if wanted == Unit::Requests => {
                    ("stats", "connections ", reader(proc))
                }
                SourceKind::Proc => ("stats", "", reader(proc)),
                SourceKind::Clusters => {
                    ("request stats", "requests in flight ", "Envoy's /clusters".to_string())
                }
                SourceKind::Stats => ("request stats", "connections ", "Envoy's stats".to_string()),
            };
            format!("{lost} unavailable ({why}); counting {what}from {from} instead")
        }
    };
    Some((Level::Warn, line))
}

/// The app's sockets, as in `uid 1000: 2 sockets, uid 1001: 1 socket`.
fn sockets_by_user(others: &BTreeMap<u32, u64>) -> String {
    let each = others.iter().map(|(uid, n)| format!("uid {uid}: {}", plural(*n, "socket")));
    each.collect::<Vec<_>>().join(", ")
}

/// `--then-quit` waiting for the app before it stops the proxy.
pub(crate) fn waiting_for_app(others: &BTreeMap<u32, u64>) -> String {
    format!(
        "waiting for the app to exit before asking the Istio agent to stop the proxy: {} still open",
        sockets_by_user(others)
    )
}

/// The app's sockets have been gone for `APP_GONE`, at looks `RECHECK` apart.
pub(crate) fn app_exited() -> String {
    format!(
        "the app has exited: no socket of another user than the proxy's has been in the pod for \
         {}, at looks {} apart",
        format_duration(APP_GONE),
        format_duration(RECHECK)
    )
}

/// `--then-quit` when the app never held a socket while the hook looked.
pub(crate) const APP_NOT_SEEN: &str = "no socket of the app seen while waiting, so its exit cannot be told: not asking the Istio agent to stop the proxy; its own shutdown follows";

/// `--then-quit` at the deadline, the app gone and an answer still on its way to its client.
pub(crate) const STILL_DELIVERING: &str = "an answer is still on its way to its client at the deadline: not asking the Istio agent to stop the proxy; its own shutdown follows";

/// `--then-quit` that cannot see the app.
pub(crate) fn app_unknown(why: &Failure) -> String {
    format!(
        "cannot tell whether the app has exited ({why}): the proxy is not stopped until it is known"
    )
}

/// `--then-quit` given up at the deadline.
pub(crate) fn app_still_running(others: Option<&BTreeMap<u32, u64>>) -> String {
    let open = others.map_or("unknown".to_string(), sockets_by_user);
    format!(
        "the app has not exited by the deadline ({open}): not asking the Istio agent to stop the proxy; its own shutdown follows"
    )
}

/// The time between counts has changed with the time a count took.
pub(crate) fn pace(pace: Duration, interval: Duration, cost: Cost) -> String {
    let took = match cost.cpu {
        Some(cpu) => format!("{} of CPU in {}", brief(cpu), brief(cost.look)),
        None => format!("{} ({} of it Envoy's answers)", brief(cost.look), brief(cost.admin)),
    };
    if pace == interval {
        format!("counting every {} again: a count took {took}", format_duration(interval))
    } else {
        format!(
            "counting every {} instead of every {}: a count took {took}, and counting takes at \
             most 1/{} of Envoy's main thread, which also runs its configuration, and of the \
             proxy container's CPU",
            brief(pace),
            format_duration(interval),
            COST_SPACING
        )
    }
}

/// `run` with the kill switch set.
pub(crate) fn disabled(setting: &str) -> String {
    format!("{setting} is set: not draining and not waiting")
}

pub(crate) const SIGNALS_NOT_TAKEN: &str = "failed to take over SIGTERM, SIGINT and the other signals that end a process; one will end the wait without a summary";

pub(crate) fn cannot_count(why: &Failure) -> String {
    format!("cannot count: {why}; still waiting (an unknown count never ends the wait)")
}

/// What held a hold to its deadline, its reads known: requests arriving, or arrivals too far
/// apart for the deadline to tell they stopped, or a deadline shorter than the quiet time.
fn held(p: &Progress, (rules, propagation): (&Rules, Duration), elapsed: Duration) -> String {
    match (p.arrived_at, p.pace) {
        (None, _) => format!("no request seen, but not yet for {}", seconds(rules.settle)),
        // Quiet for longer than a busy pod needs, not for as long as these arrivals do.
        (Some(at), Some(pace)) if elapsed.saturating_sub(at) >= rules.settle => {
            // Past the propagation the mesh should have stopped sending: say so where they did.
            let late = match at >= propagation {
                true => format!(" still coming after the propagation ({})", seconds(propagation)),
                false => String::new(),
            };
            format!(
                "arrivals every ~{}{late}: the deadline is too short to tell they stopped",
                seconds(pace.gap)
            )
        }
        (Some(_), _) => "requests still arriving".to_string(),
    }
}

/// A list of ports: `5353, 8125`.
fn ports(ports: &[u16]) -> String {
    ports.iter().map(u16::to_string).collect::<Vec<_>>().join(", ")
}

impl std::fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            ConfigWarning::AdminAmbiguous { value, found, listening } => write!(
                f,
                "--admin {value}: {} sockets match ({}) and {} of them takes a connection, so \
                 none is asked; counting without the admin API",
                found.len(),
                found.join(", "),
                if *listening == 0 { "none" } else { "more than one" },
            ),
            ConfigWarning::DeadlinePastFlag { annotated, flag } => write!(
                f,
                "annotation {ANNOTATION_PREFIX}deadline={} is past --deadline {}, which the \
                 injection template derives from the pod's terminationGracePeriodSeconds; using \
                 {}: raise the grace period instead",
                format_duration(*annotated),
                format_duration(*flag),
                format_duration(*flag)
            ),
            ConfigWarning::MinDrainEnv(v) => write!(
                f,
                "ignoring {ENV_MIN_DRAIN}={v:?}: expected a Go duration like 5s, .5s or 1m30s, as \
                 Istio reads it; using Istio's default, {}",
                format_duration(DEFAULT_MIN_DRAIN)
            ),
            ConfigWarning::MinDrainPastDeadline { what, deadline } => write!(
                f,
                "{what} is longer than the deadline ({}); using the deadline as the min-drain",
                format_duration(*deadline)
            ),
            ConfigWarning::LogFormatEnv(v) => {
                write!(f, "ignoring {ENV_LOG_FORMAT}={v:?}: expected text or json; writing text")
            }
            ConfigWarning::NodeIpsUnset => write!(
                f,
                "{ENV_NODE_IPS} is not set: node in --probes-from names no address (the admission \
                 policy sets it from the downward API's status.hostIPs)"
            ),
            ConfigWarning::NodeIp { item, value } => write!(
                f,
                "ignoring {item:?} in {ENV_NODE_IPS}={value:?}: expected IP addresses, like 10.0.0.1"
            ),
            ConfigWarning::LinkLocalGateway(gateway) => write!(
                f,
                "the pod's gateway is the link-local {gateway} (Calico, the AWS VPC CNI): the \
                 kubelet's probes come from the node's own address, which {ENV_NODE_IPS} (unset) \
                 would name; they count as arrivals"
            ),
            ConfigWarning::PodAnnotation(item) => write!(
                f,
                "ignoring --pod-annotation {item:?}: expected {ANNOTATION_PREFIX}NAME=VALUE"
            ),
            ConfigWarning::Annotation { name, value, expected } => {
                write!(f, "ignoring annotation {name}={value:?}: expected {expected}")
            }
        }
    }
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Warning::Snmp(failed) => {
                write!(f, "{failed}; connections that leave no socket are not seen")
            }
            Warning::TextTables(why) => write!(
                f,
                "netlink sock_diag is unavailable ({why}): reading /proc/net/tcp and tcp6 instead"
            ),
            Warning::NoBytes => f.write_str(
                "arrivals unknown: the socket table shows no bytes received for a connection \
                 accepted in the pod",
            ),
            Warning::Udp(udp) => write!(
                f,
                "UDP is served on port {}: the kernel counts no datagrams per socket, so what \
                 arrives over UDP is not seen, only over TCP",
                ports(udp)
            ),
            Warning::Hiding(hiding) => write!(
                f,
                "port {} listens and does not count: a connection to it that its client closes \
                 between two reads leaves no socket, cannot be told from the app's and counts",
                ports(hiding)
            ),
            Warning::Unseen => f.write_str(
                "counting connections the pod accepted that left no socket to tell them by \
                 (PassiveOpens: a client that closed first, or a tcpSocket probe) as arrivals",
            ),
            Warning::Wrapped { n, first } => {
                let (s, among) = if *n == 1 { ("s", "") } else { ("", " among them") };
                let plural = if *n == 1 { "" } else { "s" };
                write!(f, "{n} gauge{plural} wrapped below zero and count{s} as 0 ({first}{among})")
            }
            Warning::ClustersFailed(why) => {
                write!(f, "/clusters: {why}; arrivals from the socket table alone")
            }
            Warning::PastEnvoy => f.write_str(
                "the socket table sees arrivals that Envoy's /clusters does not (clients that \
                 reach the app past the sidecar, as excludeInboundPorts lets them, or a TCP \
                 stream's bytes): counting them",
            ),
            Warning::ClustersAlone(why) => {
                write!(f, "arrivals from Envoy's /clusters alone: {why}")
            }
            Warning::Undelivered(why) => write!(
                f,
                "cannot read the socket table ({why}): answers still on their way to their clients \
                 are not seen, and the count alone decides"
            ),
        }
    }
}

/// What a hold could not see arrive, for its summary: its count's `Udp` warning.
fn unseen(warnings: &[Warning]) -> String {
    let parts: Vec<String> = (warnings.iter())
        .filter_map(|w| match w {
            Warning::Udp(udp) => Some(format!("UDP to port {} is not seen", ports(udp))),
            _ => None,
        })
        .collect();
    parts.join("; ")
}

/// The summary's opening: what ended the wait, after how long.
fn ended(outcome: Outcome, elapsed: Duration, rules: &Rules) -> String {
    let took = seconds(elapsed);
    match (outcome, &rules.plan) {
        (Outcome::Reached | Outcome::AppExited, _) => format!("done after {took}"),
        (Outcome::KeptAlive(_), Plan::Hold(h)) if elapsed < rules.deadline => {
            format!("propagation of {} passed after {took}", format_duration(h.propagation))
        }
        (Outcome::Deadline | Outcome::NothingCounted | Outcome::KeptAlive(_), _) => {
            format!("deadline of {} passed after {took}", format_duration(rules.deadline))
        }
        (Outcome::Interrupted(sig), _) => {
            format!("interrupted by {} after {took}", signal_name(sig))
        }
        (Outcome::NotEnvoy, _) => format!("stopped after {took}"),
    }
}

/// The final line: how the wait ended and when, what was counted, what is still open where that
/// matters, whether the count is stale, and how many earlier lines could not be written.
pub(crate) fn summary(
    outcome: Outcome,
    elapsed: Duration,
    rules: &Rules,
    p: &Progress,
    (dropped, failed): (u64, Option<&str>),
) -> String {
    let (counted, stale) = last_count(p);
    let open = p.last.as_ref().map(Count::still_open).unwrap_or_default();
    let (after, none) = match rules.plan {
        Plan::Run { .. } => ("; the proxy may stop now", "no source answered"),
        Plan::Hold(_) => ("; the app gets its SIGTERM now", "no source told what arrived"),
    };
    let mut line = ended(outcome, elapsed, rules);
    line += &match (outcome, &rules.plan) {
        (Outcome::Reached, Plan::Hold(_)) => format!(": {}, {counted}{after}", quiet(p, rules)),
        (Outcome::Reached, _) => format!(": {counted}{after}"),
        (Outcome::AppExited, _) if p.last.is_none() => format!(": the app has exited{after}"),
        (Outcome::AppExited, _) => format!(
            ": the app has exited, which leaves nothing to answer the {counted} still open{stale}{after}"
        ),
        (Outcome::KeptAlive(since), _) => format!(
            " with requests arriving only on kept-alive connections (no new connection \
             for {}): their clients reconnect elsewhere once the app closes them, \
             {counted}{after}",
            seconds(since)
        ),
        (Outcome::Deadline, Plan::Hold(h)) => {
            let held = match stale.is_empty() {
                true => held(p, (rules, h.propagation), elapsed),
                false => "arrivals unknown".into(),
            };
            format!(" with {held}, {counted}{stale}{after}")
        }
        (Outcome::Deadline, _) => {
            // What held a count at zero: requests that still came.
            let quiet = ARRIVALS_QUIET.max(rules.settle);
            let arriving = p.arrived_at.is_some_and(|t| elapsed.saturating_sub(t) <= quiet);
            let arriving = if arriving { ", and new requests still arriving" } else { "" };
            let busy = p.busy.map(busy_words).unwrap_or_default();
            format!(" with {counted} still open{open}{arriving}{busy}{stale}")
        }
        (Outcome::NothingCounted, _) => {
            format!(
                " and nothing could be counted: {}",
                p.unknown.as_ref().map_or(none.to_string(), Failure::to_string)
            )
        }
        (Outcome::Interrupted(_), _) => format!(" with {counted}{open}{stale}"),
        (Outcome::NotEnvoy, _) => format!(
            ": what answers on the admin address is not Envoy; a waypoint of another proxy, such \
             as agentgateway's (GatewayClass istio-agentgateway-waypoint), has nothing this hook \
             can drain or count: leave the hook off it{after}"
        ),
    };
    line + &lost_lines(dropped, failed)
}

/// The last count, and whether a failed count came after it.
fn last_count(p: &Progress) -> (String, String) {
    let counted = match &p.last {
        Some(c) => format!("{} ({})", c.describe(), c.source),
        None => "nothing counted".to_string(),
    };
    let stale = p.unknown.as_ref().filter(|_| p.last.is_some()).map_or(String::new(), |why| {
        format!("; the last count failed ({why}), so this is the last known count")
    });
    (counted, stale)
}

/// A hold that ended quiet: for how long, and what it could not see or left out.
fn quiet(p: &Progress, rules: &Rules) -> String {
    let quiet = seconds(p.pace.map_or(rules.settle, |pace| pace.quiet));
    let (blind, polls) =
        p.last.as_ref().map_or((String::new(), 0), |c| (unseen(&c.warnings), c.polls));
    let verb = if blind.is_empty() { "arrived" } else { "seen" };
    let polled = match polls {
        0 => String::new(),
        1 => "1 poll on a kept-alive connection, after 5s of silence, left out".to_string(),
        n => format!("{n} polls on kept-alive connections, after 5s of silence, left out"),
    };
    let notes: Vec<&str> =
        [blind.as_str(), &polled].into_iter().filter(|s| !s.is_empty()).collect();
    let notes = if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) };
    format!("no request {verb} for {quiet}{notes}")
}

/// Log lines the summary's run could not write, if any.
fn lost_lines(dropped: u64, failed: Option<&str>) -> String {
    let (was, it) = if dropped == 1 { (" was", "it") } else { ("s were", "them") };
    match (dropped, failed) {
        (0, _) => String::new(),
        (_, Some(why)) => format!("; {dropped} earlier log line{was} not written: {why}"),
        (_, None) => {
            format!("; {dropped} earlier log line{was} dropped, as writing {it} would have blocked")
        }
    }
}

pub(crate) fn installed(path: &std::path::Path, size: u64) -> String {
    let version = env!("CARGO_PKG_VERSION");
    format!("installed {} ({size} bytes, envoy-drain {version})", path.display())
}

/// The `status` report: each source read, what it counts and leaves out, and what `run` would count.
pub(crate) fn status(
    look: &Look,
    reading: &Reading,
    sources: &Sources,
    ready: Option<&Result<Reply, Failure>>,
) -> String {
    let mut out = String::new();
    if let Some(ready) = ready {
        let url = sources.admin.url(READY_PATH);
        let _ = writeln!(out, "ready: GET {url} {}\n", ready_said(ready));
    }
    if let Some(stats) = &look.stats {
        let heading = format!("stats: GET {}", sources.stats_url());
        section(&mut out, heading, &stats.connections, stats_table);
        match &stats.requests {
            Some(Ok((count, hcms))) => requests_table(&mut out, count, hcms),
            Some(Err(why)) if stats.connections.is_ok() => {
                let _ = writeln!(out, "  requests unavailable: {why}");
            }
            _ => {}
        }
    }
    if let Some(clusters) = &look.clusters {
        let heading = format!("\nclusters: GET {}", sources.admin.url(CLUSTERS_PATH));
        section(&mut out, heading, clusters, clusters_table);
    }
    if let Some(proc) = &look.proc {
        let gap = if look.stats.is_some() { "\n" } else { "" };
        section(&mut out, format!("{gap}proc: {}", reader(sources.reader())), proc, proc_table);
    }
    match &reading.result {
        Ok(c) => {
            let why = match (c.source, &reading.fallback) {
                (SourceKind::Proc, Some(_)) => ", because the stats are unavailable",
                (SourceKind::Clusters, Some(_)) => ", because Envoy's stats do not report requests",
                (SourceKind::Stats, Some(_)) => ", because Envoy does not report requests",
                _ => "",
            };
            let _ = writeln!(out, "\nrun would count {} (from {}{why})", c.describe(), c.source);
        }
        Err(_) => out.push_str("\nrun could not count anything right now\n"),
    }
    out
}

/// A source's section: its heading, then its table, or why it was unavailable.
fn section<T>(
    out: &mut String,
    heading: String,
    read: &Result<T, Failure>,
    table: fn(&mut String, &T),
) {
    let _ = writeln!(out, "{heading}");
    match read {
        Ok(answer) => table(out, answer),
        Err(why) => {
            let _ = writeln!(out, "  unavailable: {why}");
        }
    }
}

fn ready_said(ready: &Result<Reply, Failure>) -> String {
    match ready {
        Ok(r) if r.status == 200 => {
            format!("answered {}: Envoy passes its health checks", r.describe())
        }
        // Envoy's /ready names its state (server_info_handler.cc, Utility::serverState).
        Ok(r) if r.status == 503 && r.body.trim_ascii() == b"DRAINING" => format!(
            "answered {}: Envoy fails its health checks (POST {}, \
             `run --fail-healthcheck`), so load balancers that ask stop sending",
            r.describe(),
            Request::FailHealthcheck.path()
        ),
        Ok(r) if r.status == 503 && r.body.trim_ascii().ends_with(b"INITIALIZING") => format!(
            "answered {}: Envoy is still starting, waiting for its configuration",
            r.describe()
        ),
        Ok(r) => format!("answered {}", r.describe()),
        Err(f) => f.to_string(),
    }
}

/// Rows as a table, the first column left-aligned; a row of one cell is a note.
fn grid(out: &mut String, rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows.iter().filter(|r| r.len() > 1) {
        for (i, cell) in row.iter().enumerate() {
            let n = cell.chars().count();
            match widths.get_mut(i) {
                Some(w) => *w = (*w).max(n),
                None => widths.push(n),
            }
        }
    }
    for row in rows {
        if let [note] = row.as_slice() {
            let _ = writeln!(out, "  {note}");
            continue;
        }
        out.push(' ');
        for (i, (cell, &w)) in row.iter().zip(&widths).enumerate() {
            let _ = match i {
                0 => write!(out, " {cell:<w$}"),
                _ => write!(out, "  {cell:>w$}"),
            };
        }
        out.push('\n');
    }
}

fn row(cells: &[&dyn std::fmt::Display]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Each part of a count, its total and its warnings, then any notes.
fn table(out: &mut String, heading: &str, c: &Count, notes: Vec<Vec<String>>) {
    let mut rows = vec![row(&[&heading, &"active"])];
    rows.extend(c.parts.iter().map(|p| row(&[&p.name, &p.active])));
    rows.push(row(&[&"total", &c.total]));
    rows.extend(c.warnings.iter().map(|w| vec![format!("warning: {w}")]));
    rows.extend(notes);
    grid(out, &rows);
}

fn stats_table(out: &mut String, c: &Count) {
    let skipped =
        c.excluded.iter().map(|e| vec![format!("not counted: {}, {} active", e.why, e.n)]);
    table(out, "listener", c, skipped.collect());
}

/// What counts, then every other socket of the table with why it does not.
fn proc_table(out: &mut String, c: &Count) {
    if let Some(b) = &c.basis {
        let (_, line) = basis(b);
        let _ = writeln!(out, "  {line}");
    }
    table(out, "accepted on", c, Vec::new());
    if !c.excluded.is_empty() {
        let mut rows = vec![row(&[&"not counted", &"sockets"])];
        rows.extend(c.excluded.iter().map(|e| row(&[&e.why, &e.n])));
        grid(out, &rows);
    }
}

/// Requests and connections per cluster that holds any, then what is left out and why.
fn clusters_table(out: &mut String, a: &clusters::Answer) {
    let busy = |c: &&clusters::Cluster| c.requests > 0 || c.connections > 0;
    let (counted, left_out): (Vec<&clusters::Cluster>, Vec<_>) =
        a.clusters.iter().filter(busy).partition(|c| c.left_out.is_none());
    let mut rows = vec![row(&[&"cluster", &"requests", &"connections"])];
    rows.extend(counted.iter().map(|c| row(&[&c.name, &c.requests, &c.connections])));
    rows.push(row(&[&"total", &a.count.total]));
    if a.quiet > 0 {
        let more = plural(a.quiet, "more cluster");
        rows.push(vec![format!("and {more} with nothing open")]);
    }
    let name = |c: &clusters::Cluster| format!("{} ({})", c.name, c.left_out.unwrap_or_default());
    let left_rows: Vec<Vec<String>> = (left_out.iter().map(|&c| row(&[&name(c), &c.requests])))
        .chain(a.count.excluded.iter().map(|e| row(&[&e.why, &e.n])))
        .collect();
    if !left_rows.is_empty() {
        rows.push(row(&[&"not counted", &"requests"]));
        rows.extend(left_rows);
    }
    grid(out, &rows);
    let clusters::AppArrived { requests, connections } = a.app_arrived;
    let (requests, connections) = (plural(requests, "request"), plural(connections, "connection"));
    let arrived =
        format!("arrived at the app so far, which `hold` reads: {requests} and {connections}");
    let _ = writeln!(out, "  {arrived}");
}

/// Requests and connections side by side per HTTP connection manager, then what has no HTTP.
fn requests_table(out: &mut String, c: &Count, hcms: &[Hcm]) {
    let tcp = c.parts.iter().find(|p| p.name == NON_HTTP).map_or(0, |p| p.active);
    let mut rows = vec![row(&[&"HTTP connection manager", &"requests", &"connections"])];
    rows.extend(hcms.iter().map(|h| row(&[&h.prefix, &h.requests, &h.connections])));
    rows.push(row(&[&NON_HTTP, &"-", &tcp]));
    out.push('\n');
    grid(out, &rows);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{no_mesh, run_plan};
    use crate::count::Part;

    fn part(name: &str, active: u64) -> Part {
        Part { name: name.to_string(), active }
    }

    #[test]
    fn total_sums_parts_and_breakdown_names_only_open_ones() {
        let c = Count::new(
            SourceKind::Stats,
            Unit::Connections,
            vec![part("b_15006", 2), part("a_15001", 0), part("[__1]_8080", 1)],
            vec![],
        );
        assert_eq!(c.total, 3);
        assert_eq!(c.describe(), "3 active connections");
        assert_eq!(
            c.breakdown(),
            "listener b_15006=2, listener [__1]_8080=1",
            "in the source's order, zero parts left out"
        );
    }

    #[test]
    fn a_request_count_says_what_is_requests_and_what_is_connections() {
        let with_tcp = Count::new(
            SourceKind::Stats,
            Unit::Requests,
            vec![part("http inbound_0.0.0.0_8080", 2), part(NON_HTTP, 1)],
            vec![],
        );
        assert_eq!(with_tcp.total, 3);
        assert_eq!(with_tcp.describe(), "2 active requests and 1 non-HTTP connection");
        assert_eq!(with_tcp.breakdown(), "http inbound_0.0.0.0_8080=2, non-HTTP connections=1");
        let one = Count::new(
            SourceKind::Stats,
            Unit::Requests,
            vec![part("http inbound_0.0.0.0_8080", 1), part(NON_HTTP, 0)],
            vec![],
        );
        assert_eq!(one.describe(), "1 active request");
    }

    #[test]
    fn one_connection_is_singular_and_nothing_open_has_no_breakdown() {
        let one =
            Count::new(SourceKind::Proc, Unit::Connections, vec![part("port 15006", 1)], vec![]);
        assert_eq!(one.describe(), "1 active connection");
        assert_eq!(one.still_open(), ": port 15006=1");
        let none = Count::new(SourceKind::Proc, Unit::Connections, vec![], vec![]);
        assert_eq!(none.still_open(), "");
    }

    #[test]
    fn seconds_round_to_the_nearest_tenth() {
        for (ms, want) in [
            (0, "0.0s"),
            (49, "0.0s"),
            (50, "0.1s"),
            (1949, "1.9s"),
            (1950, "2.0s"),
            (25_000, "25.0s"),
        ] {
            assert_eq!(seconds(Duration::from_millis(ms)), want, "{ms} ms");
        }
        assert_eq!(seconds(Duration::MAX), "18446744073709551616.0s", "no overflow");
    }

    /// `run`'s defaults.
    const RULES: Rules = Rules {
        min_drain: Duration::from_secs(5),
        deadline: Duration::from_secs(25),
        interval: Duration::from_millis(500),
        settle: Duration::ZERO,
        plan: run_plan(0, false),
    };

    fn progress(last: Option<Count>, unknown: Option<&str>) -> Progress {
        Progress { last, unknown: unknown.map(Failure::from), ..Progress::default() }
    }

    #[test]
    fn a_summary_after_a_failed_count_says_its_count_is_the_last_known() {
        let one =
            Count::new(SourceKind::Proc, Unit::Connections, vec![part("port 15006", 1)], vec![]);
        let stale = progress(
            Some(one),
            Some("failed to GET http://127.0.0.1:15000/stats: connection refused"),
        );
        let deadline =
            summary(Outcome::Deadline, Duration::from_millis(25_040), &RULES, &stale, (0, None));
        assert_eq!(
            deadline,
            "deadline of 25s passed after 25.0s with 1 active connection (proc) still open: \
             port 15006=1; the last count failed (failed to GET http://127.0.0.1:15000/stats: \
             connection refused), so this is the last known count"
        );
        let signal = summary(
            Outcome::Interrupted(libc::SIGTERM),
            Duration::from_secs(3),
            &RULES,
            &stale,
            (1, None),
        );
        assert_eq!(
            signal,
            "interrupted by SIGTERM after 3.0s with 1 active connection (proc): port 15006=1; \
             the last count failed (failed to GET http://127.0.0.1:15000/stats: connection \
             refused), so this is the last known count; 1 earlier log line was dropped, as \
             writing it would have blocked"
        );
        let nothing = summary(
            Outcome::NothingCounted,
            Duration::from_secs(25),
            &RULES,
            &progress(None, None),
            (2, Some("no space left on device")),
        );
        assert_eq!(
            nothing,
            "deadline of 25s passed after 25.0s and nothing could be counted: no source \
             answered; 2 earlier log lines were not written: no space left on device"
        );
    }

    #[test]
    fn a_quiet_hold_says_what_it_could_not_see() {
        let hold =
            Rules { plan: no_mesh(Duration::ZERO), settle: Duration::from_millis(500), ..RULES };
        let mut zero = Count::new(SourceKind::Proc, Unit::Connections, vec![], vec![]);
        zero.warnings = vec![Warning::Udp(vec![53, 5353]), Warning::Hiding(vec![9090])];
        zero.polls = 2;
        let line = summary(
            Outcome::Reached,
            Duration::from_secs(5),
            &hold,
            &progress(Some(zero), None),
            (0, None),
        );
        assert_eq!(
            line,
            "done after 5.0s: no request seen for 0.5s (UDP to port 53, 5353 is not seen; 2 \
             polls on kept-alive connections, after 5s of silence, left out), 0 active \
             connections (proc); the app gets its SIGTERM now"
        );
    }

    #[test]
    fn a_deadline_that_arrivals_held_says_so() {
        let at_deadline = |p: &Progress| {
            summary(Outcome::Deadline, Duration::from_secs(25), &RULES, p, (0, None))
        };
        let zero = Count::new(SourceKind::Clusters, Unit::Requests, vec![], vec![]);
        let mut p = progress(Some(zero), None);
        p.arrived_at = Some(Duration::from_millis(24_600));
        assert_eq!(
            at_deadline(&p),
            "deadline of 25s passed after 25.0s with 0 active requests (clusters) still open, and \
             new requests still arriving"
        );
        // Long ago: they stopped, and something else held the count.
        p.arrived_at = Some(Duration::from_secs(3));
        assert!(!at_deadline(&p).contains("arriving"), "{}", at_deadline(&p));
    }

    #[test]
    fn a_hold_that_kept_alive_clients_held_past_the_propagation_says_so_in_one_line() {
        let propagation = Duration::from_secs(15);
        let rules = Rules { plan: no_mesh(propagation), ..RULES };
        let open = vec![Part { name: "port 8080".to_string(), active: 2 }];
        let p = progress(Some(Count::new(SourceKind::Proc, Unit::Connections, open, vec![])), None);
        let kept = Outcome::KeptAlive(Duration::from_millis(9_240));
        assert_eq!(
            summary(kept, Duration::from_millis(15_020), &rules, &p, (0, None)),
            "propagation of 15s passed after 15.0s with requests arriving only on kept-alive \
             connections (no new connection for 9.2s): their clients reconnect elsewhere once the app closes them, 2 active connections (proc); the app gets its SIGTERM now"
        );
        // New connections that stopped only later: at the deadline, which it says.
        let said = summary(kept, Duration::from_secs(25), &rules, &p, (0, None));
        assert!(said.starts_with("deadline of 25s passed after 25.0s with requests"), "{said}");
    }

    #[test]
    fn a_hold_that_reached_its_deadline_says_whether_requests_were_still_arriving() {
        let rules =
            Rules { settle: Duration::from_secs(3), plan: no_mesh(Duration::ZERO), ..RULES };
        let zero = Count::new(SourceKind::Proc, Unit::Connections, vec![], vec![]);
        let mut p = progress(Some(zero), None);
        let said =
            |p: &Progress| summary(Outcome::Deadline, Duration::from_secs(2), &rules, p, (0, None));
        assert_eq!(
            said(&p),
            "deadline of 25s passed after 2.0s with no request seen, but not yet for 3.0s, 0 active \
             connections (proc); the app gets its SIGTERM now"
        );
        p.arrived_at = Some(Duration::from_millis(1_500));
        assert!(said(&p).contains(" with requests still arriving, "), "{}", said(&p));
        // Quiet for longer than the floor, not for as long as arrivals 4 s apart ask.
        let propagation = Duration::from_secs(15);
        let rules =
            Rules { settle: Duration::from_millis(500), plan: no_mesh(propagation), ..rules };
        let said =
            |p: &Progress| summary(Outcome::Deadline, Duration::from_secs(2), &rules, p, (0, None));
        p.arrived_at = Some(Duration::from_millis(500));
        let (gap, quiet) = (Duration::from_secs(4), Duration::from_millis(27_600));
        p.pace = Some(crate::outcome::Pace { gap, quiet });
        let short = " with arrivals every ~4.0s: the deadline is too short to tell they stopped, ";
        assert!(said(&p).contains(short), "{}", said(&p));
        // One after the propagation: the mesh still sends, later than it should.
        p.arrived_at = Some(Duration::from_millis(15_500));
        let said = summary(Outcome::Deadline, Duration::from_secs(18), &rules, &p, (0, None));
        assert!(
            said.contains(
                " with arrivals every ~4.0s still coming after the propagation (15.0s): the \
                 deadline is too short to tell they stopped, "
            ),
            "{said}"
        );
    }

    #[test]
    fn only_a_draining_envoy_is_said_to_fail_its_health_checks() {
        let answered =
            |status, body: &str| ready_said(&Ok(Reply { status, body: body.as_bytes().to_vec() }));
        assert!(
            answered(503, "DRAINING\n").ends_with("Envoy fails its health checks (POST /healthcheck/fail, `run --fail-healthcheck`), so load balancers that ask stop sending")
        );
        for starting in ["PRE_INITIALIZING\n", "INITIALIZING\n"] {
            assert_eq!(
                answered(503, starting),
                format!(
                    "answered 503 '{}': Envoy is still starting, waiting for its configuration",
                    starting.trim()
                )
            );
        }
        assert_eq!(answered(503, "busy"), "answered 503 'busy'");
    }
}
