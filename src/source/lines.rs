//! Text read in chunks and handed on line by line, so that neither an admin answer (/clusters runs
//! to hundreds of megabytes) nor a text socket table is ever held whole; and the numbers in them.

use std::io::{self, ErrorKind, Read};

/// Reads `from` to its end and hands `each` every line without its end, bytes that are not UTF-8
/// replaced, cut at `max` bytes (`cut`). Stops at the first error, `each`'s or `read_error`'s.
pub(crate) fn each_line<E>(
    mut from: impl Read,
    max: usize,
    mut each: impl FnMut(&str, bool) -> Result<(), E>,
    read_error: impl Fn(io::Error) -> E,
) -> Result<(), E> {
    let mut line: Vec<u8> = Vec::with_capacity(max.min(4096));
    let mut cut = false;
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_error(e)),
        };
        for part in chunk[..n].split_inclusive(|b| *b == b'\n') {
            let text = part.strip_suffix(b"\n").unwrap_or(part);
            let room = max.saturating_sub(line.len());
            cut |= text.len() > room;
            line.extend_from_slice(&text[..text.len().min(room)]);
            if part.ends_with(b"\n") {
                each(&String::from_utf8_lossy(&line), std::mem::take(&mut cut))?;
                line.clear();
            }
        }
    }
    if !line.is_empty() || cut {
        each(&String::from_utf8_lossy(&line), cut)?;
    }
    Ok(())
}

/// A count in digits only, as the kernel and Envoy print them (`from_str` also takes a `+`).
pub(crate) fn decimal(field: &str) -> Option<u64> {
    if field.bytes().all(|b| b.is_ascii_digit()) { field.parse().ok() } else { None }
}
