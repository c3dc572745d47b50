//! The pod shutdown from Istio's graceful-shutdown write-ups, replayed in a replica of a real
//! Istio pod (tests/support/pod.rs): Istio's capture rules, Envoy as the proxy's user with
//! Istio's default stats matcher and an ADS stream to its agent, and an app that calls another
//! service of the mesh on every request. Six long requests are in flight when the pod is deleted;
//! the app gets SIGTERM, stops listening and finishes them. The proxy container then shuts down
//! one of three ways:
//! - `fixed:<s>`: Istio's default: pilot-agent drains, waits terminationDrainDuration, stops Envoy;
//! - `exit-on-zero`: EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true, which also makes Istio enable
//!   downstream_cx_active: pilot-agent drains, waits MINIMUM_DRAIN_DURATION, then stops Envoy
//!   when its poll of the stat reads zero (istio/istio pkg/envoy/agent.go);
//! - `envoy-drain`: envoy-drain as the proxy's preStop hook, on Istio's default stats; after it,
//!   pilot-agent's default shutdown;
//! - `then-quit`: the same with `--then-quit`: the hook asks pilot-agent to stop the proxy at once
//!   (`POST /quitquitquit`), which saves terminationDrainDuration.
//!
//! Run it with `bash examples/demo.sh [MODE...]` (default: all four, fixed:5),
//! which installs Envoy and builds envoy-drain first; it needs root, like the tests.

#[allow(dead_code)]
#[path = "../tests/support"]
mod support {
    pub mod agent;
    pub mod app;
    pub mod envoy;
    pub mod h2;
    pub mod http;
    pub mod netns;
    pub mod pod;
}

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};
use support::http::{Conn, in_flight};
use support::pod::{APP, Capture, Options, Pod, Stats};

/// The long requests in flight when the pod is deleted, in seconds: each is the app's call to
/// the other service.
const REQUESTS: [f64; 6] = [1.0, 2.0, 4.0, 7.0, 9.0, 12.0];

/// Istio's defaults (pilot-agent's terminationDrainDuration and MINIMUM_DRAIN_DURATION, and the
/// drainDuration it passes to Envoy).
const TERMINATION_DRAIN: Duration = Duration::from_secs(5);
const MINIMUM_DRAIN: Duration = Duration::from_secs(5);
const DRAIN_DURATION_S: u32 = 45;
/// How often pilot-agent polls the stat with EXIT_ON_ZERO_ACTIVE_CONNECTIONS.
const POLL: Duration = Duration::from_secs(1);

#[derive(Clone, Copy)]
enum Mode {
    Fixed(Duration),
    ExitOnZero,
    EnvoyDrain,
    ThenQuit,
}

impl Mode {
    fn name(self) -> String {
        match self {
            Mode::Fixed(d) => format!("Istio default, {}s drain", d.as_secs()),
            Mode::ExitOnZero => "EXIT_ON_ZERO_ACTIVE_CONNECTIONS".to_string(),
            Mode::EnvoyDrain => "envoy-drain preStop".to_string(),
            Mode::ThenQuit => "envoy-drain preStop --then-quit".to_string(),
        }
    }
}

struct Row {
    mode: String,
    ok: usize,
    failed: usize,
    /// From the pod's deletion until Envoy was stopped.
    proxy_stopped: Duration,
    /// From the last successful response until the drain policy decided the proxy may stop.
    waited_after_last: Option<Duration>,
}

fn main() {
    let modes = match parse_modes() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("demo: {e}");
            std::process::exit(2);
        }
    };
    let envoy = match support::envoy::binary() {
        Ok(bin) => bin,
        Err(why) => {
            eprintln!("demo: {why}; run it as `bash examples/demo.sh`, which installs Envoy");
            std::process::exit(2);
        }
    };
    let drain = PathBuf::from(
        std::env::var_os("ENVOY_DRAIN").unwrap_or_else(|| "target/release/envoy-drain".into()),
    );
    let rows: Vec<Row> = modes
        .into_iter()
        .map(|m| replay(m, &envoy, &drain))
        .collect();
    println!();
    println!(
        "{:<32} {:>9} {:>6} {:>13} {:>28}",
        "pod shutdown", "succeeded", "failed", "proxy stopped", "drain ended after last reply"
    );
    for r in rows {
        println!(
            "{:<32} {:>9} {:>6} {:>12.1}s {:>28}",
            r.mode,
            format!("{}/{}", r.ok, r.ok + r.failed),
            r.failed,
            r.proxy_stopped.as_secs_f64(),
            r.waited_after_last
                .map(|d| format!("{:.2}s", d.as_secs_f64()))
                .unwrap_or_else(|| "-".to_string())
        );
    }
}

fn parse_modes() -> Result<Vec<Mode>, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        return Ok(vec![
            Mode::Fixed(TERMINATION_DRAIN),
            Mode::ExitOnZero,
            Mode::EnvoyDrain,
            Mode::ThenQuit,
        ]);
    }
    args.iter()
        .map(|a| match a.as_str() {
            "envoy-drain" => Ok(Mode::EnvoyDrain),
            "exit-on-zero" => Ok(Mode::ExitOnZero),
            "then-quit" => Ok(Mode::ThenQuit),
            other => other
                .strip_prefix("fixed:")
                .and_then(|s| s.parse::<u64>().ok())
                .map(|s| Mode::Fixed(Duration::from_secs(s)))
                .ok_or_else(|| {
                    format!(
                        "unknown mode '{other}': expected fixed:<seconds>, exit-on-zero, envoy-drain or then-quit"
                    )
                }),
        })
        .collect()
}

fn replay(mode: Mode, envoy: &Path, drain: &Path) -> Row {
    println!("\n== {}", mode.name());
    let stats = match mode {
        Mode::ExitOnZero => Stats::ExitOnZero,
        _ => Stats::IstioDefault,
    };
    let options = Options {
        capture: Capture::Redirect,
        stats,
        on_sigterm: "close",
        drain_time_s: DRAIN_DURATION_S,
        ..Options::default()
    };
    let mut pod = Pod::start(envoy, drain, options);
    // Earlier traffic: Envoy's pools to the app and to the other service stay open.
    let warm = pod.client(|| Conn::open(APP).and_then(|mut c| c.get("/call/0")));
    println!("earlier request: {:?}", warm.map(|r| r.status));
    pod.app_event("answered /call/0", Duration::from_secs(10));
    let requests: Vec<_> = REQUESTS
        .iter()
        .map(|s| pod.client(|| in_flight(APP, &format!("/call/{s}"))))
        .collect();
    for _ in REQUESTS {
        pod.app_event("received /call/", Duration::from_secs(10));
    }
    println!(
        "{} requests in flight ({REQUESTS:?} s); the pod is deleted",
        REQUESTS.len()
    );
    let deleted = Instant::now();
    pod.sigterm_app();

    let drain_ended = match mode {
        Mode::Fixed(d) => {
            pilot_agent_drain(&pod);
            println!("pilot-agent: drained; stopping Envoy in {}s", d.as_secs());
            thread::sleep(d);
            None
        }
        Mode::ExitOnZero => {
            pilot_agent_drain(&pod);
            println!(
                "pilot-agent: drained; waiting {}s, then for zero active connections",
                MINIMUM_DRAIN.as_secs()
            );
            thread::sleep(MINIMUM_DRAIN);
            exit_on_zero(&pod);
            Some(Instant::now())
        }
        Mode::EnvoyDrain | Mode::ThenQuit => {
            let hook: &[&str] = match mode {
                Mode::ThenQuit => &["run", "--then-quit"],
                _ => &["run"],
            };
            println!(
                "kubelet runs the preStop hook: envoy-drain {}",
                hook.join(" ")
            );
            let status = pod.hook(hook).status();
            let ended = Instant::now();
            println!("preStop hook ended: {status:?}");
            if pod.agent_asked_to_quit() {
                println!("pilot-agent: asked to quit; stopping Envoy now");
            } else {
                println!("kubelet sends SIGTERM to istio-proxy");
                pilot_agent_drain(&pod);
                println!(
                    "pilot-agent: drained; stopping Envoy in {}s",
                    TERMINATION_DRAIN.as_secs()
                );
                thread::sleep(TERMINATION_DRAIN);
            }
            Some(ended)
        }
    };
    pod.stop_envoy();
    let proxy_stopped = deleted.elapsed();
    println!("Envoy stopped after {:.1}s", proxy_stopped.as_secs_f64());

    let mut ok = 0;
    let mut last_ok: Option<Instant> = None;
    for (req, secs) in requests.into_iter().zip(REQUESTS) {
        match req.join() {
            Ok(Ok((resp, at))) if resp.status == 200 => {
                ok += 1;
                last_ok = Some(last_ok.map_or(at, |l| l.max(at)));
                println!("  {secs:>4}s request: 200 {}", resp.body.trim());
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
        waited_after_last: drain_ended
            .zip(last_ok)
            .filter(|_| ok == REQUESTS.len())
            .map(|(end, last)| end.saturating_duration_since(last)),
    }
}

/// What pilot-agent does first on SIGTERM: ask Envoy to drain its inbound listeners (status not
/// checked).
fn pilot_agent_drain(pod: &Pod) {
    let _ = pod.inside(|| {
        Conn::open("127.0.0.1:15000")
            .and_then(|mut c| c.request("POST", "/drain_listeners?inboundonly&graceful"))
    });
}

/// pilot-agent's EXIT_ON_ZERO_ACTIVE_CONNECTIONS loop (istio/istio pkg/envoy/agent.go,
/// activeProxyConnections): every second, sum `listener.*.downstream_cx_active` without the
/// per-worker lines, internal listeners and its own known listeners; stop at zero, when the
/// answer is empty, or after five failed polls in a row.
fn exit_on_zero(pod: &Pod) {
    let known = [
        "listener.0.0.0.0_15021.downstream_cx_active",
        "listener.0.0.0.0_15090.downstream_cx_active",
        "listener.admin.downstream_cx_active",
        "listener.admin.main_thread.downstream_cx_active",
    ];
    let mut failures = 0;
    loop {
        let answer = pod.inside(|| {
            Conn::open("127.0.0.1:15000")
                .and_then(|mut c| c.get("/stats?usedonly&filter=downstream_cx_active$"))
        });
        match answer {
            Err(e) => {
                failures += 1;
                println!("pilot-agent: unable to get listener stats from Envoy: {e}");
                if failures > 4 {
                    return;
                }
            }
            Ok(r) if r.body.is_empty() => {
                println!("pilot-agent: downstream_cx_active are not available; stopping");
                return;
            }
            Ok(r) => {
                failures = 0;
                let active: u64 = r
                    .body
                    .lines()
                    .filter_map(|l| l.split_once(':'))
                    .filter(|(name, _)| {
                        name.starts_with("listener.")
                            && !name.contains("worker_")
                            && !name.starts_with("listener.envoy_internal_")
                            && !known.contains(name)
                    })
                    .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
                    .sum();
                if active == 0 {
                    println!("pilot-agent: there are no more active connections; stopping");
                    return;
                }
                println!("pilot-agent: there are still {active} active connections");
            }
        }
        thread::sleep(POLL);
    }
}
