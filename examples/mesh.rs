//! The mesh's table: requests that fail while a pod is deleted under live traffic
//! (tests/support/mesh.rs), one row per kubelet ordering x app kind x proxy shutdown x propagation
//! delay. Arguments narrow it down: any of `classic`, `native`, an app kind (`graceful`, `nginx`,
//! `sleep`, `flush`), a mode (`istio`, `exit-on-zero`, `envoy-drain`, `requests`, `plain`), a
//! propagation delay (`2s`, `10s`, `30s`, where the pod's grace period is 60 s), `http2` (h2load
//! instead of hey), the app's preStop (`own`, its own: none, or `sleep 5` for `sleep`; `hold`:
//! `envoy-drain hold`, never with `sleep`, whose app is nginx's; default `own`); several of one
//! sort are all run. Run it with `bash examples/mesh.sh [ARG...]`, as root.
//!
//! `demo` first: the demo (`bash examples/demo.sh`), the table's top rows (classic ordering,
//! graceful app, 2 s) for Istio's default, EXIT_ON_ZERO and envoy-drain as the template sets it
//! unless modes are named, in a short table.

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

/// The propagation delays of the table: istiod's usual EDS push, and a slow one (large clusters,
/// cloud load balancers) longer than any min-drain.
const PROPAGATIONS: [u64; 2] = [2, 10];

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let demo = args.first().is_some_and(|a| a == "demo");
    if demo {
        args[0] = "classic".to_string();
        args.extend(["graceful", "2s"].map(String::from));
        if !args.iter().any(|a| is_mode(a)) {
            args.extend(["istio", "exit-on-zero", "envoy-drain"].map(String::from));
        }
    }
    let scenarios = match scenarios(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mesh: {e}");
            std::process::exit(2);
        }
    };
    let envoy = support::envoy::binary().unwrap_or_else(|why| {
        eprintln!("mesh: {why}; run it as `bash examples/mesh.sh`, which installs Envoy");
        std::process::exit(2);
    });
    let hook = PathBuf::from(
        std::env::var_os("ENVOY_DRAIN").unwrap_or_else(|| "target/release/envoy-drain".into()),
    );
    let mut rows = Vec::new();
    for (i, s) in scenarios.iter().enumerate() {
        let row = support::mesh::run(&envoy, &hook, *s);
        eprintln!(
            "[{}/{}] {}",
            i + 1,
            scenarios.len(),
            support::mesh::table(std::slice::from_ref(&row)).lines().last().unwrap_or_default()
        );
        let d = &row.deletion;
        let at = |t: std::time::Instant| t.saturating_duration_since(d.deleted).as_secs_f64();
        let summary = |h: &support::running::Finished| {
            h.last_line().split('\t').next_back().unwrap_or_default().to_string()
        };
        eprintln!(
            "      app exited at {:.1}s, proxy stopped at {:.1}s{}{}",
            at(d.app_exited),
            at(d.proxy_stopped),
            d.app_hook.as_ref().map_or(String::new(), |h| format!(
                ", hold ended at {:.1}s: {}",
                at(h.ended),
                summary(h)
            )),
            d.hook.as_ref().map_or(String::new(), |h| format!(
                ", hook ended at {:.1}s: {}",
                at(h.ended),
                row.hook_summary.as_deref().unwrap_or_default()
            ))
        );
        rows.push(row);
    }
    if demo {
        print!("{}", support::mesh::short_table(&rows));
    } else {
        print!("{}", support::mesh::table(&rows));
    }
}

fn is_mode(arg: &str) -> bool {
    matches!(arg, "istio" | "exit-on-zero" | "envoy-drain" | "requests" | "plain")
}

/// The scenarios the arguments select, in the table's order.
fn scenarios(args: Vec<String>) -> Result<Vec<Scenario>, String> {
    let mut orderings = Vec::new();
    let mut apps = Vec::new();
    let mut modes = Vec::new();
    let mut propagations = Vec::new();
    let mut http2 = false;
    let mut holds = Vec::new();
    for a in &args {
        match a.as_str() {
            "classic" => orderings.push(Ordering::Classic),
            "native" => orderings.push(Ordering::Native),
            "graceful" => apps.push(AppKind::Graceful),
            "nginx" => apps.push(AppKind::Nginx),
            "sleep" => apps.push(AppKind::Sleep5),
            "flush" => apps.push(AppKind::Flush),
            "istio" => modes.push(Mode::Istio),
            "exit-on-zero" => modes.push(Mode::ExitOnZero),
            "envoy-drain" => modes.push(Mode::EnvoyDrain),
            "requests" => modes.push(Mode::Requests),
            "plain" => modes.push(Mode::Plain),
            "http2" => http2 = true,
            "own" => holds.push(false),
            "hold" => holds.push(true),
            other => match other.strip_suffix('s').and_then(|n| n.parse::<u64>().ok()) {
                Some(n) => propagations.push(n),
                None => {
                    return Err(format!(
                        "unknown argument '{other}': expected classic, native, graceful, nginx, \
                         sleep, flush, istio, exit-on-zero, envoy-drain, requests, plain, \
                         <n>s, http2, own or hold"
                    ));
                }
            },
        }
    }
    all(&mut orderings, &[Ordering::Classic, Ordering::Native]);
    all(&mut apps, &AppKind::ALL);
    all(&mut modes, &Mode::ALL);
    all(&mut propagations, &PROPAGATIONS);
    all(&mut holds, &[false]);
    let mut out = Vec::new();
    for &p in &propagations {
        for &ordering in &orderings {
            for &app in &apps {
                for &hold in &holds {
                    if hold && app == AppKind::Sleep5 {
                        continue;
                    }
                    for &mode in &modes {
                        out.push(Scenario {
                            ordering,
                            app,
                            mode,
                            propagation: Duration::from_secs(p),
                            load: if http2 { Load::Http2 } else { Load::Http1 },
                            hold,
                        });
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Every value, when the arguments named none.
fn all<T: Copy>(chosen: &mut Vec<T>, every: &[T]) {
    if chosen.is_empty() {
        chosen.extend_from_slice(every);
    }
}
