//! Every flag's bad values, through the real binary: exit 2 and one line that names the flag, the
//! value and what was expected.

mod support;

use support::{command, run};

/// (command, flag, bad value, what the message must say was expected)
const CASES: &[(&str, &str, &str, &str)] = &[
    (
        "run",
        "--admin",
        "envoy:15000",
        "host:port with an IP address or localhost",
    ),
    ("run", "--admin", "https://127.0.0.1:15000", "host:port"),
    ("run", "--admin", "127.0.0.1", "host:port"),
    ("run", "--admin", "127.0.0.1:0", "host:port"),
    ("run", "--admin", "[::1]:99999", "host:port"),
    ("run", "--drain", "outbound", "inbound, all, none or agent"),
    ("run", "--drain", "", "inbound, all, none or agent"),
    ("run", "--source", "netstat", "auto, stats or proc"),
    ("run", "--count", "streams", "connections or requests"),
    ("status", "--count", "all", "connections or requests"),
    (
        "run",
        "--min-drain",
        "5",
        "a duration like 500ms, 25s or 1m30s",
    ),
    ("run", "--min-drain", "-1s", "a duration"),
    ("run", "--deadline", "soon", "a duration"),
    ("run", "--deadline", "0s", "a duration above zero"),
    ("run", "--deadline", "99999999999999999999s", "a duration"),
    ("run", "--interval", "0ms", "a duration above zero"),
    ("run", "--interval", "fast", "a duration"),
    ("run", "--settle", "1 fortnight", "a duration"),
    ("run", "--exit-at", "-1", "a whole number of connections"),
    ("run", "--exit-at", "1.5", "a whole number of connections"),
    (
        "run",
        "--ignore-ports",
        "15000,admin",
        "comma-separated ports from 1 to 65535",
    ),
    ("run", "--ignore-ports", "70000", "comma-separated ports"),
    ("run", "--ports", "", "at least one port"),
    ("run", "--ports", "0", "comma-separated ports"),
    ("run", "--agent", "pilot-agent:15020", "host:port"),
    ("status", "--admin", "localhost", "host:port"),
    ("status", "--source", "both", "auto, stats or proc"),
    ("status", "--ignore-ports", "x", "comma-separated ports"),
    ("status", "--ports", ",", "at least one port"),
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
fn bad_environment_variables_name_the_variable() {
    let mut c = command(&["run"]);
    c.env("MINIMUM_DRAIN_DURATION", "five");
    let out = run(c);
    assert_eq!(out.code, Some(2), "{out}");
    assert_eq!(
        out.stderr,
        "envoy-drain: invalid value 'five' for MINIMUM_DRAIN_DURATION: expected a duration like 500ms, 25s or 1m30s\n"
    );
}
