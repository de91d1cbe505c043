//! Incremental Server-Sent Events parser. Bytes arrive split anywhere (inside a UTF-8 sequence,
//! between `\r` and `\n`); the parser yields each complete event with its exact raw bytes, so an
//! event that needs no change is forwarded byte-identical.
//!
//! Lines end as the SSE spec allows: `\r\n`, `\n` or a lone `\r` (all three are read; an engine
//! or a proxy in front of it may write any). A `\r` that is the last byte read so far ends its
//! line at once (an event is never held back waiting to learn whether `\n` follows); a `\n`
//! arriving next is that line end's second half, skipped (it stays in the next event's raw bytes,
//! so the bytes forwarded are still exactly the bytes received).

use bytes::{Bytes, BytesMut};

/// One complete event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The event exactly as received, including its terminating blank line.
    pub raw: Bytes,
    /// The `data:` lines joined with `\n` (None for comment-only or field-less events).
    pub data: Option<Bytes>,
}

/// Buffers partial input until an event is complete. Events are sliced out of the bytes as read
/// (no copy): a read usually holds whole events, and only an event split across reads is joined.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Bytes,
    /// Where the next line starts (everything before is part of the current, unfinished event).
    line_start: usize,
    /// Data lines of the current event, as ranges into `buf`.
    data: Vec<(usize, usize)>,
    /// The last line ended with a `\r` that was the last byte read: a `\n` next belongs to it.
    skip_lf: bool,
}

impl SseParser {
    pub fn push(&mut self, bytes: Bytes) {
        if self.buf.is_empty() {
            self.buf = bytes;
            return;
        }
        // Appending in place when nothing else holds the buffer keeps a long event that arrives
        // in many reads linear, not quadratic.
        let mut joined = match std::mem::take(&mut self.buf).try_into_mut() {
            Ok(unique) => unique,
            Err(shared) => BytesMut::from(&shared[..]),
        };
        joined.extend_from_slice(&bytes);
        self.buf = joined.freeze();
    }

    /// Bytes received that do not yet form a complete event.
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// At the end of the body: the last event if the engine left out its closing blank line
    /// (`data: [DONE]` then end of stream). Nothing is invented for a body that ended mid-line
    /// with no `data:` field complete. Test: a_last_event_without_its_blank_line_counts.
    pub fn finish(&mut self) -> Option<SseEvent> {
        if self.buf.is_empty() {
            return None;
        }
        // After a line end one more makes the blank line; else the open line needs one too. A
        // `\r` last may still be waiting for its `\n`: `\n\n` completes either way.
        let end: &'static [u8] = if self.buf.ends_with(b"\r") {
            b"\n\n"
        } else if self.buf.ends_with(b"\n") {
            b"\n"
        } else {
            b"\n\n"
        };
        self.push(Bytes::from_static(end));
        let event = self.next_event();
        self.buf = Bytes::new();
        self.line_start = 0;
        self.data.clear();
        self.skip_lf = false;
        event.filter(|e| e.data.is_some())
    }

    /// The next complete event, if one is buffered.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            if self.skip_lf && self.line_start < self.buf.len() {
                self.skip_lf = false;
                if self.buf[self.line_start] == b'\n' {
                    self.line_start += 1;
                    continue;
                }
            }
            // INVARIANT: `\r\n`, `\n` and a lone `\r` all end a line (test:
            // every_line_ending_gives_the_same_events; sse_framing for the whole path).
            let rel = memchr::memchr2(b'\n', b'\r', &self.buf[self.line_start..])?;
            let end = self.line_start + rel;
            let next = if self.buf[end] == b'\n' {
                end + 1
            } else if end + 1 < self.buf.len() {
                end + 1 + usize::from(self.buf[end + 1] == b'\n')
            } else {
                self.skip_lf = true;
                end + 1
            };
            let start = self.line_start;
            self.line_start = next;
            if start == end {
                // Blank line: the event is complete. Its data is sliced out of the raw bytes
                // (no copy) unless it spans several `data:` lines.
                let raw = self.buf.split_to(next);
                self.line_start = 0;
                let data = match self.data.len() {
                    0 => None,
                    1 => Some(raw.slice(self.data[0].0..self.data[0].1)),
                    _ => Some(join_lines(&raw, &self.data)),
                };
                self.data.clear();
                return Some(SseEvent { raw, data });
            }
            let line = &self.buf[start..end];
            if let Some(rest) = line.strip_prefix(b"data:") {
                let skip = usize::from(rest.first() == Some(&b' '));
                self.data.push((start + 5 + skip, end));
            } else if line == b"data" {
                self.data.push((end, end));
            }
        }
    }
}

fn join_lines(raw: &Bytes, ranges: &[(usize, usize)]) -> Bytes {
    let mut joined = Vec::new();
    for (i, (s, e)) in ranges.iter().enumerate() {
        if i > 0 {
            joined.push(b'\n');
        }
        joined.extend_from_slice(&raw[*s..*e]);
    }
    Bytes::from(joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_events(input: &[u8], split: &[usize]) -> Vec<SseEvent> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        let mut last = 0;
        for &s in split.iter().chain(std::iter::once(&input.len())) {
            p.push(Bytes::copy_from_slice(&input[last..s]));
            last = s;
            while let Some(e) = p.next_event() {
                out.push(e);
            }
        }
        out
    }

    #[test]
    fn splits_anywhere_give_the_same_events() {
        let input =
            "data: {\"a\":\"é\"}\n\n: keep-alive\n\ndata: x\r\ndata: y\r\n\r\ndata: [DONE]\n\n"
                .as_bytes();
        let whole = all_events(input, &[]);
        assert_eq!(whole.len(), 4);
        assert_eq!(whole[0].data.as_deref(), Some("{\"a\":\"é\"}".as_bytes()));
        assert_eq!(whole[1].data, None);
        assert_eq!(&whole[1].raw[..], b": keep-alive\n\n");
        assert_eq!(whole[2].data.as_deref(), Some(&b"x\ny"[..]));
        assert_eq!(whole[3].data.as_deref(), Some(&b"[DONE]"[..]));
        let joined: Vec<u8> = whole.iter().flat_map(|e| e.raw.to_vec()).collect();
        assert_eq!(joined, input);
        for i in 0..input.len() {
            for j in i..input.len() {
                // A split inside a `\r\n` may move its `\n` into the next event's raw bytes.
                assert_eq!(
                    data_and_bytes(&all_events(input, &[i, j])),
                    data_and_bytes(&whole),
                    "split at {i},{j}"
                );
            }
        }
    }

    /// The events' data, and their raw bytes joined (what the client receives unchanged).
    fn data_and_bytes(events: &[SseEvent]) -> (Vec<Option<Bytes>>, Vec<u8>) {
        (
            events.iter().map(|e| e.data.clone()).collect(),
            events.iter().flat_map(|e| e.raw.to_vec()).collect(),
        )
    }

    #[test]
    fn every_line_ending_gives_the_same_events() {
        let lf =
            "data: {\"a\":1}\n\n: keep-alive\n\nevent: e\ndata: x\ndata: y\n\ndata: [DONE]\n\n";
        let (want, _) = data_and_bytes(&all_events(lf.as_bytes(), &[]));
        assert_eq!(want.len(), 4);
        for ending in ["\r\n", "\r"] {
            let input = lf.replace('\n', ending);
            let input = input.as_bytes();
            for i in 0..input.len() {
                for j in i..input.len() {
                    let events = all_events(input, &[i, j]);
                    let (data, bytes) = data_and_bytes(&events);
                    assert_eq!(data, want, "{ending:?} split at {i},{j}");
                    // Bytes unchanged; only the `\n` of a last `\r\n` split off by a read may
                    // wait for an event that never comes.
                    let rest = &input[bytes.len().min(input.len())..];
                    assert!(
                        input.starts_with(&bytes) && (rest.is_empty() || rest == b"\n"),
                        "{ending:?} split at {i},{j}: bytes unchanged"
                    );
                }
            }
        }
        // A lone `\r` last in a read ends its event at once: nothing waits for the next read.
        let mut p = SseParser::default();
        p.push(Bytes::from_static(b"data: x\r\r"));
        assert_eq!(
            p.next_event().and_then(|e| e.data).as_deref(),
            Some(&b"x"[..])
        );
        p.push(Bytes::from_static(b"\ndata: y\r\n\r\n"));
        let e = p.next_event().unwrap();
        assert_eq!(e.data.as_deref(), Some(&b"y"[..]));
        assert_eq!(&e.raw[..], b"\ndata: y\r\n\r\n");
        assert_eq!(p.next_event(), None);
    }

    #[test]
    fn a_last_event_without_its_blank_line_counts() {
        for tail in [
            "data: [DONE]",
            "data: [DONE]\n",
            "data: [DONE]\r\n",
            "data: [DONE]\r",
        ] {
            let mut p = SseParser::default();
            p.push(Bytes::from(format!("data: x\n\n{tail}")));
            assert_eq!(
                p.next_event().and_then(|e| e.data).as_deref(),
                Some(&b"x"[..])
            );
            assert_eq!(p.next_event(), None);
            let last = p.finish().unwrap();
            assert_eq!(last.data.as_deref(), Some(&b"[DONE]"[..]), "{tail:?}");
            assert_eq!(p.pending(), 0);
        }
        let mut p = SseParser::default();
        p.push(Bytes::from_static(b": comment"));
        assert_eq!(p.finish(), None);
        assert_eq!(SseParser::default().finish(), None);
    }

    #[test]
    fn incomplete_event_waits() {
        let mut p = SseParser::default();
        p.push(Bytes::from_static(b"data: {\"x\":1}\n"));
        assert_eq!(p.next_event(), None);
        p.push(Bytes::from_static(b"\n"));
        assert_eq!(
            p.next_event().and_then(|e| e.data).as_deref(),
            Some(&b"{\"x\":1}"[..])
        );
        assert_eq!(p.pending(), 0);
    }
}
