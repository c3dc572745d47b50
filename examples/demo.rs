//! The experiment from Istio's graceful-shutdown write-ups, replayed on one machine: a real Envoy
//! shaped like a sidecar in front of a slow app, a handful of long requests in flight, then the
//! pod's deletion. First as Istio does it by default (drain, wait a fixed terminationDrainDuration,
//! stop Envoy), then with envoy-drain as the proxy's preStop hook. Run it with
//! `bash examples/demo.sh`, which installs Envoy and builds envoy-drain first.
//!
//! Usage: demo [MODE...] where MODE is `fixed:<seconds>` (Istio's default with that
//! terminationDrainDuration) or `envoy-drain`; default: `fixed:5 envoy-drain`.

#[allow(dead_code)]
#[path = "../tests/support"]
mod support {
    pub mod app;
    pub mod envoy;
    pub mod http;
    pub mod netns;
}

use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};
use support::app::App;
use support::envoy::{APP, Envoy, INBOUND, Options};
use support::http::{Conn, in_flight};

/// The long requests in flight when the pod is deleted, in seconds.
const REQUESTS: [f64; 6] = [1.0, 2.0, 4.0, 7.0, 9.0, 12.0];

/// Istio's sidecar defaults (REFERENCE.md, section 2).
const DRAIN_DURATION_S: u32 = 45;
const TERMINATION_DRAIN: Duration = Duration::from_secs(5);

#[derive(Clone, Copy)]
enum Mode {
    /// pilot-agent alone: drain, sleep this long, kill Envoy.
    Fixed(Duration),
    /// envoy-drain as the preStop hook, then pilot-agent's default 5 s.
    EnvoyDrain,
}

impl Mode {
    fn name(self) -> String {
        match self {
            Mode::Fixed(d) => format!("Istio default, {}s drain", d.as_secs()),
            Mode::EnvoyDrain => "envoy-drain preStop".to_string(),
        }
    }
}

struct Row {
    mode: String,
    ok: usize,
    failed: usize,
    /// From the pod's deletion until Envoy was stopped.
    proxy_stopped: Duration,
    /// From the last successful response until envoy-drain let the proxy stop.
    hook_after_last: Option<Duration>,
}

fn main() {
    let modes: Vec<Mode> = match parse_modes() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("demo: {e}");
            std::process::exit(2);
        }
    };
    let Some(envoy) = support::envoy::binary() else {
        eprintln!("demo: run it as `bash examples/demo.sh`, which installs Envoy");
        std::process::exit(2);
    };
    let drain = PathBuf::from(
        std::env::var_os("ENVOY_DRAIN").unwrap_or_else(|| "target/release/envoy-drain".into()),
    );
    // Istio's real ports, in a network namespace of the demo's own.
    let rows = support::netns::in_private_netns(move || {
        modes
            .into_iter()
            .map(|m| replay(m, &envoy, &drain))
            .collect::<Vec<_>>()
    });
    println!();
    println!(
        "{:<28} {:>9} {:>7} {:>15} {:>26}",
        "pod shutdown", "succeeded", "failed", "proxy stopped", "hook ended after last reply"
    );
    for r in rows {
        println!(
            "{:<28} {:>9} {:>7} {:>14.1}s {:>26}",
            r.mode,
            format!("{}/{}", r.ok, r.ok + r.failed),
            r.failed,
            r.proxy_stopped.as_secs_f64(),
            r.hook_after_last
                .map(|d| format!("{:.2}s", d.as_secs_f64()))
                .unwrap_or_else(|| "-".to_string())
        );
    }
}

fn parse_modes() -> Result<Vec<Mode>, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        return Ok(vec![Mode::Fixed(TERMINATION_DRAIN), Mode::EnvoyDrain]);
    }
    args.iter()
        .map(|a| match a.as_str() {
            "envoy-drain" => Ok(Mode::EnvoyDrain),
            other => other
                .strip_prefix("fixed:")
                .and_then(|s| s.parse::<u64>().ok())
                .map(|s| Mode::Fixed(Duration::from_secs(s)))
                .ok_or_else(|| {
                    format!("unknown mode '{other}': expected fixed:<seconds> or envoy-drain")
                }),
        })
        .collect()
}

fn replay(mode: Mode, envoy_bin: &std::path::Path, drain_bin: &std::path::Path) -> Row {
    println!("\n== {}", mode.name());
    let app = App::start(APP, false);
    let mut envoy = Envoy::start(
        envoy_bin,
        Options {
            drain_time_s: DRAIN_DURATION_S,
            merge: None,
        },
    );
    let requests: Vec<_> = REQUESTS
        .iter()
        .map(|s| in_flight(INBOUND, &format!("/delay/{s}")))
        .collect();
    app.wait_received(REQUESTS.len(), Duration::from_secs(10));
    let deleted = Instant::now();
    println!(
        "{} requests in flight ({REQUESTS:?} s); the pod is deleted",
        REQUESTS.len()
    );

    let hook_ended = match mode {
        Mode::Fixed(_) => None,
        Mode::EnvoyDrain => {
            println!("kubelet runs the preStop hook: {} run", drain_bin.display());
            let status = Command::new(drain_bin)
                .arg("run")
                .status()
                .expect("failed to start envoy-drain");
            println!("preStop hook exited with {status}");
            Some(Instant::now())
        }
    };
    // SIGTERM to pilot-agent: drain (status unchecked), sleep terminationDrainDuration, kill Envoy.
    let _ = Conn::open(support::envoy::ADMIN)
        .and_then(|mut c| c.request("POST", "/drain_listeners?inboundonly&graceful"));
    let wait = match mode {
        Mode::Fixed(d) => d,
        Mode::EnvoyDrain => TERMINATION_DRAIN,
    };
    println!(
        "pilot-agent drains and waits {}s, then stops Envoy",
        wait.as_secs()
    );
    thread::sleep(wait);
    envoy.kill();
    let proxy_stopped = deleted.elapsed();

    let mut ok = 0;
    let mut last_ok = None;
    for (req, secs) in requests.into_iter().zip(REQUESTS) {
        match req.join() {
            Ok(Ok((resp, at))) if resp.status == 200 => {
                ok += 1;
                last_ok = Some(last_ok.map_or(at, |l: Instant| l.max(at)));
                println!(
                    "  {secs:>4}s request: {} {}",
                    resp.status,
                    resp.header("connection").unwrap_or("")
                );
            }
            Ok(Ok((resp, _))) => println!("  {secs:>4}s request: failed with {}", resp.status),
            Ok(Err(e)) => println!("  {secs:>4}s request: failed: {e}"),
            Err(_) => println!("  {secs:>4}s request: failed"),
        }
    }
    Row {
        mode: mode.name(),
        ok,
        failed: REQUESTS.len() - ok,
        proxy_stopped,
        hook_after_last: hook_ended
            .zip(last_ok)
            .map(|(h, l)| h.saturating_duration_since(l)),
    }
}
