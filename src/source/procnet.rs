//! The socket table and its rule (pure: sockets in, count out), counted as Envoy's own
//! `downstream_cx_active` counts: the connections Envoy's listeners accepted, nothing Envoy or the
//! app opened. The rule and its facts: docs/running.md ("Counting"), docs/how-it-works.md.

use crate::config::{Filter, mapped};
use crate::count::{Basis, Busy, Count, Excluded, Part, SourceKind, Unit};
use crate::source::lines::decimal;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::RangeInclusive;

const ESTABLISHED: u8 = 0x01;
const SYN_SENT: u8 = 0x02;
pub(crate) const SYN_RECV: u8 = 0x03;
const FIN_WAIT1: u8 = 0x04;
pub(crate) const TIME_WAIT: u8 = 0x06;
const CLOSE_WAIT: u8 = 0x08;
const LAST_ACK: u8 = 0x09;
pub(crate) const LISTEN: u8 = 0x0A;
const CLOSING: u8 = 0x0B;

/// The kernel's default `ip_local_port_range`, where it cannot be read.
pub const DEFAULT_EPHEMERAL: RangeInclusive<u16> = 32768..=60999;

/// An address and port; IPv4 is kept in its IPv4-mapped IPv6 form so that both ends of a
/// connection compare equal whichever table shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub(crate) ip: Ipv6Addr,
    pub(crate) port: u16,
}

/// Whether `ip` is loopback, IPv4-mapped or not.
pub(crate) fn loopback(ip: &Ipv6Addr) -> bool {
    ip.to_canonical().is_loopback()
}

/// One line of either table: the columns the rule uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Socket {
    pub local: Endpoint,
    pub(crate) remote: Endpoint,
    pub state: u8,
    /// The socket's owner; an accepted socket has its listener's owner.
    pub(crate) uid: u32,
    /// Links the socket to its process (`/proc/<pid>/fd`); 0 while in its listener's queues.
    pub inode: u64,
    /// The bytes it has received, where netlink was asked for them (`tcpi_bytes_received`).
    pub(crate) received: Option<u64>,
    /// Over netlink, how long it has received nothing: since its last data (`tcp_info`, where
    /// asked for; a tick less, never more than it was), or since it closed (TIME_WAIT).
    pub(crate) idle: Option<std::time::Duration>,
    /// Bytes written to it and not yet acknowledged by its peer (`tx_queue`, `idiag_wqueue`).
    pub(crate) unsent: u32,
    /// Its peer's last data came after its own last (`tcp_info`, where asked for): on a
    /// connection the pod accepted, a request not answered yet.
    pub(crate) awaiting: bool,
}

/// Parses one line of either table; `None` for the header and for anything malformed.
pub fn parse_line(line: &str) -> Option<Socket> {
    let mut fields = line.split_ascii_whitespace();
    if !fields.next()?.ends_with(':') {
        return None;
    }
    let local = endpoint(fields.next()?)?;
    let remote = endpoint(fields.next()?)?;
    let state = u8::from_str_radix(fields.next()?, 16).ok()?;
    // tx_queue:rx_queue, tr:tm->when, retrnsmt, then uid, timeout, inode.
    let unsent = u32::from_str_radix(fields.next()?.split(':').next()?, 16).ok()?;
    let uid = u32::try_from(decimal(fields.nth(2)?)?).ok()?;
    let inode = decimal(fields.nth(1)?)?;
    let (received, idle, awaiting) = (None, None, false);
    Some(Socket { local, remote, state, uid, inode, received, idle, unsent, awaiting })
}

/// `0100007F:3A98` or 32 hex digits and a port. The kernel prints each 32-bit word of the
/// address as the host stores it, so the bytes come back with `to_ne_bytes`.
fn endpoint(field: &str) -> Option<Endpoint> {
    let (addr, port) = field.split_once(':')?;
    // from_str_radix takes a leading '+': insist on hex digits only.
    if !(addr.bytes().chain(port.bytes())).all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(addr.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    let ip = match addr.len() {
        8 => Ipv4Addr::from(word(0)?).to_ipv6_mapped(),
        32 => {
            let words = [word(0)?, word(1)?, word(2)?, word(3)?];
            Ipv6Addr::from(<[u8; 16]>::try_from(words.as_flattened()).ok()?)
        }
        _ => return None,
    };
    Some(Endpoint { ip, port })
}

/// A socket address as the tables show it.
pub(crate) fn to_endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint { ip: mapped(addr.ip()), port: addr.port() }
}

/// Whether a listener bound to `listening` takes connections to `local`: the same port, and the
/// same address or the wildcard of its family (an IPv6 wildcard takes IPv4 too).
fn serves(listening: &Endpoint, local: &Endpoint) -> bool {
    let v4_any = Ipv4Addr::UNSPECIFIED.to_ipv6_mapped();
    let (at, ip) = (&listening.ip, &local.ip);
    listening.port == local.port
        && (at == ip || at.is_unspecified() || (*at == v4_any && ip.to_ipv4_mapped().is_some()))
}

/// Where sockets go as they are read: a whole table, or a count that keeps tallies only.
pub trait Sink {
    fn add(&mut self, s: Socket);
}

impl Sink for Vec<Socket> {
    fn add(&mut self, s: Socket) {
        self.push(s);
    }
}

/// A connection its owner has closed with bytes still on their way to the peer (FIN_WAIT1,
/// CLOSING, LAST_ACK): the kernel keeps sending them, with no process left to hold the socket
/// (uid and inode 0). Envoy closes so after an answer it added `Connection: close` to. Counted
/// only as still delivering, never as a connection.
fn closing(s: &Socket) -> bool {
    matches!(s.state, FIN_WAIT1 | CLOSING | LAST_ACK) && s.unsent > 0
}

/// Keeps a socket in a state the rule looks at.
impl Sink for Table {
    fn add(&mut self, s: Socket) {
        if Table::keeps(&s) {
            self.sockets.push(s);
        }
    }
}

/// Both tables as read: the sockets the rule looks at.
#[derive(Debug, Default)]
pub struct Table {
    /// Listening and open sockets (ESTABLISHED, SYN_SENT, SYN_RECV, CLOSE_WAIT), and those
    /// closed with bytes still to deliver (`closing`).
    pub sockets: Vec<Socket>,
    /// Lines that are neither a socket nor a header: a table holding any is not understood.
    pub(crate) bad_lines: u64,
    pub(crate) first_bad: Option<String>,
}

impl Table {
    pub fn add_line(&mut self, line: &str) {
        match parse_line(line) {
            Some(s) => self.add(s),
            // The header, or a blank line.
            None if line.trim_start().is_empty() || line.trim_start().starts_with("sl ") => {}
            None => {
                self.bad_lines += 1;
                if self.first_bad.is_none() {
                    self.first_bad = Some(crate::error::shorten(line.trim_end()));
                }
            }
        }
    }

    fn keeps(s: &Socket) -> bool {
        matches!(s.state, LISTEN | ESTABLISHED | SYN_SENT | SYN_RECV | CLOSE_WAIT) || closing(s)
    }

    /// Drops sockets seen twice: no walk of the kernel's tables is atomic, and `/proc/net/tcp` was seen
    /// to repeat lines under churn (tests/readers.rs). A socket is told by its inode; one not yet
    /// accepted has none, and is told by its ends (compared only then: it is costly).
    pub(crate) fn dedup(&mut self) {
        let ends = |s: &Socket| (s.local, s.remote);
        self.sockets.sort_unstable_by(|a, b| {
            a.inode.cmp(&b.inode).then_with(|| match a.inode {
                0 => ends(a).cmp(&ends(b)),
                _ => std::cmp::Ordering::Equal,
            })
        });
        self.sockets.dedup_by(|a, b| a.inode == b.inode && (a.inode != 0 || ends(a) == ends(b)));
    }

    pub fn listening(&self) -> Vec<&Socket> {
        self.sockets.iter().filter(|s| s.state == LISTEN).collect()
    }

    /// The listening socket that takes connections to `addr` (Envoy's admin listener, say).
    pub(crate) fn listener(&self, addr: SocketAddr) -> Option<&Socket> {
        taking(&self.listening(), &to_endpoint(addr), |s| &s.local).copied()
    }
}

/// Of `listening` (bound where `at` says), the one that takes connections to `local`: one bound
/// to exactly that address first, else a wildcard of its family on its port.
pub(crate) fn taking<'a, T>(
    listening: &'a [T],
    local: &Endpoint,
    at: impl Fn(&T) -> &Endpoint,
) -> Option<&'a T> {
    let exact = listening.iter().find(|l| at(l) == local);
    exact.or_else(|| listening.iter().find(|l| serves(at(l), local)))
}

/// What the rule needs besides the table.
#[derive(Debug, Clone, Copy)]
pub struct TableFacts<'a> {
    pub filter: &'a Filter,
    /// How Envoy's sockets are told from everyone else's.
    pub envoy: &'a Basis,
    /// With `Basis::Process`, the sockets Envoy's process holds, sorted.
    pub inodes: &'a [u64],
    /// The kernel's `ip_local_port_range`: the ports connect() picks from.
    pub ephemeral: &'a RangeInclusive<u16>,
}

/// The listening sockets seen so far in a run: one that has closed since (a drain's end, nginx at
/// SIGTERM) still tells which connections it accepted.
#[derive(Debug, Clone, Default)]
pub struct Listeners(Vec<Listening>);

#[derive(Debug, Clone, Copy)]
struct Listening {
    local: Endpoint,
    /// Envoy's, another process's, or not known (Envoy unknown when it was seen).
    envoys: Option<bool>,
}

impl Listeners {
    pub fn learn(&mut self, table: &Table, rule: &TableFacts) {
        for s in table.sockets.iter().filter(|s| s.state == LISTEN) {
            let envoys = rule.holds(s);
            match self.0.iter_mut().find(|l| l.local == s.local) {
                Some(l) => l.envoys = envoys.or(l.envoys),
                None => self.0.push(Listening { local: s.local, envoys }),
            }
        }
    }
}

/// Why one socket counts or does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    /// Accepted on this local port; `kept` when TPROXY kept the application's port for it.
    Accepted {
        port: u16,
        kept: bool,
    },
    /// Envoy's connection to the port it goes to: its upstream pool, to the app or elsewhere.
    EnvoyOpened(u16),
    /// With Envoy unknown: a connection the pod opened, to the port it goes to.
    PodOpened(u16),
    /// Another process's socket (the app's, the agent's), by owner.
    Other(u32),
    Ignored(u16),
    NotListed(u16),
}

impl Verdict {
    fn label(self) -> String {
        match self {
            Verdict::Accepted { port, kept: false } => format!("port {port}"),
            Verdict::Accepted { port, kept: true } => format!("port {port} (TPROXY)"),
            Verdict::EnvoyOpened(port) => format!("Envoy's upstream connection to port {port}"),
            Verdict::PodOpened(port) => format!("a connection the pod opened, to port {port}"),
            Verdict::Other(uid) => format!("another process's socket (uid {uid})"),
            Verdict::Ignored(port) => format!("ignored port {port}"),
            Verdict::NotListed(port) => format!("port {port}, not in --ports"),
        }
    }
}

impl TableFacts<'_> {
    /// Whether `s` is Envoy's (`None`: unknown); a queued connection has its listener's owner.
    pub(crate) fn holds(&self, s: &Socket) -> Option<bool> {
        match self.envoy {
            Basis::Process { uid, .. } => {
                Some(self.inodes.binary_search(&s.inode).is_ok() || (s.inode == 0 && s.uid == *uid))
            }
            Basis::Owner { uid, .. } => Some(s.uid == *uid),
            Basis::Unknown { .. } => None,
        }
    }

    /// Why `s` counts or not; `envoys` says whether it is Envoy's (`None`: Envoy is unknown).
    fn verdict(&self, s: &Socket, listeners: &Listeners, envoys: Option<bool>) -> Verdict {
        let (local, remote) = (s.local.port, s.remote.port);
        for port in [local, remote] {
            if self.filter.ignore.contains(port) {
                return Verdict::Ignored(port);
            }
        }
        let on = taking(&listeners.0, &s.local, |l| &l.local);
        let kept = match (envoys, on) {
            // Envoy unknown: whatever a listener of the pod accepted, never what it opened.
            (None, Some(_)) => false,
            (None, None) => return Verdict::PodOpened(remote),
            (Some(false), _) => return Verdict::Other(s.uid),
            // REDIRECT hands Envoy both directions on its own ports, 15006 and 15001.
            (Some(true), Some(l)) if l.envoys != Some(false) => false,
            // On another process's listening port: connect() never picks a port someone listens
            // on, so TPROXY gave Envoy this connection with its original destination.
            (Some(true), Some(_)) => true,
            (Some(true), None) if self.transparent(s) => true,
            (Some(true), None) => return Verdict::EnvoyOpened(remote),
        };
        if self.filter.only.as_ref().is_some_and(|o| !o.contains(local)) {
            return Verdict::NotListed(local);
        }
        Verdict::Accepted { port: local, kept }
    }

    /// Envoy's socket on no listening port: one it opened, or one TPROXY gave it whose app has closed its
    /// listener. connect() takes local ports from the ephemeral range, so a port outside it was
    /// accepted, one inside facing one outside went out; both inside count only for a root proxy
    /// (which TPROXY needs), to be safe.
    fn transparent(&self, s: &Socket) -> bool {
        let ephemeral = |port: u16| self.ephemeral.contains(&port);
        match (ephemeral(s.local.port), ephemeral(s.remote.port)) {
            (false, _) => true,
            (true, false) => false,
            (true, true) => self.envoy.uid() == Some(0),
        }
    }
}

/// Where a tally finds the connections the proxy accepted that are busy (`Busy`): every listener
/// seen in the run (one closed since, at a drain or the app's SIGTERM, still tells them), the
/// ports that never count, and the proxy's user, whose sockets they are (the app's end of the
/// proxy's hop to it carries the same request: it is not counted twice).
#[derive(Clone, Copy)]
pub struct Accepted<'a> {
    pub listened: &'a [Endpoint],
    pub ignore: &'a crate::lists::PortSet,
    pub proxy: u32,
}

impl Accepted<'_> {
    /// Whether the proxy accepted `s` on a port that counts. A socket closed with bytes to
    /// deliver belongs to no process (`closing`): whoever closed it, they are the pod's.
    fn took(&self, s: &Socket) -> bool {
        (s.uid == self.proxy || closing(s))
            && taking(self.listened, &s.local, |l| l).is_some()
            && !self.ignore.contains(s.local.port)
            && !self.ignore.contains(s.remote.port)
    }
}

/// The most sockets a count holds back until Envoy's sockets are listed again.
const MAX_UNSURE: usize = 4096;

/// A count fed one socket at a time once the listening sockets are known, so a dump is never held:
/// connections tallied by why they count or not, every socket by owner.
#[derive(Default)]
pub struct SocketTally<'a> {
    listening: Vec<&'a Socket>,
    accepted: Option<Accepted<'a>>,
    busy: Busy,
    /// The rule and the listeners it reads; `None` when only owners are wanted.
    rule: Option<(TableFacts<'a>, &'a Listeners)>,
    /// Envoy's sockets were listed before these sockets were read, so one it accepted since is
    /// not on the list: such a socket, which would count as Envoy's, waits in `unsure`.
    listed_first: bool,
    verdicts: BTreeMap<Verdict, u64>,
    owners: BTreeMap<u32, u64>,
    unsure: Vec<Socket>,
}

impl<'a> SocketTally<'a> {
    /// A tally of the open sockets beside `listening`, the listening sockets read with them.
    pub fn new(
        listening: &'a Table,
        rule: Option<(TableFacts<'a>, &'a Listeners)>,
        listed_first: bool,
        accepted: Option<Accepted<'a>>,
    ) -> SocketTally<'a> {
        let listening = listening.listening();
        let mut owners = BTreeMap::new();
        for s in &listening {
            *owners.entry(s.uid).or_default() += 1;
        }
        SocketTally { listening, rule, listed_first, owners, accepted, ..SocketTally::default() }
    }

    /// The connections the pod accepted that are busy, so far.
    pub fn busy(&self) -> Busy {
        self.busy
    }

    /// The count, once every socket has been added. `relist` lists Envoy's sockets again when
    /// some may have been accepted since the first list; without one, they count as Envoy's.
    pub fn count(
        mut self,
        relist: impl FnOnce() -> Option<Vec<u64>>,
    ) -> (Count, BTreeMap<u32, u64>) {
        if let Some((rule, listeners)) = self.rule
            && !self.unsure.is_empty()
        {
            let inodes = relist();
            for s in std::mem::take(&mut self.unsure) {
                let envoys = inodes.as_ref().is_none_or(|i| i.binary_search(&s.inode).is_ok());
                *self.verdicts.entry(rule.verdict(&s, listeners, Some(envoys))).or_default() += 1;
            }
        }
        let (mut parts, mut excluded) = (Vec::new(), Vec::new());
        for (v, n) in self.verdicts {
            match v {
                Verdict::Accepted { .. } => parts.push(Part { name: v.label(), active: n }),
                _ => excluded.push(Excluded { why: v.label(), n }),
            }
        }
        let n = self.listening.len() as u64;
        excluded.extend((n > 0).then(|| Excluded { why: "listening".to_string(), n }));
        let count =
            Count { excluded, ..Count::new(SourceKind::Proc, Unit::Connections, parts, vec![]) };
        (count, self.owners)
    }
}

impl Sink for SocketTally<'_> {
    fn add(&mut self, mut s: Socket) {
        if s.state == LISTEN || !Table::keeps(&s) {
            return;
        }
        if closing(&s) {
            self.busy.delivering += u64::from(self.accepted.is_some_and(|a| a.took(&s)));
            return;
        }
        // A connection still in its listener's SYN queue has no owner in a netlink dump (uid
        // 0), where `/proc/net/tcp` shows its listener's owner: it gets that owner here.
        if s.state == SYN_RECV
            && s.inode == 0
            && let Some(l) = taking(&self.listening, &s.local, |l| &l.local)
        {
            s.uid = l.uid;
        } else if s.state != SYN_RECV {
            // A half-open connection belongs to its listener, whose owner has a socket of its own.
            *self.owners.entry(s.uid).or_default() += 1;
            if self.accepted.is_some_and(|a| a.took(&s)) {
                self.busy.delivering += u64::from(s.unsent > 0);
                self.busy.awaiting += u64::from(s.awaiting);
            }
        }
        let Some((rule, listeners)) = self.rule else { return };
        let mut envoys = rule.holds(&s);
        if self.listed_first
            && envoys == Some(false)
            && rule.envoy.uid() == Some(s.uid)
            && matches!(rule.verdict(&s, listeners, Some(true)), Verdict::Accepted { .. })
        {
            if self.unsure.len() < MAX_UNSURE {
                self.unsure.push(s);
                return;
            }
            envoys = Some(true);
        }
        *self.verdicts.entry(rule.verdict(&s, listeners, envoys)).or_default() += 1;
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Counts a whole table, remembering the listeners seen for the next count.
    pub(crate) fn count(table: &Table, rule: &TableFacts<'_>, listeners: &mut Listeners) -> Count {
        listeners.learn(table, rule);
        let mut tally = SocketTally::new(table, Some((*rule, listeners)), false, None);
        for s in &table.sockets {
            tally.add(*s);
        }
        tally.count(|| None).0
    }
}

#[cfg(test)]
mod tests {
    use super::testing::count;
    use super::*;
    use crate::lists::PortSet;

    const HEADER: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode";
    const HEADER6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode";

    /// An IPv4 line with an owner and an inode.
    fn line(local: &str, remote: &str, st: &str, uid: u32, inode: u64) -> String {
        format!(
            "   0: {local} {remote} {st} 00000000:00000000 00:00000000 00000000 {uid:>5}        0 {inode} 1 0000000000000000 20 4 30 10 -1"
        )
    }

    /// IPv4 as `a.b.c.d`, IPv6 in its usual form.
    fn show(e: &Endpoint) -> String {
        std::net::SocketAddr::new(e.ip.to_canonical(), e.port).to_string()
    }

    fn table(lines: &[String]) -> Table {
        let mut t = Table::default();
        for l in lines {
            t.add_line(l);
        }
        t
    }

    fn istio() -> Filter {
        Filter { ignore: PortSet::parse(crate::lists::ISTIO_INFRA_PORTS).unwrap(), only: None }
    }

    fn count_with(lines: &[String], filter: &Filter, (envoy, inodes): &(Basis, Vec<u64>)) -> Count {
        let rule = TableFacts { filter, envoy, inodes, ephemeral: &DEFAULT_EPHEMERAL };
        count(&table(lines), &rule, &mut Listeners::default())
    }

    const UNKNOWN: (Basis, Vec<u64>) =
        (Basis::Unknown { admin: String::new(), not_envoy: None }, Vec::new());

    /// Envoy told by its user.
    fn owner(uid: u32) -> (Basis, Vec<u64>) {
        (
            Basis::Owner {
                uid,
                admin: String::new(),
                why: crate::error::Failure::from(String::new()),
            },
            Vec::new(),
        )
    }

    fn parts(c: &Count) -> Vec<(&str, u64)> {
        c.parts.iter().map(|p| (p.name.as_str(), p.active)).collect()
    }

    fn excluded(c: &Count) -> Vec<(&str, u64)> {
        c.excluded.iter().map(|e| (e.why.as_str(), e.n)).collect()
    }

    /// Envoy told by its process, which holds `inodes`.
    fn envoy(uid: u32, inodes: &[u64]) -> (Basis, Vec<u64>) {
        let mut inodes = inodes.to_vec();
        inodes.sort_unstable();
        (Basis::Process { pid: 42, uid, admin: String::new() }, inodes)
    }

    #[test]
    fn ipv4_addresses_ports_owner_and_inode_decode() {
        let s = parse_line(&line("0100007F:3A98", "0200A8C0:C350", "01", 1337, 4242)).unwrap();
        assert_eq!(show(&s.local), "127.0.0.1:15000");
        assert_eq!(show(&s.remote), "192.168.0.2:50000");
        assert_eq!((s.state, s.uid, s.inode), (ESTABLISHED, 1337, 4242));
        assert_eq!(s.unsent, 0);
    }

    #[test]
    fn accepted_connections_with_bytes_not_delivered_are_busy_but_not_on_ignored_ports() {
        // Envoy's 15006 with an answer of 0x1000 bytes on its way, another with none; the admin
        // API's answer to a scraper (15000, ignored); Envoy's own call out (not accepted); the
        // app's answer to Envoy's hop (the app's user: the request Envoy's end carries).
        let unsent = |l: String| l.replacen("00000000:00000000", "00001000:00000000", 1);
        let lines = [
            line("0A5A0002:3A9E", "00000000:0000", "0A", 1337, 1),
            line("0100007F:3A98", "00000000:0000", "0A", 1337, 2),
            unsent(line("0A5A0002:3A9E", "0A5A0009:C350", "01", 1337, 3)),
            line("0A5A0002:3A9E", "0A5A0009:C351", "01", 1337, 4),
            unsent(line("0100007F:3A98", "0100007F:C352", "01", 1337, 5)),
            unsent(line("0A5A0002:C353", "0A5A0003:1F90", "01", 1337, 6)),
            line("0A5A0002:1F90", "00000000:0000", "0A", 1000, 7),
            unsent(line("0A5A0002:1F90", "0600007F:C354", "01", 1000, 8)),
        ];
        let t = table(&lines);
        let listened: Vec<Endpoint> = t.listening().iter().map(|s| s.local).collect();
        let ignore = crate::lists::PortSet::parse("15000").unwrap();
        let accepted = Accepted { listened: &listened, ignore: &ignore, proxy: 1337 };
        let mut tally = SocketTally::new(&t, None, false, Some(accepted));
        for s in &t.sockets {
            tally.add(*s);
        }
        assert_eq!(tally.busy(), Busy { delivering: 1, awaiting: 0 });
    }

    #[test]
    fn ipv6_and_mapped_addresses_decode() {
        let l = "   0: 00000000000000000000000001000000:3AAE 0000000000000000FFFF00000100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 20 4 30 10 -1";
        let s = parse_line(l).unwrap();
        assert_eq!(show(&s.local), "[::1]:15022");
        assert_eq!(show(&s.remote), "127.0.0.1:54321", "mapped addresses read as IPv4");
        let global = "   1: B80D0120000000000000000001000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4243 1";
        assert_eq!(show(&parse_line(global).unwrap().local), "[2001:db8::1]:80");
    }

    #[test]
    fn headers_and_garbage_do_not_parse() {
        assert_eq!(parse_line(HEADER), None);
        assert_eq!(parse_line(HEADER6), None);
        assert_eq!(parse_line(""), None);
        let ok = line("0100007F:0050", "0100007F:0050", "01", 0, 1);
        assert!(parse_line(&ok).is_some());
        for bad in [
            ok.replace("0100007F:0050 0100007F", "0100007F 0100007F"),
            ok.replace("0100007F:0050 0100", "0100007G:0050 0100"),
            ok.replacen(":0050", ":10050", 1),
            ok.replace(" 01 ", " XYZ "),
            ok.replacen("0100007F:0050", "0100:0050", 1),
            ok.replacen(":0050", ":+050", 1),
            ok.replace("     0        0 1 1", "    -1        0 1 1"),
            ok.replace("     0        0 1 1", " 4294967296        0 1 1"),
            ok.replace("     0        0 1 1", "     0        0 +1 1"),
            "   0: 0100007F:0050 0100007F:0050 01 00000000:00000000 00:00000000 00000000 0"
                .to_string(),
        ] {
            assert_eq!(parse_line(&bad), None, "{bad}");
        }
    }

    #[test]
    fn only_open_states_count() {
        // ESTABLISHED, SYN_SENT, SYN_RECV and CLOSE_WAIT; not the states on the way out.
        for st in ["01", "02", "03", "04", "05", "06", "07", "08", "09", "0B"] {
            let counted = ["01", "02", "03", "08"].contains(&st);
            let lines = [
                HEADER.to_string(),
                line("00000000:1F90", "00000000:0000", "0A", 0, 1),
                line("0200000A:1F90", "0300000A:C350", st, 0, 2),
            ];
            let c = count_with(&lines, &istio(), &UNKNOWN);
            assert_eq!(c.total, u64::from(counted), "state {st}");
        }
    }

    /// A REDIRECT pod as the kernel showed it (tests/pod.rs): Envoy (uid 1337, inodes 10-19) with
    /// its listeners, an inbound client on 15006, the app's outbound call on 15001, Envoy's pooled
    /// connections to the app (from 127.0.0.6) and to a service on 9080, the app's own sockets
    /// (uid 1000), the agent's xDS connection and our own admin request.
    fn redirect_pod() -> Vec<String> {
        vec![
            HEADER.to_string(),
            line("0100007F:3A98", "00000000:0000", "0A", 1337, 10), // admin 15000
            line("00000000:3A9E", "00000000:0000", "0A", 1337, 11), // 15006
            line("00000000:3A9E", "00000000:0000", "0A", 1337, 12), // 15006, second worker
            line("00000000:3A99", "00000000:0000", "0A", 1337, 13), // 15001
            line("00000000:3AAD", "00000000:0000", "0A", 1337, 14), // 15021
            line("00000000:1F90", "00000000:0000", "0A", 1000, 30), // the app on 8080
            line("02005A0A:3A9E", "03005A0A:85D4", "01", 1337, 15), // client -> 15006
            line("0100007F:3A99", "02005A0A:C228", "01", 1337, 16), // app's call -> 15001
            line("02005A0A:C228", "03005A0A:2378", "01", 1000, 31), // the app's side of it
            line("0600007F:C638", "02005A0A:1F90", "01", 1337, 17), // pool to the app
            line("02005A0A:1F90", "0600007F:C638", "01", 1000, 32), // the app's side of it
            line("02005A0A:C224", "03005A0A:2378", "01", 1337, 18), // pool to 9080
            line("02005A0A:C230", "0400005A:3AA4", "01", 1337, 40), // agent -> istiod 15012
            line("0100007F:C240", "0100007F:1F90", "01", 1337, 42), // agent's probe of the app
            line("0100007F:1F90", "0100007F:C240", "01", 1000, 33), // the app's side of it
            line("0100007F:D000", "0100007F:3A98", "01", 1337, 41), // us -> admin
            line("0100007F:3A98", "0100007F:D000", "01", 1337, 19), // admin side
            line("02005A0A:C220", "03005A0A:2378", "06", 0, 0),     // TIME_WAIT
        ]
    }

    #[test]
    fn a_socket_read_twice_counts_once_and_listeners_sharing_a_port_stay_apart() {
        let accepted = line("0100007F:1F90", "0200007F:C350", "01", 1337, 7);
        let queued = line("0100007F:1F90", "0200007F:C351", "01", 1337, 0);
        let mut t = table(&[
            HEADER.to_string(),
            line("00000000:1F90", "00000000:0000", "0A", 1337, 5),
            line("00000000:1F90", "00000000:0000", "0A", 1337, 6),
            accepted.clone(),
            queued.clone(),
            accepted,
            queued,
            line("0100007F:1F90", "0200007F:C352", "01", 1337, 0),
        ]);
        t.dedup();
        let inodes: Vec<u64> = t.sockets.iter().map(|s| s.inode).collect();
        assert_eq!(inodes, vec![0, 0, 5, 6, 7], "two queued connections, two listeners, one");
    }

    #[test]
    fn a_redirect_pod_counts_what_envoy_accepted_and_says_why_the_rest_does_not() {
        let c = count_with(
            &redirect_pod(),
            &istio(),
            &envoy(1337, &[10, 11, 12, 13, 14, 15, 16, 17, 18, 19]),
        );
        assert_eq!(parts(&c), vec![("port 15001", 1), ("port 15006", 1)]);
        assert_eq!(
            excluded(&c),
            vec![
                ("Envoy's upstream connection to port 8080", 1),
                ("Envoy's upstream connection to port 9080", 1),
                ("another process's socket (uid 1000)", 3),
                ("another process's socket (uid 1337)", 1),
                ("ignored port 15000", 2),
                ("ignored port 15012", 1),
                ("listening", 6),
            ],
            "the agent's probe is its own (uid 1337 but not Envoy's inode); ours is on the \
             ignored admin port"
        );
        assert_eq!(c.total, 2);
    }

    #[test]
    fn a_connection_accepted_after_envoys_sockets_were_listed_counts_once_they_are_listed_again() {
        // A dump read after Envoy's sockets were listed: the client's connection on 15006
        // (inode 15) was accepted in between.
        let t = table(&redirect_pod());
        let filter = istio();
        let listed = [10, 11, 12, 13, 14, 16, 17, 18, 19];
        let (envoy, inodes) = envoy(1337, &listed);
        let rule = TableFacts {
            filter: &filter,
            envoy: &envoy,
            inodes: &inodes,
            ephemeral: &DEFAULT_EPHEMERAL,
        };
        let mut listeners = Listeners::default();
        listeners.learn(&t, &rule);
        let count = |relist: Option<&[u64]>| {
            let mut tally = SocketTally::new(&t, Some((rule, &listeners)), true, None);
            for s in &t.sockets {
                tally.add(*s);
            }
            tally.count(|| relist.map(<[u64]>::to_vec)).0
        };
        let now = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19];
        let c = count(Some(&now));
        assert_eq!(parts(&c), vec![("port 15001", 1), ("port 15006", 1)]);
        assert!(
            excluded(&c).contains(&("another process's socket (uid 1337)", 1)),
            "the agent's probe, listed again, is still not Envoy's: {c:?}"
        );
        assert_eq!(count(None).total, 2, "not listed again: it counts as Envoy's");
        assert_eq!(
            count(Some(&listed)).total,
            1,
            "listed again and still not Envoy's: another process's"
        );
    }

    #[test]
    fn by_owner_alone_the_same_pod_counts_the_same() {
        let c = count_with(&redirect_pod(), &istio(), &owner(1337));
        assert_eq!(parts(&c), vec![("port 15001", 1), ("port 15006", 1)]);
        assert_eq!(
            excluded(&c)[0],
            ("Envoy's upstream connection to port 8080", 2),
            "the agent's probe looks like Envoy's own connection: not counted either way"
        );
    }

    #[test]
    fn with_envoy_unknown_what_any_listener_accepted_counts_and_nothing_the_pod_opened() {
        let c = count_with(&redirect_pod(), &istio(), &UNKNOWN);
        assert_eq!(
            parts(&c),
            vec![("port 8080", 2), ("port 15001", 1), ("port 15006", 1)],
            "the app's sides of Envoy's pool and of the probe are what the app's listener accepted"
        );
        assert_eq!(
            &excluded(&c)[..3],
            &[
                ("a connection the pod opened, to port 8080", 2),
                ("a connection the pod opened, to port 9080", 2),
                ("ignored port 15000", 2),
            ]
        );
    }

    /// A TPROXY pod: Envoy runs as root (uid 0, inodes 10-19) and its inbound sockets keep the
    /// app's address; the app is uid 0 too, as many images run.
    fn tproxy_pod(app_listening: bool) -> Vec<String> {
        let mut lines = vec![
            HEADER.to_string(),
            line("0100007F:3A98", "00000000:0000", "0A", 0, 10),
            line("00000000:3A9E", "00000000:0000", "0A", 0, 11),
            line("00000000:3A99", "00000000:0000", "0A", 0, 13),
            line("02005A0A:1F90", "03005A0A:A942", "01", 0, 15), // client -> app's port, Envoy's
            line("0600007F:C838", "02005A0A:1F90", "01", 0, 17), // pool to the app
            line("02005A0A:1F90", "0600007F:C838", "01", 0, 32), // the app's side of it
            line("02005A0A:E48C", "03005A0A:2378", "01", 0, 18), // pool to 9080
        ];
        if app_listening {
            lines.push(line("00000000:1F90", "00000000:0000", "0A", 0, 30));
        }
        lines
    }

    #[test]
    fn under_tproxy_envoys_inbound_sockets_on_the_apps_port_count_even_after_the_app_stops_listening()
     {
        let e = envoy(0, &[10, 11, 13, 15, 17, 18]);
        for listening in [true, false] {
            let c = count_with(&tproxy_pod(listening), &istio(), &e);
            assert_eq!(parts(&c), vec![("port 8080 (TPROXY)", 1)], "{listening}");
            assert_eq!(
                &excluded(&c)[..3],
                &[
                    ("Envoy's upstream connection to port 8080", 1),
                    ("Envoy's upstream connection to port 9080", 1),
                    ("another process's socket (uid 0)", 1),
                ],
                "{listening}"
            );
        }
    }

    #[test]
    fn under_tproxy_a_connection_with_both_ports_ephemeral_counts_only_for_a_root_proxy() {
        // Envoy's pooled connection to a service on 50051, from port 58500.
        let lines = [line("02005A0A:E4A4", "03005A0A:C383", "01", 0, 18)];
        let root = count_with(&lines, &istio(), &envoy(0, &[18]));
        assert_eq!(root.total, 1, "could be TPROXY: counted, to be safe");
        let lines = [line("02005A0A:E4A4", "03005A0A:C383", "01", 1337, 18)];
        let proxy_user = count_with(&lines, &istio(), &envoy(1337, &[18]));
        assert_eq!(proxy_user.total, 0, "REDIRECT: Envoy's own connection");
    }

    #[test]
    fn a_listener_seen_once_still_explains_its_connections_after_it_closed() {
        let e = envoy(1337, &[11, 15]);
        let rule = TableFacts {
            filter: &istio(),
            envoy: &e.0,
            inodes: &e.1,
            ephemeral: &DEFAULT_EPHEMERAL,
        };
        let mut seen = Listeners::default();
        let with_listener = table(&[
            line("00000000:3A9E", "00000000:0000", "0A", 1337, 11),
            line("02005A0A:3A9E", "03005A0A:85D4", "01", 1337, 15),
        ]);
        assert_eq!(count(&with_listener, &rule, &mut seen).total, 1);
        // Envoy stopped its listeners at the end of the drain; the connection stays.
        let without = table(&[line("02005A0A:3A9E", "03005A0A:85D4", "01", 1337, 15)]);
        let c = count(&without, &rule, &mut seen);
        assert_eq!(parts(&c), vec![("port 15006", 1)]);
    }

    #[test]
    fn connections_still_in_a_listeners_queues_count_by_their_owner() {
        let e = envoy(1337, &[11]);
        let lines = [
            line("00000000:3A9E", "00000000:0000", "0A", 1337, 11),
            line("02005A0A:3A9E", "03005A0A:85D4", "03", 1337, 0), // SYN_RECV
            line("02005A0A:3A9E", "03005A0A:85D5", "01", 1337, 0), // not yet accepted
        ];
        assert_eq!(count_with(&lines, &istio(), &e).total, 2);
    }

    #[test]
    fn a_v4_client_of_a_dual_stack_listener_counts_once() {
        let lines = [
            HEADER.to_string(),
            line("0100007F:C350", "0100007F:1F90", "01", 0, 2),
            HEADER6.to_string(),
            "   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1".to_string(),
            "   1: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 3 1".to_string(),
        ];
        let c = count_with(&lines, &istio(), &UNKNOWN);
        assert_eq!(parts(&c), vec![("port 8080", 1)]);
    }

    #[test]
    fn an_ipv4_wildcard_listener_does_not_take_ipv6_connections() {
        let v6_client = "   1: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:C350 01 00000000:00000000 00:00000000 00000000     0        0 3 1";
        let lines = [line("00000000:1F90", "00000000:0000", "0A", 0, 1), v6_client.to_string()];
        let c = count_with(&lines, &istio(), &UNKNOWN);
        assert_eq!(c.total, 0, "{:?}", c.excluded);
    }

    #[test]
    fn ignored_ports_at_either_end_do_not_count_and_ports_narrows_to_local_ones() {
        let e = envoy(1337, &[1, 2, 3, 4]);
        let lines = [
            line("00000000:3A9E", "00000000:0000", "0A", 1337, 1),
            line("00000000:3A99", "00000000:0000", "0A", 1337, 2),
            line("0200000A:3A9E", "0400000A:D001", "01", 1337, 3),
            line("0200000A:3A99", "0400000A:3A98", "01", 1337, 4),
        ];
        let c = count_with(&lines, &istio(), &e);
        assert_eq!(parts(&c), vec![("port 15006", 1)]);
        assert!(excluded(&c).contains(&("ignored port 15000", 1)));
        let only =
            Filter { ignore: PortSet::default(), only: Some(PortSet::parse("15001").unwrap()) };
        let c = count_with(&lines, &only, &e);
        assert_eq!(parts(&c), vec![("port 15001", 1)]);
        assert!(excluded(&c).contains(&("port 15006, not in --ports", 1)));
    }

    #[test]
    fn the_admin_listener_is_found_by_its_exact_address_or_the_wildcard_of_its_port() {
        let t = table(&[
            line("00000000:3A98", "00000000:0000", "0A", 7, 1),
            line("0100007F:3A98", "00000000:0000", "0A", 1337, 2),
        ]);
        let admin: SocketAddr = "127.0.0.1:15000".parse().unwrap();
        assert_eq!(t.listener(admin).map(|s| s.inode), Some(2));
        let other: SocketAddr = "10.0.0.5:15000".parse().unwrap();
        assert_eq!(t.listener(other).map(|s| s.inode), Some(1));
        let v6: SocketAddr = "[::1]:15000".parse().unwrap();
        assert_eq!(t.listener(v6), None, "an IPv4 wildcard does not take [::1]");
    }

    #[test]
    fn lines_that_are_not_sockets_are_counted_and_the_first_kept() {
        let t = table(&[
            HEADER.to_string(),
            "garbage".to_string(),
            "   9: zz".to_string(),
            line("0200000A:3A9E", "0400000A:D001", "01", 0, 1),
        ]);
        assert_eq!((t.bad_lines, t.first_bad.as_deref()), (2, Some("garbage")));
        assert_eq!(t.sockets.len(), 1);
    }

    #[test]
    fn sockets_of_other_users_are_the_apps_and_a_process_that_exited_leaves_none() {
        let live = table(&[
            line("00000000:1F90", "00000000:0000", "0A", 1000, 1),
            line("0200000A:1F90", "0600007F:A000", "01", 1000, 2),
            line("0100007F:3A98", "00000000:0000", "0A", 1337, 3),
            line("0200000A:3A9E", "0300000A:C000", "01", 1337, 4),
        ]);
        let owners = |t: &Table| {
            let mut tally = SocketTally::new(t, None, false, None);
            for s in &t.sockets {
                tally.add(*s);
            }
            let mut owners = tally.count(|| None).1;
            owners.remove(&1337);
            owners
        };
        assert_eq!(owners(&live), BTreeMap::from([(1000, 2)]), "a listener and a connection");
        // After the app's exit: its connection in FIN_WAIT2 and TIME_WAIT (uid 0) are not read.
        let gone = table(&[
            line("0200000A:1F90", "0600007F:A000", "05", 1000, 0),
            line("0200000A:1F90", "0600007F:A001", "06", 0, 0),
            line("0100007F:3A98", "00000000:0000", "0A", 1337, 3),
        ]);
        assert!(owners(&gone).is_empty());
    }
}
