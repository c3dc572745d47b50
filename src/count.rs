//! What a source reports: a total, the parts it is made of, and where it came from.

/// Keeps hostile text to one readable piece of a line.
pub fn shorten(text: &str) -> String {
    const MAX: usize = 80;
    match text.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

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

impl SourceKind {
    pub fn name(self) -> &'static str {
        match self {
            SourceKind::Stats => "stats",
            SourceKind::Proc => "proc",
            SourceKind::Clusters => "clusters",
        }
    }

    /// How a part is named in log lines: stats parts are listener names, the others already
    /// say what they are (`port 15006`, `port 8080 (TPROXY)`, `cluster inbound|8080||`).
    pub fn label(self, part: &str) -> String {
        match self {
            SourceKind::Stats => format!("listener {part}"),
            SourceKind::Proc | SourceKind::Clusters => part.to_string(),
        }
    }
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
}

/// How a socket-table count told Envoy's sockets from the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Basis {
    pub text: String,
    /// Envoy's sockets could not be told apart, so the count may hold more than Envoy's.
    pub degraded: bool,
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
        }
    }

    pub fn with_excluded(self, excluded: Vec<Excluded>) -> Count {
        Count { excluded, ..self }
    }

    pub fn with_basis(self, basis: Basis) -> Count {
        Count {
            basis: Some(basis),
            ..self
        }
    }

    /// A request count from Envoy's stats; `NON_HTTP` names the part that is connections.
    pub fn requests(parts: Vec<Part>, warnings: Vec<String>) -> Count {
        Count::of(SourceKind::Stats, Unit::Requests, parts, warnings)
    }

    /// `3 active connections`; `2 active requests`, or with TCP streams
    /// `2 active requests and 1 non-HTTP connection`.
    pub fn describe(&self) -> String {
        let plural =
            |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        match self.unit {
            Unit::Connections => plural(self.total, "active connection", "active connections"),
            Unit::Requests => {
                let tcp = self
                    .parts
                    .iter()
                    .filter(|p| p.name == NON_HTTP)
                    .map(|p| p.active)
                    .sum::<u64>();
                let requests = plural(self.total - tcp, "active request", "active requests");
                if tcp == 0 {
                    requests
                } else {
                    format!(
                        "{requests} and {}",
                        plural(tcp, "non-HTTP connection", "non-HTTP connections")
                    )
                }
            }
        }
    }

    /// `listener 0.0.0.0_15006=2, listener [__1]_15007=1`: the non-zero parts.
    pub fn breakdown(&self) -> String {
        let open: Vec<String> = self
            .parts
            .iter()
            .filter(|p| p.active > 0)
            .map(|p| match self.unit {
                Unit::Connections => format!("{}={}", self.source.label(&p.name), p.active),
                Unit::Requests => format!("{}={}", p.name, p.active),
            })
            .collect();
        open.join(", ")
    }

    /// `: listener 0.0.0.0_15006=2`, or nothing when no part is open.
    pub fn still_open(&self) -> String {
        let b = self.breakdown();
        if b.is_empty() { b } else { format!(": {b}") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(name: &str, active: u64) -> Part {
        Part {
            name: name.to_string(),
            active,
        }
    }

    #[test]
    fn total_sums_parts_and_breakdown_names_only_open_ones() {
        let c = Count::new(
            SourceKind::Stats,
            vec![
                part("b_15006", 2),
                part("a_15001", 0),
                part("[__1]_8080", 1),
            ],
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
        let with_tcp = Count::requests(
            vec![part("http inbound_0.0.0.0_8080", 2), part(NON_HTTP, 1)],
            vec![],
        );
        assert_eq!(with_tcp.total, 3);
        assert_eq!(
            with_tcp.describe(),
            "2 active requests and 1 non-HTTP connection"
        );
        assert_eq!(
            with_tcp.breakdown(),
            "http inbound_0.0.0.0_8080=2, non-HTTP connections=1"
        );
        let one = Count::requests(
            vec![part("http inbound_0.0.0.0_8080", 1), part(NON_HTTP, 0)],
            vec![],
        );
        assert_eq!(one.describe(), "1 active request");
    }

    #[test]
    fn one_connection_is_singular_and_nothing_open_has_no_breakdown() {
        let one = Count::new(SourceKind::Proc, vec![part("port 15006", 1)], vec![]);
        assert_eq!(one.describe(), "1 active connection");
        assert_eq!(one.still_open(), ": port 15006=1");
        let none = Count::new(SourceKind::Proc, vec![], vec![]);
        assert_eq!(none.still_open(), "");
    }
}
