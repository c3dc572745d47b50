//! A minimal HTTP/1.1 client that shows exactly what Envoy sent (status, `connection: close`),
//! and can keep a connection open and idle.

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
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Envoy told the client to close: what a drain does to an HTTP/1 response.
    pub fn says_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// One client connection; requests on it reuse it (keep-alive) until it is dropped.
pub struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    pub fn open(addr: &str) -> io::Result<Conn> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(READ_LIMIT))?;
        Ok(Conn {
            reader: BufReader::new(stream),
        })
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
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before a response",
            ));
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
        let mut r = Response {
            status,
            headers,
            body: String::new(),
        };
        if let Some(len) = r
            .header("content-length")
            .and_then(|v| v.parse::<usize>().ok())
        {
            let mut body = vec![0; len];
            self.reader.read_exact(&mut body)?;
            r.body = String::from_utf8_lossy(&body).into_owned();
        } else if r
            .header("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"))
        {
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
