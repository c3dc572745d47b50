//! What a source reports: a total, its parts, and where it came from (data; text.rs words it);
//! what a look cost (`Cost`) and the pace counting keeps (`COST_SPACING`, `REQUEST_TIMEOUT`); what keeps
//! the pod's connections busy (`Busy`), and what the kernel remembers of earlier arrivals (`Before`).

use crate::error::Failure;
use std::time::Duration;

/// Where a count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SourceKind {
    /// Envoy's admin API: `listener.<L>.downstream_cx_active`.
    #[default]
    Stats,
    /// The kernel's socket table: `/proc/net/tcp` and `tcp6`.
    Proc,
    /// Envoy's per-host counters: `GET /clusters`.
    Clusters,
}

/// What a count counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unit {
    #[default]
    Connections,
    /// HTTP requests in flight, plus the connections of listeners that carry no HTTP (TCP proxy).
    Requests,
}

/// The part of a request count that is connections without HTTP (TCP proxy streams).
pub(crate) const NON_HTTP: &str = "non-HTTP connections";

/// One listener, port, cluster or HTTP connection manager, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Part {
    pub name: String,
    pub active: u64,
}

/// What a count left out, and why: sockets, listeners or a cluster's hosts, with their
/// connections or requests. `status` lists them so nobody has to guess.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Excluded {
    pub(crate) why: String,
    pub n: u64,
}

/// A successful count.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Count {
    pub(crate) source: SourceKind,
    pub(crate) unit: Unit,
    pub total: u64,
    /// In the source's order; for stats every counted listener, also those at 0.
    pub parts: Vec<Part>,
    /// Things the parser skipped or corrected, each worth one warning per run.
    pub(crate) warnings: Vec<Warning>,
    /// What was seen but not counted.
    pub excluded: Vec<Excluded>,
    /// How the count told what counts (whose sockets are Envoy's), worth a line when it changes.
    pub(crate) basis: Option<Basis>,
    /// What tells a new connection or request from those counted before.
    pub(crate) arrivals: Option<u64>,
    /// Arrivals recounted so far (`source::arrivals::SidecarArrivals`).
    pub(crate) recounted: u64,
    /// Of the arrivals, new connections so far, where the source tells them from requests on
    /// connections open before (the socket table).
    pub(crate) opened: Option<u64>,
    /// Polls on kept-alive connections left out so far (`hold`, the socket table).
    pub(crate) polls: u64,
    /// At the first read, what the kernel remembers of arrivals before it.
    pub(crate) before: Option<Before>,
    /// How long ago the newest arrival came, where the source can tell.
    pub(crate) newest: Option<Duration>,
}

/// What a count could not see, or corrected: said once a run (text.rs words it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Warning {
    /// Why `/proc/net/snmp` could not be read.
    Snmp(Failure),
    /// Why netlink could not be read: the text tables are.
    TextTables(Failure),
    /// The text tables tell no bytes received: arrivals unknown.
    NoBytes,
    /// What `hold` cannot see: datagrams to the UDP ports the pod serves (the kernel counts none
    /// per socket).
    Udp(Vec<u16>),
    /// These ports listen, take clients from outside the pod and do not count: connections to
    /// those that do which leave no socket (closed between two reads) are not seen unless reset.
    Hiding(Vec<u16>),
    /// Connections that left no socket count (PassiveOpens).
    Unseen,
    /// Gauges that wrapped below zero: how many, and the first one's name.
    Wrapped { n: u64, first: String },
    /// Why /clusters failed: arrivals from the socket table alone.
    ClustersFailed(Failure),
    /// The socket table sees arrivals that /clusters does not.
    PastEnvoy,
    /// Why the socket table failed: arrivals from /clusters alone.
    ClustersAlone(Failure),
    /// Why the socket table failed: what the pod still delivers is not known, and holds nothing.
    Undelivered(Failure),
}

/// Connections the pod accepted that a request still keeps busy: bytes written to them that
/// their peer has not acknowledged yet (a response still being delivered), or a request their
/// peer sent last, not answered yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Busy {
    pub delivering: u64,
    pub awaiting: u64,
}

/// What a source remembers of `hold`'s arrivals before its first read: how many came over how
/// long (the connections closed in the last minute, which wait in TIME_WAIT; or those the pod's
/// namespace accepted over its life), and of the last 10 s the newest's age and the longest
/// pause between two (`None`: none came then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Before {
    pub arrivals: u64,
    pub span: Duration,
    pub recent: Option<(Duration, Duration)>,
}

/// How a socket-table count told Envoy's sockets from the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Basis {
    /// Envoy is the process holding the admin listener; its sockets are the ones it holds.
    Process { pid: u32, uid: u32, admin: String },
    /// Its process could not be read (`why`): Envoy's sockets are its admin listener owner's.
    Owner { uid: u32, admin: String, why: Failure },
    /// Nothing listens on the admin address, or what does is not taken as Envoy (`not_envoy`
    /// says why): any listener's connections count, which may hold more than Envoy's.
    Unknown { admin: String, not_envoy: Option<String> },
}

impl Basis {
    /// Envoy's user, when known.
    pub(crate) fn uid(&self) -> Option<u32> {
        match self {
            Basis::Process { uid, .. } | Basis::Owner { uid, .. } => Some(*uid),
            Basis::Unknown { .. } => None,
        }
    }
}

impl Count {
    pub fn new(source: SourceKind, unit: Unit, parts: Vec<Part>, warnings: Vec<Warning>) -> Count {
        let total = parts.iter().map(|p| p.active).fold(0, u64::saturating_add);
        Count { source, unit, total, parts, warnings, ..Count::default() }
    }
}

/// What one look took, the part spent waiting on Envoy, and where measured the CPU it cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cost {
    pub look: Duration,
    pub admin: Duration,
    pub cpu: Option<Duration>,
}

impl Cost {
    /// What paces the next count: the CPU the look cost, else its time (waiting on a stopped
    /// Envoy costs nothing).
    pub(crate) fn paced(&self) -> Duration {
        self.cpu.unwrap_or(self.look)
    }
}

/// Two admin requests start at least this many times the last one's cost apart, so that counting
/// takes at most 1/COST_SPACING of Envoy's main thread (which also applies its configuration) and of the
/// proxy container's CPU, which a preStop shares.
pub(crate) const COST_SPACING: u32 = 20;

/// The time a request is given: a loopback admin API answers in milliseconds. A stats request that
/// ran out of it gets more the next time, and /clusters the time left (`Sources`).
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// How many named rows of an answer a count keeps for `status`; the rest are added up as one.
pub(crate) const KEPT: usize = 1000;

/// Rows kept up to `KEPT`; past them, how many more there were and their figures added up.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Capped<T> {
    pub(crate) rows: Vec<T>,
    more: u64,
    rest: [u64; 2],
}

impl<T: Clone> Capped<T> {
    /// Keeps `row()` (`true`), or past `KEPT` adds `figures` to the rest.
    pub(crate) fn keep(&mut self, row: impl FnOnce() -> T, figures: [u64; 2]) -> bool {
        if self.rows.len() < KEPT {
            self.rows.push(row());
            return true;
        }
        self.more += 1;
        self.rest =
            [self.rest[0].saturating_add(figures[0]), self.rest[1].saturating_add(figures[1])];
        false
    }

    /// The rows, then the rest as one row (`rest(how many, their figures)`) if there were any.
    pub(crate) fn all(&self, rest: impl FnOnce(u64, [u64; 2]) -> T) -> Vec<T> {
        let mut rows = self.rows.clone();
        rows.extend((self.more > 0).then(|| rest(self.more, self.rest)));
        rows
    }
}
