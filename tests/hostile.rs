//! A hostile admin API must not hold the hook past its deadline, crash it, or make it read without
//! bound: for every fault, `run` ends within 200 ms of its deadline, names the fault in one log
//! line, and counts from the socket table instead.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;
use support::hostile::{FLOOD_BYTES, Fault, Hostile};
use support::netns::in_private_netns;
use support::{Finished, command, one_open_connection, run, spawn};

/// The cap on what envoy-drain reads of one answer (docs/running.md, "Counting").
const BODY_LIMIT: u64 = 4 << 20;
const DEADLINE: Duration = Duration::from_millis(1500);

/// `run` against the hostile server, with a socket table that shows one open connection so the
/// wait lasts until the deadline.
fn against(fault: Fault) -> (Finished, Hostile) {
    against_with(fault, &[])
}

/// `run` against the fake admin API, with one connection open in the socket table `dir`.
fn hook(hostile: &Hostile, dir: &std::path::Path, extra: &[&str]) -> std::process::Command {
    let mut args = vec![
        "run",
        "--admin",
        &hostile.addr,
        "--proc-net",
        dir.to_str().unwrap(),
        "--min-drain",
        "0s",
    ];
    args.extend_from_slice(extra);
    command(&args)
}

fn against_with(fault: Fault, extra: &[&str]) -> (Finished, Hostile) {
    let hostile = Hostile::start(fault);
    let dir = one_open_connection(&format!("hostile-{fault:?}"));
    let mut args = vec!["--deadline", "1500ms"];
    args.extend_from_slice(extra);
    let out = run(hook(&hostile, &dir, &args));
    std::fs::remove_dir_all(&dir).unwrap();
    (out, hostile)
}

/// What every fault must leave true.
fn ends_cleanly_at_the_deadline(out: &Finished) {
    assert_eq!(out.code, Some(1), "a deadline with one connection open {out}");
    assert!(!out.stderr.contains("panicked"), "{out}");
    assert!(
        out.elapsed >= DEADLINE && out.elapsed < DEADLINE + Duration::from_millis(200),
        "ended {:?} after start, deadline {DEADLINE:?} {out}",
        out.elapsed
    );
    assert!(out.last_line().contains("deadline of 1s 500ms passed"), "the summary is last {out}");
}

/// Falls back to the socket table, with one line naming the fault.
fn falls_back_naming(out: &Finished, fault: &str) {
    let switch: Vec<&str> =
        out.stderr.lines().filter(|l| l.contains("stats unavailable (")).collect();
    assert_eq!(switch.len(), 1, "one line says why {out}");
    assert!(switch[0].contains(fault), "the line names {fault:?} {out}");
    assert!(switch[0].contains("; counting from "), "{out}");
}

#[test]
fn silence_times_out_within_the_deadline() {
    let (out, _h) = against(Fault::Silent);
    ends_cleanly_at_the_deadline(&out);
    falls_back_naming(&out, "no complete answer within");
}

#[test]
fn headers_then_a_stalled_body_time_out() {
    let (out, _h) = against(Fault::HeadersThenStall);
    ends_cleanly_at_the_deadline(&out);
    falls_back_naming(&out, "answered 200 but no complete answer within");
}

#[test]
fn a_trickle_of_one_byte_a_second_times_out() {
    let (out, _h) = against(Fault::Trickle);
    ends_cleanly_at_the_deadline(&out);
    falls_back_naming(&out, "no complete answer within");
}

#[test]
#[ignore = "needs root (a network namespace): `bash scripts/test` runs it"]
fn a_50_mib_body_is_cut_off_at_the_cap() {
    // In a namespace of its own with small TCP buffers, what the server gets out on a connection
    // is what envoy-drain read plus at most a few KiB the kernel held.
    let (out, written) = in_private_netns(|| {
        for (sysctl, value) in [("tcp_rmem", "4096 16384 65536"), ("tcp_wmem", "4096 16384 65536")]
        {
            std::fs::write(format!("/proc/sys/net/ipv4/{sysctl}"), value).unwrap();
        }
        let (out, h) = against(Fault::Flood);
        (out, h.written.load(Ordering::SeqCst))
    });
    ends_cleanly_at_the_deadline(&out);
    falls_back_naming(&out, "its body is larger than 4194304 bytes");
    let slack = 256 * 1024;
    assert!(
        written <= BODY_LIMIT + slack,
        "one answer got {written} bytes out of the server, of {FLOOD_BYTES}; the cap is {BODY_LIMIT}"
    );
}

#[test]
fn a_body_that_is_not_utf8_is_refused() {
    let (out, _h) = against(Fault::NotText);
    ends_cleanly_at_the_deadline(&out);
    falls_back_naming(&out, "answered with bytes that are not text");
}

#[test]
fn an_answer_with_a_line_that_is_not_a_count_is_unknown_and_the_socket_table_counts() {
    // Before, such a line was skipped and the only traffic listener counted as 0.
    for (fault, line) in [
        (Fault::BadLines, "'listener.no_separator_here'".to_string()),
        (Fault::Value("3e0"), "'listener.0.0.0.0_15006.downstream_cx_active: 3e0'".to_string()),
        (Fault::Value("-5"), "'listener.0.0.0.0_15006.downstream_cx_active: -5'".to_string()),
        (
            Fault::Value("18446744073709551616"),
            "'listener.0.0.0.0_15006.downstream_cx_active: 18446744073709551616'".to_string(),
        ),
        (Fault::CrOnly, "'http.admin.downstream_cx_active: 1".to_string()),
    ] {
        let (out, _h) = against(fault);
        ends_cleanly_at_the_deadline(&out);
        falls_back_naming(
            &out,
            &format!("Envoy's stats answer has a line that is not '<name>: <count>': {line}"),
        );
        assert!(
            out.last_line().contains("1 active connection (proc) still open: port 8080=1"),
            "{fault:?}: counted from the socket table {out}"
        );
    }
}

#[test]
fn four_mib_of_bad_lines_cost_one_line_of_log_and_do_not_delay_a_sigterm() {
    // Before: each distinct warning was compared with every earlier one, 12 s a count, and
    // SIGTERM's summary waited behind it.
    let hostile = Hostile::start(Fault::ManyBadLines);
    let dir = one_open_connection("hostile-many");
    let mut r = spawn(hook(&hostile, &dir, &["--deadline", "30s", "--interval", "100ms"]));
    r.expect_line("1 active connection (proc)", Duration::from_secs(10));
    let sent = std::time::Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(r.pid(), libc::SIGTERM) };
    let out = r.finish();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(143), "{out}");
    assert!(out.ended.saturating_duration_since(sent) < Duration::from_secs(1), "{out}");
    assert_eq!(
        out.stderr.matches("is not '<name>: <count>'").count(),
        1,
        "one line says why, once {out}"
    );
}

#[test]
fn error_statuses_are_named_with_their_bodies() {
    for (fault, named) in [
        (Fault::NotFound, "answered 404 'invalid path. admin commands are:"),
        (Fault::MethodNotAllowed, "answered 405 'Method GET not allowed, POST required.'"),
        (Fault::ServerError, "answered 500 'internal error: stats store is being rebuilt'"),
        // Not Envoy's answer: it names no server.
        (Fault::Redirect, "answered 302 without Envoy's 'server: envoy' header"),
    ] {
        let (out, _h) = against(fault);
        ends_cleanly_at_the_deadline(&out);
        falls_back_naming(&out, named);
    }
}

#[test]
fn a_waypoint_that_is_not_envoy_ends_the_hook_at_once_saying_so() {
    // An agentgateway waypoint (GatewayClass istio-agentgateway-waypoint) has no Envoy admin API:
    // waiting out the deadline for counts that never come only delays the pod's end.
    let hostile = Hostile::start(Fault::Agentgateway);
    let dir = one_open_connection("hostile-agentgateway");
    let out = run(hook(&hostile, &dir, &["--preset", "waypoint", "--deadline", "30s"]));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(3), "{out}");
    assert!(out.stderr.contains("answered 404 without Envoy's 'server: envoy' header"), "{out}");
    let last = out.last_line();
    assert!(last.contains("stopped after 0.") && last.contains("agentgateway"), "{out}");
}

#[test]
fn a_reset_mid_body_is_named() {
    // ureq takes a reset as the end of the stream; the body is short of its length either way.
    let (out, _h) = against(Fault::ResetMidBody);
    ends_cleanly_at_the_deadline(&out);
    falls_back_naming(&out, "answered 200 but connection closed mid-answer");
}

#[test]
fn requests_fall_back_to_connection_stats_when_clusters_fail_too_and_say_both_causes() {
    let (out, hostile) = against_with(Fault::StatsOnly, &["--count", "requests"]);
    ends_cleanly_at_the_deadline(&out);
    assert!(
        out.stderr.contains(&format!(
            "request stats unavailable (Envoy does not report downstream_rq_active (its stats_matcher leaves the stat out); /clusters: failed to GET http://{}/clusters: answered 404 'invalid path. admin commands are:",
            hostile.addr
        )) && out.stderr.contains("counting connections from Envoy's stats instead"),
        "{out}"
    );
    assert!(
        out.last_line()
            .contains("1 active connection (stats) still open: listener 0.0.0.0_15006=1"),
        "never a request count that is really connections {out}"
    );
}
