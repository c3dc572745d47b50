//! The mesh's table: requests that fail while a pod is deleted under live traffic
//! (tests/support/mesh.rs), one row per mesh x kubelet ordering x app kind x app preStop x proxy
//! shutdown x propagation delay x clients. Arguments narrow it down: a mesh (`sidecar`, `ambient`,
//! `no-mesh`; default `sidecar`), `classic` or `native`, an app kind (`graceful`, `nginx`,
//! `flush`), a mode (`istio`, `exit-on-zero`, `envoy-drain`, `requests`, `plain`), a propagation
//! delay (`2s`, `10s`, `30s`, where the pod's grace period is 60 s), `http2` (h2load instead of
//! hey; with a sidecar only, whose Envoy carries HTTP/2 to the HTTP/1.1 app), the app's preStop (`own`: none; `sleep<N>`, like `sleep5`; `hold`: `envoy-drain hold`;
//! default `own`), the clients (`keep-alive`, `new-conn`: a connection per request; default
//! `keep-alive`), without a sidecar the kubelet's readiness probe of pod A (`http-probes`,
//! `tcp-probes`; default `http-probes`) and where it comes from (`gateway`: a bridge CNI's node,
//! the pod's gateway; `node-ip`: Calico's or the AWS VPC CNI's, the node's own address, the
//! gateway 169.254.1.1; default `gateway`); several of one sort are all run. Without a sidecar
//! there is no proxy container, so orderings and modes give one row. Run it with
//! `bash examples/mesh.sh [ARG...]`, as root.
//!
//! `demo` first: the demo (`bash examples/demo.sh`), the table's top rows (classic ordering,
//! graceful app, 2 s) for Istio's default, EXIT_ON_ZERO and envoy-drain as the template sets it
//! unless modes are named, in a short table.

#[allow(dead_code)]
#[path = "../tests/support"]
mod support {
    pub mod agent;
    pub mod app;
    pub mod built;
    pub mod data_plane;
    pub mod envoy;
    pub mod h2;
    pub mod http;
    pub mod kubelet;
    pub mod mesh;
    pub mod netns;
    pub mod pod;
    pub mod running;
    pub mod ztunnel;
}

use std::path::PathBuf;
use std::time::Duration;
use support::kubelet::Probe;
use support::mesh::{AppKind, LoadKind, Mode, PreStop, Scenario};
use support::pod::{DataPlane, Gateway};

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
        eprintln!("      {}", timeline(&row));
        rows.push(row);
    }
    if demo {
        print!("{}", support::mesh::short_table(&rows));
    } else {
        print!("{}", support::mesh::table(&rows));
    }
}

/// When the app exited, the proxy stopped and each hook ended, after the deletion, with the
/// hooks' summaries.
fn timeline(row: &support::mesh::ReplicaRow) -> String {
    let d = &row.deletion;
    let at = |t: std::time::Instant| t.saturating_duration_since(d.deleted).as_secs_f64();
    let summary = |h: &support::running::Finished| {
        h.last_line().split('\t').next_back().unwrap_or_default().to_string()
    };
    format!(
        "app exited at {:.1}s, proxy stopped at {:.1}s{}{}",
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
    )
}

fn is_mode(arg: &str) -> bool {
    matches!(arg, "istio" | "exit-on-zero" | "envoy-drain" | "requests" | "plain")
}

/// The scenarios the arguments select, in the table's order.
fn scenarios(args: Vec<String>) -> Result<Vec<Scenario>, String> {
    let mut c = Choices::default();
    for a in &args {
        c.take(a)?;
    }
    if c.http2 && c.meshes.iter().any(|m| !m.sidecar()) {
        // The app speaks HTTP/1.1 (tests/pod/app.py); only a sidecar's Envoy carries HTTP/2 to it.
        return Err("http2 needs sidecar alone: without a sidecar h2load would reach the \
                    HTTP/1.1 app as it is"
            .to_string());
    }
    c.defaults();
    Ok(c.rows())
}

/// What the arguments chose, each list empty until `defaults` where they named none.
#[derive(Default)]
struct Choices {
    /// A sidecar stands for one of each kind `natives` names (classic, native).
    meshes: Vec<DataPlane>,
    natives: Vec<bool>,
    apps: Vec<AppKind>,
    modes: Vec<Mode>,
    propagations: Vec<u64>,
    pre_stops: Vec<PreStop>,
    clients: Vec<bool>,
    rates: Vec<f64>,
    probes: Vec<Probe>,
    gateways: Vec<Gateway>,
    outside: Vec<bool>,
    http2: bool,
}

impl Choices {
    fn take(&mut self, a: &str) -> Result<(), String> {
        match a {
            "sidecar" => self.meshes.push(DataPlane::Sidecar { native: false }),
            "ambient" => self.meshes.push(DataPlane::Ambient),
            "no-mesh" => self.meshes.push(DataPlane::None),
            "classic" => self.natives.push(false),
            "native" => self.natives.push(true),
            "graceful" => self.apps.push(AppKind::Graceful),
            "nginx" => self.apps.push(AppKind::Nginx),
            "flush" => self.apps.push(AppKind::Flush),
            "istio" => self.modes.push(Mode::Istio),
            "exit-on-zero" => self.modes.push(Mode::ExitOnZero),
            "envoy-drain" => self.modes.push(Mode::EnvoyDrain),
            "requests" => self.modes.push(Mode::Requests),
            "plain" => self.modes.push(Mode::Plain),
            "http2" => self.http2 = true,
            "own" => self.pre_stops.push(PreStop::None),
            "hold" => self.pre_stops.push(PreStop::Hold),
            "keep-alive" => self.clients.push(true),
            "new-conn" => self.clients.push(false),
            "http-probes" => self.probes.push(Probe::Http),
            "tcp-probes" => self.probes.push(Probe::Tcp),
            "gateway" => self.gateways.push(Gateway::Bridge),
            "node-ip" => self.gateways.push(Gateway::LinkLocal),
            "meshed" => self.outside.push(false),
            "outside" => self.outside.push(true),
            other => match (
                other.strip_prefix("sleep").and_then(|n| n.parse::<u64>().ok()),
                other.strip_suffix('s').and_then(|n| n.parse::<u64>().ok()),
                other.strip_suffix("/s").and_then(|n| n.parse::<f64>().ok()),
            ) {
                (Some(n), _, _) => self.pre_stops.push(PreStop::Sleep(n)),
                (_, Some(n), _) => self.propagations.push(n),
                (_, _, Some(r)) if r > 0.0 => self.rates.push(r),
                _ => {
                    return Err(format!(
                        "unknown argument '{other}': expected sidecar, ambient, no-mesh, classic, \
                         native, graceful, nginx, flush, istio, exit-on-zero, envoy-drain, \
                         requests, plain, <n>s, <rate>/s, http2, own, sleep<n>, hold, keep-alive, \
                         new-conn, http-probes, tcp-probes, gateway, node-ip, meshed or outside"
                    ));
                }
            },
        }
        Ok(())
    }

    fn defaults(&mut self) {
        all(&mut self.meshes, &[DataPlane::Sidecar { native: false }]);
        all(&mut self.natives, &[false, true]);
        all(&mut self.apps, &AppKind::ALL);
        all(&mut self.modes, &Mode::ALL);
        all(&mut self.propagations, &PROPAGATIONS);
        all(&mut self.pre_stops, &[PreStop::None]);
        all(&mut self.clients, &[true]);
        all(&mut self.rates, &[f64::from(support::mesh::RATE)]);
        all(&mut self.probes, &[Probe::Http]);
        all(&mut self.gateways, &[Gateway::Bridge]);
        all(&mut self.outside, &[false]);
    }

    /// Every row, in the table's order: per data plane, propagation, ordering, app, preStop,
    /// mode and clients; then each rate, probe, client place and gateway that applies.
    fn rows(&self) -> Vec<Scenario> {
        let load = if self.http2 { LoadKind::Http2 } else { LoadKind::Http1 };
        let mut out = Vec::new();
        for &plane in &self.meshes {
            // Without a sidecar, no proxy container: one ordering and one mode stand for all.
            let one = if plane.sidecar() { usize::MAX } else { 1 };
            for &p in &self.propagations {
                for &native in self.natives.iter().take(one) {
                    let mesh = if plane.sidecar() { DataPlane::Sidecar { native } } else { plane };
                    for (&app, &pre_stop) in cross(&self.apps, &self.pre_stops) {
                        for (&mode, &keep_alive) in
                            cross(&self.modes[..one.min(self.modes.len())], &self.clients)
                        {
                            out.push(Scenario {
                                app,
                                mode,
                                propagation: Duration::from_secs(p),
                                load,
                                pre_stop,
                                mesh,
                                keep_alive,
                                rate: self.rates[0],
                                probe: self.probes[0],
                                gateway: self.gateways[0],
                                outside: false,
                            });
                        }
                    }
                }
            }
        }
        self.variants(out)
    }

    /// Each row at each rate; without a sidecar, with each kind of probe from each place (ambient
    /// mode has one: istio-cni's address); in ambient mode, with clients in the mesh and outside.
    fn variants(&self, rows: Vec<Scenario>) -> Vec<Scenario> {
        let rates = &self.rates;
        let out =
            rows.into_iter().flat_map(|s| rates.iter().map(move |&rate| Scenario { rate, ..s }));
        let out = out.flat_map(|s| {
            let probes = if s.mesh.sidecar() { &self.probes[..1] } else { &self.probes[..] };
            probes.iter().map(move |&probe| Scenario { probe, ..s })
        });
        let out = out.flat_map(|s| {
            let outside =
                if s.mesh == DataPlane::Ambient { &self.outside[..] } else { &[false][..] };
            outside.iter().map(move |&outside| Scenario { outside, ..s })
        });
        out.flat_map(|s| {
            let gateways =
                if s.mesh == DataPlane::None { &self.gateways[..] } else { &self.gateways[..1] };
            gateways.iter().map(move |&gateway| Scenario { gateway, ..s })
        })
        .collect()
    }
}

/// Every pair of `a` and `b`, `a` the outer.
fn cross<'x, A, B>(a: &'x [A], b: &'x [B]) -> impl Iterator<Item = (&'x A, &'x B)> {
    a.iter().flat_map(move |x| b.iter().map(move |y| (x, y)))
}

/// Every value, when the arguments named none.
fn all<T: Copy>(chosen: &mut Vec<T>, every: &[T]) {
    if chosen.is_empty() {
        chosen.extend_from_slice(every);
    }
}
