//! Helpers for black-box tests: run the real binary with a time limit, read its log as it is
//! written, and keep a test's sockets in a network namespace of its own. On failure, a finished
//! run prints its command, exit status, stdout and stderr at once.

#![allow(dead_code)] // each test crate uses a different part of this module

pub mod agent;
pub mod app;
pub mod envoy;
pub mod h2;
pub mod hostile;
pub mod http;
pub mod netns;
pub mod pod;

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::thread;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_envoy-drain");

/// No test process may outlive this, whatever happens.
pub const HARD_LIMIT: Duration = Duration::from_secs(60);

pub struct Finished {
    pub command: String,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// When the process was seen to exit.
    pub ended: Instant,
}

impl fmt::Display for Finished {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "\ncommand: {}\nexit: {:?} after {:?}\n--- stdout\n{}--- stderr\n{}---",
            self.command, self.code, self.elapsed, self.stdout, self.stderr
        )
    }
}

impl Finished {
    /// The last line of the log: the summary.
    pub fn last_line(&self) -> &str {
        self.stderr.lines().last().unwrap_or_default()
    }

    /// The count lines of the log, in order: `3 active connections (stats)`.
    pub fn counts(&self) -> Vec<String> {
        self.stderr
            .lines()
            .filter_map(|l| l.split('\t').nth(3))
            .filter(|m| m.starts_with(|c: char| c.is_ascii_digit()) && m.contains(" active "))
            .map(|m| m.split(';').next().unwrap_or_default().to_string())
            .collect()
    }
}

/// A running envoy-drain whose stderr is read line by line as it comes. Killed when dropped.
pub struct Running {
    command: String,
    /// Taken by `finish`; a `Running` dropped before that kills the process.
    child: Option<Child>,
    started: Instant,
    lines: Receiver<String>,
    seen: Vec<String>,
    stdout: Option<thread::JoinHandle<String>>,
}

/// A fresh, empty directory for one test (named after it and this process); the test removes it.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("envoy-drain-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("a temporary directory");
    d
}

/// A directory for `--proc-net` whose socket table always shows one open connection, accepted on
/// port 8080: a wait on it lasts until the deadline or a signal.
pub fn one_open_connection(name: &str) -> std::path::PathBuf {
    let d = temp_dir(name);
    std::fs::write(
        d.join("tcp"),
        "  sl  local_address rem_address   st\n   \
         0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n   \
         1: 0100007F:1F90 0200007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2\n",
    )
    .expect("the fixture table");
    d
}

pub fn command(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("ENVOY_DRAIN_DISABLED")
        .env_remove("MINIMUM_DRAIN_DURATION")
        .stdin(Stdio::null());
    c
}

/// `run` counting only from the kernel's socket table, with no Envoy to drain, and `extra` flags.
pub fn watch_sockets(extra: &[&str]) -> Command {
    command(&[&["run", "--source", "proc", "--drain", "none"], extra].concat())
}

/// The same, reading the text tables in `dir`.
pub fn watch_table(dir: &std::path::Path, extra: &[&str]) -> Command {
    let dir = dir.to_str().expect("a UTF-8 temporary path");
    watch_sockets(&[&["--proc-net", dir], extra].concat())
}

/// A listener on loopback and `n` connections to it: both ends of each stay open while these
/// live.
pub struct Held {
    pub port: u16,
    pub listener: std::net::TcpListener,
    pub ends: Vec<(std::net::TcpStream, std::net::TcpStream)>,
}

pub fn hold(n: usize) -> Held {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    let ends = (0..n)
        .map(|_| {
            let client = std::net::TcpStream::connect(("127.0.0.1", port)).expect("a connection");
            let (server, _) = listener.accept().expect("its other end");
            (client, server)
        })
        .collect();
    Held {
        port,
        listener,
        ends,
    }
}

pub fn spawn(mut cmd: Command) -> Running {
    let command = format!("{cmd:?}");
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().expect("failed to start envoy-drain");
    let (tx, lines) = channel();
    let err = child.stderr.take().unwrap();
    thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut out = child.stdout.take().unwrap();
    let stdout = thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    Running {
        command,
        child: Some(child),
        started,
        lines,
        seen: Vec::new(),
        stdout: Some(stdout),
    }
}

/// `run --count requests` reacting fast: what the HTTP/2 tests start with their streams in flight.
pub const RUN_REQUESTS: [&str; 7] = [
    "run",
    "--count",
    "requests",
    "--min-drain",
    "0s",
    "--interval",
    "100ms",
];

/// Runs `cmd` (`RUN_REQUESTS` while the three HTTP/2 requests of `h2` are in flight) and checks
/// that it counted the three and ended at 0 from `source` once they were answered.
pub fn counts_three_streams_then_zero(cmd: Command, h2: &http::H2, source: &str) {
    let out = run(cmd);
    h2.wait_answered(3, Duration::from_secs(10));
    assert_eq!(out.code, Some(0), "{out}");
    assert_eq!(
        out.counts().first().map(String::as_str),
        Some(format!("3 active requests ({source})").as_str()),
        "{out}"
    );
    assert!(
        out.last_line()
            .contains(&format!("0 active requests ({source})")),
        "the idle h2 connection does not count {out}"
    );
}

/// Runs to the end (killed at `HARD_LIMIT`).
pub fn run(cmd: Command) -> Finished {
    spawn(cmd).finish()
}

impl Running {
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// Waits for a log line containing `text` and returns it; fails the test, showing the log so
    /// far, when none comes within `limit`.
    pub fn expect_line(&mut self, text: &str, limit: Duration) -> String {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(text) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => panic!(
                    "no log line containing {text:?} within {limit:?}\ncommand: {}\nlog so far:\n{}",
                    self.command,
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Waits for the process to exit (killing it at `HARD_LIMIT`) and collects its output.
    pub fn finish(mut self) -> Finished {
        let until = self.started + HARD_LIMIT;
        let mut child = self.child.take().expect("finished twice");
        let mut stderr = std::mem::take(&mut self.seen);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => stderr.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    break;
                }
            }
        }
        let status = child.wait().expect("failed to wait for envoy-drain");
        Finished {
            command: std::mem::take(&mut self.command),
            code: status.code(),
            stdout: self
                .stdout
                .take()
                .and_then(|h| h.join().ok())
                .unwrap_or_default(),
            stderr: stderr.iter().map(|l| format!("{l}\n")).collect(),
            elapsed: self.started.elapsed(),
            ended: Instant::now(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
