//! A stand-in for Istio's pilot-agent in the pod replica, with istiod behind it:
//! - the ADS server that every sidecar's Envoy holds a gRPC stream to for its whole life, over a
//!   Unix socket (cluster `xds-grpc`). It answers each resource type Envoy asks for once, with an
//!   empty set, as istiod answers a pod with no extra config, so Envoy finishes starting (Istio's
//!   bootstrap sets `initial_fetch_timeout: 0s`: without answers it would wait forever); except
//!   endpoints (EDS), which come from the network's `IstiodStandIn` and are pushed again when it
//!   changes them, as istiod pushes EDS when a pod leaves a service;
//! - the status port 15020: `POST /drain` and `POST /quitquitquit`;
//! - what pilot-agent does on SIGTERM (`on_sigterm`).
//!
//! Its threads run as the proxy's user, as pilot-agent does.
//!
//! Just enough HTTP/2 and gRPC: SETTINGS and PING are acknowledged, every request stream gets
//! `:status 200` and `content-type: application/grpc`, and received data is given back to the flow
//! control windows. Messages are DeltaDiscoveryRequest / DeltaDiscoveryResponse
//! (envoy/service/discovery/v3/discovery.proto).

use super::h2;
use super::http::Conn;
use super::pod::Process;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// The abstract socket the bootstrap's xds-grpc cluster names: one per network namespace.
pub const XDS_SOCKET: &str = "envoy-drain-pod-xds";

/// EDS's resource type, and the one cluster whose endpoints the control plane serves: the mesh's
/// service, named as istiod names it (tests/pod/client.yaml).
const ENDPOINTS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const SERVICE_CLUSTER: &str = "outbound|8080||app.default.svc.cluster.local";

/// pilot-agent's defaults (istio/istio pkg/envoy/agent.go, pilot/cmd/pilot-agent/options):
/// terminationDrainDuration, MINIMUM_DRAIN_DURATION, and EXIT_ON_ZERO_ACTIVE_CONNECTIONS's poll.
pub const TERMINATION_DRAIN: Duration = Duration::from_secs(5);
pub const MINIMUM_DRAIN: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_secs(1);

/// The mesh's endpoints for the service, as istiod knows them, and the EDS streams it pushes
/// them to.
#[derive(Clone, Default)]
pub struct IstiodStandIn {
    state: Arc<Mutex<Endpoints>>,
}

#[derive(Default)]
struct Endpoints {
    addrs: Vec<String>,
    version: u64,
    /// Open EDS streams: the connection's writer and the stream id.
    streams: Vec<(Arc<Mutex<UnixStream>>, u32)>,
}

impl IstiodStandIn {
    /// Sets the service's endpoints (`ip:port`) and pushes them to every sidecar subscribed.
    pub fn set_endpoints(&self, addrs: &[&str]) {
        let mut state = self.state.lock().unwrap();
        state.addrs = addrs.iter().map(|a| a.to_string()).collect();
        state.version += 1;
        let message = grpc_frame(&endpoints_response(&state.addrs, state.version));
        state.streams.retain(|(conn, stream)| {
            conn.lock().unwrap().write_all(&h2::frame(h2::DATA, 0, *stream, &message)).is_ok()
        });
    }

    /// Answers an EDS subscription on `stream` and keeps it for later pushes.
    fn subscribe(&self, conn: &Arc<Mutex<UnixStream>>, stream: u32) -> std::io::Result<()> {
        let mut state = self.state.lock().unwrap();
        let message = grpc_frame(&endpoints_response(&state.addrs, state.version));
        conn.lock().unwrap().write_all(&h2::frame(h2::DATA, 0, stream, &message))?;
        state.streams.push((Arc::clone(conn), stream));
        Ok(())
    }
}

pub struct Agent {
    stop: Arc<AtomicBool>,
    /// ADS streams opened so far.
    pub streams: Arc<AtomicUsize>,
    /// Someone asked for `POST /quitquitquit` on 15020, pilot-agent's "stop the proxy now".
    pub quit: Arc<AtomicBool>,
    /// Someone asked for `POST /drain` on 15020, what Istio's native-sidecar preStop does.
    pub drained: Arc<AtomicBool>,
    /// The pod sets EXIT_ON_ZERO_ACTIVE_CONNECTIONS=true.
    exit_on_zero: bool,
    /// The Envoy it runs, once started.
    envoy: Arc<OnceLock<Arc<Process>>>,
}

impl Agent {
    /// Starts in the caller's network namespace, its threads as `uid`:`gid`, serving endpoints
    /// from `control`.
    pub fn start(uid: u32, gid: u32, control: &IstiodStandIn, exit_on_zero: bool) -> Agent {
        let stop = Arc::new(AtomicBool::new(false));
        let streams = Arc::new(AtomicUsize::new(0));
        let quit = Arc::new(AtomicBool::new(false));
        let drained = Arc::new(AtomicBool::new(false));
        let envoy: Arc<OnceLock<Arc<Process>>> = Arc::new(OnceLock::new());
        let (s, n) = (Arc::clone(&stop), Arc::clone(&streams));
        let asked = StatusAsked {
            quit: Arc::clone(&quit),
            drained: Arc::clone(&drained),
            envoy: Arc::clone(&envoy),
        };
        let control = control.clone();
        let (tx, ready) = std::sync::mpsc::channel();
        thread::spawn(move || {
            as_user(uid, gid);
            let addr = SocketAddr::from_abstract_name(XDS_SOCKET).expect("an abstract name");
            let xds = UnixListener::bind_addr(&addr).expect("the agent's xDS socket");
            let status = TcpListener::bind("0.0.0.0:15020").expect("the agent's port 15020");
            let _ = tx.send(());
            let stop = Arc::clone(&s);
            thread::spawn(move || serve_status(status, &stop, &asked));
            for conn in xds.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (n, control) = (Arc::clone(&n), control.clone());
                thread::spawn(move || {
                    let _ = serve_ads(conn, &n, &control);
                });
            }
        });
        ready.recv_timeout(Duration::from_secs(10)).expect("the agent started");
        Agent { stop, streams, quit, drained, exit_on_zero, envoy }
    }

    /// The Envoy this agent runs: what `/quitquitquit` and SIGTERM stop.
    pub fn serves(&self, envoy: &Arc<Process>) {
        let _ = self.envoy.set(Arc::clone(envoy));
    }

    /// What pilot-agent does on SIGTERM (istio/istio pkg/envoy/agent.go at 86c9f01; see
    /// docs/how-it-works.md): after `/drain`, stop Envoy at once ("Agent already drained,
    /// exiting immediately"); otherwise drain the inbound listeners, then either sleep
    /// terminationDrainDuration or, with EXIT_ON_ZERO_ACTIVE_CONNECTIONS, sleep
    /// MINIMUM_DRAIN_DURATION and poll the connection stats every second until they read zero,
    /// the answer is empty, or five polls in a row failed; then stop Envoy. `/quitquitquit` ends
    /// any of it at once. Runs inside the pod; gives up at `until`, where the kubelet kills.
    pub fn on_sigterm(&self, until: Instant) {
        let Some(envoy) = self.envoy.get() else {
            return;
        };
        // Each wait ends early when Envoy stops (after /quitquitquit, say).
        let stopped_before = |at: Instant| envoy.wait_until(at.min(until)).is_some();
        if !self.drained.load(Ordering::SeqCst) {
            let _ = Conn::open("127.0.0.1:15000")
                .and_then(|mut c| c.request("POST", "/drain_listeners?inboundonly&graceful"));
            if !self.exit_on_zero {
                if stopped_before(Instant::now() + TERMINATION_DRAIN) {
                    return;
                }
            } else if stopped_before(Instant::now() + MINIMUM_DRAIN) {
                return;
            } else {
                let mut failures = 0;
                loop {
                    match active_connections() {
                        Some(0) => break,
                        Some(_) => failures = 0,
                        None => {
                            failures += 1;
                            if failures >= 5 {
                                break;
                            }
                        }
                    }
                    if stopped_before(Instant::now() + POLL) {
                        return;
                    }
                }
            }
        }
        envoy.kill();
    }
}

/// One poll of pilot-agent's EXIT_ON_ZERO_ACTIVE_CONNECTIONS loop (istio/istio pkg/envoy/agent.go,
/// activeProxyConnections): the sum of `listener.*.downstream_cx_active` without the per-worker
/// lines, internal listeners and its own known listeners; `Some(0)` also for an empty answer (the
/// stat is not enabled: it stops at once); `None` when the request failed.
fn active_connections() -> Option<u64> {
    let known = [
        "listener.0.0.0.0_15021.downstream_cx_active",
        "listener.0.0.0.0_15090.downstream_cx_active",
        "listener.admin.downstream_cx_active",
        "listener.admin.main_thread.downstream_cx_active",
    ];
    let answer = Conn::open("127.0.0.1:15000")
        .and_then(|mut c| c.get("/stats?usedonly&filter=downstream_cx_active$"))
        .ok()?;
    Some(
        answer
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
            .sum(),
    )
}

impl Drop for Agent {
    /// Runs inside the pod (see Pod's drop), where the wake-up connections land.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let addr = SocketAddr::from_abstract_name(XDS_SOCKET).expect("an abstract name");
        let _ = UnixStream::connect_addr(&addr);
        let _ = TcpStream::connect("127.0.0.1:15020");
    }
}

/// Changes the calling thread's user, and only its: the raw system call, not libc's wrapper, which
/// would change every thread of the test.
pub fn as_user(uid: u32, gid: u32) {
    // SAFETY: plain system calls on this thread's credentials; setgroups first, while privileged.
    unsafe {
        assert_eq!(libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<u32>()), 0);
        assert_eq!(libc::syscall(libc::SYS_setresgid, gid, gid, gid), 0);
        assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
    }
}

/// What was asked of the agent's status port.
struct StatusAsked {
    quit: Arc<AtomicBool>,
    drained: Arc<AtomicBool>,
    envoy: Arc<OnceLock<Arc<Process>>>,
}

/// pilot-agent's status port: every request answers 200 `OK`. `POST /quitquitquit` is noted and
/// stops Envoy at once; `POST /drain` is noted and passed on to Envoy as pilot-agent does for a
/// sidecar (istio/istio pkg/envoy/agent.go, DrainNow: inbound only, graceful, skip_exit).
fn serve_status(listener: TcpListener, stop: &AtomicBool, asked: &StatusAsked) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut conn) = conn else { continue };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        // The request head, which may come in several writes.
        let mut buf = [0u8; 4096];
        let mut n = 0;
        while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut buf[n..]) {
                Ok(0) | Err(_) => break,
                Ok(more) => n += more,
            }
        }
        let quit = buf[..n].starts_with(b"POST /quitquitquit ");
        if quit {
            asked.quit.store(true, Ordering::SeqCst);
        }
        if buf[..n].starts_with(b"POST /drain ") {
            asked.drained.store(true, Ordering::SeqCst);
            if let Ok(mut envoy) = TcpStream::connect("127.0.0.1:15000") {
                let _ = envoy.write_all(
                    b"POST /drain_listeners?inboundonly&graceful&skip_exit HTTP/1.1\r\n\
                      Host: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                let _ = envoy.read(&mut buf);
            }
        }
        let _ =
            conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK");
        if let Some(envoy) = asked.envoy.get().filter(|_| quit) {
            envoy.kill();
        }
    }
}

/// The ADS server on one connection of Envoy's: each resource type asked for is answered once
/// with an empty set, but endpoints, which come from `control` and are pushed again whenever it
/// changes them.
fn serve_ads(
    conn: UnixStream,
    streams: &AtomicUsize,
    control: &IstiodStandIn,
) -> std::io::Result<()> {
    let writer = Arc::new(Mutex::new(conn.try_clone()?));
    let mut answered: HashSet<String> = HashSet::new();
    serve_grpc(conn, &writer, streams, |stream, message| {
        let (type_url, nonce) = delta_request(message);
        // An answer per type, to its first request; ACKs carry the nonce back.
        if !nonce.is_empty() || type_url.is_empty() || !answered.insert(type_url.clone()) {
            return Ok(());
        }
        if type_url == ENDPOINTS {
            return control.subscribe(&writer, stream);
        }
        let reply = grpc_frame(&delta_response(&type_url, answered.len()));
        writer.lock().unwrap().write_all(&h2::frame(h2::DATA, 0, stream, &reply))
    })
}

/// A gRPC server on one connection: every stream is accepted and held open, and each message it
/// carries goes to `on_message` with its stream id. Writes go through `writer`, which others
/// (EDS pushes) may share.
pub fn serve_grpc<W: Write>(
    mut conn: impl Read,
    writer: &Mutex<W>,
    streams: &AtomicUsize,
    mut on_message: impl FnMut(u32, &[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut preface = [0u8; h2::PREFACE.len()];
    conn.read_exact(&mut preface)?;
    if preface != h2::PREFACE {
        return Ok(());
    }
    let write = |bytes: &[u8]| writer.lock().unwrap().write_all(bytes);
    write(&h2::frame(h2::SETTINGS, 0, 0, &[]))?;
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let f = h2::read_frame(&mut conn)?;
        let mut ack = Vec::new();
        h2::acknowledge(&f, &mut ack)?;
        write(&ack)?;
        match f.kind {
            h2::HEADERS => {
                streams.fetch_add(1, Ordering::SeqCst);
                // :status 200 (static index 8), then content-type (static name 31, past the 4-bit
                // prefix: 0x0f 0x10) as a literal of 16 bytes.
                let mut block = vec![0x88, 0x0f, 0x10, 16];
                block.extend_from_slice(b"application/grpc");
                write(&h2::frame(h2::HEADERS, h2::END_HEADERS, f.stream, &block))?;
            }
            h2::DATA => {
                let len = f.payload.len();
                if len > 0 {
                    let more = (len as u32).to_be_bytes();
                    write(&h2::frame(h2::WINDOW_UPDATE, 0, 0, &more))?;
                    write(&h2::frame(h2::WINDOW_UPDATE, 0, f.stream, &more))?;
                }
                // Skip the padding length and the padding when the frame is padded.
                let data = if f.flags & h2::PADDED != 0 {
                    let pad = usize::from(f.payload.first().copied().unwrap_or(0));
                    f.payload.get(1..len.saturating_sub(pad)).unwrap_or_default()
                } else {
                    &f.payload[..]
                };
                pending.extend_from_slice(data);
                while let Some(message) = grpc_message(&mut pending) {
                    on_message(f.stream, &message)?;
                }
            }
            h2::GOAWAY => return Ok(()),
            _ => {}
        }
    }
}

/// Takes one length-prefixed gRPC message off the front of `buf`, when it is all there.
fn grpc_message(buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    if buf.len() < 5 {
        return None;
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if buf.len() < 5 + len {
        return None;
    }
    let message = buf[5..5 + len].to_vec();
    buf.drain(..5 + len);
    Some(message)
}

pub fn grpc_frame(message: &[u8]) -> Vec<u8> {
    let mut f = vec![0];
    f.extend_from_slice(&(message.len() as u32).to_be_bytes());
    f.extend_from_slice(message);
    f
}

fn varint(buf: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*at)?;
        *at += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The type_url (field 2) and response_nonce (field 6) of a DeltaDiscoveryRequest.
pub fn delta_request(message: &[u8]) -> (String, String) {
    let (mut type_url, mut nonce) = (String::new(), String::new());
    let mut at = 0;
    while at < message.len() {
        let Some(key) = varint(message, &mut at) else {
            break;
        };
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                if varint(message, &mut at).is_none() {
                    break;
                }
            }
            1 => at += 8,
            2 => {
                let Some(len) = varint(message, &mut at) else {
                    break;
                };
                let end = at.saturating_add(len as usize).min(message.len());
                let text = String::from_utf8_lossy(&message[at..end]).into_owned();
                match field {
                    2 => type_url = text,
                    6 => nonce = text,
                    _ => {}
                }
                at = end;
            }
            5 => at += 4,
            _ => break,
        }
    }
    (type_url, nonce)
}

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited protobuf field.
pub fn field(out: &mut Vec<u8>, number: u64, bytes: &[u8]) {
    put_varint(out, number << 3 | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A DeltaDiscoveryResponse with no resources: system_version_info (1), type_url (4), nonce (5).
fn delta_response(type_url: &str, n: usize) -> Vec<u8> {
    let mut m = Vec::new();
    field(&mut m, 1, b"1");
    field(&mut m, 4, type_url.as_bytes());
    field(&mut m, 5, n.to_string().as_bytes());
    m
}

/// A DeltaDiscoveryResponse carrying the service's ClusterLoadAssignment
/// (envoy/config/endpoint/v3/endpoint.proto, endpoint_components.proto; core/v3/address.proto):
/// one locality whose lb_endpoints (2) are `addrs` (`ip:port`).
fn endpoints_response(addrs: &[String], version: u64) -> Vec<u8> {
    let mut locality = Vec::new();
    for addr in addrs {
        let (ip, port) = addr.rsplit_once(':').expect("ip:port");
        let mut socket = Vec::new();
        field(&mut socket, 2, ip.as_bytes());
        socket.push(3 << 3);
        put_varint(&mut socket, port.parse().expect("a port"));
        let (mut address, mut endpoint, mut lb_endpoint) = (Vec::new(), Vec::new(), Vec::new());
        field(&mut address, 1, &socket);
        field(&mut endpoint, 1, &address);
        field(&mut lb_endpoint, 1, &endpoint);
        field(&mut locality, 2, &lb_endpoint);
    }
    let mut assignment = Vec::new();
    field(&mut assignment, 1, SERVICE_CLUSTER.as_bytes());
    field(&mut assignment, 2, &locality);
    let mut any = Vec::new();
    field(&mut any, 1, ENDPOINTS.as_bytes());
    field(&mut any, 2, &assignment);
    let version = version.to_string();
    let mut resource = Vec::new();
    field(&mut resource, 1, version.as_bytes());
    field(&mut resource, 2, &any);
    field(&mut resource, 3, SERVICE_CLUSTER.as_bytes());
    let mut m = Vec::new();
    field(&mut m, 1, version.as_bytes());
    field(&mut m, 2, &resource);
    field(&mut m, 4, ENDPOINTS.as_bytes());
    field(&mut m, 5, format!("eds-{version}").as_bytes());
    m
}
