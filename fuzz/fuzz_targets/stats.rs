//! The /stats body parser on any text: no panic, and a count that adds up.
#![no_main]

use envoy_drain::ports::{ISTIO_INFRA_PORTS, PortSet};
use envoy_drain::stats;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = std::str::from_utf8(data) else {
        return;
    };
    let ignore = PortSet::parse(ISTIO_INFRA_PORTS).expect("the default list parses");
    if let Ok(answer) = stats::parse(body, &ignore) {
        let count = answer.count;
        let sum = count.parts.iter().map(|p| p.active).fold(0u64, u64::saturating_add);
        assert_eq!(count.total, sum);
        for p in &count.parts {
            assert!(!p.name.is_empty());
            assert!(p.name != "admin" && !p.name.starts_with("envoy_internal_"));
            assert!(p.active <= 1 << 63, "wrapped gauges count as 0");
        }
    }
});
