//! The request path's side of body capture. [`BodyCapture::start`] is called only when the
//! principal's cached opt-in flag is set (a bool check otherwise); the prompt is the client's
//! body the gateway already holds (a reference-counted clone), the completion is the whole answer
//! or, for a stream, the SSE bytes relayed to the client, each cut at [`MAX_BODY_BYTES`].

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
/// Captures waiting for the writer; beyond this they are dropped (and counted).
pub const QUEUE_LEN: usize = 1024;

/// The replica's capture queue and its counters.
pub struct BodyCapture {
    tx: mpsc::Sender<StoredBody>,
    dropped: AtomicU64,
    queued: AtomicU64,
}

impl BodyCapture {
    /// The capture side and the receiver the writer task consumes.
    pub fn new(queue_len: usize) -> (Arc<Self>, mpsc::Receiver<StoredBody>) {
        let (tx, rx) = mpsc::channel(queue_len.max(1));
        let me = Self {
            tx,
            dropped: AtomicU64::new(0),
            queued: AtomicU64::new(0),
        };
        (Arc::new(me), rx)
    }

    /// Begins the capture of one request of an opted-in tenant.
    pub fn start(self: &Arc<Self>, tenant_id: Uuid, request_id: Uuid, prompt: Bytes) -> Capture {
        Capture {
            to: self.clone(),
            tenant_id,
            request_id,
            prompt,
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

    fn offer(&self, row: StoredBody) {
        // Never waits: a full queue loses the capture, not the request's time.
        match self.tx.try_send(row) {
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
}

impl Capture {
    /// Queues the capture with this completion (bounded here).
    pub fn finish(self, completion: &[u8]) {
        let (prompt, prompt_truncated) = bounded_text(&self.prompt, MAX_BODY_BYTES);
        let (completion_text, completion_truncated) = bounded_text(completion, MAX_BODY_BYTES);
        self.to.offer(StoredBody {
            request_id: self.request_id,
            tenant_id: self.tenant_id,
            prompt,
            prompt_truncated,
            prompt_bytes: clamp_len(self.prompt.len()),
            completion: completion_text,
            completion_truncated,
            completion_bytes: clamp_len(completion.len()),
        });
    }

    /// Wraps a relayed stream so the bytes it yields (up to the bound) become the completion,
    /// queued when the stream ends or is dropped (a client hang-up).
    pub fn stream<S>(self, inner: S) -> CapturedStream<S> {
        CapturedStream {
            inner,
            capture: Some(self),
            kept: Vec::new(),
            total: 0,
        }
    }
}

/// The text of `bytes` cut at `max` bytes (at a character boundary), and whether it was cut.
/// Invalid UTF-8 is replaced, never refused: the page shows what it can.
pub fn bounded_text(bytes: &[u8], max: usize) -> (String, bool) {
    let truncated = bytes.len() > max;
    let cut = &bytes[..bytes.len().min(max)];
    let text = match std::str::from_utf8(cut) {
        Ok(s) => s.to_owned(),
        // A cut inside a character: drop its first bytes rather than show a replacement mark.
        Err(e) if truncated && e.error_len().is_none() => {
            String::from_utf8_lossy(&cut[..e.valid_up_to()]).into_owned()
        }
        Err(_) => String::from_utf8_lossy(cut).into_owned(),
    };
    (text, truncated)
}

fn clamp_len(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A relayed stream whose first [`MAX_BODY_BYTES`] (plus one, to know it was cut) are kept.
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
                let room = (MAX_BODY_BYTES + 1).saturating_sub(this.kept.len());
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
            let (completion, completion_truncated) = bounded_text(&self.kept, MAX_BODY_BYTES);
            let (prompt, prompt_truncated) = bounded_text(&c.prompt, MAX_BODY_BYTES);
            c.to.offer(StoredBody {
                request_id: c.request_id,
                tenant_id: c.tenant_id,
                prompt,
                prompt_truncated,
                prompt_bytes: clamp_len(c.prompt.len()),
                completion,
                completion_truncated: completion_truncated || self.total > self.kept.len(),
                completion_bytes: clamp_len(self.total),
            });
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
    fn text_is_cut_at_the_bound_and_at_a_character() {
        assert_eq!(bounded_text(b"hello", 5), ("hello".to_owned(), false));
        assert_eq!(bounded_text(b"hello!", 5), ("hello".to_owned(), true));
        // "é" is two bytes: cut in its middle, it is left out.
        assert_eq!(bounded_text("abé".as_bytes(), 3), ("ab".to_owned(), true));
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts() {
        let (cap, mut rx) = BodyCapture::new(1);
        cap.start(Uuid::nil(), Uuid::now_v7(), Bytes::from_static(b"{}"))
            .finish(b"a");
        cap.start(Uuid::nil(), Uuid::now_v7(), Bytes::from_static(b"{}"))
            .finish(b"b");
        assert_eq!((cap.queued(), cap.dropped()), (1, 1));
        assert_eq!(rx.recv().await.map(|r| r.completion), Some("a".to_owned()));
    }

    #[tokio::test]
    async fn a_stream_keeps_its_first_bytes_and_says_it_was_cut() {
        use futures::StreamExt;
        let (cap, mut rx) = BodyCapture::new(4);
        let big = Bytes::from(vec![b'x'; MAX_BODY_BYTES]);
        let chunks: Vec<Result<Bytes, ()>> = vec![Ok(Bytes::from_static(b"data: 1\n\n")), Ok(big)];
        let mut s = cap
            .start(Uuid::nil(), Uuid::now_v7(), Bytes::from_static(b"{}"))
            .stream(futures::stream::iter(chunks));
        while s.next().await.is_some() {}
        drop(s);
        let row = rx.recv().await.expect("queued");
        assert!(row.completion_truncated);
        assert_eq!(row.completion.len(), MAX_BODY_BYTES);
        assert_eq!(row.completion_bytes as usize, MAX_BODY_BYTES + 9);
        assert!(row.completion.starts_with("data: 1"));
    }
}
