//! The checked configuration of both hooks: which hook and what is its own alone (`Plan`,
//! `hold`'s `Hold`), the wait's rules, the readers' settings, and the parsers of the flags both
//! take (`run`'s own are in run/config.rs, `hold`'s in hold/config.rs). It reads the system only where a flag names something there: the
//! sockets an `--admin unix:` pattern matches (the one that takes a connection).

use crate::cli::ENV_LOG_FORMAT;
use crate::count::Unit;
use crate::drain::Request;
use crate::error::UsageError;
use crate::lists::{self, Names, PortSet};
use crate::log::Format;
use crate::preset::Preset;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(crate) const DEFAULT_AGENT: &str = "127.0.0.1:15020";
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_millis(500);
/// Istio's min-drain and its variable, which `run` reads and `ConfigWarning::MinDrainEnv` names.
pub(crate) const DEFAULT_MIN_DRAIN: Duration = Duration::from_secs(5);
pub(crate) const ENV_MIN_DRAIN: &str = "MINIMUM_DRAIN_DURATION";

/// An environment variable's value by name: `std::env::var`, or a test's.
pub(crate) type Env<'a> = dyn Fn(&str) -> Option<String> + 'a;

/// Where an admin API listens: a TCP address, or a Unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Address {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Tcp(addr) => write!(f, "{addr}"),
            Address::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Auto,
    Stats,
    Proc,
}

/// A setting ignored or corrected, or one that `hold` lacks: said at the start (text.rs words it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ConfigWarning {
    /// `--admin`'s value matches these sockets, and not one alone takes a connection.
    AdminAmbiguous { value: String, found: Vec<String>, listening: usize },
    /// The pod's deadline annotation is past `--deadline`, which is used.
    DeadlinePastFlag { annotated: Duration, flag: Duration },
    /// Istio's MINIMUM_DRAIN_DURATION is no Go duration: Istio's default is used.
    MinDrainEnv(String),
    /// What sets the min-drain, in words, is past the deadline, which is used.
    MinDrainPastDeadline { what: String, deadline: Duration },
    /// `--probes-from` names `node`, and ENVOY_DRAIN_NODE_IPS is not set.
    NodeIpsUnset,
    /// An item of ENVOY_DRAIN_NODE_IPS that is no address, and the variable's value.
    NodeIp { item: String, value: String },
    /// The pod's gateway is link-local and no variable names the node, whose address the probes
    /// come from.
    LinkLocalGateway(IpAddr),
    /// A `--pod-annotation` that is not NAME=VALUE.
    PodAnnotation(String),
    /// An annotation's value, ignored, and what was expected.
    Annotation { name: String, value: String, expected: String },
    /// ENVOY_DRAIN_LOG_FORMAT's value, which is neither text nor json.
    LogFormatEnv(String),
}

/// What both commands need to count.
#[derive(Debug, Clone)]
pub(crate) struct SourceConfig {
    /// The proxy whose defaults apply.
    pub(crate) preset: Preset,
    pub(crate) admin: Address,
    pub(crate) mode: Mode,
    pub(crate) unit: Unit,
    pub(crate) filter: Filter,
    pub(crate) ignore_clusters: Names,
    /// `--proc-net`: read the text tables there instead of asking the kernel over netlink.
    pub(crate) proc_net: Option<PathBuf>,
    /// What is worth a warning but not an error: an ambiguous `--admin`, a bad annotation, ...
    pub(crate) warnings: Vec<ConfigWarning>,
}

/// `hold`'s arrivals in the socket table: what counts (source/arrivals.rs).
#[derive(Debug, Clone, Default)]
pub struct ArrivalRule {
    /// The ports whose connections count (`only`; `None`: every port a listener of the pod
    /// serves), and those whose never do (`ignore`: the proxy's own, its outbound capture).
    pub(crate) ports: Filter,
    /// Clients whose connections never count: the kubelet's probes.
    pub(crate) probes: Vec<Ipv6Addr>,
    /// The periods of the kubelet's readiness probes that connect (`--probe-periods`): no more
    /// connections from `probes`, nor that left no socket, are theirs than they may have made;
    /// `None`: every one from `probes`, none that left no socket.
    pub(crate) probe_periods: Option<Vec<Duration>>,
    /// Also count the connections the namespace accepted that left no socket to see (a client
    /// that closed first, outside the pod, or a reset), from its `PassiveOpens`.
    pub(crate) passive_opens: bool,
    /// The periods of the probes the kubelet stops before the preStop (`--liveness-periods`):
    /// none during the hold, but over the pod's life among its accepted connections.
    pub(crate) liveness: Vec<Duration>,
    /// The mesh's own listeners in the pod (ambient mode: ztunnel's), whose connections never
    /// count: a client's reaches the app over a hop in the pod, which does; the app's calls out
    /// are its own.
    pub(crate) proxy: Vec<u16>,
    /// A sidecar's: connections whose client is in the pod never count (the proxy's own hop to
    /// the app, the app's calls to the pod's other containers): a client's own connection to the
    /// proxy shows each of its requests.
    pub(crate) outside_only: bool,
}

/// Which sockets may count: none on an ignored port (either end); with `--ports`, only those.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub ignore: PortSet,
    pub only: Option<PortSet>,
}

impl Filter {
    /// Whether what a listener on `port` serves counts.
    pub(crate) fn counts(&self, port: u16) -> bool {
        !self.ignore.contains(port) && self.only.as_ref().is_none_or(|p| p.contains(port))
    }
}

/// The rules of the wait; durations count from the start of the run, the min-drain from the drain.
#[derive(Debug, Clone)]
pub struct Rules {
    pub min_drain: Duration,
    /// Bounds the whole run, counted from the process's start: `hook::command` gives the drain
    /// and quit requests the time left; `hook::wait` stops looking at it and gives each look the
    /// time left, which `Sources::look` turns into one instant for every source: each admin
    /// request (a stats request at most its own timeout, a second to begin with; /clusters all of
    /// it), the socket table's dump or read and its search for Envoy's process (given at least
    /// `PROC_GRACE`). After it, only the summary may wait, at most `log::SUMMARY_WAIT`, for room
    /// in a full pipe.
    pub deadline: Duration,
    pub interval: Duration,
    /// How long the wait's end must have held (`--settle`; `hold`'s `--quiet`).
    pub settle: Duration,
    /// Which hook, and so what ends its wait.
    pub plan: Plan,
}

/// Which hook this is, decided once from the command, with what is its own alone: what ends its
/// wait once the min-drain is over, and for `hold` what tells arrivals. Every "is this hold?"
/// asks it.
#[derive(Debug, Clone)]
pub enum Plan {
    /// `run`: the count at or below `--exit-at`, at counts that saw no request arrive; with
    /// `--then-quit`, once it is and the app has exited, the proxy is stopped through Istio's
    /// `agent` (which `--drain agent` asks too).
    Run { exit_at: u64, then_quit: bool, agent: SocketAddr },
    /// `hold`: no request arriving, whatever is still in flight.
    Hold(Box<Hold>),
}

/// `hold`'s own: the app's pod, when the mesh has stopped sending to it, and what tells arrivals
/// in the socket table (in /clusters, the app's clusters do).
#[derive(Debug, Clone)]
pub struct Hold {
    pub holding: Holding,
    /// `--propagation`: by then the mesh has stopped sending to the pod.
    pub propagation: Duration,
    pub arrivals: ArrivalRule,
}

#[derive(Debug, Clone)]
pub struct HookConfig {
    pub(crate) counting: SourceConfig,
    /// What is sent before the wait: `--fail-healthcheck`, then `--drain`.
    pub(crate) before: Vec<Request>,
    pub rules: Rules,
    pub(crate) log_file: Option<PathBuf>,
    pub(crate) log_format: Format,
    pub(crate) verbose: bool,
}

pub(crate) const DURATION: &str = "a duration like 500ms, 25s or 1m30s";

/// `--admin` and `--agent`: an IP literal (or `localhost`) and a port, never a name to look up.
pub fn parse_addr(name: &'static str, value: &str) -> Result<SocketAddr, UsageError> {
    let bad = || {
        UsageError::new(
            name,
            value,
            "host:port with an IP address or localhost, like 127.0.0.1:15000, [::1]:15000 or http://localhost:15000",
        )
    };
    let rest = value.strip_prefix("http://").unwrap_or(value);
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if let Ok(addr) = rest.parse::<SocketAddr>() {
        return if addr.port() == 0 { Err(bad()) } else { Ok(addr) };
    }
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(bad)?;
    if host.eq_ignore_ascii_case("localhost") {
        Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))
    } else {
        Err(bad())
    }
}

/// `--admin`: an address as `parse_addr` takes it, or `unix:PATH`, where a `*` (Kuma's
/// `/tmp/kuma-dp-*/kuma-envoy-admin.sock`) picks the one socket that matches, or of several the one
/// that takes a connection; else the path as given (a warning when several listen).
pub(crate) fn parse_admin(value: &str) -> Result<(Address, Option<ConfigWarning>), UsageError> {
    let Some(path) = value.strip_prefix("unix:") else {
        return parse_addr("--admin", value).map(|a| (Address::Tcp(a), None));
    };
    if path.is_empty() {
        return Err(UsageError::new(
            "--admin",
            value,
            "unix: and the path of the admin API's socket, like unix:/admin/admin.sock",
        ));
    }
    if !path.contains('*') {
        return Ok((Address::Unix(PathBuf::from(path)), None));
    }
    // Only sockets, each once (`*/..` reaches one by many names); of several, the one that takes
    // a connection: a proxy restarted in an emptyDir leaves its old socket beside the new one.
    let mut found: Vec<PathBuf> = matches(Path::new(path))
        .into_iter()
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket()))
        .filter_map(|p| p.canonicalize().ok())
        .collect();
    found.sort();
    found.dedup();
    if found.len() > 1 {
        let listening: Vec<&PathBuf> =
            found.iter().filter(|p| UnixStream::connect(p).is_ok()).collect();
        if let [one] = listening.as_slice() {
            return Ok((Address::Unix(one.to_path_buf()), None));
        }
        let warning = ConfigWarning::AdminAmbiguous {
            value: value.to_string(),
            found: found.iter().map(|p| p.display().to_string()).collect(),
            listening: listening.len(),
        };
        return Ok((Address::Unix(PathBuf::from(path)), Some(warning)));
    }
    Ok((Address::Unix(found.pop().unwrap_or_else(|| PathBuf::from(path))), None))
}

/// The files that `pattern` names, a `*` matching any run of characters in a name (`lists::matches`).
fn matches(pattern: &Path) -> Vec<PathBuf> {
    let mut found = vec![PathBuf::new()];
    for part in pattern.components() {
        let name = part.as_os_str().to_string_lossy();
        if !name.contains('*') {
            for p in &mut found {
                p.push(part);
            }
            continue;
        }
        let dirs = std::mem::take(&mut found);
        for dir in dirs {
            let listed =
                std::fs::read_dir(if dir.as_os_str().is_empty() { Path::new(".") } else { &dir });
            for entry in listed.into_iter().flatten().flatten() {
                if lists::matches(&name, &entry.file_name().to_string_lossy()) {
                    found.push(dir.join(entry.file_name()));
                }
            }
        }
    }
    found.retain(|p| p.exists());
    found
}

pub fn parse_duration(name: &'static str, value: &str) -> Result<Duration, UsageError> {
    humantime::parse_duration(value.trim()).map_err(|_| UsageError::new(name, value, DURATION))
}

pub(crate) fn ports(name: &'static str, value: &str) -> Result<PortSet, UsageError> {
    PortSet::parse(value).map_err(|item| {
        UsageError::new(
            name,
            value,
            format!(
                "comma-separated ports from 1 to 65535, like 15006,15001 ('{}' is not one)",
                item.escape_debug()
            ),
        )
    })
}

pub(crate) fn some_ports(name: &'static str, value: &str) -> Result<PortSet, UsageError> {
    let none = || UsageError::new(name, value, "at least one port, like 15006,15001");
    Some(ports(name, value)?).filter(|set| !set.is_empty()).ok_or_else(none)
}

/// `--log-format`, else `ENV_LOG_FORMAT` (a bad value there is a warning: the hook still runs).
pub(crate) fn log_format(
    flag: Option<&str>,
    env: &Env<'_>,
    warnings: &mut Vec<ConfigWarning>,
) -> Result<Format, UsageError> {
    let parse = |v: &str| match v.trim().to_ascii_lowercase().as_str() {
        "text" => Some(Format::Text),
        "json" => Some(Format::Json),
        _ => None,
    };
    if let Some(v) = flag {
        return parse(v).ok_or_else(|| UsageError::new("--log-format", v, "text or json"));
    }
    let set = env(ENV_LOG_FORMAT).filter(|v| !v.trim().is_empty());
    let format = set.as_deref().map(|v| parse(v).ok_or(v));
    warnings.extend(format.and_then(Result::err).map(|v| ConfigWarning::LogFormatEnv(v.into())));
    Ok(format.and_then(Result::ok).unwrap_or(Format::Text))
}

/// A duration flag that must be above zero, or its default.
pub(crate) fn positive(
    name: &'static str,
    value: &Option<String>,
    default: Duration,
) -> Result<Duration, UsageError> {
    let Some(v) = value else { return Ok(default) };
    let above_zero = format!("a duration above zero, like {}", humantime::format_duration(default));
    let d = parse_duration(name, v)?;
    if d.is_zero() { Err(UsageError::new(name, v, above_zero)) } else { Ok(d) }
}

/// As the socket table keeps addresses: IPv4 as IPv4-mapped, so that both ends of a connection
/// compare equal whichever table shows them.
pub(crate) fn mapped(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// What `hold` holds for, chosen once from `--preset`: the app behind a sidecar of that preset,
/// whose arrivals /clusters and the socket table tell, or in a pod without one (Istio's ambient
/// mode, or no mesh), whose the socket table alone tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holding {
    Sidecar(Preset),
    Ambient,
    NoMesh,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `run`'s plan, its agent Istio's.
    pub(crate) const fn run_plan(exit_at: u64, then_quit: bool) -> Plan {
        let agent = SocketAddr::V4(std::net::SocketAddrV4::new(Ipv4Addr::LOCALHOST, 15020));
        Plan::Run { exit_at, then_quit, agent }
    }

    /// A hold without a mesh, its arrivals' rule the default: for the wait's and the words' tests.
    pub(crate) fn no_mesh(propagation: Duration) -> Plan {
        let arrivals = ArrivalRule::default();
        Plan::Hold(Box::new(Hold { holding: Holding::NoMesh, propagation, arrivals }))
    }

    /// The warnings as the log says them.
    pub(crate) fn said(warnings: &[ConfigWarning]) -> Vec<String> {
        warnings.iter().map(ConfigWarning::to_string).collect()
    }

    /// An environment without a variable.
    pub(crate) fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn an_admin_api_on_a_unix_socket_is_its_path_and_a_pattern_must_match_one_socket() {
        assert_eq!(
            parse_admin("unix:/admin/admin.sock"),
            Ok((Address::Unix(PathBuf::from("/admin/admin.sock")), None))
        );
        assert_eq!(
            parse_admin("127.0.0.1:9901"),
            Ok((Address::Tcp("127.0.0.1:9901".parse().unwrap()), None))
        );
        let tmp = std::env::temp_dir().join(format!("envoy-drain-glob-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let path = |dir: &str| tmp.join(dir).join("kuma-envoy-admin.sock");
        // A kuma-dp's socket: listening, or left behind by one that was killed.
        let sock = |dir: &str| {
            std::fs::create_dir_all(tmp.join(dir)).unwrap();
            std::os::unix::net::UnixListener::bind(path(dir)).unwrap()
        };
        let pattern = format!("unix:{}/kuma-dp-*/kuma-envoy-admin.sock", tmp.display());
        let as_given = Address::Unix(tmp.join("kuma-dp-*/kuma-envoy-admin.sock"));
        assert_eq!(
            parse_admin(&pattern),
            Ok((as_given.clone(), None)),
            "no match: the path as given, which requests then fail to open"
        );
        let _live = sock("kuma-dp-1234");
        drop(sock("other-1"));
        // Neither a file nor a directory is a socket.
        std::fs::create_dir_all(tmp.join("kuma-dp-file")).unwrap();
        std::fs::write(path("kuma-dp-file"), "").unwrap();
        std::fs::create_dir_all(path("kuma-dp-dir")).unwrap();
        let one = Address::Unix(path("kuma-dp-1234"));
        assert_eq!(parse_admin(&pattern), Ok((one.clone(), None)));
        // One name reached twice is one socket.
        let twice =
            format!("unix:{}/kuma-dp-*/../kuma-dp-1234/kuma-envoy-admin.sock", tmp.display());
        assert_eq!(parse_admin(&twice), Ok((one.clone(), None)));
        // An old kuma-dp's socket left behind: the live one is asked.
        drop(sock("kuma-dp-99"));
        assert_eq!(parse_admin(&pattern), Ok((one, None)));
        // Two that listen cannot be told apart: a warning, and the wait goes on without them.
        let _other = sock("kuma-dp-7");
        let (address, warning) = parse_admin(&pattern).unwrap();
        std::fs::remove_dir_all(&tmp).unwrap();
        assert_eq!(address, as_given);
        assert_eq!(
            warning.as_ref().map(ConfigWarning::to_string).as_deref(),
            Some(
                format!(
                    "--admin {pattern}: 3 sockets match ({}, {}, {}) and more than one of them \
                     takes a connection, so none is asked; counting without the admin API",
                    path("kuma-dp-1234").display(),
                    path("kuma-dp-7").display(),
                    path("kuma-dp-99").display(),
                )
                .as_str()
            )
        );
    }
}
