//! Unknown is never zero: a socket table that cannot be read whole and understood leaves the count
//! unknown (status exits 3, run never ends early), whatever sits in the table's place; and a quiet
//! pod still ends with 0 when its min-drain is as long as its deadline. Where Envoy's stats count
//! and the table cannot tell what is still delivered, the count decides and a line says so.

mod support;

use std::path::Path;
use std::time::Duration;
use support::{command, run, temp_dir, watch_table};

/// `status --source proc` on a directory whose `tcp` is what `make` puts there and whose `tcp6`
/// is empty: exit 3, and the reason in the table's section.
fn status_with_tcp(name: &str, make: impl FnOnce(&Path)) -> support::Finished {
    let dir = temp_dir(name);
    std::fs::write(dir.join("tcp6"), "").unwrap();
    make(&dir.join("tcp"));
    let out = run(command(&["status", "--source", "proc", "--proc-net", dir.to_str().unwrap()]));
    std::fs::remove_dir_all(&dir).unwrap();
    out
}

fn unknown_because(out: &support::Finished, why: &str) {
    assert_eq!(out.code, Some(3), "{out}");
    assert!(
        out.stdout.contains("  unavailable: failed to read ") && out.stdout.contains(why),
        "names {why:?} {out}"
    );
    assert!(out.stdout.contains("run could not count anything right now"), "{out}");
    assert!(out.elapsed < Duration::from_secs(5), "it returns at once {out}");
}

#[test]
fn a_directory_in_place_of_the_table_is_unknown_not_zero() {
    let out = status_with_tcp("unknown-dir", |p| std::fs::create_dir(p).unwrap());
    unknown_because(&out, "/tcp: not a regular file");
}

#[test]
fn a_fifo_in_place_of_the_table_returns_at_once_as_unknown() {
    let out = status_with_tcp("unknown-fifo", |p| {
        let path = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid path and mode.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
    });
    unknown_because(&out, "/tcp: not a regular file");
}

#[test]
fn dev_zero_in_place_of_the_table_is_unknown_without_an_abort() {
    let out =
        status_with_tcp("unknown-zero", |p| std::os::unix::fs::symlink("/dev/zero", p).unwrap());
    unknown_because(&out, "/tcp: not a regular file");
}

#[test]
fn a_table_of_garbage_bytes_is_unknown_not_zero() {
    let out = status_with_tcp("unknown-garbage", |p| {
        let bytes: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
        std::fs::write(p, bytes).unwrap();
    });
    unknown_because(&out, "lines are not socket lines");
}

#[test]
fn a_line_longer_than_any_the_kernel_writes_is_unknown_not_zero() {
    let out = status_with_tcp("unknown-long", |p| {
        std::fs::write(p, format!("  sl  local_address {}\n", "x".repeat(4000))).unwrap()
    });
    unknown_because(&out, "a line is longer than 512 bytes");
}

#[test]
fn run_on_an_unreadable_table_waits_out_its_deadline_and_exits_3() {
    let dir = temp_dir("unknown-run");
    std::fs::write(dir.join("tcp6"), "").unwrap();
    std::fs::create_dir(dir.join("tcp")).unwrap();
    let out = run(watch_table(&dir, &["--min-drain", "0s", "--deadline", "1s"]));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(3), "never 0: the pod might be busy {out}");
    assert!(out.last_line().contains("nothing could be counted: failed to read "), "{out}");
    assert!(out.elapsed >= Duration::from_secs(1), "{out}");
}

/// An empty table: a quiet pod.
fn quiet(name: &str) -> std::path::PathBuf {
    let dir = temp_dir(name);
    std::fs::write(
        dir.join("tcp"),
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n",
    )
    .unwrap();
    dir
}

#[test]
fn a_quiet_pod_exits_0_when_its_min_drain_is_as_long_as_its_deadline() {
    // The default 5 s min-drain shrunk to a 2 s deadline, and Istio's MINIMUM_DRAIN_DURATION far
    // past it: before, the min-drain ended after the deadline and a quiet pod exited 1.
    let dir = quiet("unknown-min-drain");
    let short = run(watch_table(&dir, &["--deadline", "2s"]));
    let mut with_env = watch_table(&dir, &["--deadline", "2s"]);
    with_env.env("MINIMUM_DRAIN_DURATION", "60s");
    let env = run(with_env);
    std::fs::remove_dir_all(&dir).unwrap();
    for out in [&short, &env] {
        assert_eq!(out.code, Some(0), "{out}");
        assert!(
            out.last_line().contains("0 active connections (proc); the proxy may stop now"),
            "{out}"
        );
        assert!(
            out.elapsed >= Duration::from_millis(1500) && out.elapsed < Duration::from_secs(2),
            "ends in the last interval before the deadline {out}"
        );
        // Its first line says so before it starts.
        assert!(
            out.stderr.contains("at least 2s after the drain, cut to 1.5s by the deadline)"),
            "{out}"
        );
    }
    assert!(env.stderr.contains("MINIMUM_DRAIN_DURATION=60s is longer than the deadline"), "{env}");
}

#[test]
fn stats_at_zero_with_an_unreadable_table_end_the_wait_and_say_what_is_not_seen() {
    // The count is known (Envoy's stats say 0); what the table would add, answers still on
    // their way to their clients, is not: the count decides, and one line says what is missing.
    let hostile = support::hostile::Hostile::start(support::hostile::Fault::Value("0"));
    let dir = temp_dir("unknown-undelivered");
    std::fs::write(dir.join("tcp6"), "").unwrap();
    std::fs::create_dir(dir.join("tcp")).unwrap();
    let table = dir.to_str().unwrap();
    let args = ["run", "--admin", &hostile.addr, "--proc-net", table, "--min-drain", "0s"];
    let out = run(command(&[&args[..], &["--deadline", "5s"]].concat()));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(0), "{out}");
    let said: Vec<&str> =
        out.stderr.lines().filter(|l| l.contains("cannot read the socket table (")).collect();
    assert_eq!(said.len(), 1, "said once {out}");
    assert!(said[0].contains("answers still on their way to their clients are not seen"), "{out}");
    assert!(out.last_line().contains("done after "), "{out}");
}
