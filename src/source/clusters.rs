//! Interprets Envoy's `GET /clusters` (pure: lines in, count out): the upstream requests in
//! flight on the clusters that carry the pod's traffic. Per-host counters are not stats, so they
//! are there on a default Istio proxy, whose stats matcher leaves every `downstream_*` stat out.
//! An upstream request counts while it is in flight: Envoy's calls to the app (inbound clusters)
//! and the app's calls through Envoy (outbound clusters); a TCP proxy stream is one request on its
//! upstream host; an idle pooled connection is none. See docs/how-it-works.md.

use crate::count::{Arrivals, Count, Part, SourceKind, Unit};
use crate::lists::{Names, PortSet};
use crate::preset::Preset;
use std::collections::BTreeMap;
use std::net::SocketAddr;

pub const CLUSTERS_PATH: &str = "/clusters";

/// Which hosts count: not those of the proxy's own clusters (`Preset::own_clusters`) or of
/// `--ignore-clusters`, not Unix sockets or internal addresses, and not those on an ignored port.
#[derive(Debug, Clone, Default)]
pub struct Rule {
    pub preset: Preset,
    pub ignore_clusters: Names,
    pub ignore_ports: PortSet,
}

/// One cluster as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cluster {
    pub name: String,
    /// Requests in flight (`rq_active` and `rq_pending_active`) on the hosts that count.
    pub requests: u64,
    /// Open upstream connections (`cx_active`) on those hosts, idle ones included.
    pub connections: u64,
    /// Why the whole cluster is left out, if it is.
    pub left_out: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub count: Count,
    /// The clusters that hold any request or connection.
    pub clusters: Vec<Cluster>,
    /// Clusters that count but hold nothing.
    pub quiet: u64,
    /// Requests on hosts left out of clusters that count, by why.
    pub hosts_left_out: Vec<(String, u64)>,
}

/// Adds up an answer line by line, so a large one is never held whole, and keeps only the
/// clusters that hold something: Envoy prints a cluster's lines together, so one is added up at
/// a time (a cluster seen again later is added up again, which changes no total).
#[derive(Debug, Default)]
pub struct Tally {
    current: Option<Cluster>,
    clusters: Vec<Cluster>,
    quiet: u64,
    hosts_left_out: BTreeMap<String, u64>,
    /// An `rq_active` line was seen: the answer lists hosts.
    hosts: bool,
    /// A counted host's value that is not a count: the count cannot be trusted.
    bad: Option<String>,
    /// `rq_total` over the hosts that count: requests so far, which tells new ones apart.
    arrived: u64,
    /// What the counted clusters past the first `KEPT` that hold anything hold, added up, and
    /// how many they are.
    more: Cluster,
    more_clusters: u64,
}

/// How many clusters that hold something are kept by name: a gateway's answer may list tens of
/// thousands with pooled connections (and a hostile one, without end); past these, they are added
/// up as one, which keeps the count whole and the memory flat.
const KEPT: usize = 1000;

const LISTED: [&str; 4] = ["rq_active", "rq_pending_active", "cx_active", "rq_total"];

impl Tally {
    /// Takes one line: `<cluster>::<host>::<stat>::<value>`; other lines are skipped.
    pub fn add_line(&mut self, line: &str, rule: &Rule) {
        let line = line.trim_end();
        let Some((rest, value)) = line.rsplit_once("::") else {
            return;
        };
        let Some((rest, stat)) = rest.rsplit_once("::") else {
            return;
        };
        if !LISTED.contains(&stat) {
            return;
        }
        let Some((name, host)) = split_host(rest) else {
            return;
        };
        self.hosts |= stat == "rq_active";
        let why_host = match host.parse::<SocketAddr>() {
            Err(_) => Some("Unix socket or internal address".to_string()),
            Ok(a) if rule.ignore_ports.contains(a.port()) => {
                Some(format!("ignored port {}", a.port()))
            }
            Ok(_) => None,
        };
        let cluster = self.cluster(name, rule);
        let counted = cluster.left_out.is_none() && why_host.is_none();
        let Ok(n) = value.trim().parse::<u64>() else {
            if counted && self.bad.is_none() {
                self.bad = Some(crate::error::shorten(line));
            }
            return;
        };
        match (stat, why_host) {
            ("rq_total", _) if counted => self.arrived = self.arrived.wrapping_add(n),
            ("rq_total", _) => {}
            ("cx_active", _) if counted => {
                cluster.connections = cluster.connections.saturating_add(n)
            }
            ("cx_active", _) => {}
            // A left-out cluster shows its requests beside the reason.
            (_, None) => cluster.requests = cluster.requests.saturating_add(n),
            (_, Some(why)) if cluster.left_out.is_none() => {
                let e = self.hosts_left_out.entry(why).or_default();
                *e = e.saturating_add(n);
            }
            (_, Some(_)) => cluster.requests = cluster.requests.saturating_add(n),
        }
    }

    /// The cluster being added up, switching to `name` when it starts.
    fn cluster(&mut self, name: &str, rule: &Rule) -> &mut Cluster {
        let current = match self.current.take() {
            Some(c) if c.name == name => c,
            previous => {
                if let Some(p) = previous {
                    self.close(p);
                }
                let left_out = if rule.preset.owns_cluster(name) {
                    Some(rule.preset.own_cluster)
                } else if rule.ignore_clusters.matches(name) {
                    Some("--ignore-clusters")
                } else {
                    None
                };
                Cluster {
                    name: name.to_string(),
                    requests: 0,
                    connections: 0,
                    left_out,
                }
            }
        };
        self.current.insert(current)
    }

    /// Keeps a finished cluster if it holds anything.
    fn close(&mut self, c: Cluster) {
        if c.requests > 0 || c.connections > 0 {
            if self.clusters.len() < KEPT {
                self.clusters.push(c);
            } else if c.left_out.is_none() {
                self.more.requests = self.more.requests.saturating_add(c.requests);
                self.more.connections = self.more.connections.saturating_add(c.connections);
                self.more_clusters += 1;
            }
        } else if c.left_out.is_none() {
            self.quiet += 1;
        }
    }

    /// The request count over the clusters that count; unknown when the answer lists no hosts
    /// or a counted host's value is not a count.
    pub fn finish(mut self) -> Result<Answer, String> {
        if let Some(c) = self.current.take() {
            self.close(c);
        }
        if self.more_clusters > 0 {
            let mut more = std::mem::take(&mut self.more);
            more.name = format!("({} more clusters)", self.more_clusters);
            self.clusters.push(more);
        }
        if let Some(line) = self.bad {
            return Err(format!(
                "Envoy's /clusters answer has a value that is not a count: '{line}'"
            ));
        }
        if !self.hosts {
            return Err("Envoy's /clusters answer lists no hosts".to_string());
        }
        let parts = self
            .clusters
            .iter()
            .filter(|c| c.left_out.is_none() && c.requests > 0)
            .map(|c| Part {
                name: format!("cluster {}", c.name),
                active: c.requests,
            })
            .collect();
        Ok(Answer {
            count: Count::of(SourceKind::Clusters, Unit::Requests, parts, vec![])
                .with_arrivals(Arrivals::Requests(self.arrived)),
            clusters: self.clusters,
            quiet: self.quiet,
            hosts_left_out: self.hosts_left_out.into_iter().collect(),
        })
    }
}

/// Splits `<cluster>::<host>` where the host is an address: an IPv6 host holds `::` too, so the
/// split is the first one after which the rest parses as an address, else the first one.
fn split_host(rest: &str) -> Option<(&str, &str)> {
    let splits = || {
        rest.match_indices("::")
            .map(|(i, _)| (&rest[..i], &rest[i + 2..]))
    };
    splits()
        .find(|(_, host)| host.parse::<SocketAddr>().is_ok())
        .or_else(|| splits().next())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(body: &str, rule: &Rule) -> Result<Answer, String> {
        let mut t = Tally::default();
        for line in body.lines() {
            t.add_line(line, rule);
        }
        t.finish()
    }

    fn istio() -> Rule {
        Rule {
            preset: crate::preset::ISTIO,
            ignore_clusters: Names::default(),
            ignore_ports: PortSet::parse(crate::lists::ISTIO_INFRA_PORTS).unwrap(),
        }
    }

    /// Envoy 1.40.0 in the pod replica (tests/pod.rs), a request in flight that called the other
    /// service, the ADS stream open; cluster-wide lines and most host lines cut for length.
    const POD: &str = "xds-grpc::observability_name::xds-grpc
xds-grpc::default_priority::max_connections::1024
xds-grpc::added_via_api::false
xds-grpc::@envoy-drain-pod-xds::cx_active::1
xds-grpc::@envoy-drain-pod-xds::rq_active::1
xds-grpc::@envoy-drain-pod-xds::rq_pending_active::0
xds-grpc::@envoy-drain-pod-xds::hostname::
inbound|8080||::observability_name::inbound|8080||
inbound|8080||::10.90.0.2:8080::cx_active::2
inbound|8080||::10.90.0.2:8080::cx_connect_fail::0
inbound|8080||::10.90.0.2:8080::rq_active::1
inbound|8080||::10.90.0.2:8080::rq_pending_active::0
inbound|8080||::10.90.0.2:8080::hostname::inbound|8080||10.90.0.2:8080
inbound|8080||::10.90.0.2:8080::success_rate::-1
agent::127.0.0.1:15020::cx_active::0
agent::127.0.0.1:15020::rq_active::0
outbound|9080||svc.other.svc.cluster.local::10.90.0.3:9080::cx_active::1
outbound|9080||svc.other.svc.cluster.local::10.90.0.3:9080::rq_active::1
outbound|9080||svc.other.svc.cluster.local::10.90.0.3:9080::rq_pending_active::0
prometheus_stats::127.0.0.1:15000::cx_active::0
prometheus_stats::127.0.0.1:15000::rq_active::0
";

    #[test]
    fn requests_in_flight_count_on_the_pods_clusters_and_istios_own_never() {
        let a = tally(POD, &istio()).unwrap();
        assert_eq!(a.count.total, 2);
        assert_eq!(a.count.describe(), "2 active requests");
        assert_eq!(
            a.count.breakdown(),
            "cluster inbound|8080||=1, cluster outbound|9080||svc.other.svc.cluster.local=1"
        );
        let xds = a.clusters.iter().find(|c| c.name == "xds-grpc").unwrap();
        assert_eq!(
            (xds.requests, xds.left_out),
            (1, Some("Istio's own cluster")),
            "the ADS stream is shown, not counted"
        );
        let inbound = a
            .clusters
            .iter()
            .find(|c| c.name == "inbound|8080||")
            .unwrap();
        assert_eq!((inbound.requests, inbound.connections), (1, 2));
    }

    #[test]
    fn each_proxys_own_clusters_are_shown_and_never_count() {
        for (preset, own, why) in [
            ("consul", "consul-dataplane", "Consul's own cluster"),
            ("kuma", "system_ads", "Kuma's own cluster"),
            (
                "kuma",
                "system_meshmetric_prometheus_default",
                "Kuma's own cluster",
            ),
            (
                "envoy-gateway",
                "xds_cluster",
                "Envoy Gateway's own cluster",
            ),
            ("contour", "contour", "Contour's own cluster"),
        ] {
            let body =
                format!("{own}::10.0.0.1:5678::rq_active::1\napp::10.0.0.2:8080::rq_active::1\n");
            let rule = Rule {
                preset: crate::preset::find(preset).unwrap(),
                ..istio()
            };
            let a = tally(&body, &rule).unwrap();
            assert_eq!(a.count.total, 1, "{preset}: only the app's request counts");
            let c = a.clusters.iter().find(|c| c.name == own).unwrap();
            assert_eq!((c.requests, c.left_out), (1, Some(why)), "{preset}");
            // Istio knows none of them: read as Istio's, the stream would hold the hook.
            assert_eq!(tally(&body, &istio()).unwrap().count.total, 2, "{own}");
        }
    }

    #[test]
    fn pending_requests_count_and_idle_connections_do_not() {
        let body = "c::10.0.0.1:80::cx_active::5\nc::10.0.0.1:80::rq_active::0\nc::10.0.0.1:80::rq_pending_active::2\n";
        assert_eq!(tally(body, &istio()).unwrap().count.total, 2);
    }

    #[test]
    fn ignored_clusters_by_name_or_prefix_and_hosts_on_ignored_ports_or_sockets_do_not_count() {
        let body =
            "outbound|4317||otel.observability.svc.cluster.local::10.0.0.9:4317::rq_active::1
exporter-a::10.0.0.8:9000::rq_active::1
mine::10.0.0.7:15012::rq_active::1
mine::/var/run/sock::rq_active::1
mine::envoy://internal/x::rq_active::1
mine::10.0.0.7:80::rq_active::4
";
        let rule = Rule {
            ignore_clusters: Names::parse("outbound|4317||*, exporter-a").unwrap(),
            ..istio()
        };
        let a = tally(body, &rule).unwrap();
        assert_eq!(a.count.total, 4);
        assert_eq!(
            a.hosts_left_out,
            vec![
                ("Unix socket or internal address".to_string(), 2),
                ("ignored port 15012".to_string(), 1)
            ]
        );
        let left: Vec<_> = a.clusters.iter().filter_map(|c| c.left_out).collect();
        assert_eq!(left, vec!["--ignore-clusters", "--ignore-clusters"]);
        assert_eq!(a.quiet, 0);
    }

    #[test]
    fn ipv6_hosts_and_cluster_names_holding_colons_split_where_the_address_starts() {
        let body =
            "inbound|8080||::[::1]:8080::rq_active::3\nweird::name::[fd00::5]:80::rq_active::1\n";
        let a = tally(body, &istio()).unwrap();
        let names: Vec<_> = a
            .clusters
            .iter()
            .map(|c| (c.name.as_str(), c.requests))
            .collect();
        assert_eq!(names, vec![("inbound|8080||", 3), ("weird::name", 1)]);
    }

    #[test]
    fn an_answer_without_hosts_or_with_a_bad_counted_value_is_unknown_never_zero() {
        assert!(tally("", &istio()).is_err());
        assert!(tally("c::observability_name::c\n", &istio()).is_err());
        let bad = "c::10.0.0.1:80::rq_active::-1\n";
        let e = tally(bad, &istio()).unwrap_err();
        assert!(
            e.contains("not a count: 'c::10.0.0.1:80::rq_active::-1'"),
            "{e}"
        );
        let bad_but_left_out =
            "xds-grpc::10.0.0.1:80::rq_active::x\nc::10.0.0.1:80::rq_active::0\n";
        assert_eq!(tally(bad_but_left_out, &istio()).unwrap().count.total, 0);
    }

    #[test]
    fn past_a_thousand_busy_clusters_the_rest_are_added_up_as_one_and_the_count_stays_whole() {
        let mut t = Tally::default();
        for i in 0..5000 {
            let name = format!("outbound|80||s{i}.ns.svc.cluster.local");
            t.add_line(&format!("{name}::10.0.0.1:80::cx_active::1"), &istio());
            t.add_line(
                &format!("{name}::10.0.0.1:80::rq_active::{}", i % 2),
                &istio(),
            );
        }
        let a = t.finish().unwrap();
        assert_eq!(a.count.total, 2500);
        assert_eq!(a.clusters.len(), KEPT + 1, "memory stays flat");
        let more = a.clusters.last().unwrap();
        assert_eq!(more.name, "(4000 more clusters)");
        assert_eq!((more.requests, more.connections), (2000, 4000));
    }

    #[test]
    fn requests_so_far_add_up_over_the_hosts_that_count_only() {
        let body = "inbound|8080||::10.90.0.2:8080::rq_active::0
inbound|8080||::10.90.0.2:8080::rq_total::40
outbound|9080||svc.other.svc.cluster.local::10.90.0.3:9080::rq_active::0
outbound|9080||svc.other.svc.cluster.local::10.90.0.3:9080::rq_total::2
xds-grpc::@envoy-drain-pod-xds::rq_total::1
agent::127.0.0.1:15020::rq_total::9
inbound|15090||::127.0.0.1:15090::rq_total::5
";
        let a = tally(body, &istio()).unwrap();
        assert_eq!(a.count.total, 0);
        assert_eq!(a.count.arrivals, Arrivals::Requests(42));
    }
}
