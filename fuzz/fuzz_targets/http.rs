//! The admin client's reading of an answer (status line, headers, length, chunks, lines) on any
//! bytes: no panic, the caps hold, and the body read whole and line by line agree.
#![no_main]

use envoy_drain::source::admin;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut streamed = String::new();
    let (whole, lines) = admin::replay(data, |l| streamed.push_str(l));
    let Ok(reply) = whole else {
        return;
    };
    assert!(reply.body.len() as u64 <= admin::BODY_LIMIT);
    let Ok(text) = std::str::from_utf8(&reply.body) else {
        return;
    };
    // Lines are cut at 4,096 bytes; shorter ones arrive as they were sent.
    if reply.status == 200 && text.split_inclusive('\n').all(|l| l.len() <= 4096) {
        assert_eq!(lines, Ok(()));
        assert_eq!(streamed, text);
    }
});
