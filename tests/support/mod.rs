//! Helpers for black-box tests: run the real binary with a time limit, read its log as it is
//! written (running.rs), and keep a test's sockets in a network namespace of its own.

#![allow(dead_code)] // each test crate uses a different part of this module

pub mod agent;
pub mod app;
pub mod built;
pub mod cluster;
pub mod data_plane;
pub mod envoy;
pub mod h2;
pub mod hostile;
pub mod http;
pub mod kubelet;
pub mod mesh;
pub mod netns;
pub mod node;
pub mod pod;
pub mod rollout;
pub mod running;
pub mod ztunnel;

#[allow(unused_imports)] // as above
pub use running::{Finished, Running, run, spawn};

use std::process::{Command, Stdio};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_envoy-drain");

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
        .env_remove("ENVOY_SECURE_METRICS_PORT")
        .env_remove("ENVOY_SECURE_MERGED_METRICS_PORT")
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
    Held { port, listener, ends }
}

/// `run --count requests` reacting fast: what the HTTP/2 tests start with their streams in flight.
pub const RUN_REQUESTS: [&str; 7] =
    ["run", "--count", "requests", "--min-drain", "0s", "--interval", "100ms"];

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
        out.last_line().contains(&format!("0 active requests ({source})")),
        "the idle h2 connection does not count {out}"
    );
}
