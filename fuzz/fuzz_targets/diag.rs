//! The sock_diag reply parser on any bytes, as the datagrams of one dump: no panic, only the
//! states the rule reads, and the same sockets whether kept as a table or counted as they come.
//! A count's view of what is still delivered or awaited never exceeds the sockets.
#![no_main]

use envoy_drain::config::Filter;
use envoy_drain::count::Basis;
use envoy_drain::lists::PortSet;
use envoy_drain::source::diag;
use envoy_drain::source::procnet::{
    Accepted, DEFAULT_EPHEMERAL, Endpoint, Listeners, TableFacts, Sink, Table, SocketTally,
};
use libfuzzer_sys::fuzz_target;

/// Counts a whole table, remembering the listeners seen, as the socket table's count does.
fn count(table: &Table, rule: &TableFacts<'_>, listeners: &mut Listeners) -> envoy_drain::count::Count {
    listeners.learn(table, rule);
    let mut tally = SocketTally::new(table, Some((*rule, listeners)), false, None);
    for s in &table.sockets {
        tally.add(*s);
    }
    tally.count(|| None).0
}

fuzz_target!(|data: &[u8]| {
    let mut table = Table::default();
    // The first byte splits the input into datagrams of up to 1 + 4 * it bytes.
    let Some((&size, rest)) = data.split_first() else {
        return;
    };
    for datagram in rest.chunks(1 + 4 * usize::from(size)) {
        match diag::parse(datagram, 1, &mut table) {
            Ok(false) => {}
            Ok(true) | Err(_) => break,
        }
    }
    assert!(table.sockets.iter().all(|s| matches!(s.state, 1 | 2 | 3 | 8 | 10)));
    // Counted from the whole table, and counted as a stream beside its listening sockets.
    let filter = Filter { ignore: PortSet::default(), only: None };
    let envoy = Basis::Owner { uid: 1337, admin: String::new(), why: String::new().into() };
    let rule = TableFacts { filter: &filter, envoy: &envoy, inodes: &[], ephemeral: &DEFAULT_EPHEMERAL };
    let mut listeners = Listeners::default();
    let whole = count(&table, &rule, &mut listeners);
    // What the accepted ones still deliver or await, told of no more sockets than there are.
    let listened: Vec<Endpoint> = table.listening().iter().map(|s| s.local).collect();
    let accepted = Accepted { listened: &listened, ignore: &filter.ignore, proxy: 1337 };
    let mut tally = SocketTally::new(&table, Some((rule, &listeners)), true, Some(accepted));
    for s in &table.sockets {
        tally.add(*s);
    }
    let (busy, n) = (tally.busy(), table.sockets.len() as u64);
    assert!(busy.delivering <= n && busy.awaiting <= n, "{busy:?} of {n} sockets");
    let (streamed, _) = tally.count(|| None);
    assert_eq!(whole, streamed);
});
