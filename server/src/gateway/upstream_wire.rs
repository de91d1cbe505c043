//! HTTP/1.1 framing for the gateway's upstream client ([`super::upstream_conn`]), without IO:
//! the request head it sends, the response head it reads (parsed with `httparse`), and a body
//! decoder for `content-length`, `chunked` and read-until-close bodies. The decoder keeps no
//! buffer of its own: it passes body bytes through as they come and leaves the caller only an
//! incomplete framing line (a chunk-size or trailer line, bounded by [`MAX_LINE_BYTES`]) to keep
//! until the next read.
//!
//! Anything that does not parse is an error, never a guess: a body whose framing is broken ends
//! the exchange as an upstream failure and the connection is closed, not reused.

use http::{HeaderMap, HeaderValue, StatusCode};
use uuid::Uuid;

/// Longest response head accepted (hyper's default limit is about 400 KiB; an engine's is a few
/// hundred bytes).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header fields in a response head (hyper's default is 100).
const MAX_HEADERS: usize = 100;
/// Longest chunk-size or trailer line.
pub const MAX_LINE_BYTES: usize = 4096;

/// Why an upstream's answer could not be read as HTTP/1.1.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("response head larger than {MAX_HEAD_BYTES} bytes")]
    HeadTooLarge,
    #[error("malformed response head: {0}")]
    Head(httparse::Error),
    #[error("response header value is not valid")]
    HeaderValue,
    #[error("invalid or conflicting content-length")]
    ContentLength,
    #[error("the upstream switched protocols")]
    SwitchedProtocols,
    #[error("malformed chunked body")]
    Chunked,
    #[error("the upstream closed the connection before the body ended")]
    Truncated,
}

/// The request head for a POST of `body_len` bytes of JSON, with the trace's `traceparent` when
/// there is one. Header names are lower-case, as hyper sent them.
pub fn request_head(
    path: &str,
    host: &HeaderValue,
    request_id: Uuid,
    traceparent: Option<&HeaderValue>,
    body_len: usize,
) -> Vec<u8> {
    let mut id = Uuid::encode_buffer();
    let id = request_id.hyphenated().encode_lower(&mut id);
    let mut head = Vec::with_capacity(160 + path.len() + host.len());
    head.extend_from_slice(b"POST ");
    head.extend_from_slice(path.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    head.extend_from_slice(host.as_bytes());
    head.extend_from_slice(b"\r\ncontent-type: application/json\r\nx-request-id: ");
    head.extend_from_slice(id.as_bytes());
    if let Some(tp) = traceparent {
        head.extend_from_slice(b"\r\ntraceparent: ");
        head.extend_from_slice(tp.as_bytes());
    }
    head.extend_from_slice(b"\r\ncontent-length: ");
    head.extend_from_slice(body_len.to_string().as_bytes());
    head.extend_from_slice(b"\r\n\r\n");
    head
}

/// How the body of a response is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Length(u64),
    Chunked,
    /// Until the upstream closes the connection.
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    /// `content-type` and `retry-after`, the fields the exchange reads; framing and reuse are
    /// read from the head here.
    pub headers: HeaderMap,
    pub framing: Framing,
    /// Whether the connection may carry another request once the body ended.
    pub keep_alive: bool,
}

/// What the bytes read so far hold.
#[derive(Debug)]
pub enum Parsed {
    /// Not a whole head yet: read more.
    Partial,
    /// An interim (1xx) answer of this many bytes, to skip; the real one follows.
    Interim(usize),
    /// The head, and how many bytes it took.
    Head(Head, usize),
}

/// Parses a response head at the start of `buf`.
pub fn parse_head(buf: &[u8]) -> Result<Parsed, WireError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut fields);
    let len = match response.parse(buf).map_err(WireError::Head)? {
        httparse::Status::Partial if buf.len() >= MAX_HEAD_BYTES => {
            return Err(WireError::HeadTooLarge)
        }
        httparse::Status::Partial => return Ok(Parsed::Partial),
        httparse::Status::Complete(len) if len > MAX_HEAD_BYTES => {
            return Err(WireError::HeadTooLarge)
        }
        httparse::Status::Complete(len) => len,
    };
    let code = response.code.unwrap_or(0);
    let status =
        StatusCode::from_u16(code).map_err(|_| WireError::Head(httparse::Error::Status))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(WireError::SwitchedProtocols);
    }
    if status.is_informational() {
        return Ok(Parsed::Interim(len));
    }
    // Only the headers the exchange reads are kept (a `HeaderMap` of every field cost a hash,
    // a name lookup and an allocation per field, on every request); framing reads the fields.
    let fields = &*response.headers;
    let mut headers = HeaderMap::new();
    for field in fields {
        let name = field.name.as_bytes();
        let kept = if name.eq_ignore_ascii_case(b"content-type") {
            http::header::CONTENT_TYPE
        } else if name.eq_ignore_ascii_case(b"retry-after") {
            http::header::RETRY_AFTER
        } else {
            continue;
        };
        let value = HeaderValue::from_bytes(field.value).map_err(|_| WireError::HeaderValue)?;
        headers.append(kept, value);
    }
    let (framing, smuggled) = framing(status, fields)?;
    let keep_alive = response.version == Some(1)
        && framing != Framing::Close
        && !smuggled
        && !has_token(fields, "connection", "close");
    Ok(Parsed::Head(
        Head {
            status,
            headers,
            framing,
            keep_alive,
        },
        len,
    ))
}

/// The body's framing (RFC 9112 section 6.3), and whether the head carried both
/// `transfer-encoding` and `content-length` (then the connection is not reused).
fn framing(
    status: StatusCode,
    fields: &[httparse::Header<'_>],
) -> Result<(Framing, bool), WireError> {
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok((Framing::Length(0), false));
    }
    let has_length = values(fields, "content-length").next().is_some();
    let mut codings = values(fields, "transfer-encoding").peekable();
    if codings.peek().is_some() {
        let last = codings
            .flat_map(|v| v.split(|b| *b == b','))
            .map(<[u8]>::trim_ascii)
            .rfind(|t| !t.is_empty());
        let chunked = last.is_some_and(|t| t.eq_ignore_ascii_case(b"chunked"));
        let framing = if chunked {
            Framing::Chunked
        } else {
            Framing::Close
        };
        return Ok((framing, has_length));
    }
    if !has_length {
        return Ok((Framing::Close, false));
    }
    // Repeated values (in one field or several) must all agree.
    let mut length = None;
    for value in values(fields, "content-length") {
        for part in value.split(|b| *b == b',') {
            let part = part.trim_ascii();
            if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
                return Err(WireError::ContentLength);
            }
            let n: u64 = std::str::from_utf8(part)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or(WireError::ContentLength)?;
            if length.is_some_and(|l| l != n) {
                return Err(WireError::ContentLength);
            }
            length = Some(n);
        }
    }
    length
        .map(|n| (Framing::Length(n), false))
        .ok_or(WireError::ContentLength)
}

/// The values of every field named `name` (any case), in order.
fn values<'a>(
    fields: &'a [httparse::Header<'a>],
    name: &'a str,
) -> impl DoubleEndedIterator<Item = &'a [u8]> + 'a {
    fields
        .iter()
        .filter(move |f| f.name.eq_ignore_ascii_case(name))
        .map(|f| f.value)
}

/// Whether a comma-separated header (such as `connection`) lists `token`.
fn has_token(fields: &[httparse::Header<'_>], name: &str, token: &str) -> bool {
    values(fields, name).any(|v| {
        v.split(|b| *b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    })
}

/// Where the decoder is in the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Bytes left of a `content-length` body.
    Length(u64),
    /// Everything until the connection closes.
    Close,
    /// Expecting a chunk-size line.
    ChunkSize,
    /// Bytes left of the current chunk's data.
    ChunkData(u64),
    /// Expecting the CRLF after a chunk's data.
    ChunkEnd,
    /// After the last chunk: trailer lines until an empty one (bytes of them so far).
    Trailers(usize),
    Done,
}

/// Turns the bytes of a response body as read from the socket into the body's content.
#[derive(Debug)]
pub struct BodyDecoder {
    state: State,
}

impl BodyDecoder {
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkSize,
            Framing::Close => State::Close,
        };
        Self { state }
    }

    /// Whether the whole body has been decoded.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decodes what it can of `input`, appending the body's bytes to `out`; returns how many
    /// bytes of `input` it used. Unused bytes are an incomplete framing line (to be given again,
    /// with more after them) or, once done, bytes past the end of the body.
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, WireError> {
        let mut pos = 0;
        loop {
            let rest = &input[pos..];
            match self.state {
                State::Done => return Ok(pos),
                State::Close => {
                    out.extend_from_slice(rest);
                    return Ok(input.len());
                }
                State::Length(left) | State::ChunkData(left) => {
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(rest.len());
                    out.extend_from_slice(&rest[..take]);
                    pos += take;
                    let left = left - take as u64;
                    self.state = match self.state {
                        State::Length(_) if left == 0 => State::Done,
                        State::Length(_) => State::Length(left),
                        _ if left == 0 => State::ChunkEnd,
                        _ => State::ChunkData(left),
                    };
                    if left > 0 {
                        return Ok(pos);
                    }
                }
                State::ChunkSize => {
                    // httparse reads an empty size as 0 (the last chunk): a digit must come first.
                    match rest.first() {
                        None => return Ok(pos),
                        Some(b) if !b.is_ascii_hexdigit() => return Err(WireError::Chunked),
                        Some(_) => {}
                    }
                    match httparse::parse_chunk_size(rest) {
                        Ok(httparse::Status::Complete((used, size))) => {
                            pos += used;
                            self.state = if size == 0 {
                                State::Trailers(0)
                            } else {
                                State::ChunkData(size)
                            };
                        }
                        Ok(httparse::Status::Partial) if rest.len() < MAX_LINE_BYTES => {
                            return Ok(pos)
                        }
                        Ok(httparse::Status::Partial) | Err(_) => return Err(WireError::Chunked),
                    }
                }
                State::ChunkEnd => {
                    if rest.starts_with(b"\r\n") {
                        pos += 2;
                        self.state = State::ChunkSize;
                    } else if rest.is_empty() || rest == b"\r" {
                        return Ok(pos);
                    } else {
                        return Err(WireError::Chunked);
                    }
                }
                State::Trailers(seen) => match memchr::memchr(b'\n', rest) {
                    Some(end) if end == 0 || rest[end - 1] != b'\r' => {
                        return Err(WireError::Chunked)
                    }
                    Some(end) if seen + end + 1 > MAX_HEAD_BYTES => return Err(WireError::Chunked),
                    Some(end) => {
                        pos += end + 1;
                        self.state = if end == 1 {
                            State::Done
                        } else {
                            State::Trailers(seen + end + 1)
                        };
                    }
                    None if rest.len() < MAX_LINE_BYTES => return Ok(pos),
                    None => return Err(WireError::Chunked),
                },
            }
        }
    }

    /// The connection reached end-of-file: fine if that is where the body ends.
    pub fn end_of_file(&mut self) -> Result<(), WireError> {
        match self.state {
            State::Done => Ok(()),
            State::Close => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(WireError::Truncated),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Head {
        match parse_head(raw.as_bytes()).unwrap() {
            Parsed::Head(h, len) => {
                assert_eq!(len, raw.len());
                h
            }
            other => panic!("{other:?}"),
        }
    }

    /// Decodes `wire` fed in pieces of `step` bytes, keeping unused bytes as the client does.
    fn decode_in_steps(framing: Framing, wire: &[u8], step: usize) -> (Vec<u8>, bool, usize) {
        let mut d = BodyDecoder::new(framing);
        let mut out = Vec::new();
        let mut kept: Vec<u8> = Vec::new();
        for piece in wire.chunks(step) {
            kept.extend_from_slice(piece);
            let used = d.decode(&kept, &mut out).unwrap();
            kept.drain(..used);
            assert!(kept.len() < MAX_LINE_BYTES);
        }
        (out, d.is_done(), kept.len())
    }

    #[test]
    fn request_head_is_exact() {
        let id = Uuid::nil();
        let h = request_head(
            "/v1/chat/completions",
            &HeaderValue::from_static("e:8000"),
            id,
            None,
            12,
        );
        assert_eq!(
            std::str::from_utf8(&h).unwrap(),
            "POST /v1/chat/completions HTTP/1.1\r\nhost: e:8000\r\ncontent-type: application/json\r\n\
             x-request-id: 00000000-0000-0000-0000-000000000000\r\ncontent-length: 12\r\n\r\n"
        );
        let tp =
            HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        let h = request_head(
            "/v1/completions",
            &HeaderValue::from_static("e"),
            id,
            Some(&tp),
            2,
        );
        assert_eq!(
            std::str::from_utf8(&h).unwrap(),
            "POST /v1/completions HTTP/1.1\r\nhost: e\r\ncontent-type: application/json\r\n\
             x-request-id: 00000000-0000-0000-0000-000000000000\r\n\
             traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\
             content-length: 2\r\n\r\n"
        );
    }

    #[test]
    fn heads_give_framing_and_reuse() {
        let h = head("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(h.status, 200);
        assert_eq!(h.framing, Framing::Chunked);
        assert!(h.keep_alive);
        assert_eq!(h.headers["content-type"], "text/event-stream");
        // Only the fields the exchange reads are kept.
        assert_eq!(h.headers.len(), 1);
        let h = head("HTTP/1.1 429 Too Many\r\nRetry-After: 3\r\nX-Other: y\r\nContent-Length: 0\r\nCONNECTION: Close\r\n\r\n");
        assert_eq!(h.headers["retry-after"], "3");
        assert_eq!(
            (h.headers.len(), h.framing, h.keep_alive),
            (1, Framing::Length(0), false)
        );

        let h = head(
            "HTTP/1.1 404 Not Found\r\ncontent-length: 7\r\nconnection: keep-alive, Close\r\n\r\n",
        );
        assert_eq!(
            (h.status.as_u16(), h.framing, h.keep_alive),
            (404, Framing::Length(7), false)
        );

        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\ncontent-length: 3\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(3), true));

        // No length: the body runs to the close.
        let h = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Close, false));
        let h = head("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(2), false));
        let h = head("HTTP/1.1 204 No Content\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(0), true));

        // Both framings: chunked wins, the connection is not reused.
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Chunked, false));
        let h = head("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Close, false));
    }

    #[test]
    fn bad_heads_are_errors() {
        let parse = |raw: &str| parse_head(raw.as_bytes()).map(|_| ()).unwrap_err();
        assert_eq!(
            parse("HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n"),
            WireError::ContentLength
        );
        assert_eq!(
            parse("HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n"),
            WireError::ContentLength
        );
        assert_eq!(
            parse("HTTP/1.1 200 OK\r\ncontent-length: +1\r\n\r\n"),
            WireError::ContentLength
        );
        assert_eq!(
            parse("HTTP/1.1 101 Switching Protocols\r\n\r\n"),
            WireError::SwitchedProtocols
        );
        assert!(matches!(parse("HTTP/2 200\r\n\r\n"), WireError::Head(_)));
        assert!(matches!(
            parse("HTTP/1.1 200 OK\r\nbad header\r\n\r\n"),
            WireError::Head(_)
        ));
        let big = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(parse(&big), WireError::HeadTooLarge);
    }

    #[test]
    fn partial_and_interim_heads() {
        let raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        for cut in 0..25 {
            assert!(
                matches!(parse_head(&raw[..cut]).unwrap(), Parsed::Partial),
                "{cut}"
            );
        }
        let Parsed::Interim(skip) = parse_head(raw).unwrap() else {
            panic!("not interim")
        };
        assert_eq!(skip, 25);
        let Parsed::Head(h, len) = parse_head(&raw[skip..]).unwrap() else {
            panic!("no head")
        };
        assert_eq!((h.status.as_u16(), len), (200, raw.len() - skip));
    }

    const CHUNKED: &[u8] = b"7\r\ndata: a\r\n1C;ext=\"x\"\r\ndata: {\"choices\":[]}\n\nxxxxxx\r\n\
        0\r\nx-trailer: 1\r\n\r\n";

    #[test]
    fn chunked_bodies_decode_in_any_split() {
        for step in 1..=CHUNKED.len() {
            let (out, done, kept) = decode_in_steps(Framing::Chunked, CHUNKED, step);
            assert_eq!(
                out, b"data: adata: {\"choices\":[]}\n\nxxxxxx",
                "step {step}"
            );
            assert!(done, "step {step}");
            assert_eq!(kept, 0);
        }
    }

    #[test]
    fn bytes_after_the_body_are_left_unused() {
        let mut wire = CHUNKED.to_vec();
        wire.extend_from_slice(b"HTTP/1.1");
        let mut d = BodyDecoder::new(Framing::Chunked);
        let mut out = Vec::new();
        assert_eq!(d.decode(&wire, &mut out).unwrap(), CHUNKED.len());
        assert!(d.is_done());
        let mut d = BodyDecoder::new(Framing::Length(4));
        let mut out = Vec::new();
        assert_eq!(d.decode(b"abcdef", &mut out).unwrap(), 4);
        assert_eq!((out.as_slice(), d.is_done()), (&b"abcd"[..], true));
    }

    #[test]
    fn length_and_close_bodies() {
        for step in 1..=10 {
            let (out, done, _) = decode_in_steps(Framing::Length(10), b"0123456789", step);
            assert_eq!((out.as_slice(), done), (&b"0123456789"[..], true));
        }
        let mut d = BodyDecoder::new(Framing::Length(10));
        let mut out = Vec::new();
        d.decode(b"01234", &mut out).unwrap();
        assert_eq!(d.end_of_file(), Err(WireError::Truncated));
        assert!(BodyDecoder::new(Framing::Length(0)).is_done());

        let mut d = BodyDecoder::new(Framing::Close);
        let mut out = Vec::new();
        assert_eq!(d.decode(b"anything", &mut out).unwrap(), 8);
        assert!(!d.is_done());
        assert_eq!(d.end_of_file(), Ok(()));
        assert!(d.is_done());
    }

    #[test]
    fn broken_chunked_bodies_are_errors() {
        let bad: [&[u8]; 6] = [
            b"\r\n",                  // no size (httparse alone would read the last chunk)
            b"zz\r\n",                // not hex
            b"3\r\nabcXY",            // no CRLF after the data
            b"3\nabc\r\n",            // bare LF after the size
            b"0\r\nx: 1\n\r\n",       // bare LF in a trailer
            b"11111111111111111\r\n", // size overflows
        ];
        for wire in bad {
            let mut d = BodyDecoder::new(Framing::Chunked);
            assert_eq!(
                d.decode(wire, &mut Vec::new()),
                Err(WireError::Chunked),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
        }
        // A size line that never ends is cut at the limit.
        let mut d = BodyDecoder::new(Framing::Chunked);
        let long = [b"1;".as_slice(), &[b'x'; MAX_LINE_BYTES]].concat();
        assert_eq!(d.decode(&long, &mut Vec::new()), Err(WireError::Chunked));
        // Trailers without end.
        let mut d = BodyDecoder::new(Framing::Chunked);
        d.decode(b"0\r\n", &mut Vec::new()).unwrap();
        let line = b"x-t: 0123456789\r\n";
        let result = (0..MAX_HEAD_BYTES / line.len() + 1)
            .map(|_| d.decode(line, &mut Vec::new()))
            .find(Result::is_err);
        assert_eq!(result, Some(Err(WireError::Chunked)));
        // Ended mid-chunk.
        let mut d = BodyDecoder::new(Framing::Chunked);
        d.decode(b"5\r\nab", &mut Vec::new()).unwrap();
        assert_eq!(d.end_of_file(), Err(WireError::Truncated));
    }
}
