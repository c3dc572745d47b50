//! The command line as a user meets it: help, version, bad input, the kill switch, exit codes,
//! signals and the log file. No Envoy needed.

mod support;

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;
use support::{command, one_open_connection, run, spawn, temp_dir, watch_table};

/// A loopback address nothing listens on.
fn refused() -> String {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string()
}

#[test]
fn help_lists_the_commands_and_exit_codes() {
    let out = run(command(&["--help"]));
    assert_eq!(out.code, Some(0), "{out}");
    for want in ["run ", "hold ", "status ", "Exit codes:", "130", "ENVOY_DRAIN_DISABLED"] {
        assert!(out.stdout.contains(want), "missing {want:?} {out}");
    }
    let run_help = run(command(&["run", "--help"]));
    assert_eq!(run_help.code, Some(0), "{run_help}");
    for flag in [
        "--admin",
        "--drain",
        "--source",
        "--count",
        "--min-drain",
        "--deadline",
        "--interval",
        "--settle",
        "--exit-at",
        "--ignore-ports",
        "--ports",
        "--proc-net",
        "--log-file",
        "--then-quit",
        "--agent",
        "--verbose",
    ] {
        assert!(run_help.stdout.contains(flag), "missing {flag} {run_help}");
    }
}

#[test]
fn version_prints_name_and_version() {
    let out = run(command(&["--version"]));
    assert_eq!(out.code, Some(0), "{out}");
    assert_eq!(out.stdout, format!("envoy-drain {}\n", env!("CARGO_PKG_VERSION")));
}

#[test]
fn a_missing_command_exits_2_and_names_the_commands() {
    let none = run(command(&[]));
    assert_eq!(none.code, Some(2), "{none}");
    assert_eq!(
        none.stderr,
        "envoy-drain: no command given: expected run, hold, status or install (see envoy-drain --help)\n"
    );
}

#[test]
fn the_kill_switch_exits_0_at_once_with_one_line() {
    let mut c = command(&["run", "--admin", &refused()]);
    c.env("ENVOY_DRAIN_DISABLED", "1");
    let out = run(c);
    assert_eq!(out.code, Some(0), "{out}");
    assert_eq!(out.stderr.lines().count(), 1, "{out}");
    assert!(
        out.stderr.contains("ENVOY_DRAIN_DISABLED=1 is set: not draining and not waiting"),
        "{out}"
    );
    let mut empty = command(&["run", "--deadline", "5x"]);
    empty.env("ENVOY_DRAIN_DISABLED", "");
    assert_eq!(run(empty).code, Some(2), "an empty value does not disable");
}

#[test]
fn the_kill_switch_wins_over_every_argument_error() {
    // Before, an unknown flag (argh's own error) exited 2 before the switch was looked at.
    for args in [
        &["run", "--no-such-flag"][..],
        &["run", "--deadline", "5x"],
        &["run", "--deadline"],
        &["run", "stray"],
    ] {
        let mut c = command(args);
        c.env("ENVOY_DRAIN_DISABLED", "true");
        let out = run(c);
        assert_eq!(out.code, Some(0), "{args:?} {out}");
        assert!(
            out.stderr.contains("ENVOY_DRAIN_DISABLED=true is set: not draining and not waiting"),
            "{out}"
        );
    }
}

#[test]
fn status_with_no_source_answering_exits_3() {
    let dir = temp_dir("cli-status3");
    let out = run(command(&["status", "--admin", &refused(), "--proc-net", dir.to_str().unwrap()]));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(3), "{out}");
    assert!(out.stdout.contains("unavailable: failed to GET http://127.0.0.1:"), "{out}");
    assert!(out.stdout.contains("run could not count anything right now"), "{out}");
}

#[test]
fn run_that_never_counts_exits_3_at_the_deadline_and_says_why() {
    let dir = temp_dir("cli-run3");
    let out = run(command(&[
        "run",
        "--admin",
        &refused(),
        "--proc-net",
        dir.to_str().unwrap(),
        "--deadline",
        "1s",
        "--min-drain",
        "0s",
    ]));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(3), "{out}");
    let last = out.last_line();
    assert!(last.contains("\terror\tenvoy-drain\tdeadline of 1s passed after"), "{out}");
    assert!(
        last.contains("nothing could be counted: stats: failed to GET")
            && last.contains("proc: failed to read ")
            && last.ends_with("/tcp and tcp6: neither exists"),
        "{out}"
    );
    assert_eq!(
        out.stderr.matches("cannot count:").count(),
        1,
        "the same failure is logged once {out}"
    );
}

#[test]
fn hold_refuses_a_gateway_and_a_zero_quiet_time_in_one_line() {
    for (args, want) in [
        (
            &["hold", "--preset", "contour"][..],
            "envoy-drain: invalid value 'contour' for --preset: expected a sidecar's preset, istio, consul or kuma, or ambient (Istio's ambient mode) or none (no mesh): a gateway or waypoint has no app behind it to hold\n",
        ),
        (
            &["hold", "--preset", "waypoint"],
            "envoy-drain: invalid value 'waypoint' for --preset: expected a sidecar's preset, istio, consul or kuma, or ambient (Istio's ambient mode) or none (no mesh): a gateway or waypoint has no app behind it to hold\n",
        ),
        (
            &["hold", "--quiet", "0s"],
            "envoy-drain: invalid value '0s' for --quiet: expected a duration above zero, like 500ms\n",
        ),
        (
            &["hold", "--min", "30s"],
            "envoy-drain: invalid value '30s' for --min: expected at most the deadline (20s)\n",
        ),
    ] {
        let out = run(command(args));
        assert_eq!((out.code, out.stderr.as_str()), (Some(2), want), "{out}");
    }
}

#[test]
fn the_log_file_gets_every_line_and_a_bad_or_full_one_is_only_a_warning() {
    let dir = one_open_connection("cli-logfile");
    let log = dir.join("hook.log");
    let logging_to = |file: &std::path::Path| {
        let file = file.to_str().unwrap();
        let args = ["--deadline", "300ms", "--min-drain", "0s", "--log-file", file];
        run(watch_table(&dir, &args))
    };
    let out = logging_to(&log);
    let written = std::fs::read_to_string(&log).unwrap();
    // A full disk: every line fails there, and the summary, on stderr, says why.
    let full = logging_to(std::path::Path::new("/dev/full"));
    let missing = dir.join("no/such/dir.log");
    let bad = logging_to(&missing);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(1), "{out}");
    assert_eq!(written, out.stderr, "the file holds exactly the lines of stderr");
    assert_eq!(full.code, Some(1), "{full}");
    let lines = full.stderr.lines().count() - 1;
    assert!(
        full.last_line().ends_with(&format!(
            "; {lines} earlier log lines were not written: no space left on device"
        )),
        "{full}"
    );
    assert_eq!(bad.code, Some(1), "{bad}");
    assert!(
        bad.stderr.contains(&format!(
            "\twarn\tenvoy-drain\tfailed to open log file {}: no such file or directory; \
             logging to stderr only",
            missing.display()
        )),
        "the cause in the log's own words: {bad}"
    );
}

/// Answers one request the way pilot-agent's /quitquitquit does (a Go net/http `200 OK` with
/// body `OK`) and hands back the request line it got. With `exits`, it first kills the process
/// whose pid is there, as the agent's exit ends the container and every process in it.
fn fake_agent(exits: Option<Arc<AtomicI32>>) -> (String, std::thread::JoinHandle<String>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let handle = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut request_line = String::new();
        reader.read_line(&mut request_line).unwrap();
        let mut header = String::new();
        while reader.read_line(&mut header).unwrap_or(0) > 2 {
            header.clear();
        }
        if let Some(pid) = exits {
            // SAFETY: a signal to the hook's process, which the test spawned.
            unsafe { libc::kill(pid.load(Ordering::SeqCst), libc::SIGKILL) };
        }
        conn.write_all(b"HTTP/1.1 200 OK\r\nDate: Sun, 22 Nov 2026 01:19:08 GMT\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK").unwrap();
        request_line.trim_end().to_string()
    });
    (addr, handle)
}

/// A socket table holding the app's listener (uid 1000, not the proxy's user), or nothing.
const APP_LISTENING: &str = "  sl  local_address rem_address   st\n   \
     0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 7\n";
const NOTHING: &str = "  sl  local_address rem_address   st\n";

/// Nobody may connect to `agent` by now.
fn never_asked(agent: &TcpListener) -> bool {
    agent.set_nonblocking(true).unwrap();
    agent.accept().is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock)
}

/// `run --then-quit` with this min-drain on a socket table (in a directory named `name`) where
/// the app listens, and the fake agent it asks (its address; the request it got comes from the
/// handle).
fn quitting(
    name: &str,
    min_drain: &str,
) -> (std::path::PathBuf, String, std::thread::JoinHandle<String>, support::Running) {
    quitting_with(name, min_drain, None)
}

/// `quitting`, its agent ending the hook as it gets the request when `exits`.
fn quitting_with(
    name: &str,
    min_drain: &str,
    exits: Option<Arc<AtomicI32>>,
) -> (std::path::PathBuf, String, std::thread::JoinHandle<String>, support::Running) {
    let dir = temp_dir(name);
    std::fs::write(dir.join("tcp"), APP_LISTENING).unwrap();
    let (agent, request) = fake_agent(exits.clone());
    let hook =
        spawn(watch_table(&dir, &["--min-drain", min_drain, "--then-quit", "--agent", &agent]));
    if let Some(pid) = exits {
        pid.store(hook.pid(), Ordering::SeqCst);
    }
    (dir, agent, request, hook)
}

/// The app of `quitting` exits (its listener leaves the table, replaced whole as the kernel's
/// would be): the hook ends 0 and the agent was asked to stop the proxy.
fn app_exits(
    dir: std::path::PathBuf,
    request: std::thread::JoinHandle<String>,
    hook: support::Running,
) -> support::Finished {
    std::fs::write(dir.join("tcp.next"), NOTHING).unwrap();
    std::fs::rename(dir.join("tcp.next"), dir.join("tcp")).unwrap();
    let out = hook.finish();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(0), "{out}");
    assert_eq!(request.join().unwrap(), "POST /quitquitquit HTTP/1.1");
    out
}

#[test]
fn then_quit_asks_the_agent_to_stop_the_proxy_once_the_app_has_exited() {
    let (dir, agent, request, mut hook) = quitting("cli-quit", "0s");
    hook.expect_line(
        "waiting for the app to exit before asking the Istio agent to stop the proxy: uid 1000: 1 socket still open",
        Duration::from_secs(5),
    );
    let out = app_exits(dir, request, hook);
    assert!(
        out.stderr.contains(&format!(
            "asking the Istio agent to stop the proxy after this summary: POST http://{agent}/quitquitquit"
        )),
        "{out}"
    );
    assert!(out.last_line().contains("done after"), "the summary stays last {out}");
}

#[test]
fn then_quit_writes_its_summary_before_the_agent_can_end_the_container() {
    // Red-team of run, finding 6: the agent (the container's first process) exits at once on
    // /quitquitquit, and every process of the container with it; the summary and the record
    // written after the request were lost (1 run in 60). Here the agent kills the hook as soon
    // as it has the request.
    let pid = Arc::new(AtomicI32::new(0));
    let (dir, _, request, mut hook) = quitting_with("cli-quit-killed", "0s", Some(pid));
    hook.expect_line("waiting for the app to exit", Duration::from_secs(5));
    std::fs::write(dir.join("tcp.next"), NOTHING).unwrap();
    std::fs::rename(dir.join("tcp.next"), dir.join("tcp")).unwrap();
    let out = hook.finish();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(request.join().unwrap(), "POST /quitquitquit HTTP/1.1");
    assert!(out.stderr.contains("done after"), "the summary was written first {out}");
}

#[test]
fn then_quit_keeps_the_proxy_through_the_min_drain_for_an_app_that_closed_its_sockets() {
    // An app that closes every socket at SIGTERM may work on alone and then call out through
    // the proxy: its sockets gone do not stop the proxy before the min-drain ends.
    let (dir, _, request, mut hook) = quitting("cli-quit-early", "3s");
    hook.expect_line("min-drain ends in", Duration::from_secs(5));
    let out = app_exits(dir, request, hook);
    assert!(
        out.elapsed >= Duration::from_secs(3),
        "the proxy was stopped only once the min-drain was over {out}"
    );
    assert!(
        out.stderr.contains("the app has exited: no socket of another user than the proxy's has been in the pod for 800ms, at looks 100ms apart"),
        "{out}"
    );
}

#[test]
fn then_quit_leaves_the_proxy_alone_when_it_never_saw_the_app() {
    // An app without a socket cannot be told from one that has exited.
    let dir = temp_dir("cli-quit-unseen");
    std::fs::write(dir.join("tcp"), NOTHING).unwrap();
    let agent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = agent.local_addr().unwrap().to_string();
    let out = run(watch_table(&dir, &["--min-drain", "0s", "--then-quit", "--agent", &addr]));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(0), "the count was reached {out}");
    assert!(never_asked(&agent), "the agent was not asked to stop the proxy {out}");
    assert!(
        out.stderr.contains("no socket of the app seen while waiting, so its exit cannot be told: not asking the Istio agent to stop the proxy"),
        "{out}"
    );
}

#[test]
fn then_quit_leaves_the_proxy_alone_while_the_app_still_holds_sockets() {
    // The app (uid 1000, not the proxy's user) still listens: it has not exited, and may still
    // call out through the proxy, so the proxy must not be stopped under it.
    let dir = temp_dir("cli-quit-app");
    std::fs::write(dir.join("tcp"), APP_LISTENING).unwrap();
    let agent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = agent.local_addr().unwrap().to_string();
    let out = run(watch_table(
        &dir,
        &["--min-drain", "0s", "--deadline", "1s", "--then-quit", "--agent", &addr],
    ));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(0), "the count was reached {out}");
    assert!(never_asked(&agent), "the agent was not asked to stop the proxy {out}");
    for line in [
        "waiting for the app to exit before asking the Istio agent to stop the proxy: uid 1000: 1 socket still open",
        "the app has not exited by the deadline (uid 1000: 1 socket): not asking the Istio agent to stop the proxy",
    ] {
        assert!(out.stderr.contains(line), "{line:?} {out}");
    }
    assert!(out.last_line().contains("done after"), "{out}");
}

#[test]
fn a_hanging_admin_api_does_not_hold_the_hook_past_its_deadline() {
    let dir = one_open_connection("cli-hang");
    // Connections complete in the backlog but are never accepted: requests get no answer.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = silent.local_addr().unwrap().to_string();
    let out = run(command(&[
        "run",
        "--admin",
        &admin,
        "--proc-net",
        dir.to_str().unwrap(),
        "--deadline",
        "1500ms",
        "--min-drain",
        "0s",
    ]));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        out.stderr.contains("failed to drain listeners")
            && out.stderr.contains("no complete answer within 1s"),
        "{out}"
    );
    assert!(out.stderr.contains("counting from"), "falls back to the socket table {out}");
    assert!(out.elapsed < Duration::from_millis(1500 + 400), "the deadline is hard: {out}");
}

#[test]
fn status_reads_a_pods_socket_table_as_the_fixture_expects() {
    // A REDIRECT pod's table (tests/fixtures/proc-net): IPv4, IPv6 and mapped clients on 15006,
    // the app's call on 15001, Envoy's pools to the app and to 443, the app's own sockets,
    // infrastructure ports and closed sockets. Not a live table: Envoy is told by its owner.
    let out =
        run(command(&["status", "--source", "proc", "--proc-net", "tests/fixtures/proc-net"]));
    assert_eq!(out.code, Some(0), "{out}");
    let want = std::fs::read_to_string("tests/fixtures/proc-net-status.txt").unwrap();
    assert_eq!(out.stdout, want, "{out}");
}

#[test]
fn a_pods_annotations_win_over_the_flags_and_a_bad_one_is_a_warning_not_a_lost_wait() {
    let dir = one_open_connection("cli-annotations");
    let good = run(watch_table(
        &dir,
        &["--deadline=20s", "--min-drain=0s", "--pod-annotation=envoy-drain.io/deadline=400ms"],
    ));
    let bad = run(watch_table(
        &dir,
        &[
            "--deadline=300ms",
            "--min-drain=0s",
            "--pod-annotation=envoy-drain.io/deadline=2 mins please",
            "--pod-annotation=envoy-drain.io/count=streams",
        ],
    ));
    let off = run(watch_table(
        &dir,
        &["--deadline=20s", "--pod-annotation=envoy-drain.io/disabled=true"],
    ));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(good.code, Some(1), "{good}");
    assert!(
        good.last_line().contains("deadline of 400ms passed"),
        "the pod's deadline, not the flag's 20s: {good}"
    );
    // A bad value costs nothing: the hook waits as its flags say, and says what it ignored.
    assert_eq!(bad.code, Some(1), "{bad}");
    assert!(
        bad.stderr.contains(
            "\twarn\tenvoy-drain\tignoring annotation envoy-drain.io/deadline=\"2 mins please\": \
             expected a duration above zero, like 25s, 2m or 1h\n"
        ) && bad.stderr.contains(
            "\twarn\tenvoy-drain\tignoring annotation envoy-drain.io/count=\"streams\": expected \
             connections or requests\n"
        ),
        "{bad}"
    );
    assert!(bad.last_line().contains("deadline of 300ms passed"), "{bad}");
    assert_eq!(off.code, Some(0), "{off}");
    assert_eq!(off.stderr.lines().count(), 1, "the pod's kill switch: {off}");
    assert!(
        off.stderr.contains(
            "annotation envoy-drain.io/disabled=true is set: not draining and not waiting"
        ),
        "{off}"
    );
}

#[test]
fn a_deadline_of_centuries_from_a_flag_or_an_annotation_is_waited_on_without_a_panic() {
    // Once an overflow adding it to the clock's instant (a panic, no summary).
    let dir = temp_dir("cli-centuries");
    std::fs::write(dir.join("tcp"), "  sl  local_address rem_address   st\n").unwrap();
    let most = format!("{}s", u64::MAX);
    let flag = run(watch_table(&dir, &["--deadline", &most, "--min-drain", "0s"]));
    let annotation = run(watch_table(
        &dir,
        &["--min-drain=0s", &format!("--pod-annotation=envoy-drain.io/deadline={most}")],
    ));
    std::fs::remove_dir_all(&dir).unwrap();
    for out in [flag, annotation] {
        assert_eq!(out.code, Some(0), "{out}");
        assert!(out.last_line().contains("done after 0.0s: 0 active connections (proc)"), "{out}");
    }
}
