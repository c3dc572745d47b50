//! `hold`'s configuration: its flags and environment made into the wait's rules and the readers'
//! settings, for an app behind a sidecar, in Istio's ambient mode or without a mesh (`Holding`).
//! It reads the system only to tell where probes come from: the pod's route tables, for
//! `--probes-from gateway` and for `--preset none` without that flag.

use crate::cli::{ENV_NODE_IPS, HoldArgs};
use crate::config::{
    ArrivalRule, ConfigWarning, DEFAULT_INTERVAL, Env, Filter, Hold, Holding, HookConfig, Mode,
    Plan, Rules, SourceConfig, log_format, mapped, parse_admin, parse_duration, ports, positive,
    some_ports,
};
use crate::count::Unit;
use crate::error::UsageError;
use crate::lists::Names;
use crate::preset::{self, OUTBOUND_CAPTURE, PRESETS};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

/// `hold`'s `--min`: outlasts a push to the proxies that comes within a second or two
/// (BENCHMARKS §10).
const DEFAULT_HOLD_MIN: Duration = Duration::from_secs(3);
/// `hold`'s least quiet time: one read at the default interval, so that a busy pod ends within a
/// second of its last request; sparser arrivals ask for more (hold/quiet.rs, `Rate`).
const DEFAULT_QUIET: Duration = Duration::from_millis(500);
/// `hold`'s `--deadline`: leaves the app 10 s of the default 30 s grace period.
const DEFAULT_HOLD_DEADLINE: Duration = Duration::from_secs(20);
/// `hold`'s `--propagation`: the `sleep 15` it replaces.
const DEFAULT_PROPAGATION: Duration = Duration::from_secs(15);

/// `hold`: what arrives at the app. Behind a sidecar, the socket table at every read and Envoy's
/// /clusters at its own pace (Istio's stats have no counter per app); with `ambient` or `none`,
/// where no Envoy is in the pod, the socket table alone (`arrivals`). The wait ends by
/// `Plan::Hold`'s rule.
pub fn hold_config(a: &HoldArgs, env: &Env<'_>) -> Result<HookConfig, UsageError> {
    let holding = Holding::of(a.preset.as_deref().unwrap_or("istio"))?;
    let (preset, own) = match holding {
        Holding::Sidecar(p) => (p, p.ignore_ports),
        // No Envoy in the pod: its admin address, checked when given, is never asked.
        Holding::Ambient => (preset::ISTIO, AMBIENT_OWN),
        Holding::NoMesh => (preset::ISTIO, ""),
    };
    let (admin, admin_warning) = parse_admin(a.admin.as_deref().unwrap_or(preset.admin))?;
    let mut warnings: Vec<ConfigWarning> = admin_warning.into_iter().collect();
    let ignore = ports("--ignore-ports", a.ignore_ports.as_deref().unwrap_or(own))?;
    let probes = probes(a, holding, env, &mut warnings)?;
    let sidecar = matches!(holding, Holding::Sidecar(_));
    let rule = ArrivalRule {
        ports: Filter {
            ignore: if sidecar { ignore.clone().with(OUTBOUND_CAPTURE) } else { ignore.clone() },
            only: a.ports.as_deref().map(|v| some_ports("--ports", v)).transpose()?,
        },
        probes,
        probe_periods: probe_periods("--probe-periods", a.probe_periods.as_deref())?,
        liveness: probe_periods("--liveness-periods", a.liveness_periods.as_deref())?
            .unwrap_or_default(),
        passive_opens: !sidecar,
        proxy: if holding == Holding::Ambient { ZTUNNEL.to_vec() } else { Vec::new() },
        outside_only: holding != Holding::Ambient,
    };
    let mut counting = SourceConfig {
        preset,
        admin,
        mode: if sidecar { Mode::Stats } else { Mode::Proc },
        unit: Unit::Requests,
        filter: Filter { ignore, only: None },
        ignore_clusters: Names::default(),
        proc_net: None,
        warnings,
    };
    let log_format = log_format(a.log_format.as_deref(), env, &mut counting.warnings)?;
    Ok(HookConfig {
        counting,
        before: Vec::new(),
        rules: hold_rules(a, holding, rule)?,
        log_file: a.log_file.as_ref().map(PathBuf::from),
        log_format,
        verbose: a.verbose,
    })
}

/// Where the kubelet's probes come from: `--probes-from`, else without a mesh the pod's gateways
/// and the node's addresses; ambient mode's always.
fn probes(
    a: &HoldArgs,
    holding: Holding,
    env: &Env<'_>,
    warnings: &mut Vec<ConfigWarning>,
) -> Result<Vec<Ipv6Addr>, UsageError> {
    let names_node =
        a.probes_from.as_deref().is_some_and(|v| v.split(',').any(|i| i.trim() == "node"));
    let node = node_addresses(env, names_node, warnings);
    // A link-local gateway (Calico's and the AWS VPC CNI's 169.254.1.1, an IPv6 fe80::) is not
    // where the probes come from: the node's own address is, which only `ENV_NODE_IPS` tells.
    if holding == Holding::NoMesh && a.probes_from.is_none() && node.is_empty() {
        let gateway = default_gateways().into_iter().find(link_local);
        warnings.extend(gateway.map(|g| ConfigWarning::LinkLocalGateway(g.to_canonical())));
    }
    let mut probes = match (holding, &a.probes_from) {
        (_, Some(v)) => probe_sources(v, &node)?,
        (Holding::NoMesh, None) => probe_sources("gateway,node", &node)?,
        _ => Vec::new(),
    };
    if holding == Holding::Ambient {
        probes.extend(AMBIENT_PROBES.map(mapped));
    }
    Ok(probes)
}

/// `hold`'s wait: until no request arrived for the quiet time, at least `--min`, at most
/// `--deadline`.
fn hold_rules(a: &HoldArgs, holding: Holding, arrivals: ArrivalRule) -> Result<Rules, UsageError> {
    let deadline = positive("--deadline", &a.deadline, DEFAULT_HOLD_DEADLINE)?;
    let min_flag = a.min.as_deref().map(|v| parse_duration("--min", v)).transpose()?;
    let min = min_flag.unwrap_or(DEFAULT_HOLD_MIN.min(deadline));
    let within =
        |what: &str| format!("{what} the deadline ({})", humantime::format_duration(deadline));
    if let Some(v) = a.min.as_deref().filter(|_| min > deadline) {
        return Err(UsageError::new("--min", v, within("at most")));
    }
    let quiet = positive("--quiet", &a.quiet, DEFAULT_QUIET.min(deadline))?;
    if let Some(v) = a.quiet.as_deref().filter(|_| quiet >= deadline) {
        return Err(UsageError::new("--quiet", v, within("less than")));
    }
    Ok(Rules {
        min_drain: min,
        deadline,
        interval: positive("--interval", &a.interval, DEFAULT_INTERVAL)?,
        settle: quiet,
        plan: Plan::Hold(Box::new(Hold {
            holding,
            propagation: positive("--propagation", &a.propagation, DEFAULT_PROPAGATION)?
                .min(deadline),
            arrivals,
        })),
    })
}

const HOLD_PRESETS: &str = "a sidecar's preset, istio, consul or kuma, or ambient (Istio's ambient \
    mode) or none (no mesh): a gateway or waypoint has no app behind it to hold";

/// ztunnel's own ports in an ambient pod's namespace: its outbound capture and DNS
/// (istio/ztunnel `scripts/ztunnel-redirect-inpod.sh`); 15008 and 15006 carry arrivals.
const AMBIENT_OWN: &str = "15001,15053";

/// ztunnel's listeners in an ambient pod: the pod's calls out (15001), plaintext (15006) and
/// HBONE (15008) clients, DNS (15053) (istio/ztunnel `scripts/ztunnel-redirect-inpod.sh`).
const ZTUNNEL: [u16; 4] = [15001, 15006, 15008, 15053];

/// Where istio-cni sends the kubelet's probes from in ambient mode: it SNATs them, and every
/// other connection from the node, on the node (istio/istio `cni/pkg/iptables/iptables.go`,
/// `HostProbeSNATAddress`, `HostProbeV6SNATAddress`).
const AMBIENT_PROBES: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(169, 254, 7, 127)),
    IpAddr::V6(Ipv6Addr::new(0xfd16, 0x9254, 0x7127, 0x1337, 0xffff, 0xffff, 0xffff, 0xffff)),
];

/// `--probes-from`: IP addresses, `gateway` for the pod's default gateway and `node` for the
/// node's addresses (`node`).
fn probe_sources(value: &str, node: &[Ipv6Addr]) -> Result<Vec<Ipv6Addr>, UsageError> {
    let mut found = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match item {
            "gateway" => found.extend(default_gateways()),
            "node" => found.extend_from_slice(node),
            _ => match item.parse::<IpAddr>() {
                Ok(ip) => found.push(mapped(ip)),
                Err(_) => {
                    let expected =
                        "comma-separated IP addresses, gateway or node, like gateway,node,10.0.0.1";
                    let expected = format!("{expected} ('{item}' is not one)");
                    return Err(UsageError::new("--probes-from", value, expected));
                }
            },
        }
    }
    Ok(found)
}

/// The node's addresses, where the kubelet's probes come from without a mesh: `ENV_NODE_IPS`,
/// which the admission policy sets from the downward API's `status.hostIPs` (the kubelet expands
/// no `$(VAR)` in a hook's command, but runs it with the container's environment). A bad item is
/// a warning; so is the variable unset where `--probes-from` names `node`.
fn node_addresses(env: &Env<'_>, named: bool, warnings: &mut Vec<ConfigWarning>) -> Vec<Ipv6Addr> {
    let Some(value) = env(ENV_NODE_IPS) else {
        warnings.extend(named.then_some(ConfigWarning::NodeIpsUnset));
        return Vec::new();
    };
    let mut found = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match item.parse::<IpAddr>() {
            Ok(ip) => found.push(mapped(ip)),
            Err(_) => warnings
                .push(ConfigWarning::NodeIp { item: item.to_string(), value: value.clone() }),
        }
    }
    found
}

/// 169.254.0.0/16, or fe80::/10.
fn link_local(ip: &Ipv6Addr) -> bool {
    match ip.to_ipv4_mapped() {
        Some(v4) => v4.is_link_local(),
        None => ip.is_unicast_link_local(),
    }
}

/// `--probe-periods`, `--liveness-periods` (`name`), where given: comma-separated whole seconds,
/// as a probe's `periodSeconds` are (at least 1), or `none`.
fn probe_periods(
    name: &'static str,
    value: Option<&str>,
) -> Result<Option<Vec<Duration>>, UsageError> {
    let Some(value) = value else { return Ok(None) };
    if value.trim() == "none" {
        return Ok(Some(Vec::new()));
    }
    let expected = "comma-separated whole seconds from 1s, like 10s,5s, or none";
    let bad = || UsageError::new(name, value, expected);
    let period = |item: &str| {
        let d = parse_duration(name, item.trim()).map_err(|_| bad())?;
        let whole = d >= Duration::from_secs(1) && d.subsec_nanos() == 0;
        // humantime adds up "10s 1s": one period each.
        if whole && !item.trim().contains(char::is_whitespace) { Ok(d) } else { Err(bad()) }
    };
    value.split(',').map(period).collect::<Result<_, _>>().map(Some)
}

/// The pod's default gateways, which a bridge CNI's node reaches the pod from: where the
/// kubelet's probes come from. IPv4's from `/proc/net/route`, IPv6's from `/proc/net/ipv6_route`
/// (an IPv6-only or IPv6-primary pod has only the latter).
fn default_gateways() -> Vec<Ipv6Addr> {
    let read = |path| std::fs::read_to_string(path).unwrap_or_default();
    gateways(&read("/proc/net/route"), &read("/proc/net/ipv6_route"))
}

/// The default routes' gateways in the two tables' text: IPv4's `Iface Destination Gateway ...`
/// (hex, in the host's byte order), IPv6's `dest plen src plen next_hop ...` (hex, network order).
fn gateways(route: &str, ipv6_route: &str) -> Vec<Ipv6Addr> {
    let v4 = route.lines().skip(1).filter_map(|line| {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        let (destination, gateway) = (fields.get(1)?, fields.get(2)?);
        let gateway = u32::from_str_radix(gateway, 16).ok().filter(|g| *g != 0)?;
        let ip = Ipv4Addr::from(gateway.to_ne_bytes());
        (*destination == "00000000").then(|| ip.to_ipv6_mapped())
    });
    let v6 = ipv6_route.lines().filter_map(|line| {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        let (destination, length, hop) = (fields.first()?, fields.get(1)?, fields.get(4)?);
        let hop = u128::from_str_radix(hop, 16).ok().filter(|h| *h != 0)?;
        let default = destination.bytes().all(|b| b == b'0') && *length == "00";
        default.then(|| Ipv6Addr::from(hop))
    });
    let mut found: Vec<Ipv6Addr> = v4.chain(v6).collect();
    found.dedup();
    found
}

impl Holding {
    /// A sidecar's preset must name the app's clusters: a gateway's has none.
    fn of(name: &str) -> Result<Holding, UsageError> {
        match name {
            "ambient" => Ok(Holding::Ambient),
            "none" => Ok(Holding::NoMesh),
            _ => (PRESETS.into_iter())
                .find(|p| p.name == name && !p.inbound_clusters.is_empty())
                .map(Holding::Sidecar)
                .ok_or_else(|| UsageError::new("--preset", name, HOLD_PRESETS)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{no_env, said};

    #[test]
    fn holds_defaults_and_ambient_modes_rule() {
        let hold = |preset: &str, deadline: Option<&str>| {
            let a = HoldArgs {
                preset: Some(preset.into()),
                deadline: deadline.map(String::from),
                liveness_periods: Some("10s,30s".into()),
                ..HoldArgs::default()
            };
            hold_config(&a, &no_env).unwrap()
        };
        let c = hold("ambient", None);
        let secs = Duration::from_secs;
        let Plan::Hold(h) = c.rules.plan else { panic!() };
        let (propagation, rule) = (h.propagation, h.arrivals);
        assert_eq!((c.rules.min_drain, propagation), (secs(3), secs(15)));
        assert_eq!(c.rules.deadline, secs(20));
        let v6 = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff".parse().unwrap();
        assert_eq!(rule.probes, [mapped("169.254.7.127".parse().unwrap()), v6]);
        assert_eq!(rule.proxy, [15001, 15006, 15008, 15053], "ztunnel's listeners");
        assert!(rule.passive_opens && !rule.outside_only);
        assert_eq!(rule.liveness, [secs(10), secs(30)]);
        // The propagation within a shorter deadline; the min cut to it as before.
        let c = hold("none", Some("8s"));
        let Plan::Hold(h) = c.rules.plan else { panic!() };
        let (propagation, rule) = (h.propagation, h.arrivals);
        assert_eq!((propagation, c.rules.min_drain), (secs(8), secs(3)));
        // Without a mesh the pod's own memory (TIME_WAIT, PassiveOpens), not a sidecar's.
        assert!(rule.proxy.is_empty() && rule.passive_opens && rule.outside_only);
    }

    #[test]
    fn without_a_mesh_the_probes_come_from_the_nodes_addresses_in_the_environment() {
        let hold = |probes_from: Option<&str>, env: Option<&str>| {
            let a = HoldArgs {
                preset: Some("none".into()),
                probes_from: probes_from.map(String::from),
                probe_periods: Some("10s,1s".into()),
                ..HoldArgs::default()
            };
            let c =
                hold_config(&a, &|k| (k == ENV_NODE_IPS).then(|| env.map(String::from))?).unwrap();
            let Plan::Hold(hold) = c.rules.plan else { panic!("{:?}", c.rules.plan) };
            (hold.arrivals, said(&c.counting.warnings))
        };
        let mapped = |ip: &str| mapped(ip.parse().unwrap());
        let (rule, warnings) = hold(Some("node"), Some("10.0.0.7, fd00::7,node-1"));
        assert_eq!(rule.probes, [mapped("10.0.0.7"), mapped("fd00::7")]);
        assert_eq!(
            warnings,
            [
                "ignoring \"node-1\" in ENVOY_DRAIN_NODE_IPS=\"10.0.0.7, fd00::7,node-1\": expected IP addresses, like 10.0.0.1"
            ]
        );
        assert_eq!(rule.probe_periods, Some(vec![Duration::from_secs(10), Duration::from_secs(1)]));
        // Named but unset: said; the default's `node` without it: nothing to say.
        let (rule, warnings) = hold(Some("node,10.0.0.9"), None);
        assert_eq!(rule.probes, [mapped("10.0.0.9")]);
        assert!(warnings[0].starts_with("ENVOY_DRAIN_NODE_IPS is not set"), "{warnings:?}");
        let (rule, warnings) = hold(None, Some("10.0.0.7"));
        assert!(rule.probes.contains(&mapped("10.0.0.7")) && warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn the_default_gateways_are_read_from_both_route_tables() {
        // As the kernel writes them: 10.90.0.3 via eth0 (host byte order, little-endian here),
        // and fd98::1 for ::/0.
        let route = "Iface\tDestination\tGateway\tFlags\n\
                     eth0\t00000000\t03005A0A\t0003\n\
                     eth0\t00005A0A\t00000000\t0001\n";
        let ipv6_route = "fd980000000000000000000000000000 40 00000000000000000000000000000000 00 \
                          00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0\n\
                          00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
                          fd980000000000000000000000000001 00000400 00000001 00000000 00000003 eth0\n";
        let found: Vec<IpAddr> =
            gateways(route, ipv6_route).into_iter().map(|g| g.to_canonical()).collect();
        assert_eq!(found, ["10.90.0.3".parse::<IpAddr>().unwrap(), "fd98::1".parse().unwrap()]);
        // An IPv6-only pod.
        assert_eq!(gateways("", ipv6_route).len(), 1);
        // Calico's gateways, which the probes do not come from.
        let link = |ip: &str| link_local(&mapped(ip.parse().unwrap()));
        assert!(link("169.254.1.1") && link("fe80::ecee:eeff:feee:eeee"));
        assert!(!link("10.90.0.3") && !link("fd98::1"));
    }
}
