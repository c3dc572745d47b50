//! A hostile admin API must not hold the hook past its deadline, crash it, or make it read without
//! bound: for every fault, `run` ends within 200 ms of its deadline, names the fault in one log
//! line, and counts from the socket table instead.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;
use support::hostile::{FLOOD_BYTES, Fault, Hostile};
use support::netns::in_private_netns;
use support::{Finished, command, one_open_connection, run};

/// The cap on what envoy-drain reads of one answer (README, "Counting").
const BODY_LIMIT: u64 = 4 << 20;
const DEADLINE: Duration = Duration::from_millis(1500);

/// `run` against the hostile server, with a socket table that shows one open connection so the
/// wait lasts until the deadline.
fn against(fault: Fault) -> (Finished, Hostile) {
    against_with(fault, &[])
}

fn against_with(fault: Fault, extra: &[&str]) -> (Finished, Hostile) {
    let hostile = Hostile::start(fault);
    let dir = one_open_connection(&format!("hostile-{fault:?}"));
    let mut args = vec![
        "run",
        "--admin",
        &hostile.addr,
        "--proc-net",
        dir.to_str().unwrap(),
        "--min-drain",
        "0s",
        "--deadline",
        "1500ms",
    ];
    args.extend_from_slice(extra);
    let out = run(command(&args));
    std::fs::remove_dir_all(&dir).unwrap();
    (out, hostile)
}

/// What every fault must leave true.
fn ends_cleanly_at_the_deadline(out: &Finished) {
    assert_eq!(
        out.code,
        Some(1),
        "a deadline with one connection open {out}"
    );
    assert!(!out.stderr.contains("panicked"), "{out}");
    assert!(
        out.elapsed >= DEADLINE && out.elapsed < DEADLINE + Duration::from_millis(200),
        "ended {:?} after start, deadline {DEADLINE:?} {out}",
        out.elapsed
    );
    assert!(
        out.last_line().contains("deadline of 1s 500ms passed"),
        "the summary is last {out}"
    );
}

/// Falls back to the socket table, with one line naming the fault.
fn falls_back_naming(out: &Finished, fault: &str) {
    let switch: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("stats unavailable ("))
        .collect();
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
fn a_50_mib_body_is_cut_off_at_the_cap() {
    // In a namespace of its own with small TCP buffers, what the server gets out on a connection
    // is what envoy-drain read plus at most a few KiB the kernel held.
    let (out, written) = in_private_netns(|| {
        for (sysctl, value) in [
            ("tcp_rmem", "4096 16384 65536"),
            ("tcp_wmem", "4096 16384 65536"),
        ] {
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
fn bad_lines_are_skipped_with_a_warning_each_and_the_good_ones_still_count() {
    let (out, _h) = against(Fault::BadLines);
    ends_cleanly_at_the_deadline(&out);
    for fault in [
        "skipped a stats line without ': ': 'listener.no_separator_here'",
        "skipped a stats line whose value is not a count: 'listener.0.0.0.0_15001.downstream_cx_active: -1'",
        "listener.0.0.0.0_8443.downstream_cx_active is 18446744073709551615, a gauge that wrapped below zero; counting it as 0",
    ] {
        assert_eq!(
            out.stderr.matches(fault).count(),
            1,
            "warned once: {fault} {out}"
        );
    }
    assert!(
        out.last_line()
            .contains("1 active connection (stats) still open: listener 0.0.0.0_15006=1"),
        "the well-formed line still counts {out}"
    );
}

#[test]
fn error_statuses_are_named_with_their_bodies() {
    for (fault, named) in [
        (
            Fault::NotFound,
            "answered 404 'invalid path. admin commands are:",
        ),
        (
            Fault::MethodNotAllowed,
            "answered 405 'Method GET not allowed, POST required.'",
        ),
        (
            Fault::ServerError,
            "answered 500 'internal error: stats store is being rebuilt'",
        ),
        (Fault::Redirect, "answered 302 ''"),
    ] {
        let (out, _h) = against(fault);
        ends_cleanly_at_the_deadline(&out);
        falls_back_naming(&out, named);
    }
}

#[test]
fn a_reset_mid_body_is_named() {
    let (out, _h) = against(Fault::ResetMidBody);
    ends_cleanly_at_the_deadline(&out);
    // ureq sees the reset as the connection ending before the promised length.
    falls_back_naming(&out, "answered 200 but connection closed mid-answer");
}

#[test]
fn requests_fall_back_to_connection_stats_when_clusters_fail_too_and_say_both_causes() {
    let (out, hostile) = against_with(Fault::StatsOnly, &["--count", "requests"]);
    ends_cleanly_at_the_deadline(&out);
    assert!(
        out.stderr.contains(&format!(
            "request stats unavailable (Envoy does not report downstream_rq_active (its stats_matcher leaves the stat out); /clusters: GET http://{}/clusters answered 404 'invalid path. admin commands are:",
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
