//! The /clusters parser on any lines, read as each preset's (the first byte picks it): no panic,
//! and a request count that adds up from what the kept clusters hold; the same answer read twice
//! tells of no arrival.
#![no_main]

use envoy_drain::lists::Names;
use envoy_drain::lists::{ISTIO_INFRA_PORTS, PortSet};
use envoy_drain::preset::PRESETS;
use envoy_drain::source::clusters::{Arrived, HostScope, HostTally};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, data)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(data);
    let rule = HostScope {
        preset: PRESETS[usize::from(pick) % PRESETS.len()],
        ignore_clusters: Names::parse("exporter*,x").expect("the names parse"),
        ignore_ports: PortSet::parse(ISTIO_INFRA_PORTS).expect("the default list parses"),
        app_only: pick & 0x80 != 0,
    };
    let mut tally = HostTally::default();
    for line in text.lines() {
        tally.add_line(line, &rule);
    }
    if let Ok(a) = tally.finish() {
        let parts: u64 = a.count.parts.iter().map(|p| p.active).sum();
        assert_eq!(a.count.total, parts);
        let kept = a
            .clusters
            .iter()
            .filter(|c| c.left_out.is_none())
            .fold(0u64, |sum, c| sum.saturating_add(c.requests));
        assert_eq!(a.count.total, kept, "every counted request is in a kept cluster");
        let mut arrived = Arrived::default();
        let first = arrived.add(a.counters.clone());
        assert_eq!(arrived.add(a.counters), first, "the same answer twice: nothing arrived");
    }
});
