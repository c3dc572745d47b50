//! `run`'s configuration: its flags, the pod's annotations and Istio's environment made into the
//! wait's rules, the requests before it and what counts (`counting`, which `status` shares).
//! What both hooks share is config.rs; `hold`'s own is hold/config.rs.

use crate::cli::{ANNOTATION_PREFIX, RunArgs};
use crate::config::{
    ConfigWarning, DEFAULT_AGENT, DEFAULT_INTERVAL, DEFAULT_MIN_DRAIN, DURATION, ENV_MIN_DRAIN,
    Env, Filter, HookConfig, Mode, Plan, Rules, SourceConfig, log_format, parse_addr, parse_admin,
    parse_duration, ports, positive, some_ports,
};
use crate::count::Unit;
use crate::drain::Request;
use crate::error::UsageError;
use crate::lists::Names;
use crate::preset::{self, PRESETS, Preset};
use std::path::PathBuf;
use std::time::Duration;

const DEFAULT_DEADLINE: Duration = Duration::from_secs(25);

const UNITS: [(&str, Unit); 2] = [("connections", Unit::Connections), ("requests", Unit::Requests)];

const ONLY_STATS: &str = "connections with --source proc: only Envoy's stats know requests";

/// What asks Istio's agent (`--drain agent`, `--then-quit`) with a proxy that has none.
fn no_agent(asks: &str, preset: Preset) -> UsageError {
    UsageError::new(
        "--preset",
        preset.name,
        format!(
            "istio or waypoint with {asks}, which asks Istio's agent: only Istio has one (to stop \
             such a proxy, the kubelet's SIGTERM to its container does)"
        ),
    )
}

/// The value of a flag that takes one of a few words, or an error listing them.
fn one_of<T: Copy>(name: &'static str, value: &str, words: &[(&str, T)]) -> Result<T, UsageError> {
    if let Some((_, v)) = words.iter().find(|(w, _)| *w == value) {
        return Ok(*v);
    }
    let names: Vec<&str> = words.iter().map(|(w, _)| *w).collect();
    let listed = match names.split_last() {
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    Err(UsageError::new(name, value, listed))
}

/// What counts, from the flags `run` and `status` share (`hold` sets its own few).
pub(crate) fn counting(a: &RunArgs) -> Result<SourceConfig, UsageError> {
    let preset = match a.preset.as_deref() {
        Some(v) => one_of("--preset", v, &PRESETS.map(|p| (p.name, p)))?,
        None => preset::ISTIO,
    };
    let modes = [("auto", Mode::Auto), ("stats", Mode::Stats), ("proc", Mode::Proc)];
    let mode = one_of("--source", a.source.as_deref().unwrap_or("auto"), &modes)?;
    let unit = if preset.waypoint { Unit::Requests } else { Unit::Connections };
    let unit = a.count.as_deref().map_or(Ok(unit), |v| one_of("--count", v, &UNITS))?;
    // The socket table knows connections, never requests.
    if unit == Unit::Requests && mode == Mode::Proc {
        return Err(UsageError::new("--count", "requests", ONLY_STATS));
    }
    let only = a.ports.as_deref().map(|v| some_ports("--ports", v)).transpose()?;
    let clusters = a.ignore_clusters.as_deref().unwrap_or_default();
    let ignore_clusters = Names::parse(clusters).map_err(|_| {
        let expected = "comma-separated cluster names or name* prefixes, like otel-collector";
        UsageError::new("--ignore-clusters", clusters, format!("{expected},outbound|4317||*"))
    })?;
    if a.proc_net.as_deref() == Some("") {
        let expected = "a directory holding tcp and tcp6, like /proc/1234/net";
        return Err(UsageError::new("--proc-net", "", expected));
    }
    let (admin, admin_warning) = parse_admin(a.admin.as_deref().unwrap_or(preset.admin))?;
    let ignore = ports("--ignore-ports", a.ignore_ports.as_deref().unwrap_or(preset.ignore_ports))?;
    Ok(SourceConfig {
        preset,
        admin,
        mode,
        unit,
        filter: Filter { ignore, only },
        ignore_clusters,
        proc_net: a.proc_net.as_ref().map(PathBuf::from),
        warnings: admin_warning.into_iter().collect(),
    })
}

/// The variables of pilot-agent's mTLS metrics listeners (pilot/cmd/pilot-agent/options).
const SECURE_METRICS_PORTS: [&str; 2] =
    ["ENVOY_SECURE_METRICS_PORT", "ENVOY_SECURE_MERGED_METRICS_PORT"];

/// `env` looks up an environment variable; empty values count as unset.
pub fn run_config(a: &RunArgs, env: &Env<'_>) -> Result<HookConfig, UsageError> {
    let mut counting = counting(a)?;
    let preset = counting.preset;
    // Istio 1.31's opt-in mTLS metrics listeners, at the ports pilot-agent reads from the proxy
    // container's environment: its own drain leaves them out too (pkg/envoy/agent.go, NewAgent).
    // A value Go's strconv.Atoi refuses is 0 there: no listener.
    for name in preset.agent.then_some(SECURE_METRICS_PORTS).into_iter().flatten() {
        if let Some(port) = env(name).and_then(|v| v.parse().ok()).filter(|p| *p > 0) {
            counting.filter.ignore = std::mem::take(&mut counting.filter.ignore).with(port);
        }
    }
    let warnings = &mut counting.warnings;
    let pod = pod_settings(&a.pod_annotation, counting.mode, warnings);
    counting.unit = pod.count.unwrap_or(counting.unit);
    let drain = drain(a, preset)?;
    if a.then_quit && !preset.agent {
        return Err(no_agent("--then-quit", preset));
    }
    let deadline = deadline(a, pod.deadline, warnings)?;
    let min_drain = min_drain(a, &pod, deadline, env, warnings)?;
    let exit_at = match &a.exit_at {
        None => 0,
        Some(v) => v.trim().parse::<u64>().map_err(|_| {
            UsageError::new("--exit-at", v, "a whole number of connections, like 0")
        })?,
    };
    let interval = positive("--interval", &a.interval, DEFAULT_INTERVAL)?;
    let settle =
        a.settle.as_deref().map_or(Ok(Duration::ZERO), |v| parse_duration("--settle", v))?;
    let log_format = log_format(a.log_format.as_deref(), env, warnings)?;
    // The health checks fail first, so that a load balancer in front stops sending before the
    // listeners drain.
    let fail = a.fail_healthcheck.then_some(Request::FailHealthcheck);
    Ok(HookConfig {
        counting,
        before: fail.into_iter().chain(drain).collect(),
        rules: Rules {
            min_drain,
            deadline,
            interval,
            settle,
            plan: Plan::Run {
                exit_at,
                then_quit: a.then_quit,
                agent: parse_addr("--agent", a.agent.as_deref().unwrap_or(DEFAULT_AGENT))?,
            },
        },
        log_file: a.log_file.as_ref().map(PathBuf::from),
        log_format,
        verbose: a.verbose,
    })
}

fn drain(a: &RunArgs, preset: Preset) -> Result<Option<Request>, UsageError> {
    let (inbound, all) =
        (Request::DrainListeners { all: false }, Request::DrainListeners { all: true });
    // `agent` asks Istio's agent, as Istio's native-sidecar preStop does.
    let drains = [
        ("inbound", Some(inbound)),
        ("all", Some(all)),
        ("none", None),
        ("agent", Some(Request::AgentDrain)),
    ];
    let drain = a.drain.as_deref().map_or(Ok(preset.drain), |v| one_of("--drain", v, &drains))?;
    // A gateway's listeners carry no traffic direction: `inboundonly` would drain none of them.
    if drain == Some(inbound) && preset.drain == Some(all) {
        let expected = format!(
            "all or none with --preset {}: a gateway's listeners have no direction, so inbound \
             would drain none of them",
            preset.name
        );
        return Err(UsageError::new("--drain", "inbound", expected));
    }
    if drain == Some(Request::AgentDrain) && !preset.agent {
        return Err(no_agent("--drain agent", preset));
    }
    Ok(drain)
}

/// `--deadline`, or the pod's annotation unless longer than the flag, which the template derives
/// from the grace period: past it, the kubelet kills the hook before its summary.
fn deadline(
    a: &RunArgs,
    annotated: Option<Duration>,
    warnings: &mut Vec<ConfigWarning>,
) -> Result<Duration, UsageError> {
    let flag = positive("--deadline", &a.deadline, DEFAULT_DEADLINE)?;
    Ok(match annotated {
        Some(d) if a.deadline.is_some() && d > flag => {
            warnings.push(ConfigWarning::DeadlinePastFlag { annotated: d, flag });
            flag
        }
        Some(d) => d,
        None => flag,
    })
}

/// The min-drain: the pod's annotation, else `--min-drain`, else Istio's MINIMUM_DRAIN_DURATION,
/// else 5 s, never past the deadline. Past it, only the flag is a usage error: an annotation or
/// Istio's variable never fails the hook.
fn min_drain(
    a: &RunArgs,
    pod: &PodSettings,
    deadline: Duration,
    env: &Env<'_>,
    warnings: &mut Vec<ConfigWarning>,
) -> Result<Duration, UsageError> {
    let (what, d) = if let Some(d) = pod.min_drain {
        let d_text = humantime::format_duration(d);
        (format!("annotation {ANNOTATION_PREFIX}min-drain={d_text}"), d)
    } else if let Some(v) = &a.min_drain {
        let d = parse_duration("--min-drain", v)?;
        if d > deadline && pod.deadline.is_none() {
            let given = if a.deadline.is_some() { "" } else { " by default; --deadline raises it" };
            let deadline = humantime::format_duration(deadline);
            return Err(UsageError::new(
                "--min-drain",
                v,
                format!("at most the deadline ({deadline}{given})"),
            ));
        }
        (format!("--min-drain {v}, with annotation {ANNOTATION_PREFIX}deadline,"), d)
    } else if let Some(v) = env(ENV_MIN_DRAIN).filter(|v| !v.is_empty()) {
        // A warning and Istio's default, as pilot-agent does (pkg/env/var.go, DurationVar.Lookup).
        let Some(d) = go_duration(&v) else {
            warnings.push(ConfigWarning::MinDrainEnv(v));
            return Ok(DEFAULT_MIN_DRAIN.min(deadline));
        };
        (format!("{ENV_MIN_DRAIN}={v}"), d)
    } else {
        return Ok(DEFAULT_MIN_DRAIN.min(deadline));
    };
    if d > deadline {
        warnings.push(ConfigWarning::MinDrainPastDeadline { what, deadline });
    }
    Ok(d.min(deadline))
}

/// MINIMUM_DRAIN_DURATION as pilot-agent reads it, with Go's `time.ParseDuration`: humantime held
/// to Go's units and int64 of nanoseconds, with a sign (a negative one waits for nothing) and
/// numbers that may lack a digit beside the point (`.5s`, `1.s`). `None` where Go refuses it.
fn go_duration(v: &str) -> Option<Duration> {
    let (negative, rest) = match v.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, v.strip_prefix('+').unwrap_or(v)),
    };
    let mut units = rest.split(|c: char| c.is_ascii_digit() || c == '.').filter(|u| !u.is_empty());
    if !units.all(|u| ["ns", "us", "µs", "μs", "ms", "s", "m", "h"].contains(&u)) {
        return None;
    }
    let mut spelled = String::new();
    let rest = rest.replace('μ', "µ");
    let mut chars = rest.chars().peekable();
    let mut before = None;
    while let Some(c) = chars.next() {
        let digit = |c: Option<char>| c.is_some_and(|c| c.is_ascii_digit());
        let (left, right) = (digit(before), digit(chars.peek().copied()));
        match c {
            '.' if !left && !right => return None,
            '.' => spelled.extend(
                [(!left).then_some('0'), Some('.'), (!right).then_some('0')].into_iter().flatten(),
            ),
            c => spelled.push(c),
        }
        before = Some(c);
    }
    let d = humantime::parse_duration(&spelled).ok()?;
    (d.as_nanos() <= i64::MAX as u128).then_some(if negative { Duration::ZERO } else { d })
}

/// What a pod's annotations set, each value checked.
#[derive(Debug, Default, PartialEq)]
struct PodSettings {
    deadline: Option<Duration>,
    min_drain: Option<Duration>,
    count: Option<Unit>,
}

/// Reads `--pod-annotation` values: a bad one is a warning, never an error, and changes nothing.
fn pod_settings(given: &[String], mode: Mode, warnings: &mut Vec<ConfigWarning>) -> PodSettings {
    let mut pod = PodSettings::default();
    for item in given {
        let Some((name, value)) = item.split_once('=') else {
            warnings.push(ConfigWarning::PodAnnotation(item.clone()));
            continue;
        };
        let mut ignore = |expected: &str| {
            let (name, value) = (name.to_string(), value.to_string());
            warnings.push(ConfigWarning::Annotation { name, value, expected: expected.into() });
        };
        let duration = || humantime::parse_duration(value.trim()).ok();
        match name.strip_prefix(ANNOTATION_PREFIX) {
            Some("deadline") => match duration() {
                Some(d) if !d.is_zero() => pod.deadline = Some(d),
                _ => ignore("a duration above zero, like 25s, 2m or 1h"),
            },
            Some("min-drain") => match duration() {
                Some(d) => pod.min_drain = Some(d),
                None => ignore(DURATION),
            },
            Some("count") => match one_of("", value.trim(), &UNITS) {
                Ok(Unit::Requests) if mode == Mode::Proc => ignore(ONLY_STATS),
                Ok(unit) => pod.count = Some(unit),
                Err(e) => ignore(&e.expected),
            },
            // `disabled=true` is the kill switch, which cli.rs acts on; `hold` and `log-format`
            // are the template's: it adds the app container's preStop, and `--log-format=json`.
            Some("disabled" | "hold") if matches!(value.trim(), "false" | "true") => {}
            Some("log-format") if matches!(value.trim(), "text" | "json") => {}
            Some("disabled") => ignore("true (envoy-drain off for this pod) or false"),
            Some("hold") => ignore("true (the app's preStop is `envoy-drain hold`) or false"),
            Some("log-format") => ignore("text or json"),
            Some(_) => {
                ignore("one of the names deadline, min-drain, count, hold, log-format or disabled")
            }
            None => ignore(&format!("a name under {ANNOTATION_PREFIX}")),
        }
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ENV_LOG_FORMAT;
    use crate::config::tests::{no_env, said};
    use crate::log::Format;

    fn args(pairs: &[(&str, &str)]) -> RunArgs {
        let mut a = RunArgs::default();
        for (k, value) in pairs {
            let v = Some(value.to_string());
            match *k {
                "preset" => a.preset = v,
                "admin" => a.admin = v,
                "drain" => a.drain = v,
                "source" => a.source = v,
                "min-drain" => a.min_drain = v,
                "deadline" => a.deadline = v,
                "interval" => a.interval = v,
                "settle" => a.settle = v,
                "exit-at" => a.exit_at = v,
                "ignore-ports" => a.ignore_ports = v,
                "ports" => a.ports = v,
                "ignore-clusters" => a.ignore_clusters = v,
                "count" => a.count = v,
                "agent" => a.agent = v,
                "log-format" => a.log_format = v,
                "pod-annotation" => a.pod_annotation.push(value.to_string()),
                _ => panic!("unknown flag {k}"),
            }
        }
        a
    }

    fn err(pairs: &[(&str, &str)]) -> String {
        run_config(&args(pairs), &no_env).unwrap_err().to_string()
    }

    #[test]
    fn istios_mtls_metrics_listeners_are_left_out_at_the_ports_its_environment_gives() {
        let env = |k: &str| match k {
            "ENVOY_SECURE_METRICS_PORT" => Some("15091".to_string()),
            "ENVOY_SECURE_MERGED_METRICS_PORT" => Some("9x".to_string()),
            _ => None,
        };
        let ignored = |pairs: &[(&str, &str)]| run_config(&args(pairs), &env).unwrap().counting;
        let ignore = ignored(&[]).filter.ignore;
        assert!(ignore.contains(15091) && ignore.contains(15090), "{ignore}");
        // As pilot-agent reads it: a value that is no number opens no listener.
        assert!(!ignore.contains(15092) && !ignore.contains(9), "{ignore}");
        // Also beside a list of the user's own; never for a proxy without Istio's agent.
        assert_eq!(ignored(&[("ignore-ports", "8081")]).filter.ignore.to_string(), "8081,15091");
        assert!(!ignored(&[("preset", "consul")]).filter.ignore.contains(15091));
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let c = run_config(&RunArgs::default(), &no_env).unwrap();
        assert_eq!(c.counting.admin.to_string(), "127.0.0.1:15000");
        assert_eq!(c.before, vec![Request::DrainListeners { all: false }]);
        assert_eq!(c.counting.mode, Mode::Auto);
        assert_eq!(c.counting.unit, Unit::Connections);
        assert_eq!(c.rules.min_drain, Duration::from_secs(5));
        assert_eq!(c.rules.deadline, Duration::from_secs(25));
        assert_eq!(c.rules.interval, Duration::from_millis(500));
        assert_eq!(c.rules.settle, Duration::ZERO);
        assert!(matches!(c.rules.plan, Plan::Run { exit_at: 0, then_quit: false, .. }));
        let ignore = &c.counting.filter.ignore;
        assert!(ignore.contains(15021) && !ignore.contains(15006));
        assert_eq!(c.counting.filter.only, None);
        assert_eq!(c.counting.proc_net, None, "netlink");
        assert!(c.counting.warnings.is_empty());
    }

    #[test]
    fn the_log_format_comes_from_its_flag_else_its_variable_and_a_bad_variable_only_warns() {
        let format = |pairs: &[(&str, &str)], var: Option<&str>| {
            let env = |name: &str| (name == ENV_LOG_FORMAT).then(|| var.map(String::from))?;
            run_config(&args(pairs), &env).map(|c| (c.log_format, c.counting.warnings.len()))
        };
        assert_eq!(format(&[], None), Ok((Format::Text, 0)));
        assert_eq!(format(&[], Some("JSON")), Ok((Format::Json, 0)));
        assert_eq!(format(&[("log-format", "text")], Some("json")), Ok((Format::Text, 0)));
        assert_eq!(format(&[], Some("yaml")), Ok((Format::Text, 1)), "a warning, text");
        assert_eq!(
            err(&[("log-format", "yaml")]),
            "invalid value 'yaml' for --log-format: expected text or json"
        );
    }

    #[test]
    fn admin_addresses_in_every_accepted_form() {
        for (given, want) in [
            ("127.0.0.1:15000", "127.0.0.1:15000"),
            ("[::1]:15000", "[::1]:15000"),
            ("http://127.0.0.1:9901", "127.0.0.1:9901"),
            ("http://[::1]:9901/", "[::1]:9901"),
            ("localhost:15000", "127.0.0.1:15000"),
            ("http://localhost:15000", "127.0.0.1:15000"),
        ] {
            assert_eq!(parse_addr("--admin", given).unwrap().to_string(), want);
        }
    }

    #[test]
    fn a_min_drain_flag_longer_than_the_deadline_is_an_error_naming_what_was_typed() {
        assert_eq!(
            err(&[("deadline", "3s"), ("min-drain", "5s")]),
            "invalid value '5s' for --min-drain: expected at most the deadline (3s)"
        );
        assert_eq!(
            err(&[("min-drain", "30s")]),
            "invalid value '30s' for --min-drain: expected at most the deadline (25s by default; \
             --deadline raises it)"
        );
        let short = run_config(&args(&[("deadline", "3s")]), &no_env).unwrap();
        assert_eq!(
            short.rules.min_drain,
            Duration::from_secs(3),
            "the default min-drain shrinks to a short deadline"
        );
    }

    #[test]
    fn istios_minimum_drain_duration_is_used_when_the_flag_is_absent() {
        let env = |k: &str| (k == ENV_MIN_DRAIN).then(|| "8s".to_string());
        let c = run_config(&RunArgs::default(), &env).unwrap();
        assert_eq!(c.rules.min_drain, Duration::from_secs(8));
        let flag_wins = run_config(&args(&[("min-drain", "1s")]), &env).unwrap();
        assert_eq!(flag_wins.rules.min_drain, Duration::from_secs(1));
        let empty = |_: &str| Some(String::new());
        let c = run_config(&RunArgs::default(), &empty).unwrap();
        assert_eq!(c.rules.min_drain, DEFAULT_MIN_DRAIN, "empty means unset");
    }

    #[test]
    fn a_minimum_drain_duration_past_the_deadline_is_a_warning_not_a_failure() {
        let env = |k: &str| (k == ENV_MIN_DRAIN).then(|| "60s".to_string());
        let c = run_config(&RunArgs::default(), &env).unwrap();
        assert_eq!(c.rules.min_drain, c.rules.deadline);
        let warnings = said(&c.counting.warnings);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("MINIMUM_DRAIN_DURATION=60s"), "{warnings:?}");
    }

    #[test]
    fn a_minimum_drain_duration_is_read_as_go_reads_it_and_a_bad_one_is_a_warning() {
        let min_drain = |v: &str| {
            let env = |k: &str| (k == ENV_MIN_DRAIN).then(|| v.to_string());
            let c = run_config(&args(&[("deadline", "2h")]), &env).unwrap();
            (c.rules.min_drain, said(&c.counting.warnings))
        };
        for (v, us) in [
            (".5s", 500_000),
            ("+5s", 5_000_000),
            ("1.5m", 90_000_000),
            ("1h2m3.5s", 3_723_500_000),
            ("250µs", 250),
            ("1.s", 1_000_000),
            ("-3s", 0),
            ("0", 0),
        ] {
            assert_eq!(min_drain(v), (Duration::from_micros(us), vec![]), "{v}");
        }
        // What Go refuses: pilot-agent warns and takes its default, and so does the hook.
        for v in ["five", "5", ".s", "1..5s", "5d", "s", "-", "9999999999h"] {
            let (d, warnings) = min_drain(v);
            assert_eq!(d, DEFAULT_MIN_DRAIN, "{v}");
            assert_eq!(
                warnings,
                [format!(
                    "ignoring MINIMUM_DRAIN_DURATION={v:?}: expected a Go duration like 5s, .5s \
                     or 1m30s, as Istio reads it; using Istio's default, 5s"
                )],
                "{v}"
            );
        }
    }

    #[test]
    fn humantime_durations_parse() {
        let c = run_config(
            &args(&[("deadline", "1m30s"), ("interval", "250ms"), ("settle", "2s")]),
            &no_env,
        )
        .unwrap();
        assert_eq!(c.rules.deadline, Duration::from_secs(90));
        assert_eq!(c.rules.interval, Duration::from_millis(250));
        assert_eq!(c.rules.settle, Duration::from_secs(2));
    }

    #[test]
    fn the_health_checks_fail_before_the_drain_and_only_the_agents_requests_go_to_it() {
        let fail = |drain| RunArgs { fail_healthcheck: true, ..args(&[("drain", drain)]) };
        let c = run_config(&fail("inbound"), &no_env).unwrap();
        assert_eq!(c.before, [Request::FailHealthcheck, Request::DrainListeners { all: false }]);
        assert_eq!(run_config(&fail("none"), &no_env).unwrap().before, [Request::FailHealthcheck]);
        let all = run_config(&fail("all"), &no_env).unwrap().before;
        assert_eq!(all, [Request::FailHealthcheck, Request::DrainListeners { all: true }]);
        let agent = RunArgs { fail_healthcheck: true, ..args(&[("drain", "agent")]) };
        let agent = run_config(&agent, &no_env).unwrap().before;
        assert_eq!(agent, [Request::FailHealthcheck, Request::AgentDrain]);
        let to_agent: Vec<bool> = all.iter().chain(&agent).map(|r| r.to_agent()).collect();
        assert_eq!(to_agent, [false, false, false, true], "only the agent's drain goes to it");
    }

    #[test]
    fn drain_agent_asks_the_agent_address() {
        let c = run_config(&args(&[("drain", "agent"), ("agent", "127.0.0.1:15099")]), &no_env)
            .unwrap();
        assert_eq!(c.before, vec![Request::AgentDrain], "nothing to Envoy's admin API");
        let Plan::Run { agent, .. } = c.rules.plan else { panic!("{:?}", c.rules.plan) };
        assert_eq!(agent.to_string(), "127.0.0.1:15099");
    }

    #[test]
    fn a_preset_sets_the_proxys_admin_api_own_ports_and_drain_and_flags_still_win() {
        let c = run_config(&args(&[("preset", "contour")]), &no_env).unwrap();
        assert_eq!(c.counting.admin.to_string(), "unix:/admin/admin.sock");
        assert!(c.counting.filter.ignore.contains(8002) && c.counting.filter.ignore.contains(9001));
        assert!(!c.counting.filter.ignore.contains(15021), "Istio's ports are not Contour's");
        assert_eq!(
            c.before,
            vec![Request::DrainListeners { all: true }],
            "a gateway's listeners have no direction"
        );
        let c = run_config(&args(&[("preset", "consul")]), &no_env).unwrap();
        assert_eq!(c.counting.admin.to_string(), "127.0.0.1:19000");
        assert_eq!(c.before, vec![Request::DrainListeners { all: false }]);
        let given = args(&[
            ("preset", "envoy-gateway"),
            ("admin", "127.0.0.1:9000"),
            ("ignore-ports", "9001"),
            ("drain", "none"),
        ]);
        let c = run_config(&given, &no_env).unwrap();
        assert_eq!(c.counting.admin.to_string(), "127.0.0.1:9000");
        let ignore = &c.counting.filter.ignore;
        assert!(ignore.contains(9001) && !ignore.contains(19001));
        assert_eq!(c.before, vec![]);
        let istio = run_config(&args(&[]), &no_env).unwrap();
        assert_eq!(istio.counting.preset, preset::ISTIO, "the default");
        assert_eq!(istio.counting.unit, Unit::Connections);
        // A waypoint: Istio's admin API and agent, all listeners, requests unless told otherwise.
        let c = run_config(&args(&[("preset", "waypoint")]), &no_env).unwrap();
        assert_eq!(c.counting.admin.to_string(), "127.0.0.1:15000");
        assert_eq!(c.before, vec![Request::DrainListeners { all: true }]);
        assert_eq!(c.counting.unit, Unit::Requests);
        let c = run_config(&args(&[("preset", "waypoint"), ("count", "connections")]), &no_env);
        assert_eq!(c.unwrap().counting.unit, Unit::Connections);
        assert!(err(&[("preset", "linkerd")]).ends_with(
            "invalid value 'linkerd' for --preset: expected istio, waypoint, consul, kuma, envoy-gateway or contour"
        ));
        for gateway in ["contour", "envoy-gateway"] {
            assert_eq!(
                err(&[("preset", gateway), ("drain", "inbound")]),
                format!(
                    "invalid value 'inbound' for --drain: expected all or none with --preset \
                     {gateway}: a gateway's listeners have no direction, so inbound would drain \
                     none of them"
                )
            );
        }
        let e = err(&[("preset", "kuma"), ("drain", "agent")]);
        assert!(
            e.starts_with("invalid value 'kuma' for --preset: expected istio or waypoint with --drain agent, which asks Istio's agent"),
            "{e}"
        );
        let mut a = args(&[("preset", "consul")]);
        a.then_quit = true;
        let e = run_config(&a, &no_env).unwrap_err().to_string();
        assert!(
            e.starts_with("invalid value 'consul' for --preset: expected istio or waypoint with --then-quit, which asks Istio's agent"),
            "{e}"
        );
    }

    #[test]
    fn then_quit_uses_the_agent_address() {
        let mut a = args(&[("agent", "[::1]:15020")]);
        let plan = |a: &RunArgs| run_config(a, &no_env).unwrap().rules.plan;
        assert!(matches!(plan(&a), Plan::Run { then_quit: false, .. }));
        a.then_quit = true;
        let Plan::Run { then_quit, agent, .. } = plan(&a) else { panic!() };
        assert!(then_quit);
        assert_eq!(agent.to_string(), "[::1]:15020");
    }

    #[test]
    fn an_empty_ignore_list_ignores_nothing_and_ports_narrow_the_proc_count() {
        let c =
            run_config(&args(&[("ignore-ports", ""), ("ports", "15006,15001")]), &no_env).unwrap();
        assert!(c.counting.filter.ignore.is_empty());
        let only = c.counting.filter.only.unwrap();
        assert!(only.contains(15006) && only.contains(15001) && !only.contains(8080));
    }
    #[test]
    fn a_pods_annotations_win_over_the_templates_flags_but_never_outlast_its_grace_period() {
        let c = run_config(
            &args(&[
                ("deadline", "24s"),
                ("count", "connections"),
                ("pod-annotation", "envoy-drain.io/deadline=20s"),
                ("pod-annotation", "envoy-drain.io/min-drain=10s"),
                ("pod-annotation", "envoy-drain.io/count= requests"),
                ("pod-annotation", "envoy-drain.io/disabled=false"),
                ("pod-annotation", "envoy-drain.io/hold=true"),
            ]),
            &no_env,
        )
        .unwrap();
        assert_eq!(c.rules.deadline, Duration::from_secs(20));
        assert_eq!(c.rules.min_drain, Duration::from_secs(10));
        assert_eq!(c.counting.unit, Unit::Requests);
        assert!(c.counting.warnings.is_empty(), "{:?}", c.counting.warnings);
        // 600s on a pod whose grace period gives 24s: the kubelet would kill the hook at 30s.
        let past = run_config(
            &args(&[("deadline", "24s"), ("pod-annotation", "envoy-drain.io/deadline=600s")]),
            &no_env,
        )
        .unwrap();
        assert_eq!(past.rules.deadline, Duration::from_secs(24));
        assert_eq!(
            said(&past.counting.warnings),
            ["annotation envoy-drain.io/deadline=10m is past --deadline 24s, which the injection \
              template derives from the pod's terminationGracePeriodSeconds; using 24s: raise the \
              grace period instead"]
        );
    }

    #[test]
    fn a_bad_annotation_is_a_warning_naming_it_and_the_flags_stay() {
        let c = run_config(
            &args(&[
                ("deadline", "24s"),
                ("min-drain", "2s"),
                ("pod-annotation", "envoy-drain.io/deadline=2 mins please"),
                ("pod-annotation", "envoy-drain.io/deadline=0s"),
                ("pod-annotation", "envoy-drain.io/min-drain=soon"),
                ("pod-annotation", "envoy-drain.io/count=streams"),
                ("pod-annotation", "envoy-drain.io/disabled=yes"),
                ("pod-annotation", "envoy-drain.io/deadlin=10s"),
                ("pod-annotation", "sidecar.istio.io/inject=true"),
                ("pod-annotation", "envoy-drain.io/deadline"),
            ]),
            &no_env,
        )
        .unwrap();
        assert_eq!(c.rules.deadline, Duration::from_secs(24));
        assert_eq!(c.rules.min_drain, Duration::from_secs(2));
        assert_eq!(c.counting.unit, Unit::Connections);
        assert_eq!(
            said(&c.counting.warnings),
            [
                "ignoring annotation envoy-drain.io/deadline=\"2 mins please\": expected a duration above zero, like 25s, 2m or 1h",
                "ignoring annotation envoy-drain.io/deadline=\"0s\": expected a duration above zero, like 25s, 2m or 1h",
                "ignoring annotation envoy-drain.io/min-drain=\"soon\": expected a duration like 500ms, 25s or 1m30s",
                "ignoring annotation envoy-drain.io/count=\"streams\": expected connections or requests",
                "ignoring annotation envoy-drain.io/disabled=\"yes\": expected true (envoy-drain off for this pod) or false",
                "ignoring annotation envoy-drain.io/deadlin=\"10s\": expected one of the names deadline, min-drain, count, hold, log-format or disabled",
                "ignoring annotation sidecar.istio.io/inject=\"true\": expected a name under envoy-drain.io/",
                "ignoring --pod-annotation \"envoy-drain.io/deadline\": expected envoy-drain.io/NAME=VALUE",
            ]
        );
    }

    #[test]
    fn a_min_drain_past_the_pods_own_deadline_is_a_warning_not_a_failed_hook() {
        let flag = run_config(
            &args(&[("min-drain", "20s"), ("pod-annotation", "envoy-drain.io/deadline=5s")]),
            &no_env,
        )
        .unwrap();
        assert_eq!(flag.rules.min_drain, Duration::from_secs(5));
        assert_eq!(
            said(&flag.counting.warnings),
            [
                "--min-drain 20s, with annotation envoy-drain.io/deadline, is longer than the deadline (5s); using the deadline as the min-drain"
            ]
        );
        let annotation =
            run_config(&args(&[("pod-annotation", "envoy-drain.io/min-drain=1m")]), &no_env)
                .unwrap();
        assert_eq!(annotation.rules.min_drain, annotation.rules.deadline);
        assert_eq!(annotation.counting.warnings.len(), 1, "{:?}", annotation.counting.warnings);
        let proc = run_config(
            &args(&[("source", "proc"), ("pod-annotation", "envoy-drain.io/count=requests")]),
            &no_env,
        )
        .unwrap();
        assert_eq!(proc.counting.unit, Unit::Connections);
        assert!(
            proc.counting.warnings[0].to_string().ends_with(
                "expected connections with --source proc: only Envoy's stats know requests"
            ),
            "{:?}",
            proc.counting.warnings
        );
    }
}
