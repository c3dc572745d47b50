//! Envoy's admin API on a Unix socket (Contour's, Kuma's): a ureq connector that opens the socket
//! where ureq would open a TCP connection, so everything goes through the same client. ureq's
//! `unversioned` transport API may change in a minor release: Cargo.lock pins the version.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use ureq::Error;
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, LazyBuffers, NextTimeout, Transport,
};

/// Opens `path` for every request, whatever the request's host.
#[derive(Debug)]
pub(crate) struct UnixConnector {
    pub(crate) path: PathBuf,
}

impl<In: Transport> Connector<In> for UnixConnector {
    type Out = UnixTransport;

    fn connect(
        &self,
        details: &ConnectionDetails,
        _chained: Option<In>,
    ) -> Result<Option<UnixTransport>, Error> {
        let stream = connect(&self.path, details.timeout.not_zero().map(|t| *t))?;
        let config = details.config;
        let buffers = LazyBuffers::new(config.input_buffer_size(), config.output_buffer_size());
        Ok(Some(UnixTransport { stream, buffers }))
    }
}

/// Connects within `timeout`. A blocking connect to a Unix socket waits for room in the
/// listener's backlog without end (`unix_stream_connect` in net/unix/af_unix.c sleeps for the
/// socket's send timeout), so the timeout is set before connecting.
fn connect(path: &Path, timeout: Option<Duration>) -> Result<UnixStream, Error> {
    // SAFETY: sockaddr_un is plain data for which all zeroes is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    // The path and its terminating NUL must fit.
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(Error::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a socket path of at most {} bytes", addr.sun_path.len() - 1),
        )));
    }
    for (to, from) in addr.sun_path.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    // SAFETY: socket() takes no pointers; the descriptor it returns is checked, then owned.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Error::Io(io::Error::last_os_error()));
    }
    // SAFETY: fd is a new descriptor that nothing else owns.
    let stream = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    stream.set_write_timeout(timeout)?;
    let started = Instant::now();
    loop {
        // SAFETY: addr lives across the call, with its size passed.
        let r = unsafe {
            libc::connect(
                stream.as_raw_fd(),
                (&raw const addr).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if r == 0 {
            return Ok(stream);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted if timeout.is_none_or(|t| started.elapsed() < t) => {
                continue;
            }
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted => {
                return Err(Error::Timeout(ureq::Timeout::Connect));
            }
            _ => return Err(Error::Io(e)),
        }
    }
}

pub(crate) struct UnixTransport {
    stream: UnixStream,
    buffers: LazyBuffers,
}

/// Not derived: the buffers' derived Debug would cost the binary 4 KB.
impl std::fmt::Debug for UnixTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnixTransport").finish()
    }
}

/// The time `timeout` leaves, or the timeout error ureq expects when none is left.
fn left(timeout: NextTimeout) -> Result<Option<Duration>, Error> {
    if timeout.after.is_zero() {
        return Err(Error::Timeout(timeout.reason));
    }
    Ok(timeout.not_zero().map(|t| *t))
}

/// An I/O error as ureq expects it: a timeout as its own error.
fn io_error(e: io::Error, timeout: NextTimeout) -> Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout(timeout.reason),
        _ => Error::Io(e),
    }
}

impl Transport for UnixTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), Error> {
        let timeout = timeout.for_write();
        self.stream.set_write_timeout(left(timeout)?)?;
        let output = &self.buffers.output()[..amount];
        self.stream.write_all(output).map_err(|e| io_error(e, timeout))
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, Error> {
        let timeout = timeout.for_read();
        let limit = left(timeout)?;
        let started = Instant::now();
        let n = loop {
            // A signal cuts a read short: retry within the time left.
            let rest = limit.map(|l| l.saturating_sub(started.elapsed()));
            if rest.is_some_and(|r| r.is_zero()) {
                return Err(Error::Timeout(timeout.reason));
            }
            self.stream.set_read_timeout(rest)?;
            match self.stream.read(self.buffers.input_append_buf()) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other.map_err(|e| io_error(e, timeout))?,
            }
        };
        self.buffers.input_appended(n);
        Ok(n > 0)
    }

    /// Connections are never pooled (`max_idle_connections(0)`), so none is reused.
    fn is_open(&mut self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Address;
    use crate::source::admin::Client;
    use std::os::unix::net::UnixListener;

    /// A listener whose backlog is full makes a blocking connect wait without end; the client
    /// gives up when its time is up.
    #[test]
    fn a_full_backlog_ends_at_the_timeout() {
        let dir = std::env::temp_dir().join(format!("envoy-drain-uds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("admin.sock");
        let _listener = UnixListener::bind(&path).unwrap();
        let mut queued = Vec::new();
        let full = (0..5000).any(|_| match connect(&path, Some(Duration::from_millis(50))) {
            Ok(s) => {
                queued.push(s);
                false
            }
            Err(Error::Timeout(_)) => true,
            Err(e) => panic!("{e}"),
        });
        assert!(full, "the backlog filled after {} connections", queued.len());
        let client = Client::new(Address::Unix(path));
        let started = Instant::now();
        let e = client.post("/drain_listeners", Duration::from_millis(300)).unwrap_err();
        let took = started.elapsed();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(e, crate::error::Failure::from("no complete answer within 300ms"));
        assert!(client.url("/drain_listeners").ends_with("admin.sock"));
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn a_socket_that_is_not_there_is_named_in_the_logs_words() {
        let client = Client::new(Address::Unix(PathBuf::from("/nonexistent/admin.sock")));
        let e = client.get("/ready", Duration::from_secs(1)).unwrap_err();
        let line = crate::error::failed("GET", client.url("/ready"), e);
        assert_eq!(
            line.to_string(),
            "failed to GET /ready on unix:/nonexistent/admin.sock: no such file or directory"
        );
    }

    #[test]
    fn a_path_too_long_for_a_socket_address_is_refused_before_connecting() {
        let long = PathBuf::from(format!("/{}", "a".repeat(200)));
        let e = connect(&long, None).unwrap_err().to_string();
        assert!(e.contains("a socket path of at most 107 bytes"), "{e}");
    }
}
