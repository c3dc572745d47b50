//! A mesh replica for the one number users judge a drain by: requests that fail while a pod is
//! deleted under live traffic. Three pod replicas (support/pod.rs) on one network:
//! - pods A (10.90.0.2) and B (10.90.0.4) serve the service `app` on 8080, the app
//!   (tests/pod/app.py) as uid 1000; with a sidecar, Istio's capture rules and Envoy as uid 1337;
//!   in ambient mode, istio-cni's rules, and their node's ztunnel itself (support/ztunnel.rs)
//!   holding its listeners in their namespaces; without a mesh, the app alone;
//! - a client pod (10.90.0.5) that reaches the service's address (10.96.0.10:8080) through its
//!   sidecar (tests/pod/client.yaml), whose endpoints the control plane stand-in sends over EDS;
//!   in ambient mode through its own node's ztunnel over HBONE, which follows the workload
//!   discovery stand-in, or from outside the mesh through kube-proxy's rules to ztunnel's 15006;
//!   without a mesh through kube-proxy's iptables rules; and where real load generators run as
//!   uid 1000: `hey` for HTTP/1.1, `h2load` for HTTP/2 (Debian's packages hey and nghttp2-client).
//!
//! A scenario deletes pod A with the kubelet stand-in (support/kubelet.rs) in one of its orderings
//! while the load runs; a propagation delay later the control plane removes A from the endpoints,
//! as istiod's push reaches clients, or kube-proxy's rules drop it. Pod B stays. Without a sidecar
//! the kubelet's probes reach A's app every second, from where they come in that mesh. The
//! outcome of every request comes from the load generators, the kind of each failure from the
//! client sidecar's access log where there is one, and when requests reached A from A's app.

use super::agent::SERVICE_CLUSTER;
use super::http::Conn;
use super::kubelet::{self, AppPreStop, Deletion, Probe, Probes, ProxyPreStop};
use super::pod::{self, Capture, Gateway, Network, Pod, PodOptions, Stats};
use super::ztunnel::{Control, Served, ZtunnelNode};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

pub const A: &str = "10.90.0.2";
pub const B: &str = "10.90.0.4";
pub const CLIENT: &str = "10.90.0.5";
/// The service's address, which the client's sidecar captures and routes.
const SERVICE: &str = "http://10.96.0.10:8080";
/// The steady load: short requests at a constant rate.
pub const RATE: u32 = 100;
const SHORT: &str = "/local/0.05";
/// The long requests in flight at pod A when it is deleted.
pub const LONG: usize = 3;
const LONG_SECONDS: u32 = 10;
/// How long the load runs before the deletion, and after both the pod is gone and the endpoint
/// has left the client's list.
const BEFORE: Duration = Duration::from_secs(2);
const AFTER: Duration = Duration::from_secs(2);

/// What the app does when it is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppKind {
    /// Keeps serving after SIGTERM until its endpoint is gone (nothing in flight, nothing new for
    /// 1 s but the kubelet's probes), then exits.
    Graceful,
    /// Closes its listener at SIGTERM and finishes what it has (nginx's way).
    Nginx,
    /// Graceful, with one last outbound call through the sidecar at SIGTERM (a final flush).
    Flush,
}

impl AppKind {
    pub const ALL: [AppKind; 3] = [AppKind::Graceful, AppKind::Nginx, AppKind::Flush];

    pub fn name(self) -> &'static str {
        match self {
            AppKind::Graceful => "graceful",
            AppKind::Nginx => "nginx-style",
            AppKind::Flush => "final flush",
        }
    }

    /// tests/pod/app.py's mode.
    fn on_sigterm(self) -> &'static str {
        match self {
            AppKind::Graceful => "graceful",
            AppKind::Nginx => "close",
            AppKind::Flush => "flush",
        }
    }
}

/// The app container's preStop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreStop {
    None,
    /// `sleep N`, as Kubernetes' guides and ambient users' Kyverno policies add.
    Sleep(u64),
    /// `envoy-drain hold` as the injection template (with a sidecar) and examples/hold-policy.yaml
    /// (without one) write it for pod A: the preset of its mesh, 10 s of the grace period left to
    /// the app; without a sidecar the period of its readiness probe (1 s), ztunnel's own ports
    /// in ambient mode, and without a mesh the node's address in its environment (`PodOptions`).
    Hold,
}

impl PreStop {
    fn kubelet(self, mesh: pod::DataPlane, grace: Duration) -> AppPreStop {
        match self {
            PreStop::None => AppPreStop::None,
            PreStop::Sleep(n) => AppPreStop::Sleep(Duration::from_secs(n)),
            PreStop::Hold => {
                let deadline = format!("--deadline={}s", grace.as_secs() - 10);
                let probes = ["--probe-periods", "1s"];
                let args: Vec<&str> = match mesh {
                    pod::DataPlane::Sidecar { .. } => vec!["hold", "--preset", "istio", &deadline],
                    pod::DataPlane::Ambient => {
                        [&["hold", "--preset", "ambient", &deadline][..], &probes]
                            .concat()
                            .into_iter()
                            .chain(["--ignore-ports", "15001,15053"])
                            .collect()
                    }
                    pod::DataPlane::None => {
                        [&["hold", "--preset", "none", &deadline][..], &probes].concat()
                    }
                    pod::DataPlane::Waypoint => unreachable!("the replica has no waypoint"),
                };
                AppPreStop::Hook(args.into_iter().map(String::from).collect())
            }
        }
    }

    fn name(self) -> String {
        match self {
            PreStop::None => "-".to_string(),
            PreStop::Sleep(n) => format!("sleep {n}s"),
            PreStop::Hold => "hold".to_string(),
        }
    }
}

/// How the proxy container is set up to shut down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Istio's injection as it is: no preStop in classic mode (pilot-agent drains, sleeps
    /// terminationDrainDuration, stops Envoy); `pilot-agent request POST drain` in native mode.
    Istio,
    /// The same with EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true.
    ExitOnZero,
    /// envoy-drain as the injection template (examples/istio-template-values.yaml) sets it:
    /// classic, `--then-quit`; native, `--drain=agent`.
    EnvoyDrain,
    /// The template with `--count requests`.
    Requests,
    /// The hook with neither: a classic proxy is then stopped by pilot-agent's own shutdown.
    Plain,
}

impl Mode {
    pub const ALL: [Mode; 5] =
        [Mode::Istio, Mode::ExitOnZero, Mode::EnvoyDrain, Mode::Requests, Mode::Plain];

    /// The shutdown's name, for a classic sidecar or a native one.
    pub fn name(self, native: bool) -> &'static str {
        match (self, native) {
            (Mode::Istio, false) => "Istio default",
            (Mode::Istio, true) => "Istio native preStop",
            (Mode::ExitOnZero, _) => "EXIT_ON_ZERO",
            (Mode::EnvoyDrain, _) => "envoy-drain (template)",
            (Mode::Requests, _) => "envoy-drain --count requests",
            (Mode::Plain, _) => "envoy-drain run (no flags)",
        }
    }

    fn stats(self) -> Stats {
        match self {
            Mode::ExitOnZero => Stats::ExitOnZero,
            _ => Stats::IstioDefault,
        }
    }

    /// The proxy's preStop. The template's hook, as it renders for each ordering at the pod's
    /// grace period (docs/install.md: 6 s and 3 s less), without its `--log-file=/proc/1/fd/1`
    /// (PID 1 here is not the proxy container's).
    pub fn pre_stop(self, native: bool, grace: Duration) -> ProxyPreStop {
        let grace = grace.as_secs();
        let mut hook = match (self, native) {
            (Mode::Istio | Mode::ExitOnZero, false) => return ProxyPreStop::None,
            (Mode::Istio | Mode::ExitOnZero, true) => return ProxyPreStop::AgentDrain,
            (Mode::Plain, _) => vec!["run".to_string()],
            (_, false) => vec![
                "run".to_string(),
                "--then-quit".to_string(),
                "--agent=127.0.0.1:15020".to_string(),
                format!("--deadline={}s", grace - 6),
            ],
            (_, true) => vec![
                "run".to_string(),
                "--drain=agent".to_string(),
                "--agent=127.0.0.1:15020".to_string(),
                format!("--deadline={}s", grace - 3),
            ],
        };
        if self == Mode::Requests {
            hook.extend(["--count".to_string(), "requests".to_string()]);
        }
        ProxyPreStop::Hook(hook)
    }
}

/// Which load generator sends the short requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadKind {
    /// hey: HTTP/1.1 with keep-alive.
    Http1,
    /// h2load: HTTP/2 (prior knowledge), all the way to the server pods.
    Http2,
}

#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub app: AppKind,
    pub mode: Mode,
    /// From the deletion until the client's sidecar no longer has pod A.
    pub propagation: Duration,
    pub load: LoadKind,
    pub pre_stop: PreStop,
    /// What carries the traffic: a sidecar, classic or native (the kubelet's order); with
    /// `Ambient` or `None` there is no proxy container, so `mode` says nothing.
    pub mesh: pod::DataPlane,
    /// The clients keep their connections open between requests (hey's default); else one
    /// connection per request.
    pub keep_alive: bool,
    /// Requests a second, all clients together (`RATE` unless a row says otherwise).
    pub rate: f64,
    /// Without a sidecar, pod A's readiness probe, every second.
    pub probe: Probe,
    /// Without a sidecar, how the pods reach the node (the kubelet probes from the node's
    /// address: the bridge's, or not the gateway).
    pub gateway: Gateway,
    /// In ambient mode, the clients are outside the mesh: they reach the pods through
    /// kube-proxy, in plaintext to ztunnel's 15006.
    pub outside: bool,
}

impl Scenario {
    /// Whether the sidecar is a native one.
    pub fn native(&self) -> bool {
        self.mesh == pod::DataPlane::Sidecar { native: true }
    }

    /// The probes' column: their kind and where they come from.
    fn probes(&self) -> &'static str {
        match (self.mesh, self.probe, self.gateway) {
            (pod::DataPlane::Sidecar { .. } | pod::DataPlane::Waypoint, ..) => "-",
            (pod::DataPlane::Ambient, Probe::Http, _) => "HTTP, from 169.254.7.127",
            (pod::DataPlane::Ambient, Probe::Tcp, _) => "tcpSocket, from 169.254.7.127",
            (pod::DataPlane::None, Probe::Http, Gateway::Bridge) => "HTTP, from the gateway",
            (pod::DataPlane::None, Probe::Tcp, Gateway::Bridge) => "tcpSocket, from the gateway",
            (pod::DataPlane::None, Probe::Http, Gateway::LinkLocal) => "HTTP, from the node's IP",
            (pod::DataPlane::None, Probe::Tcp, Gateway::LinkLocal) => {
                "tcpSocket, from the node's IP"
            }
        }
    }

    /// The pod's terminationGracePeriodSeconds: Kubernetes' default, or 60 s where the mesh is
    /// known to be slow (30 s propagation), as such users set it.
    pub fn grace(&self) -> Duration {
        if self.propagation >= Duration::from_secs(30) {
            Duration::from_secs(60)
        } else {
            kubelet::GRACE
        }
    }
}

/// Failed requests by kind, as the client's sidecar saw them fail: `refused` (Envoy could not
/// connect to pod A: response flag UF, or no host: UH), `reset` (the connection to pod A ended
/// under the request: UC, UR, LR; and resets the load generator saw itself), `timeout` (UT, and
/// the load generator's own), and `five_xx` (an answer of 500 or more from pod A itself).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kinds {
    pub five_xx: usize,
    pub reset: usize,
    pub refused: usize,
    pub timeout: usize,
}

pub struct ReplicaRow {
    pub scenario: Scenario,
    pub sent: usize,
    pub failed: usize,
    pub kinds: Kinds,
    /// The long requests pod A was serving at the deletion, and how many of them succeeded.
    pub long_at_a: usize,
    pub long_ok: usize,
    pub deletion: Deletion,
    /// The end of the last request pod A answered with success.
    pub last_request_end: Option<Instant>,
    /// The hook's summary line, when there was a hook.
    pub hook_summary: Option<String>,
    /// The start of the last request the client's sidecar sent to pod A: the last arrival.
    pub last_arrival: Option<Instant>,
}

impl ReplicaRow {
    /// Deletion to pod gone, in seconds.
    pub fn gone(&self) -> f64 {
        secs(self.deletion.pod_gone(), self.deletion.deleted)
    }

    /// App exit to proxy stop, in seconds: negative when the proxy stopped first.
    pub fn app_exit_to_proxy_stop(&self) -> f64 {
        secs(self.deletion.proxy_stopped, self.deletion.app_exited)
    }

    /// The last arrival at pod A to the end of the app's `hold`, in seconds.
    pub fn hold_after_last_arrival(&self) -> Option<f64> {
        let hold = self.deletion.app_hook.as_ref()?;
        Some(secs(hold.ended, self.last_arrival?))
    }

    /// Last request end to proxy stop, in seconds.
    pub fn last_request_to_proxy_stop(&self) -> Option<f64> {
        self.last_request_end.map(|end| secs(self.deletion.proxy_stopped, end))
    }
}

/// `a - b` in seconds, signed.
fn secs(a: Instant, b: Instant) -> f64 {
    if a >= b { (a - b).as_secs_f64() } else { -(b - a).as_secs_f64() }
}

/// kube-proxy's iptables rules for the service (pkg/proxy/iptables/proxier.go: a KUBE-SVC chain
/// that picks an endpoint at random for each new connection, `statistic --mode random
/// --probability 1/n`, then DNAT), which conntrack keeps on its endpoint for its whole life.
/// Written in the client pod's own namespace, where kube-proxy writes them on the node: the same
/// DNAT, without the bridge netfilter a node needs to undo it on a reply.
fn kube_proxy(hosts: &[&str]) -> String {
    let mut rules = String::from(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         :POSTROUTING ACCEPT [0:0]\n:KUBE-SVC - [0:0]\n\
         -A OUTPUT -d 10.96.0.10/32 -p tcp --dport 8080 -j KUBE-SVC\n",
    );
    for (i, host) in hosts.iter().enumerate() {
        let left = hosts.len() - i;
        let pick = match left {
            1 => String::new(),
            n => format!("-m statistic --mode random --probability {:.5} ", 1.0 / n as f64),
        };
        rules += &format!("-A KUBE-SVC -p tcp {pick}-j DNAT --to-destination {host}:8080\n");
    }
    rules + "COMMIT\n"
}

/// The three pods on one network; in ambient mode a node's ztunnel for each (dropped first), and
/// the workload discovery they follow.
pub struct MeshReplica {
    nodes: Vec<ZtunnelNode>,
    pub a: Pod,
    pub b: Pod,
    pub client: Pod,
    network: Arc<Network>,
    kind: pod::DataPlane,
    workloads: Control,
    /// The client reaches the service through kube-proxy's rules.
    kube_proxy: bool,
}

impl MeshReplica {
    /// Starts the mesh of `kind`, pod A's app and proxy set up by `app` and `stats`, and waits
    /// until the client's proxy has both endpoints.
    pub fn start(
        envoy: &Path,
        hook: &Path,
        (app, stats): (AppKind, Stats),
        (kind, outside): (pod::DataPlane, bool),
        gateway: Gateway,
    ) -> MeshReplica {
        let network = Network::new(false);
        let server = |on_sigterm, stats| PodOptions {
            mesh: kind,
            capture: Capture::Redirect,
            stats,
            on_sigterm,
            gateway,
            node_ips: kind == pod::DataPlane::None,
            ..PodOptions::default()
        };
        let a = Pod::join(&network, A, envoy, hook, server(app.on_sigterm(), stats));
        let b = Pod::join(&network, B, envoy, hook, server("serve", Stats::IstioDefault));
        let client_mesh = if outside { pod::DataPlane::None } else { kind };
        let client_options =
            PodOptions { mesh: client_mesh, client: true, ..PodOptions::default() };
        let client = Pod::join(&network, CLIENT, envoy, hook, client_options);
        let workloads = Control::default();
        let mut nodes = Vec::new();
        if kind == pod::DataPlane::Ambient {
            let a_pod = Served { ns: a.netns(), name: "app-a", ip: A };
            nodes.push(ZtunnelNode::start("node-a", &workloads, &a_pod));
            let b_pod = Served { ns: b.netns(), name: "app-b", ip: B };
            nodes.push(ZtunnelNode::start("node-b", &workloads, &b_pod));
            if !outside {
                let caller = Served { ns: client.netns(), name: "client", ip: CLIENT };
                nodes.push(ZtunnelNode::start("node-c", &workloads, &caller));
            }
        }
        let kube_proxy = client_mesh == pod::DataPlane::None;
        let mesh = MeshReplica { nodes, a, b, client, network, kind, workloads, kube_proxy };
        mesh.route(&[A, B]);
        mesh
    }

    /// Sends the service's new connections to `hosts` from now on: the control plane's push to
    /// the client's proxy, or kube-proxy's rules; returns once the client's proxy has them.
    fn route(&self, hosts: &[&str]) {
        if self.kind == pod::DataPlane::Ambient {
            let names = [(A, "app-a"), (B, "app-b")];
            let serving: Vec<&str> =
                names.iter().filter(|(ip, _)| hosts.contains(ip)).map(|(_, n)| *n).collect();
            self.workloads.set_serving(&serving);
        }
        if self.kube_proxy {
            self.client.iptables(&kube_proxy(hosts));
        }
        if !self.kind.sidecar() {
            return;
        }
        let endpoints: Vec<String> = hosts.iter().map(|h| format!("{h}:8080")).collect();
        let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
        self.network.control.set_endpoints(&endpoints);
        let pushed = super::envoy::until(Duration::from_secs(10), || {
            let answer = self
                .client
                .inside(|| Conn::open(super::envoy::ADMIN).and_then(|mut c| c.get("/clusters")));
            let Ok(answer) = answer else { return false };
            let mut seen: Vec<&str> = answer
                .body
                .lines()
                .filter_map(|l| l.strip_prefix(SERVICE_CLUSTER)?.strip_prefix("::"))
                .filter_map(|l| l.split_once("::cx_active::").map(|(host, _)| host))
                .collect();
            seen.sort_unstable();
            seen == endpoints
        });
        assert!(
            pushed,
            "the client's proxy routes to {endpoints:?}; its log:\n{}",
            self.client.envoy_log()
        );
    }

    /// A load generator in the client pod, its output captured.
    fn generator(&self, program: &str, args: &[String]) -> Child {
        let mut cmd: Command = self.client.as_app(program);
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.spawn().unwrap_or_else(|e| {
            panic!("NOT RUN: {program}: {e}; `bash scripts/test-tools` installs it")
        })
    }
}

/// The outcome of one load generator's run.
#[derive(Debug, Default)]
struct Outcome {
    sent: usize,
    /// Answers of 500 or more.
    five_xx: usize,
    /// Other answers that are not 2xx or 3xx.
    other_status: usize,
    /// Requests without an answer, by kind.
    errors: Kinds,
}

impl Outcome {
    fn failed(&self) -> usize {
        self.five_xx
            + self.other_status
            + self.errors.reset
            + self.errors.refused
            + self.errors.timeout
    }
}

/// hey's summary: `Status code distribution:` with `[200]\t12 responses` lines, and
/// `Error distribution:` with `[3]\tGet "...": EOF` lines.
fn hey_outcome(out: &str) -> Outcome {
    let mut o = Outcome::default();
    let mut section = "";
    for line in out.lines() {
        let t = line.trim();
        if t.ends_with("distribution:") {
            section = t;
            continue;
        }
        let Some((number, rest)) = t.strip_prefix('[').and_then(|r| r.split_once(']')) else {
            continue;
        };
        let Ok(number) = number.parse::<usize>() else {
            continue;
        };
        let rest = rest.trim();
        if section.starts_with("Status code") {
            let n: usize = rest.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
            o.sent += n;
            match number {
                200..=399 => {}
                500.. => o.five_xx += n,
                _ => o.other_status += n,
            }
        } else if section.starts_with("Error") {
            o.sent += number;
            if rest.contains("refused") {
                o.errors.refused += number;
            } else if rest.contains("Timeout") || rest.contains("timeout") {
                o.errors.timeout += number;
            } else {
                o.errors.reset += number;
            }
        }
    }
    o
}

/// h2load's summary: `requests: N total, N started, N done, N succeeded, N failed, N errored,
/// N timeout` and `status codes: N 2xx, N 3xx, N 4xx, N 5xx`. Requests still in flight when its
/// duration ends are cut off by h2load itself: only those done count.
fn h2load_outcome(out: &str) -> Outcome {
    let numbers = |prefix: &str| -> BTreeMap<String, usize> {
        out.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(|rest| {
                rest.split(',')
                    .filter_map(|part| {
                        let (n, name) = part.trim().split_once(' ')?;
                        Some((name.to_string(), n.parse().ok()?))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let requests = numbers("requests: ");
    let codes = numbers("status codes: ");
    let get = |m: &BTreeMap<String, usize>, k: &str| m.get(k).copied().unwrap_or(0);
    let done = get(&requests, "done");
    let answered: usize = codes.values().sum();
    let timeout = get(&requests, "timeout");
    Outcome {
        sent: done,
        five_xx: get(&codes, "5xx"),
        other_status: get(&codes, "4xx"),
        errors: Kinds {
            timeout,
            // Done without an answer: the stream or the connection was reset.
            reset: done.saturating_sub(answered).saturating_sub(timeout),
            ..Kinds::default()
        },
    }
}

/// One line of the client sidecar's access log (tests/pod/client.yaml):
/// `ACCESS <start, epoch s.ms> <duration ms> <code> <flags> <upstream host> <path>`.
struct Access {
    code: u16,
    flags: String,
}

fn access_log(log: &str) -> Vec<Access> {
    log.lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("ACCESS ")?.split(' ').skip(2);
            let code = w.next()?.parse().ok()?;
            Some(Access { code, flags: w.next()?.to_string() })
        })
        .collect()
}

/// The kinds of the failures the sidecar answered, by its response flags.
fn kinds_from_flags(log: &[Access]) -> Kinds {
    let mut k = Kinds::default();
    for a in log.iter().filter(|a| a.code >= 500 || a.code == 0) {
        let has = |f: &str| a.flags.split(',').any(|x| x == f);
        if has("UF") || has("UH") {
            k.refused += 1;
        } else if has("UC") || has("UR") || has("LR") || has("DC") {
            k.reset += 1;
        } else if has("UT") {
            k.timeout += 1;
        } else {
            k.five_xx += 1;
        }
    }
    k
}

/// Runs one scenario in a mesh of its own, torn down after.
pub fn run(envoy: &Path, hook: &Path, s: Scenario) -> ReplicaRow {
    let mut mesh =
        MeshReplica::start(envoy, hook, (s.app, s.mode.stats()), (s.mesh, s.outside), s.gateway);
    let kinds: &'static [Probe] = match s.probe {
        Probe::Tcp => &[Probe::Tcp],
        Probe::Http => &[Probe::Http],
    };
    let _probes = match s.mesh {
        pod::DataPlane::Sidecar { .. } | pod::DataPlane::Waypoint => None,
        // istio-cni SNATs them on the node; else they come from the node's address.
        pod::DataPlane::Ambient => Some(pod::PROBE_IP),
        pod::DataPlane::None => Some(pod::OTHER_IP),
    }
    .map(|from| {
        Probes::start(&mesh.network, from, format!("{A}:8080"), kinds, Duration::from_secs(1))
    });
    let started = Instant::now();
    let short = Generator::new(short_load(&mesh, &s));
    // A slow load takes a few of its gaps to have reached both.
    let reach = Duration::from_secs_f64(10.0 + 8.0 / s.rate);
    let reached = super::envoy::until(reach, || {
        mesh.a.app_said(&format!("received {SHORT}"))
            && mesh.b.app_said(&format!("received {SHORT}"))
    });
    assert!(reached, "the load reaches both pods: {}", short.finish());
    let (long, at_a) = long_requests_at_a(&mut mesh);
    thread::sleep(BEFORE.saturating_sub(started.elapsed()));
    let deletion = delete_a(&mut mesh, &s);
    let short = match s.load {
        LoadKind::Http1 => {
            short.interrupt();
            hey_outcome(&short.finish())
        }
        LoadKind::Http2 => h2load_outcome(&short.finish()),
    };
    let long: Vec<Outcome> = long.into_iter().map(|g| hey_outcome(&g.finish())).collect();
    // When requests reached A and were answered, as its app says (the probes left out).
    mesh.a.app_said("");
    let served = |prefix: &str| {
        mesh.a.app_times(prefix).filter(|(l, _)| !l.contains("probe")).map(|(_, t)| t).max()
    };
    let (last_arrival, last_request_end) = (served("received "), served("answered "));
    let (sent, failed, kinds) = tally(&mut mesh, &s, &short, &long);
    let long_failed: usize = long.iter().map(Outcome::failed).sum();
    ReplicaRow {
        scenario: s,
        sent,
        failed,
        kinds,
        long_at_a: at_a,
        long_ok: at_a.saturating_sub(long_failed),
        hook_summary: deletion
            .hook
            .as_ref()
            .map(|h| h.last_line().split('\t').next_back().unwrap_or_default().to_string()),
        deletion,
        last_request_end,
        last_arrival,
    }
}

/// The short requests' load generator: hey (HTTP/1.1) or h2load (HTTP/2) at the scenario's rate.
fn short_load(mesh: &MeshReplica, s: &Scenario) -> Child {
    let short_url = format!("{SERVICE}{SHORT}");
    // h2load cannot be stopped early and still report: its run covers the longest deletion.
    let h2_duration = BEFORE + s.grace().max(s.propagation) + AFTER + Duration::from_secs(8);
    match s.load {
        LoadKind::Http1 => {
            // hey's -q is each worker's rate: one worker below 10 a second.
            let workers = if s.rate >= 10.0 { 10.0 } else { 1.0 };
            let mut args = ["-z", "600s", "-t", "30"].map(String::from).to_vec();
            args.extend([
                "-c".into(),
                workers.to_string(),
                "-q".into(),
                (s.rate / workers).to_string(),
            ]);
            if !s.keep_alive {
                args.push("-disable-keepalive".into());
            }
            args.push(short_url);
            mesh.generator("hey", &args)
        }
        LoadKind::Http2 => mesh.generator(
            "h2load",
            &[
                "-c".into(),
                "4".into(),
                // Streams at once per connection: enough for the rate at 50 ms a request.
                "-m".into(),
                "10".into(),
                "--rps".into(),
                (s.rate / 4.0).to_string(),
                "-D".into(),
                h2_duration.as_secs().to_string(),
                short_url,
            ],
        ),
    }
}

/// Long requests, one at a time, until pod A serves `LONG` of them (the balancer spreads them
/// over both pods; ztunnel at random: 24 tries miss 3 at A one time in 30,000): their load
/// generators, and how many reached A.
fn long_requests_at_a(mesh: &mut MeshReplica) -> (Vec<Generator>, usize) {
    let mut long = Vec::new();
    let mut at_a = 0;
    for i in 1..=8 * LONG {
        if at_a == LONG {
            break;
        }
        let path = format!("/local/{LONG_SECONDS}?long={i}");
        let args = ["-n", "1", "-c", "1", "-t", "30"].map(String::from);
        let args = [&args[..], &[format!("{SERVICE}{path}")]].concat();
        long.push(Generator::new(mesh.generator("hey", &args)));
        let received = format!("received {path}");
        let mut at = None;
        super::envoy::until(Duration::from_secs(10), || {
            if mesh.a.app_said(&received) {
                at = Some(true);
            } else if mesh.b.app_said(&received) {
                at = Some(false);
            }
            at.is_some()
        });
        match at {
            Some(true) => at_a += 1,
            Some(false) => {}
            None => panic!("no pod received {path}"),
        }
    }
    assert_eq!(at_a, LONG, "pod A got its long requests");
    (long, at_a)
}

/// Pod A deleted as the kubelet does, the control plane's push taking it out of the routes the
/// propagation later; returns once it is gone and pushed, and `AFTER` more.
fn delete_a(mesh: &mut MeshReplica, s: &Scenario) -> Deletion {
    let proxy_pre_stop = match s.mesh {
        pod::DataPlane::Sidecar { native } => s.mode.pre_stop(native, s.grace()),
        _ => ProxyPreStop::None,
    };
    let app_pre_stop = s.pre_stop.kubelet(s.mesh, s.grace());
    let (a, grace, propagation) = (&mesh.a, s.grace(), s.propagation);
    thread::scope(|scope| {
        let propagated = scope.spawn(|| {
            thread::sleep(propagation);
            let at = Instant::now();
            mesh.route(&[B]);
            at
        });
        let deletion = kubelet::delete(a, &proxy_pre_stop, &app_pre_stop, grace);
        let propagated = propagated.join().expect("the control plane's push");
        thread::sleep(
            (deletion.pod_gone().max(propagated) + AFTER).saturating_duration_since(Instant::now()),
        );
        deletion
    })
}

/// The requests sent and failed, and the failures by kind: the short load's, the long ones',
/// and, with `AppKind::Flush`, the app's last call through its own sidecar.
fn tally(
    mesh: &mut MeshReplica,
    s: &Scenario,
    short: &Outcome,
    long: &[Outcome],
) -> (usize, usize, Kinds) {
    let mut kinds = kinds_from_flags(&access_log(&mesh.client.envoy_log()));
    let mut failed = short.failed();
    let mut sent = short.sent;
    for o in long.iter().chain([short]) {
        kinds.reset += o.errors.reset;
        kinds.refused += o.errors.refused;
        kinds.timeout += o.errors.timeout;
    }
    for o in long {
        failed += o.failed();
        sent += o.sent;
    }
    if s.app == AppKind::Flush {
        // The app's last call through its own sidecar is a request too.
        mesh.a.app_said("last call");
        let last = mesh.a.app_lines().into_iter().find(|l| l.starts_with("last call"));
        sent += 1;
        match last {
            Some("last call 200") => {}
            Some(l) if l.contains("refused") => kinds.refused += 1,
            Some(l) if l.starts_with("last call failed") => kinds.reset += 1,
            Some(_) => kinds.five_xx += 1,
            // Killed before it ended.
            None => kinds.reset += 1,
        }
        failed += usize::from(last != Some("last call 200"));
    }
    (sent, failed, kinds)
}

/// A running load generator whose output is collected as it runs.
struct Generator {
    child: Child,
    /// What it printed, once its output has ended.
    output: std::sync::mpsc::Receiver<String>,
}

impl Generator {
    fn new(mut child: Child) -> Generator {
        let mut out = child.stdout.take().expect("piped");
        let mut err = child.stderr.take().expect("piped");
        let (tx, output) = std::sync::mpsc::channel();
        thread::spawn(move || {
            use std::io::Read;
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            let _ = err.read_to_string(&mut s);
            let _ = tx.send(s);
        });
        Generator { child, output }
    }

    /// SIGINT: hey stops sending, waits for what is in flight and prints its summary.
    fn interrupt(&self) {
        // SAFETY: a signal to a child of ours that has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
    }

    /// Waits for its output to end (killing it after 60 s) and returns what it printed.
    fn finish(mut self) -> String {
        let printed = self.output.recv_timeout(Duration::from_secs(60));
        let _ = self.child.kill();
        let _ = self.child.wait();
        printed.unwrap_or_else(|_| "(killed after 60 s: no summary)".to_string())
    }
}

/// The table, one row per scenario, in Markdown.
pub fn table(rows: &[ReplicaRow]) -> String {
    let mut t = String::from(
        "| mesh | ordering | app | app preStop | proxy shutdown | propagation | load | clients | sent | failed | 5xx | reset | refused | timeout | long at A ok | deletion to pod gone | app exit to proxy stop | last request end to proxy stop | hold end after last arrival | kubelet's probes |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let s = r.scenario;
        let sidecar = s.mesh.sidecar();
        let (mesh, ordering, mode) = match s.mesh {
            pod::DataPlane::Sidecar { native: false } => ("sidecar", "classic", s.mode.name(false)),
            pod::DataPlane::Sidecar { native: true } => ("sidecar", "native", s.mode.name(true)),
            pod::DataPlane::Ambient => ("ambient", "-", "-"),
            pod::DataPlane::None => ("none", "-", "-"),
            pod::DataPlane::Waypoint => ("waypoint", "-", "-"),
        };
        let load = match s.load {
            LoadKind::Http1 => format!("HTTP/1.1 {}/s", s.rate),
            LoadKind::Http2 => format!("HTTP/2 {}/s", s.rate),
        };
        let clients = match (s.keep_alive, s.outside) {
            (true, false) => "keep-alive",
            (false, false) => "new connection",
            (true, true) => "keep-alive, outside the mesh",
            (false, true) => "new connection, outside the mesh",
        };
        let signed = |d: Option<f64>| d.map_or("-".to_string(), |d| format!("{d:+.1}s"));
        t.push_str(&format!(
            "| {mesh} | {ordering} | {} | {} | {mode} | {}s | {load} | {clients} | {} | {} | {} | {} | {} | {} | {}/{} | {:.1}s | {} | {} | {} | {} |\n",
            s.app.name(),
            s.pre_stop.name(),
            s.propagation.as_secs(),
            r.sent,
            r.failed,
            r.kinds.five_xx,
            r.kinds.reset,
            r.kinds.refused,
            r.kinds.timeout,
            r.long_ok,
            r.long_at_a,
            r.gone(),
            signed(sidecar.then(|| r.app_exit_to_proxy_stop())),
            signed(r.last_request_to_proxy_stop().filter(|_| sidecar)),
            signed(r.hold_after_last_arrival()),
            s.probes(),
        ));
    }
    t
}

/// The demo's short table: per proxy shutdown, what a user sees.
pub fn short_table(rows: &[ReplicaRow]) -> String {
    let mut t = format!(
        "{:<32} {:>6} {:>6} {:>12} {:>10} {:>22}\n",
        "pod shutdown", "sent", "failed", "long at A ok", "pod gone", "proxy stop after app"
    );
    for r in rows {
        t.push_str(&format!(
            "{:<32} {:>6} {:>6} {:>12} {:>9.1}s {:>+21.1}s\n",
            r.scenario.mode.name(r.scenario.native()),
            r.sent,
            r.failed,
            format!("{}/{}", r.long_ok, r.long_at_a),
            r.gone(),
            r.app_exit_to_proxy_stop(),
        ));
    }
    t
}
