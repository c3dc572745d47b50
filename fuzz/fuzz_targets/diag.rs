//! The sock_diag reply parser on any bytes, as the datagrams of one dump: no panic, only the
//! states the rule reads, and after the readers' clean-up no socket twice.
#![no_main]

use envoy_drain::source::diag;
use envoy_drain::source::procnet::Table;
use libfuzzer_sys::fuzz_target;

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
    diag::own_requests(&mut table);
    table.dedup();
    let mut keys: Vec<_> = table.sockets.iter().map(|s| (s.local, s.remote, s.inode)).collect();
    keys.dedup();
    assert_eq!(keys.len(), table.sockets.len());
});
