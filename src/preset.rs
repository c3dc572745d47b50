//! `--preset`: the defaults that fit each Envoy-based proxy: where its admin API listens, which of
//! its ports, listeners, HTTP connection managers and clusters are its own (never counted), which
//! listeners its drain covers, and whether Istio's agent is there to drain and stop the proxy.
//! Every one is a default that an explicit flag overrides; `--fail-healthcheck` stays a choice (a
//! switch no preset could take back). The facts, read from each proxy's source, are in
//! docs/running.md ("Other Envoy-based proxies").

use crate::drain::Drain;
use crate::lists::{ISTIO_INFRA_PORTS, matches};

/// The port the sidecars' capture sends the app's outbound connections to: Istio's
/// (istio-iptables, `ProxyPort` 15001), Kuma's transparent proxy's (kumactl's `--redirect-outbound-port`
/// default) and Consul's (`TransparentProxy.OutboundListenerPort` default). Connections Envoy
/// accepted there are the app's calls out, never arrivals at the app.
pub const OUTBOUND_CAPTURE: u16 = 15001;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    pub name: &'static str,
    /// Why `status` leaves one of `own_clusters` out: "Istio's own cluster".
    pub own_cluster: &'static str,
    /// `--admin`'s default, as the flag takes it.
    pub admin: &'static str,
    /// `--ignore-ports`' default: the proxy's own listeners and its companions' ports.
    pub ignore_ports: &'static str,
    /// The stat prefixes of the proxy's own listeners that are named, not numbered by their
    /// address (so `ignore_ports` cannot tell them), whose connections never count. In these
    /// three lists a name ending in `*` is a prefix.
    pub own_listeners: &'static [&'static str],
    /// The stat prefixes of the proxy's own HTTP connection managers (its admin API, health and
    /// metrics listeners), whose requests never count.
    pub own_hcms: &'static [&'static str],
    /// The proxy's own clusters (its xDS stream, which is always in flight, its exporters and the
    /// clusters behind its own listeners), whose requests in `/clusters` never count.
    pub own_clusters: &'static [&'static str],
    /// The clusters that carry requests to the app, whose hosts' counters tell `hold` what
    /// arrives; a gateway has no app behind it, and none.
    pub inbound_clusters: &'static [&'static str],
    /// `--drain`'s default: a sidecar drains its inbound listeners; a gateway's listeners carry
    /// no traffic direction, so `inboundonly` would drain none of them.
    pub drain: Drain,
    /// Whether Istio's agent is there, for `--drain agent` and `--then-quit`.
    pub agent: bool,
}

/// Istio's sidecars and gateways: today's behaviour, the default. Its own HTTP connection
/// managers are the admin API's and those of its health (15021) and Prometheus (15090) listeners,
/// whose stat prefixes are "agent" and "stats"; its own clusters are its agent, Prometheus,
/// certificates, xDS, tracers, telemetry exporters and the self-discovery cluster, all in Istio's
/// bootstrap template (istio/istio, tools/packaging/common/envoy_bootstrap.json).
pub const ISTIO: Preset = Preset {
    name: "istio",
    own_cluster: "Istio's own cluster",
    admin: "127.0.0.1:15000",
    ignore_ports: ISTIO_INFRA_PORTS,
    own_listeners: &[],
    own_hcms: &["admin", "agent", "stats"],
    own_clusters: &[
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
    ],
    // `inbound|PORT||` (pilot/pkg/model/service.go BuildInboundSubsetKey), and the passthrough
    // cluster for ports no Service names (pilot/pkg/util/network, InboundPassthroughCluster).
    inbound_clusters: &["inbound|*", "InboundPassthroughCluster*"],
    drain: Drain::Inbound,
    agent: true,
};

pub const PRESETS: [Preset; 5] = [
    ISTIO,
    // consul-dataplane's bootstrap (hashicorp/consul-dataplane, internal/bootstrap and
    // pkg/consuldp/bootstrap.go): its xDS cluster "consul-dataplane", "self_admin" and
    // "prometheus_backend" behind its metrics listener, "consul_telemetry_collector_loopback".
    Preset {
        name: "consul",
        own_cluster: "Consul's own cluster",
        admin: "127.0.0.1:19000",
        ignore_ports: "19000,20100,20101,20200,20600,21000",
        own_listeners: &[],
        own_hcms: &["admin", "envoy_prometheus_metrics", "envoy_ready"],
        own_clusters: &[
            "consul-dataplane",
            "self_admin",
            "prometheus_backend",
            "consul_telemetry_collector_loopback",
        ],
        // agent/xds xdscommon LocalAppClusterName.
        inbound_clusters: &["local_app"],
        drain: Drain::Inbound,
        agent: false,
    },
    // kumahq/kuma: the bootstrap's "system_ads" and "system_access_log_sink" (once "ads_cluster"
    // and "access_log_sink"), the admin listener and cluster "system_envoy_admin" (once
    // "kuma:envoy:admin"), "system_probe_readiness", MeshMetric's "system_meshmetric_*" listener,
    // manager and cluster on 5670, and the dynamic-config listener "system_dynamicconfig"
    // (pkg/xds/bootstrap/template_v3.go, pkg/xds/generator/admin_proxy_generator.go,
    // pkg/plugins/policies/meshmetric, pkg/xds/dynconf, pkg/xds/envoy/names).
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
        drain: Drain::Inbound,
        agent: false,
    },
    // envoyproxy/gateway internal/xds/bootstrap/bootstrap.yaml.tpl: "xds_cluster",
    // "prometheus_stats" behind its stats listener, its OpenTelemetry sinks.
    Preset {
        name: "envoy-gateway",
        own_cluster: "Envoy Gateway's own cluster",
        admin: "127.0.0.1:19000",
        ignore_ports: "19000,19001,19002,19003",
        own_listeners: &[],
        own_hcms: &["admin", "eg-stats-http", "eg-ready-http"],
        own_clusters: &["xds_cluster", "prometheus_stats", "otel_metric_sink_*"],
        inbound_clusters: &[],
        drain: Drain::All,
        agent: false,
    },
    // projectcontour/contour internal/envoy/v3/bootstrap.go: the xDS cluster "contour" and
    // "envoy-admin", the admin socket behind its stats and admin listeners.
    Preset {
        name: "contour",
        own_cluster: "Contour's own cluster",
        admin: "unix:/admin/admin.sock",
        ignore_ports: "8002,9001",
        own_listeners: &[],
        own_hcms: &["admin", "envoy-admin", "stats", "health", "stats-health"],
        own_clusters: &["contour", "envoy-admin"],
        inbound_clusters: &[],
        drain: Drain::All,
        agent: false,
    },
];

impl Preset {
    /// Whether the listener whose stats are named `name` is the proxy's own.
    pub fn owns_listener(&self, name: &str) -> bool {
        self.own_listeners.iter().any(|p| matches(p, name))
    }

    /// Whether the HTTP connection manager with stat prefix `prefix` is the proxy's own.
    pub fn owns_hcm(&self, prefix: &str) -> bool {
        self.own_hcms.iter().any(|p| matches(p, prefix))
    }

    /// Whether the cluster `name` carries requests to the app.
    pub fn is_inbound(&self, name: &str) -> bool {
        self.inbound_clusters.iter().any(|p| matches(p, name))
    }

    /// Whether the cluster `name` is the proxy's own.
    pub fn owns_cluster(&self, name: &str) -> bool {
        self.own_clusters.iter().any(|p| matches(p, name))
    }
}

impl Default for Preset {
    fn default() -> Preset {
        ISTIO
    }
}

/// The preset named `name`.
pub fn find(name: &str) -> Option<Preset> {
    PRESETS.iter().find(|p| p.name == name).copied()
}
