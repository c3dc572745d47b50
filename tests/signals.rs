//! A signal that ends a process during the wait: the summary line, then 128 + the signal, at once;
//! one ignored from the start (nohup's SIGHUP) stays ignored.

mod support;

use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};
use support::{one_open_connection, spawn, watch_table};

/// The hook watching one open connection, started with `sig` as `disposition` (`SIG_DFL`,
/// `SIG_IGN`) whatever the test runner's is: a runner under nohup ignores SIGHUP, and a child
/// inherits that.
fn watching(
    dir: &std::path::Path,
    sig: i32,
    disposition: libc::sighandler_t,
) -> std::process::Command {
    let mut cmd = watch_table(dir, &["--deadline", "30s"]);
    // SAFETY: signal() is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(sig, disposition);
            Ok(())
        });
    }
    cmd
}

#[test]
fn sigterm_sigint_and_sighup_print_the_summary_and_exit_143_130_and_129_at_once() {
    for (sig, code, name) in [
        (libc::SIGTERM, 143, "SIGTERM"),
        (libc::SIGINT, 130, "SIGINT"),
        (libc::SIGHUP, 129, "SIGHUP"),
        (libc::SIGUSR1, 138, "SIGUSR1"),
    ] {
        let dir = one_open_connection(&format!("signals-{name}"));
        let mut r = spawn(watching(&dir, sig, libc::SIG_DFL));
        r.expect_line("1 active connection (proc)", Duration::from_secs(10));
        let sent = Instant::now();
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(r.pid(), sig) }, 0);
        let out = r.finish();
        let took = out.ended.saturating_duration_since(sent);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(out.code, Some(code), "{out}");
        assert!(
            out.last_line().contains(&format!("interrupted by {name} after"))
                && out.last_line().contains("with 1 active connection (proc): port 8080=1"),
            "{out}"
        );
        // The promise is 100 ms (BENCHMARKS.md measures it); a shared machine gets a margin here.
        assert!(took < Duration::from_secs(1), "exited {took:?} after {name} {out}");
        // The elapsed time it states is when it wrote the line: no later than its exit.
        let stated: f64 = out
            .last_line()
            .split(" after ")
            .nth(1)
            .and_then(|rest| rest.split('s').next())
            .and_then(|n| n.parse().ok())
            .expect("an elapsed time");
        let lived = out.elapsed.as_secs_f64();
        assert!(
            stated <= lived + 0.05 && stated >= lived - 0.3,
            "says {stated}s, lived {lived:.2}s {out}"
        );
    }
}

#[test]
fn under_nohup_sighup_is_left_ignored_and_sigterm_still_ends_the_wait() {
    let dir = one_open_connection("signals-nohup");
    let mut r = spawn(watching(&dir, libc::SIGHUP, libc::SIG_IGN));
    r.expect_line("1 active connection (proc)", Duration::from_secs(10));
    // SIGHUP first: were it taken, it would be the one the summary names (the lower number is
    // delivered first when both are pending).
    // SAFETY: signalling our own child.
    unsafe {
        assert_eq!(libc::kill(r.pid(), libc::SIGHUP), 0);
        assert_eq!(libc::kill(r.pid(), libc::SIGTERM), 0);
    }
    let out = r.finish();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(143), "{out}");
    assert!(out.last_line().contains("interrupted by SIGTERM after"), "{out}");
}
