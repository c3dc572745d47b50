//! HTTP to Envoy's admin API and Istio's agent on loopback, through ureq without its default
//! features: no proxy (a pod's HTTP_PROXY must not apply), no redirects, no pooled connections, no
//! name lookups. Every request is bounded in time (ureq's global timeout covers the body too) and
//! in the bytes it reads, but /clusters, which only time bounds.

use crate::config::Address;
use crate::count::REQUEST_TIMEOUT;
use crate::error::{Failure, io_cause, shorten};
use crate::source::lines::each_line;
use crate::source::uds::UnixConnector;
use std::cell::{Cell, RefCell};
use std::io::ErrorKind;
use std::time::Duration;
use ureq::http::Response;
use ureq::unversioned::resolver::DefaultResolver;
use ureq::{Agent, Body};

/// The most we read of any answer but /clusters: the filtered /stats answer of 40,000 listeners,
/// and never a hostile server's stream without end.
pub(crate) const BODY_LIMIT: u64 = 4 << 20;

/// Envoy's state: 200 `LIVE`, or 503 `DRAINING` once its health checks fail.
pub(crate) const READY_PATH: &str = "/ready";

/// A longer line is cut there: Envoy's lines are a cluster name, a host and a counter.
const MAX_LINE: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    /// `405 'Method GET not allowed, POST required.'`: for warnings.
    pub(crate) fn describe(&self) -> String {
        let body = String::from_utf8_lossy(&self.body);
        format!("{} '{}'", self.status, shorten(body.trim()))
    }
}

pub(crate) struct Client {
    address: Address,
    agent: Agent,
    /// Whether only Envoy may answer (`Client::envoy`).
    envoy: bool,
    /// Why what listens at the address is not taken as Envoy, as the last answer said.
    not_envoy: RefCell<Option<String>>,
    /// HTTP answers without Envoy's header since Envoy's last (`None`: Envoy has answered).
    foreign: Cell<Option<u8>>,
}

/// What Envoy's admin API puts in every answer's head: its manager overwrites `server`
/// (source/server/admin/admin.h, `serverName`).
const ENVOY_SERVER: &str = "envoy";

impl Client {
    /// A client for Envoy's admin API: an answer without Envoy's `server: envoy` header fails.
    pub(crate) fn envoy(address: Address) -> Client {
        Client { envoy: true, ..Client::new(address) }
    }

    pub(crate) fn new(address: Address) -> Client {
        let config = Agent::config_builder()
            .proxy(None)
            .max_redirects(0)
            .http_status_as_error(false)
            .max_idle_connections(0)
            // ureq's default buffers are 128 KiB each way; Envoy's heads are a few hundred bytes.
            .input_buffer_size(16 * 1024)
            .max_response_header_size(16 * 1024)
            .output_buffer_size(4 * 1024)
            .user_agent(concat!("envoy-drain/", env!("CARGO_PKG_VERSION")))
            .build();
        let agent = match &address {
            Address::Tcp(_) => config.into(),
            Address::Unix(path) => Agent::with_parts(
                config,
                UnixConnector { path: path.clone() },
                DefaultResolver::default(),
            ),
        };
        let (not_envoy, foreign) = (RefCell::new(None), Cell::new(Some(0)));
        Client { address, agent, envoy: false, not_envoy, foreign }
    }

    /// Why what listens at the admin address is not Envoy, as the last request found: it answered
    /// without Envoy's header, or its socket may not be opened. `None` once Envoy answers, and
    /// while nothing answers at all.
    pub(crate) fn not_envoy(&self) -> Option<String> {
        self.not_envoy.borrow().clone()
    }

    /// Whether what answers at the address is something else than Envoy for good: two HTTP
    /// answers in a row without Envoy's header, and Envoy never answered (an error of the
    /// socket, or one odd answer, is no such sign).
    pub(crate) fn never_envoy(&self) -> bool {
        self.foreign.get().is_some_and(|n| n >= 2)
    }

    /// What a request goes to, as the log names it: `http://127.0.0.1:15000/stats`, `/x on unix:/a`.
    pub(crate) fn url(&self, path: &str) -> String {
        match &self.address {
            Address::Tcp(addr) => format!("http://{addr}{path}"),
            Address::Unix(_) => format!("{path} on {}", self.address),
        }
    }

    /// A GET within `timeout`, its answer read whole; the error is a cause, `connection refused`.
    pub(crate) fn get(&self, path: &str, timeout: Duration) -> Result<Reply, Failure> {
        self.call("GET", path, timeout).and_then(|answer| read_whole(answer, timeout))
    }

    /// A POST within `left` and at most `REQUEST_TIMEOUT`.
    pub(crate) fn post(&self, path: &str, left: Duration) -> Result<Reply, Failure> {
        let timeout = left.min(REQUEST_TIMEOUT);
        self.call("POST", path, timeout).and_then(|answer| read_whole(answer, timeout))
    }

    /// A GET whose 200 answer is handed to `each` line by line as it arrives, lines cut at
    /// `MAX_LINE`, within `left`, at most `limit` bytes (/clusters runs to hundreds of megabytes,
    /// which only time bounds). Any other status is an error naming it.
    pub(crate) fn get_lines(
        &self,
        path: &str,
        left: Duration,
        limit: u64,
        mut each: impl FnMut(&str),
    ) -> Result<(), Failure> {
        let answer = self.call("GET", path, left)?;
        let status = answer.status().as_u16();
        if status != 200 {
            let reply = read_whole(answer, left).unwrap_or(Reply { status, body: Vec::new() });
            return Err(Failure::from(format!("answered {}", reply.describe())));
        }
        if answer.body().content_length().is_some_and(|n| n > limit) {
            return Err(Failure::from(format!("answered 200 but {}", too_large(limit))));
        }
        let reader = answer.into_body().into_with_config().limit(limit).reader();
        each_line(
            reader,
            MAX_LINE,
            |line, _| {
                each(line);
                Ok(())
            },
            |e| format!("answered 200 but {}", cause(ureq::Error::from(e), left, limit)).into(),
        )
    }

    /// Sends the request and reads the answer's head within `timeout`; the body is the caller's.
    fn call(&self, method: &str, path: &str, timeout: Duration) -> Result<Response<Body>, Failure> {
        if timeout.is_zero() {
            return Err(Failure::from("no time left before the deadline"));
        }
        // Over a Unix socket the URL's host only fills the Host header.
        let url = match &self.address {
            Address::Tcp(_) => self.url(path),
            Address::Unix(_) => format!("http://127.0.0.1{path}"),
        };
        let answer = if method == "POST" {
            let request = self.agent.post(&url).config();
            request.timeout_global(Some(timeout)).build().send_empty()
        } else {
            let request = self.agent.get(&url).config();
            request.timeout_global(Some(timeout)).build().call()
        };
        let answer = answer.map_err(|e| {
            if let ureq::Error::Io(io) = &e
                && io.kind() == ErrorKind::PermissionDenied
            {
                self.said(Some(io_cause(io)));
            }
            cause(e, timeout, BODY_LIMIT)
        })?;
        if self.envoy {
            let server = answer.headers().get("server").map(|v| v.as_bytes());
            if server != Some(ENVOY_SERVER.as_bytes()) {
                let why = format!(
                    "answered {} without Envoy's 'server: {ENVOY_SERVER}' header",
                    answer.status().as_u16()
                );
                self.said(Some(why.clone()));
                self.foreign.set(self.foreign.get().map(|n| n.saturating_add(1)));
                return Err(Failure::from(why));
            }
            self.said(None);
            self.foreign.set(None);
        }
        Ok(answer)
    }

    fn said(&self, why: Option<String>) {
        if self.envoy {
            *self.not_envoy.borrow_mut() = why;
        }
    }
}

/// The body read whole; one announced over the cap is refused before a byte of it is read.
fn read_whole(mut answer: Response<Body>, timeout: Duration) -> Result<Reply, Failure> {
    let status = answer.status().as_u16();
    let body = answer.body_mut();
    let failed = |why: String| format!("answered {status} but {why}");
    if body.content_length().is_some_and(|n| n > BODY_LIMIT) {
        return Err(Failure::from(failed(too_large(BODY_LIMIT))));
    }
    let body = body
        .with_config()
        .limit(BODY_LIMIT)
        .read_to_vec()
        .map_err(|e| failed(cause(e, timeout, BODY_LIMIT)))?;
    Ok(Reply { status, body })
}

fn too_large(limit: u64) -> String {
    format!("its body is larger than {limit} bytes")
}

/// ureq's error in the words of the rest of the log: what a user of the hook can act on.
fn cause(e: ureq::Error, timeout: Duration, limit: u64) -> String {
    match e {
        ureq::Error::Timeout(_) => format!(
            "no complete answer within {}",
            humantime::format_duration(Duration::from_millis(timeout.as_millis() as u64))
        ),
        ureq::Error::BodyExceedsLimit(_) => too_large(limit),
        ureq::Error::Io(e) => match e.kind() {
            ErrorKind::ConnectionRefused => "connection refused".to_string(),
            ErrorKind::ConnectionReset => "connection reset".to_string(),
            ErrorKind::UnexpectedEof => "connection closed mid-answer".to_string(),
            _ => io_cause(&e),
        },
        ureq::Error::Protocol(p) => format!("answered with something that is not HTTP/1.1: {p}"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, Write};
    use std::net::TcpListener;
    use std::time::Instant;

    /// Serves one connection with `answer` and hands back the request's head.
    fn serve(answer: &'static [u8]) -> (Client, std::thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head += &line;
            }
            let mut conn = conn;
            let _ = conn.write_all(answer);
            head
        });
        (Client::new(Address::Tcp(addr)), handle)
    }

    /// Envoy's admin API names itself in every answer; what does not is not taken for it, and
    /// Envoy's own answer is.
    #[test]
    fn an_answer_without_envoys_server_header_is_a_failure_that_says_so() {
        let ask = |answer: &'static [u8]| {
            let (plain, server) = serve(answer);
            let client = Client { envoy: true, ..plain };
            let reply = client.get("/ready", Duration::from_secs(5));
            server.join().unwrap();
            (reply.map(|r| r.body), client.not_envoy())
        };
        let (reply, not_envoy) = ask(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nhello, world");
        let why = "answered 200 without Envoy's 'server: envoy' header";
        assert_eq!(reply.unwrap_err(), Failure::from(why));
        assert_eq!(not_envoy.as_deref(), Some(why));
        let (reply, not_envoy) =
            ask(b"HTTP/1.1 200 OK\r\nserver: envoy\r\ncontent-length: 5\r\n\r\nLIVE\n");
        assert_eq!(reply.unwrap(), b"LIVE\n");
        assert_eq!(not_envoy, None);
    }

    #[test]
    fn only_answers_in_a_row_without_envoys_header_where_envoy_never_answered_are_never_envoy() {
        const FOREIGN: &[u8] =
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        const ENVOY: &[u8] =
            b"HTTP/1.1 200 OK\r\nserver: envoy\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        // Each answer on a connection of its own, in turn; what the client says after each.
        let said = |answers: Vec<&'static [u8]>| {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let client = Client::envoy(Address::Tcp(listener.local_addr().unwrap()));
            let n = answers.len();
            let server = std::thread::spawn(move || {
                for answer in answers {
                    let (conn, _) = listener.accept().unwrap();
                    let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
                    let mut line = String::new();
                    while reader.read_line(&mut line).unwrap_or(0) > 2 {
                        line.clear();
                    }
                    let _ = (&conn).write_all(answer);
                }
            });
            let seen: Vec<bool> = (0..n)
                .map(|_| {
                    let _ = client.get("/clusters", Duration::from_secs(5));
                    client.never_envoy()
                })
                .collect();
            server.join().unwrap();
            seen
        };
        // agentgateway's admin server: the second such answer tells.
        assert_eq!(said(vec![FOREIGN, FOREIGN]), [false, true]);
        // Envoy answered once: a later odd answer is a fault of Envoy's, never another proxy.
        assert_eq!(said(vec![ENVOY, FOREIGN, FOREIGN]), [false, false, false]);
        // Nothing listening: errors of the socket tell nothing.
        let closed = Client::envoy(Address::Tcp("127.0.0.1:1".parse().unwrap()));
        for _ in 0..2 {
            let _ = closed.get("/clusters", Duration::from_secs(1));
        }
        assert!(!closed.never_envoy());
    }

    fn get(answer: &'static [u8]) -> Result<Reply, Failure> {
        let (client, server) = serve(answer);
        let reply = client.get("/stats", Duration::from_secs(5));
        server.join().unwrap();
        reply
    }

    #[test]
    fn a_request_names_its_host_and_agent_and_a_post_says_it_has_no_body() {
        let (client, server) = serve(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nOK\n");
        let reply = client.post("/drain_listeners?graceful", Duration::from_secs(5));
        let head = server.join().unwrap().to_ascii_lowercase();
        assert_eq!(reply.unwrap().body, b"OK\n");
        assert!(head.starts_with("post /drain_listeners?graceful http/1.1\r\n"), "{head}");
        assert!(head.contains("\r\nhost: 127.0.0.1:"), "{head}");
        assert!(head.contains("\r\ncontent-length: 0\r\n"), "{head}");
        assert!(head.contains("\r\nuser-agent: envoy-drain/"), "{head}");
    }

    #[test]
    fn bodies_end_by_length_by_chunks_or_by_the_connection_closing() {
        let by_length = get(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello, and more");
        assert_eq!(by_length.unwrap().body, b"hello");
        let chunked = get(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\n",
        );
        assert_eq!(chunked.unwrap().body, b"hello, world");
        let until_close = get(b"HTTP/1.0 404 Not Found\r\n\r\ninvalid path");
        let r = until_close.unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, &b"invalid path"[..]));
        let no_content = get(b"HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n");
        assert_eq!(no_content.unwrap().body, b"");
        let redirect =
            get(b"HTTP/1.1 302 Found\r\nlocation: http://10.0.0.1/\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(redirect.unwrap().status, 302, "never followed");
    }

    #[test]
    fn what_is_not_http_or_ends_early_is_an_error_that_says_so() {
        for (answer, want) in [
            (&b"SSH-2.0-OpenSSH\r\n\r\n"[..], "not HTTP/1.1"),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
                "answered 200 but connection closed mid-answer",
            ),
            (b"", "connection closed mid-answer"),
        ] {
            let e = get(answer).unwrap_err();
            assert!(e.contains(want), "{e} for {:?}", String::from_utf8_lossy(answer));
        }
    }

    #[test]
    fn a_body_past_the_cap_is_refused_whether_announced_or_chunked() {
        let announced = get(b"HTTP/1.1 200 OK\r\ncontent-length: 999999999\r\n\r\n").unwrap_err();
        assert_eq!(
            announced,
            Failure::from("answered 200 but its body is larger than 4194304 bytes"),
            "refused before reading"
        );
        let chunked = get(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFF\r\nxx")
            .unwrap_err();
        assert!(chunked.starts_with("answered 200 but "), "cut off, or ended early: {chunked}");
    }

    #[test]
    fn lines_past_their_cap_are_refused_whether_announced_or_chunked() {
        let lines = |answer: &'static [u8]| {
            let (client, server) = serve(answer);
            let mut n = 0;
            let got = client.get_lines("/stats", Duration::from_secs(5), 10, |_| n += 1);
            server.join().unwrap();
            got.map(|()| n)
        };
        assert_eq!(
            lines(b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\na\nb\nc\nd\ne\nf"),
            Err(Failure::from("answered 200 but its body is larger than 10 bytes")),
            "refused before reading"
        );
        assert_eq!(
            lines(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\na\nb\nc\nd\ne\nf\ng\nh\n\r\n0\r\n\r\n"),
            Err(Failure::from("answered 200 but its body is larger than 10 bytes"))
        );
        assert_eq!(lines(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\na\nb\nc\nd\ne\n"), Ok(5));
    }

    #[test]
    fn lines_arrive_one_by_one_with_a_last_one_that_has_no_end() {
        let (client, server) = serve(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\na\nbc\r\n3\r\nd\ne\r\n0\r\n\r\n",
        );
        let mut lines = Vec::new();
        client
            .get_lines("/clusters", Duration::from_secs(5), u64::MAX, |l| lines.push(l.to_string()))
            .unwrap();
        server.join().unwrap();
        assert_eq!(lines, vec!["a", "bcd", "e"]);
    }

    #[test]
    fn lines_may_come_later_than_one_request_may_take_and_hold_more_than_any_cap() {
        const LINES: usize = 300_000;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = Client::new(Address::Tcp(listener.local_addr().unwrap()));
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut head = String::new();
            let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
            while reader.read_line(&mut head).unwrap() > 2 {}
            // Envoy builds a large /clusters answer whole before its first byte.
            std::thread::sleep(REQUEST_TIMEOUT + Duration::from_millis(300));
            conn.write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n").unwrap();
            let line = b"outbound|80||a.b.svc.cluster.local::10.0.0.1:80::rq_active::0\n";
            for _ in 0..LINES {
                conn.write_all(line).unwrap();
            }
        });
        let mut lines = 0;
        client.get_lines("/clusters", Duration::from_secs(20), u64::MAX, |_| lines += 1).unwrap();
        server.join().unwrap();
        assert_eq!(lines, LINES, "{} MiB, all of it", (LINES * 63) >> 20);
    }

    #[test]
    fn silence_ends_at_the_timeout_and_refusal_says_so() {
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = Client::new(Address::Tcp(silent.local_addr().unwrap()));
        let started = Instant::now();
        let e = client.get("/stats", Duration::from_millis(300)).unwrap_err();
        assert_eq!(e, Failure::from("no complete answer within 300ms"));
        assert!(started.elapsed() < Duration::from_secs(2));
        let refused = silent.local_addr().unwrap();
        drop(silent);
        let e = Client::new(Address::Tcp(refused)).get("/", Duration::from_secs(1)).unwrap_err();
        assert_eq!(e, Failure::from("connection refused"));
    }
}
