//! The kernel's TCP sockets over netlink (NETLINK_SOCK_DIAG), the way `ss` asks for them: dumps
//! of the listening sockets, then the open ones, each with the columns procnet's rule reads from
//! `/proc/net/tcp`, filtered by the kernel and never written as text. Parsing is pure (`parse`,
//! fuzzed); only `dump` talks to the kernel. Layouts and the kernel's behaviour:
//! docs/how-it-works.md ("Reading the socket table over netlink").

use crate::error::{Failure, failed, io_cause};
use crate::source::procnet::{Endpoint, Sink, Socket, TIME_WAIT};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// `NETLINK_SOCK_DIAG` (linux/netlink.h).
const NETLINK_SOCK_DIAG: i32 = 4;
/// The first version of the request: for a dump the kernel sets its family to AF_UNSPEC
/// (`inet_diag_dump_compat`), so one walk answers for IPv4 and IPv6.
const TCPDIAG_GETSOCK: u16 = 18;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
/// Set on a reply when the kernel saw the tables change under the dump.
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

const HEADER: usize = 16;
/// `struct inet_diag_req`: family, lengths, extensions (4), the socket id (48), states, tables.
const REQUEST: usize = 60;
/// `struct inet_diag_msg`: family, state, timer, retransmits (4), the socket id (48), expiry and
/// queues (12), uid and inode (8); attributes may follow.
const MESSAGE: usize = 72;

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// The states the rule looks at, in two dumps, each of which walks only its own hash table
/// (`inet_diag_dump_icsk`): LISTEN, then ESTABLISHED, SYN_SENT, SYN_RECV and CLOSE_WAIT, and
/// FIN_WAIT1, LAST_ACK and CLOSING, where a closed connection may still deliver its last bytes.
pub(crate) const LISTENING: u32 = 1 << 10;
pub(crate) const OPEN: u32 =
    (1 << 1) | (1 << 2) | (1 << 3) | (1 << 4) | (1 << 8) | (1 << 9) | (1 << 11);
/// Every state but LISTEN, for `hold`: TIME_WAIT keeps a closed connection's ends for 60 s.
pub(crate) const ALL: u32 = 0xfff & !LISTENING & !1;

/// The kernel fills a dump's datagrams up to 32 KiB (`SKB_WITH_OVERHEAD(32768)`, af_netlink.c).
const DATAGRAM: usize = 32 * 1024;

/// The most one dump may return: like the text reader's cap, about 900,000 sockets, or 300,000
/// with each one's `tcp_info`.
const MAX_DUMP: usize = 128 << 20;

/// The extension bit that asks for each socket's `tcp_info`, and the attribute that carries it.
const INFO_EXT: u8 = 1 << (INET_DIAG_INFO - 1);
const INET_DIAG_INFO: u16 = 2;
/// Where `tcpi_bytes_received` lies in `struct tcp_info` (linux/tcp.h; since Linux 4.1).
const BYTES_RECEIVED: usize = 128;
/// Where `tcpi_last_data_sent` and `tcpi_last_data_recv` lie in `struct tcp_info`: milliseconds
/// since data was last sent, and since data last arrived.
const LAST_DATA_SENT: usize = 44;
const LAST_DATA_RECV: usize = 52;
/// Where `tcpi_data_segs_out` lies in `struct tcp_info` (since Linux 4.6): data segments sent.
const DATA_SEGS_OUT: usize = 156;

/// The coarsest clock tcp_info's milliseconds come from: jiffies at HZ=100. An age counted in
/// whole jiffies can be one longer than the time that passed (`jiffies_to_msecs(now - lrcvtime)`,
/// net/ipv4/tcp.c; TIME_WAIT's time left, `inet_twsk_diag_fill`, likewise), so an arrival dated
/// by it is dated up to a jiffy early; the age less a jiffy never dates it before it came.
pub(crate) const JIFFY: Duration = Duration::from_millis(10);

/// How long a closed connection's end waits in TIME_WAIT (`TCP_TIMEWAIT_LEN`, include/net/tcp.h);
/// a dump gives the milliseconds it has left (`inet_twsk_diag_fill`).
pub(crate) const TIME_WAIT_LEN: Duration = Duration::from_secs(60);

/// The sequence number of every request: each dump has a socket of its own.
const SEQ: u32 = 1;

/// The dump request for `states`; with `info`, with each `tcp_info`.
pub(crate) fn request(states: u32, info: bool) -> [u8; HEADER + REQUEST] {
    let mut b = [0u8; HEADER + REQUEST];
    b[0..4].copy_from_slice(&((HEADER + REQUEST) as u32).to_ne_bytes());
    b[4..6].copy_from_slice(&TCPDIAG_GETSOCK.to_ne_bytes());
    b[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    b[8..12].copy_from_slice(&SEQ.to_ne_bytes());
    // Family, lengths and the socket id stay zero: a dump of everything.
    if info {
        b[HEADER + 3] = INFO_EXT;
    }
    b[HEADER + 52..HEADER + 56].copy_from_slice(&states.to_ne_bytes());
    b
}

/// Reads one datagram of the reply to request `seq` into `sink`; `true` once the dump is done. A
/// message that is not whole and ours makes the reply unusable; the kernel's error, netlink.
pub fn parse(datagram: &[u8], seq: u32, sink: &mut impl Sink) -> Result<bool, DumpError> {
    let mut rest = datagram;
    while !rest.is_empty() {
        if rest.len() < HEADER {
            return Err(unread("a message shorter than its header"));
        }
        let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let kind = u16::from_ne_bytes([rest[4], rest[5]]);
        let flags = u16::from_ne_bytes([rest[6], rest[7]]);
        let their_seq = u32::from_ne_bytes([rest[8], rest[9], rest[10], rest[11]]);
        if len < HEADER || len > rest.len() {
            return Err(unread("a message whose length does not fit the datagram"));
        }
        if their_seq != seq {
            return Err(unread("a message for another request"));
        }
        if flags & NLM_F_DUMP_INTR != 0 {
            return Err(unread("the kernel says the tables changed under the dump"));
        }
        let body = &rest[HEADER..len];
        match kind {
            NLMSG_NOOP => {}
            NLMSG_DONE | NLMSG_ERROR => {
                // Both carry an int: 0 for a dump's end, else a negative errno.
                let short = || unread("an end or error message without its code");
                let code = i32::from_ne_bytes(*body.first_chunk().ok_or_else(short)?);
                return match code {
                    0 if kind == NLMSG_DONE => Ok(true),
                    0 => Err(unread("an acknowledgement where a dump was asked for")),
                    c => Err(DumpError::Unavailable(failed(
                        "dump",
                        "the kernel's TCP sockets over netlink",
                        format!(
                            "the kernel refused: {}",
                            io::Error::from_raw_os_error(c.saturating_neg())
                        ),
                    ))),
                };
            }
            TCPDIAG_GETSOCK => sink.add(socket(body)?),
            _ => return Err(unread("a message of an unknown type")),
        }
        // Messages are aligned to 4 bytes; the last one's padding may be cut.
        let next = (len + 3) & !3;
        rest = rest.get(next..).unwrap_or_default();
    }
    Ok(false)
}

/// One `inet_diag_msg`; IPv4 addresses become IPv4-mapped, as the text reader keeps them.
fn socket(body: &[u8]) -> Result<Socket, DumpError> {
    let m: &[u8; MESSAGE] =
        body.first_chunk().ok_or_else(|| unread("a socket message shorter than inet_diag_msg"))?;
    let end = |at: usize, port: [u8; 2]| -> Result<Endpoint, DumpError> {
        let a: [u8; 16] = m[at..at + 16].try_into().map_err(|_| unread("a short address"))?;
        let ip = match m[0] {
            AF_INET => Ipv4Addr::new(a[0], a[1], a[2], a[3]).to_ipv6_mapped(),
            AF_INET6 => Ipv6Addr::from(a),
            _ => return Err(unread("a socket of neither IPv4 nor IPv6")),
        };
        Ok(Endpoint { ip, port: u16::from_be_bytes(port) })
    };
    let (local, remote) = (end(8, [m[4], m[5]])?, end(24, [m[6], m[7]])?);
    let u32_at = |at: usize| u32::from_ne_bytes([m[at], m[at + 1], m[at + 2], m[at + 3]]);
    let info = info(&body[MESSAGE..]);
    let idle = match (m[1], info) {
        (TIME_WAIT, _) => {
            let left = Duration::from_millis(u32_at(52).into());
            Some(TIME_WAIT_LEN.saturating_sub(left).saturating_sub(JIFFY))
        }
        (_, Some((_, last_recv, _))) => {
            Some(Duration::from_millis(last_recv.into()).saturating_sub(JIFFY))
        }
        _ => None,
    };
    Ok(Socket {
        local,
        remote,
        state: m[1],
        uid: u32_at(64),
        inode: u64::from(u32_at(68)),
        received: info.map(|(received, ..)| received),
        idle,
        // `write_seq - snd_una` for a socket that is not listening (`tcp_diag_get_info`).
        unsent: u32_at(60),
        awaiting: info.is_some_and(|(.., awaiting)| awaiting),
    })
}

/// What a socket's `tcp_info` tells, from the `rtattr`s after an `inet_diag_msg`, when there: the
/// bytes received, the milliseconds since data last came, and whether it awaits an answer.
fn info(mut attrs: &[u8]) -> Option<(u64, u32, bool)> {
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
        let payload = attrs.get(4..len)?;
        if kind == INET_DIAG_INFO {
            let b = payload.get(BYTES_RECEIVED..)?.first_chunk()?;
            let u32_at = |at: usize| Some(u32::from_ne_bytes(*payload.get(at..)?.first_chunk()?));
            let received = u64::from_ne_bytes(*b);
            let (last_recv, last_sent) = (u32_at(LAST_DATA_RECV)?, u32_at(LAST_DATA_SENT)?);
            // Data segments sent, where the kernel's `tcp_info` is that long.
            let segs_out = u32_at(DATA_SEGS_OUT);
            // Data came after the last it sent, in milliseconds; or it came and none was ever
            // sent (a first request, whose arrival and the handshake fall in one millisecond).
            let awaiting = received > 0 && (last_recv < last_sent || segs_out == Some(0));
            return Some((received, last_recv, awaiting));
        }
        attrs = attrs.get((len + 3) & !3..).unwrap_or_default();
    }
    None
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DumpError {
    /// Netlink is not there or the kernel has no sock_diag for TCP (gVisor, a kernel without
    /// inet_diag or tcp_diag): it will not change within a run.
    Unavailable(Failure),
    /// This dump could not be read whole in time: this count is unknown.
    Failed(Failure),
}

/// This dump's reply could not be read, for `cause`.
fn unread(cause: impl Into<String>) -> DumpError {
    DumpError::Failed(failed("read", "the sock_diag reply", cause.into()))
}

/// Sends `req` (`request`) to the kernel and reads the TCP sockets of this network namespace
/// into `sink` as the kernel sends them, before `until`. Not deduplicated: a socket shows twice
/// only when its hash chain gained one between two datagrams.
pub(crate) fn dump(req: &[u8], until: Instant, sink: &mut impl Sink) -> Result<(), DumpError> {
    // SAFETY: socket() takes no pointers; the descriptor it returns is checked, then owned.
    let fd = unsafe {
        libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
    };
    if fd < 0 {
        let os = io_cause(&io::Error::last_os_error());
        return Err(DumpError::Unavailable(failed("open", "a NETLINK_SOCK_DIAG socket", os)));
    }
    // std's UdpSocket makes the calls that take no address on any datagram socket: a send, which
    // an unconnected netlink socket sends to the kernel (netlink_sendmsg,
    // net/netlink/af_netlink.c), and the receive timeout.
    // SAFETY: fd is a new descriptor that nothing else owns; the socket closes it once.
    let socket = UdpSocket::from(unsafe { OwnedFd::from_raw_fd(fd) });
    socket.send(req).map_err(|e| {
        DumpError::Unavailable(failed("send", "the sock_diag request", io_cause(&e)))
    })?;
    let mut buf = vec![0u8; DATAGRAM];
    let mut total = 0usize;
    loop {
        let n = receive(&socket, &mut buf, until)?;
        if n > buf.len() {
            return Err(unread(format!("a datagram of {n} bytes does not fit {DATAGRAM}")));
        }
        total += n;
        if total > MAX_DUMP {
            return Err(unread(format!("it is larger than {MAX_DUMP} bytes")));
        }
        match parse(&buf[..n], SEQ, sink)? {
            true => break,
            false if n == 0 => return Err(unread("it ended early")),
            false => {}
        }
    }
    Ok(())
}

/// One datagram from the kernel within the time left, its whole length even when cut (MSG_TRUNC).
fn receive(socket: &UdpSocket, buf: &mut [u8], until: Instant) -> Result<usize, DumpError> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(unread("no time left before the deadline"));
        }
        let timeout = socket.set_read_timeout(Some(left));
        timeout.map_err(|e| unread(format!("setting its timeout: {}", io_cause(&e))))?;
        // SAFETY: sockaddr_nl is plain data for which all zeroes is valid.
        let mut from: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        let mut from_len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        // SAFETY: buf, from and from_len live across the call, with their lengths passed;
        // MSG_TRUNC makes the kernel return the datagram's length but copy at most buf.len().
        let n = unsafe {
            libc::recvfrom(
                socket.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_TRUNC,
                (&raw mut from).cast(),
                &mut from_len,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    return Err(unread("no time left before the deadline"));
                }
                _ => return Err(unread(io_cause(&e))),
            }
        }
        if from.nl_pid != 0 {
            continue;
        }
        return Ok(n as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Filter;
    use crate::count::Basis;
    use crate::count::Excluded;
    use crate::lists::PortSet;
    use crate::source::procnet::testing::count;
    use crate::source::procnet::{DEFAULT_EPHEMERAL, Listeners, Table, TableFacts};

    /// A message as the kernel lays it out: header, then `body`, padded to 4 bytes.
    fn message(kind: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut m = ((HEADER + body.len()) as u32).to_ne_bytes().to_vec();
        m.extend([kind.to_ne_bytes(), flags.to_ne_bytes()].concat());
        m.extend([seq.to_ne_bytes(), 0u32.to_ne_bytes()].concat());
        m.extend(body);
        m.resize(m.len().next_multiple_of(4), 0);
        m
    }

    /// One socket of the dump of request 1.
    fn socket(diag: &[u8]) -> Vec<u8> {
        message(TCPDIAG_GETSOCK, 0x2, 1, diag)
    }

    /// An `inet_diag_msg` for a socket, with `extra` attribute bytes after it.
    fn diag(
        family: u8,
        state: u8,
        local: (&[u8], u16),
        remote: (&[u8], u16),
        uid: u32,
        inode: u32,
    ) -> Vec<u8> {
        let mut m = vec![0u8; MESSAGE];
        m[0] = family;
        m[1] = state;
        m[4..6].copy_from_slice(&local.1.to_be_bytes());
        m[6..8].copy_from_slice(&remote.1.to_be_bytes());
        m[8..8 + local.0.len()].copy_from_slice(local.0);
        m[24..24 + remote.0.len()].copy_from_slice(remote.0);
        m[64..68].copy_from_slice(&uid.to_ne_bytes());
        m[68..72].copy_from_slice(&inode.to_ne_bytes());
        // An INET_DIAG_SHUTDOWN attribute, as the kernel always adds: skipped by its length.
        m.extend_from_slice(&[5, 0, 8, 0, 0, 0, 0, 0]);
        m
    }

    fn done(seq: u32, code: i32) -> Vec<u8> {
        message(NLMSG_DONE, 0x2, seq, &code.to_ne_bytes())
    }

    #[test]
    fn the_request_asks_for_a_dump_of_the_rules_states() {
        let r = request(LISTENING | OPEN, false);
        assert_eq!(u32::from_ne_bytes(r[0..4].try_into().unwrap()), 76);
        assert_eq!(u16::from_ne_bytes(r[4..6].try_into().unwrap()), 18);
        assert_eq!(u16::from_ne_bytes(r[6..8].try_into().unwrap()), 0x301);
        assert_eq!(u32::from_ne_bytes(r[8..12].try_into().unwrap()), SEQ);
        assert_eq!(u32::from_ne_bytes(r[68..72].try_into().unwrap()), 0xf1e);
    }

    #[test]
    fn sockets_of_both_families_become_what_the_text_reader_makes() {
        let mut d =
            socket(&diag(AF_INET, 1, (&[127, 0, 0, 1], 8080), (&[127, 0, 0, 2], 50000), 1337, 42));
        let v6 = std::net::Ipv6Addr::LOCALHOST.octets();
        d.extend(socket(&diag(AF_INET6, 10, (&v6, 15006), (&[0; 16], 0), 1337, 43)));
        let mut t = Table::default();
        assert_eq!(parse(&d, 1, &mut t), Ok(false));
        let line = "   0: 0100007F:1F90 0200007F:C350 01 00000000:00000000 00:00000000 00000000  1337        0 42";
        let mut text = Table::default();
        text.add_line(line);
        assert_eq!(t.sockets[0], text.sockets[0]);
        assert_eq!(t.sockets[1].local, Endpoint { ip: Ipv6Addr::LOCALHOST, port: 15006 });
        assert_eq!((t.sockets[1].state, t.sockets[1].inode), (10, 43));
        assert_eq!(parse(&done(1, 0), 1, &mut t), Ok(true));
    }

    #[test]
    fn the_kernels_refusals_are_told_from_bytes_that_make_no_sense() {
        let mut t = Table::default();
        // No inet_diag: an error message carrying -EOPNOTSUPP (TCPDIAG_GETSOCK) or -ENOENT
        // (SOCK_DIAG_BY_FAMILY), then the request's header.
        let mut error = (-libc::ENOENT).to_ne_bytes().to_vec();
        error.extend_from_slice(&request(OPEN, false)[..HEADER]);
        let refused = |e: Result<bool, DumpError>| match e {
            Err(DumpError::Unavailable(why)) => why.ends_with(&format!(
                "the kernel refused: {}",
                io::Error::from_raw_os_error(libc::ENOENT)
            )),
            _ => false,
        };
        assert!(refused(parse(&message(NLMSG_ERROR, 0x100, 1, &error), 1, &mut t)));
        // No protocol handler: the dump's end carries the error instead of 0.
        assert!(refused(parse(&done(1, -libc::ENOENT), 1, &mut t)));
        for (bytes, why) in [
            (done(2, 0), "another request"),
            (message(NLMSG_DONE, NLM_F_DUMP_INTR, 1, &0i32.to_ne_bytes()), "changed"),
            (message(99, 0, 1, &[]), "unknown type"),
            (message(TCPDIAG_GETSOCK, 0, 1, &[0; 8]), "shorter than inet_diag_msg"),
            (message(NLMSG_DONE, 0, 1, &[]), "without its code"),
            (done(1, 0)[..10].to_vec(), "shorter than its header"),
        ] {
            match parse(&bytes, 1, &mut t) {
                Err(DumpError::Failed(w)) => assert!(w.contains(why), "{w}"),
                other => panic!("{other:?} for {why}"),
            }
        }
        let mut long = done(1, 0);
        long[0] = 200;
        assert!(matches!(parse(&long, 1, &mut t), Err(DumpError::Failed(_))));
        assert!(t.sockets.is_empty());
    }

    #[test]
    fn a_request_in_the_syn_queue_counts_as_its_listeners() {
        let mut t = Table::default();
        let any = [0u8; 4];
        let lo = [127, 0, 0, 1];
        let d = [
            diag(AF_INET, 10, (&any, 8080), (&any, 0), 1337, 5),
            diag(AF_INET, 3, (&lo, 8080), (&lo, 40000), 0, 0),
            diag(AF_INET, 3, (&lo, 9090), (&lo, 40001), 0, 0),
        ]
        .iter()
        .flat_map(|b| socket(b))
        .collect::<Vec<u8>>();
        parse(&d, 1, &mut t).unwrap();
        let filter = Filter { ignore: PortSet::default(), only: None };
        let envoy = Basis::Process { pid: 1, uid: 1337, admin: String::new() };
        let rule = TableFacts {
            filter: &filter,
            envoy: &envoy,
            inodes: &[5],
            ephemeral: &DEFAULT_EPHEMERAL,
        };
        let c = count(&t, &rule, &mut Listeners::default());
        assert_eq!(c.total, 1, "{c:?}");
        assert_eq!(
            c.excluded[0],
            Excluded { why: "another process's socket (uid 0)".to_string(), n: 1 },
            "no listener on 9090: left as the kernel said"
        );
    }

    /// A SOCK_DIAG_BY_FAMILY dump request (`inet_diag_req_v2`) for a family and protocol.
    fn by_family(family: u8, protocol: u8) -> Vec<u8> {
        let mut b = vec![0u8; HEADER + 56];
        b[0..4].copy_from_slice(&((HEADER + 56) as u32).to_ne_bytes());
        b[4..6].copy_from_slice(&20u16.to_ne_bytes());
        b[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        b[8..12].copy_from_slice(&1u32.to_ne_bytes());
        b[HEADER] = family;
        b[HEADER + 1] = protocol;
        b[HEADER + 4..HEADER + 8].copy_from_slice(&(LISTENING | OPEN).to_ne_bytes());
        b
    }

    /// The kernel's own refusals, asked for on purpose: no handler for a family is an error
    /// message with ENOENT (net/core/sock_diag.c), no handler for a protocol is a dump whose
    /// end carries -ENOENT (net/ipv4/inet_diag.c). Both make netlink unavailable, not a count.
    #[test]
    fn the_real_kernels_refusals_make_netlink_unavailable() {
        let until = Instant::now() + std::time::Duration::from_secs(10);
        // Family 4 (IPX) has had no sock_diag handler since IPX left the kernel.
        let no_family = dump(&by_family(4, 0), until, &mut Table::default()).unwrap_err();
        assert_eq!(
            no_family,
            DumpError::Unavailable(failed(
                "dump",
                "the kernel's TCP sockets over netlink",
                format!("the kernel refused: {}", std::io::Error::from_raw_os_error(libc::ENOENT))
            ))
        );
        // Protocol 253 is reserved for experiments: no inet_diag handler will ever exist.
        let no_protocol = dump(&by_family(AF_INET, 253), until, &mut Table::default()).unwrap_err();
        assert_eq!(no_protocol, no_family);
    }

    /// The real kernel, in this process's namespace: a listener and a connection to it show up.
    #[test]
    fn real_dumps_hold_this_processs_listener_then_its_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let until = Instant::now() + std::time::Duration::from_secs(10);
        let mut l = Table::default();
        dump(&request(LISTENING, false), until, &mut l).unwrap();
        assert!(l.sockets.iter().all(|s| s.state == 10), "{:?}", l.sockets);
        assert_eq!(l.sockets.iter().filter(|s| s.local.port == port).count(), 1);
        let mut t = Table::default();
        dump(&request(OPEN, false), until, &mut t).unwrap();
        assert!(t.sockets.iter().all(|s| s.state != 10), "{:?}", t.sockets);
        let on_port: Vec<&Socket> = t.sockets.iter().filter(|s| s.local.port == port).collect();
        assert_eq!(on_port.len(), 1, "the accepted end");
        assert_eq!(on_port[0].received, None, "not asked for");
        assert!(t.sockets.iter().any(|s| s.remote.port == port && s.state == 1));
    }

    /// Asked for, each socket comes with the bytes it has received, read or not.
    #[test]
    fn real_dumps_with_info_tell_the_bytes_an_accepted_connection_received() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let until = Instant::now() + std::time::Duration::from_secs(10);
        let received = || {
            let mut t = Table::default();
            dump(&request(OPEN, true), until, &mut t).unwrap();
            let accepted = t.sockets.iter().find(|s| s.local.port == port).copied();
            accepted.and_then(|s| s.received)
        };
        assert_eq!(received(), Some(0));
        client.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        // Loopback delivers before the write returns; a few dumps at most, bounded in time.
        let seen = (0..100).find_map(|_| received().filter(|&n| n > 0));
        assert_eq!(seen, Some(16));
    }

    /// Over netlink an accepted connection tells a request not answered yet (its peer sent last)
    /// and an answer not delivered yet (bytes its peer has not acknowledged): a client that
    /// does not read.
    #[test]
    fn real_dumps_tell_a_request_awaiting_its_answer_and_an_answer_still_being_delivered() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        let accepted = || {
            let mut t = Table::default();
            dump(&request(OPEN, true), until, &mut t).unwrap();
            t.sockets
                .iter()
                .find(|s| s.local.port == port && s.state != crate::source::procnet::LISTEN)
                .copied()
        };
        let asked = b"GET /big HTTP/1.1\r\n\r\n";
        client.write_all(asked).unwrap();
        server.read_exact(&mut vec![0u8; asked.len()]).unwrap();
        // The clock of tcp_info ticks in milliseconds: the request is the last data by then.
        std::thread::sleep(Duration::from_millis(20));
        let s = accepted().unwrap();
        assert!(s.awaiting && s.unsent == 0, "the request, not answered: {s:?}");
        // An answer larger than what the kernel holds for a client that does not read.
        server.set_nonblocking(true).unwrap();
        let chunk = [b'x'; 64 * 1024];
        let written: usize = (0..1000).map_while(|_| server.write(&chunk).ok()).sum();
        std::thread::sleep(Duration::from_millis(20));
        let s = accepted().unwrap();
        assert!(!s.awaiting && s.unsent > 0, "{written} bytes written, some not delivered: {s:?}");
        // The client reads it all: delivered.
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = vec![0u8; written];
        client.read_exact(&mut got).unwrap();
        let delivered = (0..100).find_map(|_| accepted().filter(|s| s.unsent == 0));
        assert!(delivered.is_some_and(|s| !s.awaiting), "{delivered:?}");
    }

    /// A server that wrote an answer and closed (Envoy, after an answer it added `Connection:
    /// close` to) leaves the kernel delivering it, in FIN_WAIT1 with no process: the pod's
    /// accepted connections still count it as delivering, not as open.
    #[test]
    fn real_dumps_tell_an_answer_still_delivered_after_its_server_closed() {
        use crate::count::Busy;
        use crate::source::procnet::{Accepted, SocketTally};
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let chunk = [b'x'; 64 * 1024];
        let written: usize = (0..1000).map_while(|_| server.write(&chunk).ok()).sum();
        drop(server);
        let until = Instant::now() + Duration::from_secs(10);
        let busy = || {
            let mut t = Table::default();
            dump(&request(LISTENING | OPEN, true), until, &mut t).unwrap();
            // This test's listener alone: the other tests' connections share the namespace.
            let listened: Vec<_> =
                t.listening().iter().map(|s| s.local).filter(|l| l.port == port).collect();
            let ignore = crate::lists::PortSet::default();
            // SAFETY: geteuid has no preconditions and cannot fail.
            let proxy = unsafe { libc::geteuid() };
            let accepted = Accepted { listened: &listened, ignore: &ignore, proxy };
            let mut tally = SocketTally::new(&t, None, false, Some(accepted));
            let closed = t.sockets.iter().filter(|s| s.local.port == port && s.inode == 0);
            let closed = closed.count();
            t.sockets.iter().for_each(|s| tally.add(*s));
            (tally.busy(), closed)
        };
        let (orphaned, closed) = busy();
        assert_eq!(closed, 1, "the server's end, closed, with no process: {written} written");
        assert_eq!(orphaned.delivering, 1, "{orphaned:?}");
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = vec![0u8; written];
        client.read_exact(&mut got).unwrap();
        let delivered = (0..100).map(|_| busy().0).find(|b| b.delivering == 0);
        assert_eq!(delivered, Some(Busy::default()));
    }

    /// Over netlink a socket tells how long it has received nothing: an open one since its last
    /// bytes, one in TIME_WAIT since it closed.
    #[test]
    fn real_dumps_tell_how_long_a_socket_has_been_idle_or_closed() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        client.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        // Read, or the close would reset the connection.
        std::io::Read::read(&mut server, &mut [0u8; 64]).unwrap();
        // The time to measure.
        std::thread::sleep(Duration::from_millis(300));
        drop(server);
        let until = Instant::now() + Duration::from_secs(10);
        let mut all: Vec<Socket> = Vec::new();
        dump(&request(ALL, true), until, &mut all).unwrap();
        let client_end = all.iter().find(|s| s.remote.port == port).copied();
        let idle = client_end.and_then(|s| s.idle);
        // The client has received nothing since it connected, 300 ms ago at least (less a jiffy).
        assert!(
            idle.is_some_and(
                |i| i >= Duration::from_millis(300) - JIFFY && i < Duration::from_secs(5)
            ),
            "{client_end:?}"
        );
        let closed = all.iter().find(|s| s.local.port == port && s.state == TIME_WAIT);
        assert!(closed.is_none(), "the server closed first but its peer has not: FIN_WAIT2");
        drop(client);
        let closed = (0..100).find_map(|_| {
            let mut all: Vec<Socket> = Vec::new();
            dump(&request(ALL, true), until, &mut all).unwrap();
            all.into_iter().find(|s| s.local.port == port && s.state == TIME_WAIT)
        });
        let idle = closed.and_then(|s| s.idle);
        assert!(idle.is_some_and(|i| i < Duration::from_secs(2)), "{closed:?}");
    }
}
