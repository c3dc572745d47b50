//! Interprets `/proc/net/tcp` and `/proc/net/tcp6` lines the way netstat does (pure: lines in,
//! count out). The format is in REFERENCE.md, section 4.

use crate::count::{Count, Part, SourceKind};
use crate::ports::PortSet;
use std::collections::HashMap;

const ESTABLISHED: u8 = 0x01;
const SYN_SENT: u8 = 0x02;
const SYN_RECV: u8 = 0x03;
const CLOSE_WAIT: u8 = 0x08;
const LISTEN: u8 = 0x0A;

/// An address and port; IPv4 is kept in its IPv4-mapped IPv6 form so that both ends of a
/// connection compare equal whichever table shows them.
type Endpoint = ([u8; 16], u16);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Socket {
    pub local: Endpoint,
    pub remote: Endpoint,
    pub state: u8,
}

/// Parses one line of either table; `None` for the header and for anything malformed.
pub fn parse_line(line: &str) -> Option<Socket> {
    let mut fields = line.split_ascii_whitespace();
    let slot = fields.next()?;
    if !slot.ends_with(':') {
        return None;
    }
    let local = endpoint(fields.next()?)?;
    let remote = endpoint(fields.next()?)?;
    let state = u8::from_str_radix(fields.next()?, 16).ok()?;
    Some(Socket {
        local,
        remote,
        state,
    })
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
    let mut bytes = [0u8; 16];
    match addr.len() {
        8 => {
            bytes[10] = 0xff;
            bytes[11] = 0xff;
            bytes[12..].copy_from_slice(&word(0)?);
        }
        32 => {
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
        }
        _ => return None,
    }
    Some((bytes, port))
}

/// Which sockets count: not those on an ignored port (either end), and with `--ports` only those
/// whose local port is listed.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub ignore: PortSet,
    pub only: Option<PortSet>,
}

/// One connection as counted: the ports of the first end seen, and whether its other end is in
/// the table too (a connection between two local sockets).
struct Seen {
    local: u16,
    remote: u16,
    both_ends: bool,
}

/// Adds up lines from both tables; `finish` turns them into a count.
#[derive(Default)]
pub struct Tally {
    connections: HashMap<(Endpoint, Endpoint), Seen>,
    listening: Vec<u16>,
    bad_lines: usize,
}

impl Tally {
    pub fn add_line(&mut self, line: &str, filter: &Filter) {
        let Some(s) = parse_line(line) else {
            if !is_header(line) {
                self.bad_lines += 1;
            }
            return;
        };
        if s.state == LISTEN {
            self.listening.push(s.local.1);
            return;
        }
        if !matches!(s.state, ESTABLISHED | SYN_SENT | SYN_RECV | CLOSE_WAIT)
            || filter.ignore.contains(s.local.1)
            || filter.ignore.contains(s.remote.1)
            || filter.only.as_ref().is_some_and(|o| !o.contains(s.local.1))
        {
            return;
        }
        // Both ends of a local connection are in the table, mirrored: count the pair once.
        let key = if s.local <= s.remote {
            (s.local, s.remote)
        } else {
            (s.remote, s.local)
        };
        self.connections
            .entry(key)
            .and_modify(|c| c.both_ends = true)
            .or_insert(Seen {
                local: s.local.1,
                remote: s.remote.1,
                both_ends: false,
            });
    }

    /// Groups connections by the listening port that accepted them (`port 15006`); the ones this
    /// namespace opened itself are grouped by the port they go to (`outgoing to port 443`).
    pub fn finish(mut self) -> Count {
        self.listening.sort_unstable();
        let listens = |p: u16| self.listening.binary_search(&p).is_ok();
        // Listening ports first, then outgoing, each by port number.
        let mut by_port: HashMap<(bool, u16), u64> = HashMap::new();
        for c in self.connections.values() {
            let key = if listens(c.local) {
                (false, c.local)
            } else if c.both_ends && listens(c.remote) {
                (false, c.remote)
            } else {
                (true, c.remote)
            };
            *by_port.entry(key).or_default() += 1;
        }
        let mut keys: Vec<_> = by_port.into_iter().collect();
        keys.sort_unstable();
        let parts = keys
            .into_iter()
            .map(|((outgoing, port), active)| Part {
                name: if outgoing {
                    format!("outgoing to port {port}")
                } else {
                    format!("port {port}")
                },
                active,
            })
            .collect();
        let warnings = match self.bad_lines {
            0 => vec![],
            n => vec![format!("skipped {n} socket table lines that did not parse")],
        };
        Count::new(SourceKind::Proc, parts, warnings)
    }
}

fn is_header(line: &str) -> bool {
    let t = line.trim_start();
    t.is_empty() || t.starts_with("sl ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode";
    const HEADER6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode";

    fn v4(n: u32, local: &str, remote: &str, st: &str) -> String {
        format!(
            "   {n}: {local} {remote} {st} 00000000:00000000 00:00000000 00000000     0        0 {} 1 0000000000000000 20 4 30 10 -1",
            1000 + n
        )
    }

    /// IPv4 as `a.b.c.d`, IPv6 in its usual form.
    fn show(e: &Endpoint) -> String {
        let v6 = std::net::Ipv6Addr::from(e.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => format!("{v4}:{}", e.1),
            None => format!("[{v6}]:{}", e.1),
        }
    }

    fn count(lines: &[String], filter: &Filter) -> Count {
        let mut t = Tally::default();
        for l in lines {
            t.add_line(l, filter);
        }
        t.finish()
    }

    fn istio() -> Filter {
        Filter {
            ignore: PortSet::parse(crate::ports::ISTIO_INFRA_PORTS).unwrap(),
            only: None,
        }
    }

    fn parts(c: &Count) -> Vec<(&str, u64)> {
        c.parts
            .iter()
            .map(|p| (p.name.as_str(), p.active))
            .collect()
    }

    #[test]
    fn ipv4_addresses_and_ports_decode() {
        let s = parse_line(&v4(0, "0100007F:3A98", "0200A8C0:C350", "01")).unwrap();
        assert_eq!(show(&s.local), "127.0.0.1:15000");
        assert_eq!(show(&s.remote), "192.168.0.2:50000");
        assert_eq!(s.state, ESTABLISHED);
    }

    #[test]
    fn ipv6_and_mapped_addresses_decode() {
        let line = "   0: 00000000000000000000000001000000:3AAE 0000000000000000FFFF00000100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 20 4 30 10 -1";
        let s = parse_line(line).unwrap();
        assert_eq!(show(&s.local), "[::1]:15022");
        assert_eq!(
            show(&s.remote),
            "127.0.0.1:54321",
            "mapped addresses read as IPv4"
        );
        let global = "   1: B80D0120000000000000000001000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4243 1";
        assert_eq!(show(&parse_line(global).unwrap().local), "[2001:db8::1]:80");
    }

    #[test]
    fn headers_and_garbage_do_not_parse() {
        assert_eq!(parse_line(HEADER), None);
        assert_eq!(parse_line(HEADER6), None);
        assert_eq!(parse_line(""), None);
        assert_eq!(parse_line("   0: 0100007F 0100007F:0050 01"), None);
        assert_eq!(parse_line("   0: 0100007G:0050 0100007F:0050 01"), None);
        assert_eq!(parse_line("   0: 0100007F:10050 0100007F:0050 01"), None);
        assert_eq!(parse_line("   0: 0100007F:0050 0100007F:0050 XYZ"), None);
        assert_eq!(parse_line("   0: 0100:0050 0100007F:0050 01"), None);
        assert_eq!(parse_line("   0: 0100007F:+050 0100007F:0050 01"), None);
    }

    #[test]
    fn only_open_states_count() {
        let states = [
            ("01", true),
            ("02", true),
            ("03", true),
            ("04", false),
            ("05", false),
            ("06", false),
            ("07", false),
            ("08", true),
            ("09", false),
            ("0A", false),
            ("0B", false),
        ];
        for (st, counted) in states {
            let lines = [
                HEADER.to_string(),
                v4(0, "0200000A:1F90", "0300000A:C350", st),
            ];
            let c = count(&lines, &istio());
            assert_eq!(c.total, u64::from(counted), "state {st}");
        }
    }

    #[test]
    fn a_local_connection_counts_once_under_its_listening_port() {
        let lines = [
            HEADER.to_string(),
            v4(0, "0100007F:3A9E", "00000000:0000", "0A"),
            // client side first, then the accepted side: 127.0.0.1:50000 <-> 127.0.0.1:15006
            v4(1, "0100007F:C350", "0100007F:3A9E", "01"),
            v4(2, "0100007F:3A9E", "0100007F:C350", "01"),
        ];
        let c = count(&lines, &istio());
        assert_eq!(parts(&c), vec![("port 15006", 1)]);
    }

    #[test]
    fn a_v4_client_of_a_dual_stack_listener_pairs_across_the_two_tables() {
        let lines = [
            HEADER.to_string(),
            v4(0, "0100007F:C350", "0100007F:1F90", "01"),
            HEADER6.to_string(),
            "   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1".to_string(),
            "   1: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1".to_string(),
        ];
        let c = count(&lines, &istio());
        assert_eq!(parts(&c), vec![("port 8080", 1)]);
    }

    #[test]
    fn connections_this_namespace_opened_group_by_remote_port() {
        let lines = [
            v4(0, "0200000A:C350", "0300000A:01BB", "01"),
            v4(1, "0200000A:C351", "0300000A:01BB", "02"),
            v4(2, "0200000A:0050", "0400000A:D000", "08"),
            v4(3, "0200000A:0050", "00000000:0000", "0A"),
        ];
        let c = count(&lines, &istio());
        assert_eq!(parts(&c), vec![("port 80", 1), ("outgoing to port 443", 2)]);
    }

    #[test]
    fn ignored_ports_at_either_end_do_not_count() {
        let lines = [
            // agent -> istiod xDS, kubelet -> health port, us -> admin
            v4(0, "0200000A:C350", "0300000A:3AA4", "01"),
            v4(1, "0200000A:3AAD", "0400000A:D000", "01"),
            v4(2, "0100007F:C351", "0100007F:3A98", "01"),
            v4(3, "0200000A:3A9E", "0400000A:D001", "01"),
        ];
        assert_eq!(count(&lines, &istio()).total, 1);
        let nothing_ignored = Filter::default();
        assert_eq!(count(&lines, &nothing_ignored).total, 4);
    }

    #[test]
    fn ports_flag_keeps_only_listed_local_ports() {
        let lines = [
            v4(0, "0200000A:3A9E", "0400000A:D001", "01"),
            v4(1, "0200000A:3A99", "0400000A:D002", "01"),
            v4(2, "0200000A:1F90", "0400000A:D003", "01"),
            v4(3, "0200000A:D004", "0400000A:3A9E", "01"),
        ];
        let f = Filter {
            ignore: PortSet::default(),
            only: Some(PortSet::parse("15006,15001").unwrap()),
        };
        let c = count(&lines, &f);
        assert_eq!(c.total, 2, "a remote port 15006 is not a local one");
    }

    #[test]
    fn malformed_lines_are_counted_in_one_warning() {
        let lines = [
            HEADER.to_string(),
            "garbage".to_string(),
            "   9: zz".to_string(),
            v4(0, "0200000A:3A9E", "0400000A:D001", "01"),
        ];
        let c = count(&lines, &istio());
        assert_eq!(c.total, 1);
        assert_eq!(
            c.warnings,
            vec!["skipped 2 socket table lines that did not parse"]
        );
    }
}
