//! HTTP/1.1 keep-alive connections to one upstream, with a client of our own (framing in
//! [`super::upstream_wire`]). The request future and then the response body read the socket
//! themselves, on the handler's task: a chunk goes from the engine's socket to the client's with
//! no task, channel or connection driver in between. Idle connections wait in a LIFO pool; one
//! the engine closed is noticed at checkout and dropped, and a request no byte of which reached a
//! kept-alive socket is retried once on a new connection (never one that may have reached the
//! engine).
//!
//! Memory: an open stream's upstream connection holds its socket and little else. Reads go into
//! a buffer on the reading task's stack and body bytes are copied out at once; what is kept
//! between reads is only an incomplete chunk-size or trailer line (usually nothing, so no
//! allocation), given back as soon as it is used. The request head is built, written and freed.
//! hyper's client kept a 4 KiB read buffer, an 8 KiB write buffer and a 9 KiB dispatch channel
//! per connection for the whole stream.
//!
//! A hang-up is passed on as a half-close (our write side shut, the read side kept): the engine
//! sees end-of-file and stops at once, and every byte it wrote before it stopped still reaches us,
//! so the tokens it produced can be counted from its own output. The body owns the socket (one
//! descriptor per upstream connection) and shuts its write side directly.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use uuid::Uuid;

use super::upstream_wire::{self, BodyDecoder, Parsed, WireError};

/// Bytes read from an upstream socket at a time, into a buffer on the stack of the task that
/// reads (nothing per connection). An SSE event from an engine is a few hundred bytes; a large
/// answer takes more reads.
const READ_BYTES: usize = 8192;

/// Why an exchange with the upstream failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamFailure {
    #[error("cannot connect to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("connecting to {0} timed out")]
    ConnectTimeout(String),
    #[error("upstream connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("upstream answer is not valid HTTP/1.1: {0}")]
    Wire(#[from] WireError),
    #[error("the upstream closed the connection without a complete answer")]
    Closed,
}

/// The connections to one upstream address.
pub struct ConnPool {
    /// `host:port`, as connected to.
    addr: String,
    /// The `Host` header every request carries.
    host: HeaderValue,
    idle: Mutex<Vec<TcpStream>>,
    max_idle: usize,
    connect_timeout: Duration,
}

/// The head of an upstream answer and its body (which owns the connection until it ends).
pub struct UpstreamResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: UpstreamBody,
}

impl ConnPool {
    pub fn new(
        addr: String,
        host: HeaderValue,
        max_idle: usize,
        connect_timeout: Duration,
    ) -> Self {
        Self {
            addr,
            host,
            idle: Mutex::new(Vec::new()),
            max_idle,
            connect_timeout,
        }
    }

    async fn connect(&self) -> Result<TcpStream, UpstreamFailure> {
        let tcp = tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| UpstreamFailure::ConnectTimeout(self.addr.clone()))?
            .map_err(|e| UpstreamFailure::Connect(self.addr.clone(), e))?;
        // Requests and chunks are small: no Nagle delay.
        let _ = tcp.set_nodelay(true);
        Ok(tcp)
    }

    /// An idle connection that can take a request now, if there is one (closed ones are dropped).
    fn take_idle(&self) -> Option<TcpStream> {
        loop {
            let tcp = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop()?;
            if is_quiet(&tcp) {
                return Some(tcp);
            }
        }
    }

    /// Puts a connection whose exchange completed back in the pool, if there is room.
    fn release(&self, tcp: TcpStream) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.max_idle {
            idle.push(tcp);
        }
    }

    /// POSTs `body` (JSON) to `path` and waits for the answer's head. Dropped, it closes the
    /// connection (the engine sees the client leave).
    pub async fn send(
        self: &Arc<Self>,
        path: &str,
        request_id: Uuid,
        traceparent: Option<&HeaderValue>,
        body: Bytes,
    ) -> Result<UpstreamResponse, UpstreamFailure> {
        let request =
            upstream_wire::request_head(path, &self.host, request_id, traceparent, body.len());
        let mut retried = false;
        let mut tcp = loop {
            let (mut tcp, reused) = match self.take_idle().filter(|_| !retried) {
                Some(tcp) => (tcp, true),
                None => (self.connect().await?, false),
            };
            match write_request(&mut tcp, &request, &body).await {
                Ok(()) => break tcp,
                // No byte was taken: a kept-alive connection the engine had closed. Safe to retry.
                Err((_, 0)) if reused && !retried => retried = true,
                Err((e, _)) => return Err(e.into()),
            }
        };
        drop(request);
        let (head, rest) = read_head(&mut tcp).await?;
        let mut body = UpstreamBody {
            tcp: Some(tcp),
            decoder: BodyDecoder::new(head.framing),
            reusable: head.keep_alive,
            kept: Vec::new(),
            first: None,
            pool: self.clone(),
        };
        if !rest.is_empty() {
            body.first = body.feed(&rest)?;
        }
        Ok(UpstreamResponse {
            status: head.status,
            headers: head.headers,
            body,
        })
    }
}

/// Whether an idle connection has nothing to read: not closed by the engine, no stray bytes.
/// Tokio answers from the readiness its reactor recorded, so this costs no system call unless
/// the socket became readable.
fn is_quiet(tcp: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(tcp.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// Writes the request head and body (one `writev` when the socket takes it all); on failure, the
/// error and how many bytes were written.
async fn write_request(
    tcp: &mut TcpStream,
    head: &[u8],
    body: &[u8],
) -> Result<(), (std::io::Error, usize)> {
    let mut slices = [IoSlice::new(head), IoSlice::new(body)];
    let mut bufs = &mut slices[..if body.is_empty() { 1 } else { 2 }];
    let mut written = 0;
    while !bufs.is_empty() {
        match tcp.write_vectored(bufs).await {
            Ok(0) => return Err((std::io::ErrorKind::WriteZero.into(), written)),
            Ok(n) => {
                written += n;
                IoSlice::advance_slices(&mut bufs, n);
            }
            Err(e) => return Err((e, written)),
        }
    }
    Ok(())
}

/// Reads one read's worth from `tcp` into a stack buffer and appends it to `out`; 0 at
/// end-of-file.
fn poll_read_into(
    tcp: &mut TcpStream,
    cx: &mut Context<'_>,
    out: &mut Vec<u8>,
) -> Poll<std::io::Result<usize>> {
    let mut stack = [MaybeUninit::<u8>::uninit(); READ_BYTES];
    let mut buf = ReadBuf::uninit(&mut stack);
    std::task::ready!(Pin::new(tcp).poll_read(cx, &mut buf))?;
    out.extend_from_slice(buf.filled());
    Poll::Ready(Ok(buf.filled().len()))
}

/// Reads up to the end of the response head (skipping interim 1xx answers); returns it and the
/// bytes read after it.
async fn read_head(tcp: &mut TcpStream) -> Result<(upstream_wire::Head, Vec<u8>), UpstreamFailure> {
    let mut buf = Vec::new();
    loop {
        let n = std::future::poll_fn(|cx| poll_read_into(tcp, cx, &mut buf)).await?;
        if n == 0 {
            return Err(UpstreamFailure::Closed);
        }
        loop {
            match upstream_wire::parse_head(&buf)? {
                Parsed::Partial => break,
                Parsed::Interim(len) => {
                    buf.drain(..len);
                }
                Parsed::Head(head, len) => {
                    buf.drain(..len);
                    return Ok((head, buf));
                }
            }
        }
    }
}

/// A response body that reads its own connection and returns it to the pool at the end.
/// Dropped early, it closes the connection: the engine sees the client leave and stops.
pub struct UpstreamBody {
    /// `None` once the body ended (the connection is pooled or closed) or broke.
    tcp: Option<TcpStream>,
    decoder: BodyDecoder,
    /// Whether the connection may carry another request once the body ended.
    reusable: bool,
    /// Bytes read and not decoded yet: an incomplete chunk-size or trailer line. Empty (and
    /// unallocated) between events as engines send them.
    kept: Vec<u8>,
    /// Body bytes that arrived with the head.
    first: Option<Bytes>,
    pool: Arc<ConnPool>,
}

impl UpstreamBody {
    /// Tells the engine the client left (it stops generating) while the body stays readable to
    /// its end, so what the engine produced before it stopped is still counted.
    /// INVARIANT: the engine sees end-of-file when the client leaves, and what it wrote before
    /// is still read and billed (server/tests/integration/hang_up.rs, upstream_conn.rs).
    pub fn half_close(&mut self) {
        self.reusable = false;
        if let Some(tcp) = self.tcp.as_mut() {
            // Tokio's shutdown is one `shutdown(2)` call: never pending, the context unused.
            let mut cx = Context::from_waker(Waker::noop());
            if let Poll::Ready(Err(e)) = Pin::new(tcp).poll_shutdown(&mut cx) {
                tracing::debug!(error = %e, "half-close of an upstream connection failed");
            }
        }
    }

    /// Decodes bytes just read; returns the body bytes among them, if any.
    fn feed(&mut self, fresh: &[u8]) -> Result<Option<Bytes>, UpstreamFailure> {
        let mut out = Vec::new();
        if self.kept.is_empty() {
            let used = self.decoder.decode(fresh, &mut out)?;
            self.keep(&fresh[used..]);
        } else {
            self.kept.extend_from_slice(fresh);
            let used = self.decoder.decode(&self.kept, &mut out)?;
            self.kept.drain(..used);
            let rest = std::mem::take(&mut self.kept);
            self.keep(&rest);
        }
        Ok((!out.is_empty()).then(|| Bytes::from(out)))
    }

    /// Keeps what the decoder did not use for the next read, in an allocation of its size.
    fn keep(&mut self, rest: &[u8]) {
        if rest.is_empty() {
            self.kept = Vec::new();
        } else if self.decoder.is_done() {
            // Bytes after the body: the engine sent something unasked; do not reuse the socket.
            self.reusable = false;
            self.kept = Vec::new();
        } else {
            self.kept = rest.to_vec();
        }
    }

    /// The body ended: the connection goes back to the pool if it may carry another request.
    fn finish(&mut self) {
        if let Some(tcp) = self.tcp.take() {
            if self.reusable {
                self.pool.release(tcp);
            }
        }
    }
}

impl Stream for UpstreamBody {
    type Item = Result<Bytes, UpstreamFailure>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        loop {
            if this.decoder.is_done() {
                this.finish();
                return Poll::Ready(None);
            }
            let Some(tcp) = this.tcp.as_mut() else {
                return Poll::Ready(None);
            };
            let mut stack = [MaybeUninit::<u8>::uninit(); READ_BYTES];
            let mut buf = ReadBuf::uninit(&mut stack);
            if let Err(e) = std::task::ready!(Pin::new(tcp).poll_read(cx, &mut buf)) {
                this.tcp = None;
                return Poll::Ready(Some(Err(e.into())));
            }
            let fresh = buf.filled();
            if fresh.is_empty() {
                // End-of-file: the connection is done either way.
                this.tcp = None;
                this.kept = Vec::new();
                return match this.decoder.end_of_file() {
                    Ok(()) => Poll::Ready(None),
                    Err(e) => Poll::Ready(Some(Err(e.into()))),
                };
            }
            match this.feed(fresh) {
                Ok(Some(bytes)) => return Poll::Ready(Some(Ok(bytes))),
                Ok(None) => {}
                Err(e) => {
                    this.tcp = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }
}
