//! A replica of a Kubernetes pod with an Istio sidecar, from real parts:
//! - the pod's network namespace, joined by a veth pair to a node's bridge (`Network`, 10.90.0.3)
//!   where the rest of the mesh runs: an HTTP service (9080) and a TCP service (5432); several
//!   pods may join one network, each with an address of its own (support/mesh.rs);
//! - in the pod, the iptables rules istio-iptables writes (tests/pod/redirect.rules, or
//!   tproxy.rules with its policy route);
//! - Envoy as the proxy's user (uid 1337; uid 0 with gid 1337 under TPROXY, as Istio's injection
//!   template runs it), with an Istio-shaped bootstrap (tests/pod/envoy.yaml) and Istio's default
//!   stats matcher or the one EXIT_ON_ZERO_ACTIVE_CONNECTIONS makes;
//! - a stand-in agent holding Envoy's ADS stream over a Unix socket (support/agent.rs);
//! - the application (tests/pod/app.py) as an unprivileged user, calling the other service
//!   through the sidecar; or, in the mesh's client pod, no app of its own: the load generators
//!   run there as that user, and its sidecar routes to the mesh's service over EDS
//!   (tests/pod/client.yaml).
//!
//! Or a pod without a sidecar (`DataPlane`): in Istio's ambient mode, istio-cni's rules in the pod
//! (tests/pod/ztunnel.rules), for the node's real ztunnel to take it (support/ztunnel.rs,
//! `ZtunnelNode`); with no mesh, the app alone.
//!
//! The hook runs as the proxy's user inside the pod, as a preStop exec does. Everything is gone
//! when the `Pod` is dropped, also when a test fails.

use super::agent::{Agent, IstiodStandIn};
use super::app::App;
pub use super::data_plane::DataPlane;
use super::netns::Netns;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

pub const POD_IP: &str = "10.90.0.2";
pub const OTHER_IP: &str = "10.90.0.3";
/// Where a client outside the pod sends its requests.
pub const APP: &str = "10.90.0.2:8080";
pub const APP_UID: u32 = 1000;
/// Where istio-cni's SNAT makes the kubelet's probes come from in ambient mode.
pub const PROBE_IP: &str = "169.254.7.127";
/// A client on the node's network that is not the node (whose address, the pod's gateway, a
/// bridge CNI's probes come from).
pub const CLIENT_IP: &str = "10.90.0.7";
/// The gateway of a pod of Calico or the AWS VPC CNI: a link-local address the node answers for
/// (proxy ARP), not the node's own, which the kubelet's probes come from.
pub const LINK_LOCAL_GATEWAY: &str = "169.254.1.1";
/// The node's bridge over IPv6, and the pod's address there (`PodOptions::ipv6`).
pub const GATEWAY_IP6: &str = "fd98::1";
/// Where istio-cni makes the kubelet's probes come from over IPv6 in ambient mode (istio/istio
/// `cni/pkg/iptables/iptables.go`, `HostProbeV6SNATAddress`), on the bridge beside `PROBE_IP`.
pub const PROBE_IP6: &str = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff";
pub const POD_IP6: &str = "fd98::2";

/// How the pod reaches the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gateway {
    /// A bridge CNI's (flannel, kubenet): the node's bridge address, where probes come from.
    Bridge,
    /// Calico's and the AWS VPC CNI's: `LINK_LOCAL_GATEWAY`; probes come from `OTHER_IP`.
    LinkLocal,
}

/// How the pod's inbound traffic reaches Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// Istio's default: NAT to 15006 (inbound) and 15001 (outbound).
    Redirect,
    /// `sidecar.istio.io/interceptionMode: TPROXY`: inbound keeps its original destination.
    Tproxy,
}

/// Which stats Envoy creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stats {
    /// Istio's default matcher: no downstream_cx_active, so the hook counts sockets.
    IstioDefault,
    /// What EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true adds: downstream_cx_active.
    ExitOnZero,
}

#[derive(Debug, Clone, Copy)]
pub struct PodOptions {
    /// What carries the pod's traffic: a sidecar (classic or native: the kubelet stand-in's
    /// order), ambient mode or none; the replica has no waypoint.
    pub mesh: DataPlane,
    pub capture: Capture,
    pub stats: Stats,
    /// What the app does on SIGTERM (tests/pod/app.py): serve, close, call or tcp.
    pub on_sigterm: &'static str,
    /// Envoy's --drain-time-s (Istio passes drainDuration, 45 s by default).
    pub drain_time_s: u32,
    /// Envoy streams its metrics to a collector on the other side (tests/pod/exporter.yaml).
    pub exporter: bool,
    /// The mesh's client pod: no app; its sidecar also routes to the mesh's service
    /// (tests/pod/client.yaml), whose endpoints come from the control plane over EDS. In ambient
    /// mode its node's ztunnel carries its connections (support/ztunnel.rs); without a mesh
    /// nothing does (`Pod::iptables` writes kube-proxy's part).
    pub client: bool,
    pub gateway: Gateway,
    /// The app's container has ENVOY_DRAIN_NODE_IPS from the downward API's status.hostIPs, as
    /// examples/hold-policy.yaml adds it without a mesh: the node's address, `OTHER_IP`.
    pub node_ips: bool,
    /// The pod also has an IPv6 address (`POD_IP6`), its IPv6 default route through the node's
    /// bridge (`GATEWAY_IP6`), as a dual-stack or IPv6-primary cluster gives it.
    pub ipv6: bool,
    /// The inbound connection manager's `delayed_close_timeout` at 0s (off), as the EnvoyFilter
    /// of docs/running.md sets it: Envoy writes a closed connection's last bytes whatever time
    /// its client takes.
    pub no_delayed_close: bool,
}

impl Default for PodOptions {
    fn default() -> PodOptions {
        PodOptions {
            mesh: DataPlane::Sidecar { native: false },
            capture: Capture::Redirect,
            stats: Stats::IstioDefault,
            on_sigterm: "serve",
            drain_time_s: 45,
            exporter: false,
            client: false,
            gateway: Gateway::Bridge,
            node_ips: false,
            ipv6: false,
            no_delayed_close: false,
        }
    }
}

/// A process of the pod (Envoy, the app) that other threads can signal, stop and wait for: a
/// reaper thread waits for it and notes when it exited.
pub struct Process {
    pid: i32,
    exited: Mutex<Option<Instant>>,
    changed: Condvar,
}

impl Process {
    /// Starts `cmd`. It must be spawned by a thread that outlives it: the pod's commands die with
    /// the thread that started them (`Netns::command`).
    pub fn spawn(mut cmd: Command) -> (Arc<Process>, Option<std::process::ChildStdout>) {
        let shown = format!("{cmd:?}");
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{shown}: {e}"));
        let process = Arc::new(Process {
            pid: child.id() as i32,
            exited: Mutex::new(None),
            changed: Condvar::new(),
        });
        let (stdout, reaped) = (child.stdout.take(), Arc::clone(&process));
        thread::spawn(move || {
            let _ = child.wait();
            *reaped.exited.lock().unwrap() = Some(Instant::now());
            reaped.changed.notify_all();
        });
        (process, stdout)
    }

    pub fn signal(&self, signal: i32) {
        if self.exited.lock().unwrap().is_none() {
            // SAFETY: a signal to a child of ours that has not been reaped yet.
            unsafe { libc::kill(self.pid, signal) };
        }
    }

    /// Waits until it exits or `deadline` passes; when it exited.
    pub fn wait_until(&self, deadline: Instant) -> Option<Instant> {
        let mut exited = self.exited.lock().unwrap();
        while exited.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            exited = self.changed.wait_timeout(exited, left).unwrap().0;
        }
        *exited
    }

    /// SIGKILL, then waits for the exit; when it exited.
    pub fn kill(&self) -> Instant {
        self.signal(libc::SIGKILL);
        self.wait_until(Instant::now() + Duration::from_secs(10)).expect("a killed process exits")
    }
}

/// The node's network: a namespace with a bridge (10.90.0.3/24) that pods join with veth pairs,
/// where the mesh's other services run, and the control plane every pod's agent serves xDS from.
/// The bridge also holds `PROBE_IP`, which istio-cni makes the kubelet's probes come from in
/// ambient mode, and `CLIENT_IP`, for clients other than the node itself.
pub struct Network {
    other: Netns,
    /// Servers whose accept loops must be woken from inside the namespace when dropped.
    servers: Mutex<Option<(App, Database, Option<Collector>)>>,
    /// Metrics streams Envoy has opened to the collector, when there is one.
    exporter_streams: Option<Arc<std::sync::atomic::AtomicUsize>>,
    pub control: IstiodStandIn,
}

impl Network {
    /// The network, its services started; with `exporter`, a metrics collector too.
    pub fn new(exporter: bool) -> Arc<Network> {
        for (program, arg) in [
            ("ip", "-V"),
            ("iptables-restore", "--version"),
            ("setpriv", "--version"),
            ("/usr/bin/python3", "--version"),
        ] {
            require(program, arg);
        }
        let other = Netns::new();
        ip(&other, &["link", "add", "br0", "type", "bridge"]);
        ip(&other, &["addr", "add", &format!("{OTHER_IP}/24"), "dev", "br0"]);
        ip(&other, &["addr", "add", &format!("{CLIENT_IP}/32"), "dev", "br0"]);
        ip(&other, &["addr", "add", &format!("{PROBE_IP}/32"), "dev", "br0"]);
        ip(&other, &["addr", "add", &format!("{LINK_LOCAL_GATEWAY}/32"), "dev", "br0"]);
        ip(&other, &["-6", "addr", "add", &format!("{GATEWAY_IP6}/64"), "dev", "br0", "nodad"]);
        ip(&other, &["-6", "addr", "add", &format!("{PROBE_IP6}/128"), "dev", "br0", "nodad"]);
        ip(&other, &["link", "set", "br0", "up"]);
        let (service, database) =
            other.enter(|| (App::start("10.90.0.3:9080", false), Database::start()));
        let collector = exporter.then(|| other.enter(|| Collector::start("10.90.0.3:15999")));
        Arc::new(Network {
            other,
            exporter_streams: collector.as_ref().map(|c| Arc::clone(&c.streams)),
            servers: Mutex::new(Some((service, database, collector))),
            control: IstiodStandIn::default(),
        })
    }

    /// Joins `pod` to the bridge with address `addr`, its default route through the node.
    fn attach(&self, pod: &Netns, addr: &str, gateway: Gateway, ipv6: bool) {
        let port = format!("veth{}", addr.rsplit('.').next().unwrap_or("0"));
        let node = self.other.path();
        ip(pod, &["link", "add", "eth0", "type", "veth", "peer", "name", &port, "netns", &node]);
        ip(&self.other, &["link", "set", &port, "master", "br0", "up"]);
        ip(pod, &["addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
        ip(pod, &["link", "set", "eth0", "up"]);
        match gateway {
            Gateway::Bridge => ip(pod, &["route", "add", "default", "via", OTHER_IP]),
            Gateway::LinkLocal => {
                ip(pod, &["route", "add", LINK_LOCAL_GATEWAY, "dev", "eth0", "scope", "link"]);
                ip(pod, &["route", "add", "default", "via", LINK_LOCAL_GATEWAY, "dev", "eth0"]);
            }
        }
        if ipv6 {
            ip(pod, &["-6", "addr", "add", &format!("{POD_IP6}/64"), "dev", "eth0", "nodad"]);
            ip(pod, &["-6", "route", "add", "default", "via", GATEWAY_IP6, "dev", "eth0"]);
        }
    }

    /// Runs `f` on the node, outside every pod.
    pub fn client<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.other.enter(f)
    }
}

/// Sets a socket option (`SOL_SOCKET`'s `name`) to `value` on the socket `fd`.
pub fn set_socket_option<T>(fd: std::os::fd::RawFd, name: libc::c_int, value: &T) {
    // SAFETY: a socket of the caller's, and a value of the size given.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        );
    }
}

/// A connection to `target` from `source`, an address of the namespace the calling thread is in:
/// what a client of a given address does (std's TcpStream cannot bind before it connects).
pub fn connect_from(source: &str, target: &str) -> std::io::Result<TcpStream> {
    use std::net::SocketAddr;
    use std::os::fd::FromRawFd;
    let bad = |addr: &str| std::io::Error::other(format!("not an address: {addr}"));
    let to: SocketAddr = target.parse().map_err(|_| bad(target))?;
    let from = SocketAddr::new(source.parse().map_err(|_| bad(source))?, 0);
    // As the kernel takes them: sockaddr_in or sockaddr_in6, in a sockaddr_storage.
    let raw = |a: SocketAddr| -> (libc::sockaddr_storage, libc::socklen_t) {
        // SAFETY: sockaddr_storage is plain data for which all zeroes is valid, and large
        // enough for either address; each is written through a pointer of its own type.
        unsafe {
            let mut s: libc::sockaddr_storage = std::mem::zeroed();
            match a {
                SocketAddr::V4(v4) => {
                    let sin = (&raw mut s).cast::<libc::sockaddr_in>();
                    (*sin).sin_family = libc::AF_INET as libc::sa_family_t;
                    (*sin).sin_port = v4.port().to_be();
                    (*sin).sin_addr.s_addr = u32::from(*v4.ip()).to_be();
                    (s, std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t)
                }
                SocketAddr::V6(v6) => {
                    let sin6 = (&raw mut s).cast::<libc::sockaddr_in6>();
                    (*sin6).sin6_family = libc::AF_INET6 as libc::sa_family_t;
                    (*sin6).sin6_port = v6.port().to_be();
                    (*sin6).sin6_addr.s6_addr = v6.ip().octets();
                    (s, std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t)
                }
            }
        }
    };
    let family = if to.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    let ((from, from_len), (to, to_len)) = (raw(from), raw(to));
    // SAFETY: a new socket that the TcpStream then owns; bind and connect get addresses we own,
    // with their size.
    unsafe {
        let fd = libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        if libc::bind(fd, (&raw const from).cast(), from_len) != 0
            || libc::connect(fd, (&raw const to).cast(), to_len) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let servers = self.servers.lock().unwrap().take();
        self.other.enter(move || drop(servers));
    }
}

fn ip(ns: &Netns, args: &[&str]) {
    let mut c = ns.command("ip");
    c.args(args);
    check(c);
}

pub struct Pod {
    pub options: PodOptions,
    hook: PathBuf,
    pod: Netns,
    dir: PathBuf,
    /// The sidecar's Envoy, or in ambient mode the ztunnel stand-in; none without a mesh.
    envoy: Option<Arc<Process>>,
    app: Option<Arc<Process>>,
    app_events: Mutex<Receiver<(String, Instant)>>,
    app_seen: Vec<(String, Instant)>,
    agent: Option<Agent>,
    /// Dropped last: the network may be shared with other pods.
    network: Arc<Network>,
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Fails the test, naming what is missing, unless `program` runs.
fn require(program: &str, arg: &str) {
    let ok = Command::new(program)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "NOT RUN: `{program} {arg}` failed; the pod replica needs iproute2, iptables, setpriv \
         (util-linux) and Debian's /usr/bin/python3, which `bash scripts/test` installs"
    );
}

/// A copy of `path` that any user may run, made once per test process when `path` itself is
/// not reachable by an unprivileged user (a checkout under /root, say).
fn runnable(path: &Path, name: &str, cache: &'static OnceLock<PathBuf>) -> PathBuf {
    cache
        .get_or_init(|| {
            let reachable = Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg("/usr/bin/test")
                .arg("-x")
                .arg(path)
                .status()
                .is_ok_and(|s| s.success());
            if reachable {
                return path.to_path_buf();
            }
            let dir = std::env::temp_dir().join(format!("envoy-drain-bin-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            set_mode(&dir, 0o755);
            let copy = dir.join(name);
            std::fs::copy(path, &copy).unwrap();
            set_mode(&copy, 0o755);
            copy
        })
        .clone()
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn hook_binary(hook: &Path) -> PathBuf {
    static CACHE: OnceLock<PathBuf> = OnceLock::new();
    runnable(hook, "envoy-drain", &CACHE)
}

fn envoy_binary(envoy: &Path) -> PathBuf {
    static CACHE: OnceLock<PathBuf> = OnceLock::new();
    runnable(envoy, "envoy", &CACHE)
}

/// Runs `cmd` to completion and fails the test with its output unless it succeeds.
fn check(mut cmd: Command) {
    let shown = format!("{cmd:?}");
    let out = cmd.output().unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pod {
    /// Builds the pod on a network of its own and waits until Envoy is live and the app
    /// listens. `envoy` is Envoy's binary (support::envoy::binary), `hook` envoy-drain's.
    pub fn start(envoy: &Path, hook: &Path, options: PodOptions) -> Pod {
        Pod::join(&Network::new(options.exporter), POD_IP, envoy, hook, options)
    }

    /// Builds the pod at `addr` on `network` and waits until Envoy is live and the app listens.
    pub fn join(
        network: &Arc<Network>,
        addr: &str,
        envoy: &Path,
        hook: &Path,
        options: PodOptions,
    ) -> Pod {
        let dir = std::env::temp_dir().join(format!(
            "envoy-drain-pod-{}-{:?}-{addr}",
            std::process::id(),
            thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        set_mode(&dir, 0o755);

        let pod = Netns::new();
        network.attach(&pod, addr, options.gateway, options.ipv6);
        let proxy = options.mesh.sidecar();
        let (envoy, agent) = match options.mesh {
            _ if proxy => {
                let (envoy, agent) = start_sidecar(&pod, network, envoy, &dir, options);
                (Some(envoy), Some(agent))
            }
            DataPlane::Ambient => {
                capture_for_ztunnel(&pod);
                (None, None)
            }
            _ => (None, None),
        };
        let (app, app_events) = if options.client {
            (None, channel().1)
        } else {
            let (app, events) = start_app(&pod, &dir, options.on_sigterm);
            (Some(app), events)
        };
        let mut p = Pod {
            options,
            hook: hook_binary(hook),
            pod,
            dir,
            envoy,
            app,
            app_events: Mutex::new(app_events),
            app_seen: Vec::new(),
            agent,
            network: Arc::clone(network),
        };
        match options.mesh {
            _ if proxy => p.wait_live(),
            _ => {}
        }
        if !options.client {
            p.app_event("listening", Duration::from_secs(10));
        }
        p
    }

    fn wait_live(&self) {
        let limit = Duration::from_secs(30);
        if !super::envoy::until(limit, || self.inside(super::envoy::live)) {
            panic!("Envoy was not LIVE within {limit:?}; its log:\n{}", self.envoy_log());
        }
    }

    /// Whether the agent was asked to drain (`POST /drain`).
    pub fn agent_asked_to_drain(&self) -> bool {
        self.agent.as_ref().is_some_and(|a| a.drained.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Whether the agent was asked to stop the proxy (`POST /quitquitquit`).
    pub fn agent_asked_to_quit(&self) -> bool {
        self.agent.as_ref().is_some_and(|a| a.quit.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// The proxy container gets SIGTERM: the agent stand-in shuts Envoy down as pilot-agent does
    /// (support/agent.rs); whatever still runs at `until` is killed, as the kubelet does at the
    /// end of the grace period. Returns when Envoy has stopped.
    pub fn sigterm_proxy(&self, until: Instant) -> Instant {
        if let Some(agent) = &self.agent {
            self.pod.enter(|| agent.on_sigterm(until));
        }
        match &self.envoy {
            Some(envoy) => envoy.wait_until(until).unwrap_or_else(|| envoy.kill()),
            None => Instant::now(),
        }
    }

    /// Envoy's process.
    pub fn envoy(&self) -> &Process {
        self.envoy.as_deref().expect("a pod with Envoy")
    }

    /// The app's process (none in the client pod).
    pub fn app(&self) -> Option<&Process> {
        self.app.as_deref()
    }

    /// Metrics streams Envoy has opened to the collector.
    pub fn exporter_streams(&self) -> usize {
        self.network
            .exporter_streams
            .as_ref()
            .map_or(0, |n| n.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// ADS streams Envoy has opened to the agent.
    pub fn ads_streams(&self) -> usize {
        self.agent.as_ref().map_or(0, |a| a.streams.load(std::sync::atomic::Ordering::SeqCst))
    }

    pub fn envoy_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("envoy.log")).unwrap_or_default()
    }

    /// The pod's network namespace, for the node's ztunnel to take it.
    pub fn netns(&self) -> &Netns {
        &self.pod
    }

    /// Runs `f` inside the pod (as root: for looking, not for traffic).
    pub fn inside<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.pod.enter(f)
    }

    /// Runs `f` on the other side of the veth pair, where the pod's clients are.
    pub fn client<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.network.client(f)
    }

    /// The pod's network, where a client's node ztunnel runs (`Network::hbone_client`).
    pub fn network(&self) -> &Arc<Network> {
        &self.network
    }

    /// `program` inside the pod as the app's user: the mesh's load generators in the client pod.
    pub fn as_app(&self, program: &str) -> Command {
        let mut c = self.pod.command("setpriv");
        c.arg(format!("--reuid={APP_UID}"))
            .arg(format!("--regid={APP_UID}"))
            .args(["--clear-groups", "--pdeathsig", "SIGKILL"])
            .arg(program)
            .stdin(Stdio::null());
        c
    }

    /// envoy-drain inside the pod, as the proxy container's user: a preStop exec.
    pub fn hook(&self, args: &[&str]) -> Command {
        let (uid, gid) = proxy_user(self.options.capture);
        self.hook_as(uid, gid, args)
    }

    /// envoy-drain inside the pod as another user: a debug container, say.
    pub fn hook_as(&self, uid: u32, gid: u32, args: &[&str]) -> Command {
        let mut c = self.pod.command("setpriv");
        c.arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .args(["--clear-groups", "--pdeathsig", "SIGKILL"])
            .arg(&self.hook)
            .args(args)
            .env_remove("ENVOY_DRAIN_DISABLED")
            .env_remove("MINIMUM_DRAIN_DURATION")
            .env_remove("ENVOY_DRAIN_NODE_IPS")
            .stdin(Stdio::null());
        if self.options.node_ips {
            c.env("ENVOY_DRAIN_NODE_IPS", OTHER_IP);
        }
        c
    }

    /// SIGTERM to the app container, as the kubelet sends it when the pod is deleted.
    pub fn sigterm_app(&self) {
        if let Some(app) = &self.app {
            app.signal(libc::SIGTERM);
        }
    }

    /// The app's lines read so far.
    pub fn app_lines(&self) -> Vec<&str> {
        self.app_seen.iter().map(|(line, _)| line.as_str()).collect()
    }

    /// When the app printed each line read so far that starts with `text`.
    pub fn app_times(&self, text: &str) -> impl Iterator<Item = (&str, Instant)> {
        self.app_seen
            .iter()
            .filter(move |(l, _)| l.starts_with(text))
            .map(|(l, t)| (l.as_str(), *t))
    }

    /// Whether the app has printed a line starting with `text`, without waiting.
    pub fn app_said(&mut self, text: &str) -> bool {
        while let Ok(event) = self.app_events.get_mut().unwrap().try_recv() {
            self.app_seen.push(event);
        }
        self.app_seen.iter().any(|(l, _)| l.starts_with(text))
    }

    /// Waits for the app to print a line starting with `text`; returns when it was read.
    pub fn app_event(&mut self, text: &str, limit: Duration) -> Instant {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.app_events.get_mut().unwrap().recv_timeout(left) {
                Ok((line, at)) => {
                    let found = line.starts_with(text);
                    self.app_seen.push((line, at));
                    if found {
                        return at;
                    }
                }
                Err(_) => panic!(
                    "the app printed no {text:?} within {limit:?}; it printed:\n{}\nits errors:\n{}\n\
                     Envoy's log:\n{}",
                    self.app_lines().join("\n"),
                    std::fs::read_to_string(self.dir.join("app.log")).unwrap_or_default(),
                    self.envoy_log()
                ),
            }
        }
    }

    /// Replaces the pod's iptables tables with `rules` (iptables-restore's format).
    pub fn iptables(&self, rules: &str) {
        let mut restore = self.pod.command("iptables-restore");
        restore.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = restore.spawn().expect("iptables-restore");
        child.stdin.take().expect("piped").write_all(rules.as_bytes()).expect("the rules");
        let out = child.wait_with_output().expect("iptables-restore");
        assert!(out.status.success(), "iptables-restore: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Ends Envoy at once, as pilot-agent does at the end of its drain.
    pub fn stop_envoy(&mut self) {
        self.envoy().kill();
    }

    /// The sandbox's end once the pod's containers have exited: CNI DEL removes the pod's
    /// interface (the bridge plugin deletes it in the pod's namespace), and with it whatever the
    /// kernel was still sending.
    pub fn remove_network(&self) {
        ip(&self.pod, &["link", "del", "eth0"]);
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        if let Some(app) = &self.app {
            app.kill();
        }
        if let Some(envoy) = &self.envoy {
            envoy.kill();
        }
        let agent = self.agent.take();
        self.pod.enter(move || drop(agent));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The proxy container's user and group: Istio's injection template runs it as 1337:1337, or as
/// 0:1337 when the pod uses TPROXY (which needs CAP_NET_ADMIN).
pub fn proxy_user(capture: Capture) -> (u32, u32) {
    match capture {
        Capture::Redirect => (1337, 1337),
        Capture::Tproxy => (0, 1337),
    }
}

/// The sidecar: istio-iptables' rules, the agent, and Envoy fed by it.
fn start_sidecar(
    pod: &Netns,
    network: &Network,
    envoy: &Path,
    dir: &Path,
    options: PodOptions,
) -> (Arc<Process>, Agent) {
    let rules = match options.capture {
        Capture::Redirect => "tests/pod/redirect.rules",
        Capture::Tproxy => "tests/pod/tproxy.rules",
    };
    let mut restore = pod.command("iptables-restore");
    restore.arg(repo(rules));
    check(restore);
    if options.capture == Capture::Tproxy {
        ip(pod, &["rule", "add", "fwmark", "1337", "lookup", "133"]);
        ip(pod, &["route", "add", "local", "default", "dev", "lo", "table", "133"]);
    }
    let (uid, gid) = proxy_user(options.capture);
    let exit_on_zero = options.stats == Stats::ExitOnZero;
    let agent = pod.enter(|| Agent::start(uid, gid, &network.control, exit_on_zero));
    let envoy = start_envoy(pod, envoy, dir, options);
    agent.serves(&envoy);
    (envoy, agent)
}

/// Ambient mode in the pod: istio-cni's rules and policy route (tests/pod/ztunnel.rules); the
/// node's ztunnel then takes the pod (support/ztunnel.rs, `ZtunnelNode`).
fn capture_for_ztunnel(pod: &Netns) {
    let mut restore = pod.command("iptables-restore");
    restore.arg(repo("tests/pod/ztunnel.rules"));
    check(restore);
    ip(pod, &["rule", "add", "fwmark", "0x111/0xfff", "pref", "32764", "lookup", "100"]);
    ip(pod, &["route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "100"]);
}

/// Envoy with `config`, as `user`, logging to the pod's envoy.log.
fn run_envoy(
    ns: &Netns,
    envoy: &Path,
    dir: &Path,
    config: &str,
    (uid, gid): (u32, u32),
    extra: &[&str],
) -> Arc<Process> {
    let path = dir.join("envoy.yaml");
    std::fs::write(&path, config).unwrap();
    set_mode(&path, 0o644);
    let log = std::fs::File::create(dir.join("envoy.log")).unwrap();
    // The access log goes to /dev/stdout, which Envoy opens again as the proxy's user.
    std::os::unix::fs::chown(dir.join("envoy.log"), Some(uid), Some(gid)).unwrap();
    let mut cmd = ns.command("setpriv");
    cmd.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .args(["--clear-groups", "--pdeathsig", "SIGKILL"])
        .arg(envoy_binary(envoy))
        .arg("-c")
        .arg(&path)
        .args(["--drain-strategy", "immediate", "--concurrency", "2"])
        .args(["--disable-hot-restart", "-l", "warning"])
        // The client's access log is read while Envoy runs: flush it often (default: 10 s).
        .args(["--file-flush-interval-msec", "100"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    Process::spawn(cmd).0
}

fn start_envoy(pod: &Netns, envoy: &Path, dir: &Path, options: PodOptions) -> Arc<Process> {
    let mut bootstrap = std::fs::read_to_string(repo("tests/pod/envoy.yaml")).unwrap();
    if options.capture == Capture::Tproxy {
        bootstrap = bootstrap.replace("transparent: false", "transparent: true");
    }
    if options.no_delayed_close {
        let prefix = "stat_prefix: inbound_0.0.0.0_8080";
        assert!(bootstrap.contains(prefix), "tests/pod/envoy.yaml: {prefix}");
        let off = format!("{prefix}\n          delayed_close_timeout: 0s");
        bootstrap = bootstrap.replace(prefix, &off);
    }
    // Envoy takes one --config-yaml: the merges have distinct top-level keys, so they concatenate.
    let merges = [
        (options.stats == Stats::ExitOnZero, "tests/pod/exit-on-zero-stats.yaml"),
        (options.exporter, "tests/pod/exporter.yaml"),
        (options.client && options.mesh.sidecar(), "tests/pod/client.yaml"),
    ];
    let merge: String = merges
        .iter()
        .filter(|(wanted, _)| *wanted)
        .map(|(_, file)| std::fs::read_to_string(repo(file)).unwrap())
        .collect();
    let drain_time = options.drain_time_s.to_string();
    let mut extra = vec!["--drain-time-s", &drain_time];
    if !merge.is_empty() {
        extra.extend(["--config-yaml", &merge]);
    }
    run_envoy(pod, envoy, dir, &bootstrap, proxy_user(options.capture), &extra)
}

fn start_app(
    pod: &Netns,
    dir: &Path,
    on_sigterm: &str,
) -> (Arc<Process>, Receiver<(String, Instant)>) {
    let script = dir.join("app.py");
    std::fs::copy(repo("tests/pod/app.py"), &script).unwrap();
    set_mode(&script, 0o644);
    let mut cmd = pod.command("setpriv");
    cmd.arg(format!("--reuid={APP_UID}"))
        .arg(format!("--regid={APP_UID}"))
        .args(["--clear-groups", "--pdeathsig", "SIGKILL"])
        .arg("/usr/bin/python3")
        .arg(&script)
        .arg(on_sigterm)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("app.log")).unwrap());
    let (app, out) = Process::spawn(cmd);
    let out = out.expect("the app's stdout");
    let (tx, events) = channel();
    thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send((line, Instant::now())).is_err() {
                return;
            }
        }
    });
    (app, events)
}

/// A telemetry collector on the other side: a gRPC server that holds every stream open.
pub struct Collector {
    addr: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub streams: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Collector {
    fn start(addr: &str) -> Collector {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let listener = TcpListener::bind(addr).expect("the collector's port");
        let stop = Arc::new(AtomicBool::new(false));
        let streams = Arc::new(AtomicUsize::new(0));
        let (s, n) = (Arc::clone(&stop), Arc::clone(&streams));
        thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let n = Arc::clone(&n);
                thread::spawn(move || {
                    let writer = Mutex::new(conn.try_clone()?);
                    super::agent::serve_grpc(conn, &writer, &n, |_, _| Ok(()))
                });
            }
        });
        Collector { addr: addr.to_string(), stop, streams }
    }
}

impl Drop for Collector {
    /// Runs inside the other namespace (see Pod's drop), where the wake-up connection lands.
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
    }
}

/// The TCP service on the other side (10.90.0.3:5432): for each line `wait <seconds>` it waits
/// that long and answers `done`.
struct Database {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Database {
    fn start() -> Database {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = TcpListener::bind("10.90.0.3:5432").expect("the database's port");
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s = std::sync::Arc::clone(&stop);
        thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                thread::spawn(move || serve_database(conn));
            }
        });
        Database { stop }
    }
}

fn serve_database(conn: TcpStream) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    for line in BufReader::new(conn).lines().map_while(Result::ok) {
        let wait =
            line.strip_prefix("wait ").and_then(|s| s.trim().parse::<f64>().ok()).unwrap_or(0.0);
        thread::sleep(Duration::from_secs_f64(wait.clamp(0.0, 30.0)));
        if out.write_all(b"done\n").is_err() {
            return;
        }
    }
}

impl Drop for Database {
    /// Runs inside the other namespace (see Pod's drop), where the wake-up connection lands.
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = TcpStream::connect("10.90.0.3:5432");
    }
}
