//! The /proc/net/tcp parser on any lines: no panic, a count that adds up, and never more
//! connections than socket lines.
#![no_main]

use envoy_drain::ports::{ISTIO_INFRA_PORTS, PortSet};
use envoy_drain::procnet::{Filter, Tally, parse_line};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let filter = Filter {
        ignore: PortSet::parse(ISTIO_INFRA_PORTS).expect("the default list parses"),
        only: None,
    };
    let mut tally = Tally::default();
    let mut sockets = 0u64;
    for line in text.lines() {
        if parse_line(line).is_some() {
            sockets += 1;
        }
        tally.add_line(line, &filter);
    }
    let count = tally.finish();
    let sum: u64 = count.parts.iter().map(|p| p.active).sum();
    assert_eq!(count.total, sum);
    assert!(count.total <= sockets);
});
