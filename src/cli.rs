//! The command line as typed, and the kill switch that wins over it. Values stay strings; the
//! configurations (config.rs, run/config.rs, hold/config.rs) check them so that every error names
//! the flag, the value and what was expected.

use crate::outcome::EXIT_USAGE;
use argh::FromArgs;
use std::ffi::OsString;
use std::io::Write;

/// The kill switch in the container's environment: set and non-empty, `run` and `hold` do nothing.
const ENV_DISABLED: &str = "ENVOY_DRAIN_DISABLED";
/// The node's addresses, comma-separated, where the kubelet's probes come from without a mesh:
/// the admission policy sets it from the downward API's `status.hostIPs`.
pub(crate) const ENV_NODE_IPS: &str = "ENVOY_DRAIN_NODE_IPS";
/// `--log-format`'s value when the flag is not given: the template and the policies can set it
/// for every hook of a pod.
pub(crate) const ENV_LOG_FORMAT: &str = "ENVOY_DRAIN_LOG_FORMAT";
/// A pod's settings: its annotations under this prefix, which the template passes as flags.
pub(crate) const ANNOTATION_PREFIX: &str = "envoy-drain.io/";
/// The one annotation the template acts on itself: `true` leaves the pod to Istio's own preStop.
const ANNOTATION_DISABLED: &str = "envoy-drain.io/disabled";

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    Run(RunArgs),
    Hold(HoldArgs),
    Status(StatusArgs),
    Install(InstallArgs),
    /// `run` or `hold` with a kill switch set (the variable or the pod's annotation, as `NAME=VALUE`):
    /// whatever the other flags say.
    Disabled(String),
    /// Help or the version, for stdout.
    Print(String),
    /// A usage error, for stderr.
    Usage(String),
}

/// Reads the arguments (the program name first) and the kill switch from `env`.
pub fn parse(args: &[OsString], env: &dyn Fn(&str) -> Option<OsString>) -> Parsed {
    let args: Vec<String> = match args.iter().map(|a| a.clone().into_string()).collect() {
        Ok(a) => a,
        Err(bad) => return Parsed::Usage(format!("argument {bad:?} is not UTF-8")),
    };
    let strs = split_equals(&args);
    // The kill switch wins over everything, bad flags included.
    if matches!(strs.get(1), Some(&"run" | &"hold"))
        && let Some(v) = env(ENV_DISABLED).filter(|v| !v.is_empty())
    {
        return Parsed::Disabled(format!("{ENV_DISABLED}={}", v.to_string_lossy()));
    }
    let cli = match Cli::from_args(&["envoy-drain"], strs.get(1..).unwrap_or_default()) {
        Ok(cli) => cli,
        Err(early) if early.status.is_ok() => return Parsed::Print(early.output),
        Err(early) => return Parsed::Usage(early.output.trim_end().to_string()),
    };
    if cli.version {
        return Parsed::Print(format!("envoy-drain {}\n", env!("CARGO_PKG_VERSION")));
    }
    match cli.command {
        // `envoy-drain.io/disabled=true`: the pod's own kill switch.
        Some(Command::Run(a)) => match a.pod_annotation.iter().find(|p| {
            p.split_once('=').is_some_and(|(n, v)| n == ANNOTATION_DISABLED && v.trim() == "true")
        }) {
            Some(p) => Parsed::Disabled(format!("annotation {}", p.trim())),
            None => Parsed::Run(a),
        },
        Some(Command::Hold(a)) => Parsed::Hold(a),
        Some(Command::Status(a)) => Parsed::Status(a),
        Some(Command::Install(a)) => Parsed::Install(a),
        None => Parsed::Usage(
            "no command given: expected run, hold, status or install (see envoy-drain --help)"
                .to_string(),
        ),
    }
}

/// Every `--flag=value` split into `--flag value`, up to a `--`: argh takes only the second, and
/// manifests are written with the first.
fn split_equals(args: &[String]) -> Vec<&str> {
    let mut out = Vec::with_capacity(args.len());
    let mut flags = true;
    for a in args {
        flags &= a != "--";
        match a.split_once('=') {
            Some((flag, value)) if flags && flag.len() > 2 && flag.starts_with("--") => {
                out.extend([flag, value]);
            }
            _ => out.push(a.as_str()),
        }
    }
    out
}

/// Prints a usage error as one line and gives its exit code.
pub fn usage_error(message: &str) -> i32 {
    let _ = writeln!(std::io::stderr(), "envoy-drain: {message}");
    EXIT_USAGE
}

/// Keeps an Envoy sidecar alive until its last connection is done: the preStop hook of istio-proxy.
#[derive(FromArgs, Debug, PartialEq)]
#[argh(note = "Exit codes:
  0    the count reached the threshold, or the app has exited; hold: no
       request arrived for the quiet time, or past the propagation only
       on kept-alive connections (or a kill switch is set:
       ENVOY_DRAIN_DISABLED, envoy-drain.io/disabled=true)
  1    the deadline passed with connections still open; hold: with new
       connections still arriving, or arrivals unknown
  2    usage error: a flag has a bad value (never a --pod-annotation or an
       environment variable: a bad one is a warning)
  3    nothing could be counted at any point of the run, or a waypoint's
       admin address answers but is not Envoy (agentgateway): at once
  130  interrupted by SIGINT (143: SIGTERM; 128 + n for signal n: SIGHUP,
       SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, unless ignored from the start as
       under nohup); the summary line is printed first

Environment:
  ENVOY_DRAIN_DISABLED    set and non-empty: `run` and `hold` log that and exit 0
  MINIMUM_DRAIN_DURATION  the min-drain when --min-drain is not given (Istio's variable,
                          read as Go reads it: 5s, .5s, 1m30s)
  ENVOY_DRAIN_NODE_IPS    hold: the node's addresses, comma-separated, for node in
                          --probes-from (the admission policy sets it from status.hostIPs)")]
struct Cli {
    /// print the version and exit
    #[argh(switch)]
    pub(crate) version: bool,

    #[argh(subcommand)]
    pub(crate) command: Option<Command>,
}

#[derive(FromArgs, Debug, PartialEq)]
#[argh(subcommand)]
enum Command {
    Run(RunArgs),
    Hold(HoldArgs),
    Status(StatusArgs),
    Install(InstallArgs),
}

/// Drain Envoy, then wait until its connections close or the deadline passes.
#[derive(FromArgs, Debug, PartialEq, Default)]
#[argh(subcommand, name = "run")]
pub struct RunArgs {
    /// the Envoy-based proxy, whose defaults and own listeners, HTTP managers and clusters
    /// (never counted) apply: istio, waypoint (Istio ambient's), consul, kuma, envoy-gateway or
    /// contour (default: istio)
    #[argh(option)]
    pub preset: Option<String>,

    /// the address of Envoy's admin API, whose listener also tells which process is Envoy:
    /// host:port, [::1]:port, http://host:port or unix:PATH, where a * in PATH picks the one
    /// socket that takes a connection (default: the preset's, 127.0.0.1:15000 for istio)
    #[argh(option)]
    pub admin: Option<String>,

    /// which listeners to drain: inbound, all or none; or agent: ask Istio's agent, as Istio's
    /// native-sidecar preStop does, which drains (a sidecar's inbound, a waypoint's all) and later
    /// stops the proxy at once on SIGTERM (default: inbound; all for the waypoint, envoy-gateway
    /// and contour presets)
    #[argh(option)]
    pub drain: Option<String>,

    /// before the drain, fail Envoy's health checks (POST /healthcheck/fail): its /ready and
    /// health-check filter answer 503, so a load balancer in front of a gateway stops sending
    #[argh(switch)]
    pub fail_healthcheck: bool,

    /// what to count: auto (stats, else the kernel's socket table; status shows both), stats or
    /// proc (default: auto)
    #[argh(option)]
    pub source: Option<String>,

    /// connections, or requests: requests in flight (HTTP requests, and TCP streams), so idle
    /// keep-alive connections do not hold the wait; from Envoy's stats, else its /clusters (a
    /// waypoint's: /clusters), else connections; status shows both (default: connections;
    /// requests for waypoint)
    #[argh(option)]
    pub count: Option<String>,

    /// never exit sooner after the drain (default: $MINIMUM_DRAIN_DURATION, else 5s)
    #[argh(option)]
    pub min_drain: Option<String>,

    /// stop waiting after this long, whatever is still open (default: 25s)
    #[argh(option)]
    pub deadline: Option<String>,

    /// time between counts; longer when a count takes long: 20 times its time (default: 500ms)
    #[argh(option)]
    pub interval: Option<String>,

    /// the count must stay at or below the threshold this long (default: 0s)
    #[argh(option)]
    pub settle: Option<String>,

    /// the threshold: exit when at most this many connections (or requests) are open (default: 0)
    #[argh(option)]
    pub exit_at: Option<String>,

    /// comma-separated ports whose connections never count; empty ignores none (default: the
    /// preset's own, for istio 15000,15004,15010,15012,15014,15020,15021,15053,15090)
    #[argh(option)]
    pub ignore_ports: Option<String>,

    /// proc source only: of the connections Envoy accepted, count only those on these local
    /// ports, e.g. 15006 (default: all)
    #[argh(option)]
    pub ports: Option<String>,

    /// with --count requests from /clusters: comma-separated clusters whose requests never
    /// count, as names or name* prefixes, for exporters of your own; the preset's own (its xDS
    /// stream, exporters, for istio xds-grpc, sds-grpc, agent and the like) never count
    /// (default: none)
    #[argh(option)]
    pub ignore_clusters: Option<String>,

    /// read the text socket tables tcp and tcp6 in this directory, e.g. /proc/<pid>/net,
    /// instead of asking the kernel over netlink (default: netlink, else /proc/net)
    #[argh(option)]
    pub proc_net: Option<String>,

    /// also append every log line to this file, e.g. /proc/1/fd/1 (default: none)
    #[argh(option)]
    pub log_file: Option<String>,

    /// text (tab-separated lines, as Istio's agent writes) or json (an object a line; the
    /// summary's holds the termination's record) (default: $ENVOY_DRAIN_LOG_FORMAT, else text)
    #[argh(option)]
    pub log_format: Option<String>,

    /// after reaching the threshold and once the app has exited (no socket of another user
    /// than the proxy's in the pod for 0.8s), POST /quitquitquit to the Istio agent so the proxy
    /// exits at once (default: off)
    #[argh(switch)]
    pub then_quit: bool,

    /// the Istio agent's address, for --drain agent and --then-quit (default: 127.0.0.1:15020)
    #[argh(option)]
    pub agent: Option<String>,

    /// log the per-listener breakdown at every count
    #[argh(switch)]
    pub verbose: bool,

    /// one of the pod's envoy-drain.io/ annotations, as NAME=VALUE, which the injection
    /// template passes on; repeatable: deadline, min-drain and count win over their flags,
    /// disabled=true is a kill switch; a bad one is a warning and changes nothing
    #[argh(option)]
    pub pod_annotation: Vec<String>,
}

/// The app container's preStop: wait until requests stop arriving at the app (at least --min,
/// then a quiet time from their rate); the app gets its SIGTERM after it.
#[derive(FromArgs, Debug, PartialEq, Default)]
#[argh(subcommand, name = "hold")]
pub struct HoldArgs {
    /// the pod's mesh: istio, consul or kuma (a sidecar: the socket table, and Envoy's counters
    /// of its clusters to the app), ambient (Istio's ambient mode) or none (no mesh), read from
    /// the socket table alone (default: istio)
    #[argh(option)]
    pub preset: Option<String>,

    /// the address of the sidecar's admin API: host:port, [::1]:port, http://host:port or
    /// unix:PATH (default: the preset's, 127.0.0.1:15000 for istio)
    #[argh(option)]
    pub admin: Option<String>,

    /// socket table: comma-separated ports whose connections count, e.g. 8080 (default: every
    /// port that listens in the pod, but the mesh's own)
    #[argh(option)]
    pub ports: Option<String>,

    /// comma-separated addresses whose connections (and their requests in /clusters) never
    /// count: the kubelet's probes; gateway for the pod's default gateway, node for the
    /// addresses in $ENVOY_DRAIN_NODE_IPS (default: 169.254.7.127 with ambient, gateway,node
    /// with none)
    #[argh(option)]
    pub probes_from: Option<String>,

    /// comma-separated periods of the probes the kubelet sends while the pod terminates and
    /// that connect (tcpSocket, httpGet, grpc: its readiness probes, its sidecars' liveness
    /// probes), e.g. 10s,1s, or none: only as many connections from --probes-from, and of those
    /// that left no socket, as they make are theirs (default: every one from --probes-from, none
    /// that left no socket)
    #[argh(option)]
    pub probe_periods: Option<String>,

    /// comma-separated periods of the probes the kubelet stops before the preStop (liveness,
    /// startup) and that connect, e.g. 10s, or none: they are not clients among the connections
    /// the pod accepted over its life, which tell how often requests come (default: none)
    #[argh(option)]
    pub liveness_periods: Option<String>,

    /// never return sooner (default: 3s)
    #[argh(option)]
    pub min: Option<String>,

    /// return once no request has arrived for this long at least; longer where requests come
    /// further apart: until their rate tells they stopped (wrong for one deletion in 2,000),
    /// and twice their longest pause between reads (default: 500ms)
    #[argh(option)]
    pub quiet: Option<String>,

    /// return after this long, whatever still arrives (default: 20s)
    #[argh(option)]
    pub deadline: Option<String>,

    /// how long after the deletion the mesh may still send here: arrivals too sparse to tell
    /// their end hold until then, and none after it is expected unless one comes (default: 15s)
    #[argh(option)]
    pub propagation: Option<String>,

    /// time between reads of what arrives; longer when a read takes long: 20 times its time,
    /// as /clusters' reads are (default: 500ms)
    #[argh(option)]
    pub interval: Option<String>,

    /// comma-separated ports whose connections (and clusters' hosts) never count (default: the
    /// preset's own; with ambient ztunnel's 15001,15053)
    #[argh(option)]
    pub ignore_ports: Option<String>,

    /// also append every log line to this file, e.g. /proc/1/fd/1 (default: none)
    #[argh(option)]
    pub log_file: Option<String>,

    /// text (tab-separated lines, as Istio's agent writes) or json (an object a line; the
    /// summary's holds the termination's record) (default: $ENVOY_DRAIN_LOG_FORMAT, else text)
    #[argh(option)]
    pub log_format: Option<String>,

    /// log every read, not only changes
    #[argh(switch)]
    pub verbose: bool,
}

/// `status` takes `run`'s flags, so a hook's own command line shows what it would count. argh has
/// no flatten (google/argh#15): `run`'s parser serves, with `status`'s first line in its help.
#[derive(Debug, PartialEq, Default)]
pub struct StatusArgs(pub RunArgs);

const STATUS_ABOUT: &str = "Print what `run` would count right now, per source, and what it \
    leaves out and why; changes nothing. Takes run's flags.";

impl argh::SubCommand for StatusArgs {
    const COMMAND: &'static argh::CommandInfo =
        &argh::CommandInfo { name: "status", short: &'\0', description: STATUS_ABOUT };
}

impl FromArgs for StatusArgs {
    fn from_args(name: &[&str], args: &[&str]) -> Result<StatusArgs, argh::EarlyExit> {
        RunArgs::from_args(name, args).map(StatusArgs).map_err(|mut e| {
            let run = <RunArgs as argh::SubCommand>::COMMAND.description;
            e.output = e.output.replacen(run, STATUS_ABOUT, 1);
            e
        })
    }
}

/// Copy this binary to DEST (DEST/envoy-drain when DEST is a directory), atomically; for init
/// containers.
#[derive(FromArgs, Debug, PartialEq)]
#[argh(subcommand, name = "install")]
pub struct InstallArgs {
    /// the directory or file path to install to, e.g. /envoy-drain
    #[argh(positional)]
    pub(crate) dest: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arguments after the program's name, split at spaces.
    fn parsed(args: &str) -> Parsed {
        let args: Vec<OsString> =
            format!("envoy-drain {args}").split(' ').map(OsString::from).collect();
        parse(&args, &|_| None)
    }

    #[test]
    fn a_flag_with_an_equals_sign_parses_as_the_flag_and_its_value() {
        assert_eq!(
            parsed("run --drain=agent --deadline=30s --count requests"),
            parsed("run --drain agent --deadline 30s --count requests"),
        );
        assert!(matches!(
            parsed("run --log-file=/proc/1/fd/1 --agent=127.0.0.1:15020"),
            Parsed::Run(a) if a.log_file.as_deref() == Some("/proc/1/fd/1")
                && a.agent.as_deref() == Some("127.0.0.1:15020")
        ));
    }

    #[test]
    fn only_the_first_equals_sign_splits_and_nothing_after_a_double_dash() {
        assert!(matches!(
            parsed("run --log-file=/tmp/a=b"),
            Parsed::Run(a) if a.log_file.as_deref() == Some("/tmp/a=b")
        ));
        assert!(matches!(
            parsed("install -- --dest=x"),
            Parsed::Install(a) if a.dest == "--dest=x"
        ));
    }

    #[test]
    fn a_value_given_to_a_switch_is_a_usage_error_naming_it() {
        assert_eq!(
            parsed("run --then-quit=yes"),
            Parsed::Usage("Unrecognized argument: yes".to_string())
        );
    }

    #[test]
    fn the_pods_disabled_annotation_is_a_kill_switch_and_only_true_turns_it_on() {
        assert_eq!(
            parsed("run --pod-annotation=envoy-drain.io/disabled=true --deadline=24s"),
            Parsed::Disabled("annotation envoy-drain.io/disabled=true".to_string())
        );
        for other in ["false", "yes", "True"] {
            assert!(
                matches!(
                    parsed(&format!("run --pod-annotation=envoy-drain.io/disabled={other}")),
                    Parsed::Run(a) if a.pod_annotation.len() == 1
                ),
                "{other}"
            );
        }
        let args: Vec<OsString> = ["envoy-drain", "run"].iter().map(OsString::from).collect();
        assert_eq!(
            parse(&args, &|k| (k == ENV_DISABLED).then(|| OsString::from("1"))),
            Parsed::Disabled("ENVOY_DRAIN_DISABLED=1".to_string())
        );
    }
}
