//! Logging never holds the hook: a log file that is a FIFO nobody reads does not hang its open, a
//! pipe whose reader stalls gets what fits and the rest is dropped and counted, and the summary and
//! the exit on SIGTERM come at once whatever stderr or the log file do.

mod support;

use std::ffi::CString;
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::process::Stdio;
use std::time::{Duration, Instant};
use support::{one_open_connection, run, spawn, watch_table};

/// `run` on a table with one open connection, no Envoy, so it waits; with `extra` flags.
fn waiting(dir: &std::path::Path, extra: &[&str]) -> std::process::Command {
    let mut args = vec!["--min-drain", "0s"];
    args.extend_from_slice(extra);
    watch_table(dir, &args)
}

fn fifo(path: &std::path::Path) {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid path and mode.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

#[test]
fn a_log_file_that_is_a_fifo_nobody_reads_does_not_hang_the_open() {
    // Before, open() blocked until a reader came, before signals were even taken.
    let dir = one_open_connection("logs-fifo");
    let log = dir.join("hook.log");
    fifo(&log);
    let out = run(waiting(&dir, &["--deadline", "1s", "--log-file", log.to_str().unwrap()]));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(1), "a deadline with one connection open {out}");
    assert!(
        out.stderr.contains(&format!(
            "failed to open log file {}: nothing reads it; logging to stderr only",
            log.display()
        )),
        "{out}"
    );
    assert!(out.elapsed < Duration::from_secs(3), "{out}");
}

/// A run that logs a line a millisecond to `log` and waits for 30 s.
fn chatty(dir: &std::path::Path, log: &std::path::Path) -> std::process::Command {
    let log = log.to_str().unwrap();
    waiting(dir, &["--deadline", "30s", "--interval", "1ms", "--verbose", "--log-file", log])
}

/// SIGTERM to the run once `seen` says it is going, and its exit within a second.
fn sigterm(r: support::Running) -> support::Finished {
    let sent = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(r.pid(), libc::SIGTERM) };
    let out = r.finish();
    assert_eq!(out.code, Some(143), "{out}");
    assert!(
        out.ended.saturating_duration_since(sent) < Duration::from_secs(1),
        "exited {:?} after SIGTERM {out}",
        out.ended.saturating_duration_since(sent)
    );
    out
}

#[test]
fn a_log_pipe_whose_reader_stalls_drops_lines_counts_them_and_holds_nothing() {
    // Before, write() blocked once the pipe was full, and SIGTERM could not end the hook.
    let dir = one_open_connection("logs-stall");
    let log = dir.join("hook.log");
    fifo(&log);
    // A reader that never reads, its pipe shrunk to one page.
    let reader = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&log).unwrap();
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(reader.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) };
    let mut r = spawn(chatty(&dir, &log));
    // Thousands of lines a second against a page of pipe: most cannot be written.
    r.expect_line("1 active connection (proc)", Duration::from_secs(10));
    for _ in 0..200 {
        r.expect_line("1 active connection (proc)", Duration::from_secs(10));
    }
    let out = sigterm(r);
    drop(reader);
    std::fs::remove_dir_all(&dir).unwrap();
    let last = out.last_line();
    assert!(last.contains("interrupted by SIGTERM after"), "{out}");
    assert!(
        last.contains("earlier log lines were dropped, as writing them would have blocked"),
        "the summary says how many lines were lost {out}"
    );
}

#[test]
fn a_stderr_nobody_reads_holds_neither_the_counting_nor_the_exit() {
    // Before, the main thread blocked in write() on stderr holding the logger, and the summary
    // and exit of a SIGTERM waited behind it.
    let dir = one_open_connection("logs-stderr");
    let log = dir.join("hook.log");
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors that we then own.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (read_end, write_end) = unsafe {
        use std::os::fd::{FromRawFd, OwnedFd};
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    };
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 4096) };
    let mut cmd = chatty(&dir, &log);
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::from(write_end)).spawn().unwrap();
    // It keeps counting while stderr is full: the log file grows past what a page holds.
    let lines = || std::fs::read_to_string(&log).unwrap_or_default().lines().count();
    let until = Instant::now() + Duration::from_secs(10);
    while lines() < 500 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(lines() >= 500, "counting went on: {} lines", lines());
    let sent = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if sent.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = sent.elapsed();
    drop(read_end);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(143), "{text}");
    assert!(took < Duration::from_secs(1), "exited {took:?} after SIGTERM");
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.contains("interrupted by SIGTERM")
            && last.contains("earlier log lines were dropped, as writing them would have blocked"),
        "{last}"
    );
}

#[test]
fn a_json_log_is_an_object_a_line_and_its_summary_is_the_terminations_record() {
    // One open connection and no Envoy: a run to its deadline, every line JSON (python's parser
    // judges), the last the record with the outcome, the exit code and the count.
    let dir = one_open_connection("logs-json");
    let out = run(waiting(&dir, &["--deadline", "1s", "--log-format", "json"]));
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.code, Some(1), "{out}");
    let check = "import json, sys\n\
                 lines = [json.loads(l) for l in sys.stdin]\n\
                 assert all(l['logger'] == 'envoy-drain' and l['msg'] for l in lines), lines\n\
                 last = lines[-1]\n\
                 print(last['event'], last['command'], last['outcome'], last['exit_code'], \
                 last['count'], last['count_source'], last['deadline_ms'], len(lines))\n";
    let mut python = std::process::Command::new("python3")
        .args(["-c", check])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    use std::io::Write;
    python.stdin.take().unwrap().write_all(out.stderr.as_bytes()).unwrap();
    let parsed = python.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&parsed.stdout);
    assert!(parsed.status.success(), "{}{out}", String::from_utf8_lossy(&parsed.stderr));
    assert!(said.starts_with("summary run deadline 1 1 proc 1000 "), "{said}{out}");
}
