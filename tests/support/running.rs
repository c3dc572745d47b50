//! Running a command whose stderr is read line by line as it comes: envoy-drain in the tests, the
//! hook in the kubelet stand-in. On failure, a finished run prints its command, exit status,
//! stdout and stderr at once.

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::thread;
use std::time::{Duration, Instant};

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

    /// The time between counts at the end: `given`, or what the hook last paced it to when
    /// counts cost more (`counting every 698ms instead of every 200ms: ...`).
    pub fn interval(&self, given: Duration) -> Duration {
        let paced = self.stderr.lines().rev().find_map(|l| {
            let every = l.split("counting every ").nth(1)?.split(" instead of").next()?;
            humantime::parse_duration(every).ok()
        });
        paced.unwrap_or(given)
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
    Running { command, child: Some(child), started, lines, seen: Vec::new(), stdout: Some(stdout) }
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
    pub fn finish(self) -> Finished {
        let until = self.started + HARD_LIMIT;
        self.finish_by(until)
    }

    /// The same, killing it at `until`.
    pub fn finish_by(mut self, until: Instant) -> Finished {
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
            stdout: self.stdout.take().and_then(|h| h.join().ok()).unwrap_or_default(),
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
