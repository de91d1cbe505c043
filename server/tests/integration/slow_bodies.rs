//! Slow bodies outside `/v1`: hundreds of connections each declaring a 1 MB body to `/api/login`
//! or to the adapter upload route and sending a byte now and then are cut by the body deadline
//! (short ones configured here), an interrupted upload is rejected rather than left `uploading`,
//! `/v1/models` answers meanwhile, and a fast upload under the same bounds goes through.

#![allow(
    clippy::disallowed_methods,
    reason = "test load generators run until the test ends"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::lifecycle::{multipart, offer, on_sim, valid_adapter, LORA_BASE};
use common::{eventually, TestApp};
use sqlx::PgPool;
use tf_engine_sim::SimConfig;
use tokenfactory::fleet::sim_fleet::SimFleet;
use tokenfactory::gateway::GatewayOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What [`trickle`] returns as the answer when the connection was reset before any answer bytes.
const RESET: &str = "<reset>";

/// Sends `head` and `start`, then one byte every 100 ms; returns how long the server took to
/// close the connection (`None`: still open after 5 s) and what it answered.
async fn trickle(addr: SocketAddr, head: String, start: Vec<u8>) -> (Option<Duration>, String) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let opened = Instant::now();
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&start).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    // A reset the kernel reports to one of our writes is not reported again to the next read,
    // which then sees a plain end: that end, with nothing read, is the same reset.
    let mut write_failed = false;
    while opened.elapsed() < Duration::from_secs(5) {
        tokio::select! {
            read = tcp.read(&mut buf) => match read {
                Ok(0) if write_failed && answer.is_empty() => {
                    return (Some(opened.elapsed()), RESET.to_owned());
                }
                Ok(0) => {
                    return (Some(opened.elapsed()), String::from_utf8_lossy(&answer).into());
                }
                // The server closed with our last byte unread: the kernel answers it with a
                // reset, which can overtake the 408 already sent (a race of TCP, not the server).
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && answer.is_empty() => {
                    return (Some(opened.elapsed()), RESET.to_owned());
                }
                Err(_) => {
                    return (Some(opened.elapsed()), String::from_utf8_lossy(&answer).into());
                }
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            },
            _ = tick.tick() => {
                write_failed |= tcp.write_all(b"x").await.is_err();
            }
        }
    }
    (None, String::from_utf8_lossy(&answer).into())
}

#[sqlx::test(migrations = "../migrations")]
async fn a_slow_body_flood_is_cut_and_v1_keeps_answering(pool: PgPool) {
    offer(&pool, LORA_BASE, 1, true).await;
    let fleet = Arc::new(SimFleet::new(
        TaskTracker::new(),
        CancellationToken::new(),
        SimConfig::default(),
    ));
    let dir = tempfile::tempdir().unwrap();
    let gateway = GatewayOptions {
        body_timeout_ms: 500,
        body_min_bytes_per_sec: 1000,
        ..GatewayOptions::default()
    };
    let t = TestApp::builder(pool)
        .lifecycle(on_sim(&fleet, &dir))
        .gateway(gateway)
        .start()
        .await;
    let tenant = t.tenant("acme").await;

    let login_head = "POST /api/login HTTP/1.1\r\nhost: x\r\n\
                      content-type: application/x-www-form-urlencoded\r\n\
                      content-length: 1000000\r\n\r\n"
        .to_owned();
    let mut flood = Vec::new();
    for _ in 0..250 {
        flood.push(tokio::spawn(trickle(
            t.addr,
            login_head.clone(),
            b"csrf=".to_vec(),
        )));
    }
    let (ct, _) = multipart(&[], &[]);
    let uploads: Vec<String> = (0..50).map(|i| format!("slow-{i}")).collect();
    let mut slow_uploads = Vec::new();
    for name in &uploads {
        let head = format!(
            "POST /api/v1/adapters HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\
             content-type: {ct}\r\ncontent-length: 1000000\r\n\r\n",
            tenant.key
        );
        // The name and base fields, then the start of a file: the upload has begun.
        let (_, fields) = multipart(&[("name", name), ("base", LORA_BASE)], &[]);
        let mut start = fields[..fields.len() - "--tf-test-boundary-7d3c--\r\n".len()].to_vec();
        start.extend_from_slice(
            b"--tf-test-boundary-7d3c\r\nContent-Disposition: form-data; \
              name=\"adapter_config.json\"; filename=\"adapter_config.json\"\r\n\r\n{",
        );
        slow_uploads.push(tokio::spawn(trickle(t.addr, head, start)));
    }

    // Meanwhile a key holder is served at once.
    for _ in 0..5 {
        let asked = Instant::now();
        let r = t
            .http
            .get(t.url("/v1/models"))
            .bearer_auth(&tenant.key)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "{:?}",
            asked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut slowest = Duration::ZERO;
    let mut timed_out = 0;
    for c in flood {
        let (closed, answer) = c.await.unwrap();
        let closed = closed.expect("a slow login body was cut");
        slowest = slowest.max(closed);
        assert!(
            answer.starts_with("HTTP/1.1 408") || answer == RESET,
            "{answer}"
        );
        timed_out += usize::from(answer.starts_with("HTTP/1.1 408"));
    }
    // A reset can overtake the 408 now and then; most clients read it.
    assert!(timed_out >= 200, "{timed_out} of 250 read the 408");
    let mut refused = 0;
    for c in slow_uploads {
        let (closed, answer) = c.await.unwrap();
        slowest = slowest.max(closed.expect("a slow upload was cut"));
        assert!(
            answer.starts_with("HTTP/1.1 4") || answer == RESET,
            "{answer}"
        );
        refused += usize::from(answer.starts_with("HTTP/1.1 4"));
    }
    assert!(refused >= 40, "{refused} of 50 read the refusal");
    println!("300 slow bodies, the last cut after {slowest:?}");
    assert!(slowest < Duration::from_secs(3), "{slowest:?}");

    // The interrupted uploads are rejected, not left `uploading`.
    for name in &uploads {
        eventually(Duration::from_secs(5), "the slow upload rejected", || {
            let t = &t;
            let tenant = &tenant;
            async move {
                let (_, view) = t.manage(tenant, name, "get").await;
                view["state"] == "rejected"
            }
        })
        .await;
    }

    // A fast upload under the same bounds goes through.
    let (config, weights) = valid_adapter(LORA_BASE);
    let (status, view) = t
        .upload(&tenant, "fast", LORA_BASE, &config, &weights)
        .await;
    assert_eq!(status, 201, "{view}");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_form_larger_than_the_bound_is_refused_before_any_handler(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let r = t
        .http
        .post(t.url("/api/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(vec![b'a'; GatewayOptions::default().max_form_bytes + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
}
