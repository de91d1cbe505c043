//! Serving client connections (portal and `/v1`) with the bounds `axum::serve` lacks: a deadline
//! for each request head, which also closes idle keep-alive connections and ones that never send
//! anything (slowloris), and a cap on open connections (further ones wait in the listen backlog).
//! Request bodies are bounded by the gateway itself, after authentication (`gateway::body`).
//!
//! Shutdown: stop accepting, tell every connection to close once its current response is done,
//! and resolve when all are closed (the caller puts its drain deadline around that).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// Bounds on client connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerOptions {
    /// Time to send a complete request head, from when the connection opens or its previous
    /// response ends (hyper starts its header timer then), so also the idle keep-alive timeout.
    pub header_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(30),
            max_connections: 16_384,
        }
    }
}

/// Connection counters for `/metrics`.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    open: AtomicU64,
    accepted: AtomicU64,
    accept_errors: AtomicU64,
}

impl ServerMetrics {
    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// Appends the Prometheus text lines.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "# TYPE tf_http_connections_open gauge\ntf_http_connections_open {}",
            self.open()
        );
        let _ = writeln!(
            out,
            "# TYPE tf_http_connections_accepted_total counter\ntf_http_connections_accepted_total {}",
            self.accepted.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# TYPE tf_http_accept_errors_total counter\ntf_http_accept_errors_total {}",
            self.accept_errors.load(Ordering::Relaxed)
        );
    }
}

/// After an accept error that is not the peer's (out of descriptors, most often), how long the
/// loop waits before accepting again; connections already open carry on meanwhile.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` until `shutdown` resolves, then until every connection closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    options: ServerOptions,
    metrics: Arc<ServerMetrics>,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(options.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let connections = TaskTracker::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(options.header_timeout)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (tcp, remote) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    metrics.accept_errors.fetch_add(1, Ordering::Relaxed);
                    if !is_peer_error(&e) {
                        tracing::warn!(error = %e, "accept failed; new connections wait");
                        tokio::select! {
                            () = &mut shutdown => break,
                            () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                        }
                    }
                    continue;
                }
            },
        };
        // A streamed chunk leaves at once instead of waiting behind an unacknowledged one.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        metrics.accepted.fetch_add(1, Ordering::Relaxed);
        metrics.open.fetch_add(1, Ordering::Relaxed);
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut()
                .insert(ConnectInfo::<SocketAddr>(remote));
            router.clone().oneshot(req.map(axum::body::Body::new))
        });
        let conn = graceful.watch(http.serve_connection(TokioIo::new(tcp), service));
        let metrics = metrics.clone();
        connections.spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "client connection ended with an error");
            }
            metrics.open.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    connections.close();
    connections.wait().await;
}

/// Errors of one connection that was already gone, which say nothing about the listener.
fn is_peer_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}
