//! HTTP/1.1 keep-alive connections to one upstream, driven by whoever reads them. A pooled client
//! such as reqwest runs each connection as a task of its own, so every request and every streamed
//! chunk crosses two tasks (a wake-up and usually a thread hop each way). Here the request future
//! and then the response body poll their connection themselves: a chunk goes from the engine's
//! socket to the client's on one task. Idle connections wait in a LIFO pool; one the engine
//! closed is noticed at checkout and replaced, and a request it never sent is retried once on a
//! new connection (never one that may have reached the engine).
//!
//! A hang-up is passed on as a half-close (our write side shut, the read side kept): the engine
//! sees end-of-file and stops at once, and every byte it wrote before it stopped still reaches us,
//! so the tokens it produced can be counted from its own output. The socket is owned by the
//! connection alone (one descriptor per upstream connection, no duplicate): the half-close is
//! asked for through a flag the socket's IO wrapper ([`HalfClosable`]) acts on at its next poll,
//! and the wrapper wakes the task that drives it so that poll comes at once.
//!
//! Memory: each connection's read buffer is a fixed [`READ_BUF_BYTES`] (hyper's adaptive default
//! starts at 8 KiB and grows up to ~400 KiB), since what an engine sends is small SSE events; a
//! large answer only takes more reads.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::task::AtomicWaker;
use futures::Stream;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

type Driver = Connection<TokioIo<HalfClosable>, Full<Bytes>>;

/// Bytes read from an upstream socket at a time. Each open stream keeps one such buffer for its
/// upstream connection; an SSE event from an engine is a few hundred bytes. It also bounds an
/// upstream response head (hyper's exact read strategy), which engines keep under 1 KiB.
const READ_BUF_BYTES: usize = 4096;

/// The request to shut the write side of one upstream socket, shared between the connection
/// (which asks) and the socket's IO wrapper (which does it).
#[derive(Debug, Default)]
struct ShutWrite {
    requested: AtomicBool,
    /// The task that last polled the socket: woken so the shutdown happens without waiting for
    /// the engine to send something.
    waker: AtomicWaker,
}

/// The upstream socket, with a write side that [`ShutWrite`] can close while reads go on.
/// Replaces a `try_clone` of the socket (a second descriptor per open stream).
struct HalfClosable {
    tcp: TcpStream,
    shut: Arc<ShutWrite>,
    /// The shutdown was done (or failed: it is not tried again).
    shut_done: bool,
}

impl HalfClosable {
    /// Shuts the write side if that was asked for and not done yet; registers the waker first
    /// so a request made after the check still wakes this task.
    fn apply_shutdown(&mut self, cx: &mut Context<'_>) {
        if self.shut_done {
            return;
        }
        self.shut.waker.register(cx.waker());
        if !self.shut.requested.load(Ordering::Acquire) {
            return;
        }
        self.shut_done = true;
        // Tokio's TCP shutdown is one `shutdown(2)` call: it is never pending.
        if let Poll::Ready(Err(e)) = Pin::new(&mut self.tcp).poll_shutdown(cx) {
            tracing::debug!(error = %e, "half-close of an upstream connection failed");
        }
    }

    fn write_shut() -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "upstream write side shut (client left)",
        )
    }
}

impl AsyncRead for HalfClosable {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.apply_shutdown(cx);
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for HalfClosable {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.apply_shutdown(cx);
        if self.shut_done {
            return Poll::Ready(Err(Self::write_shut()));
        }
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.apply_shutdown(cx);
        if self.shut_done {
            return Poll::Ready(Err(Self::write_shut()));
        }
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.apply_shutdown(cx);
        if self.shut_done {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.shut_done {
            return Poll::Ready(Ok(()));
        }
        self.shut_done = true;
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// Why an exchange with the upstream failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamFailure {
    #[error("cannot connect to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("connecting to {0} timed out")]
    ConnectTimeout(String),
    #[error("HTTP exchange failed: {0}")]
    Http(#[from] hyper::Error),
}

/// One connection: the request half and the future that drives its socket (`None` once the
/// connection has ended).
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    driver: Option<Driver>,
    /// Asks the socket (owned by the driver) to shut its write side while the driver keeps
    /// reading. Once asked, the connection never goes back to the pool.
    shut: Arc<ShutWrite>,
}

impl Conn {
    /// Drives the socket; `false` once the connection is closed or broken (it is then dropped,
    /// which fails whatever still waits on it).
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(driver) = self.driver.as_mut() else {
            return false;
        };
        match Pin::new(driver).poll(cx) {
            Poll::Pending => true,
            Poll::Ready(_) => {
                self.driver = None;
                false
            }
        }
    }

    /// Whether the connection can take a request now (driving it once to learn).
    fn ready(&mut self, cx: &mut Context<'_>) -> bool {
        !self.shut.requested.load(Ordering::Acquire)
            && self.drive(cx)
            && matches!(self.sender.poll_ready(cx), Poll::Ready(Ok(())))
    }

    /// Sends FIN: the engine reads end-of-file and cancels; its output so far can still be read.
    /// INVARIANT: the engine sees end-of-file when the client leaves, and what it wrote before
    /// is still read and billed (server/tests/hang_up.rs, upstream_conn.rs). The wrapper shuts
    /// the socket at its next poll, which the wake-up brings at once.
    fn shut_write(&mut self) {
        if !self.shut.requested.swap(true, Ordering::AcqRel) {
            self.shut.waker.wake();
        }
    }
}

/// The connections to one upstream address.
pub struct ConnPool {
    /// `host:port`, as connected to.
    addr: String,
    /// The `Host` header every request carries.
    host: HeaderValue,
    idle: Mutex<Vec<Conn>>,
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

    /// The `Host` header value of this upstream.
    pub fn host(&self) -> &HeaderValue {
        &self.host
    }

    async fn connect(&self) -> Result<Conn, UpstreamFailure> {
        let tcp = tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| UpstreamFailure::ConnectTimeout(self.addr.clone()))?
            .map_err(|e| UpstreamFailure::Connect(self.addr.clone(), e))?;
        // Requests and chunks are small: no Nagle delay.
        let _ = tcp.set_nodelay(true);
        let shut = Arc::new(ShutWrite::default());
        let io = HalfClosable {
            tcp,
            shut: shut.clone(),
            shut_done: false,
        };
        let (sender, driver) = http1::Builder::new()
            .read_buf_exact_size(Some(READ_BUF_BYTES))
            .handshake(TokioIo::new(io))
            .await?;
        Ok(Conn {
            sender,
            driver: Some(driver),
            shut,
        })
    }

    /// An idle connection that can take a request now, if there is one (stale ones are dropped).
    async fn take_idle(&self) -> Option<Conn> {
        loop {
            let mut conn = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop()?;
            if poll_fn(|cx| Poll::Ready(conn.ready(cx))).await {
                return Some(conn);
            }
        }
    }

    /// Puts a connection whose exchange completed back in the pool, if it can take another.
    fn release(&self, mut conn: Conn, cx: &mut Context<'_>) {
        if !conn.ready(cx) {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.max_idle {
            idle.push(conn);
        }
    }

    /// Sends `req` and waits for the answer's head, driving the connection meanwhile.
    pub async fn send(
        self: &Arc<Self>,
        req: Request<Full<Bytes>>,
    ) -> Result<UpstreamResponse, UpstreamFailure> {
        let mut req = req;
        let mut retried = false;
        loop {
            let (mut conn, reused) = match self.take_idle().await {
                Some(conn) => (conn, true),
                None => (self.connect().await?, false),
            };
            let mut answer = pin!(conn.sender.try_send_request(req));
            let result = poll_fn(|cx| {
                if let Poll::Ready(r) = answer.as_mut().poll(cx) {
                    return Poll::Ready(r);
                }
                conn.drive(cx);
                answer.as_mut().poll(cx)
            })
            .await;
            match result {
                Ok(response) => {
                    let (head, body) = response.into_parts();
                    return Ok(UpstreamResponse {
                        status: head.status,
                        headers: head.headers,
                        body: UpstreamBody {
                            body,
                            conn: Some(conn),
                            pool: self.clone(),
                        },
                    });
                }
                Err(mut e) => match e.take_message() {
                    // Never written: a kept-alive connection the engine had closed. Safe to retry.
                    Some(unsent) if reused && !retried => {
                        retried = true;
                        req = unsent;
                    }
                    _ => return Err(e.into_error().into()),
                },
            }
        }
    }
}

/// A response body that drives its own connection and returns it to the pool at the end.
/// Dropped early, it closes the connection: the engine sees the client leave and stops.
pub struct UpstreamBody {
    body: Incoming,
    conn: Option<Conn>,
    pool: Arc<ConnPool>,
}

impl UpstreamBody {
    /// Tells the engine the client left (it stops generating) while the body stays readable to
    /// its end, so what the engine produced before it stopped is still counted.
    pub fn half_close(&mut self) {
        if let Some(conn) = self.conn.as_mut() {
            conn.shut_write();
        }
    }
}

impl Stream for UpstreamBody {
    type Item = Result<Bytes, hyper::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let mut drove = false;
        loop {
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        // Copied out (a few hundred bytes an event): a slice would share the
                        // connection's read buffer while the meter or the client's socket still
                        // holds it, and hyper would then allocate a new buffer for the next read
                        // instead of reusing this one.
                        return Poll::Ready(Some(Ok(Bytes::copy_from_slice(&data))));
                    }
                    // Trailers carry nothing the gateway uses.
                    drove = false;
                }
                Poll::Ready(Some(Err(e))) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    if let Some(conn) = this.conn.take() {
                        this.pool.release(conn, cx);
                    }
                    return Poll::Ready(None);
                }
                // The body waits for the socket: drive the connection, then look once more.
                Poll::Pending if !drove => {
                    drove = true;
                    if let Some(conn) = this.conn.as_mut() {
                        conn.drive(cx);
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
