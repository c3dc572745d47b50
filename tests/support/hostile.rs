//! An admin API that misbehaves in the ways real Envoy cannot be made to on demand: silence,
//! stalls, trickles, floods, bad bytes, error statuses, resets and redirects. Where it imitates
//! Envoy it uses Envoy 1.40.0's bytes (its headers, its 404 body, its stats lines).

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Accepts and never answers.
    Silent,
    /// Sends the headers, then stalls the body.
    HeadersThenStall,
    /// Sends a real answer one byte a second.
    Trickle,
    /// A 50 MiB body.
    Flood,
    /// A body that is not UTF-8.
    NotText,
    /// Envoy's own lines plus one without a separator, a negative one and 2^64-1.
    BadLines,
    NotFound,
    MethodNotAllowed,
    ServerError,
    /// Headers and part of the body, then a TCP reset.
    ResetMidBody,
    Redirect,
    /// Envoy with connection stats only, whose /clusters fails: /stats answers Envoy's lines,
    /// every other path 404.
    StatsOnly,
    /// Envoy's lines with this value for the one traffic listener.
    Value(&'static str),
    /// Envoy's lines ending in a lone CR instead of LF.
    CrOnly,
    /// Nearly 4 MiB of distinct lines that are not counts, after the admin line.
    ManyBadLines,
    /// agentgateway's admin server, as in its waypoints (agentgateway
    /// crates/agentgateway/src/management/admin.rs): an empty 404 for the paths it does not
    /// serve, in hyper's head, which names no server.
    Agentgateway,
}

pub const FLOOD_BYTES: u64 = 50 << 20;

/// Envoy's admin response headers, as Envoy 1.40.0 sends them (plus a length where we know it).
fn head(status: &str, length: Option<u64>) -> String {
    let length = match length {
        Some(n) => format!("content-length: {n}\r\n"),
        None => String::new(),
    };
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=UTF-8\r\ncache-control: no-cache, max-age=0\r\n\
         x-content-type-options: nosniff\r\ndate: Sun, 22 Nov 2026 01:19:08 GMT\r\nserver: envoy\r\n{length}\r\n"
    )
}

/// What Envoy 1.40.0 answers to the stats query with one inbound connection open.
pub const STATS: &str = "http.admin.downstream_cx_active: 1
http.inbound_0.0.0.0_8080.downstream_cx_active: 1
listener.0.0.0.0_15006.downstream_cx_active: 1
listener.0.0.0.0_15006.worker_0.downstream_cx_active: 1
listener.admin.downstream_cx_active: 1
listener.admin.main_thread.downstream_cx_active: 1
";

pub struct Hostile {
    pub addr: String,
    /// The most bytes the server handed to the kernel on one connection.
    pub written: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Hostile {
    pub fn start(fault: Fault) -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let written = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (w, s) = (Arc::clone(&written), Arc::clone(&stop));
        thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (w, s) = (Arc::clone(&w), Arc::clone(&s));
                thread::spawn(move || serve(conn, fault, &w, &s));
            }
        });
        Hostile { addr, written, stop }
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
    }
}

fn serve(conn: TcpStream, fault: Fault, written: &AtomicU64, stop: &AtomicBool) {
    let _ = conn.set_write_timeout(Some(Duration::from_secs(10)));
    let path = request_path(&conn);
    let path = path.as_str();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&conn);
    let mut out = conn;
    let mut sent = 0u64;
    let mut send = |bytes: &[u8]| -> bool {
        let ok = out.write_all(bytes).is_ok();
        if ok {
            sent += bytes.len() as u64;
            written.fetch_max(sent, Ordering::SeqCst);
        }
        ok
    };
    let hold = || hold_until_stopped(stop);
    if let Some(raw) = foreign_answer(fault) {
        send(raw.as_bytes());
        return;
    }
    if let Some((status, body)) = whole_answer(fault, path) {
        let mut answer = head(status, Some(body.len() as u64)).into_bytes();
        answer.extend(body);
        send(&answer);
        return;
    }
    match fault {
        Fault::Silent => hold(),
        Fault::HeadersThenStall => {
            send(head("200 OK", Some(STATS.len() as u64)).as_bytes());
            hold();
        }
        Fault::Trickle => {
            let answer = format!("{}{STATS}", head("200 OK", Some(STATS.len() as u64)));
            for b in answer.bytes() {
                if stop.load(Ordering::SeqCst) || !send(&[b]) {
                    return;
                }
                thread::sleep(Duration::from_secs(1));
            }
        }
        Fault::Flood => {
            send(head("200 OK", Some(FLOOD_BYTES)).as_bytes());
            let chunk = STATS.repeat(64 * 1024 / STATS.len());
            let mut body = 0u64;
            while body < FLOOD_BYTES && send(chunk.as_bytes()) {
                body += chunk.len() as u64;
            }
        }
        Fault::ResetMidBody => {
            send(head("200 OK", Some(100_000)).as_bytes());
            send(&STATS.as_bytes()[..40]);
            reset_on_close(fd);
        }
        _ => {}
    }
}

/// The path of the request on `conn`, its head read whole.
fn request_path(conn: &TcpStream) -> String {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut request = String::new();
    let _ = reader.read_line(&mut request);
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap_or(0) > 2 {
        line.clear();
    }
    request.split_whitespace().nth(1).unwrap_or_default().to_string()
}

/// Holds a connection open, doing nothing, until the test ends (or a bounded while).
fn hold_until_stopped(stop: &AtomicBool) {
    for _ in 0..600 {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// SO_LINGER 0: the socket's close sends RST instead of FIN.
fn reset_on_close(fd: std::os::fd::RawFd) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    super::pod::set_socket_option(fd, libc::SO_LINGER, &linger);
}

/// A fault that is one whole answer, in Envoy's head: its status and body.
/// What a server that is not Envoy answers, its whole bytes: agentgateway's empty 404 (no
/// `server` header), or a redirect away from loopback.
fn foreign_answer(fault: Fault) -> Option<&'static str> {
    match fault {
        Fault::Agentgateway => Some(
            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\ndate: Mon, 07 Dec 2026 15:20:00 GMT\r\n\r\n",
        ),
        Fault::Redirect => Some(
            "HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:1/stats\r\ncontent-length: 0\r\n\r\n",
        ),
        _ => None,
    }
}

fn whole_answer(fault: Fault, path: &str) -> Option<(&'static str, Vec<u8>)> {
    let ok = |body: String| Some(("200 OK", body.into_bytes()));
    match fault {
        Fault::NotText => Some((
            "200 OK",
            b"listener.admin.downstream_cx_active: 1\n\xff\xfe\xc3\x28 garbage\n".to_vec(),
        )),
        Fault::BadLines => ok(format!(
            "{STATS}listener.no_separator_here\nlistener.0.0.0.0_15001.downstream_cx_active: -1\n\
             listener.0.0.0.0_8443.downstream_cx_active: 18446744073709551615\n"
        )),
        Fault::StatsOnly if path.starts_with("/stats") => ok(STATS.to_string()),
        Fault::Value(v) => ok(STATS.replace(
            "listener.0.0.0.0_15006.downstream_cx_active: 1",
            &format!("listener.0.0.0.0_15006.downstream_cx_active: {v}"),
        )),
        Fault::CrOnly => ok(STATS.replace('\n', "\r")),
        Fault::ManyBadLines => {
            let mut body = String::from("listener.admin.downstream_cx_active: 1\n");
            let mut i = 0u64;
            while body.len() < (4 << 20) - 64 {
                body += &format!("listener.l{i}.downstream_cx_active: x{i}\n");
                i += 1;
            }
            ok(body)
        }
        Fault::NotFound | Fault::StatsOnly => Some((
            "404 Not Found",
            b"invalid path. admin commands are:\n  /: Admin home page\n".to_vec(),
        )),
        Fault::MethodNotAllowed => {
            Some(("405 Method Not Allowed", b"Method GET not allowed, POST required.".to_vec()))
        }
        Fault::ServerError => Some((
            "500 Internal Server Error",
            b"internal error: stats store is being rebuilt\n".to_vec(),
        )),
        _ => None,
    }
}
