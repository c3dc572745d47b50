//! Interprets Envoy's `GET /clusters` (pure: lines in, count out): the upstream requests in flight
//! on the clusters that carry the pod's traffic, in and out; a TCP proxy stream is one, an idle
//! pooled connection none. Per-host counters are not stats, so a default Istio proxy has them.
//! See docs/how-it-works.md.

use crate::count::{Capped, Count, Excluded, KEPT, Part, SourceKind, Unit, Warning};
use crate::error::Failure;
use crate::lists::{Names, PortSet, any};
use crate::preset::Preset;
use crate::source::stats::WRAPPED;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::net::SocketAddr;

pub(crate) const CLUSTERS_PATH: &str = "/clusters";

/// Which hosts count: not the proxy's own clusters' nor `--ignore-clusters`', not Unix sockets or
/// internal addresses, not on an ignored port; with `app_only` (`hold`), only the app's clusters',
/// and those on a Unix socket too.
#[derive(Debug, Clone, Default)]
pub struct HostScope {
    pub preset: Preset,
    pub ignore_clusters: Names,
    pub ignore_ports: PortSet,
    pub app_only: bool,
}

/// One cluster as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cluster {
    pub(crate) name: String,
    /// Requests in flight (`rq_active` and `rq_pending_active`) on the hosts that count.
    pub requests: u64,
    /// Open upstream connections (`cx_active`) on those hosts, idle ones included.
    pub(crate) connections: u64,
    /// Why the whole cluster is left out, if it is.
    pub left_out: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub count: Count,
    /// The clusters that hold any request or connection.
    pub clusters: Vec<Cluster>,
    /// Clusters that count but hold nothing.
    pub(crate) quiet: u64,
    /// The arrival counters of the hosts that count, those at 0 left out.
    pub counters: Vec<HostCounter>,
    /// So far on the app's own clusters' hosts, which `hold` reads.
    pub(crate) app_arrived: AppArrived,
}

/// One host's arrival counter: a hash of the host's and the counter's names, and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostCounter {
    pub(crate) host: u64,
    pub(crate) value: u64,
}

/// Requests and connections so far on the app's own clusters' hosts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AppArrived {
    pub(crate) requests: u64,
    pub(crate) connections: u64,
}

/// Adds up an answer line by line, keeping the clusters that hold something (Envoy prints a
/// cluster's lines together).
#[derive(Debug, Default)]
pub struct HostTally {
    current: Option<Cluster>,
    clusters: Capped<Cluster>,
    quiet: u64,
    hosts_left_out: BTreeMap<String, u64>,
    /// An `rq_active` line was seen: the answer lists hosts.
    hosts: bool,
    /// A counted host's value that is not a count: the count cannot be trusted.
    bad: Option<String>,
    /// The arrival counters (`rq_total`; with `app_only`, `cx_total` too) of the hosts that count.
    counters: Vec<HostCounter>,
    app_arrived: AppArrived,
    /// Gauges that wrapped below zero, and the first one's host.
    wrapped: u64,
    first_wrapped: Option<String>,
}

const LISTED: [&str; 5] = ["rq_active", "rq_pending_active", "cx_active", "rq_total", "cx_total"];

impl HostTally {
    /// Takes one line: `<cluster>::<host>::<stat>::<value>`; other lines are skipped.
    pub fn add_line(&mut self, line: &str, rule: &HostScope) {
        let line = line.trim_end();
        let Some((rest, value)) = line.rsplit_once("::") else { return };
        let Some((rest, stat)) = rest.rsplit_once("::") else { return };
        if !LISTED.contains(&stat) {
            return;
        }
        let Some((name, host)) = split_host(rest) else { return };
        self.hosts |= stat == "rq_active";
        let why_host = why_host(host, name, rule);
        let parsed = value.trim().parse::<u64>();
        // A gauge that wrapped below zero (a per-host rq_active, as /stats' own do) means 0.
        let wrapped = parsed.as_ref().is_ok_and(|n| *n > WRAPPED) && stat.ends_with("active");
        let counted = self.cluster(name, rule).left_out.is_none() && why_host.is_none();
        // Warned of only where it would have counted.
        if wrapped && counted {
            self.wrapped += 1;
            self.first_wrapped.get_or_insert_with(|| rest.to_string());
        }
        let cluster = self.cluster(name, rule);
        let Ok(n) = parsed.map(|n| if wrapped { 0 } else { n }) else {
            if counted && self.bad.is_none() {
                self.bad = Some(crate::error::shorten(line));
            }
            return;
        };
        let app_host = why_host.is_none() && any(rule.preset.inbound_clusters, name);
        match (stat, why_host) {
            ("rq_total", _) | ("cx_total", _) => {
                if app_host {
                    let AppArrived { requests, connections } = &mut self.app_arrived;
                    let so_far = if stat == "rq_total" { requests } else { connections };
                    *so_far = so_far.saturating_add(n);
                }
                if counted && n > 0 && (stat == "rq_total" || rule.app_only) {
                    let host = BuildHasherDefault::<DefaultHasher>::new().hash_one((rest, stat));
                    self.counters.push(HostCounter { host, value: n });
                }
            }
            ("cx_active", _) if counted => {
                cluster.connections = cluster.connections.saturating_add(n)
            }
            ("cx_active", _) => {}
            (_, Some(why)) if cluster.left_out.is_none() => {
                let e = self.hosts_left_out.entry(why).or_default();
                *e = e.saturating_add(n);
            }
            // A host that counts; or one of a left-out cluster, which shows them beside its reason.
            _ => cluster.requests = cluster.requests.saturating_add(n),
        }
    }

    /// The cluster being added up, switching to `name` when it starts.
    fn cluster(&mut self, name: &str, rule: &HostScope) -> &mut Cluster {
        let current = match self.current.take() {
            Some(c) if c.name == name => c,
            previous => {
                if let Some(p) = previous {
                    self.close(p);
                }
                let left_out = if any(rule.preset.own_clusters, name) {
                    Some(rule.preset.own_cluster)
                } else if rule.app_only && !any(rule.preset.inbound_clusters, name) {
                    Some("not the app's inbound")
                } else if rule.ignore_clusters.matches(name) {
                    Some("--ignore-clusters")
                } else {
                    None
                };
                Cluster { name: name.to_string(), requests: 0, connections: 0, left_out }
            }
        };
        self.current.insert(current)
    }

    fn close(&mut self, c: Cluster) {
        if c.requests > 0 || c.connections > 0 {
            // Past the cap, only what counts is added up.
            if c.left_out.is_none() || self.clusters.rows.len() < KEPT {
                let figures = [c.requests, c.connections];
                self.clusters.keep(|| c, figures);
            }
        } else if c.left_out.is_none() {
            self.quiet += 1;
        }
    }

    /// The request count; unknown when the answer lists no hosts or a counted value is not a count.
    pub fn finish(mut self) -> Result<Answer, Failure> {
        if let Some(c) = self.current.take() {
            self.close(c);
        }
        let clusters = self.clusters.all(|more, [requests, connections]| Cluster {
            name: format!("({more} more clusters)"),
            requests,
            connections,
            left_out: None,
        });
        if let Some(line) = self.bad {
            return Err(Failure::from(format!(
                "Envoy's /clusters answer has a value that is not a count: '{line}'"
            )));
        }
        if !self.hosts {
            return Err(Failure::from("Envoy's /clusters answer lists no hosts".to_string()));
        }
        let parts = clusters
            .iter()
            .filter(|c| c.left_out.is_none() && c.requests > 0)
            .map(|c| Part { name: format!("cluster {}", c.name), active: c.requests })
            .collect();
        // Requests on hosts left out of clusters that count, by why.
        let excluded =
            self.hosts_left_out.into_iter().map(|(why, n)| Excluded { why, n }).collect();
        let (n, first) = (self.wrapped, self.first_wrapped);
        let wrapped = first.map(|first| Warning::Wrapped { n, first });
        let count =
            Count::new(SourceKind::Clusters, Unit::Requests, parts, wrapped.into_iter().collect());
        Ok(Answer {
            count: Count { excluded, ..count },
            clusters,
            quiet: self.quiet,
            counters: self.counters,
            app_arrived: self.app_arrived,
        })
    }
}

/// What has arrived since the first answer, over answers whose hosts come and go: a counter that
/// grew adds what it grew by; one first seen, or lower than before, belongs to a host made (again)
/// since and adds all it holds; one that vanished adds nothing (istio/istio#51935: idle inbound
/// hosts were re-created). An ORIGINAL_DST cluster can list several hosts of one address under
/// one name (`HostsForAddress`): those are paired largest with largest.
#[derive(Debug, Default)]
pub struct Arrived {
    last: Option<Vec<HostCounter>>,
    total: u64,
}

impl Arrived {
    /// Takes an answer's counters, and tells what has arrived so far.
    pub fn add(&mut self, mut now: Vec<HostCounter>) -> Option<u64> {
        now.sort_unstable();
        if let Some(last) = &self.last {
            for hosts in now.chunk_by(|a, b| a.host == b.host) {
                let host = hosts[0].host;
                let from = last.partition_point(|c| c.host < host);
                let to = last.partition_point(|c| c.host <= host);
                let mut before = last[from..to].iter().rev();
                for &HostCounter { value: n, .. } in hosts.iter().rev() {
                    let new = match before.next() {
                        Some(&HostCounter { value: was, .. }) if n >= was => n - was,
                        _ => n,
                    };
                    self.total = self.total.saturating_add(new);
                }
            }
        }
        self.last = Some(now);
        Some(self.total)
    }
}

/// Why a host's figures do not count: a Unix socket or internal address (but `hold`'s app on one,
/// an Istio Sidecar's `defaultEndpoint: unix://`; a waypoint's pods), or an ignored port.
fn why_host(host: &str, cluster: &str, rule: &HostScope) -> Option<String> {
    let pipe = host.starts_with('/') || host.starts_with('@');
    // A waypoint's hosts are internal addresses that name a pod's: `envoy://<listener>/IP:PORT`.
    let internal = host.strip_prefix("envoy://").filter(|_| rule.preset.waypoint);
    let to = internal.and_then(|h| h.rsplit_once('/')?.1.parse::<SocketAddr>().ok());
    match to.map_or_else(|| host.parse::<SocketAddr>(), Ok) {
        Err(_) if rule.app_only && pipe && any(rule.preset.inbound_clusters, cluster) => None,
        Err(_) if rule.preset.waypoint && host.starts_with("envoy://") => None,
        Err(_) => Some("Unix socket or internal address".to_string()),
        Ok(a) if rule.ignore_ports.contains(a.port()) => Some(format!("ignored port {}", a.port())),
        Ok(_) => None,
    }
}

/// Splits `<cluster>::<host>` where the host is an address: an IPv6 host holds `::` too, so the
/// split is the first one after which the rest parses as an address, else the first one.
fn split_host(rest: &str) -> Option<(&str, &str)> {
    let splits = || rest.match_indices("::").map(|(i, _)| (&rest[..i], &rest[i + 2..]));
    splits().find(|(_, host)| host.parse::<SocketAddr>().is_ok()).or_else(|| splits().next())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(body: &str, rule: &HostScope) -> Result<Answer, Failure> {
        let mut t = HostTally::default();
        for line in body.lines() {
            t.add_line(line, rule);
        }
        t.finish()
    }

    fn istio() -> HostScope {
        HostScope {
            preset: crate::preset::ISTIO,
            ignore_clusters: Names::default(),
            ignore_ports: PortSet::parse(crate::lists::ISTIO_INFRA_PORTS).unwrap(),
            app_only: false,
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
        let inbound = a.clusters.iter().find(|c| c.name == "inbound|8080||").unwrap();
        assert_eq!((inbound.requests, inbound.connections), (1, 2));
    }

    #[test]
    fn a_per_host_gauge_that_wrapped_below_zero_counts_as_0_with_a_warning() {
        // Red-team of run, finding 9: an rq_active of 2^64 - 1 held the wait to its deadline,
        // where /stats' gauges that wrap count as 0.
        let wrapped = POD.replace(
            "inbound|8080||::10.90.0.2:8080::rq_active::1",
            "inbound|8080||::10.90.0.2:8080::rq_active::18446744073709551615",
        );
        let a = tally(&wrapped, &istio()).unwrap();
        assert_eq!(a.count.total, 1, "the outbound request alone");
        assert_eq!(
            a.count.warnings.iter().map(Warning::to_string).collect::<Vec<_>>(),
            ["1 gauge wrapped below zero and counts as 0 (inbound|8080||::10.90.0.2:8080)"]
        );
    }

    #[test]
    fn each_proxys_own_clusters_are_shown_and_never_count() {
        for (preset, own, why) in [
            ("consul", "consul-dataplane", "Consul's own cluster"),
            ("kuma", "system_ads", "Kuma's own cluster"),
            ("kuma", "system_meshmetric_prometheus_default", "Kuma's own cluster"),
            ("envoy-gateway", "xds_cluster", "Envoy Gateway's own cluster"),
            ("contour", "contour", "Contour's own cluster"),
        ] {
            let body =
                format!("{own}::10.0.0.1:5678::rq_active::1\napp::10.0.0.2:8080::rq_active::1\n");
            let rule = HostScope {
                preset: crate::preset::PRESETS.into_iter().find(|p| p.name == preset).unwrap(),
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

    /// Upstream Envoy as istiod's waypoint in the rollout replica (tests/rollout.rs) under hey's
    /// load, ten kept-alive clients: Envoy's lines, some hosts cut, one host's rq_active set to 2
    /// and encap's to 1 (a request to a pod's own address).
    const WAYPOINT: &str = "main_internal::envoy://main_internal/::cx_active::10
main_internal::envoy://main_internal/::rq_active::10
main_internal::envoy://main_internal/::rq_total::40
connect_originate::10.244.0.4:15008::cx_active::1
connect_originate::10.244.0.4:15008::rq_active::4
connect_originate::10.244.0.5:15008::cx_active::1
connect_originate::10.244.0.5:15008::rq_active::5
agent::127.0.0.1:15020::rq_active::0
encap::envoy://connect_originate/::rq_active::1
inbound-vip|80|http|app.shop-0.svc.cluster.local::envoy://connect_originate/10.244.0.5:8080::cx_active::5
inbound-vip|80|http|app.shop-0.svc.cluster.local::envoy://connect_originate/10.244.0.5:8080::rq_active::2
inbound-vip|80|http|app.shop-0.svc.cluster.local::envoy://connect_originate/10.244.0.4:8080::cx_active::4
inbound-vip|80|http|app.shop-0.svc.cluster.local::envoy://connect_originate/10.244.0.4:8080::rq_active::0
sds-grpc::./var/run/secrets/workload-spiffe-uds/socket::rq_active::2
xds-grpc::./etc/istio/proxy/XDS::rq_active::1
";

    #[test]
    fn a_waypoint_counts_its_services_requests_not_its_clients_streams_nor_tunnels() {
        let waypoint = crate::preset::PRESETS.into_iter().find(|p| p.name == "waypoint").unwrap();
        let a = tally(WAYPOINT, &HostScope { preset: waypoint, ..istio() }).unwrap();
        assert_eq!(
            a.count.breakdown(),
            "cluster encap=1, cluster inbound-vip|80|http|app.shop-0.svc.cluster.local=2"
        );
        // The CONNECT streams (idle kept-alive clients too) and the tunnels to the pods: shown.
        for (own, requests) in [("main_internal", 10), ("connect_originate", 9)] {
            let c = a.clusters.iter().find(|c| c.name == own).unwrap();
            assert_eq!((c.requests, c.left_out), (requests, Some("Istio's own cluster")));
        }
        // Read as a sidecar's, the tunnels would hold the hook and the requests go unseen.
        assert_eq!(tally(WAYPOINT, &istio()).unwrap().count.total, 9);
        // Istio's own exporters are a waypoint's too: an access-log stream never holds it.
        let stream = "envoy_accesslog_service::10.0.0.9:9411::rq_active::1\n";
        assert_eq!(
            tally(stream, &HostScope { preset: waypoint, ..istio() }).unwrap().count.total,
            0
        );
        // `--ignore-ports 8080` leaves out the pods' port its hosts name (red-team of run, 7).
        let ignore_ports = PortSet::parse("8080").unwrap();
        let a = tally(WAYPOINT, &HostScope { preset: waypoint, ignore_ports, ..istio() }).unwrap();
        assert_eq!(a.count.breakdown(), "cluster encap=1");
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
        let rule = HostScope {
            ignore_clusters: Names::parse("outbound|4317||*, exporter-a").unwrap(),
            ..istio()
        };
        let a = tally(body, &rule).unwrap();
        assert_eq!(a.count.total, 4);
        assert_eq!(
            a.count.excluded,
            vec![
                Excluded { why: "Unix socket or internal address".to_string(), n: 2 },
                Excluded { why: "ignored port 15012".to_string(), n: 1 }
            ]
        );
        let left: Vec<_> = a.clusters.iter().filter_map(|c| c.left_out).collect();
        assert_eq!(left, vec!["--ignore-clusters", "--ignore-clusters"]);
        assert_eq!(a.quiet, 0);
    }

    #[test]
    fn an_app_on_a_unix_socket_tells_holds_arrivals_and_never_runs_count() {
        // Red-team #2: a Sidecar whose defaultEndpoint is unix://; the host was dropped.
        let body = "inbound|8080||::/var/run/app/app.sock::rq_active::0
inbound|8080||::/var/run/app/app.sock::rq_total::110
inbound|8080||::/var/run/app/app.sock::cx_total::3
";
        let hold = HostScope { app_only: true, ..istio() };
        let a = tally(body, &hold).unwrap();
        assert_eq!(a.app_arrived, AppArrived { requests: 110, connections: 3 });
        assert_eq!(a.counters.len(), 2, "both counters tell arrivals: {:?}", a.counters);
        let run = tally(body, &istio()).unwrap();
        assert!(run.counters.is_empty(), "{:?}", run.counters);
    }

    #[test]
    fn ipv6_hosts_and_cluster_names_holding_colons_split_where_the_address_starts() {
        let body =
            "inbound|8080||::[::1]:8080::rq_active::3\nweird::name::[fd00::5]:80::rq_active::1\n";
        let a = tally(body, &istio()).unwrap();
        let names: Vec<_> = a.clusters.iter().map(|c| (c.name.as_str(), c.requests)).collect();
        assert_eq!(names, vec![("inbound|8080||", 3), ("weird::name", 1)]);
    }

    #[test]
    fn an_answer_without_hosts_or_with_a_bad_counted_value_is_unknown_never_zero() {
        assert!(tally("", &istio()).is_err());
        assert!(tally("c::observability_name::c\n", &istio()).is_err());
        let bad = "c::10.0.0.1:80::rq_active::-1\n";
        let e = tally(bad, &istio()).unwrap_err();
        assert!(e.contains("not a count: 'c::10.0.0.1:80::rq_active::-1'"), "{e}");
        let bad_but_left_out =
            "xds-grpc::10.0.0.1:80::rq_active::x\nc::10.0.0.1:80::rq_active::0\n";
        assert_eq!(tally(bad_but_left_out, &istio()).unwrap().count.total, 0);
    }

    #[test]
    fn past_a_thousand_busy_clusters_the_rest_are_added_up_as_one_and_the_count_stays_whole() {
        let mut t = HostTally::default();
        for i in 0..5000 {
            let name = format!("outbound|80||s{i}.ns.svc.cluster.local");
            t.add_line(&format!("{name}::10.0.0.1:80::cx_active::1"), &istio());
            t.add_line(&format!("{name}::10.0.0.1:80::rq_active::{}", i % 2), &istio());
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
        let mut arrived = Arrived::default();
        let a = tally(body, &istio()).unwrap();
        assert_eq!(a.count.total, 0);
        assert_eq!(a.counters.len(), 2, "{:?}", a.counters);
        assert_eq!(arrived.add(a.counters), Some(0));
        let later = body.replace("::40", "::43").replace("::2\n", "::3\n");
        let a = tally(&later, &istio()).unwrap();
        assert_eq!(arrived.add(a.counters), Some(4));
    }

    #[test]
    fn a_host_that_vanishes_or_restarts_its_counter_takes_no_arrival_back() {
        let counters = |body: &str, rule: &HostScope| tally(body, rule).unwrap().counters;
        let rule = HostScope { app_only: true, ..istio() };
        let host = |port: u16, rq: u64, cx: u64| {
            format!(
                "inbound|8080||::10.90.0.{port}:8080::rq_active::0
inbound|8080||::10.90.0.{port}:8080::rq_total::{rq}
inbound|8080||::10.90.0.{port}:8080::cx_total::{cx}
outbound|9080||svc::10.90.0.3:9080::rq_total::{rq}
"
            )
        };
        let mut arrived = Arrived::default();
        let first = host(2, 40, 10) + &host(4, 7, 7);
        assert_eq!(arrived.add(counters(&first, &rule)), Some(0));
        // The host with 47 requests is gone; nothing arrived.
        assert_eq!(arrived.add(counters(&host(2, 40, 10), &rule)), Some(0));
        // Re-created with its counters from 0: its 2 requests are new, on 1 new connection.
        let again = host(2, 40, 10) + &host(4, 2, 1);
        assert_eq!(arrived.add(counters(&again, &rule)), Some(3));
        // Hosts of one address in an ORIGINAL_DST cluster, under one name: one more request at
        // the busy one is one arrival, whichever order they are listed in, and one that vanished
        // takes nothing back.
        let dup = |rq: &[u64]| {
            rq.iter()
                .map(|n| {
                    format!(
                        "inbound|8080||::10.90.0.2:8080::rq_active::0
inbound|8080||::10.90.0.2:8080::rq_total::{n}
"
                    )
                })
                .collect::<String>()
        };
        let mut dups = Arrived::default();
        for (rq, total) in
            [(&[726, 1, 1][..], 0), (&[1, 1, 726], 0), (&[1, 727], 1), (&[1, 727, 1], 2)]
        {
            assert_eq!(dups.add(counters(&dup(rq), &rule)), Some(total));
        }
        // The outbound cluster's requests and the app's own calls out never arrive at it.
        let out = host(2, 40, 10).replace(
            "outbound|9080||svc::10.90.0.3:9080::rq_total::40",
            "outbound|9080||svc::10.90.0.3:9080::rq_total::90",
        );
        assert_eq!(arrived.add(counters(&(out + &host(4, 2, 1)), &rule)), Some(3));
    }
}
