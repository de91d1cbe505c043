//! The token in flight at a hang-up: an engine that was producing a token when the client left
//! writes it after it learned of the hang-up. The gateway passes the hang-up on as a half-close
//! and reads on, so that token is billed; a gateway that closed the connection outright would
//! never read it (the race behind an aborted stream billed one token short).

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::json;
use sqlx::PgPool;
use tokenfactory::fleet::{self, BaseRegistration};
use tokenfactory::usage::{Provenance, UsageStatus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const RACY: &str = "racy-base";

/// What the raw engine saw.
#[derive(Default)]
struct Seen {
    /// The gateway's end-of-file arrived while the stream was running.
    cancelled: AtomicBool,
}

fn chunk(tokens: u32) -> Vec<u8> {
    let event = format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"{RACY}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{tokens} \"}},\"finish_reason\":null}}],\"usage\":{{\"prompt_tokens\":7,\"completion_tokens\":{tokens},\"total_tokens\":{}}}}}\n\n",
        7 + tokens
    );
    [
        format!("{:x}\r\n", event.len()).as_bytes(),
        event.as_bytes(),
        b"\r\n",
    ]
    .concat()
}

/// One streamed answer: token 1, then wait for the gateway's end-of-file, then the token that was
/// being produced meanwhile (token 2), then close.
async fn serve(mut tcp: TcpStream, seen: Arc<Seen>) {
    raw_http::read_request(&mut tcp).await.unwrap();
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&chunk(1)).await.unwrap();
    let mut rest = [0u8; 64];
    let eof = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut rest)).await;
    assert!(
        matches!(eof, Ok(Ok(0))),
        "the gateway never told the engine"
    );
    seen.cancelled.store(true, Ordering::SeqCst);
    // Written into a socket the gateway may have closed: only a half-close lets it arrive.
    let _ = tcp.write_all(&chunk(2)).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn the_token_in_flight_at_a_hang_up_is_billed(pool: PgPool) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let engine = l.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = l.accept().await.unwrap();
            tokio::spawn(serve(tcp, s.clone()));
        }
    });
    fleet::register_bases(
        &pool,
        "static",
        &[BaseRegistration {
            name: RACY.into(),
            graph: "graph-racy".into(),
            upstream_url: format!("http://{engine}/v1"),
            upstream_model: RACY.into(),
            continuous_usage: true,
            denied_fields: Some(tokenfactory::engine_policy::EnginePolicy::denied_except(&[
                "sim",
            ])),
            prompt_estimator: tokenfactory::engine_policy::PromptEstimator::SimWords,
            kind: tf_core::endpoint::ModelKind::Chat,
            nvext_allowed: None,
        }],
    )
    .await
    .unwrap();
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;

    for _ in 0..2 {
        let mut body = chat(RACY, "hello", 16);
        body["stream"] = json!(true);
        let r = t
            .post(&a.key, "/v1/chat/completions", body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let id = request_id(&r);
        assert_eq!(read_events_then_hang_up(r, 1).await, 1);
        let ev = t.event(&id).await;
        assert!(seen.cancelled.swap(false, Ordering::SeqCst));
        assert_eq!(ev.status, UsageStatus::ClientAbort);
        assert_eq!(ev.provenance, Provenance::Partial);
        assert_eq!(
            (ev.prompt_tokens, ev.completion_tokens),
            (7, 2),
            "the engine produced two tokens"
        );
    }
}
