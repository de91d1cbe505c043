//! The ceiling the gateway is measured against (issue 35): a bare HTTP/1 pass-through in a few
//! dozen lines of hyper (no auth, no resolution, no admission, no metering), one upstream
//! connection per client connection, bodies relayed as they come. What the gateway costs beyond
//! this is what its features cost. The gateway bench runs it in its own process; the streams bench
//! runs it as a process of its own, as it runs the gateway.

#![allow(
    clippy::disallowed_methods,
    reason = "the pass-through serves until the benchmark process exits; nothing waits for it at shutdown"
)]

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Serves the pass-through on a new port; returns its address.
pub async fn serve(upstream: SocketAddr) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve_on(l, upstream));
    addr
}

/// Accepts connections on `l` and relays each one's requests to `upstream`, forever.
pub async fn serve_on(l: TcpListener, upstream: SocketAddr) {
    loop {
        let (client, _) = l.accept().await.unwrap();
        client.set_nodelay(true).unwrap();
        tokio::spawn(async move {
            let up = tokio::net::TcpStream::connect(upstream).await.unwrap();
            up.set_nodelay(true).unwrap();
            let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(up))
                .await
                .unwrap();
            tokio::spawn(conn);
            let send = Arc::new(tokio::sync::Mutex::new(send));
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let send = send.clone();
                    async move {
                        let mut send = send.lock().await;
                        send.ready().await?;
                        send.send_request(req).await
                    }
                });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(client), service)
                .await;
        });
    }
}
