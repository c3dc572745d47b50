//! Plain HTTP/1.1 to Envoy's admin API and Istio's agent on loopback: every request bounded in
//! time and in the bytes it reads.

use crate::count::shorten;
use std::io::Read;
use std::net::SocketAddr;
use std::time::Duration;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

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
    base: String,
    agent: ureq::Agent,
}

impl Client {
    pub fn new(addr: SocketAddr) -> Client {
        let config = ureq::Agent::config_builder()
            // HTTP_PROXY in a pod's environment must not send loopback requests elsewhere.
            .proxy(None)
            .http_status_as_error(false)
            .max_redirects(0)
            .max_redirects_will_error(false)
            // A fresh connection per request: a pooled one can be stale after Envoy restarts.
            .max_idle_connections(0)
            .user_agent(concat!("envoy-drain/", env!("CARGO_PKG_VERSION")))
            .build();
        Client {
            base: format!("http://{addr}"),
            agent: ureq::Agent::with_parts(config, DefaultConnector::default(), Fixed(addr)),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn get(&self, path: &str, left: Duration) -> Result<Reply, String> {
        self.send("GET", path, left)
    }

    pub fn post(&self, path: &str, left: Duration) -> Result<Reply, String> {
        self.send("POST", path, left)
    }

    /// A GET whose 200 answer is handed to `each` line by line as it arrives, at most
    /// `STREAM_LIMIT` bytes, within the same timeout as any request. Any other status is an
    /// error naming it.
    pub fn get_lines(
        &self,
        path: &str,
        left: Duration,
        mut each: impl FnMut(&str),
    ) -> Result<(), String> {
        let timeout = left.min(REQUEST_TIMEOUT);
        if timeout.is_zero() {
            return Err("no time left before the deadline".to_string());
        }
        let mut response = self
            .agent
            .get(self.url(path))
            .config()
            .timeout_global(Some(timeout))
            .build()
            .call()
            .map_err(|e| cause(&e, timeout))?;
        let status = response.status().as_u16();
        let mut reader = response
            .body_mut()
            .with_config()
            .limit(if status == 200 {
                STREAM_LIMIT
            } else {
                BODY_LIMIT
            })
            .reader();
        if status != 200 {
            let mut body = Vec::new();
            let _ = reader.read_to_end(&mut body);
            return Err(format!("answered {}", Reply { status, body }.describe()));
        }
        let mut chunk = vec![0u8; 64 * 1024];
        let mut line: Vec<u8> = Vec::with_capacity(512);
        loop {
            let n = reader
                .read(&mut chunk)
                .map_err(|e| format!("answered 200 but {}", io_cause(&e, timeout)))?;
            if n == 0 {
                break;
            }
            for piece in chunk[..n].split_inclusive(|b| *b == b'\n') {
                let room = MAX_LINE.saturating_sub(line.len());
                line.extend_from_slice(&piece[..piece.len().min(room)]);
                if piece.ends_with(b"\n") {
                    each(&String::from_utf8_lossy(&line));
                    line.clear();
                }
            }
        }
        if !line.is_empty() {
            each(&String::from_utf8_lossy(&line));
        }
        Ok(())
    }

    /// One request with a timeout of at most `REQUEST_TIMEOUT` and never past `left`, covering
    /// connect, headers and body. The error says what happened, for a log line.
    fn send(&self, method: &str, path: &str, left: Duration) -> Result<Reply, String> {
        let timeout = left.min(REQUEST_TIMEOUT);
        if timeout.is_zero() {
            return Err("no time left before the deadline".to_string());
        }
        let url = self.url(path);
        let result = if method == "POST" {
            self.agent
                .post(&url)
                .config()
                .timeout_global(Some(timeout))
                .build()
                .send_empty()
        } else {
            self.agent
                .get(&url)
                .config()
                .timeout_global(Some(timeout))
                .build()
                .call()
        };
        let mut response = result.map_err(|e| cause(&e, timeout))?;
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .with_config()
            .limit(BODY_LIMIT)
            .read_to_vec()
            .map_err(|e| format!("answered {status} but {}", cause(&e, timeout)))?;
        Ok(Reply { status, body })
    }
}

/// Every request goes to the one address given on the command line: no name is ever looked up,
/// and no resolver code is linked in (a scratch image has no resolver configuration anyway).
#[derive(Debug)]
struct Fixed(SocketAddr);

impl Resolver for Fixed {
    fn resolve(
        &self,
        _: &ureq::http::Uri,
        _: &ureq::config::Config,
        _: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let mut addrs = self.empty();
        addrs.push(self.0);
        Ok(addrs)
    }
}

/// The cause behind an error from a body reader, which carries ureq's error inside.
fn io_cause(e: &std::io::Error, timeout: Duration) -> String {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<ureq::Error>())
    {
        Some(inner) => cause(inner, timeout),
        None => cause(
            &ureq::Error::Io(std::io::Error::new(e.kind(), e.to_string())),
            timeout,
        ),
    }
}

/// A short cause for a log line: `connection refused`, `no answer within 1s`.
fn cause(e: &ureq::Error, timeout: Duration) -> String {
    match e {
        ureq::Error::Timeout(_) => format!(
            "no complete answer within {}",
            humantime::format_duration(Duration::from_millis(timeout.as_millis() as u64))
        ),
        ureq::Error::Io(io) => match io.kind() {
            std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
            std::io::ErrorKind::ConnectionReset => "connection reset".to_string(),
            std::io::ErrorKind::UnexpectedEof => "connection closed mid-answer".to_string(),
            _ => io.to_string(),
        },
        ureq::Error::BodyExceedsLimit(limit) => {
            format!("its body is larger than {limit} bytes")
        }
        other => other.to_string(),
    }
}
