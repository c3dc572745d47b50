//! Every flag's bad values, through the real binary: exit 2 and one line that names the flag, the
//! value and what was expected.

mod support;

use support::{command, run};

/// (command, flag, bad value, what the message must say was expected)
const CASES: &[(&str, &str, &str, &str)] = &[
    ("run", "--admin", "envoy:15000", "host:port with an IP address or localhost"),
    ("run", "--admin", "https://127.0.0.1:15000", "host:port"),
    ("run", "--admin", "127.0.0.1", "host:port"),
    ("run", "--admin", "127.0.0.1:0", "host:port"),
    ("run", "--admin", "[::1]:99999", "host:port"),
    ("run", "--admin", "http://127.0.0.1:15000/stats", "host:port"),
    ("run", "--admin", "", "host:port"),
    ("run", "--admin", "[::1]", "host:port"),
    ("run", "--admin", "unix:", "unix: and the path of the admin API's socket"),
    ("run", "--drain", "outbound", "inbound, all, none or agent"),
    ("run", "--drain", "", "inbound, all, none or agent"),
    ("run", "--source", "netstat", "auto, stats or proc"),
    ("run", "--count", "streams", "connections or requests"),
    ("status", "--count", "all", "connections or requests"),
    ("run", "--min-drain", "5", "a duration like 500ms, 25s or 1m30s"),
    ("run", "--min-drain", "-1s", "a duration"),
    ("run", "--deadline", "soon", "a duration like 500ms, 25s or 1m30s"),
    ("run", "--deadline", "0s", "a duration above zero"),
    ("run", "--deadline", "99999999999999999999s", "a duration"),
    ("run", "--interval", "0ms", "a duration above zero"),
    ("run", "--interval", "fast", "a duration"),
    ("run", "--interval", "-1s", "a duration"),
    ("run", "--settle", "1 fortnight", "a duration"),
    ("run", "--exit-at", "-1", "a whole number of connections"),
    ("run", "--exit-at", "1.5", "a whole number of connections"),
    (
        "run",
        "--ignore-ports",
        "15000,admin",
        "ports from 1 to 65535, like 15006,15001 ('admin' is not one)",
    ),
    ("run", "--ignore-ports", "70000", "comma-separated ports"),
    ("run", "--ports", "", "at least one port"),
    ("run", "--ports", "0", "comma-separated ports"),
    ("run", "--ignore-clusters", "*", "comma-separated cluster names or name* prefixes"),
    ("run", "--agent", "pilot-agent:15020", "host:port"),
    ("status", "--admin", "localhost", "host:port"),
    ("status", "--source", "both", "auto, stats or proc"),
    ("status", "--ignore-ports", "x", "comma-separated ports"),
    ("status", "--ports", ",", "at least one port"),
    (
        "hold",
        "--preset",
        "linkerd",
        "istio, consul or kuma, or ambient (Istio's ambient mode) or none",
    ),
    ("hold", "--ports", "", "at least one port"),
    ("hold", "--ports", "http", "comma-separated ports"),
    ("hold", "--probes-from", "10.0.0.300", "comma-separated IP addresses, gateway or node"),
    (
        "hold",
        "--probe-periods",
        "10",
        "comma-separated whole seconds from 1s, like 10s,5s, or none",
    ),
    ("hold", "--probe-periods", "10s,0s", "comma-separated whole seconds from 1s"),
    ("hold", "--probe-periods", "10s 1s", "comma-separated whole seconds from 1s"),
    ("hold", "--probe-periods", "500ms", "comma-separated whole seconds from 1s"),
    ("hold", "--liveness-periods", "10", "comma-separated whole seconds from 1s"),
    ("hold", "--liveness-periods", "1m,x", "comma-separated whole seconds from 1s"),
    ("hold", "--propagation", "0s", "a duration above zero, like 15s"),
    ("hold", "--propagation", "soon", "a duration like 500ms, 25s or 1m30s"),
];

#[test]
fn every_bad_value_exits_2_with_one_line_naming_the_flag() {
    for (cmd, flag, value, expected) in CASES {
        let out = run(command(&[cmd, flag, value]));
        assert_eq!(out.code, Some(2), "{cmd} {flag} {value:?} {out}");
        let want = format!("envoy-drain: invalid value '{value}' for {flag}: expected ");
        assert!(
            out.stderr.starts_with(&want) && out.stderr.contains(expected),
            "{cmd} {flag} {value:?}: wanted '{want}... {expected}' {out}"
        );
        assert_eq!(out.stderr.lines().count(), 1, "{out}");
    }
}

#[test]
fn requests_from_the_socket_table_are_refused_because_it_knows_no_requests() {
    let out = run(command(&["run", "--count", "requests", "--source", "proc"]));
    assert_eq!(out.code, Some(2), "{out}");
    assert_eq!(
        out.stderr,
        "envoy-drain: invalid value 'requests' for --count: expected connections with --source proc: only Envoy's stats know requests\n"
    );
}

#[test]
fn a_min_drain_longer_than_the_deadline_is_an_error_naming_the_min_drain_as_typed() {
    let out = run(command(&["run", "--min-drain", "30s", "--deadline", "10s"]));
    assert_eq!(out.code, Some(2), "{out}");
    assert_eq!(
        out.stderr,
        "envoy-drain: invalid value '30s' for --min-drain: expected at most the deadline (10s)\n"
    );
}

#[test]
fn a_quiet_time_the_deadline_cannot_hold_is_an_error_naming_the_quiet_time_as_typed() {
    // Red-team #6: it ran to the deadline and said requests were still arriving.
    let out = run(command(&["hold", "--quiet", "30s", "--deadline", "8s"]));
    assert_eq!(out.code, Some(2), "{out}");
    assert_eq!(
        out.stderr,
        "envoy-drain: invalid value '30s' for --quiet: expected less than the deadline (8s)\n"
    );
}

#[test]
fn a_flag_without_its_value_or_an_unknown_flag_exits_2_naming_it() {
    for (args, named) in [
        (&["run", "--deadline"][..], "--deadline"),
        (&["status", "--admin"], "--admin"),
        (&["run", "--wait", "5s"], "--wait"),
        (&["install"], "dest"),
        (&["drain"], "drain"),
    ] {
        let out = run(command(args));
        assert_eq!(out.code, Some(2), "{args:?} {out}");
        assert!(
            out.stderr.starts_with("envoy-drain: ") && out.stderr.contains(named),
            "{args:?} {out}"
        );
    }
}

#[test]
fn istios_minimum_drain_duration_is_read_as_go_reads_it_and_a_bad_one_never_costs_the_wait() {
    // A quiet pod: the hook ends when the min-drain does.
    let dir = support::temp_dir("args-env");
    std::fs::write(dir.join("tcp"), "  sl  local_address rem_address   st\n").unwrap();
    let hook = |value: &str| {
        let mut c = support::watch_table(&dir, &["--deadline", "10s"]);
        c.env("MINIMUM_DRAIN_DURATION", value);
        run(c)
    };
    // Go's `.5s` and `+2s`, which once exited 2: no drain, no wait.
    let (half, two, bad) = (hook(".5s"), hook("+2s"), hook("five"));
    std::fs::remove_dir_all(&dir).unwrap();
    let ms = std::time::Duration::from_millis;
    for (out, min_drain) in [(&half, ms(500)), (&two, ms(2000))] {
        assert_eq!(out.code, Some(0), "{out}");
        assert!(
            out.elapsed >= min_drain && out.elapsed < min_drain + ms(1500),
            "ends when the min-drain does {out}"
        );
    }
    // As pilot-agent: a warning, and Istio's default of 5 s.
    assert_eq!(bad.code, Some(0), "{bad}");
    assert!(
        bad.stderr.contains(
            "\twarn\tenvoy-drain\tignoring MINIMUM_DRAIN_DURATION=\"five\": expected a Go duration \
             like 5s, .5s or 1m30s, as Istio reads it; using Istio's default, 5s\n"
        ),
        "{bad}"
    );
    assert!(bad.elapsed >= ms(5000), "{bad}");
}
