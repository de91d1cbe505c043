//! The gateway's upstream connections (server/src/gateway/upstream_conn.rs) against a raw HTTP/1.1
//! server that counts connections: kept-alive connections are reused, a pooled connection the
//! engine closed is replaced without failing the request, and dropping a body mid-stream closes
//! its connection (that is how the engine learns the client left).

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

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

/// A server that answers each connection with `script` (which reads the requests itself);
/// returns the base URL and a count of connections.
async fn scripted<F, Fut>(script: F) -> (String, Arc<AtomicUsize>)
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", l.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let c = connections.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = l.accept().await.unwrap();
            tcp.set_nodelay(true).unwrap();
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(script(tcp));
        }
    });
    (base, connections)
}

/// Writes `bytes` one at a time, each its own TCP segment, so every read sees a fragment.
async fn trickle(tcp: &mut TcpStream, bytes: &[u8]) {
    for b in bytes {
        tcp.write_all(&[*b]).await.unwrap();
        tokio::task::yield_now().await;
    }
}

/// Reads a whole body; the error, if it broke.
async fn body_of(u: &Upstream) -> Result<Vec<u8>, String> {
    let r = u
        .send(Endpoint::Chat, Uuid::now_v7(), r#"{"model":"m"}"#.into())
        .await
        .map_err(|e| e.to_string())?;
    let mut body = r.body;
    let mut out = Vec::new();
    while let Some(b) = body.next().await {
        out.extend_from_slice(&b.map_err(|e| e.to_string())?);
    }
    Ok(out)
}

const SSE_CHUNKED: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
    transfer-encoding: chunked\r\n\r\nf\r\ndata: {\"a\":1}\n\n\r\n10;x=y\r\ndata: {\"bb\":2}\n\n\r\n\
    e\r\ndata: [DONE]\n\n\r\n0\r\nx-trailer: t\r\n\r\n";

#[tokio::test]
async fn a_chunked_answer_in_fragments_arrives_whole_and_the_connection_is_reused() {
    let (base, connections) = scripted(|mut tcp| async move {
        while raw_http::read_request(&mut tcp).await.is_some() {
            trickle(&mut tcp, SSE_CHUNKED).await;
        }
    })
    .await;
    let u = upstream(&base);
    for _ in 0..3 {
        assert_eq!(
            body_of(&u).await.unwrap(),
            b"data: {\"a\":1}\n\ndata: {\"bb\":2}\n\ndata: [DONE]\n\n"
        );
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn large_answers_arrive_intact_in_both_framings() {
    let (base, _) = scripted(|mut tcp| async move {
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut chunked = true;
        while raw_http::read_request(&mut tcp).await.is_some() {
            if chunked {
                tcp.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                    .await
                    .unwrap();
                for part in big.chunks(100_000) {
                    let framed =
                        [format!("{:X}\r\n", part.len()).as_bytes(), part, b"\r\n"].concat();
                    tcp.write_all(&framed).await.unwrap();
                }
                tcp.write_all(b"0\r\n\r\n").await.unwrap();
            } else {
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", big.len());
                tcp.write_all(&[head.as_bytes(), &big].concat())
                    .await
                    .unwrap();
            }
            chunked = !chunked;
        }
    })
    .await;
    let u = upstream(&base);
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    for _ in 0..2 {
        assert!(body_of(&u).await.unwrap() == big);
    }
}

#[tokio::test]
async fn connections_that_cannot_carry_another_request_are_not_reused() {
    // `connection: close`, a body delimited by the close, bytes after the body: each answer
    // arrives whole, and each request takes a new connection.
    let answers: [&[u8]; 3] = [
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA",
    ];
    for answer in answers {
        let (base, connections) = scripted(move |mut tcp| async move {
            if raw_http::read_request(&mut tcp).await.is_some() {
                tcp.write_all(answer).await.unwrap();
                // Keeps the socket open unless the answer says it ends with the close.
                if answer.windows(14).any(|w| w == b"content-length") {
                    let _ = raw_http::read_request(&mut tcp).await;
                }
            }
        })
        .await;
        let u = upstream(&base);
        for _ in 0..3 {
            assert_eq!(body_of(&u).await.unwrap(), b"ok");
        }
        assert_eq!(
            connections.load(Ordering::SeqCst),
            3,
            "{}",
            String::from_utf8_lossy(answer)
        );
    }
}

#[tokio::test]
async fn truncated_and_malformed_answers_are_errors() {
    let answers: [&[u8]; 4] = [
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabXX0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nnot-hex\r\n",
    ];
    for answer in answers {
        let (base, _) = scripted(move |mut tcp| async move {
            if raw_http::read_request(&mut tcp).await.is_some() {
                tcp.write_all(answer).await.unwrap();
            }
        })
        .await;
        let u = upstream(&base);
        assert!(
            body_of(&u).await.is_err(),
            "{}",
            String::from_utf8_lossy(answer)
        );
    }
    // No answer at all, and half a head.
    for answer in [&b""[..], b"HTTP/1.1 200 OK\r\ncontent-"] {
        let (base, _) = scripted(move |mut tcp| async move {
            if raw_http::read_request(&mut tcp).await.is_some() {
                tcp.write_all(answer).await.unwrap();
            }
        })
        .await;
        let u = upstream(&base);
        let e = u
            .send(Endpoint::Chat, Uuid::now_v7(), "{}".into())
            .await
            .err()
            .expect("an answer without a head is an error");
        assert!(e.to_string().contains("closed the connection"), "{e}");
    }
}

#[tokio::test]
async fn a_half_close_reaches_the_engine_and_what_it_sent_after_is_still_read() {
    // The engine streams until it reads end-of-file, then sends one last event and ends the body
    // properly: only a half-close (not a close) lets that event through.
    let (base, _) = scripted(|mut tcp| async move {
        use tokio::io::AsyncReadExt;
        raw_http::read_request(&mut tcp).await.unwrap();
        tcp.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        let (mut rd, mut wr) = tcp.split();
        let mut byte = [0u8; 1];
        {
            let eof = async { assert_eq!(rd.read(&mut byte).await.unwrap(), 0) };
            tokio::pin!(eof);
            loop {
                tokio::select! {
                    () = &mut eof => break,
                    () = tokio::time::sleep(Duration::from_millis(5)) => {
                        wr.write_all(b"9\r\ndata: x\n\n\r\n").await.unwrap();
                    }
                }
            }
        }
        wr.write_all(b"c\r\ndata: last\n\n\r\n0\r\n\r\n")
            .await
            .unwrap();
        // The gateway does not reuse a half-closed connection: it closes, we read nothing more.
        assert_eq!(rd.read(&mut byte).await.unwrap(), 0);
    })
    .await;
    let u = upstream(&base);
    let r = u
        .send(Endpoint::Chat, Uuid::now_v7(), "{}".into())
        .await
        .unwrap();
    let mut body = r.body;
    assert!(body
        .next()
        .await
        .unwrap()
        .unwrap()
        .starts_with(b"data: x\n\n"));
    body.half_close();
    let mut rest = Vec::new();
    let read = async {
        while let Some(b) = body.next().await {
            rest.extend_from_slice(&b.unwrap());
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("the engine saw end-of-file and ended the body");
    assert!(rest.ends_with(b"data: last\n\n"), "{rest:?}");
}
