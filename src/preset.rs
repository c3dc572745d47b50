//! `--preset`: the defaults that fit each Envoy-based proxy: where its admin API listens, which of
//! its ports and HTTP connection managers are its own (never counted), which listeners its drain
//! covers, and whether Istio's agent is there to drain and stop the proxy. Every one is a default
//! that an explicit flag overrides; `--fail-healthcheck` stays a choice (a switch no preset could
//! take back). The facts, read from each proxy's source, are in
//! docs/running.md ("Other Envoy-based proxies").

use crate::config::Drain;
use crate::lists::ISTIO_INFRA_PORTS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    pub name: &'static str,
    /// `--admin`'s default, as the flag takes it.
    pub admin: &'static str,
    /// `--ignore-ports`' default: the proxy's own listeners and its companions' ports.
    pub ignore_ports: &'static str,
    /// The stat prefixes of the proxy's own HTTP connection managers (its admin API, health and
    /// metrics listeners), whose requests never count.
    pub own_hcms: &'static [&'static str],
    /// `--drain`'s default: a sidecar drains its inbound listeners; a gateway's listeners carry
    /// no traffic direction, so `inboundonly` would drain none of them.
    pub drain: Drain,
    /// Whether Istio's agent is there, for `--drain agent` and `--then-quit`.
    pub agent: bool,
}

/// Istio's sidecars and gateways: today's behaviour, the default. Its own HTTP connection
/// managers are the admin API's and those of its health (15021) and Prometheus (15090) listeners,
/// whose stat prefixes are "agent" and "stats" in Istio's bootstrap template (istio/istio,
/// tools/packaging/common/envoy_bootstrap.json).
pub const ISTIO: Preset = Preset {
    name: "istio",
    admin: "127.0.0.1:15000",
    ignore_ports: ISTIO_INFRA_PORTS,
    own_hcms: &["admin", "agent", "stats"],
    drain: Drain::Inbound,
    agent: true,
};

pub const PRESETS: [Preset; 5] = [
    ISTIO,
    Preset {
        name: "consul",
        admin: "127.0.0.1:19000",
        ignore_ports: "19000,20100,20101,20200,20600,21000",
        own_hcms: &["admin", "envoy_prometheus_metrics", "envoy_ready"],
        drain: Drain::Inbound,
        agent: false,
    },
    Preset {
        name: "kuma",
        admin: "unix:/tmp/kuma-dp-*/kuma-envoy-admin.sock",
        ignore_ports: "9901,9902,15053",
        own_hcms: &["admin"],
        drain: Drain::Inbound,
        agent: false,
    },
    Preset {
        name: "envoy-gateway",
        admin: "127.0.0.1:19000",
        ignore_ports: "19000,19001,19002,19003",
        own_hcms: &["admin", "eg-stats-http", "eg-ready-http"],
        drain: Drain::All,
        agent: false,
    },
    Preset {
        name: "contour",
        admin: "unix:/admin/admin.sock",
        ignore_ports: "8002,9001",
        own_hcms: &["admin", "envoy-admin", "stats", "health", "stats-health"],
        drain: Drain::All,
        agent: false,
    },
];

/// The preset named `name`.
pub fn find(name: &str) -> Option<Preset> {
    PRESETS.iter().find(|p| p.name == name).copied()
}

/// `istio, consul, kuma, envoy-gateway or contour`.
pub fn names() -> String {
    let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
    match names.split_last() {
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}
