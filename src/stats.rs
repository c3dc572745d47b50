//! Interprets the body of `GET /stats?usedonly&filter=downstream_cx_active$` (pure: text in,
//! count out). The rules and the byte format are in REFERENCE.md, section 1.

use crate::count::{Count, Part, SourceKind};
use crate::log::shorten;
use crate::ports::PortSet;

/// The path and query we ask Envoy for: the same query Istio's pilot-agent sends, so the stat is
/// filtered inside Envoy; `$` is sent percent-encoded, which Envoy decodes before matching.
pub const STATS_PATH: &str = "/stats?usedonly&filter=downstream_cx_active%24";

const PREFIX: &str = "listener.";
const SUFFIX: &str = ".downstream_cx_active";
/// Always present when the stat is enabled: our own admin connection is active while Envoy answers.
const ADMIN_LINE: &str = "listener.admin.downstream_cx_active";

/// A gauge above this has wrapped below zero (istio/istio #49229); it means 0.
const WRAPPED: u64 = 1 << 63;

/// Why an answer could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotEnabled;

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

/// Counts `listener.<L>.downstream_cx_active` lines. An answer without the admin listener's line
/// means Envoy does not create the stat (a `stats_matcher` leaves it out): unknown, never zero.
pub fn parse(body: &str, ignore: &PortSet) -> Result<Answer, NotEnabled> {
    let mut enabled = false;
    let mut parts = Vec::new();
    let mut skipped = Vec::new();
    let mut warnings = Vec::new();
    for line in body.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let Some((name, value)) = line.split_once(':') else {
            warnings.push(format!(
                "skipped a stats line without ': ': '{}'",
                shorten(line)
            ));
            continue;
        };
        let name = name.trim();
        if name == ADMIN_LINE {
            enabled = true;
        }
        let Some(listener) = listener_name(name) else {
            continue;
        };
        let active = match value.trim().parse::<u64>() {
            Ok(v) if v > WRAPPED => {
                warnings.push(format!(
                    "{name} is {v}, a gauge that wrapped below zero; counting it as 0"
                ));
                0
            }
            Ok(v) => v,
            Err(_) => {
                warnings.push(format!(
                    "skipped a stats line whose value is not a count: '{}'",
                    shorten(line)
                ));
                continue;
            }
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
        return Err(NotEnabled);
    }
    Ok(Answer {
        count: Count::new(SourceKind::Stats, parts, warnings),
        skipped,
    })
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
    use crate::ports::ISTIO_INFRA_PORTS;

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

    /// Real Envoy 1.40.0 with two workers (REFERENCE.md, section 1).
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
    fn a_wrapped_gauge_counts_as_zero_with_a_warning() {
        let body = "listener.0.0.0.0_15006.downstream_cx_active: 18446744073709551615
listener.0.0.0.0_15001.downstream_cx_active: 1
listener.admin.downstream_cx_active: 1
";
        let a = parse(body, &istio()).unwrap();
        assert_eq!(a.count.total, 1);
        assert_eq!(a.count.warnings.len(), 1);
        assert!(
            a.count.warnings[0].contains("wrapped"),
            "{:?}",
            a.count.warnings
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
    fn unparsable_lines_are_skipped_each_with_one_warning() {
        let body = "listener.0.0.0.0_15006.downstream_cx_active: -1
listener.0.0.0.0_15001.downstream_cx_active: lots
garbage without separator
listener.0.0.0.0_8080.downstream_cx_active: 2
listener.admin.downstream_cx_active: 1
";
        let a = parse(body, &istio()).unwrap();
        assert_eq!(a.count.total, 2);
        assert_eq!(a.count.warnings.len(), 3, "{:?}", a.count.warnings);
    }

    #[test]
    fn an_answer_without_the_admin_line_means_not_enabled_never_zero() {
        assert_eq!(parse("", &istio()), Err(NotEnabled));
        assert_eq!(parse("\n", &istio()), Err(NotEnabled));
        let only_others = "listener.0.0.0.0_15006.downstream_cx_active: 0\n";
        assert_eq!(parse(only_others, &istio()), Err(NotEnabled));
        let only_handler = "listener.admin.main_thread.downstream_cx_active: 1\n";
        assert_eq!(parse(only_handler, &istio()), Err(NotEnabled));
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
    fn histograms_and_other_stats_are_not_counted() {
        let body = "listener.admin.downstream_cx_active: 1
listener.0.0.0.0_15006.downstream_cx_length_ms: No recorded values
listener.0.0.0.0_15006.downstream_cx_active_total: 9
cluster.x.upstream_cx_active: 4
";
        assert_eq!(parse(body, &istio()).unwrap().count.total, 0);
    }

    #[test]
    fn long_garbage_is_shortened_in_warnings() {
        let body = format!(
            "{}\nlistener.admin.downstream_cx_active: 1\n",
            "é".repeat(500)
        );
        let a = parse(&body, &istio()).unwrap();
        assert!(a.count.warnings[0].chars().count() < 150);
    }
}
