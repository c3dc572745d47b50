//! The flag value parsers (durations, port lists, addresses) on any text: no panic, and what they
//! accept is usable; a pod's annotation or Istio's MINIMUM_DRAIN_DURATION, whatever it holds, is
//! never an error.
#![no_main]

use envoy_drain::cli::RunArgs;
use envoy_drain::config::{parse_addr, parse_duration};
use envoy_drain::run::config::run_config;
use envoy_drain::lists::PortSet;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(addr) = parse_addr("--admin", value) {
        assert_ne!(addr.port(), 0);
    } else {
        let e = parse_addr("--admin", value).unwrap_err().to_string();
        assert!(e.starts_with("invalid value '") && e.contains("for --admin"));
    }
    let _ = parse_duration("--deadline", value);
    if let Ok(set) = PortSet::parse(value) {
        assert!(!set.contains(0));
    }
    let annotated = RunArgs {
        pod_annotation: vec![value.to_string(), format!("envoy-drain.io/deadline={value}")],
        ..RunArgs::default()
    };
    assert!(run_config(&annotated, &|_| None).is_ok());
    // Istio's MINIMUM_DRAIN_DURATION, whatever it holds, is never an error either.
    let env = |k: &str| (k == "MINIMUM_DRAIN_DURATION").then(|| value.to_string());
    assert!(run_config(&RunArgs::default(), &env).is_ok());
});
