//! The socket-table rule on any lines, with Envoy known by process, by owner or not at all: no
//! panic, a count that adds up, and every parsed socket in a state the rule reads (LISTEN,
//! ESTABLISHED, SYN_SENT, SYN_RECV, CLOSE_WAIT) either counted or listed with why not; what the
//! accepted ones still deliver or await told of no more sockets than there are.
#![no_main]

use envoy_drain::config::Filter;
use envoy_drain::count::Basis;
use envoy_drain::lists::{ISTIO_INFRA_PORTS, PortSet};
use envoy_drain::source::procnet::{
    Accepted, DEFAULT_EPHEMERAL, Endpoint, Listeners, TableFacts, Sink, Table, SocketTally, parse_line,
};
use libfuzzer_sys::fuzz_target;

/// Counts a whole table, remembering the listeners seen, as the socket table's count does.
fn count(table: &Table, rule: &TableFacts<'_>, listeners: &mut Listeners) -> envoy_drain::count::Count {
    listeners.learn(table, rule);
    let listened: Vec<Endpoint> = table.listening().iter().map(|s| s.local).collect();
    let accepted = Accepted { listened: &listened, ignore: &rule.filter.ignore, proxy: 1337 };
    let mut tally = SocketTally::new(table, Some((*rule, listeners)), false, Some(accepted));
    for s in &table.sockets {
        tally.add(*s);
    }
    let busy = tally.busy();
    let n = table.sockets.len() as u64;
    assert!(busy.delivering <= n && busy.awaiting <= n, "{busy:?} of {n} sockets");
    tally.count(|| None).0
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let filter = Filter {
        ignore: PortSet::parse(ISTIO_INFRA_PORTS).expect("the default list parses"),
        only: None,
    };
    let mut table = Table::default();
    let mut parsed = 0u64;
    for line in text.lines() {
        if parse_line(line).is_some_and(|s| matches!(s.state, 1 | 2 | 3 | 8 | 10)) {
            parsed += 1;
        }
        table.add_line(line);
    }
    let mut some_inodes: Vec<u64> =
        table.sockets.iter().map(|s| s.inode).filter(|i| i % 2 == 0).collect();
    some_inodes.sort_unstable();
    let (admin, why) = (String::new(), String::new());
    let owner = |uid| (Basis::Owner { uid, admin: admin.clone(), why: why.clone().into() }, vec![]);
    let envoys = [
        (Basis::Unknown { admin: admin.clone(), not_envoy: None }, vec![]),
        owner(1337),
        owner(0),
        (Basis::Process { pid: 1, uid: 0, admin: admin.clone() }, some_inodes),
    ];
    let mut listeners = Listeners::default();
    for (envoy, inodes) in &envoys {
        let rule = TableFacts { filter: &filter, envoy, inodes, ephemeral: &DEFAULT_EPHEMERAL };
        let c = count(&table, &rule, &mut listeners);
        let counted: u64 = c.parts.iter().map(|p| p.active).sum();
        let left_out: u64 = c.excluded.iter().map(|e| e.n).sum();
        assert_eq!(c.total, counted);
        assert_eq!(counted + left_out, parsed, "every socket counted or explained");
    }
});
