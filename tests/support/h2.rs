//! Just enough HTTP/2 framing (RFC 9113, section 6) for the tests' bare client (support/http.rs)
//! and the stand-in agent's ADS server (support/agent.rs): writing and reading one frame, HPACK
//! literals, and the acknowledgements both peers owe.

use std::io::{self, Read, Write};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

pub fn read_frame(r: &mut impl Read) -> io::Result<Frame> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head)?;
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0; len];
    r.read_exact(&mut payload)?;
    Ok(Frame {
        kind: head[3],
        flags: head[4],
        stream: u32::from_be_bytes([head[5] & 0x7f, head[6], head[7], head[8]]),
        payload,
    })
}

/// Acknowledges the peer's SETTINGS and PING, as every endpoint must.
pub fn acknowledge(f: &Frame, w: &mut impl Write) -> io::Result<()> {
    match f.kind {
        SETTINGS if f.flags & ACK == 0 => w.write_all(&frame(SETTINGS, ACK, 0, &[])),
        PING if f.flags & ACK == 0 => w.write_all(&frame(PING, ACK, 0, &f.payload)),
        _ => Ok(()),
    }
}

/// An HPACK literal header without indexing, its name from the static table.
pub fn literal(name_index: u8, value: &str) -> Vec<u8> {
    let mut b = vec![name_index, value.len() as u8];
    b.extend_from_slice(value.as_bytes());
    b
}
