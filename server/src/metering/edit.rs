//! Byte-span edits of an engine's output: the gateway changes a chunk or a whole body only where
//! it must (the `model` name, the `usage` member), copying every other byte as the engine sent
//! it. Values are located, never re-serialised; an edit that cannot be located exactly is not
//! made (the bytes pass unchanged), so an edit can never corrupt the JSON around it.

use bytes::{Bytes, BytesMut};

/// A byte range `[start, end)`.
pub type Span = (usize, usize);

/// What becomes of a chunk's `usage` member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageEdit {
    /// Sent as the engine wrote it.
    Keep,
    /// Its value replaced with `null` (OpenAI's non-final chunks for a client that asked).
    Null,
    /// The member removed (OpenAI's chunks for a client that did not ask).
    Remove,
}

/// Where `part` (a slice borrowed from `data`) sits in `raw`. The data of a one-line event is a
/// slice of `raw` itself, so the offset is pointer arithmetic, no search; a multi-line event's
/// data is a joined copy, and its offset is mapped back through the event's `data:` lines (a value
/// that spans two lines cannot be located and is left alone). Test: spans_map_through_data_lines.
pub fn locate(raw: &[u8], data: &[u8], part: &[u8]) -> Option<Span> {
    let off = (part.as_ptr() as usize).checked_sub(data.as_ptr() as usize)?;
    if off + part.len() > data.len() {
        return None;
    }
    match (data.as_ptr() as usize).checked_sub(raw.as_ptr() as usize) {
        Some(d) if d + data.len() <= raw.len() => Some((d + off, d + off + part.len())),
        _ => map_joined(raw, off, part.len()),
    }
}

/// Maps `[off, off + len)` of the joined data of `raw`'s `data:` lines back into `raw`.
fn map_joined(raw: &[u8], off: usize, len: usize) -> Option<Span> {
    let mut cursor = 0;
    let mut line_start = 0;
    for line in raw.split(|b| *b == b'\n') {
        let ls = line_start;
        line_start += line.len() + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let seg_start = if let Some(rest) = line.strip_prefix(b"data:") {
            ls + 5 + usize::from(rest.first() == Some(&b' '))
        } else if line == b"data" {
            ls + line.len()
        } else {
            continue;
        };
        let seg_len = ls + line.len() - seg_start;
        if off >= cursor && off + len <= cursor + seg_len {
            let start = seg_start + off - cursor;
            return Some((start, start + len));
        }
        cursor += seg_len + 1;
        if cursor > off {
            return None;
        }
    }
    None
}

/// The span of the whole `"usage": value` member (with one adjacent comma) around the value at
/// `value`, if the bytes before it are exactly that key.
fn member_span(raw: &[u8], value: Span) -> Option<Span> {
    let ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\r' | b'\n');
    let back = |mut i: usize| {
        while i > 0 && raw.get(i - 1).is_some_and(ws) {
            i -= 1;
        }
        i
    };
    let colon = back(value.0).checked_sub(1)?;
    if raw.get(colon) != Some(&b':') {
        return None;
    }
    const KEY: &[u8] = b"\"usage\"";
    let key_end = back(colon);
    let key = key_end.checked_sub(KEY.len())?;
    if raw.get(key..key_end) != Some(KEY) {
        return None;
    }
    let before = back(key).checked_sub(1)?;
    match raw.get(before)? {
        b',' => Some((before, value.1)),
        b'{' => {
            let mut next = value.1;
            while raw.get(next).is_some_and(ws) {
                next += 1;
            }
            Some(if raw.get(next) == Some(&b',') {
                (key, next + 1)
            } else {
                (key, value.1)
            })
        }
        _ => None,
    }
}

/// `raw` with its model value (at `model.0`) replaced by `model.1` (unless equal) and its usage
/// member edited; `raw` itself (no copy) when nothing changes.
pub fn apply(raw: &Bytes, model: Option<(Span, &[u8])>, usage: Option<(Span, UsageEdit)>) -> Bytes {
    let model = model.filter(|(s, name)| raw.get(s.0..s.1) != Some(*name));
    let usage = usage.and_then(|(span, edit)| match edit {
        UsageEdit::Keep => None,
        UsageEdit::Null => {
            (raw.get(span.0..span.1) != Some(b"null")).then_some((span, &b"null"[..]))
        }
        UsageEdit::Remove => Some(match member_span(raw, span) {
            Some(member) => (member, &b""[..]),
            None => (span, &b"null"[..]),
        }),
    });
    let mut edits = [model, usage];
    if edits.iter().all(Option::is_none) {
        return raw.clone();
    }
    edits.sort_by_key(|e| e.map(|(s, _)| s.0));
    let mut out = BytesMut::with_capacity(raw.len() + model.map_or(0, |(_, n)| n.len()));
    let mut at = 0;
    for (span, with) in edits.into_iter().flatten() {
        if span.0 < at || span.1 > raw.len() {
            // Overlapping or out of range: never happens for two distinct top-level members.
            continue;
        }
        out.extend_from_slice(&raw[at..span.0]);
        out.extend_from_slice(with);
        at = span.1;
    }
    out.extend_from_slice(&raw[at..]);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span_of(raw: &str, part: &str) -> Span {
        let s = raw.find(part).unwrap();
        (s, s + part.len())
    }

    #[test]
    fn usage_members_are_removed_with_one_comma() {
        for (raw, want) in [
            (r#"{"a":1,"usage":null}"#, r#"{"a":1}"#),
            (r#"{"a":1, "usage" : {"x":1} ,"b":2}"#, r#"{"a":1 ,"b":2}"#),
            (r#"{"usage":null,"a":1}"#, r#"{"a":1}"#),
            (r#"{ "usage": null }"#, r#"{  }"#),
        ] {
            let value = if raw.contains("null") {
                "null"
            } else {
                r#"{"x":1}"#
            };
            let raw = Bytes::from(raw.to_owned());
            let span = span_of(std::str::from_utf8(&raw).unwrap(), value);
            assert_eq!(apply(&raw, None, Some((span, UsageEdit::Remove))), want);
        }
        // Not preceded by the plain key: the value is nulled instead.
        let raw = Bytes::from_static(br#"{"\u0075sage":{"x":1}}"#);
        let span = span_of(std::str::from_utf8(&raw).unwrap(), r#"{"x":1}"#);
        assert_eq!(
            apply(&raw, None, Some((span, UsageEdit::Remove))),
            r#"{"\u0075sage":null}"#
        );
    }

    #[test]
    fn model_and_usage_edits_combine() {
        let raw = Bytes::from_static(br#"data: {"model":"up","usage":{"x":1}}"#);
        let s = std::str::from_utf8(&raw).unwrap();
        let m = span_of(s, r#""up""#);
        let u = span_of(s, r#"{"x":1}"#);
        assert_eq!(
            apply(&raw, Some((m, br#""served""#)), Some((u, UsageEdit::Null))),
            r#"data: {"model":"served","usage":null}"#
        );
        assert_eq!(
            apply(
                &raw,
                Some((m, br#""served""#)),
                Some((u, UsageEdit::Remove))
            ),
            r#"data: {"model":"served"}"#
        );
        let same = apply(&raw, Some((m, br#""up""#)), Some((u, UsageEdit::Keep)));
        assert_eq!(same.as_ptr(), raw.as_ptr(), "no edit, no copy");
    }

    #[test]
    fn spans_map_through_data_lines() {
        let raw = b"data: {\"model\":\"up\",\ndata: \"usage\":null}\n\n";
        let data = b"{\"model\":\"up\",\n\"usage\":null}".to_vec();
        let part = &data[9..13];
        assert_eq!(part, b"\"up\"");
        let (s, e) = locate(raw, &data, part).unwrap();
        assert_eq!(&raw[s..e], b"\"up\"");
        let part = &data[23..27];
        assert_eq!(part, b"null");
        let (s, e) = locate(raw, &data, part).unwrap();
        assert_eq!(&raw[s..e], b"null");
        // A value across the join cannot be located.
        assert_eq!(locate(raw, &data, &data[13..16]), None);
    }
}
