//! Istio's real node proxy for the replica's ambient mode: ztunnel, built from
//! `../shared/ztunnel` (istio/ztunnel at 62d826530e5c, Apache-2.0; its README), run as a node runs
//! it (`ZtunnelNode`):
//! - in in-pod mode: `inpodmulti`, a stand-in for istio-cni's node agent, hands it each pod's
//!   network namespace over ZDS, and it opens 15001, 15006, 15008 and 15053 inside each, as the
//!   node's ztunnel does; the pods carry istio-cni's in-pod rules (tests/pod/ztunnel.rules);
//! - with HBONE between pods over mTLS, its certificates from its fake CA (`FAKE_CA`);
//! - in a network namespace of its own (its admin ports 15000, 15020 and 15021 there);
//! - with what istiod's workload discovery would tell it from `Control`, a stand-in xDS server:
//!   ztunnel reads a local file once at start (`LOCAL_XDS_PATH`, src/xds.rs `LocalClient`), so a
//!   workload's removal from a service a propagation delay late needs the xDS stream istiod
//!   holds. That stream is gRPC over TLS only (src/tls/control.rs, `grpc_connector`:
//!   `https_only`): a small Python TLS terminator in the node's namespace hands it to `Control`'s
//!   plaintext HTTP/2 server on a Unix socket, with a CA and a certificate made by openssl for
//!   the test.
//!
//! Messages are DeltaDiscoveryRequest / DeltaDiscoveryResponse carrying
//! `istio.workload.Address` resources (ztunnel's proto/workload.proto): a Workload for each pod,
//! the service `app` (10.96.0.10:8080) among its `services` while it serves, and the Service
//! itself. Authorization policies are answered with none.

use super::agent::{delta_request, field, grpc_frame, put_varint, serve_grpc};
use super::h2;
use super::netns::Netns;
use super::pod::Process;
use std::collections::HashSet;
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Duration;

const ADDRESS: &str = "type.googleapis.com/istio.workload.Address";
/// The mesh's service, as istiod names it for ztunnel: `namespace/hostname`.
pub const SERVICE: &str = "default/app.default.svc.cluster.local";
const VIP: [u8; 4] = [10, 96, 0, 10];
const PORT: u64 = 8080;

/// The directory holding `ztunnel` and `examples/inpodmulti`, built once per machine by
/// `../shared/ztunnel/build.sh` (about 9 minutes the first time; `ZTUNNEL_BIN` names a built one).
pub fn binaries() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let what = "ztunnel is needed for ambient mode";
    BUILT
        .get_or_init(|| super::built::built_by("ZTUNNEL_BIN", "../shared/ztunnel/build.sh", what))
        .clone()
}

/// A pod as istiod's workload discovery describes it.
#[derive(Clone)]
struct Workload {
    name: String,
    ip: [u8; 4],
    node: String,
    /// Among the service's endpoints.
    serving: bool,
}

impl Workload {
    fn uid(&self) -> String {
        format!("Kubernetes//Pod/default/{}", self.name)
    }

    /// Its `Address` resource (workload.proto `Workload`): uid (20), name (1), namespace (2),
    /// addresses (3), tunnel_protocol HBONE (5), trust_domain (6), service_account (7), node (9),
    /// services (22: namespace/hostname to its ports), cluster_id (18).
    fn resource(&self) -> Vec<u8> {
        let mut w = Vec::new();
        field(&mut w, 1, self.name.as_bytes());
        field(&mut w, 2, b"default");
        field(&mut w, 3, &self.ip);
        put_varint(&mut w, 5 << 3);
        put_varint(&mut w, 1);
        field(&mut w, 6, b"cluster.local");
        field(&mut w, 7, b"default");
        field(&mut w, 9, self.node.as_bytes());
        field(&mut w, 18, b"Kubernetes");
        field(&mut w, 20, self.uid().as_bytes());
        if self.serving {
            let mut entry = Vec::new();
            field(&mut entry, 1, SERVICE.as_bytes());
            field(&mut entry, 2, &port_list());
            field(&mut w, 22, &entry);
        }
        let mut address = Vec::new();
        field(&mut address, 1, &w);
        address
    }
}

/// `PortList` { ports (1): `Port` { service_port (1), target_port (2) } }: 8080 to 8080.
fn port_list() -> Vec<u8> {
    let mut list = Vec::new();
    field(&mut list, 1, &port());
    list
}

fn port() -> Vec<u8> {
    let mut p = Vec::new();
    put_varint(&mut p, 1 << 3);
    put_varint(&mut p, PORT);
    put_varint(&mut p, 2 << 3);
    put_varint(&mut p, PORT);
    p
}

/// The service's `Address` resource (workload.proto `Service`): name (1), namespace (2),
/// hostname (3), addresses (4: `NetworkAddress` { network (1), address (2) }), ports (5).
fn service() -> Vec<u8> {
    let mut s = Vec::new();
    field(&mut s, 1, b"app");
    field(&mut s, 2, b"default");
    field(&mut s, 3, b"app.default.svc.cluster.local");
    let mut vip = Vec::new();
    field(&mut vip, 2, &VIP);
    field(&mut s, 4, &vip);
    field(&mut s, 5, &port());
    let mut address = Vec::new();
    field(&mut address, 2, &s);
    address
}

/// A DeltaDiscoveryResponse (envoy/service/discovery/v3/discovery.proto): resources (2: a
/// `Resource` { version (1), resource (2: Any { type_url (1), value (2) }), name (3) } each),
/// type_url (4), nonce (5).
fn response(type_url: &str, resources: &[(String, Vec<u8>)], nonce: u64) -> Vec<u8> {
    let mut m = Vec::new();
    for (name, value) in resources {
        let mut any = Vec::new();
        field(&mut any, 1, type_url.as_bytes());
        field(&mut any, 2, value);
        let mut resource = Vec::new();
        field(&mut resource, 1, nonce.to_string().as_bytes());
        field(&mut resource, 2, &any);
        field(&mut resource, 3, name.as_bytes());
        field(&mut m, 2, &resource);
    }
    field(&mut m, 4, type_url.as_bytes());
    field(&mut m, 5, nonce.to_string().as_bytes());
    m
}

/// The stand-in for istiod's workload discovery: the pods and the service, and the ztunnels'
/// open Address streams, to which every change is pushed.
#[derive(Clone, Default)]
pub struct Control {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    workloads: Vec<Workload>,
    nonce: u64,
    streams: Vec<Subscription>,
}

/// An Address stream: where to push, and the last push the ztunnel acknowledged.
struct Subscription {
    conn: Arc<Mutex<UnixStream>>,
    stream: u32,
    acked: Arc<AtomicU64>,
}

impl Control {
    /// Serves on `socket` until the process ends.
    fn serve(&self, socket: &Path) {
        let listener = UnixListener::bind(socket).expect("the xDS stand-in's socket");
        let control = self.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let control = control.clone();
                thread::spawn(move || {
                    let _ = control.stream(conn);
                });
            }
        });
    }

    /// A new pod, pushed to the ztunnels already subscribed.
    fn add(&self, name: &str, ip: &str, node: &str) {
        let ip = ip.parse::<std::net::Ipv4Addr>().expect("an IPv4 address").octets();
        let w = Workload { name: name.into(), ip, node: node.into(), serving: false };
        let mut state = self.state.lock().unwrap();
        state.nonce += 1;
        let message = grpc_frame(&response(ADDRESS, &[(w.uid(), w.resource())], state.nonce));
        state.streams.retain(|s| {
            s.conn.lock().unwrap().write_all(&h2::frame(h2::DATA, 0, s.stream, &message)).is_ok()
        });
        state.workloads.push(w);
    }

    /// Puts the pods named in `serving` among the service's endpoints and takes the rest out,
    /// pushes the pods that changed to every ztunnel, as istiod pushes a workload whose readiness
    /// changed, and returns once each has acknowledged the push.
    pub fn set_serving(&self, serving: &[&str]) {
        let (nonce, acked) = {
            let mut state = self.state.lock().unwrap();
            let mut changed = Vec::new();
            for w in &mut state.workloads {
                let now = serving.contains(&w.name.as_str());
                if w.serving != now {
                    w.serving = now;
                    changed.push((w.uid(), w.resource()));
                }
            }
            state.nonce += 1;
            let nonce = state.nonce;
            let message = grpc_frame(&response(ADDRESS, &changed, nonce));
            state.streams.retain(|s| {
                s.conn
                    .lock()
                    .unwrap()
                    .write_all(&h2::frame(h2::DATA, 0, s.stream, &message))
                    .is_ok()
            });
            (nonce, state.streams.iter().map(|s| Arc::clone(&s.acked)).collect::<Vec<_>>())
        };
        let all = super::envoy::until(Duration::from_secs(10), || {
            acked.iter().all(|a| a.load(Ordering::SeqCst) >= nonce)
        });
        assert!(all, "every ztunnel acknowledged the push of {serving:?}");
    }

    /// One ztunnel's connection: its Address subscription gets every resource and later pushes;
    /// any other type, none.
    fn stream(&self, conn: UnixStream) -> std::io::Result<()> {
        let writer = Arc::new(Mutex::new(conn.try_clone()?));
        let mut answered: HashSet<String> = HashSet::new();
        let acked = Arc::new(AtomicU64::new(0));
        serve_grpc(conn, &writer, &AtomicUsize::new(0), |stream, message| {
            let (type_url, nonce) = delta_request(message);
            if type_url == ADDRESS
                && let Ok(n) = nonce.parse::<u64>()
            {
                acked.fetch_max(n, Ordering::SeqCst);
            }
            if !nonce.is_empty() || type_url.is_empty() || !answered.insert(type_url.clone()) {
                return Ok(());
            }
            let mut state = self.state.lock().unwrap();
            state.nonce += 1;
            let resources: Vec<(String, Vec<u8>)> = match type_url.as_str() {
                ADDRESS => {
                    let pods = state.workloads.iter().map(|w| (w.uid(), w.resource()));
                    pods.chain([(SERVICE.to_string(), service())]).collect()
                }
                _ => Vec::new(),
            };
            let message = grpc_frame(&response(&type_url, &resources, state.nonce));
            writer.lock().unwrap().write_all(&h2::frame(h2::DATA, 0, stream, &message))?;
            if type_url == ADDRESS {
                let acked = Arc::clone(&acked);
                state.streams.push(Subscription { conn: Arc::clone(&writer), stream, acked });
            }
            Ok(())
        })
    }
}

/// A Python TLS terminator: accepts TLS (ALPN h2) on 127.0.0.1:15012 and pipes each connection to
/// the Unix socket argv[3], in one thread per connection that alone reads and writes its TLS
/// socket (OpenSSL's objects are not shared between threads).
const TERMINATOR: &str = "
import select, socket, ssl, sys, threading
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
ctx.set_alpn_protocols(['h2'])
server = socket.create_server(('127.0.0.1', 15012))
def serve(conn):
    try:
        tls = ctx.wrap_socket(conn, server_side=True)
    except (OSError, ssl.SSLError):
        conn.close()
        return
    up = socket.socket(socket.AF_UNIX)
    up.connect(sys.argv[3])
    try:
        while True:
            ready = [tls] if tls.pending() else select.select([tls, up], [], [])[0]
            if tls in ready:
                data = tls.recv(65536)
                if not data:
                    break
                up.sendall(data)
            if up in ready:
                data = up.recv(65536)
                if not data:
                    break
                tls.sendall(data)
    except (OSError, ssl.SSLError):
        pass
    finally:
        tls.close()
        up.close()
print('listening', file=sys.stderr, flush=True)
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
";

/// What every node's ztunnel shares: the xDS stand-in, its socket, and the certificates that let
/// ztunnel trust it.
struct Shared {
    control: Control,
    dir: PathBuf,
}

impl Shared {
    /// What the nodes of `control` share: made by the first, kept while any lives.
    fn of(control: &Control) -> Arc<Shared> {
        static SHARED: Mutex<Option<std::sync::Weak<Shared>>> = Mutex::new(None);
        let mut s = SHARED.lock().unwrap();
        match s.as_ref().and_then(std::sync::Weak::upgrade) {
            Some(shared) if Arc::ptr_eq(&shared.control.state, &control.state) => shared,
            _ => {
                let shared = Arc::new(Shared::new(control));
                *s = Some(Arc::downgrade(&shared));
                shared
            }
        }
    }

    fn new(control: &Control) -> Shared {
        let dir = std::env::temp_dir().join(format!(
            "envoy-drain-ztunnel-{}-{:?}",
            std::process::id(),
            thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A CA, and a certificate for 127.0.0.1 it signs: what ztunnel checks istiod's against.
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl").args(args).current_dir(&dir).output();
            let out = out.unwrap_or_else(|e| panic!("NOT RUN: openssl: {e}"));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "openssl {args:?}: {err}");
        };
        let ec = ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out"];
        openssl(&[&ec[..], &["ca.key"]].concat());
        openssl(&[&ec[..], &["xds.key"]].concat());
        let ca = "/CN=istiod test CA";
        let ca_ext = ["basicConstraints=critical,CA:TRUE", "keyUsage=critical,keyCertSign"];
        let days = ["-days", "2"];
        let ca_cert = ["req", "-x509", "-key", "ca.key", "-out", "ca.pem", "-subj", ca];
        openssl(&[&ca_cert[..], &days, &["-addext", ca_ext[0], "-addext", ca_ext[1]]].concat());
        openssl(&["req", "-new", "-key", "xds.key", "-out", "xds.csr", "-subj", "/CN=istiod"]);
        let ext =
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n";
        std::fs::write(dir.join("xds.ext"), ext).unwrap();
        let sign = ["x509", "-req", "-in", "xds.csr", "-CA", "ca.pem", "-CAkey", "ca.key"];
        let out = ["-CAcreateserial", "-out", "xds.pem", "-extfile", "xds.ext"];
        openssl(&[&sign[..], &out, &days].concat());
        control.serve(&dir.join("xds.sock"));
        Shared { control: control.clone(), dir }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A node of one pod: its namespace, its ztunnel, the node agent stand-in that hands it the pod,
/// and the TLS terminator to the xDS stand-in. Everything is gone when dropped. One pod a node:
/// `inpodmulti` waits for ztunnel's acknowledgement of its first pod only, then exits (its
/// `wait_forever` returns at the first), which may cut a second pod's start off; ztunnel keeps
/// the pods it took when the agent goes.
pub struct ZtunnelNode {
    processes: Vec<Arc<Process>>,
    _ns: Netns,
    _shared: Arc<Shared>,
    log: PathBuf,
}

/// A pod a node's ztunnel serves: its namespace, its name (a Workload), its address.
pub struct Served<'a> {
    pub ns: &'a Netns,
    pub name: &'a str,
    pub ip: &'a str,
}

impl ZtunnelNode {
    /// Starts node `name`'s ztunnel for `pod`, telling `control` of it (not serving yet), and
    /// waits until it takes HBONE connections there.
    pub fn start(name: &str, control: &Control, pod: &Served<'_>) -> ZtunnelNode {
        let shared = Shared::of(control);
        control.add(pod.name, pod.ip, name);
        let bins = binaries();
        let ns = Netns::new();
        let dir = &shared.dir.clone();
        let log = dir.join(format!("{name}.log"));
        let zds = dir.join(format!("{name}-zds.sock"));
        let file = |name: &str| std::fs::File::create(dir.join(name)).unwrap();
        let mut terminator = ns.command("/usr/bin/python3");
        terminator
            .args(["-c", TERMINATOR])
            .args([dir.join("xds.pem"), dir.join("xds.key"), dir.join("xds.sock")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file(&format!("{name}-tls.log")));
        let mut agent = Command::new(bins.join("examples/inpodmulti"));
        agent.env("INPOD_UDS", &zds).stdin(Stdio::null()).stdout(Stdio::null());
        agent.stderr(file(&format!("{name}-zds.log")));
        // inpodmulti opens /var/run/netns/<name>: climbing from there to / reaches the pod's own
        // handle, with nothing to mount or clean up.
        std::fs::create_dir_all("/var/run/netns").unwrap();
        agent.arg(format!("../../..{}=default/{}/default", pod.ns.path(), pod.name));
        let mut ztunnel = ns.command(&bins.join("ztunnel").display().to_string());
        ztunnel
            .envs([
                ("PROXY_MODE", "shared"),
                ("FAKE_CA", "true"),
                ("XDS_ADDRESS", "https://127.0.0.1:15012"),
                ("NODE_NAME", name),
                ("CLUSTER_ID", "Kubernetes"),
                ("RUST_LOG", "info"),
            ])
            .env("INPOD_UDS", &zds)
            .env("XDS_ROOT_CA", dir.join("ca.pem"))
            .stdin(Stdio::null())
            .stdout(file(&format!("{name}.log")))
            .stderr(file(&format!("{name}.err")));
        let processes =
            vec![Process::spawn(terminator).0, Process::spawn(agent).0, Process::spawn(ztunnel).0];
        let node = ZtunnelNode { processes, _ns: ns, _shared: shared, log };
        // Connecting from inside would be captured (to 15001): the pod's own table tells.
        let listening = || {
            let table = pod.ns.enter(|| std::fs::read_to_string("/proc/thread-self/net/tcp6"));
            let hbone = format!(":{:04X} ", 15008);
            table.unwrap_or_default().lines().any(|l| l.contains(&hbone) && l.contains(" 0A "))
        };
        let ready = super::envoy::until(Duration::from_secs(30), listening);
        let agent = std::fs::read_to_string(dir.join(format!("{name}-zds.log")));
        let agent = agent.unwrap_or_default();
        assert!(
            ready,
            "ztunnel took no pod {}; the node agent's log:\n{agent}\nztunnel's:\n{}",
            pod.name,
            node.log()
        );
        node
    }

    /// ztunnel's log so far: its access log among it.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ZtunnelNode {
    fn drop(&mut self) {
        for p in self.processes.iter().rev() {
            p.kill();
        }
    }
}
