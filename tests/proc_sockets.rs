//! The real binary against real TCP connections on loopback, counted from the kernel's socket
//! table in a network namespace of the test's own.

mod support;

use std::time::{Duration, Instant};
use support::netns::in_private_netns;
use support::{command, hold, run, spawn, watch_sockets};

#[test]
#[ignore = "needs root (a network namespace): `bash scripts/test` runs it"]
fn status_counts_each_loopback_connection_once_under_its_listening_port() {
    in_private_netns(|| {
        let held = hold(3);
        let out = run(command(&["status", "--source", "proc"]));
        assert_eq!(out.code, Some(0), "{out}");
        let row = format!("port {}", held.port);
        let line = out.stdout.lines().find(|l| l.contains(&row));
        assert!(line.is_some_and(|l| l.trim_end().ends_with(" 3")), "a row '{row} ... 3' {out}");
        assert!(out.stdout.contains("run would count 3 active connections (from proc)"), "{out}");
    });
}

#[test]
#[ignore = "needs root (a network namespace): `bash scripts/test` runs it"]
fn ignored_and_unlisted_ports_are_not_counted() {
    in_private_netns(|| {
        let held = hold(2);
        let port = held.port.to_string();
        let ignored = run(command(&["status", "--source", "proc", "--ignore-ports", &port]));
        assert!(ignored.stdout.contains("run would count 0 active connections"), "{ignored}");
        let other = run(command(&["status", "--source", "proc", "--ports", "15006"]));
        assert!(other.stdout.contains("run would count 0 active connections"), "{other}");
        let listed = run(command(&["status", "--source", "proc", "--ports", &port]));
        assert!(listed.stdout.contains("run would count 2 active connections"), "{listed}");
    });
}

#[test]
#[ignore = "needs root (a network namespace): `bash scripts/test` runs it"]
fn run_exits_0_soon_after_the_last_connection_closes() {
    in_private_netns(|| {
        let mut held = hold(2);
        // No Envoy in this namespace: auto mode must fall back to the socket table and say so.
        let mut r = spawn(command(&[
            "run",
            "--min-drain",
            "0s",
            "--interval",
            "100ms",
            "--deadline",
            "30s",
        ]));
        r.expect_line("failed to drain listeners", Duration::from_secs(10));
        r.expect_line(
            "counting from the kernel's socket table (netlink sock_diag) instead",
            Duration::from_secs(10),
        );
        r.expect_line("2 active connections (proc)", Duration::from_secs(10));
        held.ends.pop();
        r.expect_line("1 active connection (proc)", Duration::from_secs(10));
        held.ends.clear();
        let closed = Instant::now();
        let out = r.finish();
        let after_close = closed.elapsed();
        assert_eq!(out.code, Some(0), "{out}");
        assert!(
            out.last_line().contains("done after")
                && out.last_line().contains("0 active connections (proc)"),
            "{out}"
        );
        assert!(
            after_close < Duration::from_secs(5),
            "exited {after_close:?} after the close {out}"
        );
    });
}

#[test]
#[ignore = "needs root (a network namespace): `bash scripts/test` runs it"]
fn run_exits_1_at_the_deadline_naming_the_port_still_open() {
    in_private_netns(|| {
        let held = hold(1);
        let out = run(watch_sockets(&[
            "--min-drain",
            "0s",
            "--interval",
            "100ms",
            "--deadline",
            "1500ms",
        ]));
        assert_eq!(out.code, Some(1), "{out}");
        let want = format!("with 1 active connection (proc) still open: port {}=1", held.port);
        assert!(out.last_line().contains("deadline of 1s 500ms passed"), "{out}");
        assert!(out.last_line().contains(&want), "{out}");
        assert!(
            out.elapsed >= Duration::from_millis(1500) && out.elapsed < Duration::from_secs(5),
            "{out}"
        );
    });
}
