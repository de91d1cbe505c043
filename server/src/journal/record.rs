//! One journal record: `u32` LE payload length, `u32` LE CRC-32 of the payload, the payload (a
//! usage event as JSON). A record cut short by a crash, or whose checksum does not match, ends
//! the readable part of a segment: it is detected and dropped, never misread.

use crate::usage::UsageEvent;

/// Bytes before the payload.
const HEADER: usize = 8;
/// Larger payloads are corruption, not events.
const MAX_PAYLOAD: usize = 64 * 1024;

/// Encodes an event as a record.
pub fn encode(event: &UsageEvent) -> serde_json::Result<Vec<u8>> {
    Ok(frame(&serde_json::to_vec(event)?))
}

/// Frames a payload: length, checksum, payload (the journal's and the in-flight log's records).
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(
        &u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
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
        Frame::Whole { payload, len } => match serde_json::from_slice(payload) {
            Ok(event) => Decoded::Record {
                event: Box::new(event),
                len,
            },
            Err(_) => Decoded::Corrupt,
        },
        Frame::Incomplete => Decoded::Incomplete,
        Frame::Corrupt => Decoded::Corrupt,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::usage::{Provenance, UsageStatus};

    pub fn event(n: u8) -> UsageEvent {
        UsageEvent {
            request_id: uuid::Uuid::now_v7(),
            tenant_id: uuid::Uuid::nil(),
            api_key_id: None,
            served_name: format!("m{n}"),
            base_model: "b".into(),
            adapter: None,
            graph: "g".into(),
            price_key: "b".into(),
            prompt_tokens: i64::from(n),
            cached_tokens: 0,
            completion_tokens: 2,
            reasoning_tokens: 0,
            endpoint: crate::endpoint::Endpoint::Chat,
            provenance: Provenance::Engine,
            status: UsageStatus::Ok,
            stream: true,
            ttft_ms: Some(3),
            duration_ms: 9,
            started_at: time::OffsetDateTime::now_utc()
                .replace_nanosecond(0)
                .unwrap(),
        }
    }

    #[test]
    fn round_trips_and_detects_every_torn_or_flipped_byte() {
        let e = event(7);
        let rec = encode(&e).unwrap();
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
