//! The demo: a pod with an Istio sidecar is deleted while a client keeps calling its service (100
//! short requests a second through the client's own sidecar, which learns of the deletion over
//! EDS 2 s late) and three 10 s requests are in flight at it; the app is graceful. The proxy
//! container shuts down as Istio does by default, as EXIT_ON_ZERO_ACTIVE_CONNECTIONS does, and
//! with envoy-drain as the injection template sets it up, without and with `--then-quit`. These
//! are the top rows of the mesh's table (examples/mesh.rs, BENCHMARKS.md), from the same code
//! (tests/support/mesh.rs).
//!
//! Run it with `bash examples/demo.sh [MODE...]` (default: istio exit-on-zero envoy-drain
//! then-quit; also `requests`), which installs Envoy and the tools and builds envoy-drain first;
//! it needs root, like the tests.

#[allow(dead_code)]
#[path = "../tests/support"]
mod support {
    pub mod agent;
    pub mod app;
    pub mod envoy;
    pub mod h2;
    pub mod http;
    pub mod kubelet;
    pub mod mesh;
    pub mod netns;
    pub mod pod;
    pub mod running;
}

use std::path::PathBuf;
use std::time::Duration;
use support::kubelet::Ordering;
use support::mesh::{AppKind, Load, Mode, Scenario};

fn main() {
    let modes = match parse_modes() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("demo: {e}");
            std::process::exit(2);
        }
    };
    let envoy = support::envoy::binary().unwrap_or_else(|why| {
        eprintln!("demo: {why}; run it as `bash examples/demo.sh`, which installs Envoy");
        std::process::exit(2);
    });
    let hook = PathBuf::from(
        std::env::var_os("ENVOY_DRAIN").unwrap_or_else(|| "target/release/envoy-drain".into()),
    );
    let rows: Vec<_> = modes
        .into_iter()
        .map(|mode| {
            let scenario = Scenario {
                ordering: Ordering::Classic,
                app: AppKind::Graceful,
                mode,
                propagation: Duration::from_secs(2),
                load: Load::Http1,
            };
            eprintln!("== {}", mode.name(Ordering::Classic));
            support::mesh::run(&envoy, &hook, scenario)
        })
        .collect();
    print!("{}", support::mesh::short_table(&rows));
}

fn parse_modes() -> Result<Vec<Mode>, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        return Ok(vec![
            Mode::Istio,
            Mode::ExitOnZero,
            Mode::EnvoyDrain,
            Mode::ThenQuit,
        ]);
    }
    args.iter()
        .map(|a| match a.as_str() {
            "istio" => Ok(Mode::Istio),
            "exit-on-zero" => Ok(Mode::ExitOnZero),
            "envoy-drain" => Ok(Mode::EnvoyDrain),
            "requests" => Ok(Mode::Requests),
            "then-quit" => Ok(Mode::ThenQuit),
            other => Err(format!(
                "unknown mode '{other}': expected istio, exit-on-zero, envoy-drain, requests or then-quit"
            )),
        })
        .collect()
}
