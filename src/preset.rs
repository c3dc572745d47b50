//! `--preset`: the defaults that fit each Envoy-based proxy: its admin API, what is its own (never
//! counted), what its drain covers, and whether Istio's agent is there. A flag overrides each.
//! The facts, from each proxy's source: docs/running.md ("Other Envoy-based proxies").

use crate::drain::Request;
use crate::lists::ISTIO_INFRA_PORTS;

/// The port Istio's, Kuma's and Consul's capture send the app's outbound connections to
/// (istio-iptables `ProxyPort`, kumactl `--redirect-outbound-port`, Consul's
/// `OutboundListenerPort`): what Envoy accepts there are the app's calls out, never arrivals.
pub(crate) const OUTBOUND_CAPTURE: u16 = 15001;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    pub(crate) name: &'static str,
    /// Why `status` leaves one of `own_clusters` out: "Istio's own cluster".
    pub(crate) own_cluster: &'static str,
    /// `--admin`'s default, as the flag takes it.
    pub(crate) admin: &'static str,
    /// `--ignore-ports`' default: the proxy's own listeners and its companions' ports.
    pub(crate) ignore_ports: &'static str,
    /// The stat prefixes of the proxy's own named listeners (no port tells them), never counted.
    /// In these lists a name ending in `*` is a prefix (`lists::any`).
    pub(crate) own_listeners: &'static [&'static str],
    /// The stat prefixes of the proxy's own HTTP connection managers, never counted.
    pub(crate) own_hcms: &'static [&'static str],
    /// The proxy's own clusters (its xDS stream, exporters, its own listeners' clusters).
    pub(crate) own_clusters: &'static [&'static str],
    /// The clusters that carry requests to the app, which tell `hold` what arrives (a gateway: none).
    pub(crate) inbound_clusters: &'static [&'static str],
    /// `--drain`'s default, which listeners the hook drains before it waits (`None`: none): a
    /// gateway's listeners have no direction, and drain all.
    pub(crate) drain: Option<Request>,
    /// Whether Istio's agent is there, for `--drain agent` and `--then-quit`.
    pub(crate) agent: bool,
    /// Istio's waypoint: requests by default, from /clusters alone (its stats cannot tell a TCP
    /// stream from an idle client), hosts at Envoy's internal addresses (`envoy://listener/...`)
    /// included, as its services reach their pods through its own HBONE listener.
    pub(crate) waypoint: bool,
}

/// A waypoint's own clusters: the 11 of Istio's bootstrap template (istio/istio
/// tools/packaging/common/envoy_bootstrap.json), a sidecar's too, then its HBONE plumbing
/// (pilot/pkg/networking/core/cluster_waypoint.go): the clients' CONNECT streams (`main_internal`),
/// the tunnels to the pods (`connect_originate`) and those of the multi-network and east-west
/// gateway's forms. `encap`, which carries the requests sent to a pod's own address, is not one.
const WAYPOINT_OWN: [&str; 16] = [
    "prometheus_stats",
    "agent",
    "sds-grpc",
    "sds-files-grpc",
    "xds-grpc",
    "zipkin",
    "lightstep",
    "datadog_agent",
    "envoy_metrics_service",
    "envoy_accesslog_service",
    "local_cluster",
    "main_internal",
    "connect_originate",
    "inner_connect_originate",
    "outer_connect_originate",
    "forward_inner_connect",
];

/// Istio's sidecars and gateways, the default. Its own managers and clusters are in its bootstrap
/// template (istio/istio tools/packaging/common/envoy_bootstrap.json).
pub const ISTIO: Preset = Preset {
    name: "istio",
    own_cluster: "Istio's own cluster",
    admin: "127.0.0.1:15000",
    ignore_ports: ISTIO_INFRA_PORTS,
    own_listeners: &[],
    own_hcms: &["admin", "agent", "stats"],
    own_clusters: WAYPOINT_OWN.split_at(11).0,
    // `inbound|PORT||` (pilot/pkg/model/service.go BuildInboundSubsetKey), and the passthrough
    // cluster for ports no Service names (pilot/pkg/util/network, InboundPassthroughCluster).
    inbound_clusters: &["inbound|*", "InboundPassthroughCluster*"],
    drain: Some(Request::DrainListeners { all: false }),
    agent: true,
    waypoint: false,
};

pub const PRESETS: [Preset; 6] = [
    ISTIO,
    // Istio's waypoint (pilot/pkg/networking/core/waypoint.go): ztunnels' pooled HBONE connections
    // end on `connect_terminate`, one CONNECT stream per client connection, idle or not, which
    // `main_internal` carries; the services' clusters (`inbound-vip|...`) and `encap` (to a pod's
    // own address) hold the requests, on hosts at `connect_originate`'s internal address. See
    // docs/running.md, "Waypoints".
    Preset {
        name: "waypoint",
        own_listeners: &["envoy_internal_*"],
        own_hcms: &["admin", "agent", "stats", "connect_terminate"],
        own_clusters: &WAYPOINT_OWN,
        inbound_clusters: &[],
        drain: Some(Request::DrainListeners { all: true }),
        waypoint: true,
        ..ISTIO
    },
    // hashicorp/consul-dataplane internal/bootstrap, pkg/consuldp/bootstrap.go.
    Preset {
        name: "consul",
        own_cluster: "Consul's own cluster",
        admin: "127.0.0.1:19000",
        ignore_ports: "19000,20100,20101,20200,20600,21000",
        own_hcms: &["admin", "envoy_prometheus_metrics", "envoy_ready"],
        own_clusters: &[
            "consul-dataplane",
            "self_admin",
            "prometheus_backend",
            "consul_telemetry_collector_loopback",
        ],
        // agent/xds xdscommon LocalAppClusterName.
        inbound_clusters: &["local_app"],
        agent: false,
        ..ISTIO
    },
    // kumahq/kuma (pkg/xds/bootstrap/template_v3.go, pkg/xds/generator/admin_proxy_generator.go,
    // pkg/plugins/policies/meshmetric, pkg/xds/dynconf, pkg/xds/envoy/names), older names too.
    Preset {
        name: "kuma",
        own_cluster: "Kuma's own cluster",
        admin: "unix:/tmp/kuma-dp-*/kuma-envoy-admin.sock",
        ignore_ports: "5670,9901,9902,15053",
        own_listeners: &["system_meshmetric_*", "system_dynamicconfig"],
        own_hcms: &[
            "admin",
            "system_envoy_admin",
            "kuma_envoy_admin",
            "system_meshmetric_*",
            "system_dynamicconfig",
        ],
        own_clusters: &[
            "system_ads",
            "system_access_log_sink",
            "system_envoy_admin",
            "system_probe_readiness",
            "system_meshmetric_*",
            "ads_cluster",
            "access_log_sink",
            "kuma:envoy:admin",
            "kuma:metrics:hijacker",
            "_kuma:metrics:*",
        ],
        // pkg/xds/envoy/names GetLocalClusterName: `localhost:PORT`.
        inbound_clusters: &["localhost:*"],
        agent: false,
        ..ISTIO
    },
    // envoyproxy/gateway internal/xds/bootstrap/bootstrap.yaml.tpl.
    Preset {
        name: "envoy-gateway",
        own_cluster: "Envoy Gateway's own cluster",
        admin: "127.0.0.1:19000",
        ignore_ports: "19000,19001,19002,19003",
        own_hcms: &["admin", "eg-stats-http", "eg-ready-http"],
        own_clusters: &["xds_cluster", "prometheus_stats", "otel_metric_sink_*"],
        inbound_clusters: &[],
        drain: Some(Request::DrainListeners { all: true }),
        agent: false,
        ..ISTIO
    },
    // projectcontour/contour internal/envoy/v3/bootstrap.go.
    Preset {
        name: "contour",
        own_cluster: "Contour's own cluster",
        admin: "unix:/admin/admin.sock",
        ignore_ports: "8002,9001",
        own_hcms: &["admin", "envoy-admin", "stats", "health", "stats-health"],
        own_clusters: &["contour", "envoy-admin"],
        inbound_clusters: &[],
        drain: Some(Request::DrainListeners { all: true }),
        agent: false,
        ..ISTIO
    },
];

impl Default for Preset {
    fn default() -> Preset {
        ISTIO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sidecar_leaves_out_the_bootstrap_clusters_and_a_waypoint_its_hbone_ones_too() {
        assert_eq!(ISTIO.own_clusters.last(), Some(&"local_cluster"));
        assert!(!ISTIO.own_clusters.contains(&"main_internal"));
        assert!(!ISTIO.own_clusters.contains(&"connect_originate"));
        let waypoint = PRESETS.iter().find(|p| p.name == "waypoint").unwrap();
        assert!(waypoint.own_clusters.starts_with(ISTIO.own_clusters));
        assert!(waypoint.own_clusters.contains(&"main_internal"));
        assert!(!waypoint.own_clusters.contains(&"encap"));
    }
}
