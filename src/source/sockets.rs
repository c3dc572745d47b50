//! The socket-table source: the kernel's TCP sockets over netlink (diag), else the text tables;
//! which are Envoy's (the holder of its admin listener, through `/proc/<pid>/fd`); procnet's rule.

use crate::config::{Address, Filter, SourceConfig};
use crate::count::{Basis, Busy, Count, Part, SourceKind, Unit, Warning};
use crate::error::{Failure, failed, io_cause};
use crate::source::arrivals::{self, Tracker};
use crate::source::diag::{self, DumpError};
use crate::source::lines::each_line;
use crate::source::procnet::{
    self, Accepted, DEFAULT_EPHEMERAL, Endpoint, LISTEN, Listeners, Sink, SocketTally, Table,
    TableFacts, loopback,
};
use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Read;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::ops::RangeInclusive;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reader {
    Netlink,
    /// The text tables in this directory, and why netlink is not used where it was meant to be.
    Text {
        dir: PathBuf,
        why: Option<Failure>,
    },
}

/// The text tables netlink falls back to.
const PROC_NET: &str = "/proc/net";

pub(crate) struct SocketTable {
    /// Where the sockets are read from (netlink gives way to the text tables once unavailable).
    pub(crate) reader: Reader,
    filter: Filter,
    admin: Address,
    /// Where processes are listed, when the table is this machine's live one.
    proc_root: Result<PathBuf, Failure>,
    listeners: Listeners,
    envoy_pid: Option<u32>,
    searched: bool,
    /// Why what holds the admin address is not taken as Envoy (`Client::not_envoy`): the admin API
    /// answered as something else or refused to be opened.
    pub(crate) not_envoy: Option<String>,
    /// What the last count's table said about the pod, until `pod` takes it.
    pod: Option<Pod>,
    /// When the table was made: `hold`'s reads of arrivals are timed from it.
    made: Instant,
    /// Every listener seen in the run (`Accepted`).
    listened: Vec<Endpoint>,
}

/// What the socket table says besides the count: the sockets of other users than the proxy's, by
/// user (while the app runs, its own; an exited process holds none), and the connections the pod
/// accepted that a request still keeps busy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Pod {
    pub(crate) owners: BTreeMap<u32, u64>,
    pub(crate) busy: Busy,
}

impl SocketTable {
    /// Netlink, unless `--proc-net` names the text tables to read.
    pub(crate) fn new(c: &SourceConfig) -> SocketTable {
        let reader = match &c.proc_net {
            None => Reader::Netlink,
            Some(dir) => Reader::Text { dir: dir.to_path_buf(), why: None },
        };
        SocketTable {
            proc_root: match &c.proc_net {
                Some(dir) if !dir.starts_with("/proc") => {
                    Err(Failure::from(format!("{} is not a live table", dir.display())))
                }
                _ => Ok(PathBuf::from("/proc")),
            },
            reader,
            filter: c.filter.clone(),
            admin: c.admin.clone(),
            listeners: Listeners::default(),
            envoy_pid: None,
            searched: false,
            not_envoy: None,
            pod: None,
            made: Instant::now(),
            listened: Vec::new(),
        }
    }

    /// `hold`: the connections that count open now, by port, and what has arrived (`tracker`),
    /// before `until`; unknown from the text tables, which tell no bytes.
    pub(crate) fn arrivals(
        &mut self,
        tracker: &mut Tracker,
        until: Instant,
    ) -> Result<Count, Failure> {
        let mut warnings = Vec::new();
        // Read before the sockets (Tracker::read): a connection accepted in between is seen
        // before it is counted, never counted before it is seen.
        let snmp = self.proc_root.as_ref().ok().map(|root| root.join("net/snmp"));
        let read = snmp.filter(|_| tracker.rule.passive_opens).map(|f| (fs::read_to_string(&f), f));
        let opens = match read {
            Some((Ok(text), _)) => arrivals::passive_opens(&text),
            Some((Err(e), snmp)) => {
                warnings.push(Warning::Snmp(failed("read", snmp.display(), io_cause(&e))));
                None
            }
            None => None,
        };
        let (listening, open) = self.read_listening(until)?;
        if let (Ok(root), None) = (&self.proc_root, tracker.age) {
            let mut inodes: Vec<u64> = listening.sockets.iter().map(|s| s.inode).collect();
            inodes.sort_unstable();
            tracker.age = Some(pod_age(root, &inodes, until));
        }
        let mut sockets = listening.sockets;
        read_open(open, until, &diag::request(diag::ALL, true), &mut sockets)?;
        self.reader_warning(&mut warnings);
        let ephemeral = *self.ephemeral().start();
        let (Reader::Netlink, Ok(root)) = (&self.reader, &self.proc_root) else {
            warnings.push(Warning::NoBytes);
            return Ok(Count::new(SourceKind::Proc, Unit::Connections, Vec::new(), warnings));
        };
        let read = tracker.read(self.made.elapsed(), &addresses(), &sockets, opens);
        let udp = udp_servers(root, &tracker.rule.ports, ephemeral);
        let hiding = tracker.rule.passive_opens && !read.hiding.is_empty();
        warnings.extend((!udp.is_empty()).then_some(Warning::Udp(udp)));
        warnings.extend(hiding.then_some(Warning::Hiding(read.hiding)));
        warnings.extend((read.unseen > 0).then_some(Warning::Unseen));
        let parts =
            read.open.iter().map(|(port, n)| Part { name: format!("port {port}"), active: *n });
        let count = Count::new(SourceKind::Proc, Unit::Connections, parts.collect(), warnings);
        Ok(Count {
            arrivals: Some(tracker.total),
            opened: Some(tracker.opened),
            polls: tracker.polls,
            before: read.before,
            newest: read.newest,
            ..count
        })
    }

    /// The kernel's count, made before `until`: the listening sockets, Envoy's process, then the open
    /// sockets counted as they come. Netlink that is unavailable gives way to the text tables.
    pub(crate) fn count(&mut self, until: Instant) -> Result<Count, Failure> {
        let (mut count, pod) = self.read(until, true)?;
        self.pod = Some(pod);
        self.reader_warning(&mut count.warnings);
        Ok(count)
    }

    /// One read before `until`: what Envoy accepted, counted as the sockets come (with
    /// `counting`, its listeners learnt, and a count that found Envoy's process listing it
    /// again), and what the pod holds besides.
    fn read(&mut self, until: Instant, counting: bool) -> Result<(Count, Pod), Failure> {
        let (listening, open) = self.read_listening(until)?;
        // Looked up once: on a Unix socket it reads /proc/net/unix.
        let admin = self.admin_socket(&listening);
        let (basis, inodes) = self.envoy(admin, until);
        let ephemeral = self.ephemeral();
        let rule = TableFacts {
            filter: &self.filter,
            envoy: &basis,
            inodes: &inodes,
            ephemeral: &ephemeral,
        };
        if counting {
            self.listeners.learn(&listening, &rule);
        }
        // Every listener of the proxy seen in the run, `listening`'s added (`Accepted`); not the app's, whose end of
        // the proxy's hop carries a request the proxy's end already does. The text tables were
        // read whole before Envoy's sockets were listed; a dump comes after.
        for s in listening.listening() {
            if rule.holds(s) != Some(false) && !self.listened.contains(&s.local) {
                self.listened.push(s.local);
            }
        }
        // The proxy's user: its admin socket's owner (the uid `basis` names, where it names one:
        // `envoy` takes it from that socket), else this hook's (which runs in its container).
        // SAFETY: geteuid has no preconditions and cannot fail.
        let proxy = admin.map_or_else(|| unsafe { libc::geteuid() }, |(uid, _)| uid);
        let accepted = Accepted { listened: &self.listened, ignore: &self.filter.ignore, proxy };
        let whole = counting && open.is_none();
        let rule = counting.then_some((rule, &self.listeners));
        let mut tally = SocketTally::new(&listening, rule, whole, Some(accepted));
        read_open(open, until, &diag::request(diag::OPEN, true), &mut tally)?;
        let busy = tally.busy();
        let relist = || match (&self.proc_root, &basis) {
            (Ok(root), Basis::Process { pid, .. }) if counting => sockets_of(root, *pid).ok(),
            _ => None,
        };
        let (count, mut owners) = tally.count(relist);
        // The app's sockets: those of other users than the proxy's; and the accepted connections
        // still `busy`.
        owners.remove(&proxy);
        Ok((Count { basis: Some(basis), ..count }, Pod { owners, busy }))
    }

    /// Where netlink was meant to be read and the text tables are, the warning that says why.
    fn reader_warning(&self, warnings: &mut Vec<Warning>) {
        if let Reader::Text { why: Some(why), .. } = &self.reader {
            warnings.push(Warning::TextTables(why.clone()));
        }
    }

    /// Envoy's process, as the last count found it, else searched for once in a run; `None` where it
    /// cannot be read (`hold`, in the app's container).
    pub(crate) fn envoy_pid(&mut self, until: Instant) -> Option<u32> {
        if self.envoy_pid.is_none() && !std::mem::replace(&mut self.searched, true) {
            let (listening, _) = self.read_listening(until).ok()?;
            let admin = self.admin_socket(&listening);
            self.envoy(admin, until);
        }
        self.envoy_pid
    }

    /// What the pod holds besides the count, before `until`: the last count's sockets, else read now.
    pub(crate) fn pod(&mut self, until: Instant) -> Result<Pod, Failure> {
        match self.pod.take() {
            Some(pod) => Ok(pod),
            None => self.read(until, false).map(|(_, pod)| pod),
        }
    }

    /// The listening sockets, before `until`; from the text tables, the open ones too.
    fn read_listening(&mut self, until: Instant) -> Result<(Table, Option<Table>), Failure> {
        if self.reader == Reader::Netlink {
            let mut listening = Table::default();
            match diag::dump(&diag::request(diag::LISTENING, false), until, &mut listening) {
                Ok(()) => {
                    listening.dedup();
                    return Ok((listening, None));
                }
                Err(DumpError::Failed(f)) => return Err(f),
                Err(DumpError::Unavailable(f)) => {
                    self.reader = Reader::Text { dir: PathBuf::from(PROC_NET), why: Some(f) };
                }
            }
        }
        let dir = match &self.reader {
            Reader::Text { dir, .. } => dir,
            Reader::Netlink => Path::new(PROC_NET),
        };
        let mut table = read_tables(dir, until)?;
        // `/proc/net/tcp` was seen to repeat lines many times over in one read under churn.
        table.dedup();
        let (listening, open) = table.sockets.into_iter().partition(|s| s.state == LISTEN);
        let table = |sockets| Table { sockets, ..Table::default() };
        Ok((table(listening), Some(table(open))))
    }

    /// Who Envoy is, how that was found, and with a process the sockets it holds.
    fn envoy(
        &mut self,
        admin_socket: Option<(u32, Option<u64>)>,
        until: Instant,
    ) -> (Basis, Vec<u64>) {
        let admin = self.admin.to_string();
        let Some((uid, inode)) = admin_socket else {
            return (Basis::Unknown { admin, not_envoy: self.not_envoy.clone() }, Vec::new());
        };
        let found = match (&self.proc_root, inode) {
            (Ok(root), Some(inode)) => find_holder(root, inode, uid, self.envoy_pid, until),
            (Ok(root), None) => {
                Err(format!("{} does not show the socket's inode", root.join("net/unix").display())
                    .into())
            }
            (Err(why), _) => Err(why.clone()),
        };
        match found {
            Ok((pid, inodes)) => {
                self.envoy_pid = Some(pid);
                (Basis::Process { pid, uid, admin }, inodes)
            }
            Err(why) => (Basis::Owner { uid, admin, why }, Vec::new()),
        }
    }

    /// The admin API's listening socket: its owner, and its inode when it can be read (a Unix socket's
    /// from `/proc/net/unix`). `None` when nothing listens there, or what does is not Envoy.
    fn admin_socket(&self, listening: &Table) -> Option<(u32, Option<u64>)> {
        if self.not_envoy.is_some() {
            return None;
        }
        match &self.admin {
            Address::Tcp(addr) => listening.listener(*addr).map(|s| (s.uid, Some(s.inode))),
            Address::Unix(path) => {
                let uid = fs::metadata(path).ok()?.uid();
                let root = self.proc_root.as_ref().ok();
                match root.map(|root| unix_listener(&root.join("net/unix"), path)) {
                    Some(Ok(None)) => None,
                    found => Some((uid, found.and_then(Result::ok).flatten())),
                }
            }
        }
    }

    /// The range connect() picks local ports from here; fixture tables get the kernel's default.
    fn ephemeral(&self) -> RangeInclusive<u16> {
        let read = |root: &PathBuf| {
            let text = fs::read_to_string(root.join("sys/net/ipv4/ip_local_port_range")).ok()?;
            let mut ports = text.split_ascii_whitespace().map(str::parse::<u16>);
            Some(ports.next()?.ok()?..=ports.next()?.ok()?)
        };
        self.proc_root.as_ref().ok().and_then(read).unwrap_or(DEFAULT_EPHEMERAL)
    }
}

/// The open sockets into `sink`: the text tables' as read with the listening ones, else a dump
/// of `request` (`diag::request`).
fn read_open(
    open: Option<Table>,
    until: Instant,
    request: &[u8],
    sink: &mut impl Sink,
) -> Result<(), Failure> {
    let Some(table) = open else {
        return diag::dump(request, until, sink)
            .map_err(|(DumpError::Failed(f) | DumpError::Unavailable(f))| f);
    };
    table.sockets.into_iter().for_each(|s| sink.add(s));
    Ok(())
}

/// This network namespace's addresses (getifaddrs), IPv4 ones as IPv4-mapped.
fn addresses() -> Vec<Ipv6Addr> {
    let mut found = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, which freeifaddrs releases; each entry's address is read
    // only when set, as the family it says.
    unsafe {
        if libc::getifaddrs(&mut list) != 0 {
            return found;
        }
        let mut at = list;
        while let Some(entry) = at.as_ref() {
            if let Some(addr) = entry.ifa_addr.as_ref() {
                match i32::from(addr.sa_family) {
                    libc::AF_INET => {
                        let v4 = &*(entry.ifa_addr as *const libc::sockaddr_in);
                        let ip = Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
                        found.push(ip.to_ipv6_mapped());
                    }
                    libc::AF_INET6 => {
                        let v6 = &*(entry.ifa_addr as *const libc::sockaddr_in6);
                        found.push(Ipv6Addr::from(v6.sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            at = entry.ifa_next;
        }
        libc::freeifaddrs(list);
    }
    found
}

/// The most one table may hold: about 900,000 sockets of 150 bytes. A larger one is unknown.
const MAX_TABLE: usize = 128 << 20;

/// The kernel's lines are under 200 bytes; a longer one is not a socket table's.
const MAX_LINE: usize = 512;

/// Both text tables in `dir`. A table may be missing (a kernel without IPv6 has no tcp6), not
/// both; one that exists must be read whole and understood, or the count is unknown.
fn read_tables(dir: &Path, until: Instant) -> Result<Table, Failure> {
    let mut table = Table::default();
    let mut read_any = false;
    for name in ["tcp", "tcp6"] {
        read_any |= read_table(&dir.join(name), &mut table, until)?;
    }
    if !read_any {
        return Err(failed("read", format!("{}/tcp and tcp6", dir.display()), "neither exists"));
    }
    Ok(table)
}

/// Reads a table line by line, bounded in bytes, line length and time. `false` when it does not
/// exist; an error when it cannot be read whole before `until` or holds a line not a socket's.
fn read_table(path: &Path, table: &mut Table, until: Instant) -> Result<bool, Failure> {
    let fail = |why: String| failed("read", path.display(), why);
    // O_NONBLOCK: a FIFO in a table's place must not hang the open.
    let file = match OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(fail(io_cause(&e))),
    };
    let kind = file.metadata().map_err(|e| fail(io_cause(&e)))?.file_type();
    // The kernel's tables are regular files; a FIFO, a device or a directory is not one.
    if !kind.is_file() {
        return Err(fail("not a regular file".to_string()));
    }
    let bad_before = table.bad_lines;
    let mut total = 0;
    let each = |line: &str, cut: bool| {
        total += line.len() + 1;
        if Instant::now() >= until {
            return Err(fail("no time left before the deadline".to_string()));
        } else if total > MAX_TABLE {
            return Err(fail(format!("it is larger than {MAX_TABLE} bytes")));
        } else if cut {
            return Err(fail(format!("a line is longer than {MAX_LINE} bytes")));
        }
        table.add_line(line);
        Ok(())
    };
    each_line(file.take(MAX_TABLE as u64 + 1), MAX_LINE, each, |e| fail(io_cause(&e)))?;
    if table.bad_lines > bad_before {
        return Err(fail(format!(
            "{} lines are not socket lines, the first '{}'",
            table.bad_lines - bad_before,
            table.first_bad.as_deref().unwrap_or_default()
        )));
    }
    Ok(true)
}

/// The UDP ports served in the pod: sockets bound and unconnected (state 07 and no peer in
/// `/proc/net/udp` and `udp6`, `udp4_format_sock`) on a port below the ephemeral range, from
/// which a client's own sockets take theirs. The kernel counts no datagrams per socket (`Udp:
/// InDatagrams` is the namespace's, replies to the pod's own queries among them), so `hold`
/// cannot see what they receive, and says so.
fn udp_servers(root: &Path, ports: &Filter, ephemeral: u16) -> Vec<u16> {
    let mut found = Vec::new();
    for table in ["net/udp", "net/udp6"] {
        let mut text = String::new();
        let file = fs::File::open(root.join(table));
        if file.and_then(|f| f.take(MAX_UNIX_TABLE).read_to_string(&mut text)).is_err() {
            continue;
        }
        for s in text.lines().filter_map(procnet::parse_line) {
            let port = s.local.port;
            // Bound to loopback, it serves the pod alone (ztunnel's DNS on 127.0.0.1:15053).
            let outside = !loopback(&s.local.ip);
            let serves =
                s.state == UDP_UNCONNECTED && s.remote.port == 0 && port < ephemeral && outside;
            if serves && ports.counts(port) && !found.contains(&port) {
                found.push(port);
            }
        }
    }
    found.sort_unstable();
    found
}

/// A UDP socket's state with no peer: TCP_CLOSE, as `/proc/net/udp` prints it.
const UDP_UNCONNECTED: u8 = 0x07;

/// `/proc/net/unix` is a few hundred lines in a pod; more than this is not the kernel's.
const MAX_UNIX_TABLE: u64 = 16 << 20;

/// The inode of the listening Unix socket bound to `path` (flags with `__SO_ACCEPTCON`), from
/// `table`, `/proc/net/unix` (`unix_seq_show`), also when `path` names it another way.
fn unix_listener(table: &Path, path: &Path) -> std::io::Result<Option<u64>> {
    const ACCEPTCON: u32 = 0x10000;
    let mut text = String::new();
    fs::File::open(table)?.take(MAX_UNIX_TABLE).read_to_string(&mut text)?;
    let wanted = path.as_os_str().to_string_lossy();
    let file = |p: &Path| fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let target = file(path);
    for line in text.lines().skip(1) {
        let Some((flags, inode, name)) = unix_line(line) else { continue };
        let same = name == wanted || (target.is_some() && file(Path::new(name)) == target);
        if flags & ACCEPTCON != 0 && same {
            return Ok(Some(inode));
        }
    }
    Ok(None)
}

/// A line of `/proc/net/unix` as its flags, inode and path. The kernel prints the path as bound,
/// after one space and spaces included, so it is the rest of the line, not a field.
fn unix_line(line: &str) -> Option<(u32, u64, &str)> {
    let mut fields = [""; 7];
    let mut rest = line;
    for field in &mut fields {
        rest = rest.trim_start_matches(' ');
        let end = rest.find(' ').unwrap_or(rest.len());
        (*field, rest) = rest.split_at(end);
    }
    let path = rest.strip_prefix(' ').filter(|p| !p.is_empty())?;
    let flags = u32::from_str_radix(fields[3], 16).ok()?;
    Some((flags, fields[6].parse().ok()?, path))
}

/// The socket inodes a process holds, sorted.
fn sockets_of(proc_root: &Path, pid: u32) -> std::io::Result<Vec<u64>> {
    let fds = fs::read_dir(proc_root.join(pid.to_string()).join("fd"))?;
    // A descriptor closed between the listing and the readlink is simply gone.
    let target = |entry: std::io::Result<fs::DirEntry>| fs::read_link(entry.ok()?.path()).ok();
    let inode = |t: PathBuf| t.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok();
    let mut inodes: Vec<u64> = fds.filter_map(|e| target(e).and_then(inode)).collect();
    inodes.sort_unstable();
    Ok(inodes)
}

/// The pod's age: how long the oldest process this user can see holding one of its listening
/// sockets (`inodes`, sorted) has run. In a pod's container that is its app, started with the pod,
/// whose namespace's counters count since; `None` where no such process shows before `until`.
fn pod_age(proc_root: &Path, inodes: &[u64], until: Instant) -> Option<Duration> {
    // "12345.67 ...": seconds and hundredths (no float parsing: it would cost the binary 16 KiB).
    let uptime = fs::read_to_string(proc_root.join("uptime")).ok()?;
    let (whole, hundredths) = uptime.split_ascii_whitespace().next()?.split_once('.')?;
    let uptime = whole.parse::<u64>().ok()? as f64 + hundredths.parse::<u64>().ok()? as f64 / 100.0;
    // SAFETY: sysconf reads a constant of the system, with no memory given to it.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks <= 0 {
        return None;
    }
    let mut oldest: Option<u64> = None;
    for entry in fs::read_dir(proc_root).ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let holds = sockets_of(proc_root, pid)
            .is_ok_and(|held| held.iter().any(|i| *i != 0 && inodes.binary_search(i).is_ok()));
        if Instant::now() >= until {
            return None;
        }
        if !holds {
            continue;
        }
        // The start time, in clock ticks since boot, is the 22nd field; the command before it
        // (the 2nd, in parentheses) may hold spaces.
        let stat = fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let start =
            stat.rsplit_once(')').and_then(|(_, rest)| rest.split_ascii_whitespace().nth(19));
        if let Some(start) = start.and_then(|s| s.parse().ok()) {
            oldest = Some(oldest.map_or(start, |o: u64| o.min(start)));
        }
    }
    let started = oldest? as f64 / ticks as f64;
    Duration::try_from_secs_f64(uptime - started).ok()
}

/// The process holding socket `inode` (owned by `uid`), and all its sockets; `last` is tried first.
fn find_holder(
    proc_root: &Path,
    inode: u64,
    uid: u32,
    last: Option<u32>,
    until: Instant,
) -> Result<(u32, Vec<u64>), Failure> {
    if let Some(pid) = last
        && let Ok(inodes) = sockets_of(proc_root, pid)
        && inodes.binary_search(&inode).is_ok()
    {
        return Ok((pid, inodes));
    }
    let dir =
        fs::read_dir(proc_root).map_err(|e| failed("list", proc_root.display(), io_cause(&e)))?;
    let mut denied = None;
    for entry in dir.flatten() {
        if Instant::now() >= until {
            return Err(failed("find", "Envoy's process", "no time left before the deadline"));
        }
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        // /proc/<pid> belongs to the process's user: only Envoy's user can hold its listener.
        if entry.metadata().map(|m| m.uid()).ok() != Some(uid) {
            continue;
        }
        match sockets_of(proc_root, pid) {
            Ok(inodes) if inodes.binary_search(&inode).is_ok() => return Ok((pid, inodes)),
            Ok(_) => {}
            Err(e) => {
                let fd = format!("{}/{pid}/fd", proc_root.display());
                denied = Some(failed("read", fd, io_cause(&e)));
            }
        }
    }
    Err(denied.unwrap_or_else(|| {
        Failure::from(format!("no process of uid {uid} shows socket:[{inode}] here"))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lists::PortSet;
    use std::net::TcpListener;
    use std::os::fd::AsRawFd;

    /// As the kernel prints them: a server on 0.0.0.0:5353 and on [::]:443 (QUIC), a DNS stub on
    /// 127.0.0.1:53, a client's socket connected to 10.96.0.10:53 and an unconnected one on an
    /// ephemeral port; and 9125, ignored.
    #[test]
    fn udp_servers_are_bound_unconnected_below_the_ephemeral_range_and_not_on_loopback() {
        let root = std::env::temp_dir().join(format!("envoy-drain-udp-{}", std::process::id()));
        fs::create_dir_all(root.join("net")).unwrap();
        let line = |local: &str, remote: &str, state: &str| {
            format!(
                "  1: {local} {remote} {state} 00000000:00000000 00:00000000 00000000  1000        0 4242 2 0000000000000000 0\n"
            )
        };
        let head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n";
        let any = "00000000:0000";
        let udp = [
            line("00000000:14E9", any, "07"),
            line("0100007F:0035", any, "07"),
            line("0200000A:A000", "0A00600A:0035", "01"),
            line("00000000:9C40", any, "07"),
            line("00000000:23A5", any, "07"),
        ];
        fs::write(root.join("net/udp"), [head.to_string(), udp.concat()].concat()).unwrap();
        let quic = line(
            "00000000000000000000000000000000:01BB",
            "00000000000000000000000000000000:0000",
            "07",
        );
        fs::write(root.join("net/udp6"), [head, &quic].concat()).unwrap();
        let ports = Filter { ignore: PortSet::parse("9125").unwrap(), only: None };
        let found = udp_servers(&root, &ports, 32768);
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(found, [443, 5353]);
    }

    /// The kernel shows a socket's path as it was bound, spaces and all; the flag names it also
    /// through a symlink.
    #[test]
    fn a_listening_unix_socket_is_found_with_a_space_in_its_path_and_through_a_symlink() {
        let dir = std::env::temp_dir().join(format!("envoy-drain unix {}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let bound = dir.join("admin sock");
        let listener = std::os::unix::net::UnixListener::bind(&bound).unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&bound, &link).unwrap();
        let table = Path::new("/proc/net/unix");
        let (by_name, by_link) = (unix_listener(table, &bound), unix_listener(table, &link));
        let nothing = unix_listener(table, &dir.join("nothing"));
        let inode = fs::read_link(format!("/proc/self/fd/{}", listener.as_raw_fd())).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        let inode = inode.to_str().unwrap();
        let inode: u64 = inode["socket:[".len()..inode.len() - 1].parse().unwrap();
        assert_eq!(by_name.unwrap(), Some(inode));
        assert_eq!(by_link.unwrap(), Some(inode));
        assert_eq!(nothing.unwrap(), None);
        let line = "0000000062cb94f9: 00000002 00000000 00010000 0001 01 31337 /run/a b";
        assert_eq!(unix_line(line), Some((0x10000, 31337, "/run/a b")));
        assert_eq!(unix_line("0000000062cb94f9: 00000003 00000000 00000000 0001 03  1140"), None);
    }

    /// This process's own listening socket is found as its own, with every socket it holds.
    #[test]
    fn the_holder_of_a_socket_is_found_with_all_its_sockets() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let inode = |fd: i32| -> u64 {
            let link = fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
            let text = link.to_str().unwrap().to_string();
            text["socket:[".len()..text.len() - 1].parse().unwrap()
        };
        let (mine, theirs) = (inode(listener.as_raw_fd()), inode(other.as_raw_fd()));
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let me = std::process::id();
        let until = Instant::now() + std::time::Duration::from_secs(10);
        let (pid, inodes) = find_holder(Path::new("/proc"), mine, uid, None, until).unwrap();
        assert_eq!(pid, me);
        assert!(inodes.binary_search(&mine).is_ok() && inodes.binary_search(&theirs).is_ok());
        let again = find_holder(Path::new("/proc"), mine, uid, Some(me), until).unwrap();
        assert_eq!(again.0, me);
        let e = find_holder(Path::new("/proc"), u64::MAX, uid, Some(me), until).unwrap_err();
        assert!(e.contains("shows socket:[18446744073709551615]"), "{e}");
    }
}
