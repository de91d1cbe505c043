//! One journal record: `u32` LE payload length, `u32` LE CRC-32 of the payload, the payload (a
//! usage event: binary, [`super::codec`]; records an older binary wrote hold JSON, still read).
//! A record cut short by a crash, or whose checksum does not match, ends the readable part of a
//! segment: it is detected and dropped, never misread.

use super::codec;
use crate::usage::UsageEvent;

/// Bytes before the payload.
const HEADER: usize = 8;
/// Larger payloads are corruption, not events.
const MAX_PAYLOAD: usize = 64 * 1024;

/// Encodes an event as a record.
pub fn encode(event: &UsageEvent) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    frame_into(&mut out, |out| {
        out.push(EVENT);
        codec::put_event(out, event);
    });
    out
}

/// The first byte of a binary event payload (below `{`, which starts an older binary's JSON).
const EVENT: u8 = 1;

/// The event in a payload: binary, or the JSON of an older binary.
fn event_from(payload: &[u8]) -> Option<UsageEvent> {
    match payload.first() {
        Some(b'{') => serde_json::from_slice(payload).ok(),
        Some(&EVENT) => {
            let mut r = codec::Reader::new(&payload[1..]);
            codec::get_event(&mut r).filter(|_| r.is_empty())
        }
        _ => None,
    }
}

/// Appends a record (length, checksum, payload: the journal's and the in-flight log's records) to
/// `out`, its payload written in place by `put` (no buffer of its own).
pub fn frame_into(out: &mut Vec<u8>, put: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.extend_from_slice(&[0; HEADER]);
    put(out);
    let payload = &out[at + HEADER..];
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let crc = crc32fast::hash(payload);
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
    out[at + 4..at + HEADER].copy_from_slice(&crc.to_le_bytes());
}

/// What the bytes at the start of a buffer hold, framing only.
#[derive(Debug, PartialEq)]
pub enum Frame<'a> {
    /// A whole record with a valid checksum, `len` bytes in all.
    Whole {
        payload: &'a [u8],
        len: usize,
    },
    Incomplete,
    Corrupt,
}

pub fn unframe(buf: &[u8]) -> Frame<'_> {
    if buf.len() < HEADER {
        return Frame::Incomplete;
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let crc = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    if len == 0 || len > MAX_PAYLOAD {
        return Frame::Corrupt;
    }
    let Some(payload) = buf.get(HEADER..HEADER + len) else {
        return Frame::Incomplete;
    };
    if crc32fast::hash(payload) != crc {
        return Frame::Corrupt;
    }
    Frame::Whole {
        payload,
        len: HEADER + len,
    }
}

/// What decoding the bytes at the start of a buffer found.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    /// A whole, valid record of `len` bytes.
    Record { event: Box<UsageEvent>, len: usize },
    /// The buffer ends inside a record (a torn tail, or more bytes to read).
    Incomplete,
    /// The bytes are not a valid record.
    Corrupt,
}

pub fn decode(buf: &[u8]) -> Decoded {
    match unframe(buf) {
        Frame::Whole { payload, len } => match event_from(payload) {
            Some(event) => Decoded::Record {
                event: Box::new(event),
                len,
            },
            None => Decoded::Corrupt,
        },
        Frame::Incomplete => Decoded::Incomplete,
        Frame::Corrupt => Decoded::Corrupt,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::codec::tests::event;

    #[test]
    fn round_trips_and_detects_every_torn_or_flipped_byte() {
        let e = event(7);
        let rec = encode(&e);
        assert_eq!(
            decode(&rec),
            Decoded::Record {
                event: Box::new(e),
                len: rec.len()
            }
        );
        for cut in 0..rec.len() {
            assert_eq!(decode(&rec[..cut]), Decoded::Incomplete, "cut at {cut}");
        }
        for i in 0..rec.len() {
            let mut bad = rec.clone();
            bad[i] ^= 0x40;
            assert!(
                !matches!(decode(&bad), Decoded::Record { .. }),
                "flip at {i} misread"
            );
        }
    }

    /// Records written before the binary format (the whole event as JSON) still replay.
    #[test]
    fn a_json_record_replays() {
        let e = event(4);
        let payload = serde_json::to_vec(&e).unwrap();
        let mut rec = Vec::new();
        frame_into(&mut rec, |out| out.extend_from_slice(&payload));
        assert_eq!(
            decode(&rec),
            Decoded::Record {
                event: Box::new(e),
                len: rec.len()
            }
        );
    }

    /// Issue 32: a record written by a binary before events named their endpoint and reasoning
    /// tokens still replays (as chat, no reasoning).
    #[test]
    fn a_record_from_an_older_binary_replays() {
        let original = event(3);
        let mut json = serde_json::to_value(&original).unwrap();
        let fields = json.as_object_mut().unwrap();
        fields.remove("endpoint").unwrap();
        fields.remove("reasoning_tokens").unwrap();
        let payload = serde_json::to_vec(&json).unwrap();
        let mut rec = Vec::new();
        rec.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_le_bytes());
        rec.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        rec.extend_from_slice(&payload);
        match decode(&rec) {
            Decoded::Record { event: e, .. } => {
                assert_eq!(e.endpoint, crate::endpoint::Endpoint::Chat);
                assert_eq!(e.reasoning_tokens, 0);
                assert_eq!(*e, original);
            }
            other => panic!("{other:?}"),
        }
    }
}
