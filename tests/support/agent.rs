//! A stand-in for Istio's pilot-agent in the pod replica: the ADS server that every sidecar's
//! Envoy holds a gRPC stream to for its whole life, over a Unix socket (cluster `xds-grpc`), and
//! the agent's status port 15020. The ADS server answers each resource type Envoy asks for once,
//! with an empty set, as istiod answers a pod with no extra config, so Envoy finishes starting
//! (Istio's bootstrap sets `initial_fetch_timeout: 0s`: without answers it would wait forever).
//! Its threads run as the proxy's user, as pilot-agent does.
//!
//! Just enough HTTP/2 and gRPC: SETTINGS and PING are acknowledged, every request stream gets
//! `:status 200` and `content-type: application/grpc`, and received data is given back to the flow
//! control windows. Messages are DeltaDiscoveryRequest / DeltaDiscoveryResponse
//! (envoy/service/discovery/v3/discovery.proto).

use super::h2;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

/// The abstract socket the bootstrap's xds-grpc cluster names: one per network namespace.
pub const XDS_SOCKET: &str = "envoy-drain-pod-xds";

pub struct Agent {
    stop: Arc<AtomicBool>,
    /// ADS streams opened so far.
    pub streams: Arc<AtomicUsize>,
    /// Someone asked for `POST /quitquitquit` on 15020, pilot-agent's "stop the proxy now".
    pub quit: Arc<AtomicBool>,
    /// Someone asked for `POST /drain` on 15020, what Istio's native-sidecar preStop does.
    pub drained: Arc<AtomicBool>,
}

impl Agent {
    /// Starts in the caller's network namespace, its threads as `uid`:`gid`.
    pub fn start(uid: u32, gid: u32) -> Agent {
        let stop = Arc::new(AtomicBool::new(false));
        let streams = Arc::new(AtomicUsize::new(0));
        let quit = Arc::new(AtomicBool::new(false));
        let drained = Arc::new(AtomicBool::new(false));
        let (s, n) = (Arc::clone(&stop), Arc::clone(&streams));
        let asked = Asked {
            quit: Arc::clone(&quit),
            drained: Arc::clone(&drained),
        };
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
                let n = Arc::clone(&n);
                thread::spawn(move || {
                    let _ = serve_grpc(conn, &n, true);
                });
            }
        });
        ready
            .recv_timeout(Duration::from_secs(10))
            .expect("the agent started");
        Agent {
            stop,
            streams,
            quit,
            drained,
        }
    }
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
        assert_eq!(
            libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<u32>()),
            0
        );
        assert_eq!(libc::syscall(libc::SYS_setresgid, gid, gid, gid), 0);
        assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
    }
}

/// What was asked of the agent's status port.
struct Asked {
    quit: Arc<AtomicBool>,
    drained: Arc<AtomicBool>,
}

/// pilot-agent's status port: every request answers 200 `OK`. `POST /quitquitquit` is noted;
/// `POST /drain` is noted and passed on to Envoy as pilot-agent does for a sidecar
/// (istio/istio pkg/envoy/agent.go, DrainNow: inbound only, graceful, skip_exit).
fn serve_status(listener: TcpListener, stop: &AtomicBool, asked: &Asked) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut conn) = conn else { continue };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        let mut buf = [0u8; 4096];
        let n = conn.read(&mut buf).unwrap_or(0);
        if buf[..n].starts_with(b"POST /quitquitquit ") {
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
    }
}

/// A gRPC server on one connection: every stream is accepted and held open, its messages read.
/// With `discovery`, each resource type asked for is answered once with an empty set (ADS).
pub fn serve_grpc(
    mut conn: impl Read + Write,
    streams: &AtomicUsize,
    discovery: bool,
) -> std::io::Result<()> {
    let mut preface = [0u8; h2::PREFACE.len()];
    conn.read_exact(&mut preface)?;
    if preface != h2::PREFACE {
        return Ok(());
    }
    conn.write_all(&h2::frame(h2::SETTINGS, 0, 0, &[]))?;
    let mut answered: HashSet<String> = HashSet::new();
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let f = h2::read_frame(&mut conn)?;
        h2::acknowledge(&f, &mut conn)?;
        match f.kind {
            h2::HEADERS => {
                streams.fetch_add(1, Ordering::SeqCst);
                // :status 200 (static index 8), then content-type (static name 31, past the 4-bit
                // prefix: 0x0f 0x10) as a literal of 16 bytes.
                let mut block = vec![0x88, 0x0f, 0x10, 16];
                block.extend_from_slice(b"application/grpc");
                conn.write_all(&h2::frame(h2::HEADERS, h2::END_HEADERS, f.stream, &block))?;
            }
            h2::DATA => {
                let len = f.payload.len();
                if len > 0 {
                    let more = (len as u32).to_be_bytes();
                    conn.write_all(&h2::frame(h2::WINDOW_UPDATE, 0, 0, &more))?;
                    conn.write_all(&h2::frame(h2::WINDOW_UPDATE, 0, f.stream, &more))?;
                }
                // Skip the padding length and the padding when the frame is padded.
                let data = if f.flags & h2::PADDED != 0 {
                    let pad = usize::from(f.payload.first().copied().unwrap_or(0));
                    f.payload
                        .get(1..len.saturating_sub(pad))
                        .unwrap_or_default()
                } else {
                    &f.payload[..]
                };
                pending.extend_from_slice(data);
                while let Some(message) = grpc_message(&mut pending) {
                    if !discovery {
                        continue;
                    }
                    let (type_url, nonce) = delta_request(&message);
                    // An answer per type, to its first request; ACKs carry the nonce back.
                    if nonce.is_empty() && !type_url.is_empty() && answered.insert(type_url.clone())
                    {
                        let reply = grpc_frame(&delta_response(&type_url, answered.len()));
                        conn.write_all(&h2::frame(h2::DATA, 0, f.stream, &reply))?;
                    }
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

fn grpc_frame(message: &[u8]) -> Vec<u8> {
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
fn delta_request(message: &[u8]) -> (String, String) {
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

/// A DeltaDiscoveryResponse with no resources: system_version_info (1), type_url (4), nonce (5).
fn delta_response(type_url: &str, n: usize) -> Vec<u8> {
    let mut m = Vec::new();
    for (field, text) in [
        (1u8, "1".to_string()),
        (4, type_url.to_string()),
        (5, n.to_string()),
    ] {
        m.push(field << 3 | 2);
        m.push(text.len() as u8);
        m.extend_from_slice(text.as_bytes());
    }
    m
}
