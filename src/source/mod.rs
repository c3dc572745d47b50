//! The sources and the one decision between them, for `run`, `hold` and `status`: Envoy's stats,
//! else (auto) the kernel's socket table; for requests, the stats, else /clusters, else
//! connections; for `hold`'s arrivals, the socket table with /clusters at its pace.

pub(crate) mod admin;
pub mod arrivals;
pub mod clusters;
pub mod diag;
pub(crate) mod lines;
pub mod procnet;
pub(crate) mod sockets;
pub mod stats;
pub(crate) mod uds;

use crate::config::{Holding, Mode, Plan, SourceConfig};
use crate::count::{Before, Cost, Count, REQUEST_TIMEOUT, Unit, Warning};
use crate::error::{Failure, failed};
use admin::Client;
use arrivals::{SidecarArrivals, Tracker};
use clusters::CLUSTERS_PATH;
use sockets::{Pod, SocketTable};
use stats::{Hcm, REQUESTS_PATH, STATS_PATH};
use std::time::{Duration, Instant};

/// One attempt to count.
#[derive(Debug, Clone)]
pub(crate) struct Reading {
    pub(crate) result: Result<Count, Failure>,
    /// Why the preferred count was not made this time, if it was not.
    pub(crate) fallback: Option<Failure>,
}

/// What one answer of the stats said.
#[derive(Debug, Clone)]
pub(crate) struct StatsLook {
    pub(crate) connections: Result<Count, Failure>,
    /// With `--count requests`: the request count and each HTTP connection manager's figures.
    pub(crate) requests: Option<Result<(Count, Vec<Hcm>), Failure>>,
}

/// Everything one count looked at; a source that was not read is `None`.
#[derive(Debug, Clone)]
pub(crate) struct Look {
    pub(crate) stats: Option<StatsLook>,
    /// With `--count requests`, where the stats do not report requests.
    pub(crate) clusters: Option<Result<clusters::Answer, Failure>>,
    pub(crate) proc: Option<Result<Count, Failure>>,
}

/// The CPU time process `pid`'s main thread has run: the first field of its schedstat, in
/// nanoseconds (Documentation/scheduler/sched-stats.rst).
fn main_thread_cpu(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/schedstat")).ok()?;
    let ns: u64 = text.split_ascii_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// The CPU this process has used so far, all its threads.
fn process_cpu() -> Option<Duration> {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: t is a valid timespec for the call to fill.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    (r == 0).then(|| Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
}

/// A CPU clock read at a start: what it has run since (`None` where it cannot be read).
fn meter(clock: impl Fn() -> Option<Duration>) -> impl Fn() -> Option<Duration> {
    let start = clock();
    move || start.zip(clock()).map(|(before, after)| after.saturating_sub(before))
}

/// The least time the socket table is given, even at the deadline.
const PROC_GRACE: Duration = Duration::from_millis(100);

/// The instant `left` from now, within a year (the clock cannot hold centuries).
fn within(left: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(left)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}

pub(crate) struct Sources {
    pub(crate) mode: Mode,
    pub(crate) unit: Unit,
    pub(crate) admin: Client,
    /// What never counts in /clusters; its preset and `--ignore-ports` apply to the stats too.
    clusters: clusters::HostScope,
    arrived: clusters::Arrived,
    table: SocketTable,
    spent: Spent,
    /// Why the stats gave no requests at the last count, whose requests came from /clusters: the
    /// next count asks /clusters first (Envoy's stats matcher never changes, and a filtered
    /// /stats answer costs Envoy almost half of what /clusters costs).
    clusters_first: Option<Failure>,
    /// The time the next stats request is given: a second, doubled after each one that ran out of
    /// it, up to `MAX_STATS_TIMEOUT`.
    stats_timeout: Duration,
    reads: Reads,
}

/// What a look reads: `run`'s count (and `status`'s), or `hold`'s arrivals, tracked between looks:
/// from the socket table alone where no Envoy is in the pod, or behind a sidecar from the table
/// and /clusters.
enum Reads {
    Count,
    Arrivals(Box<Tracker>, Option<SidecarArrivals>),
}

/// What a look spends beyond its own time: how long it waited on Envoy's admin API, what its
/// requests cost Envoy's main thread in CPU where its process is known (a stalled Envoy costs
/// nothing), and the time and own CPU of a /clusters read paced on its own, which does not pace
/// the looks.
#[derive(Debug, Clone, Copy, Default)]
struct Spent {
    admin: Duration,
    envoy_cpu: Option<Duration>,
    aside: Duration,
    aside_cpu: Duration,
}

/// Envoy's uptime in seconds (`server.*`, which Istio's stats matcher keeps).
const UPTIME_PATH: &str = "/stats?filter=%5Eserver%5C.uptime%24";

/// The longest a stats request may be given, however slow Envoy has been.
const MAX_STATS_TIMEOUT: Duration = Duration::from_secs(8);

impl Sources {
    /// The sources of `plan`'s hook: `hold` reads arrivals by its rule.
    pub(crate) fn new(c: &SourceConfig, plan: &Plan) -> Sources {
        Sources {
            mode: c.mode,
            unit: c.unit,
            admin: Client::envoy(c.admin.clone()),
            clusters: clusters::HostScope {
                preset: c.preset,
                ignore_clusters: c.ignore_clusters.clone(),
                ignore_ports: c.filter.ignore.clone(),
                app_only: matches!(plan, Plan::Hold(_)),
            },
            arrived: clusters::Arrived::default(),
            table: SocketTable::new(c),
            spent: Spent::default(),
            clusters_first: None,
            stats_timeout: REQUEST_TIMEOUT,
            reads: match plan {
                Plan::Run { .. } => Reads::Count,
                Plan::Hold(h) => Reads::Arrivals(
                    // SAFETY: geteuid has no preconditions and cannot fail.
                    Box::new(Tracker::new(h.arrivals.clone(), unsafe { libc::geteuid() })),
                    matches!(h.holding, Holding::Sidecar(_)).then(SidecarArrivals::default),
                ),
            },
        }
    }

    /// The socket table, told what the admin API's last answer said of who listens there.
    fn table(&mut self) -> &mut SocketTable {
        self.table.not_envoy = self.admin.not_envoy();
        &mut self.table
    }

    pub(crate) fn reader(&self) -> &sockets::Reader {
        &self.table.reader
    }

    /// One query for whatever is counted: connections, or connections and requests together.
    fn stats_path(&self) -> &'static str {
        if self.unit == Unit::Requests { REQUESTS_PATH } else { STATS_PATH }
    }

    pub(crate) fn stats_url(&self) -> String {
        self.admin.url(self.stats_path())
    }

    /// One count, what the socket table says about the pod (not read for `hold`, which runs
    /// before the app's SIGTERM: its sockets tell nothing then), and what it cost, within `left`.
    pub(crate) fn measure(
        &mut self,
        left: Duration,
    ) -> (Reading, Option<Result<Pod, Failure>>, Cost) {
        let until = within(left.max(PROC_GRACE));
        let (asked, own) = (Instant::now(), meter(process_cpu));
        let mut reading = decide(&self.look(left, false));
        let pod = matches!(self.reads, Reads::Count).then(|| self.table().pod(until));
        if let (Some(Err(why)), Ok(count)) = (&pod, &mut reading.result) {
            count.warnings.push(Warning::Undelivered(why.clone()));
        }
        let s = self.spent;
        let cost = Cost {
            look: asked.elapsed().saturating_sub(s.aside),
            admin: s.admin,
            cpu: own()
                .zip(s.envoy_cpu)
                .map(|(own, envoy)| own.saturating_sub(s.aside_cpu).saturating_add(envoy)),
        };
        (reading, pod, cost)
    }

    /// What the socket table says about the pod now, read within `left`.
    pub(crate) fn pod(&mut self, left: Duration) -> Result<Pod, Failure> {
        self.table().pod(within(left.max(PROC_GRACE)))
    }

    /// Reads the sources the mode allows, in the decision's order, as far as one can count; with
    /// `every`, all of them (`status` shows each).
    pub(crate) fn look(&mut self, left: Duration, every: bool) -> Look {
        let until = within(left);
        self.spent = Spent::default();
        let admin = self.mode != Mode::Proc;
        // Found once, before the requests are timed: Envoy's main thread is its process's first.
        let envoy = admin.then(|| self.table().envoy_pid(until)).flatten();
        let (asked, envoy_cpu) = (Instant::now(), meter(move || envoy.and_then(main_thread_cpu)));
        match &mut self.reads {
            Reads::Count => {}
            Reads::Arrivals(tracker, None) => {
                let proc_until = until.max(Instant::now() + PROC_GRACE);
                let proc = Some(self.table.arrivals(tracker, proc_until));
                return Look { stats: None, clusters: None, proc };
            }
            Reads::Arrivals(tracker, Some(state)) => {
                let (mut tracker, mut state) = (std::mem::take(tracker), std::mem::take(state));
                let look =
                    self.sidecar_arrivals((&mut tracker, &mut state), until, asked, envoy_cpu);
                self.reads = Reads::Arrivals(tracker, Some(state));
                return look;
            }
        }
        let requests = self.unit == Unit::Requests;
        let known = self.clusters_first.clone().filter(|_| admin && !every && requests);
        let stats = match &known {
            // What the stats said before, so that the count says why it comes from /clusters.
            Some(why) => Some(StatsLook {
                connections: Err(Failure::from("not asked: the count comes from /clusters")),
                requests: Some(Err(why.clone())),
            }),
            None => admin.then(|| self.stats(until)),
        };
        let stats_requests = stats.as_ref().is_some_and(|s| matches!(s.requests, Some(Ok(_))));
        let mut look = Look { stats, clusters: None, proc: None };
        if admin && requests && (every || !stats_requests) {
            look.clusters = Some(self.clusters(until));
        }
        if known.is_some() && matches!(look.clusters, Some(Err(_))) {
            look.stats = Some(self.stats(until));
        }
        self.clusters_first = match (&look.clusters, &look.stats) {
            (Some(Ok(_)), Some(StatsLook { requests: Some(Err(why)), .. })) if !every => {
                Some(why.clone())
            }
            _ => None,
        };
        (self.spent.admin, self.spent.envoy_cpu) = (asked.elapsed(), envoy_cpu());
        if self.mode != Mode::Stats && (every || decide(&look).result.is_err()) {
            // A hung admin API may have used up the time: the socket table still gets its moment.
            let proc_until = until.max(Instant::now() + PROC_GRACE);
            look.proc = Some(self.table().count(proc_until));
        }
        look
    }

    /// `hold` behind a sidecar: the socket table at every look, /clusters when its own pace allows
    /// or the table cannot tell; the table last, so that it shows what arrived until the look's end.
    fn sidecar_arrivals(
        &mut self,
        (tracker, state): (&mut Tracker, &mut SidecarArrivals),
        until: Instant,
        asked: Instant,
        envoy_cpu: impl Fn() -> Option<Duration>,
    ) -> Look {
        let left = until.saturating_duration_since(asked).saturating_sub(PROC_GRACE);
        let mut blocked = false;
        let clusters = state.clusters_limit(asked, left).map(|limit| {
            let own = meter(process_cpu);
            let answer = self.clusters(within(limit));
            let took = asked.elapsed();
            (self.spent.admin, self.spent.envoy_cpu) = (took, envoy_cpu());
            blocked = state.clusters_read(asked, took, self.spent.envoy_cpu);
            if !state.table_blind {
                (self.spent.aside, self.spent.aside_cpu) = (took, own().unwrap_or_default());
                self.spent.envoy_cpu = Some(Duration::ZERO);
            }
            answer
        });
        // At the first answer, the app's requests so far over Envoy's uptime: how often they came
        // before the hold (its hosts are made with the inbound clusters, as Envoy starts).
        if let Some(Ok(answer)) = &clusters
            && state.life.is_none()
        {
            let mut uptime = None;
            let left = until.saturating_duration_since(Instant::now()).min(REQUEST_TIMEOUT);
            let parse = |l: &str| l.strip_prefix("server.uptime: ")?.trim().parse::<u64>().ok();
            let _ = self.admin.get_lines(UPTIME_PATH, left, admin::BODY_LIMIT, |l| {
                uptime = uptime.or(parse(l));
            });
            let requests = answer.app_arrived.requests;
            state.life = Some(uptime.filter(|u| *u > 0 && requests > 0).map(|u| Before {
                arrivals: requests,
                span: Duration::from_secs(u),
                recent: None,
            }));
        }
        let proc = self.table.arrivals(tracker, until.max(Instant::now() + PROC_GRACE));
        let (clusters, proc) = state.merge(clusters, proc, tracker.probes, blocked);
        Look { stats: None, clusters, proc: Some(proc) }
    }

    fn stats(&mut self, until: Instant) -> StatsLook {
        let requests = self.unit == Unit::Requests;
        let timeout = self.stats_timeout.min(until.saturating_duration_since(Instant::now()));
        let asked = Instant::now();
        let mut lines = stats::Lines::new(&self.clusters.ignore_ports, self.clusters.preset);
        let got =
            self.admin.get_lines(self.stats_path(), timeout, admin::BODY_LIMIT, |l| lines.add(l));
        if got.is_err() && asked.elapsed() >= timeout {
            self.stats_timeout = self.stats_timeout.saturating_mul(2).min(MAX_STATS_TIMEOUT);
        }
        let connections =
            got.map_err(|f| failed("GET", self.stats_url(), f)).and_then(|()| lines.connections());
        // A failed answer fails both counts alike.
        let requests = requests
            .then(|| connections.as_ref().map_err(Failure::clone).and_then(|c| lines.requests(c)));
        StatsLook { connections, requests }
    }

    /// Envoy's per-host counters, read line by line as they arrive.
    fn clusters(&mut self, until: Instant) -> Result<clusters::Answer, Failure> {
        let mut tally = clusters::HostTally::default();
        let left = until.saturating_duration_since(Instant::now());
        self.admin
            .get_lines(CLUSTERS_PATH, left, u64::MAX, |line| tally.add_line(line, &self.clusters))
            .map_err(|f| failed("GET", self.admin.url(CLUSTERS_PATH), f))?;
        let mut answer = tally.finish()?;
        let arrivals = self.arrived.add(std::mem::take(&mut answer.counters));
        answer.count.arrivals = arrivals;
        Ok(answer)
    }
}

/// The one decision: requests from the stats, else from /clusters; then connections from the
/// stats, else (auto) from the socket table; and why the preferred count is not in force.
pub(crate) fn decide(look: &Look) -> Reading {
    let mut why: Vec<Failure> = Vec::new();
    if let Some(s) = &look.stats {
        match &s.requests {
            Some(Ok((count, _))) => return reading(count, why),
            Some(Err(e)) => why.push(e.clone()),
            None => {}
        }
    }
    match &look.clusters {
        Some(Ok(a)) => return reading(&a.count, why),
        Some(Err(e)) => why.push(Failure::In("/clusters", Box::new(e.clone()))),
        None => {}
    }
    if let Some(s) = &look.stats {
        match &s.connections {
            Ok(count) => return reading(count, why),
            // The same failure as the requests' when the whole answer failed.
            Err(e) if !why.contains(e) => why.push(e.clone()),
            Err(_) => {}
        }
    }
    let fallback = (!why.is_empty()).then_some(Failure::Each(why));
    let result = match (&look.proc, &fallback) {
        (Some(Ok(c)), _) => Ok(c.clone()),
        (Some(Err(proc)), Some(why)) => Err(Failure::Each(vec![
            Failure::In("stats", Box::new(why.clone())),
            Failure::In("proc", Box::new(proc.clone())),
        ])),
        (Some(Err(proc)), None) => Err(proc.clone()),
        (None, Some(why)) => return Reading { result: Err(why.clone()), fallback: None },
        (None, None) => Err(Failure::from("no source was read")),
    };
    Reading { result, fallback }
}

fn reading(count: &Count, why: Vec<Failure>) -> Reading {
    Reading { result: Ok(count.clone()), fallback: (!why.is_empty()).then_some(Failure::Each(why)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Address;
    use crate::count::SourceKind;
    use std::net::{SocketAddr, TcpListener};
    use std::path::PathBuf;

    /// A loopback port nothing listens on: bound, then closed.
    fn refused() -> SocketAddr {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
    }

    fn dir(name: &str, tcp: Option<&str>) -> PathBuf {
        let d = std::env::temp_dir().join(format!("envoy-drain-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        if let Some(text) = tcp {
            std::fs::write(d.join("tcp"), text).unwrap();
        }
        d
    }

    fn sources(mode: Mode, proc_net: PathBuf) -> Sources {
        let config = SourceConfig {
            preset: crate::preset::ISTIO,
            admin: Address::Tcp(refused()),
            mode,
            unit: Unit::Connections,
            filter: crate::config::Filter::default(),
            ignore_clusters: crate::lists::Names::default(),
            proc_net: Some(proc_net),
            warnings: vec![],
        };
        Sources::new(&config, &crate::config::tests::run_plan(0, false))
    }

    /// A listener on 8080 and one connection it accepted.
    const ONE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:1F90 0200007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1
";

    #[test]
    fn auto_falls_back_to_the_socket_table_and_says_why() {
        let d = dir("auto", Some(ONE));
        let r = decide(&sources(Mode::Auto, d.clone()).look(Duration::from_secs(1), false));
        std::fs::remove_dir_all(&d).unwrap();
        let c = r.result.unwrap();
        assert_eq!((c.source, c.total), (SourceKind::Proc, 1));
        let why = r.fallback.unwrap();
        assert!(
            why.starts_with("failed to GET http://127.0.0.1:")
                && why.ends_with(": connection refused"),
            "{why}"
        );
    }

    #[test]
    fn stats_only_does_not_fall_back_and_asks_nothing_without_time_left() {
        let d = dir("stats-only", Some(ONE));
        let mut stats = sources(Mode::Stats, d.clone());
        let (r, late) = (
            decide(&stats.look(Duration::from_secs(1), false)),
            decide(&stats.look(Duration::ZERO, false)),
        );
        std::fs::remove_dir_all(&d).unwrap();
        assert!(r.result.unwrap_err().contains("connection refused"));
        assert!(late.result.unwrap_err().ends_with("no time left before the deadline"));
    }

    #[test]
    fn one_table_missing_is_fine_both_missing_is_unknown() {
        let d = dir("missing", Some(ONE));
        let count = |d: &PathBuf| {
            decide(&sources(Mode::Proc, d.clone()).look(Duration::from_secs(1), false)).result
        };
        assert_eq!(count(&d).unwrap().total, 1);
        std::fs::remove_file(d.join("tcp")).unwrap();
        let e = count(&d).unwrap_err();
        std::fs::remove_dir_all(&d).unwrap();
        assert!(
            e.starts_with("failed to read ") && e.ends_with("/tcp and tcp6: neither exists"),
            "{e}"
        );
    }

    fn proc_count(n: u64) -> Count {
        let part = crate::count::Part { name: "port 15006".to_string(), active: n };
        Count::new(SourceKind::Proc, Unit::Connections, vec![part], vec![])
    }

    fn answer(n: u64) -> Count {
        let part = crate::count::Part { name: "0.0.0.0_15006".to_string(), active: n };
        Count::new(SourceKind::Stats, Unit::Connections, vec![part], vec![])
    }

    #[test]
    fn the_decision_prefers_requests_then_connections_then_the_socket_table() {
        let stats =
            |connections: Result<Count, Failure>, requests| StatsLook { connections, requests };
        let requests = Count::new(SourceKind::Stats, Unit::Requests, vec![], vec![]);
        let cases = [
            (
                stats(Ok(answer(2)), Some(Ok((requests, vec![])))),
                Some(Ok(proc_count(5))),
                Ok("0 active requests".to_string()),
                None,
            ),
            (
                stats(Ok(answer(2)), Some(Err(Failure::from("no rq")))),
                Some(Ok(proc_count(5))),
                Ok("2 active connections".to_string()),
                Some("no rq"),
            ),
            (
                stats(Err(Failure::from("refused")), None),
                Some(Ok(proc_count(5))),
                Ok("5 active connections".to_string()),
                Some("refused"),
            ),
            (
                stats(Err(Failure::from("refused")), None),
                Some(Err(Failure::from("no table"))),
                Err(Failure::from("stats: refused; proc: no table")),
                Some("refused"),
            ),
            (stats(Err(Failure::from("refused")), None), None, Err(Failure::from("refused")), None),
        ];
        for (s, proc, want, fallback) in cases {
            let r = decide(&Look { stats: Some(s), clusters: None, proc });
            let to_text = |e: Failure| e.to_string();
            assert_eq!(r.result.map(|c| c.describe()).map_err(to_text), want.map_err(to_text));
            assert_eq!(r.fallback.map(|f| f.to_string()).as_deref(), fallback);
        }
        let proc_only =
            decide(&Look { stats: None, clusters: None, proc: Some(Ok(proc_count(1))) });
        assert_eq!(proc_only.result.unwrap().total, 1);
        assert_eq!(proc_only.fallback, None);
    }

    #[test]
    fn without_request_stats_requests_come_from_clusters_and_say_why() {
        let clusters_answer = |n| clusters::Answer {
            count: Count {
                excluded: vec![crate::count::Excluded { why: "x".to_string(), n }],
                ..Count::new(SourceKind::Clusters, Unit::Requests, vec![], vec![])
            },
            clusters: vec![],
            quiet: 0,
            counters: vec![],
            app_arrived: clusters::AppArrived::default(),
        };
        let no_rq =
            StatsLook { connections: Ok(answer(2)), requests: Some(Err(Failure::from("no rq"))) };
        let r = decide(&Look {
            stats: Some(no_rq.clone()),
            clusters: Some(Ok(clusters_answer(0))),
            proc: None,
        });
        assert_eq!(r.result.unwrap().source, SourceKind::Clusters);
        assert_eq!(r.fallback.map(|f| f.to_string()).as_deref(), Some("no rq"));
        let r = decide(&Look {
            stats: Some(no_rq),
            clusters: Some(Err(Failure::from("refused"))),
            proc: None,
        });
        let c = r.result.unwrap();
        assert_eq!((c.source, c.unit), (SourceKind::Stats, Unit::Connections));
        assert_eq!(r.fallback.map(|f| f.to_string()).as_deref(), Some("no rq; /clusters: refused"));
        let all_down = StatsLook {
            connections: Err(Failure::from("refused")),
            requests: Some(Err(Failure::from("refused"))),
        };
        let r = decide(&Look {
            stats: Some(all_down),
            clusters: Some(Err(Failure::from("refused"))),
            proc: Some(Ok(proc_count(3))),
        });
        assert_eq!(r.result.unwrap().source, SourceKind::Proc);
        assert_eq!(
            r.fallback.map(|f| f.to_string()).as_deref(),
            Some("refused; /clusters: refused"),
            "the same failure is said once"
        );
    }
}
