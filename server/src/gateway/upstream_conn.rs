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
//! so the tokens it produced can be counted from its own output.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

type Driver = Connection<TokioIo<TcpStream>, Full<Bytes>>;

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
    /// A second handle on the socket (the driver owns the first), to shut its write side while
    /// the driver keeps reading. `None` once shut: the connection never goes back to the pool.
    write_half: Option<std::net::TcpStream>,
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
        self.write_half.is_some()
            && self.drive(cx)
            && matches!(self.sender.poll_ready(cx), Poll::Ready(Ok(())))
    }

    /// Sends FIN: the engine reads end-of-file and cancels; its output so far can still be read.
    fn shut_write(&mut self) {
        if let Some(socket) = self.write_half.take() {
            if let Err(e) = socket.shutdown(std::net::Shutdown::Write) {
                tracing::debug!(error = %e, "half-close of an upstream connection failed");
            }
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
        let connect_err = |e: std::io::Error| UpstreamFailure::Connect(self.addr.clone(), e);
        let std_tcp = tcp.into_std().map_err(connect_err)?;
        let write_half = std_tcp.try_clone().map_err(connect_err)?;
        let tcp = TcpStream::from_std(std_tcp).map_err(connect_err)?;
        let (sender, driver) = http1::Builder::new().handshake(TokioIo::new(tcp)).await?;
        Ok(Conn {
            sender,
            driver: Some(driver),
            write_half: Some(write_half),
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
                        return Poll::Ready(Some(Ok(data)));
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
