//! The /stats body parsers (connections, and requests) on any text: no panic, and counts that add
//! up.
#![no_main]

use envoy_drain::lists::{ISTIO_INFRA_PORTS, PortSet};
use envoy_drain::preset::ISTIO;
use envoy_drain::source::stats::Lines;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = std::str::from_utf8(data) else {
        return;
    };
    let ignore = PortSet::parse(ISTIO_INFRA_PORTS).expect("the default list parses");
    let mut lines = Lines::new(&ignore, ISTIO);
    body.lines().for_each(|l| lines.add(l));
    let connections = lines.connections();
    if let Ok((count, hcms)) =
        connections.as_ref().map_err(Clone::clone).and_then(|c| lines.requests(c))
    {
        let sum = count.parts.iter().map(|p| p.active).fold(0u64, u64::saturating_add);
        assert_eq!(count.total, sum);
        assert_eq!(count.parts.len(), hcms.len() + 1, "one part per manager, and the non-HTTP one");
        assert!(connections.is_ok(), "requests need the connection stats too");
    }
    if let Ok(count) = connections {
        let sum = count.parts.iter().map(|p| p.active).fold(0u64, u64::saturating_add);
        assert_eq!(count.total, sum);
        for p in &count.parts {
            assert!(!p.name.is_empty());
            assert!(p.name != "admin" && !p.name.starts_with("envoy_internal_"));
            assert!(p.active <= 1 << 63, "wrapped gauges count as 0");
        }
    }
});
