//! What a source reports: a total, the parts it is made of, and where it came from (data only;
//! text.rs words it).

/// Where a count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// Envoy's admin API: `listener.<L>.downstream_cx_active`.
    Stats,
    /// The kernel's socket table: `/proc/net/tcp` and `tcp6`.
    Proc,
    /// Envoy's per-host counters: `GET /clusters`.
    Clusters,
}

/// What a count counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Connections,
    /// HTTP requests in flight, plus the connections of listeners that carry no HTTP (TCP proxy).
    Requests,
}

/// The part of a request count that is connections without HTTP (TCP proxy streams).
pub const NON_HTTP: &str = "non-HTTP connections";

/// One listener (stats) or one port (proc) and how many connections it holds; with requests, one
/// HTTP connection manager (`http <stat prefix>`) and its requests, or the non-HTTP connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub name: String,
    pub active: u64,
}

/// Sockets seen but left out of a count, and why: `status` lists them so nobody has to guess.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excluded {
    pub why: String,
    pub n: u64,
}

/// A successful count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Count {
    pub source: SourceKind,
    pub unit: Unit,
    pub total: u64,
    /// In the source's order (Envoy sorts its stats by name; proc sorts by port); for stats every
    /// counted listener, also those at 0.
    pub parts: Vec<Part>,
    /// Things the parser skipped or corrected, each worth one warning per run.
    pub warnings: Vec<String>,
    /// What was seen but not counted.
    pub excluded: Vec<Excluded>,
    /// How the count told what counts (whose sockets are Envoy's), worth a line when it changes.
    pub basis: Option<Basis>,
    /// What tells a new connection or request from those counted before.
    pub arrivals: Arrivals,
}

/// What tells whether a request has arrived since an earlier count: while one still does, the
/// pod is still in some client's endpoints, whatever the count (between two short requests it
/// touches zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Arrivals {
    /// The source cannot tell: Istio's stats matcher leaves Envoy's `_total` counters out, and
    /// the socket table only shows what is open at the moment it is read.
    #[default]
    Unknown,
    /// Requests so far (`rq_total` of the hosts that count, from /clusters), a counter.
    Requests(u64),
}

/// How a socket-table count told Envoy's sockets from the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Basis {
    /// Envoy is the process holding the admin listener; its sockets are the ones it holds.
    Process { pid: u32, uid: u32, admin: String },
    /// Its process could not be read (`why`): Envoy's sockets are its admin listener owner's.
    Owner { uid: u32, admin: String, why: String },
    /// Nothing listens on the admin address, or what does is not taken as Envoy (`not_envoy`
    /// says why): any listener's connections count, which may hold more than Envoy's.
    Unknown { admin: String, not_envoy: Option<String> },
}

impl Count {
    /// A connection count.
    pub fn new(source: SourceKind, parts: Vec<Part>, warnings: Vec<String>) -> Count {
        Count::of(source, Unit::Connections, parts, warnings)
    }

    pub fn of(source: SourceKind, unit: Unit, parts: Vec<Part>, warnings: Vec<String>) -> Count {
        Count {
            source,
            unit,
            total: parts.iter().map(|p| p.active).fold(0, u64::saturating_add),
            parts,
            warnings,
            excluded: Vec::new(),
            basis: None,
            arrivals: Arrivals::Unknown,
        }
    }

    /// A request count from Envoy's stats; `NON_HTTP` names the part that is connections.
    pub fn requests(parts: Vec<Part>, warnings: Vec<String>) -> Count {
        Count::of(SourceKind::Stats, Unit::Requests, parts, warnings)
    }
}
