//! Usage events as compact binary payloads: fixed-width integers, UUIDs as 16 bytes, strings
//! length-prefixed, the start instant as Unix nanoseconds. Written on every request (the
//! in-flight start), so it is cheaper than JSON by an order: no escaping, no number or date
//! formatting, no allocation beyond the output buffer (issue 35).
//!
//! A binary payload starts with a format byte below `{`, so a reader tells it from the JSON that
//! older binaries wrote by its first byte and reads both. The codes of enums are fixed here, not
//! taken from declaration order, so reordering a Rust enum never changes what a record means.

use time::OffsetDateTime;
use uuid::Uuid;

use crate::endpoint::Endpoint;
use crate::usage::{Provenance, UsageEvent, UsageStatus};

/// Appends `e`.
pub fn put_event(out: &mut Vec<u8>, e: &UsageEvent) {
    out.extend_from_slice(e.request_id.as_bytes());
    out.extend_from_slice(e.tenant_id.as_bytes());
    put_opt(out, e.api_key_id, |out, id| {
        out.extend_from_slice(id.as_bytes())
    });
    put_str(out, &e.served_name);
    put_str(out, &e.base_model);
    put_opt(out, e.adapter.as_deref(), put_str);
    put_str(out, &e.graph);
    put_str(out, &e.price_key);
    for n in [
        e.prompt_tokens,
        e.cached_tokens,
        e.completion_tokens,
        e.reasoning_tokens,
    ] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    // The codes are the record format: matched exhaustively, so a new variant must be given
    // one; never renumbered.
    out.push(endpoint_code(e.endpoint));
    out.push(match e.provenance {
        Provenance::Engine => 0,
        Provenance::Partial => 1,
        Provenance::Estimated => 2,
    });
    out.push(match e.status {
        UsageStatus::Ok => 0,
        UsageStatus::ClientAbort => 1,
        UsageStatus::UpstreamError => 2,
        UsageStatus::Interrupted => 3,
        UsageStatus::Rejected => 4,
    });
    out.push(u8::from(e.stream));
    put_opt(out, e.ttft_ms, |out, t| {
        out.extend_from_slice(&t.to_le_bytes())
    });
    out.extend_from_slice(&e.duration_ms.to_le_bytes());
    out.extend_from_slice(&e.started_at.unix_timestamp_nanos().to_le_bytes());
}

/// Reads an event written by [`put_event`]; `None` if the bytes are not one.
pub fn get_event(r: &mut Reader<'_>) -> Option<UsageEvent> {
    Some(UsageEvent {
        request_id: r.uuid()?,
        tenant_id: r.uuid()?,
        api_key_id: r.opt(Reader::uuid)?,
        served_name: r.string()?,
        base_model: r.string()?,
        adapter: r.opt(Reader::string)?,
        graph: r.string()?,
        price_key: r.string()?,
        prompt_tokens: r.i64()?,
        cached_tokens: r.i64()?,
        completion_tokens: r.i64()?,
        reasoning_tokens: r.i64()?,
        endpoint: match r.u8()? {
            0 => Endpoint::Chat,
            1 => Endpoint::Completions,
            2 => Endpoint::Responses,
            3 => Endpoint::Embeddings,
            4 => Endpoint::Messages,
            _ => return None,
        },
        provenance: match r.u8()? {
            0 => Provenance::Engine,
            1 => Provenance::Partial,
            2 => Provenance::Estimated,
            _ => return None,
        },
        status: match r.u8()? {
            0 => UsageStatus::Ok,
            1 => UsageStatus::ClientAbort,
            2 => UsageStatus::UpstreamError,
            3 => UsageStatus::Interrupted,
            4 => UsageStatus::Rejected,
            _ => return None,
        },
        stream: match r.u8()? {
            0 => false,
            1 => true,
            _ => return None,
        },
        ttft_ms: r.opt(|r| Some(i32::from_le_bytes(r.array()?)))?,
        duration_ms: i32::from_le_bytes(r.array()?),
        started_at: OffsetDateTime::from_unix_timestamp_nanos(i128::from_le_bytes(r.array()?))
            .ok()?,
    })
}

fn endpoint_code(e: Endpoint) -> u8 {
    match e {
        Endpoint::Chat => 0,
        Endpoint::Completions => 1,
        Endpoint::Responses => 2,
        Endpoint::Embeddings => 3,
        Endpoint::Messages => 4,
    }
}

/// Appends an option: a presence byte, then the value if there is one.
pub fn put_opt<T>(out: &mut Vec<u8>, v: Option<T>, put: impl FnOnce(&mut Vec<u8>, T)) {
    match v {
        Some(v) => {
            out.push(1);
            put(out, v);
        }
        None => out.push(0),
    }
}

/// Appends `n` (read back by [`Reader::u64`]).
pub fn put_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(&n.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&u32::try_from(s.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Reads a payload front to back; every read is `None` past its end.
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    /// True when every byte was read (a payload with bytes left over is not well formed).
    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.rest.split_at_checked(n)?;
        self.rest = rest;
        Some(head)
    }

    pub fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    pub fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.array()?))
    }

    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.array()?))
    }

    pub fn uuid(&mut self) -> Option<Uuid> {
        Some(Uuid::from_bytes(self.array()?))
    }

    /// Reads an option written by [`put_opt`]; `None` if the bytes are not one.
    pub fn opt<T>(&mut self, get: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        match self.u8()? {
            0 => Some(None),
            1 => get(self).map(Some),
            _ => None,
        }
    }

    fn string(&mut self) -> Option<String> {
        let len = u32::from_le_bytes(self.array()?) as usize;
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).ok().map(str::to_owned)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An event for the journal's tests.
    pub fn event(n: u8) -> UsageEvent {
        UsageEvent {
            request_id: Uuid::now_v7(),
            tenant_id: Uuid::nil(),
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
            endpoint: Endpoint::Chat,
            provenance: Provenance::Engine,
            status: UsageStatus::Ok,
            stream: true,
            ttft_ms: Some(3),
            duration_ms: 9,
            started_at: OffsetDateTime::now_utc().replace_nanosecond(0).unwrap(),
        }
    }

    #[test]
    fn every_field_round_trips_and_every_cut_is_refused() {
        let mut e = event(9);
        e.adapter = Some("support-bot".into());
        e.api_key_id = Some(Uuid::now_v7());
        e.endpoint = Endpoint::Messages;
        e.status = UsageStatus::ClientAbort;
        e.reasoning_tokens = 5;
        e.started_at = OffsetDateTime::now_utc();
        for e in [e, event(1)] {
            let mut out = Vec::new();
            put_event(&mut out, &e);
            let mut r = Reader::new(&out);
            assert_eq!(get_event(&mut r).as_ref(), Some(&e));
            assert!(r.is_empty());
            assert_eq!(
                e.started_at,
                get_event(&mut Reader::new(&out)).unwrap().started_at
            );
            for cut in 0..out.len() {
                assert_eq!(
                    get_event(&mut Reader::new(&out[..cut])),
                    None,
                    "cut at {cut}"
                );
            }
        }
    }

    /// The codes are the record format: they must never follow a reordering of the Rust enums.
    #[test]
    fn enum_codes_are_fixed() {
        let codes: Vec<u8> = Endpoint::ALL.iter().map(|e| endpoint_code(*e)).collect();
        assert_eq!(codes, [0, 1, 2, 3, 4]);
        let mut e = event(1);
        e.provenance = Provenance::Estimated;
        e.status = UsageStatus::Rejected;
        let mut out = Vec::new();
        put_event(&mut out, &e);
        // endpoint, provenance, status, stream sit after the four counts.
        let tail = &out[out.len() - (4 + 1 + 4 + 4 + 16)..];
        assert_eq!(&tail[..4], &[0, 2, 4, u8::from(e.stream)]);
    }
}
