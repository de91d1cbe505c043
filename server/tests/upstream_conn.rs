//! The gateway's upstream connections (server/src/gateway/upstream_conn.rs) against a raw HTTP/1.1
//! server that counts connections: kept-alive connections are reused, a pooled connection the
//! engine closed is replaced without failing the request, and dropping a body mid-stream closes
//! its connection (that is how the engine learns the client left).

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::raw_http;
use futures::StreamExt;
use tokenfactory::endpoint::Endpoint;
use tokenfactory::gateway::upstream::{Upstream, UpstreamOptions};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use uuid::Uuid;

/// How the test server behaves after answering.
#[derive(Clone, Copy)]
enum After {
    /// Keep the connection for the next request.
    KeepAlive,
    /// Close it shortly after answering, without saying so (a keep-alive timeout on the engine).
    CloseQuietly,
    /// Stream chunks until the client goes away; count the goodbye.
    StreamForever,
}

struct Server {
    base: String,
    connections: Arc<AtomicUsize>,
    hung_up: Arc<AtomicUsize>,
}

async fn server(after: After) -> Server {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", l.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let hung_up = Arc::new(AtomicUsize::new(0));
    let (c, h) = (connections.clone(), hung_up.clone());
    tokio::spawn(async move {
        loop {
            let (tcp, _) = l.accept().await.unwrap();
            tcp.set_nodelay(true).unwrap();
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(tcp, after, h.clone()));
        }
    });
    Server {
        base,
        connections,
        hung_up,
    }
}

/// Reads one request and checks its head; `false` at EOF.
async fn read_request(tcp: &mut TcpStream) -> bool {
    let Some(head) = raw_http::read_request(tcp).await else {
        return false;
    };
    assert!(
        head.starts_with("post /v1/chat/completions http/1.1\r\n"),
        "{head}"
    );
    assert!(head.contains("\r\nhost: 127.0.0.1:"), "{head}");
    assert!(head.contains("\r\nx-request-id: "), "{head}");
    true
}

async fn serve(mut tcp: TcpStream, after: After, hung_up: Arc<AtomicUsize>) {
    while read_request(&mut tcp).await {
        match after {
            After::KeepAlive | After::CloseQuietly => {
                let body = br#"{"ok":true}"#;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                tcp.write_all(head.as_bytes()).await.unwrap();
                tcp.write_all(body).await.unwrap();
                if matches!(after, After::CloseQuietly) {
                    return;
                }
            }
            After::StreamForever => {
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                tcp.write_all(head.as_bytes()).await.unwrap();
                let chunk = b"data: {}\n\n";
                loop {
                    let framed =
                        [format!("{:x}\r\n", chunk.len()).as_bytes(), chunk, b"\r\n"].concat();
                    if tcp.write_all(&framed).await.is_err() {
                        hung_up.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }
}

fn upstream(base: &str) -> Upstream {
    Upstream::new(
        base,
        &UpstreamOptions {
            connect_timeout: Duration::from_secs(2),
            first_byte_timeout: Duration::from_secs(5),
            chunk_timeout: Duration::from_secs(5),
            pool_idle_per_host: 8,
        },
    )
    .unwrap()
}

async fn call(u: &Upstream) -> Vec<u8> {
    let r = u
        .send(Endpoint::Chat, Uuid::now_v7(), r#"{"model":"m"}"#.into())
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let mut body = r.body;
    let mut out = Vec::new();
    while let Some(b) = body.next().await {
        out.extend_from_slice(&b.unwrap());
    }
    out
}

#[tokio::test]
async fn kept_alive_connections_are_reused() {
    let s = server(After::KeepAlive).await;
    let u = upstream(&s.base);
    for _ in 0..50 {
        assert_eq!(call(&u).await, br#"{"ok":true}"#);
    }
    assert_eq!(
        s.connections.load(Ordering::SeqCst),
        1,
        "one connection, reused"
    );
    // Concurrent requests open more, and they are pooled for later.
    let burst: Vec<_> = (0..4).map(|_| call(&u)).collect();
    futures::future::join_all(burst).await;
    let opened = s.connections.load(Ordering::SeqCst);
    assert!(
        opened <= 4,
        "{opened} connections for 4 concurrent requests"
    );
    for _ in 0..20 {
        call(&u).await;
    }
    assert_eq!(s.connections.load(Ordering::SeqCst), opened);
}

#[tokio::test]
async fn a_pooled_connection_the_engine_closed_is_replaced() {
    let s = server(After::CloseQuietly).await;
    let u = upstream(&s.base);
    for _ in 0..10 {
        assert_eq!(call(&u).await, br#"{"ok":true}"#);
        // Let the engine's close arrive while the connection sits in the pool.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.connections.load(Ordering::SeqCst), 10);
}

#[tokio::test]
async fn dropping_a_body_mid_stream_closes_its_connection() {
    let s = server(After::StreamForever).await;
    let u = upstream(&s.base);
    let r = u
        .send(Endpoint::Chat, Uuid::now_v7(), "{}".into())
        .await
        .unwrap();
    let mut body = r.body;
    for _ in 0..3 {
        assert_eq!(&body.next().await.unwrap().unwrap()[..], b"data: {}\n\n");
    }
    drop(body);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while s.hung_up.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the engine never saw the client leave"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
