//! The request path's side of body capture. [`BodyCapture::start`] is called only when the
//! principal's cached opt-in flag is set (a bool check otherwise). The request path only cuts:
//! a body within [`MAX_BODY_BYTES`] is handed over as the reference-counted buffer the gateway
//! already holds, a longer one as a copy of its first [`MAX_BODY_BYTES`] (so a queued capture
//! never pins a large request or answer); a stream keeps its first [`MAX_BODY_BYTES`] relayed
//! bytes. Text decoding happens in the writer task ([`Captured::into_row`]), off the request.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use tf_core::db::bodies::StoredBody;
use tokio::sync::mpsc;
use uuid::Uuid;

/// Most bytes kept of a prompt, and of a completion.
pub const MAX_BODY_BYTES: usize = 32 * 1024;
/// Captures waiting for the writer; beyond this they are dropped (and counted). With both
/// bodies cut, a full queue holds at most `QUEUE_LEN * 2 * MAX_BODY_BYTES` (64 MiB).
pub const QUEUE_LEN: usize = 1024;

/// One request's bodies as the request path hands them over: cut, not yet decoded.
#[derive(Debug)]
pub struct Captured {
    pub tenant_id: Uuid,
    pub request_id: Uuid,
    /// At most [`MAX_BODY_BYTES`] of the prompt; `prompt_bytes` is its whole length.
    pub prompt: Bytes,
    pub prompt_bytes: usize,
    /// At most [`MAX_BODY_BYTES`] of the completion; `completion_bytes` is its whole length.
    pub completion: Bytes,
    pub completion_bytes: usize,
}

impl Captured {
    /// The row to store (the writer calls this, not the request path).
    pub fn into_row(self) -> StoredBody {
        let prompt_truncated = self.prompt_bytes > self.prompt.len();
        let completion_truncated = self.completion_bytes > self.completion.len();
        StoredBody {
            request_id: self.request_id,
            tenant_id: self.tenant_id,
            prompt: text(&self.prompt, prompt_truncated),
            prompt_truncated,
            prompt_bytes: clamp_len(self.prompt_bytes),
            completion: text(&self.completion, completion_truncated),
            completion_truncated,
            completion_bytes: clamp_len(self.completion_bytes),
        }
    }
}

/// The replica's capture queue and its counters.
pub struct BodyCapture {
    tx: mpsc::Sender<Captured>,
    dropped: AtomicU64,
    queued: AtomicU64,
}

impl BodyCapture {
    /// The capture side and the receiver the writer task consumes.
    pub fn new(queue_len: usize) -> (Arc<Self>, mpsc::Receiver<Captured>) {
        let (tx, rx) = mpsc::channel(queue_len.max(1));
        let me = Self {
            tx,
            dropped: AtomicU64::new(0),
            queued: AtomicU64::new(0),
        };
        (Arc::new(me), rx)
    }

    /// Begins the capture of one request of an opted-in tenant.
    pub fn start(self: &Arc<Self>, tenant_id: Uuid, request_id: Uuid, prompt: &Bytes) -> Capture {
        Capture {
            to: self.clone(),
            tenant_id,
            request_id,
            prompt: cut(prompt),
            prompt_bytes: prompt.len(),
        }
    }

    /// Captures dropped because the queue was full (or the writer gone).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Captures handed to the writer since start.
    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    /// Appends the Prometheus text lines.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "# TYPE tf_body_captures_queued_total counter\ntf_body_captures_queued_total {}",
            self.queued()
        );
        let _ = writeln!(
            out,
            "# TYPE tf_body_captures_dropped_total counter\ntf_body_captures_dropped_total {}",
            self.dropped()
        );
    }

    fn offer(&self, captured: Captured) {
        // Never waits: a full queue loses the capture, not the request's time.
        match self.tx.try_send(captured) {
            Ok(()) => self.queued.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.dropped.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// One request's capture in progress.
pub struct Capture {
    to: Arc<BodyCapture>,
    tenant_id: Uuid,
    request_id: Uuid,
    prompt: Bytes,
    prompt_bytes: usize,
}

impl Capture {
    /// Queues the capture with this (whole) completion.
    pub fn finish(self, completion: &Bytes) {
        self.finish_cut(cut(completion), completion.len());
    }

    fn finish_cut(self, completion: Bytes, completion_bytes: usize) {
        self.to.offer(Captured {
            tenant_id: self.tenant_id,
            request_id: self.request_id,
            prompt: self.prompt,
            prompt_bytes: self.prompt_bytes,
            completion,
            completion_bytes,
        });
    }

    /// Wraps a relayed stream so the bytes it yields (up to the bound) become the completion,
    /// queued when the stream ends or is dropped (a client hang-up). The wrapper only looks at
    /// the chunks; the metered stream inside is polled and dropped exactly as without it.
    pub fn stream<S>(self, inner: S) -> CapturedStream<S> {
        CapturedStream {
            inner,
            capture: Some(self),
            kept: Vec::new(),
            total: 0,
        }
    }
}

/// `b` itself when within the bound (a reference count), else a copy of its first bytes.
fn cut(b: &Bytes) -> Bytes {
    if b.len() <= MAX_BODY_BYTES {
        b.clone()
    } else {
        Bytes::copy_from_slice(&b[..MAX_BODY_BYTES])
    }
}

/// The text of a kept (maybe cut) body. Invalid UTF-8 is replaced, never refused: the page
/// shows what it can; a character the cut split in two is left out rather than replaced.
pub fn text(kept: &[u8], truncated: bool) -> String {
    match std::str::from_utf8(kept) {
        Ok(s) => s.to_owned(),
        Err(e) if truncated && e.error_len().is_none() => {
            String::from_utf8_lossy(&kept[..e.valid_up_to()]).into_owned()
        }
        Err(_) => String::from_utf8_lossy(kept).into_owned(),
    }
}

fn clamp_len(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A relayed stream whose first [`MAX_BODY_BYTES`] are kept.
pub struct CapturedStream<S> {
    inner: S,
    capture: Option<Capture>,
    kept: Vec<u8>,
    total: usize,
}

impl<S, E> Stream for CapturedStream<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    type Item = Result<Bytes, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let next = Pin::new(&mut this.inner).poll_next(cx);
        match &next {
            Poll::Ready(Some(Ok(b))) => {
                this.total = this.total.saturating_add(b.len());
                let room = MAX_BODY_BYTES.saturating_sub(this.kept.len());
                this.kept.extend_from_slice(&b[..b.len().min(room)]);
            }
            Poll::Ready(None) => this.flush(),
            _ => {}
        }
        next
    }
}

impl<S> CapturedStream<S> {
    fn flush(&mut self) {
        if let Some(c) = self.capture.take() {
            let kept = Bytes::from(std::mem::take(&mut self.kept));
            c.finish_cut(kept, self.total);
        }
    }
}

impl<S> Drop for CapturedStream<S> {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_leaves_out_a_character_the_cut_split() {
        assert_eq!(text(b"hello", false), "hello");
        // "é" is two bytes: cut in its middle, it is left out.
        assert_eq!(text(&"abé".as_bytes()[..3], true), "ab");
        // Invalid bytes not at a cut are replaced.
        assert_eq!(text(b"a\xffb", false), "a\u{fffd}b");
    }

    #[test]
    fn a_long_body_is_copied_cut_and_a_short_one_shared() {
        let short = Bytes::from(vec![b'a'; MAX_BODY_BYTES]);
        assert_eq!(cut(&short).as_ptr(), short.as_ptr(), "shared, not copied");
        let long = Bytes::from(vec![b'a'; MAX_BODY_BYTES + 1]);
        assert_eq!(cut(&long).len(), MAX_BODY_BYTES);
        assert_ne!(
            cut(&long).as_ptr(),
            long.as_ptr(),
            "copied: the queue never pins it"
        );
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts() {
        let (cap, mut rx) = BodyCapture::new(1);
        let prompt = Bytes::from_static(b"{}");
        cap.start(Uuid::nil(), Uuid::now_v7(), &prompt)
            .finish(&Bytes::from_static(b"a"));
        cap.start(Uuid::nil(), Uuid::now_v7(), &prompt)
            .finish(&Bytes::from_static(b"b"));
        assert_eq!((cap.queued(), cap.dropped()), (1, 1));
        let row = rx.recv().await.map(Captured::into_row);
        assert_eq!(row.map(|r| r.completion), Some("a".to_owned()));
    }

    #[tokio::test]
    async fn a_stream_keeps_its_first_bytes_and_says_it_was_cut() {
        use futures::StreamExt;
        let (cap, mut rx) = BodyCapture::new(4);
        let big = Bytes::from(vec![b'x'; MAX_BODY_BYTES]);
        let chunks: Vec<Result<Bytes, ()>> = vec![Ok(Bytes::from_static(b"data: 1\n\n")), Ok(big)];
        let mut s = cap
            .start(Uuid::nil(), Uuid::now_v7(), &Bytes::from_static(b"{}"))
            .stream(futures::stream::iter(chunks));
        while s.next().await.is_some() {}
        drop(s);
        let row = rx.recv().await.expect("queued").into_row();
        assert!(row.completion_truncated);
        assert_eq!(row.completion.len(), MAX_BODY_BYTES);
        assert_eq!(row.completion_bytes as usize, MAX_BODY_BYTES + 9);
        assert!(row.completion.starts_with("data: 1"));
        assert_eq!(cap.queued(), 1, "queued once, not again on drop");
    }

    #[tokio::test]
    async fn a_stream_dropped_midway_queues_what_was_relayed() {
        use futures::StreamExt;
        let (cap, mut rx) = BodyCapture::new(4);
        let chunks: Vec<Result<Bytes, ()>> = vec![
            Ok(Bytes::from_static(b"data: 1\n\n")),
            Ok(Bytes::from_static(b"data: 2\n\n")),
        ];
        let mut s = cap
            .start(Uuid::nil(), Uuid::now_v7(), &Bytes::from_static(b"{}"))
            .stream(futures::stream::iter(chunks));
        let _ = s.next().await;
        drop(s);
        let row = rx.recv().await.expect("queued").into_row();
        assert_eq!(row.completion, "data: 1\n\n");
        assert!(!row.completion_truncated);
    }
}
