//! Arrivals read from the pod's socket table (pure: sockets in, a counter out), for `hold`: alone
//! in Istio's ambient mode, in pods without a mesh and behind a sidecar whose admin API cannot
//! answer. A connection is told by its two ends, whichever side of it the table
//! shows, so it is one arrival whether the pod's socket still lives, waits in TIME_WAIT (the side
//! that closed first keeps its ends for 60 s), or only the other end is in the pod (a proxy of the
//! pod connecting to the app). Behind a sidecar, `SidecarArrivals` merges the table's with
//! /clusters' requests, read at their own pace. The facts: docs/how-it-works.md ("Arrivals from
//! the kernel").

use crate::config::ArrivalRule;
use crate::count::{Before, COST_SPACING, Count, REQUEST_TIMEOUT, Warning};
use crate::error::Failure;
use crate::hold::quiet::WINDOW;
use crate::source::clusters;
use crate::source::diag::{JIFFY, TIME_WAIT_LEN};
use crate::source::procnet::{Endpoint, LISTEN, SYN_RECV, Socket, TIME_WAIT, loopback, taking};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

/// The connections a read shows, and the app's own ends of its calls out.
type Connections = (HashMap<Key, Conn>, HashSet<Endpoint>);

/// ztunnel's HBONE port, where its connections to other pods go.
const HBONE: u16 = 15008;

/// One connection as the table shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    server: Endpoint,
    client: Endpoint,
}

/// A kept-alive connection that had received nothing for this long before its next bytes, from
/// a client that sent nothing else meanwhile, is polled (a metrics scrape, a health check, a
/// gRPC keepalive): its bytes do not count. Its client keeps the connection to this pod whatever
/// the mesh says, so holding the app for it gains nothing.
const POLL: Duration = Duration::from_secs(5);

/// How far back before the first read the kernel's memory of closed connections is taken: as
/// far as the quiet time looks back during the hold.
const HISTORY: Duration = WINDOW;

#[derive(Debug, Clone, Copy, Default)]
struct Conn {
    /// The bytes the server's socket has received, where it is in the pod and shows them.
    received: Option<u64>,
    /// How long its ends have received nothing: the least of its sockets' (TIME_WAIT's since it
    /// closed).
    idle: Option<Duration>,
    /// One of its ends waits in TIME_WAIT.
    closed: bool,
    /// Its bytes this read began a poll (`POLL`): the next read's, if any, are the poll's rest.
    polled: bool,
    /// Counted as accepted by the pod (its accepted socket was seen past SYN_RECV, or the client
    /// that made it is in the pod).
    accepted: bool,
    /// The client that made it is in the pod.
    inside: bool,
    /// Taken for one of the kubelet's probes when first seen: its bytes count only once it
    /// receives a second request (a probe sends one).
    probe: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Read {
    /// New connections, and open ones that received bytes, that count.
    pub(crate) arrived: u64,
    /// Of those, new connections (the rest are requests on connections open before).
    pub(crate) opened: u64,
    /// Of those, connections the pod accepted that left no socket (`ArrivalRule::passive_opens`).
    pub(crate) unseen: u64,
    /// Polls (`POLL`) left out.
    pub(crate) polls: u64,
    /// Connections open now that count, by the server's port.
    pub(crate) open: Vec<(u16, u64)>,
    /// At the first read: what the kernel remembers of arrivals before it.
    pub(crate) before: Option<Before>,
    /// How long ago the newest arrival came, where every one left a socket that tells.
    pub(crate) newest: Option<Duration>,
    /// Ports listened on outside the pod that do not count: a connection to one that leaves no
    /// socket cannot be told from the app's, and counts.
    pub(crate) hiding: Vec<u16>,
}

#[derive(Debug, Default)]
pub(crate) struct Tracker {
    pub(crate) rule: ArrivalRule,
    /// Every listener seen in the run (one closed since still tells its connections).
    listening: Vec<Endpoint>,
    last: Option<HashMap<Key, Conn>>,
    /// `PassiveOpens` less the connections seen accepted, at its highest so far.
    unexplained: Option<i128>,
    /// The app's own ends of its calls out at the read before, and its user where that is not
    /// root (`None`: every user's), which tells them from ztunnel's own connections out.
    calls: HashSet<Endpoint>,
    uid: Option<u32>,
    /// The ends of connections out of other users (ztunnel's), as of the read before.
    theirs: HashSet<Endpoint>,
    /// When each client address last sent anything, as of the read before (the last `POLL`),
    /// `POLL` later than it was (so that a time before the first read is one too).
    sent: HashMap<Ipv6Addr, Duration>,
    accepted: u64,
    /// Arrivals so far: a counter, as /clusters' `rq_total` is.
    pub(crate) total: u64,
    pub(crate) opened: u64,
    /// The probes' connections so far, which /clusters counts among the app's requests.
    pub(crate) probes: u64,
    pub(crate) polls: u64,
    /// When the first read was, and how many connections since were taken for probes.
    first_at: Option<Duration>,
    /// When the last read was.
    last_at: Option<Duration>,
    /// The pod's age at the first read, where its processes tell (`sockets::pod_age`); `None`
    /// until it is looked for, once.
    pub(crate) age: Option<Option<Duration>>,
    probed: u64,
}

impl Tracker {
    /// The tracker of `rule`, for the app's user `uid`.
    pub(crate) fn new(rule: ArrivalRule, uid: u32) -> Tracker {
        Tracker { rule, uid: Some(uid).filter(|uid| *uid != 0), ..Tracker::default() }
    }

    /// One read at `at`: the pod's addresses (`ours`), its sockets, and its `PassiveOpens` read
    /// before them. The first read only sets what later ones are compared with, and tells what
    /// the kernel remembers of earlier arrivals. In ambient mode a client's connection arrives
    /// twice, a stream on 15008 and ztunnel's hop to the app (both ends in the pod): a read takes
    /// the two as one where it sees both.
    pub(crate) fn read(
        &mut self,
        at: Duration,
        ours: &[Ipv6Addr],
        sockets: &[Socket],
        passive_opens: Option<u64>,
    ) -> Read {
        let (mut now, calls) = self.connections(ours, sockets);
        let first = self.last.is_none();
        let last = self.last.take().unwrap_or_default();
        let since = at.saturating_sub(*self.first_at.get_or_insert(at));
        let then = self.last_at.replace(at).unwrap_or(at);
        let mut read = Read::default();
        let (mut sent, mut open) = (Vec::new(), BTreeMap::new());
        let mut newest = Duration::MAX;
        for (key, seen) in &mut now {
            let before = last.get(key).filter(|b| !reopened(b, seen, (then, at)));
            let client = self.probed_or_client(key, seen, before, (since, first));
            if !self.counts(key, seen) {
                continue;
            }
            let grew = self.grew(key, seen, before, (at, first), &mut sent);
            read.polls += u64::from(seen.polled);
            let arrived = u64::from(before.is_none() || grew);
            if arrived > 0 {
                newest = newest.min(seen.idle.unwrap_or_default());
            }
            read.arrived += arrived;
            read.opened += u64::from(before.is_none() || client);
            if seen.received.is_some() {
                *open.entry(key.server.port).or_insert(0) += 1;
            }
        }
        let uncaptured = self.uncaptured(&now, &last, calls);
        read.open = open.into_iter().collect();
        read.hiding = self.hiding();
        // Keeps when each client last sent, for the last `POLL`.
        self.sent.retain(|_, t| at.saturating_add(POLL).saturating_sub(*t) < POLL);
        for (client, t) in sent {
            self.sent.entry(client).and_modify(|last| *last = t.max(*last)).or_insert(t);
        }
        if first {
            let before = self.remembered(&now, passive_opens);
            read = Read { open: read.open, hiding: read.hiding, before, ..Read::default() };
        }
        self.last = Some(now);
        if let Some(opens) = passive_opens.filter(|_| self.rule.passive_opens) {
            self.unseen(opens, (first, since), uncaptured, &mut read);
        }
        // Those that left no socket came at some time since the read before: now, to be safe.
        read.newest =
            (read.arrived > 0).then_some(if read.unseen > 0 { Duration::ZERO } else { newest });
        self.total = self.total.saturating_add(read.arrived);
        self.opened = self.opened.saturating_add(read.opened);
        self.polls = self.polls.saturating_add(read.polls);
        read
    }

    /// Whether a connection counts: to a port that counts, from neither a probe, the pod itself
    /// nor (where only clients outside count) the pod's inside, and not to the proxy's own ports.
    fn counts(&self, key: &Key, seen: &Conn) -> bool {
        // A client on loopback is the pod calling itself, in ambient mode too (ztunnel's hop
        // to the app comes from the client's address, or the pod's).
        let local = loopback(&key.client.ip);
        let inside = seen.inside && self.rule.outside_only;
        let proxy = self.rule.proxy.contains(&key.server.port);
        self.rule.ports.counts(key.server.port) && !seen.probe && !local && !inside && !proxy
    }

    /// What the first read's table remembers of the arrivals before it (`remember`): for its
    /// life, the connections the pod accepted that have gone (`PassiveOpens` less those open) over
    /// its age, less the probes' (their periods over the pod's age).
    fn remembered(&self, now: &HashMap<Key, Conn>, passive_opens: Option<u64>) -> Option<Before> {
        // Some end closed in the pod: it closes connections itself, and TIME_WAIT tells them.
        let closing = now.iter().any(|(k, s)| s.closed && !self.rule.probes.contains(&k.client.ip));
        let (mut ages, mut lately) = (Vec::new(), Vec::new());
        for (key, seen) in now.iter().filter(|(k, s)| self.counts(k, s)) {
            // Before the first read, the probes' addresses had their share without count.
            if seen.closed && !self.rule.probes.contains(&key.client.ip) {
                ages.extend(seen.idle);
            }
            // And each open connection's last bytes came when it has been idle since.
            if !seen.closed && seen.received.is_some_and(|b| b > 0) {
                lately.extend(seen.idle.filter(|i| *i <= HISTORY));
            }
        }
        if !self.rule.passive_opens {
            // Behind a sidecar (no PassiveOpens: the pod's accepts are its own hops) its
            // clients pool their connections: what they last brought.
            return recently(lately);
        }
        // Those still open came and have not gone: the table shows what they bring.
        let open = now.values().filter(|s| s.accepted && !s.closed).count() as u64;
        let age = self.age.flatten().filter(|a| !a.is_zero());
        let life = passive_opens.map(|n| n.saturating_sub(open)).zip(age).map(|(opens, age)| {
            let periods = self.rule.probe_periods.iter().flatten().chain(&self.rule.liveness);
            let (kinds, probes) = periods.fold((0.0, 0.0), |(k, n), p| {
                (k + 1.0, n + age.as_secs_f64() / p.as_secs_f64().max(1.0))
            });
            // The kubelet's probes come a little late or fail now and then: a few more or fewer
            // than their periods make are no clients.
            let slack = 2.0 + kinds + probes / 100.0;
            ((opens as f64 - probes - slack).max(0.0) as u64, age)
        });
        // A pod younger than a minute remembers its life alone.
        let memory =
            before(ages).map(|m| Before { span: age.map_or(m.span, |a| a.min(m.span)), ..m });
        remember(memory, closing, life, !self.rule.proxy.is_empty())
    }

    /// The calls out new since the read before whose capture by ztunnel (an accepted end on
    /// 15001 or 15053, its client the call's end) no read showed: one of its accepts each.
    fn uncaptured(
        &mut self,
        now: &HashMap<Key, Conn>,
        last: &HashMap<Key, Conn>,
        calls: HashSet<Endpoint>,
    ) -> u64 {
        let captured: HashSet<&Endpoint> =
            now.keys().chain(last.keys()).map(|k| &k.client).collect();
        let uncaptured = calls.iter().filter(|c| !self.calls.contains(c) && !captured.contains(c));
        let uncaptured = uncaptured.count() as u64;
        self.calls = calls;
        uncaptured
    }

    /// The connections `sockets` show, by their two ends, and the app's own ends of its calls out;
    /// the listeners among them noted.
    fn connections(&mut self, ours: &[Ipv6Addr], sockets: &[Socket]) -> Connections {
        for s in sockets.iter().filter(|s| s.state == LISTEN) {
            if !self.listening.contains(&s.local) {
                self.listening.push(s.local);
            }
        }
        let mut now: HashMap<Key, Conn> = HashMap::new();
        let (mut calls, mut foreign) = (HashSet::new(), HashSet::new());
        for s in sockets.iter().filter(|s| s.state != LISTEN) {
            let Some((key, in_server)) = self.key(ours, s) else {
                // The app's own end of a call out, not ztunnel's (its HBONE to a peer's 15008,
                // its own connections onward, of another user, which the end keeps once its
                // socket waits in TIME_WAIT with no user).
                let theirs = match self.uid {
                    _ if s.inode == 0 => self.theirs.contains(&s.local),
                    Some(uid) => uid != s.uid,
                    None => false,
                };
                if theirs {
                    foreign.insert(s.local);
                } else if ours.contains(&s.local.ip) && s.remote.port != HBONE {
                    // Its calls' TIME_WAIT tells nothing of its clients'.
                    calls.insert(s.local);
                }
                continue;
            };
            let seen = now.entry(key).or_default();
            seen.accepted |= !in_server || s.state != SYN_RECV;
            // The client's end may have gone where the server's waits in TIME_WAIT.
            seen.inside |= !in_server || is_ours(ours, &key.client);
            seen.closed |= s.state == TIME_WAIT;
            seen.idle = seen.idle.into_iter().chain(s.idle).min();
            if in_server && s.received.is_some() {
                seen.received = s.received;
            }
        }
        self.theirs = foreign;
        (now, calls)
    }

    /// Whether connection `key` is one of the kubelet's probes (`seen.probe`), counting those
    /// newly seen accepted and probes; whether it was one and is now a client's.
    fn probed_or_client(
        &mut self,
        key: &Key,
        seen: &mut Conn,
        before: Option<&Conn>,
        (since, first): (Duration, bool),
    ) -> bool {
        if seen.accepted && !before.is_some_and(|b| b.accepted) {
            self.accepted += 1;
        }
        // A probe sends one request on a connection of its own (kubelet pkg/probe): more bytes
        // after some make it a client's, which gives its share back.
        let again = matches!((before.and_then(|b| b.received), seen.received),
            (Some(was), Some(is)) if was > 0 && is > was);
        let client = before.is_some_and(|b| b.probe) && again;
        self.probed = self.probed.saturating_sub(u64::from(client));
        let counts = self.rule.ports.counts(key.server.port);
        let from_probes = self.rule.probes.contains(&key.client.ip) && counts;
        seen.probe = match before {
            Some(b) => b.probe && !client,
            // Closed before the first read: the probes' share since then is whole.
            None if first && seen.closed => from_probes,
            None => from_probes && self.probe(since, true),
        };
        // At the first read, only those still open: their requests may be yet to count.
        let new_probe = before.is_none() && (!first || seen.received.is_some());
        self.probes += u64::from(seen.probe && new_probe && counts);
        client
    }

    /// Whether an open connection received bytes that count since the read before: not a poll's
    /// (`POLL`), which it notes in `seen.polled`, nor a poll's rest (a request may span two reads);
    /// Its client goes to `sent` when it sent anything, with the time it last did.
    fn grew(
        &self,
        key: &Key,
        seen: &mut Conn,
        before: Option<&Conn>,
        (at, first): (Duration, bool),
        sent: &mut Vec<(Ipv6Addr, Duration)>,
    ) -> bool {
        let more = match (before.and_then(|b| b.received), seen.received) {
            (Some(was), Some(is)) => is.saturating_sub(was),
            _ => 0,
        };
        let rest = before.is_some_and(|b| b.polled);
        let quiet_client = self
            .sent
            .get(&key.client.ip)
            .is_none_or(|t| at.saturating_add(POLL).saturating_sub(*t) >= POLL);
        let idle = before.and_then(|b| b.idle).is_some_and(|i| i >= POLL);
        seen.polled = more > 0 && !rest && idle && quiet_client;
        // A connection's last bytes are as old as it has been idle.
        let recent = !first || seen.idle.is_none_or(|i| i < POLL);
        if (before.is_none() || more > 0) && recent {
            let idle = seen.idle.unwrap_or_default();
            sent.push((key.client.ip, at.saturating_add(POLL).saturating_sub(idle)));
        }
        more > 0 && !seen.polled && !rest
    }

    /// Whether one more connection `since` the first read can be one of the kubelet's probes,
    /// taking it if so: one `seen` from their addresses, or one that left no socket. Without
    /// `--probe-periods`, every one seen from their addresses and none that left no socket.
    /// With them, as many as the probes may have made: a probe of period p makes at most
    /// since / p + 1 connections in `since` (the kubelet's prober ticks every period, kubelet
    /// pkg/kubelet/prober/worker.go `run`), a tenth of a period more for the time it takes to
    /// start.
    fn probe(&mut self, since: Duration, seen: bool) -> bool {
        let Some(periods) = &self.rule.probe_periods else { return seen };
        let made = |p: &Duration| {
            let p = p.as_secs_f64().max(f64::MIN_POSITIVE);
            ((since.as_secs_f64() + p / 10.0) / p).floor() as u64 + 1
        };
        let allowed: u64 = periods.iter().map(made).fold(0, u64::saturating_add);
        // A share not taken for long is gone: at most two a probe wait (a probe that came late,
        // and the next), not every one of a probe that stopped or never ran.
        let kept = allowed.saturating_sub(2 * periods.len() as u64);
        self.probed = self.probed.max(kept);
        let free = self.probed < allowed;
        self.probed += u64::from(free);
        free
    }

    /// The connection `s` belongs to, and whether `s` is its server's socket; `None` for one the
    /// pod opened to elsewhere. The server is the end a listener of the pod serves: `s`'s own
    /// local end when it was accepted, else its remote end when that is the pod's (`ours`).
    fn key(&self, ours: &[Ipv6Addr], s: &Socket) -> Option<(Key, bool)> {
        if taking(&self.listening, &s.local, |l| l).is_some() {
            return Some((Key { server: s.local, client: s.remote }, true));
        }
        (is_ours(ours, &s.remote) && taking(&self.listening, &s.remote, |l| l).is_some())
            .then_some((Key { server: s.remote, client: s.local }, false))
    }

    /// The ports of listeners that take connections from outside the pod and do not count. The
    /// mesh's own inbound ports (`ArrivalRule::proxy`) hide nothing: each connection through them
    /// reaches the app over a hop the table shows.
    fn hiding(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = (self.listening.iter())
            .filter(|l| !loopback(&l.ip))
            .map(|l| l.port)
            .filter(|&p| !self.rule.ports.counts(p) && !self.rule.proxy.contains(&p))
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// Adds to `read` the connections the pod accepted since the last read that no read saw, less
    /// the probes' share of them: `PassiveOpens`, which counts every accepted connection, less
    /// those seen, beyond the most this has been. Read before the sockets, a connection accepted
    /// in between is seen before it is counted, which the highest so far absorbs. One that a
    /// listener that does not count took (`read.hiding`) cannot be told from the app's, and
    /// counts: a quiet pod held longer, never a request lost.
    fn unseen(
        &mut self,
        opens: u64,
        (first, since): (bool, Duration),
        calls: u64,
        read: &mut Read,
    ) {
        let now = i128::from(opens) - i128::from(self.accepted);
        let before = self.unexplained.replace(now.max(self.unexplained.unwrap_or(now)));
        let mut unseen = match before {
            Some(was) if !first && now > was => u64::try_from(now - was).unwrap_or(u64::MAX),
            _ => 0,
        };
        // Through ztunnel a connection is accepted twice: by it, and by the app from its hop,
        // which the table showed; and so is each of the app's calls out, by ztunnel alone.
        if !self.rule.proxy.is_empty() {
            unseen = unseen.saturating_sub(read.opened).saturating_sub(calls);
        }
        read.unseen = unseen - (0..unseen).take_while(|_| self.probe(since, false)).count() as u64;
        read.arrived += read.unseen;
        read.opened += read.unseen;
    }
}

/// Whether `now`, on the ends of a connection the read `then` saw closed (`before`), is another
/// one: a client that keeps no TIME_WAIT of its own may take the same port again while the pod's
/// end of the old connection waits in TIME_WAIT, and the kernel takes the new connection
/// (`tcp_timewait_state_process`, net/ipv4/tcp_minisocks.c). Open again, or closed later than
/// the old one did: its age short of what the old one's grew to by `at` (by more than a read's
/// own jitter, `REOPENED`).
fn reopened(before: &Conn, now: &Conn, (then, at): (Duration, Duration)) -> bool {
    let since = at.saturating_sub(then);
    let short = |(was, is): (Duration, Duration)| was.saturating_add(since).saturating_sub(is);
    before.closed && (!now.closed || before.idle.zip(now.idle).is_some_and(|w| short(w) > REOPENED))
}

/// How far short of the old connection's age a closed one's must be to be another: ages are
/// whole jiffies and a read's time is taken after its dump, which a loaded node can delay by
/// hundreds of milliseconds; a port taken again within a second is missed (one spurious
/// arrival, which makes a hold longer, never shorter).
const REOPENED: Duration = Duration::from_secs(1);

/// What the ages of the arrivals before the first read tell: how many came in the minute the
/// kernel remembers them (TIME_WAIT lasts 60 s), and back to `HISTORY` the newest and the
/// longest pause between two. Where one alone came then, the pause before it, from the one before
/// that: a sparse rate (a request every few seconds, shared between endpoints at random) shows
/// so, and is no sign that requests have stopped; a first arrival tells none. Nothing remembered
/// tells nothing: the clients may close first, which leaves no TIME_WAIT in the pod.
pub fn before(mut ages: Vec<Duration>) -> Option<Before> {
    ages.sort_unstable();
    let within = ages.partition_point(|age| *age <= HISTORY);
    let told = &ages[..if within == 1 { ages.len().min(2) } else { within }];
    let pause = told.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
    let recent = ages[..within].first().map(|&newest| (newest, pause));
    let arrivals = ages.len() as u64;
    (arrivals > 0).then_some(Before { arrivals, span: TIME_WAIT_LEN, recent })
}

/// What is remembered of the arrivals before the first read. Where an end closed in the pod
/// lately (`closing`), the pod closes connections itself and the minute of TIME_WAIT tells them
/// (`memory`: none, or those that came). Else the clients close first and leave nothing, or
/// none came: the pod's `life`, the connections its namespace accepted, less the probes', over
/// its age. In ambient mode each connection reaches the app over ztunnel's hop, an end of which
/// waits in TIME_WAIT in the pod whoever closes first: none there means none came for a minute.
pub fn remember(
    memory: Option<Before>,
    closing: bool,
    life: Option<(u64, Duration)>,
    ambient: bool,
) -> Option<Before> {
    if closing {
        return Some(memory.unwrap_or(Before { arrivals: 0, span: TIME_WAIT_LEN, recent: None }));
    }
    let (arrivals, span) = life.filter(|(n, age)| *n > 0 && !age.is_zero())?;
    let recent = ambient.then_some((TIME_WAIT_LEN.min(span), Duration::ZERO));
    Some(Before { arrivals, span, recent })
}

/// What the pod's open connections tell of the arrivals before the first read, behind a sidecar
/// (whose clients, other sidecars, pool their connections and close none): each one's last bytes
/// came when it has been idle since (`ages`, at most `HISTORY`), so at least as many arrived as
/// the connections within the span back to the oldest of them. One alone tells no rate. Ages are
/// a jiffy short (`diag::JIFFY`): the span is a jiffy longer, never a rate too high.
fn recently(mut ages: Vec<Duration>) -> Option<Before> {
    ages.sort_unstable();
    let (newest, span) = (*ages.first()?, *ages.last()?);
    let span = span.saturating_add(JIFFY).max(Duration::from_millis(500));
    (ages.len() > 1).then_some(Before {
        arrivals: ages.len() as u64,
        span,
        recent: Some((newest, Duration::ZERO)),
    })
}

/// Whether `end` is an address of the pod (`ours`): 127.0.0.0/8 and ::1 always are.
fn is_ours(ours: &[Ipv6Addr], end: &Endpoint) -> bool {
    ours.contains(&end.ip) || loopback(&end.ip)
}

/// A /clusters read longer than this and than 4 times the cheapest waited on a stalled Envoy.
const STALL: Duration = Duration::from_millis(100);

/// `hold`'s arrivals behind a sidecar from both sources: the socket table's counter at every
/// look, Envoy's /clusters' at its own pace. The table shows a pooled connection's bytes once a
/// read however many requests they were: an answer of /clusters that saw more than the table did
/// since the answer before recounts them (they arrived then, not now), and one that saw some where
/// the table saw none adds them as arrivals; the requests of the probes the table saw are none.
/// Also whether the table failed to tell them at the last look (until the first says so, it
/// tells), when /clusters is next due, and the least time it took (what it costs Envoy where its
/// CPU cannot be read: a read that waited on a stopped Envoy took longer and cost nothing).
#[derive(Debug, Default)]
pub(crate) struct SidecarArrivals {
    fresh: u64,
    recounted: u64,
    kernel: Option<u64>,
    clusters: Option<u64>,
    /// What the table saw arrive since the last /clusters answer, and the probes it had seen by
    /// that answer.
    since: u64,
    probes: u64,
    /// Probes of the last answer's span whose requests it did not count.
    carried: u64,
    /// Whether the last answer added arrivals the table did not see (they came since the answer
    /// before, when is not told).
    added: bool,
    pub(crate) table_blind: bool,
    /// The app's requests over Envoy's uptime, once read (`None`: not yet; `Some(None)`: not
    /// told), given to the first count as what is remembered from before it.
    pub(crate) life: Option<Option<Before>>,
    told: bool,
    due: Option<Instant>,
    least: Option<Duration>,
}

impl SidecarArrivals {
    /// Whether a look at `now` reads /clusters, and then within how long of the `left` it has:
    /// while the table tells, a stalled Envoy must not stop it (a few of the cheapest reads).
    pub(crate) fn clusters_limit(&self, now: Instant, left: Duration) -> Option<Duration> {
        let due = self.table_blind || self.due.is_none_or(|t| now >= t);
        let few = |l: Duration| l.saturating_mul(4);
        due.then(|| match self.least {
            _ if self.table_blind => left,
            Some(least) => REQUEST_TIMEOUT.max(few(least)).min(left),
            None => few(REQUEST_TIMEOUT).min(left),
        })
    }

    /// A /clusters read asked at `asked` that took `took` and cost Envoy's main thread `cpu`
    /// (where known): the next one is due 20 times that later; whether it waited on a stall,
    /// through which the table was not read and connections may have come and gone.
    pub(crate) fn clusters_read(
        &mut self,
        asked: Instant,
        took: Duration,
        cpu: Option<Duration>,
    ) -> bool {
        let least = self.least.map_or(took, |l| l.min(took));
        self.least = Some(least);
        // Envoy's main thread's CPU, but not less than the cheapest read took (what else its
        // answer costs it, writing and freeing it, falls outside that CPU).
        self.due =
            asked.checked_add(cpu.map_or(least, |cpu| cpu.max(least)).saturating_mul(COST_SPACING));
        took > least.saturating_mul(4).max(STALL)
    }

    /// Takes the table's counter (`None`: it could not tell) and, when /clusters answered, its
    /// counter; gives the arrivals and the recounted ones so far, unknown when neither told, and
    /// whether the table saw arrivals that /clusters did not (clients that reach the app past
    /// the sidecar, or a TCP stream's bytes).
    fn add(
        &mut self,
        (kernel, probes): (Option<u64>, u64),
        clusters: Option<u64>,
    ) -> (Option<(u64, u64)>, bool) {
        if let Some(k) = kernel {
            let moved = self.kernel.replace(k).map_or(0, |was| k.saturating_sub(was));
            self.since = self.since.saturating_add(moved);
            self.fresh = self.fresh.saturating_add(moved);
        }
        let mut past_envoy = false;
        if let Some(c) = clusters {
            // The table, read after /clusters, may see a probe before /clusters counts its
            // request: those of one answer's span may be the next answer's.
            let new = probes.saturating_sub(std::mem::replace(&mut self.probes, probes));
            let probed = new.saturating_add(self.carried);
            match self.clusters.replace(c) {
                // The first answer: the probes open now may have requests still to count.
                None => self.carried = new,
                Some(was) => {
                    let moved = c.saturating_sub(was);
                    self.carried = probed.saturating_sub(moved).min(new);
                    let moved = moved.saturating_sub(probed);
                    past_envoy = moved == 0 && self.since > 0;
                    self.added = self.since == 0 && moved > 0;
                    match self.since {
                        0 => self.fresh = self.fresh.saturating_add(moved),
                        seen => {
                            let more = moved.saturating_sub(seen);
                            self.recounted = self.recounted.saturating_add(more);
                        }
                    }
                }
            }
            self.since = 0;
        }
        (kernel.or(clusters).map(|_| (self.fresh, self.recounted)), past_envoy)
    }

    /// Both sources' arrivals into the look: the table's count when it told them, with
    /// /clusters' recounts; else /clusters' answer; unknown after a stall.
    pub(crate) fn merge(
        &mut self,
        mut clusters: Option<Result<clusters::Answer, Failure>>,
        mut proc: Result<Count, Failure>,
        probes: u64,
        blocked: bool,
    ) -> (Option<Result<clusters::Answer, Failure>>, Result<Count, Failure>) {
        let kernel = proc.as_ref().ok().and_then(|c| c.arrivals);
        let answered = clusters.as_ref().and_then(|c| c.as_ref().ok());
        let (total, past_envoy) =
            self.add((kernel, probes), answered.and_then(|a| a.count.arrivals));
        let (arrivals, recounted) = match total {
            Some((fresh, again)) if !blocked => (Some(fresh), again),
            _ => (None, 0),
        };
        self.table_blind = kernel.is_none();
        if let (Ok(count), Some(_)) = (&mut proc, kernel) {
            // Behind a sidecar the clients are other sidecars, which pool their connections and
            // choose this pod per request: a request on an old connection is a new choice.
            (count.arrivals, count.recounted, count.opened) = (arrivals, recounted, None);
            if !std::mem::replace(&mut self.told, true) {
                count.before = self.life.flatten().or(count.before);
            }
            if std::mem::take(&mut self.added) {
                count.newest = Some(Duration::ZERO);
            }
            if let Some(Err(why)) = &clusters {
                count.warnings.push(Warning::ClustersFailed(why.clone()));
            }
            count.warnings.extend(past_envoy.then_some(Warning::PastEnvoy));
            return (None, proc);
        }
        if let Some(Ok(answer)) = &mut clusters {
            (answer.count.arrivals, answer.count.recounted) = (arrivals, recounted);
            let why = match &proc {
                Ok(c) => Failure::from(
                    c.warnings.iter().map(Warning::to_string).collect::<Vec<_>>().join("; "),
                ),
                Err(why) => why.clone(),
            };
            answer.count.warnings.push(Warning::ClustersAlone(why));
        }
        (clusters, proc)
    }
}

/// `Tcp: ... PassiveOpens ...` of `/proc/net/snmp`: the header line names the columns, the next
/// gives the values.
pub(crate) fn passive_opens(snmp: &str) -> Option<u64> {
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let names: Vec<&str> = tcp.next()?.split_ascii_whitespace().collect();
    let values: Vec<&str> = tcp.next()?.split_ascii_whitespace().collect();
    let at = names.iter().position(|n| *n == "PassiveOpens")?;
    values.get(at)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Filter;
    use crate::lists::PortSet;
    use crate::source::procnet::to_endpoint;

    const ESTABLISHED: u8 = 1;
    const TIME_WAIT: u8 = 6;
    const POD: &str = "10.90.0.2";

    fn end(addr: &str) -> Endpoint {
        to_endpoint(addr.parse().unwrap())
    }

    fn socket(local: &str, remote: &str, state: u8, received: Option<u64>) -> Socket {
        Socket {
            local: end(local),
            remote: end(remote),
            state,
            uid: 0,
            inode: 0,
            received,
            idle: None,
            unsent: 0,
            awaiting: false,
        }
    }

    fn listening(ports: &[u16]) -> Vec<Socket> {
        let any = |p: u16| format!("0.0.0.0:{p}");
        ports.iter().map(|&p| socket(&any(p), "0.0.0.0:0", LISTEN, None)).collect()
    }

    fn ours() -> Vec<Ipv6Addr> {
        vec![end(&format!("{POD}:0")).ip]
    }

    /// Reads `each` in turn, 500 ms apart, with the listeners on `ports` and the namespace's
    /// `PassiveOpens`; what each read found.
    fn reads(rule: ArrivalRule, ports: &[u16], each: &[(&[Socket], Option<u64>)]) -> Vec<Read> {
        let mut tracker = Tracker::new(rule, 0);
        let mut found = Vec::new();
        for (i, (sockets, opens)) in each.iter().enumerate() {
            let all: Vec<Socket> =
                listening(ports).into_iter().chain(sockets.iter().copied()).collect();
            let at = Duration::from_millis(500 * i as u64);
            found.push(tracker.read(at, &ours(), &all, *opens));
        }
        found
    }

    fn arrived(found: &[Read]) -> Vec<u64> {
        found.iter().map(|r| r.arrived).collect()
    }

    #[test]
    fn a_connection_accepted_on_a_port_that_counts_arrives_and_the_rest_do_not() {
        let ignore = PortSet::parse("15001,15021").unwrap();
        let rule = ArrivalRule { ports: Filter { ignore, only: None }, ..ArrivalRule::default() };
        let later = [
            socket(&format!("{POD}:15006"), "10.90.0.9:50000", ESTABLISHED, Some(120)),
            socket("127.0.0.1:8080", "127.0.0.6:41000", ESTABLISHED, Some(0)),
            socket(&format!("{POD}:15006"), "10.90.0.9:50001", SYN_RECV, None),
            socket(&format!("{POD}:15001"), "10.90.0.9:50002", ESTABLISHED, Some(500)),
            socket(&format!("{POD}:15021"), "10.90.0.3:50003", ESTABLISHED, Some(90)),
            // Opened by the pod, to elsewhere: no listener of the pod serves either end.
            socket(&format!("{POD}:41000"), "10.90.0.3:9080", ESTABLISHED, Some(70)),
        ];
        let found = reads(rule, &[15006, 15001, 15021, 8080], &[(&[], None), (&later, None)]);
        // The one to 8080 is from loopback: the pod calling itself.
        assert_eq!(arrived(&found), [0, 2]);
        assert_eq!(found[1].open, [(15006, 1)], "the SYN_RECV one shows no bytes yet");
    }

    #[test]
    fn a_request_on_a_kept_alive_connection_arrives_and_an_idle_one_does_not() {
        let at =
            |bytes| [socket(&format!("{POD}:8080"), "10.90.0.9:50000", ESTABLISHED, Some(bytes))];
        let (a, b, c) = (at(100), at(180), at(180));
        let found = reads(ArrivalRule::default(), &[8080], &[(&a, None), (&b, None), (&c, None)]);
        assert_eq!(arrived(&found), [0, 1, 0]);
    }

    #[test]
    fn a_connection_opened_and_closed_between_two_reads_is_seen_by_the_end_that_closed_first() {
        // The app closed first: its end waits in TIME_WAIT.
        let server = [socket(&format!("{POD}:8080"), "10.90.0.9:50000", TIME_WAIT, None)];
        // A proxy of the pod closed first (ztunnel's hop to the app, from the client's address).
        let client = [socket("10.90.0.9:50001", &format!("{POD}:8080"), TIME_WAIT, None)];
        let found = reads(
            ArrivalRule::default(),
            &[8080],
            &[(&[], None), (&server, None), (&client, None)],
        );
        assert_eq!(arrived(&found), [0, 1, 1]);
        // Both ends in the pod are one connection; the same ends a read later are no news.
        let both =
            [server[0], socket("10.90.0.9:50000", &format!("{POD}:8080"), ESTABLISHED, None)];
        let found =
            reads(ArrivalRule::default(), &[8080], &[(&[], None), (&both, None), (&both, None)]);
        assert_eq!(arrived(&found), [0, 1, 0]);
    }

    #[test]
    fn a_call_out_to_another_pods_port_of_the_same_number_is_no_arrival() {
        let out = [socket(&format!("{POD}:41000"), "10.90.0.4:8080", TIME_WAIT, None)];
        let found = reads(ArrivalRule::default(), &[8080], &[(&[], None), (&out, None)]);
        assert_eq!(arrived(&found), [0, 0]);
    }

    #[test]
    fn behind_a_sidecar_only_clients_outside_the_pod_arrive() {
        // The proxy's pooled hop to the app, and the app's call to another container on
        // loopback, both with their client in the pod; and a client's own connection to 15006.
        let rule = ArrivalRule { outside_only: true, ..ArrivalRule::default() };
        let sockets = |bytes| {
            [
                socket("127.0.0.1:8080", "127.0.0.6:41000", ESTABLISHED, Some(bytes)),
                socket("127.0.0.6:41000", "127.0.0.1:8080", ESTABLISHED, Some(bytes)),
                socket("127.0.0.1:6379", "127.0.0.1:42000", ESTABLISHED, Some(bytes)),
                socket("127.0.0.1:42000", "127.0.0.1:6379", ESTABLISHED, Some(bytes)),
            ]
        };
        let client = socket(&format!("{POD}:15006"), "10.90.0.9:50000", ESTABLISHED, Some(90));
        // The app's end of a hop it closed first, the proxy's end gone.
        let waiting = socket("127.0.0.1:8080", "127.0.0.6:41001", TIME_WAIT, None);
        let later = [&sockets(200)[..], &[client, waiting]].concat();
        let found = reads(rule, &[8080, 6379, 15006], &[(&sockets(100), None), (&later, None)]);
        assert_eq!(arrived(&found), [0, 1]);
    }

    /// Ambient mode's rule: ztunnel's inbound listeners, the probes from 169.254.7.127, and the
    /// namespace's counters read.
    fn ambient() -> ArrivalRule {
        ArrivalRule {
            probes: vec![end("169.254.7.127:0").ip],
            proxy: vec![15006, 15008],
            passive_opens: true,
            ..ArrivalRule::default()
        }
    }

    #[test]
    fn in_ambient_mode_ztunnels_hop_is_the_arrival_and_its_hbone_bytes_never_are() {
        // ztunnel's HBONE connection to 15008 carries every stream, its PINGs, a scrape's bytes
        // on a kept-alive stream and a stream's closing frames alike: no bytes there count.
        // Each client connection reaches the app over a hop from the client's address, both
        // ends in the pod, whichever closes first leaving a TIME_WAIT end in the pod.
        let hbone =
            |bytes| socket(&format!("{POD}:15008"), "10.90.0.5:40000", ESTABLISHED, Some(bytes));
        let hop = |port: u16, bytes| {
            let client = format!("10.90.0.9:{port}");
            [
                socket(&format!("{POD}:8080"), &client, ESTABLISHED, Some(bytes)),
                socket(&client, &format!("{POD}:8080"), ESTABLISHED, None),
            ]
        };
        let closed = socket("10.90.0.9:50003", &format!("{POD}:8080"), TIME_WAIT, None);
        let probe = socket(&format!("{POD}:8080"), "169.254.7.127:33000", TIME_WAIT, None);
        let tcp = Some;
        let each = [
            (vec![hbone(100)], tcp(10)),
            // One client connection: its hop, the HBONE connection's bytes beside it.
            ([&[hbone(400)][..], &hop(50000, 80)].concat(), tcp(11)),
            // A second request on it; then only closing frames on the HBONE connection.
            ([&[hbone(700)][..], &hop(50000, 160)].concat(), tcp(11)),
            ([&[hbone(900)][..], &hop(50000, 160)].concat(), tcp(11)),
            // Two more: one open, one whose client closed first; and a probe.
            (
                [&[hbone(1500)][..], &hop(50000, 160), &hop(50001, 80), &[closed, probe]].concat(),
                tcp(14),
            ),
        ];
        let each: Vec<(&[Socket], _)> = each.iter().map(|(s, c)| (&s[..], *c)).collect();
        let found = reads(ambient(), &[8080, 15008, 15006], &each);
        assert_eq!(arrived(&found), [0, 1, 1, 0, 2], "a client's request once");
        assert_eq!(found[4].opened, 2, "the hops are the new connections");
        assert!(found.iter().all(|r| r.hiding.is_empty()), "ztunnel's listeners hide nothing");
    }

    #[test]
    fn in_ambient_mode_connections_that_leave_no_socket_count_once() {
        // A reset hop leaves nothing at either end: PassiveOpens alone tells it. A plaintext
        // client through 15006 that closes first is accepted twice (15006, then the hop's app
        // end), of which the table shows the hop: one arrival.
        let hop = |port: u16| {
            socket(&format!("10.90.0.9:{port}"), &format!("{POD}:8080"), TIME_WAIT, None)
        };
        let tcp = Some;
        let plain = [hop(50000), hop(50001)];
        let each: [(&[Socket], _); 3] = [(&[], tcp(5)), (&[], tcp(8)), (&plain, tcp(12))];
        let found = reads(ambient(), &[8080, 15008, 15006], &each);
        assert_eq!(arrived(&found), [0, 3, 2], "three resets; two plaintext clients");
        assert_eq!(found[1].unseen, 3);
        // ztunnel's PassiveOpens of the pod's calls out (15001) leave sockets in the pod.
        let out = [socket(&format!("{POD}:15001"), &format!("{POD}:41000"), TIME_WAIT, None)];
        let with_out = ArrivalRule {
            ports: Filter { ignore: PortSet::parse("15001").unwrap(), only: None },
            ..ambient()
        };
        let each: [(&[Socket], _); 2] = [(&[], tcp(5)), (&out, tcp(6))];
        let found = reads(with_out, &[8080, 15001, 15008], &each);
        assert_eq!(arrived(&found), [0, 0], "the pod's call out");
    }

    #[test]
    fn connections_that_left_no_socket_count_from_passive_opens_once_each() {
        let rule = ArrivalRule { passive_opens: true, ..ArrivalRule::default() };
        let seen = [socket(&format!("{POD}:8080"), "10.90.0.9:50000", TIME_WAIT, None)];
        let found = reads(
            rule,
            &[8080],
            &[
                (&[], Some(10)),
                // Three accepted, one seen: two left no socket.
                (&seen, Some(13)),
                // Nothing new.
                (&seen, Some(13)),
                // One seen before the counter counts it (read first), then counted.
                (
                    &[seen[0], socket(&format!("{POD}:8080"), "10.90.0.9:50001", TIME_WAIT, None)],
                    Some(13),
                ),
                (&seen, Some(14)),
            ],
        );
        assert_eq!(arrived(&found), [0, 3, 0, 1, 0]);
        assert_eq!(found[1].unseen, 2);
    }

    #[test]
    fn probes_that_left_no_socket_are_left_out_only_as_often_as_their_period_allows() {
        // A tcpSocket readiness probe every second (the kubelet closes first: PassiveOpens
        // alone counts it), reads every 500 ms; then a client's connection that left no socket
        // too, which the probes' share cannot hide.
        let rule = ArrivalRule {
            passive_opens: true,
            probe_periods: Some(vec![Duration::from_secs(1)]),
            ..ArrivalRule::default()
        };
        let each: Vec<(&[Socket], Option<u64>)> =
            [10, 11, 11, 12, 12, 13, 15, 15].iter().map(|&n| (&[][..], Some(n))).collect();
        let found = reads(rule.clone(), &[8080], &each);
        assert_eq!(arrived(&found), [0, 0, 0, 0, 0, 0, 1, 0]);
        assert_eq!(found[6].opened, 1, "a new connection, not a request on an open one");
        // Without the periods, each counts.
        let found = reads(ArrivalRule { probe_periods: None, ..rule }, &[8080], &each);
        assert_eq!(arrived(&found), [0, 1, 0, 1, 0, 1, 2, 0]);
    }

    #[test]
    fn connections_from_the_probes_address_beyond_what_the_probes_make_arrive() {
        // The node's address: its probe every 10 s, and a client behind the node's own NAT (a
        // NodePort's, or a host-network ingress) from the same address, kept alive.
        let node = "10.90.0.3";
        let rule = ArrivalRule {
            probes: vec![end(&format!("{node}:0")).ip],
            probe_periods: Some(vec![Duration::from_secs(10)]),
            ..ArrivalRule::default()
        };
        let probe = socket(&format!("{POD}:8080"), &format!("{node}:33000"), TIME_WAIT, None);
        let client = |bytes| {
            socket(&format!("{POD}:8080"), &format!("{node}:33001"), ESTABLISHED, Some(bytes))
        };
        let found = reads(
            rule,
            &[8080],
            &[
                (&[], None),
                (&[probe], None),
                (&[probe, client(90)], None),
                (&[probe, client(180)], None),
            ],
        );
        assert_eq!(arrived(&found), [0, 0, 1, 1], "the probe, then the client and its request");
        assert_eq!(found.iter().map(|r| r.opened).collect::<Vec<_>>(), [0, 0, 1, 0]);
    }

    #[test]
    fn a_kept_alive_client_from_the_probes_address_is_no_probe_once_it_sends_again() {
        // A NodePort client SNATed to the node's address, open at the first read and sending,
        // taken for a probe at first sight (a probe's one request): its next request tells.
        let node = "10.90.0.3";
        let rule = ArrivalRule {
            probes: vec![end(&format!("{node}:0")).ip],
            probe_periods: Some(vec![Duration::from_secs(10)]),
            ..ArrivalRule::default()
        };
        let client = |bytes| {
            [socket(&format!("{POD}:8080"), &format!("{node}:40000"), ESTABLISHED, Some(bytes))]
        };
        let (a, b, c) = (client(100), client(200), client(300));
        let found = reads(rule, &[8080], &[(&a, None), (&b, None), (&c, None)]);
        assert_eq!(arrived(&found), [0, 1, 1]);
        assert_eq!(found[1].opened, 1, "a client's connection, new to the count");
    }

    #[test]
    fn the_share_of_a_probe_that_never_comes_does_not_pile_up() {
        // A 1 s readiness probe listed, but the kubelet sends none (its container exited, or the
        // kubelet stopped probing); after 8 s a burst of 5 connections that left no socket: at
        // most two are taken for that probe's.
        let rule = ArrivalRule {
            passive_opens: true,
            probe_periods: Some(vec![Duration::from_secs(1)]),
            ..ArrivalRule::default()
        };
        let mut each: Vec<(&[Socket], Option<u64>)> = vec![(&[][..], Some(10)); 16];
        each.push((&[], Some(15)));
        let found = reads(rule, &[8080], &each);
        assert_eq!(found[16].arrived, 3, "{found:?}");
    }

    #[test]
    fn a_connection_from_the_probes_address_to_an_ignored_port_takes_no_probes_share() {
        // A host-network scrape of the ignored 9090 from the node, then the HTTP probe of 8080.
        let node = "10.90.0.3";
        let rule = ArrivalRule {
            probes: vec![end(&format!("{node}:0")).ip],
            probe_periods: Some(vec![Duration::from_secs(10)]),
            ports: Filter { ignore: PortSet::parse("9090").unwrap(), only: None },
            ..ArrivalRule::default()
        };
        let scrape = socket(&format!("{POD}:9090"), &format!("{node}:33000"), TIME_WAIT, None);
        let probe = socket(&format!("{POD}:8080"), &format!("{node}:33001"), TIME_WAIT, None);
        let found =
            reads(rule, &[8080, 9090], &[(&[], None), (&[scrape], None), (&[scrape, probe], None)]);
        assert_eq!(arrived(&found), [0, 0, 0]);
    }

    #[test]
    fn the_pods_calls_to_itself_never_arrive_without_a_sidecar_either() {
        // An app pinging a cache of the pod on loopback and on the pod's own address, every read;
        // a client from outside once. Without a mesh (clients outside the pod only) and in
        // ambient mode (ztunnel's hop to the app is in the pod: loopback alone is left out).
        let ping = |port, bytes| {
            let from = format!("127.0.0.1:{port}");
            [
                socket("127.0.0.1:6379", &from, ESTABLISHED, Some(bytes)),
                socket(&from, "127.0.0.1:6379", ESTABLISHED, Some(bytes)),
            ]
        };
        let own = |bytes| {
            let (pod, from) = (format!("{POD}:6379"), format!("{POD}:42000"));
            [
                socket(&pod, &from, ESTABLISHED, Some(bytes)),
                socket(&from, &pod, ESTABLISHED, Some(bytes)),
            ]
        };
        let client = socket(&format!("{POD}:8080"), "10.90.0.9:50000", TIME_WAIT, None);
        let first = [&ping(41000, 10)[..], &own(10)].concat();
        let later = [&ping(41000, 20)[..], &ping(41001, 5), &own(20), &[client]].concat();
        let none =
            ArrivalRule { outside_only: true, passive_opens: true, ..ArrivalRule::default() };
        let found = reads(none, &[6379, 8080], &[(&first, Some(3)), (&later, Some(5))]);
        assert_eq!(arrived(&found), [0, 1]);
        let ambient = ArrivalRule::default();
        let found = reads(ambient, &[6379, 8080], &[(&first, None), (&later, None)]);
        assert_eq!(arrived(&found), [0, 2], "the pod's own address: the stand-in's hop's");
    }

    fn idle(mut s: Socket, ms: u64) -> Socket {
        s.idle = Some(Duration::from_millis(ms));
        s
    }

    #[test]
    fn a_connection_that_left_no_socket_counts_though_a_listener_that_does_not_count_may_have_it() {
        // Only 8080 counts; 9090 listens, its scraper's connection kept alive: the three
        // connections that left no socket cannot be told from 9090's, and count (a quiet pod
        // held longer, never a request lost), and 9090 is named.
        let rule = ArrivalRule {
            passive_opens: true,
            ports: Filter {
                ignore: PortSet::default(),
                only: Some(PortSet::parse("8080").unwrap()),
            },
            ..ArrivalRule::default()
        };
        let kept = [socket(&format!("{POD}:9090"), "10.90.0.7:41000", ESTABLISHED, Some(300))];
        let each: [(&[Socket], _); 3] = [(&kept, Some(10)), (&kept, Some(13)), (&kept, Some(15))];
        let found = reads(rule.clone(), &[8080, 9090], &each);
        assert_eq!(arrived(&found), [0, 3, 2]);
        assert_eq!(found[0].hiding, [9090]);
        // A listener on loopback takes no client from outside the pod.
        let found = reads(rule, &[8080], &each);
        assert_eq!(arrived(&found), [0, 3, 2]);
        assert!(found[0].hiding.is_empty());
    }

    #[test]
    fn bytes_after_a_long_silence_on_a_kept_alive_connection_are_a_poll() {
        // A scrape every 10 s on a kept-alive connection, its request spanning two reads; then
        // a client that sends every read: its bytes arrive.
        let conn = |bytes, ms| {
            [idle(socket(&format!("{POD}:8080"), "10.90.0.9:50000", ESTABLISHED, Some(bytes)), ms)]
        };
        let each = [conn(55, 9000), conn(55, 9500), conn(58, 4), conn(110, 400), conn(110, 900)];
        let each: Vec<(&[Socket], _)> = each.iter().map(|s| (&s[..], None)).collect();
        let found = reads(ArrivalRule::default(), &[8080], &each);
        assert_eq!(arrived(&found), [0, 0, 0, 0, 0]);
        assert_eq!(found.iter().map(|r| r.polls).sum::<u64>(), 1);
        let busy = [conn(55, 9000), conn(58, 4), conn(110, 4), conn(160, 4), conn(210, 4)];
        let busy: Vec<(&[Socket], _)> = busy.iter().map(|s| (&s[..], None)).collect();
        assert_eq!(arrived(&reads(ArrivalRule::default(), &[8080], &busy)), [0, 0, 0, 1, 1]);
    }

    #[test]
    fn a_scrape_through_ztunnel_is_one_poll_whichever_connection_is_read_first() {
        // In ambient mode a client's connection to 15006 and ztunnel's hop to the app have the
        // same client address; a scrape every 15 s grows both in one read.
        let conns = |bytes, ms| {
            let client = "10.90.0.9:50000";
            [
                idle(socket(&format!("{POD}:15006"), client, ESTABLISHED, Some(bytes)), ms),
                idle(socket(&format!("{POD}:8080"), client, ESTABLISHED, Some(bytes)), ms),
            ]
        };
        let each = [conns(100, 9000), conns(100, 9500), conns(160, 5), conns(160, 505)];
        let each: Vec<(&[Socket], _)> = each.iter().map(|s| (&s[..], None)).collect();
        for _ in 0..32 {
            let found = reads(ArrivalRule::default(), &[8080, 15006], &each);
            assert_eq!(arrived(&found), [0, 0, 0, 0]);
            assert_eq!(found[2].polls, 2, "both connections' bytes, one scrape");
        }
    }

    #[test]
    fn a_pool_of_kept_alive_connections_used_in_turn_is_no_poll() {
        // One client, three kept-alive connections, a request every read on the next one: each
        // connection is idle for longer than a poll's silence, but its client is not.
        let conn = |port: u16, bytes, ms| {
            let from = format!("10.90.0.9:{port}");
            idle(socket(&format!("{POD}:8080"), &from, ESTABLISHED, Some(bytes)), ms)
        };
        let each = [
            [conn(50000, 50, 6000), conn(50001, 50, 6500), conn(50002, 50, 7000)],
            [conn(50000, 100, 4), conn(50001, 50, 7000), conn(50002, 50, 7500)],
            [conn(50000, 100, 500), conn(50001, 100, 4), conn(50002, 50, 8000)],
            [conn(50000, 100, 1000), conn(50001, 100, 500), conn(50002, 100, 4)],
        ];
        let each: Vec<(&[Socket], _)> = each.iter().map(|s| (&s[..], None)).collect();
        let found = reads(ArrivalRule::default(), &[8080], &each);
        assert_eq!(arrived(&found), [0, 0, 1, 1], "the first after the silence is a poll");
    }

    #[test]
    fn the_first_read_tells_the_arrivals_the_kernel_remembers() {
        // Connections the app closed 0.2, 4.2 and 4.7 s ago, one 30 s ago, a probe's 1 s ago,
        // and an open one: the newest 200 ms ago, the longest pause 4 s.
        let probes = vec![end("10.90.0.1:0").ip];
        let rule = ArrivalRule { probes, passive_opens: true, ..ArrivalRule::default() };
        // The table half a second later: each socket 500 ms older.
        let table = |later: u64| {
            let closed = |port: u16, ms: u64| {
                let client = format!("10.90.0.9:{port}");
                idle(socket(&format!("{POD}:8080"), &client, TIME_WAIT, None), ms + later)
            };
            let probe = socket(&format!("{POD}:8080"), "10.90.0.1:33000", TIME_WAIT, None);
            let open = socket(&format!("{POD}:8080"), "10.90.0.9:50004", ESTABLISHED, Some(90));
            let first = [closed(50000, 200), closed(50001, 4200), closed(50002, 4700)];
            [
                &first[..],
                &[closed(50003, 30_000), idle(probe, 1000 + later), idle(open, 100 + later)],
            ]
            .concat()
        };
        let (first, second) = (table(0), table(500));
        let found = reads(rule, &[8080], &[(&first, None), (&second, None)]);
        let recent = Some((Duration::from_millis(200), Duration::from_millis(4000)));
        let span = Duration::from_secs(60);
        assert_eq!(found[0].before, Some(Before { arrivals: 4, span, recent }), "the minute's");
        assert_eq!(found[1].before, None, "the first read's alone");
        assert_eq!(arrived(&found), [0, 0]);
    }

    #[test]
    fn the_apps_own_calls_in_time_wait_tell_nothing_of_its_clients() {
        // Found by an outside read: clients that close first leave nothing in the pod; the app
        // closing its own call out to a database took the pod for one that closes its clients'
        // connections, whose TIME_WAIT showed none for a minute, and forgot the pod's life.
        let call = socket(&format!("{POD}:41000"), "10.90.0.3:5432", TIME_WAIT, None);
        let rule = ArrivalRule { passive_opens: true, ..ArrivalRule::default() };
        let mut tracker =
            Tracker { age: Some(Some(Duration::from_secs(600))), ..Tracker::new(rule, 0) };
        let all: Vec<Socket> = listening(&[8080]).into_iter().chain([call]).collect();
        let read = tracker.read(Duration::ZERO, &ours(), &all, Some(1202));
        let life = Before { arrivals: 1200, span: Duration::from_secs(600), recent: None };
        assert_eq!(read.before, Some(life), "1,202 accepted, less 2 for late probes");
    }

    #[test]
    fn one_arrival_in_the_last_10_s_takes_its_pause_from_the_one_before() {
        // A request every 4 s shared with another endpoint at random: one closed 0.3 s ago, the
        // one before it 12 s ago, then 20 s: the pause is 11.7 s. The first of all tells none.
        let closed = |port: u16, ms| {
            idle(socket(&format!("{POD}:8080"), &format!("10.90.0.9:{port}"), TIME_WAIT, None), ms)
        };
        let sparse = [closed(50000, 300), closed(50001, 12_000), closed(50002, 20_000)];
        let first = [closed(50000, 300)];
        let none = || ArrivalRule { passive_opens: true, ..ArrivalRule::default() };
        let found = reads(none(), &[8080], &[(&sparse, None)]);
        let (newest, span) = (Duration::from_millis(300), Duration::from_secs(60));
        let recent = Some((newest, Duration::from_millis(11_700)));
        assert_eq!(found[0].before, Some(Before { arrivals: 3, span, recent }));
        let found = reads(none(), &[8080], &[(&first, None)]);
        let recent = Some((newest, Duration::ZERO));
        assert_eq!(found[0].before, Some(Before { arrivals: 1, span, recent }));
    }

    #[test]
    fn a_connection_on_the_ends_of_one_in_time_wait_is_another() {
        // The probe's client takes the port of its connection of 2 s ago, whose end in the pod
        // waits in TIME_WAIT: the new one is a probe's too, and PassiveOpens' count of it is
        // explained (it was a spurious arrival). A client's is one arrival, not two.
        for (client, arrivals) in [("10.90.0.3:40000", [0, 0, 0]), ("10.90.0.9:40000", [0, 1, 0])] {
            let old = idle(socket(&format!("{POD}:8080"), client, TIME_WAIT, None), 2000);
            let new = idle(socket(&format!("{POD}:8080"), client, TIME_WAIT, None), 100);
            let rule = ArrivalRule {
                passive_opens: true,
                probes: vec![end("10.90.0.3:0").ip],
                ..ArrivalRule::default()
            };
            let older = idle(new, 600);
            let found =
                reads(rule, &[8080], &[(&[old], Some(1)), (&[new], Some(2)), (&[older], Some(2))]);
            assert_eq!(arrived(&found), arrivals, "{client}: {found:?}");
        }
    }

    #[test]
    fn the_same_connection_in_time_wait_ageing_is_not_another() {
        let rule = || ArrivalRule { passive_opens: true, ..ArrivalRule::default() };
        let at = |ms| idle(socket(&format!("{POD}:8080"), "10.90.0.9:40000", TIME_WAIT, None), ms);
        // 500 ms between reads, the age 480 or 520 ms more, or 300 ms less (a read's time taken
        // 800 ms late): the same; 1.7 s less: another.
        for same in [2480, 2520, 1700] {
            let found = reads(rule(), &[8080], &[(&[at(2000)], Some(1)), (&[at(same)], Some(1))]);
            assert_eq!(arrived(&found), [0, 0], "{same}");
        }
        let found = reads(rule(), &[8080], &[(&[at(2000)], Some(1)), (&[at(300)], Some(2))]);
        assert_eq!(arrived(&found), [0, 1]);
    }

    #[test]
    fn passive_opens_is_read_from_the_snmp_table_by_its_header() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RtoMin RtoMax MaxConn \
                    ActiveOpens PassiveOpens AttemptFails EstabResets\n\
                    Tcp: 1 200 120000 -1 12 34 0 2\n";
        assert_eq!(passive_opens(snmp), Some(34));
        assert_eq!(passive_opens("Tcp: ActiveOpens\nTcp: 3\n"), None);
        assert_eq!(passive_opens("Tcp: ActiveOpens PassiveOpens\nTcp: 3\n"), None);
    }

    /// How a probe the kubelet sends looks in the pod's table.
    #[derive(Debug, Clone, Copy)]
    enum Probed {
        /// httpGet with `Connection: close`: the app closes first, its end waits in TIME_WAIT.
        Http,
        /// tcpSocket, and grpc (the kubelet's client closes its connection after the health
        /// check's answer): the kubelet closes first, no socket stays in the pod.
        ClosedFirst,
    }

    /// The end of a hold as the policy writes it (`--probe-periods` the probe's period, the
    /// defaults otherwise), on a fake clock, in an idle pod of `rule` 10 minutes old whose only
    /// connections are the kubelet's probes from `from` every `period`, the next `phase` after
    /// the deletion; read by the tracker every 500 ms, each read taking 1 ms.
    fn idle_hold(
        rule: &ArrivalRule,
        from: &str,
        (period, phase): (u64, u64),
        kind: Probed,
    ) -> (crate::wait::End, u64) {
        use crate::config::{Rules, tests::no_mesh};
        use crate::wait::{Sight, Step, Wait};
        let rule =
            ArrivalRule { probe_periods: Some(vec![Duration::from_secs(period)]), ..rule.clone() };
        let rules = Rules {
            min_drain: Duration::from_secs(3),
            deadline: Duration::from_secs(20),
            interval: Duration::from_millis(500),
            settle: Duration::from_millis(500),
            plan: no_mesh(Duration::from_secs(15)),
        };
        let mut tracker =
            Tracker { age: Some(Some(Duration::from_secs(600))), ..Tracker::new(rule, 0) };
        let mut wait = Wait::new(&rules, Duration::ZERO);
        // The probes' times in ms from the deletion, over the pod's life.
        let probes: Vec<i64> = (0..=620 / period as i64)
            .map(|k| phase as i64 + (k - 600 / period as i64) * period as i64 * 1000)
            .filter(|t| *t > -600_000)
            .collect();
        let mut now = Duration::ZERO;
        for _ in 0..1000 {
            match wait.next(now) {
                Step::Sleep(until) => now = until,
                Step::Look(ask) => {
                    let t = now.as_millis() as i64;
                    let done: Vec<i64> = probes.iter().copied().filter(|p| *p <= t).collect();
                    let waiting = done.iter().filter(|p| t - **p < 60_000).map(|&p| {
                        let client = format!("{from}:{}", 30000 + p.rem_euclid(30000));
                        let s = socket(&format!("{POD}:8080"), &client, TIME_WAIT, None);
                        idle(s, (t - p) as u64)
                    });
                    let sockets: Vec<Socket> = match kind {
                        Probed::Http => listening(&[8080]).into_iter().chain(waiting).collect(),
                        Probed::ClosedFirst => listening(&[8080]),
                    };
                    let read = tracker.read(now, &ours(), &sockets, Some(done.len() as u64));
                    let sight = Sight {
                        count: Some(0),
                        arrivals: Some(tracker.total),
                        opened: Some(tracker.opened),
                        before: read.before,
                        newest: read.newest,
                        ..Sight::default()
                    };
                    let started = now;
                    now += Duration::from_millis(1);
                    wait.saw(ask, (started, now), &sight);
                }
                Step::End(end) => return (end, now.as_millis() as u64),
            }
        }
        panic!("the wait never ended");
    }

    #[test]
    fn an_idle_pod_ends_at_its_min_whatever_the_probes_period_phase_and_kind() {
        // Red-team finding 1: the probes' connections still in TIME_WAIT at the first read took
        // their share, so the first probe during the hold was a client's. Every period from 1 to
        // 30 s, the next probe 0 to 1 period after the deletion, in tenths; without a mesh (from
        // the node) and in ambient mode (from 169.254.7.127).
        use crate::outcome::Outcome;
        let none = ArrivalRule {
            probes: vec![end("10.90.0.1:0").ip],
            passive_opens: true,
            ..ArrivalRule::default()
        };
        let cases = [(&none, "10.90.0.1"), (&ambient(), "169.254.7.127")];
        let mut held = Vec::new();
        for (rule, from) in cases {
            for period in 1..=30 {
                for tenth in 0..10 {
                    for kind in [Probed::Http, Probed::ClosedFirst] {
                        let phase = period * 100 * tenth;
                        let (end, at) = idle_hold(rule, from, (period, phase), kind);
                        if end.outcome != Outcome::Reached || at > 3100 {
                            held.push(format!("{from} {kind:?} every {period}s, next at {phase}ms: {end:?} at {at}ms"));
                        }
                    }
                }
            }
        }
        assert!(held.is_empty(), "{} of 1200 held:\n{}", held.len(), held.join("\n"));
    }

    #[test]
    fn clusters_recounts_what_the_table_saw_once_and_adds_what_it_alone_saw() {
        let mut both = SidecarArrivals::default();
        let table = |n: u64| (Some(n), 0);
        assert_eq!(both.add(table(0), Some(0)), (Some((0, 0)), false), "the first reads");
        // A pooled connection's bytes at one read; /clusters, its next answer: 20 requests.
        assert_eq!(both.add(table(1), Some(20)), (Some((1, 19)), false));
        assert_eq!(both.add(table(2), None), (Some((2, 19)), false), "between two answers");
        // The table saw some, /clusters none: clients past the sidecar, or a stream's bytes.
        assert_eq!(both.add(table(3), Some(20)), (Some((3, 19)), true));
        // The table cannot tell: what /clusters saw arrives.
        assert_eq!(both.add((None, 0), Some(25)), (Some((8, 19)), false));
        assert_eq!(both.add((None, 0), None), (None, false), "neither told");
        assert_eq!(both.add(table(3), None), (Some((8, 19)), false), "the table's counter again");
        // Four probes through the sidecar, which the table saw and left out: /clusters' four
        // requests are theirs.
        assert_eq!(both.add((Some(3), 4), Some(29)), (Some((8, 19)), false));
        // A probe the table saw before /clusters counted its request: the next answer's.
        assert_eq!(both.add((Some(3), 5), Some(29)), (Some((8, 19)), false));
        assert_eq!(both.add((Some(3), 5), Some(30)), (Some((8, 19)), false));
        // Carried one answer only: a request after that is an arrival.
        assert_eq!(both.add((Some(3), 5), Some(31)), (Some((9, 19)), false));
    }
}
