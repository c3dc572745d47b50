//! Plain HTTP/1.1 to Envoy's admin API and Istio's agent on loopback, written for exactly that:
//! one request per connection (`Connection: close`), no TLS, no proxy (a pod's HTTP_PROXY must
//! not send loopback requests elsewhere), no redirects, no name lookups. Every request is bounded
//! in time, connect, head and body together, and in the bytes it reads.

use crate::count::shorten;
use crate::error::Failure;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// No single request may take longer: a loopback admin API answers in milliseconds, and one that
/// does not must not hold up the count (auto falls back to /proc/net/tcp for that count).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// The most we read of any answer. The filtered /stats answer is about 60 bytes per listener and
/// worker; 4 MiB holds thousands of listeners and keeps a hostile server from filling memory.
pub const BODY_LIMIT: u64 = 4 << 20;

/// The most any answer read line by line may hold (`GET /clusters`): Envoy lists every cluster
/// and host, about 2 KB a host; 6,180,920 bytes for 1,000 clusters of 3 hosts (BENCHMARKS.md). It
/// is never held whole, so the cap bounds time, not memory.
pub const STREAM_LIMIT: u64 = 64 << 20;

/// A longer line is cut there: Envoy's lines are a cluster name, a host and a counter.
const MAX_LINE: usize = 4096;

/// The most a status line and headers may take.
const HEAD_LIMIT: usize = 64 * 1024;

/// An answer, whatever its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Reply {
    /// `405 'Method GET not allowed, POST required.'`: for warnings.
    pub fn describe(&self) -> String {
        let body = String::from_utf8_lossy(&self.body);
        format!("{} '{}'", self.status, shorten(body.trim()))
    }
}

pub struct Client {
    addr: SocketAddr,
    base: String,
}

impl Client {
    pub fn new(addr: SocketAddr) -> Client {
        Client {
            addr,
            base: format!("http://{addr}"),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn get(&self, path: &str, left: Duration) -> Result<Reply, Failure> {
        self.whole("GET", path, left)
    }

    pub fn post(&self, path: &str, left: Duration) -> Result<Reply, Failure> {
        self.whole("POST", path, left)
    }

    /// One request, its answer read whole.
    fn whole(&self, method: &'static str, path: &str, left: Duration) -> Result<Reply, Failure> {
        self.request(method, path, left)
            .and_then(Answer::whole)
            .map_err(|cause| Failure::new(method, self.url(path), cause))
    }

    /// A GET whose 200 answer is handed to `each` line by line as it arrives, at most
    /// `STREAM_LIMIT` bytes, within the same timeout as any request. Any other status is an
    /// error naming it.
    pub fn get_lines(
        &self,
        path: &str,
        left: Duration,
        each: impl FnMut(&str),
    ) -> Result<(), Failure> {
        self.request("GET", path, left)
            .and_then(|a| a.lines(each))
            .map_err(|cause| Failure::new("GET", self.url(path), cause))
    }

    /// Connects, sends the request and reads the answer's head, within `left` and at most
    /// `REQUEST_TIMEOUT`; the body is left for the caller, within the same time.
    fn request(
        &self,
        method: &str,
        path: &str,
        left: Duration,
    ) -> Result<Answer<TcpStream>, String> {
        let timeout = left.min(REQUEST_TIMEOUT);
        if timeout.is_zero() {
            return Err("no time left before the deadline".to_string());
        }
        let until = Instant::now() + timeout;
        let stream =
            TcpStream::connect_timeout(&self.addr, timeout).map_err(|e| match e.kind() {
                ErrorKind::TimedOut | ErrorKind::WouldBlock => late(timeout),
                _ => io_cause(&e),
            })?;
        let mut answer = Answer::new(stream, until, timeout);
        let length = if method == "POST" {
            "Content-Length: 0\r\n"
        } else {
            ""
        };
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: envoy-drain/{}\r\n{length}\
             Connection: close\r\n\r\n",
            self.addr,
            env!("CARGO_PKG_VERSION")
        );
        answer.send(request.as_bytes())?;
        answer.head()?;
        Ok(answer)
    }
}

/// How the body's end is known.
enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

/// Reads `bytes` as a server's whole answer, both as `get` and as `get_lines` read one: the
/// parsing alone, with nothing to wait for, for the fuzzer.
pub fn replay(bytes: &[u8], each: impl FnMut(&str)) -> (Result<Reply, String>, Result<(), String>) {
    let answer = |b| {
        let mut a = Answer::new(
            Received(b),
            Instant::now() + REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        );
        a.head().map(|()| a)
    };
    (
        answer(bytes).and_then(Answer::whole),
        answer(bytes).and_then(|a| a.lines(each)),
    )
}

/// Where an answer's bytes come from: the admin API's socket, or bytes already received.
trait Wire: Read + Write {
    /// Bounds the next read or write to `left`.
    fn limit(&self, left: Duration) -> std::io::Result<()>;
}

impl Wire for TcpStream {
    fn limit(&self, left: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(left))?;
        self.set_write_timeout(Some(left))
    }
}

/// What a server sent before it closed: reads end where the bytes do, and nothing is sent.
struct Received<'a>(&'a [u8]);

impl Read for Received<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Received<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Wire for Received<'_> {
    fn limit(&self, _: Duration) -> std::io::Result<()> {
        Ok(())
    }
}

/// An answer being read: what arrived past the last point parsed, and the time it has.
struct Answer<W> {
    stream: W,
    until: Instant,
    timeout: Duration,
    pending: Vec<u8>,
    status: u16,
    framing: Framing,
}

fn late(timeout: Duration) -> String {
    format!(
        "no complete answer within {}",
        humantime::format_duration(Duration::from_millis(timeout.as_millis() as u64))
    )
}

fn io_cause(e: &std::io::Error) -> String {
    match e.kind() {
        ErrorKind::ConnectionRefused => "connection refused".to_string(),
        ErrorKind::ConnectionReset => "connection reset".to_string(),
        _ => e.to_string(),
    }
}

impl<W: Wire> Answer<W> {
    fn new(stream: W, until: Instant, timeout: Duration) -> Answer<W> {
        Answer {
            stream,
            until,
            timeout,
            pending: Vec::new(),
            status: 0,
            framing: Framing::UntilClose,
        }
    }

    /// The body read whole, at most `BODY_LIMIT` bytes.
    fn whole(mut self) -> Result<Reply, String> {
        let mut body = Vec::new();
        let status = self.status;
        self.body(BODY_LIMIT, &mut |piece| body.extend_from_slice(piece))
            .map_err(|e| format!("answered {status} but {e}"))?;
        Ok(Reply { status, body })
    }

    /// A 200 answer's body handed to `each` line by line as it arrives, lines cut at `MAX_LINE`,
    /// at most `STREAM_LIMIT` bytes. Any other status is an error naming it.
    fn lines(mut self, mut each: impl FnMut(&str)) -> Result<(), String> {
        if self.status != 200 {
            let status = self.status;
            let mut body = Vec::new();
            let _ = self.body(BODY_LIMIT, &mut |piece| body.extend_from_slice(piece));
            return Err(format!("answered {}", Reply { status, body }.describe()));
        }
        let mut line: Vec<u8> = Vec::with_capacity(512);
        self.body(STREAM_LIMIT, &mut |piece| {
            for part in piece.split_inclusive(|b| *b == b'\n') {
                let room = MAX_LINE.saturating_sub(line.len());
                line.extend_from_slice(&part[..part.len().min(room)]);
                if part.ends_with(b"\n") {
                    each(&String::from_utf8_lossy(&line));
                    line.clear();
                }
            }
        })
        .map_err(|e| format!("answered 200 but {e}"))?;
        if !line.is_empty() {
            each(&String::from_utf8_lossy(&line));
        }
        Ok(())
    }

    /// Time left for this request, or the timeout's error.
    fn left(&self) -> Result<Duration, String> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(late(self.timeout));
        }
        Ok(left)
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        let left = self.left()?;
        self.stream.limit(left).map_err(|e| io_cause(&e))?;
        self.stream.write_all(bytes).map_err(|e| match e.kind() {
            ErrorKind::TimedOut | ErrorKind::WouldBlock => late(self.timeout),
            _ => io_cause(&e),
        })
    }

    /// Reads more into `pending`; `false` at the end of the stream.
    fn fill(&mut self) -> Result<bool, String> {
        let left = self.left()?;
        self.stream.limit(left).map_err(|e| io_cause(&e))?;
        let mut chunk = [0u8; 16 * 1024];
        match self.stream.read(&mut chunk) {
            Ok(0) => Ok(false),
            Ok(n) => {
                self.pending.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
            Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
                Err(late(self.timeout))
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(io_cause(&e)),
        }
    }

    /// Reads the status line and headers: the status, and how the body ends.
    fn head(&mut self) -> Result<(), String> {
        let end = loop {
            if let Some(i) = find(&self.pending, b"\r\n\r\n") {
                break i;
            }
            if self.pending.len() > HEAD_LIMIT {
                return Err(format!("its head is longer than {HEAD_LIMIT} bytes"));
            }
            if !self.fill()? {
                return Err(if self.pending.is_empty() {
                    "connection closed before an answer".to_string()
                } else {
                    "connection closed mid-answer".to_string()
                });
            }
        };
        let head = String::from_utf8_lossy(&self.pending[..end]).into_owned();
        self.pending.drain(..end + 4);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        let status = parts
            .next()
            .filter(|s| s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u16>().ok());
        let (true, Some(status)) = (version.starts_with("HTTP/1."), status) else {
            return Err(format!(
                "answered with something that is not HTTP/1: '{}'",
                shorten(status_line)
            ));
        };
        self.status = status;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("transfer-encoding")
                && value.to_ascii_lowercase().contains("chunked")
            {
                self.framing = Framing::Chunked;
            } else if name.eq_ignore_ascii_case("content-length")
                && !matches!(self.framing, Framing::Chunked)
            {
                let n = value.parse::<u64>().map_err(|_| {
                    format!("answered {status} with a bad length: '{}'", shorten(value))
                })?;
                self.framing = Framing::Length(n);
            }
        }
        // No body, whatever the headers say.
        if status == 204 || status == 304 || (100..200).contains(&status) {
            self.framing = Framing::Length(0);
        }
        Ok(())
    }

    /// Hands the body to `sink` as it arrives, never holding more than one read of it, and at
    /// most `limit` bytes.
    fn body(&mut self, limit: u64, sink: &mut dyn FnMut(&[u8])) -> Result<(), String> {
        let too_large = || format!("its body is larger than {limit} bytes");
        match self.framing {
            Framing::Length(n) if n > limit => Err(too_large()),
            Framing::Length(n) => self.exactly(n, sink),
            Framing::UntilClose => {
                let mut taken = 0u64;
                loop {
                    taken += self.pending.len() as u64;
                    if taken > limit {
                        return Err(too_large());
                    }
                    sink(&self.pending);
                    self.pending.clear();
                    if !self.fill()? {
                        return Ok(());
                    }
                }
            }
            Framing::Chunked => {
                let mut taken = 0u64;
                loop {
                    let size_line = self.line()?;
                    let size = size_line.split(';').next().unwrap_or_default().trim();
                    let size = u64::from_str_radix(size, 16)
                        .map_err(|_| format!("a bad chunk size: '{}'", shorten(size)))?;
                    if size == 0 {
                        // Trailers, up to the empty line that ends them.
                        while !self.line()?.is_empty() {}
                        return Ok(());
                    }
                    taken = taken.saturating_add(size);
                    if taken > limit {
                        return Err(too_large());
                    }
                    self.exactly(size, sink)?;
                    if !self.line()?.is_empty() {
                        return Err("a chunk does not end where its size says".to_string());
                    }
                }
            }
        }
    }

    /// Hands the next `n` bytes to `sink` as they arrive.
    fn exactly(&mut self, mut n: u64, sink: &mut dyn FnMut(&[u8])) -> Result<(), String> {
        loop {
            let here = (self.pending.len() as u64).min(n) as usize;
            if here > 0 {
                sink(&self.pending[..here]);
                self.pending.drain(..here);
                n -= here as u64;
            }
            if n == 0 {
                return Ok(());
            }
            if !self.fill()? {
                return Err("connection closed mid-answer".to_string());
            }
        }
    }

    /// One CRLF-ended line of the chunked framing, without its end.
    fn line(&mut self) -> Result<String, String> {
        loop {
            if let Some(i) = find(&self.pending, b"\r\n") {
                let line = String::from_utf8_lossy(&self.pending[..i]).into_owned();
                self.pending.drain(..i + 2);
                return Ok(line);
            }
            if self.pending.len() > MAX_LINE {
                return Err("a chunk size line is too long".to_string());
            }
            if !self.fill()? {
                return Err("connection closed mid-answer".to_string());
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::net::TcpListener;

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
        (Client::new(addr), handle)
    }

    /// The answer as read from a socket, checked to be what `replay` (the fuzzer's way) reads.
    fn get(answer: &'static [u8]) -> Result<Reply, String> {
        let (client, server) = serve(answer);
        let reply = client
            .get("/stats", Duration::from_secs(5))
            .map_err(|f| f.cause);
        server.join().unwrap();
        assert_eq!(replay(answer, |_| {}).0, reply);
        reply
    }

    #[test]
    fn a_request_names_its_host_closes_its_connection_and_a_post_says_it_has_no_body() {
        let (client, server) = serve(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nOK\n");
        let reply = client.post("/drain_listeners?graceful", Duration::from_secs(5));
        let head = server.join().unwrap();
        assert_eq!(reply.unwrap().body, b"OK\n");
        assert!(head.starts_with("POST /drain_listeners?graceful HTTP/1.1\r\nHost: 127.0.0.1:"));
        assert!(
            head.contains("\r\nContent-Length: 0\r\n")
                && head.contains("\r\nConnection: close\r\n")
        );
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
    }

    #[test]
    fn what_is_not_http_or_breaks_its_framing_is_an_error_that_says_so() {
        for (answer, want) in [
            (
                &b"SSH-2.0-OpenSSH\r\n\r\n"[..],
                "answered with something that is not HTTP/1: 'SSH-2.0-OpenSSH'",
            ),
            (b"HTTP/1.1 2000 OK\r\n\r\n", "not HTTP/1"),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
                "answered 200 with a bad length: 'x'",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                "answered 200 but a bad chunk size: 'zz'",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
                "a chunk does not end where its size says",
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
                "answered 200 but connection closed mid-answer",
            ),
            (b"HTTP/1.1 200", "connection closed mid-answer"),
            (b"", "connection closed before an answer"),
        ] {
            let e = get(answer).unwrap_err();
            assert!(
                e.contains(want),
                "{e} for {:?}",
                String::from_utf8_lossy(answer)
            );
        }
    }

    #[test]
    fn a_body_past_the_cap_is_refused_whether_announced_or_chunked() {
        let announced = get(b"HTTP/1.1 200 OK\r\ncontent-length: 999999999\r\n\r\n").unwrap_err();
        assert!(
            announced.ends_with("its body is larger than 4194304 bytes"),
            "{announced}"
        );
        let chunked = get(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFF\r\nxx")
            .unwrap_err();
        assert!(
            chunked.ends_with("its body is larger than 4194304 bytes"),
            "{chunked}"
        );
    }

    #[test]
    fn lines_arrive_one_by_one_with_a_last_one_that_has_no_end() {
        let (client, server) = serve(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\na\nbc\r\n3\r\nd\ne\r\n0\r\n\r\n",
        );
        let mut lines = Vec::new();
        client
            .get_lines("/clusters", Duration::from_secs(5), |l| {
                lines.push(l.to_string())
            })
            .unwrap();
        server.join().unwrap();
        assert_eq!(lines, vec!["a\n", "bcd\n", "e"]);
    }

    #[test]
    fn silence_ends_at_the_timeout_and_refusal_says_so() {
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = Client::new(silent.local_addr().unwrap());
        let started = Instant::now();
        let e = client
            .get("/stats", Duration::from_millis(300))
            .unwrap_err();
        let url = client.url("/stats");
        assert_eq!(
            e.to_string(),
            format!("failed to GET {url}: no complete answer within 300ms")
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        let refused = silent.local_addr().unwrap();
        drop(silent);
        let e = Client::new(refused)
            .get("/", Duration::from_secs(1))
            .unwrap_err();
        assert_eq!(e.cause, "connection refused");
    }
}
