//! A minimal HTTP/1.1 client that shows exactly what Envoy sent (status, `connection: close`),
//! and can keep a connection open and idle.

use super::h2;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

/// No client read may wait longer than this.
const READ_LIMIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// Envoy told the client to close: what a drain does to an HTTP/1 response.
    pub fn says_close(&self) -> bool {
        self.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// One client connection; requests on it reuse it (keep-alive) until it is dropped.
pub struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    pub fn open(addr: &str) -> io::Result<Conn> {
        Conn::over(TcpStream::connect(addr)?)
    }

    /// A connection made already (from an address of the caller's choice).
    pub fn over(stream: TcpStream) -> io::Result<Conn> {
        stream.set_read_timeout(Some(READ_LIMIT))?;
        Ok(Conn { reader: BufReader::new(stream) })
    }

    pub fn get(&mut self, path: &str) -> io::Result<Response> {
        self.request("GET", path)
    }

    pub fn request(&mut self, method: &str, path: &str) -> io::Result<Response> {
        write!(
            self.reader.get_mut(),
            "{method} {path} HTTP/1.1\r\nHost: app\r\nContent-Length: 0\r\n\r\n"
        )?;
        self.read_response()
    }

    fn read_response(&mut self) -> io::Result<Response> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed before a response"));
        }
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, line.clone()))?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let mut r = Response { status, headers, body: String::new() };
        if let Some(len) = r.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
            let mut body = vec![0; len];
            self.reader.read_exact(&mut body)?;
            r.body = String::from_utf8_lossy(&body).into_owned();
        } else if r.header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            r.body = self.read_chunked()?;
        }
        Ok(r)
    }

    fn read_chunked(&mut self) -> io::Result<String> {
        let mut body = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim(), 16)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, line.clone()))?;
            let mut chunk = vec![0; size + 2];
            self.reader.read_exact(&mut chunk)?;
            if size == 0 {
                return Ok(String::from_utf8_lossy(&body).into_owned());
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
}

/// A request on a connection of its own, made in the background; it yields the response and
/// when it arrived.
pub fn in_flight(addr: &str, path: &str) -> thread::JoinHandle<io::Result<(Response, Instant)>> {
    let (addr, path) = (addr.to_string(), path.to_string());
    thread::spawn(move || {
        let mut conn = Conn::open(&addr)?;
        let r = conn.get(&path)?;
        Ok((r, Instant::now()))
    })
}

/// A bare HTTP/2 client (prior knowledge, no TLS): enough to put several requests on one
/// connection and see them answered. Header blocks use HPACK literals only.
pub struct H2 {
    stream: TcpStream,
    next_id: u32,
    done: std::sync::mpsc::Receiver<u32>,
}

impl H2 {
    pub fn open(addr: &str) -> io::Result<H2> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(READ_LIMIT))?;
        stream.write_all(h2::PREFACE)?;
        stream.write_all(&h2::frame(h2::SETTINGS, 0, 0, &[]))?;
        let (tx, done) = std::sync::mpsc::channel();
        let mut reader = stream.try_clone()?;
        let mut writer = stream.try_clone()?;
        // Reads frames until the connection ends: acknowledges SETTINGS and PING, and reports
        // each stream whose response has ended.
        thread::spawn(move || {
            while let Ok(f) = h2::read_frame(&mut reader) {
                let _ = h2::acknowledge(&f, &mut writer);
                if matches!(f.kind, h2::DATA | h2::HEADERS) && f.flags & h2::END_STREAM != 0 {
                    let _ = tx.send(f.stream);
                }
            }
        });
        Ok(H2 { stream, next_id: 1, done })
    }

    /// Starts a GET on a new stream of this connection.
    pub fn get(&mut self, path: &str) -> io::Result<u32> {
        // :method GET (static 2), :scheme http (static 6), then :path (4) and :authority (1).
        let mut block = vec![0x82, 0x86];
        block.extend(h2::literal(0x04, path));
        block.extend(h2::literal(0x01, "app"));
        let id = self.next_id;
        self.next_id += 2;
        self.stream.write_all(&h2::frame(
            h2::HEADERS,
            h2::END_STREAM | h2::END_HEADERS,
            id,
            &block,
        ))?;
        Ok(id)
    }

    /// Waits until `n` responses have ended; fails the test after `limit`.
    pub fn wait_answered(&self, n: usize, limit: Duration) {
        let until = Instant::now() + limit;
        for seen in 0..n {
            let left = until.saturating_duration_since(Instant::now());
            if self.done.recv_timeout(left).is_err() {
                panic!("{seen} of {n} HTTP/2 responses within {limit:?}");
            }
        }
    }
}
