//! A replica of a Kubernetes pod with an Istio sidecar, from real parts:
//! - two network namespaces joined by a veth pair: the pod (10.90.0.2) and the rest of the mesh
//!   (10.90.0.3), where an HTTP service (9080) and a TCP service (5432) run;
//! - in the pod, the iptables rules istio-iptables writes (tests/pod/redirect.rules, or
//!   tproxy.rules with its policy route);
//! - Envoy as the proxy's user (uid 1337; uid 0 with gid 1337 under TPROXY, as Istio's injection
//!   template runs it), with an Istio-shaped bootstrap (tests/pod/envoy.yaml) and Istio's default
//!   stats matcher or the one EXIT_ON_ZERO_ACTIVE_CONNECTIONS makes;
//! - a stand-in agent holding Envoy's ADS stream over a Unix socket (support/agent.rs);
//! - the application (tests/pod/app.py) as an unprivileged user, calling the other service
//!   through the sidecar.
//!
//! The hook runs as the proxy's user inside the pod, as a preStop exec does. Everything is gone
//! when the `Pod` is dropped, also when a test fails.

use super::agent::Agent;
use super::app::App;
use super::netns::Netns;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, channel};
use std::thread;
use std::time::{Duration, Instant};

pub const POD_IP: &str = "10.90.0.2";
pub const OTHER_IP: &str = "10.90.0.3";
/// Where a client outside the pod sends its requests.
pub const APP: &str = "10.90.0.2:8080";
pub const APP_UID: u32 = 1000;

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
pub struct Options {
    pub capture: Capture,
    pub stats: Stats,
    /// What the app does on SIGTERM (tests/pod/app.py): serve, close, call or tcp.
    pub on_sigterm: &'static str,
    /// Envoy's --drain-time-s (Istio passes drainDuration, 45 s by default).
    pub drain_time_s: u32,
    /// Envoy streams its metrics to a collector on the other side (tests/pod/exporter.yaml).
    pub exporter: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            capture: Capture::Redirect,
            stats: Stats::IstioDefault,
            on_sigterm: "serve",
            drain_time_s: 45,
            exporter: false,
        }
    }
}

pub struct Pod {
    pub options: Options,
    hook: PathBuf,
    pod: Netns,
    other: Netns,
    dir: PathBuf,
    envoy: Child,
    app: Child,
    app_events: Receiver<(String, Instant)>,
    app_seen: Vec<String>,
    /// Servers whose accept loops must be woken from inside their namespaces when dropped.
    service: Option<App>,
    database: Option<Database>,
    collector: Option<Collector>,
    agent: Option<Agent>,
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
    /// Builds the pod and waits until Envoy is live and the app listens. `envoy` is Envoy's
    /// binary (support::envoy::binary), `hook` envoy-drain's.
    pub fn start(envoy: &Path, hook: &Path, options: Options) -> Pod {
        for (program, arg) in [
            ("ip", "-V"),
            ("iptables-restore", "--version"),
            ("setpriv", "--version"),
            ("/usr/bin/python3", "--version"),
        ] {
            require(program, arg);
        }
        let dir = std::env::temp_dir().join(format!(
            "envoy-drain-pod-{}-{:?}",
            std::process::id(),
            thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        set_mode(&dir, 0o755);

        let (pod, other) = (Netns::new(), Netns::new());
        let ip = |ns: &Netns, args: &[&str]| {
            let mut c = ns.command("ip");
            c.args(args);
            check(c);
        };
        let peer = other.path();
        ip(
            &pod,
            &[
                "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &peer,
            ],
        );
        for (ns, addr) in [(&pod, POD_IP), (&other, OTHER_IP)] {
            ip(ns, &["addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            ip(ns, &["link", "set", "eth0", "up"]);
        }
        let rules = match options.capture {
            Capture::Redirect => "tests/pod/redirect.rules",
            Capture::Tproxy => "tests/pod/tproxy.rules",
        };
        let mut restore = pod.command("iptables-restore");
        restore.arg(repo(rules));
        check(restore);
        if options.capture == Capture::Tproxy {
            ip(&pod, &["rule", "add", "fwmark", "1337", "lookup", "133"]);
            ip(
                &pod,
                &[
                    "route", "add", "local", "default", "dev", "lo", "table", "133",
                ],
            );
        }

        let (service, database) =
            other.enter(|| (App::start("10.90.0.3:9080", false), Database::start()));
        let collector = options
            .exporter
            .then(|| other.enter(|| Collector::start("10.90.0.3:15999")));
        let (uid, gid) = proxy_user(options.capture);
        let agent = pod.enter(|| Agent::start(uid, gid));
        let envoy = start_envoy(&pod, envoy, &dir, options);
        let (app, app_events) = start_app(&pod, &dir, options.on_sigterm);
        let mut p = Pod {
            options,
            hook: hook_binary(hook),
            pod,
            other,
            dir,
            envoy,
            app,
            app_events,
            app_seen: Vec::new(),
            service: Some(service),
            database: Some(database),
            collector,
            agent: Some(agent),
        };
        p.wait_live();
        p.app_event("listening", Duration::from_secs(10));
        p
    }

    fn wait_live(&self) {
        let limit = Duration::from_secs(30);
        if !super::envoy::until(limit, || self.inside(super::envoy::live)) {
            panic!(
                "Envoy was not LIVE within {limit:?}; its log:\n{}",
                self.envoy_log()
            );
        }
    }

    /// Whether the agent was asked to drain (`POST /drain`).
    pub fn agent_asked_to_drain(&self) -> bool {
        self.agent
            .as_ref()
            .is_some_and(|a| a.drained.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Whether the agent was asked to stop the proxy (`POST /quitquitquit`).
    pub fn agent_asked_to_quit(&self) -> bool {
        self.agent
            .as_ref()
            .is_some_and(|a| a.quit.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Metrics streams Envoy has opened to the collector.
    pub fn exporter_streams(&self) -> usize {
        self.collector
            .as_ref()
            .map_or(0, |c| c.streams.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// ADS streams Envoy has opened to the agent.
    pub fn ads_streams(&self) -> usize {
        self.agent
            .as_ref()
            .map_or(0, |a| a.streams.load(std::sync::atomic::Ordering::SeqCst))
    }

    pub fn envoy_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("envoy.log")).unwrap_or_default()
    }

    /// Runs `f` inside the pod (as root: for looking, not for traffic).
    pub fn inside<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.pod.enter(f)
    }

    /// Runs `f` on the other side of the veth pair, where the pod's clients are.
    pub fn client<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.other.enter(f)
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
            .stdin(Stdio::null());
        c
    }

    /// SIGTERM to the app container, as the kubelet sends it when the pod is deleted.
    pub fn sigterm_app(&self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.app.id() as i32, libc::SIGTERM) };
    }

    /// The app's lines read so far.
    pub fn app_lines(&self) -> &[String] {
        &self.app_seen
    }

    /// Waits for the app to print a line starting with `text`; returns when it was read.
    pub fn app_event(&mut self, text: &str, limit: Duration) -> Instant {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.app_events.recv_timeout(left) {
                Ok((line, at)) => {
                    self.app_seen.push(line.clone());
                    if line.starts_with(text) {
                        return at;
                    }
                }
                Err(_) => panic!(
                    "the app printed no {text:?} within {limit:?}; it printed:\n{}\nits errors:\n{}\n\
                     Envoy's log:\n{}",
                    self.app_seen.join("\n"),
                    std::fs::read_to_string(self.dir.join("app.log")).unwrap_or_default(),
                    self.envoy_log()
                ),
            }
        }
    }

    /// Ends Envoy at once, as pilot-agent does at the end of its drain.
    pub fn stop_envoy(&mut self) {
        let _ = self.envoy.kill();
        let _ = self.envoy.wait();
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        for child in [&mut self.app, &mut self.envoy] {
            let _ = child.kill();
            let _ = child.wait();
        }
        let (service, database, agent) =
            (self.service.take(), self.database.take(), self.agent.take());
        self.other.enter(move || drop((service, database)));
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

fn start_envoy(pod: &Netns, envoy: &Path, dir: &Path, options: Options) -> Child {
    let mut bootstrap = std::fs::read_to_string(repo("tests/pod/envoy.yaml")).unwrap();
    if options.capture == Capture::Tproxy {
        bootstrap = bootstrap.replace("transparent: false", "transparent: true");
    }
    let path = dir.join("envoy.yaml");
    std::fs::write(&path, bootstrap).unwrap();
    set_mode(&path, 0o644);
    let log = std::fs::File::create(dir.join("envoy.log")).unwrap();
    let (uid, gid) = proxy_user(options.capture);
    let mut cmd = pod.command("setpriv");
    cmd.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .args(["--clear-groups", "--pdeathsig", "SIGKILL"])
        .arg(envoy_binary(envoy))
        .arg("-c")
        .arg(&path)
        .args(["--drain-time-s", &options.drain_time_s.to_string()])
        .args(["--drain-strategy", "immediate", "--concurrency", "2"])
        .args(["--disable-hot-restart", "-l", "warning"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    // Envoy takes one --config-yaml: the merges have distinct top-level keys, so they concatenate.
    let merges = [
        (
            options.stats == Stats::ExitOnZero,
            "tests/pod/exit-on-zero-stats.yaml",
        ),
        (options.exporter, "tests/pod/exporter.yaml"),
    ];
    let merge: String = merges
        .iter()
        .filter(|(wanted, _)| *wanted)
        .map(|(_, file)| std::fs::read_to_string(repo(file)).unwrap())
        .collect();
    if !merge.is_empty() {
        cmd.args(["--config-yaml", &merge]);
    }
    cmd.spawn().expect("failed to start Envoy")
}

fn start_app(pod: &Netns, dir: &Path, on_sigterm: &str) -> (Child, Receiver<(String, Instant)>) {
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
    let mut app = cmd.spawn().expect("failed to start the app");
    let out = app.stdout.take().unwrap();
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
                thread::spawn(move || super::agent::serve_grpc(conn, &n, false));
            }
        });
        Collector {
            addr: addr.to_string(),
            stop,
            streams,
        }
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
        let wait = line
            .strip_prefix("wait ")
            .and_then(|s| s.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
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
