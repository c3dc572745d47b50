//! Interprets Envoy's filtered /stats answer (pure: lines in, count out): `downstream_cx_active`,
//! and with `--count requests` `downstream_rq_active` too. Rules and format: docs/how-it-works.md,
//! "Envoy's stats".

use crate::count::{Capped, Count, Excluded, NON_HTTP, Part, SourceKind, Unit, Warning};
use crate::error::{Failure, shorten};
use crate::lists::{PortSet, any};
use crate::preset::Preset;
use crate::source::lines::decimal;
use std::collections::HashMap;

/// Istio's pilot-agent's query, filtered inside Envoy, with `type=Gauges` so that Envoy leaves its
/// counters and histograms unvisited; `$` percent-encoded.
pub(crate) const STATS_PATH: &str = "/stats?usedonly&type=Gauges&filter=downstream_cx_active%24";

/// Connections and requests in one answer: `downstream_(cx|rq)_active$`, percent-encoded.
pub(crate) const REQUESTS_PATH: &str =
    "/stats?usedonly&type=Gauges&filter=downstream_%28cx%7Crq%29_active%24";

const PREFIX: &str = "listener.";
const SUFFIX: &str = ".downstream_cx_active";
/// Always present when the stat is enabled: our own admin connection is active while Envoy answers.
const ADMIN_LINE: &str = "listener.admin.downstream_cx_active";

/// Always present when request stats are enabled: our own request is in flight while Envoy answers.
const ADMIN_RQ_LINE: &str = "http.admin.downstream_rq_active";

/// A gauge above this has wrapped below zero (istio/istio #49229); it means 0.
pub(crate) const WRAPPED: u64 = 1 << 63;

/// One HTTP connection manager's requests and connections, for `status`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hcm {
    pub(crate) prefix: String,
    pub(crate) requests: u64,
    pub(crate) connections: u64,
}

/// An answer read line by line as it arrives: each line is checked, and only the figures the
/// counts need are kept. The filter asks for gauges only, so a line of any other shape makes the
/// answer unreadable. A gauge that wrapped below zero counts as 0; one warning says how many did.
#[derive(Debug, Default)]
pub struct Lines {
    ignore: PortSet,
    /// The proxy's own listeners and HTTP connection managers, which never count.
    preset: Preset,
    /// Why nothing is counted from this answer: its first line that is not `<name>: <count>`.
    unreadable: Option<String>,
    /// The admin listener's connection line and request line, there whenever the stats are.
    admin_connections: bool,
    admin_requests: bool,
    parts: Capped<Part>,
    skipped: Capped<Excluded>,
    hcms: Capped<Hcm>,
    /// Hashed: an answer may name many managers, and each line must cost the same.
    index: HashMap<String, usize>,
    /// Gauges that wrapped below zero, and the first one's name.
    wrapped: u64,
    first_wrapped: Option<String>,
}

impl Lines {
    /// Reads an answer with the listeners on `ignore`'s ports and `preset`'s own left out.
    pub fn new(ignore: &PortSet, preset: Preset) -> Lines {
        Lines { ignore: ignore.clone(), preset, ..Lines::default() }
    }

    /// One line of the answer, with or without its line end.
    pub fn add(&mut self, line: &str) {
        let line = line.trim();
        if line.is_empty() || self.unreadable.is_some() {
            return;
        }
        // Lines arrive with bytes that are not UTF-8 replaced.
        if line.contains(char::REPLACEMENT_CHARACTER) {
            self.unreadable = Some("Envoy answered with bytes that are not text".to_string());
            return;
        }
        let Some((name, mut n)) = gauge(line) else {
            let line = shorten(line);
            let why =
                format!("Envoy's stats answer has a line that is not '<name>: <count>': '{line}'");
            self.unreadable = Some(why);
            return;
        };
        if n > WRAPPED {
            self.wrapped += 1;
            self.first_wrapped.get_or_insert_with(|| name.to_string());
            n = 0;
        }
        self.admin_connections |= name == ADMIN_LINE;
        self.admin_requests |= name == ADMIN_RQ_LINE;
        if let Some(listener) = listener_name(name) {
            match skip_reason(listener, &self.ignore, &self.preset) {
                Some(why) => {
                    self.skipped
                        .keep(|| Excluded { why: format!("{listener} ({why})"), n }, [n, 0]);
                }
                None => {
                    self.parts.keep(|| Part { name: listener.to_string(), active: n }, [n, 0]);
                }
            }
        } else if let Some((prefix, is_request)) = hcm_stat(name, &self.preset) {
            let figures = if is_request { [n, 0] } else { [0, n] };
            match self.index.get(prefix) {
                Some(&i) => {
                    let hcm = &mut self.hcms.rows[i];
                    *(if is_request { &mut hcm.requests } else { &mut hcm.connections }) = n;
                }
                None => {
                    let (at, [requests, connections]) = (self.hcms.rows.len(), figures);
                    let new = || Hcm { prefix: prefix.to_string(), requests, connections };
                    if self.hcms.keep(new, figures) {
                        self.index.insert(prefix.to_string(), at);
                    }
                }
            }
        }
    }

    /// The answer's readable figures, when the admin line of their kind (`admin`) is there: an
    /// answer without it means Envoy does not create the stat (a `stats_matcher` leaves it out),
    /// unknown, never zero.
    fn check(&self, admin: bool, stat: &str) -> Result<(), Failure> {
        match &self.unreadable {
            Some(why) => Err(Failure::from(why.clone())),
            None if !admin => Err(Failure::from(format!(
                "Envoy does not report {stat} (its stats_matcher leaves the stat out)"
            ))),
            None => Ok(()),
        }
    }

    /// Counts `listener.<L>.downstream_cx_active` lines.
    pub fn connections(&self) -> Result<Count, Failure> {
        self.check(self.admin_connections, "downstream_cx_active")?;
        let parts = self
            .parts
            .all(|more, [n, _]| Part { name: format!("({more} more listeners)"), active: n });
        let excluded = self.skipped.all(|more, [n, _]| Excluded {
            why: format!("({more} more listeners) (left out for the reasons above)"),
            n,
        });
        let n = self.wrapped;
        let warning = self.first_wrapped.clone().map(|first| Warning::Wrapped { n, first });
        let count =
            Count::new(SourceKind::Stats, Unit::Connections, parts, warning.into_iter().collect());
        Ok(Count { excluded, ..count })
    }

    /// Counts requests: `http.<prefix>.downstream_rq_active` over the HTTP connection managers
    /// that carry traffic, plus the listeners' connections that no manager holds (TCP proxy
    /// streams), from `connections`, this answer's connection count.
    pub fn requests(&self, connections: &Count) -> Result<(Count, Vec<Hcm>), Failure> {
        self.check(self.admin_requests, "downstream_rq_active")?;
        if self.preset.waypoint {
            // Its TCP streams are connections of its internal listeners, as idle clients' are.
            return Err("a waypoint's stats cannot tell a TCP stream from an idle client".into());
        }
        let hcms = self.hcms.all(|_, [requests, connections]| Hcm {
            prefix: "(more HTTP connection managers)".to_string(),
            requests,
            connections,
        });
        let http_connections = hcms.iter().map(|h| h.connections).fold(0, u64::saturating_add);
        let mut parts: Vec<Part> = hcms
            .iter()
            .map(|h| Part { name: format!("http {}", h.prefix), active: h.requests })
            .collect();
        parts.push(Part {
            name: NON_HTTP.to_string(),
            active: connections.total.saturating_sub(http_connections),
        });
        let warnings = connections.warnings.clone();
        Ok((Count::new(SourceKind::Stats, Unit::Requests, parts, warnings), hcms))
    }
}

/// `<name>: <count>`, a count in digits only, as Envoy prints them.
fn gauge(line: &str) -> Option<(&str, u64)> {
    let (name, value) = line.split_once(':')?;
    Some((name.trim(), decimal(value.trim())?))
}

/// The prefix of a traffic manager's `http.<prefix>.downstream_{rq,cx}_active`, and whether rq.
fn hcm_stat<'a>(name: &'a str, preset: &Preset) -> Option<(&'a str, bool)> {
    let rest = name.strip_prefix("http.")?;
    let (prefix, is_request) = match rest.strip_suffix(".downstream_rq_active") {
        Some(p) => (p, true),
        None => (rest.strip_suffix(SUFFIX)?, false),
    };
    (!prefix.is_empty() && !any(preset.own_hcms, prefix)).then_some((prefix, is_request))
}

/// `listener.<L>.downstream_cx_active` gives `L`, unless it is a per-handler copy
/// (`<L>.worker_<n>`, `<L>.main_thread`) whose sum the plain line already holds. Listener names
/// contain dots (addresses), so the handler part is read from the right.
fn listener_name(stat: &str) -> Option<&str> {
    let l = stat.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    if l.is_empty() {
        return None;
    }
    if let Some((parent, last)) = l.rsplit_once('.') {
        let worker = last
            .strip_prefix("worker_")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !parent.is_empty() && (worker || last == "main_thread") {
            return None;
        }
    }
    Some(l)
}

fn skip_reason(listener: &str, ignore: &PortSet, preset: &Preset) -> Option<&'static str> {
    if listener == "admin" {
        return Some("Envoy's admin listener");
    }
    if any(preset.own_listeners, listener) {
        return Some("the proxy's own listener");
    }
    if listener.starts_with("envoy_internal_") {
        return Some("Envoy internal listener");
    }
    // Any address: 0.0.0.0_15021, [__]_15021 and 127.0.0.1_15090 alike (Istio only skips 0.0.0.0_).
    let port = listener.rsplit_once('_')?.1.parse::<u16>().ok()?;
    ignore.contains(port).then_some("ignored port")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole answer's `Lines`, read as for Istio.
    fn lines(body: &str, ignore: &PortSet) -> Lines {
        let mut lines = Lines::new(ignore, crate::preset::ISTIO);
        for line in body.lines() {
            lines.add(line);
        }
        lines
    }

    /// The connection count of a whole answer.
    pub(crate) fn parse(body: &str, ignore: &PortSet) -> Result<Count, Failure> {
        lines(body, ignore).connections()
    }

    /// The request count of a whole answer, and its HTTP connection managers.
    fn parse_requests(body: &str, ignore: &PortSet) -> Result<(Count, Vec<Hcm>), Failure> {
        let lines = lines(body, ignore);
        lines.requests(&lines.connections()?)
    }

    use crate::count::KEPT;
    use crate::lists::ISTIO_INFRA_PORTS;

    const NOT_ENABLED: &str =
        "Envoy does not report downstream_cx_active (its stats_matcher leaves the stat out)";

    fn istio() -> PortSet {
        PortSet::parse(ISTIO_INFRA_PORTS).unwrap()
    }

    fn parts(a: &Count) -> Vec<(&str, u64)> {
        a.parts.iter().map(|p| (p.name.as_str(), p.active)).collect()
    }

    /// Real Envoy 1.40.0 with two workers (docs/how-it-works.md, "Envoy's stats").
    const REAL: &str = "http.admin.downstream_cx_active: 1
http.inbound_0.0.0.0_8080.downstream_cx_active: 3
http.outbound_0.0.0.0_80.downstream_cx_active: 2
listener.127.0.0.1_15001.downstream_cx_active: 2
listener.127.0.0.1_15001.worker_0.downstream_cx_active: 1
listener.127.0.0.1_15001.worker_1.downstream_cx_active: 1
listener.127.0.0.1_15006.downstream_cx_active: 3
listener.127.0.0.1_15006.worker_0.downstream_cx_active: 2
listener.127.0.0.1_15006.worker_1.downstream_cx_active: 1
listener.admin.downstream_cx_active: 1
listener.admin.main_thread.downstream_cx_active: 1
";

    #[test]
    fn real_envoy_answer_counts_each_listener_once_without_admin_http_or_workers() {
        let a = parse(REAL, &istio()).unwrap();
        assert_eq!(a.total, 5);
        assert_eq!(parts(&a), vec![("127.0.0.1_15001", 2), ("127.0.0.1_15006", 3)]);
        assert!(a.warnings.is_empty());
        assert_eq!(a.excluded.len(), 1, "only the admin listener is skipped");
    }

    #[test]
    fn trailing_spaces_crlf_line_ends_and_no_final_newline_are_trimmed() {
        let body = "listener.0.0.0.0_15006.downstream_cx_active: 4 \n\
                    listener.0.0.0.0_15001.downstream_cx_active: 3\r\n\
                    listener.admin.downstream_cx_active: 2 \n\
                    listener.admin.main_thread.downstream_cx_active: 2 ";
        let a = parse(body, &istio()).unwrap();
        assert_eq!(a.total, 7);
        assert!(a.warnings.is_empty());
    }

    #[test]
    fn infrastructure_ports_are_skipped_on_every_address_family() {
        let body = "listener.0.0.0.0_15021.downstream_cx_active: 1
listener.[__]_15021.downstream_cx_active: 2
listener.127.0.0.1_15090.downstream_cx_active: 3
listener.[__1]_15090.downstream_cx_active: 4
listener.0.0.0.0_15090.downstream_cx_active: 5
listener.[__1]_15007.downstream_cx_active: 6
listener.admin.downstream_cx_active: 1
";
        let a = parse(body, &istio()).unwrap();
        assert_eq!(parts(&a), vec![("[__1]_15007", 6)]);
        assert_eq!(a.excluded.iter().filter(|s| s.why.ends_with("(ignored port)")).count(), 5);
    }

    #[test]
    fn empty_ignore_set_counts_infrastructure_listeners_but_never_admin() {
        let body = "listener.0.0.0.0_15021.downstream_cx_active: 1
listener.admin.downstream_cx_active: 1
";
        let a = parse(body, &PortSet::default()).unwrap();
        assert_eq!(parts(&a), vec![("0.0.0.0_15021", 1)]);
    }

    #[test]
    fn internal_listeners_are_skipped() {
        let body = "listener.envoy_internal_connect_originate.downstream_cx_active: 3
listener.envoy_internal_connect_originate.worker_0.downstream_cx_active: 3
listener.0.0.0.0_15008.downstream_cx_active: 1
listener.admin.downstream_cx_active: 1
";
        let a = parse(body, &istio()).unwrap();
        assert_eq!(parts(&a), vec![("0.0.0.0_15008", 1)]);
    }

    #[test]
    fn stat_prefix_names_and_names_with_dots_parse_from_the_right() {
        let body = "listener.admin.downstream_cx_active: 1
listener.my.prefix.downstream_cx_active: 1
listener.my.prefix.worker_12.downstream_cx_active: 1
listener.virtualInbound.downstream_cx_active: 2
listener.worker_3.downstream_cx_active: 4
";
        let a = parse(body, &istio()).unwrap();
        assert_eq!(
            parts(&a),
            vec![("my.prefix", 1), ("virtualInbound", 2), ("worker_3", 4)],
            "a listener whose whole name is worker_3 is not a per-worker copy"
        );
    }

    #[test]
    fn wrapped_gauges_count_as_zero_with_one_warning_for_all() {
        let body = "listener.0.0.0.0_15006.downstream_cx_active: 18446744073709551615
listener.0.0.0.0_15001.downstream_cx_active: 1
listener.0.0.0.0_8443.downstream_cx_active: 9223372036854775809
listener.admin.downstream_cx_active: 1
";
        let a = parse(body, &istio()).unwrap();
        assert_eq!(a.total, 1);
        assert_eq!(
            a.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
            vec![
                "2 gauges wrapped below zero and count as 0 (listener.0.0.0.0_15006.downstream_cx_active among them)"
            ]
        );
    }

    #[test]
    fn two_to_the_63_is_still_a_count() {
        let body = format!(
            "listener.x_1.downstream_cx_active: {}\nlistener.admin.downstream_cx_active: 1\n",
            1u64 << 63
        );
        assert_eq!(parse(&body, &istio()).unwrap().total, 1 << 63);
    }

    #[test]
    fn a_line_that_is_not_a_count_makes_the_answer_unknown_never_zero() {
        let good = "listener.admin.downstream_cx_active: 1\n";
        for bad in [
            "listener.0.0.0.0_15006.downstream_cx_active: 3e0",
            "listener.0.0.0.0_15006.downstream_cx_active: -5",
            "listener.0.0.0.0_15006.downstream_cx_active: +5",
            "listener.0.0.0.0_15006.downstream_cx_active: 18446744073709551616",
            "listener.0.0.0.0_15006.downstream_cx_active: lots",
            "listener.0.0.0.0_15006.downstream_cx_active:",
            "garbage without separator",
        ] {
            let body = format!("{good}{bad}\n");
            let unreadable =
                format!("Envoy's stats answer has a line that is not '<name>: <count>': '{bad}'");
            assert_eq!(parse(&body, &istio()).map(|a| a.total), Err(unreadable.into()), "{bad}");
            assert!(parse_requests(&body, &istio()).is_err(), "{bad}");
        }
        // Lines ending in a lone CR run together into one line that is not a count.
        let cr_only = "listener.admin.downstream_cx_active: 1\rlistener.0.0.0.0_15006.downstream_cx_active: 3\r";
        assert!(parse(cr_only, &istio()).is_err_and(|e| e.contains("not '<name>: <count>'")));
    }

    #[test]
    fn an_answer_without_the_admin_line_means_not_enabled_never_zero() {
        let not_enabled = Err(Failure::from(NOT_ENABLED));
        assert_eq!(parse("", &istio()), not_enabled);
        assert_eq!(parse("\n", &istio()), not_enabled);
        let only_others = "listener.0.0.0.0_15006.downstream_cx_active: 0\n";
        assert_eq!(parse(only_others, &istio()), not_enabled);
        let only_handler = "listener.admin.main_thread.downstream_cx_active: 1\n";
        assert_eq!(parse(only_handler, &istio()), not_enabled);
    }

    #[test]
    fn listeners_at_zero_are_listed_but_add_nothing() {
        let body = "listener.0.0.0.0_15006.downstream_cx_active: 0
listener.admin.downstream_cx_active: 1
";
        let a = parse(body, &istio()).unwrap();
        assert_eq!(a.total, 0);
        assert_eq!(parts(&a), vec![("0.0.0.0_15006", 0)]);
    }

    #[test]
    fn other_stats_are_not_counted() {
        let body = "listener.admin.downstream_cx_active: 1
listener.0.0.0.0_15006.downstream_cx_active_total: 9
cluster.x.upstream_cx_active: 4
";
        assert_eq!(parse(body, &istio()).unwrap().total, 0);
    }

    /// Real Envoy 1.40.0 with the combined filter: an idle connection and a request in flight on
    /// the inbound listener, a TCP proxy stream, and our own admin request.
    const REQUESTS: &str = "http.admin.downstream_cx_active: 1
http.admin.downstream_rq_active: 1
http.agent.downstream_cx_active: 1
http.agent.downstream_rq_active: 0
http.inbound_0.0.0.0_8080.downstream_cx_active: 2
http.inbound_0.0.0.0_8080.downstream_rq_active: 1
listener.0.0.0.0_15006.downstream_cx_active: 2
listener.0.0.0.0_15006.worker_0.downstream_cx_active: 2
listener.0.0.0.0_15021.downstream_cx_active: 1
listener.0.0.0.0_3306.downstream_cx_active: 1
listener.0.0.0.0_3306.worker_1.downstream_cx_active: 1
listener.admin.downstream_cx_active: 1
listener.admin.main_thread.downstream_cx_active: 1
";

    #[test]
    fn requests_count_in_flight_requests_and_tcp_streams_but_not_idle_connections() {
        let (a, hcms) = parse_requests(REQUESTS, &istio()).unwrap();
        assert_eq!(
            parts(&a),
            vec![("http inbound_0.0.0.0_8080", 1), ("non-HTTP connections", 1)],
            "the idle keep-alive connection is not a request; the TCP stream is a connection"
        );
        assert_eq!(a.total, 2);
        assert_eq!(
            hcms,
            vec![Hcm { prefix: "inbound_0.0.0.0_8080".to_string(), requests: 1, connections: 2 }],
            "admin and Istio's agent manager are left out"
        );
    }

    #[test]
    fn http2_streams_on_one_connection_are_several_requests() {
        let body = "http.admin.downstream_rq_active: 1
http.inbound_0.0.0.0_8080.downstream_cx_active: 1
http.inbound_0.0.0.0_8080.downstream_rq_active: 3
listener.0.0.0.0_15006.downstream_cx_active: 1
listener.admin.downstream_cx_active: 1
";
        let (a, _) = parse_requests(body, &istio()).unwrap();
        assert_eq!(a.total, 3);
        assert_eq!(a.describe(), "3 active requests");
    }

    #[test]
    fn without_request_stats_requests_are_unknown_but_connections_still_count() {
        // Istio with EXIT_ON_ZERO_ACTIVE_CONNECTIONS: its matcher adds downstream_cx_active only.
        let not_enabled = Err(Failure::from(NOT_ENABLED.replace("cx", "rq")));
        assert_eq!(parse_requests(REAL, &istio()), not_enabled);
        assert_eq!(parse(REAL, &istio()).unwrap().total, 5);
        let no_listener_stats = "http.admin.downstream_rq_active: 1\n";
        assert_eq!(parse_requests(no_listener_stats, &istio()), Err(Failure::from(NOT_ENABLED)));
    }

    #[test]
    fn the_connection_count_ignores_request_lines() {
        assert_eq!(parse(REQUESTS, &istio()).unwrap().total, 3);
    }

    #[test]
    fn long_garbage_is_shortened_in_what_is_said_of_it() {
        let body = format!("{}\nlistener.admin.downstream_cx_active: 1\n", "é".repeat(500));
        let why = parse(&body, &istio()).unwrap_err();
        let why = why.to_string();
        let line = why.split_once("<count>': ").unwrap().1;
        assert!(line.chars().count() < 90, "{line}");
    }

    #[test]
    fn a_proxys_own_http_managers_never_count_requests() {
        let body = "http.admin.downstream_cx_active: 1
http.admin.downstream_rq_active: 1
http.ingress_http.downstream_cx_active: 2
http.ingress_http.downstream_rq_active: 1
http.stats-health.downstream_cx_active: 1
http.stats-health.downstream_rq_active: 1
listener.0.0.0.0_8002.downstream_cx_active: 1
listener.0.0.0.0_8080.downstream_cx_active: 2
listener.admin.downstream_cx_active: 1
";
        let lines = read(body, crate::preset::PRESETS[5]);
        let (a, hcms) = lines.requests(&lines.connections().unwrap()).unwrap();
        assert_eq!(a.total, 1, "the health check in flight on 8002 is Contour's own");
        assert_eq!(hcms.len(), 1);
        // Read as Istio's, the same answer counts it.
        assert_eq!(parse_requests(body, &PortSet::default()).unwrap().0.total, 2);
    }

    /// An answer read as `preset`'s, with its own ports ignored.
    fn read(body: &str, preset: Preset) -> Lines {
        let mut lines = Lines::new(&PortSet::parse(preset.ignore_ports).unwrap(), preset);
        for line in body.lines() {
            lines.add(line);
        }
        lines
    }

    #[test]
    fn a_waypoints_internal_listeners_never_count_and_its_requests_come_from_clusters() {
        // With listener and HTTP stats let through Istio's stats matcher: its HBONE manager
        // (pilot/pkg/networking/core/listener_waypoint.go) holds a CONNECT stream per client
        // connection; internal listeners are named so by Envoy 1.40.0.
        let body = "http.admin.downstream_rq_active: 1
http.connect_terminate.downstream_cx_active: 2
http.connect_terminate.downstream_rq_active: 10
http.inbound_10.96.0.7_80.downstream_cx_active: 10
http.inbound_10.96.0.7_80.downstream_rq_active: 1
listener.0.0.0.0_15008.downstream_cx_active: 2
listener.envoy_internal_main_internal.downstream_cx_active: 10
listener.envoy_internal_connect_originate.downstream_cx_active: 4
listener.admin.downstream_cx_active: 1
";
        let lines = read(body, crate::preset::PRESETS[1]);
        let connections = lines.connections().unwrap();
        assert_eq!(connections.total, 2, "ztunnels' HBONE connections: {connections:?}");
        let whys: Vec<_> = connections.excluded.iter().map(|s| s.why.as_str()).collect();
        assert!(
            whys.contains(&"envoy_internal_main_internal (the proxy's own listener)"),
            "{whys:?}"
        );
        // A request would be 1, a TCP stream an idle client's: /clusters counts them.
        assert!(lines.requests(&connections).unwrap_err().contains("TCP stream"));
    }

    #[test]
    fn kumas_named_listeners_and_managers_never_count() {
        // Kuma names the listeners of its MeshMetric endpoint and dynamic config by a stat
        // prefix, not by address, so no port tells them.
        let body = "http.admin.downstream_cx_active: 1
http.admin.downstream_rq_active: 1
http.localhost_8080.downstream_cx_active: 1
http.localhost_8080.downstream_rq_active: 1
http.system_meshmetric_prometheus_default.downstream_cx_active: 1
http.system_meshmetric_prometheus_default.downstream_rq_active: 1
listener.10.0.0.5_8080.downstream_cx_active: 1
listener.system_meshmetric_prometheus_default.downstream_cx_active: 1
listener.system_dynamicconfig.downstream_cx_active: 1
listener.admin.downstream_cx_active: 1
";
        let lines = read(body, crate::preset::PRESETS[3]);
        let connections = lines.connections().unwrap();
        assert_eq!(connections.total, 1, "{connections:?}");
        let whys: Vec<_> = connections.excluded.iter().map(|s| s.why.as_str()).collect();
        assert_eq!(
            whys,
            [
                "system_meshmetric_prometheus_default (the proxy's own listener)",
                "system_dynamicconfig (the proxy's own listener)",
                "admin (Envoy's admin listener)"
            ]
        );
        let (requests, _) = lines.requests(&connections).unwrap();
        assert_eq!(requests.total, 1, "the scrape in flight is Kuma's own");
        // Read as Istio's, the scrape and the config poll count.
        assert_eq!(parse(body, &PortSet::default()).unwrap().total, 3);
    }

    #[test]
    fn bytes_that_were_not_utf8_make_the_answer_unknown() {
        let body =
            "listener.admin.downstream_cx_active: 1\nlistener.\u{FFFD}.downstream_cx_active: 1\n";
        assert_eq!(
            parse(body, &istio()),
            Err(Failure::from("Envoy answered with bytes that are not text"))
        );
    }

    #[test]
    fn past_a_thousand_listeners_the_rest_are_added_up_as_one() {
        let mut body = String::from("listener.admin.downstream_cx_active: 1\n");
        for i in 0..10_000 {
            body += &format!("listener.0.0.0.0_{}.downstream_cx_active: {}\n", 20_000 + i, i % 2);
        }
        let a = parse(&body, &PortSet::default()).unwrap();
        assert_eq!(a.total, 5000);
        assert_eq!(a.parts.len(), KEPT + 1);
        assert_eq!(a.parts[KEPT], Part { name: "(9000 more listeners)".to_string(), active: 4500 });
    }

    #[test]
    fn many_http_managers_cost_the_same_per_line() {
        // 100,000 prefixes: a linear search per line would take seconds.
        let mut body = String::from(
            "http.admin.downstream_rq_active: 1\nlistener.admin.downstream_cx_active: 1\n",
        );
        for i in 0..100_000 {
            body +=
                &format!("http.p{i}.downstream_cx_active: 1\nhttp.p{i}.downstream_rq_active: 1\n");
        }
        let started = std::time::Instant::now();
        let (a, hcms) = parse_requests(&body, &istio()).unwrap();
        assert_eq!((hcms.len(), a.total), (KEPT + 1, 100_000), "memory stays flat");
        let more = &hcms[KEPT];
        assert_eq!(
            (more.prefix.as_str(), more.requests, more.connections),
            ("(more HTTP connection managers)", 99_000, 99_000)
        );
        // A bound on the hook's work, not a speed target: the quadratic search took 31 s here,
        // the hashed one well under a second, unoptimized.
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }
}
