//! Interprets the body of `GET /stats?usedonly&type=Gauges&filter=downstream_cx_active$` (pure: text in,
//! count out), and with `--count requests` of `filter=downstream_(cx|rq)_active$`. The rules and
//! the byte format are in docs/how-it-works.md, "Envoy's stats".

use crate::count::shorten;
use crate::count::{Count, NON_HTTP, Part, SourceKind};
use crate::lists::PortSet;
use std::collections::HashMap;

/// The path and query we ask Envoy for: Istio's pilot-agent's query, so the stat is filtered
/// inside Envoy, and `type=Gauges`, so Envoy leaves its counters and histograms unvisited (the
/// stat is a gauge): at 10,000 clusters a third of the time (0.06 s), at 50,000 a fifth (0.2 s).
/// `$` is sent percent-encoded, which Envoy decodes before matching.
pub const STATS_PATH: &str = "/stats?usedonly&type=Gauges&filter=downstream_cx_active%24";

/// Connections and requests in one answer: `downstream_(cx|rq)_active$`, percent-encoded.
pub const REQUESTS_PATH: &str =
    "/stats?usedonly&type=Gauges&filter=downstream_%28cx%7Crq%29_active%24";

const PREFIX: &str = "listener.";
const SUFFIX: &str = ".downstream_cx_active";
/// Always present when the stat is enabled: our own admin connection is active while Envoy answers.
const ADMIN_LINE: &str = "listener.admin.downstream_cx_active";

/// Always present when request stats are enabled: our own request is in flight while Envoy answers.
const ADMIN_RQ_LINE: &str = "http.admin.downstream_rq_active";

/// HTTP connection managers that carry no application traffic: the admin API's, and those of
/// Istio's health (15021) and Prometheus (15090) listeners, whose stat prefixes are "agent" and
/// "stats" in Istio's bootstrap template (istio/istio, tools/packaging/common/envoy_bootstrap.json).
const INFRA_HCMS: [&str; 3] = ["admin", "agent", "stats"];

/// A gauge above this has wrapped below zero (istio/istio #49229); it means 0.
const WRAPPED: u64 = 1 << 63;

/// Why an answer could not be used: the count is unknown, never zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unusable {
    /// The stat is not created: a `stats_matcher` leaves it out.
    NotEnabled,
    /// A line that is not `<name>: <count>`, as the filtered answer's lines all are: the answer
    /// cannot be trusted whole.
    Unreadable(String),
}

/// A listener left out of the count, and why: `status` shows these so nobody has to guess.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub name: String,
    pub active: u64,
    pub why: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub count: Count,
    pub skipped: Vec<Skipped>,
}

/// An answer's gauges by name, and a warning when some wrapped.
pub type Gauges<'a> = (Vec<(&'a str, u64)>, Option<String>);

/// Every line of an answer as a name and a count, in one pass, which both counts then use. The
/// filter asks for gauges only, so a line of any other shape makes the answer unreadable. A gauge
/// that wrapped below zero counts as 0; one warning says how many did.
pub fn read(body: &str) -> Result<Gauges<'_>, Unusable> {
    let mut gauges = Vec::new();
    let mut wrapped: (u64, Option<&str>) = (0, None);
    for line in body.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let unreadable = || Unusable::Unreadable(shorten(line));
        let (name, value) = line.split_once(':').ok_or_else(unreadable)?;
        let (name, value) = (name.trim(), value.trim());
        // from_str takes a leading '+': digits only, as Envoy prints them.
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(unreadable());
        }
        let mut n = value.parse::<u64>().map_err(|_| unreadable())?;
        if n > WRAPPED {
            wrapped.0 += 1;
            wrapped.1.get_or_insert(name);
            n = 0;
        }
        gauges.push((name, n));
    }
    let warning = wrapped.1.map(|first| {
        format!(
            "{} gauge{} wrapped below zero and count{} as 0 ({first}{})",
            wrapped.0,
            if wrapped.0 == 1 { "" } else { "s" },
            if wrapped.0 == 1 { "s" } else { "" },
            if wrapped.0 == 1 { "" } else { " among them" }
        )
    });
    Ok((gauges, warning))
}

/// `read` then `connections`.
pub fn parse(body: &str, ignore: &PortSet) -> Result<Answer, Unusable> {
    connections(&read(body)?, ignore)
}

/// `read`, `connections`, then `requests`.
pub fn parse_requests(body: &str, ignore: &PortSet) -> Result<(Answer, Vec<Hcm>), Unusable> {
    let gauges = read(body)?;
    requests(&gauges, &connections(&gauges, ignore)?)
}

/// Counts `listener.<L>.downstream_cx_active` lines. An answer without the admin listener's line
/// means Envoy does not create the stat (a `stats_matcher` leaves it out): unknown, never zero.
pub fn connections(read: &Gauges<'_>, ignore: &PortSet) -> Result<Answer, Unusable> {
    let (gauges, warning) = read;
    let mut enabled = false;
    let mut parts = Vec::new();
    let mut skipped = Vec::new();
    for &(name, active) in gauges {
        enabled |= name == ADMIN_LINE;
        let Some(listener) = listener_name(name) else {
            continue;
        };
        match skip_reason(listener, ignore) {
            Some(why) => skipped.push(Skipped {
                name: listener.to_string(),
                active,
                why,
            }),
            None => parts.push(Part {
                name: listener.to_string(),
                active,
            }),
        }
    }
    if !enabled {
        return Err(Unusable::NotEnabled);
    }
    Ok(Answer {
        count: Count::new(SourceKind::Stats, parts, warning.iter().cloned().collect()),
        skipped,
    })
}

/// One HTTP connection manager's requests and connections, for `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hcm {
    pub prefix: String,
    pub requests: u64,
    pub connections: u64,
}

/// Counts requests: `http.<prefix>.downstream_rq_active` over the HTTP connection managers that
/// carry traffic, plus the connections of listeners that hold no HTTP (TCP proxy streams), found
/// as the listeners' connections less the HTTP managers' ones. Needs both stats: an answer without
/// `http.admin.downstream_rq_active` is unknown. `connections` is the same answer's connection
/// count.
pub fn requests(read: &Gauges<'_>, connections: &Answer) -> Result<(Answer, Vec<Hcm>), Unusable> {
    let mut enabled = false;
    let mut hcms: Vec<Hcm> = Vec::new();
    // Hashed: an answer may name many managers, and each line must cost the same.
    let mut index: HashMap<&str, usize> = HashMap::new();
    for &(name, active) in &read.0 {
        enabled |= name == ADMIN_RQ_LINE;
        let Some(rest) = name.strip_prefix("http.") else {
            continue;
        };
        let (prefix, is_request) = match (
            rest.strip_suffix(".downstream_rq_active"),
            rest.strip_suffix(SUFFIX),
        ) {
            (Some(p), _) => (p, true),
            (None, Some(p)) => (p, false),
            (None, None) => continue,
        };
        if prefix.is_empty() || INFRA_HCMS.contains(&prefix) {
            continue;
        }
        let i = *index.entry(prefix).or_insert_with(|| {
            hcms.push(Hcm {
                prefix: prefix.to_string(),
                requests: 0,
                connections: 0,
            });
            hcms.len() - 1
        });
        if is_request {
            hcms[i].requests = active;
        } else {
            hcms[i].connections = active;
        }
    }
    if !enabled {
        return Err(Unusable::NotEnabled);
    }
    let http_connections = hcms
        .iter()
        .map(|h| h.connections)
        .fold(0, u64::saturating_add);
    let mut parts: Vec<Part> = hcms
        .iter()
        .map(|h| Part {
            name: format!("http {}", h.prefix),
            active: h.requests,
        })
        .collect();
    parts.push(Part {
        name: NON_HTTP.to_string(),
        active: connections.count.total.saturating_sub(http_connections),
    });
    let answer = Answer {
        count: Count::requests(parts, connections.count.warnings.clone()),
        skipped: connections.skipped.clone(),
    };
    Ok((answer, hcms))
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

fn skip_reason(listener: &str, ignore: &PortSet) -> Option<&'static str> {
    if listener == "admin" {
        return Some("Envoy's admin listener");
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
    use crate::lists::ISTIO_INFRA_PORTS;

    fn istio() -> PortSet {
        PortSet::parse(ISTIO_INFRA_PORTS).unwrap()
    }

    fn parts(a: &Answer) -> Vec<(&str, u64)> {
        a.count
            .parts
            .iter()
            .map(|p| (p.name.as_str(), p.active))
            .collect()
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
        assert_eq!(a.count.total, 5);
        assert_eq!(
            parts(&a),
            vec![("127.0.0.1_15001", 2), ("127.0.0.1_15006", 3)]
        );
        assert!(a.count.warnings.is_empty());
        assert_eq!(a.skipped.len(), 1, "only the admin listener is skipped");
    }

    #[test]
    fn istio_style_payload_with_trailing_spaces_and_no_final_newline() {
        let body = "listener.0.0.0.0_15006.downstream_cx_active: 4 \n\
                    listener.admin.downstream_cx_active: 2 \n\
                    listener.admin.main_thread.downstream_cx_active: 2 ";
        let a = parse(body, &istio()).unwrap();
        assert_eq!(a.count.total, 4);
        assert!(a.count.warnings.is_empty());
    }

    #[test]
    fn crlf_line_ends_are_trimmed() {
        let body = "listener.admin.downstream_cx_active: 1\r\nlistener.0.0.0.0_15006.downstream_cx_active: 7\r\n";
        assert_eq!(parse(body, &istio()).unwrap().count.total, 7);
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
        assert_eq!(
            a.skipped.iter().filter(|s| s.why == "ignored port").count(),
            5
        );
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
        assert_eq!(a.count.total, 1);
        assert_eq!(
            a.count.warnings,
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
        assert_eq!(parse(&body, &istio()).unwrap().count.total, 1 << 63);
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
            assert_eq!(
                parse(&body, &istio()),
                Err(Unusable::Unreadable(bad.to_string())),
                "{bad}"
            );
            assert!(parse_requests(&body, &istio()).is_err(), "{bad}");
        }
        // Lines ending in a lone CR run together into one line that is not a count.
        let cr_only = "listener.admin.downstream_cx_active: 1\rlistener.0.0.0.0_15006.downstream_cx_active: 3\r";
        assert!(matches!(
            parse(cr_only, &istio()),
            Err(Unusable::Unreadable(_))
        ));
    }

    #[test]
    fn an_answer_without_the_admin_line_means_not_enabled_never_zero() {
        assert_eq!(parse("", &istio()), Err(Unusable::NotEnabled));
        assert_eq!(parse("\n", &istio()), Err(Unusable::NotEnabled));
        let only_others = "listener.0.0.0.0_15006.downstream_cx_active: 0\n";
        assert_eq!(parse(only_others, &istio()), Err(Unusable::NotEnabled));
        let only_handler = "listener.admin.main_thread.downstream_cx_active: 1\n";
        assert_eq!(parse(only_handler, &istio()), Err(Unusable::NotEnabled));
    }

    #[test]
    fn listeners_at_zero_are_listed_but_add_nothing() {
        let body = "listener.0.0.0.0_15006.downstream_cx_active: 0
listener.admin.downstream_cx_active: 1
";
        let a = parse(body, &istio()).unwrap();
        assert_eq!(a.count.total, 0);
        assert_eq!(parts(&a), vec![("0.0.0.0_15006", 0)]);
    }

    #[test]
    fn other_stats_are_not_counted() {
        let body = "listener.admin.downstream_cx_active: 1
listener.0.0.0.0_15006.downstream_cx_active_total: 9
cluster.x.upstream_cx_active: 4
";
        assert_eq!(parse(body, &istio()).unwrap().count.total, 0);
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
            vec![
                ("http inbound_0.0.0.0_8080", 1),
                ("non-HTTP connections", 1)
            ],
            "the idle keep-alive connection is not a request; the TCP stream is a connection"
        );
        assert_eq!(a.count.total, 2);
        assert_eq!(
            hcms,
            vec![Hcm {
                prefix: "inbound_0.0.0.0_8080".to_string(),
                requests: 1,
                connections: 2
            }],
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
        assert_eq!(a.count.total, 3);
        assert_eq!(a.count.describe(), "3 active requests");
    }

    #[test]
    fn without_request_stats_requests_are_unknown_but_connections_still_count() {
        // Istio with EXIT_ON_ZERO_ACTIVE_CONNECTIONS: its matcher adds downstream_cx_active only.
        assert_eq!(parse_requests(REAL, &istio()), Err(Unusable::NotEnabled));
        assert_eq!(parse(REAL, &istio()).unwrap().count.total, 5);
        let no_listener_stats = "http.admin.downstream_rq_active: 1\n";
        assert_eq!(
            parse_requests(no_listener_stats, &istio()),
            Err(Unusable::NotEnabled)
        );
    }

    #[test]
    fn the_connection_count_ignores_request_lines() {
        assert_eq!(parse(REQUESTS, &istio()).unwrap().count.total, 3);
    }

    #[test]
    fn long_garbage_is_shortened_in_what_is_said_of_it() {
        let body = format!(
            "{}\nlistener.admin.downstream_cx_active: 1\n",
            "é".repeat(500)
        );
        let Err(Unusable::Unreadable(line)) = parse(&body, &istio()) else {
            panic!("unreadable");
        };
        assert!(line.chars().count() < 90, "{line}");
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
        assert_eq!((hcms.len(), a.count.total), (100_000, 100_000));
        // A bound on the hook's work, not a speed target: the quadratic search took 31 s here,
        // the hashed one well under a second, unoptimized.
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }
}
