//! The gateway tried as an attacker would: slow and idle connections, unauthenticated bodies,
//! floods of bad keys, and request fields a tenant must not hold.

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokenfactory::fleet::{self, BaseRegistration};
use tokenfactory::gateway::GatewayOptions;
use tokenfactory::http_server::{ServerMetrics, ServerOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A second listener on the test app's router, with `options`.
async fn serve_with(t: &TestApp, options: ServerOptions) -> (SocketAddr, Arc<ServerMetrics>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = Arc::new(ServerMetrics::default());
    tokio::spawn(tokenfactory::http_server::serve(
        listener,
        t.app.router.clone(),
        options,
        metrics.clone(),
        std::future::pending(),
    ));
    (addr, metrics)
}

/// Reads until the server closes the connection (or `limit` passes); returns what it sent and
/// whether it closed.
async fn read_until_closed(tcp: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Err(_) => return (out, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn slow_headers_and_idle_connections_are_closed(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let options = ServerOptions {
        header_timeout: Duration::from_millis(800),
        ..ServerOptions::default()
    };
    let (addr, metrics) = serve_with(&t, options).await;

    // Slowloris: a header byte every 200 ms never completes a head.
    let mut slow = Vec::new();
    for _ in 0..30 {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"P").await.unwrap();
        slow.push(tcp);
    }
    // Idle: connected and silent.
    let mut idle = Vec::new();
    for _ in 0..30 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let dripping = tokio::spawn(async move {
        let started = Instant::now();
        let mut closed = vec![None; slow.len()];
        while closed.iter().any(Option::is_none) && started.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            for (i, tcp) in slow.iter_mut().enumerate() {
                if closed[i].is_none() && tcp.write_all(b"O").await.is_err() {
                    closed[i] = Some(started.elapsed());
                }
                let mut b = [0u8; 64];
                if closed[i].is_none() {
                    if let Ok(Ok(0)) =
                        tokio::time::timeout(Duration::from_millis(1), tcp.read(&mut b)).await
                    {
                        closed[i] = Some(started.elapsed());
                    }
                }
            }
        }
        closed
    });
    for tcp in &mut idle {
        let (_, closed) = read_until_closed(tcp, Duration::from_secs(5)).await;
        assert!(
            closed,
            "an idle connection stayed open past the header timeout"
        );
    }
    for c in dripping.await.unwrap() {
        let at = c.expect("a slowloris connection stayed open");
        assert!(at < Duration::from_secs(5), "closed only after {at:?}");
    }
    // A keep-alive connection that went quiet after a response is closed the same way.
    let key = t.tenant("acme").await.key;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!("GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let (answer, closed) = read_until_closed(&mut tcp, Duration::from_secs(5)).await;
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    assert!(closed, "an idle keep-alive connection stayed open");
    let open = || async {
        match metrics.open() {
            0 => Ok(()),
            n => Err(n),
        }
    };
    eventually(Duration::from_secs(2), "every connection closed", open).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn connections_past_the_cap_wait_for_a_slot(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let options = ServerOptions {
        max_connections: 2,
        header_timeout: Duration::from_secs(30),
    };
    let (addr, metrics) = serve_with(&t, options).await;
    let held: Vec<_> = futures::future::join_all((0..2).map(|_| TcpStream::connect(addr))).await;
    let open = || async {
        match metrics.open() {
            2 => Ok(()),
            n => Err(n),
        }
    };
    eventually(Duration::from_secs(1), "two connections open", open).await;
    // The third is not served while the two are open.
    let mut third = TcpStream::connect(addr).await.unwrap();
    third
        .write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut b = [0u8; 16];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), third.read(&mut b))
            .await
            .is_err(),
        "a connection past the cap was served"
    );
    drop(held);
    let (answer, _) = read_until_closed(&mut third, Duration::from_millis(1500)).await;
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 401"),
        "served once a slot freed: {}",
        String::from_utf8_lossy(&answer)
    );
}

/// Resident memory of this process (the server runs in it), in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[sqlx::test(migrations = "../migrations")]
async fn unauthenticated_bodies_are_never_buffered(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    const BODY: usize = 8 * 1024 * 1024 - 1;
    let before = rss();
    let mut conns = Vec::new();
    for _ in 0..40 {
        let mut tcp = TcpStream::connect(t.addr).await.unwrap();
        tcp.write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer tf-nope\r\n\
                 content-type: application/json\r\ncontent-length: {}\r\n\r\n",
                BODY + 1
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        conns.push(tcp);
    }
    // The answer comes from the headers alone: no body byte was sent.
    let zeros = vec![b' '; 1 << 20];
    for tcp in &mut conns {
        let mut head = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(5), tcp.read_exact(&mut head))
            .await
            .expect("no answer before the body")
            .unwrap();
        assert_eq!(&head, b"HTTP/1.1 401");
        // Whatever the client pushes now is not kept by the server.
        for _ in 0..8 {
            if tokio::time::timeout(Duration::from_millis(50), tcp.write_all(&zeros))
                .await
                .map_or(true, |r| r.is_err())
            {
                break;
            }
        }
    }
    let grown = rss().saturating_sub(before);
    println!("RSS grew by {} MB for 40 stalled 8 MB bodies", grown >> 20);
    assert!(grown < 64 << 20, "RSS grew by {} MB", grown >> 20);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_body_slower_than_the_minimum_rate_gets_408(pool: PgPool) {
    let gateway = GatewayOptions {
        body_timeout_ms: 400,
        body_min_bytes_per_sec: 1000,
        ..GatewayOptions::default()
    };
    let t = TestApp::builder(pool).gateway(gateway).start().await;
    let key = t.tenant("acme").await.key;
    let mut tcp = TcpStream::connect(t.addr).await.unwrap();
    let started = Instant::now();
    tcp.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\
             content-type: application/json\r\ncontent-length: 100000\r\n\r\n{{\"model\":"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let (answer, closed) = read_until_closed(&mut tcp, Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"request_timeout\""), "{text}");
    assert!(closed);
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert!(t.events().await.is_empty(), "nothing reached an engine");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_flood_of_bad_keys_is_refused_and_keeps_good_keys(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let good = t.tenant("acme").await.key;
    let models = |key: String| {
        let http = t.http.clone();
        let url = t.url("/v1/models");
        async move { http.get(url).bearer_auth(key).send().await.unwrap() }
    };
    assert_eq!(models(good.clone()).await.status(), 200);
    let mut statuses = Vec::new();
    for i in 0..200 {
        statuses.push(models(format!("tf-random-{i}")).await.status().as_u16());
    }
    assert!(statuses[..10].iter().all(|s| *s == 401), "{statuses:?}");
    assert!(statuses[150..].iter().all(|s| *s == 429), "{statuses:?}");
    // One bad key sent again and again costs one lookup (the unknown-key cache).
    let before = t.app.gateway.keys.lookups();
    for _ in 0..50 {
        assert_eq!(models("tf-one-more".into()).await.status(), 429);
    }
    let lookups = t.app.gateway.keys.lookups() - before;
    assert_eq!(
        lookups, 1,
        "{lookups} PostgreSQL lookups for one repeated bad key"
    );
    let refused = models("tf-yet-another".into()).await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error");
    // The good key, known to the cache, keeps working from the same address.
    assert_eq!(models(good).await.status(), 200);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_valid_key_behind_an_address_full_of_bad_keys_is_served(pool: PgPool) {
    let t = TestApp::builder(pool.clone()).start().await;
    let old = t.tenant("acme").await;
    let models = |addr: SocketAddr, key: String| {
        let http = t.http.clone();
        async move {
            http.get(format!("http://{addr}/v1/models"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let flood = |addr: SocketAddr| async move {
        let mut last = 0;
        for i in 0..(tokenfactory::gateway::auth::FAILURES_PER_WINDOW + 5) {
            last = models(addr, format!("tf-bogus-{i}")).await;
        }
        last
    };
    assert_eq!(flood(t.addr).await, 429, "the address is over its limit");
    // A key issued now, never seen by this replica, from the same address.
    let (_, fresh) = tf_core::keys::issue(&pool, old.id, "new").await.unwrap();
    assert_eq!(models(t.addr, fresh.clone()).await, 200);
    assert_eq!(models(t.addr, "tf-bogus-after".into()).await, 429);

    // A restarted replica: empty key cache; the address floods it first.
    let restarted = TestApp::builder(pool).replica_of(&t).start().await;
    assert_eq!(flood(restarted.addr).await, 429);
    assert_eq!(models(restarted.addr, old.key.clone()).await, 200);
    assert_eq!(models(restarted.addr, fresh).await, 200);
}

/// Behind a trusted proxy (the test's loopback peer plays the ingress), bad keys count against
/// the client its `X-Forwarded-For` names, per IPv4 address or IPv6 /64: one flooding client is
/// refused, its neighbours behind the same ingress are not. From a peer that is not a trusted
/// proxy the header is ignored (a client cannot spread its failures over invented addresses).
#[sqlx::test(migrations = "../migrations")]
async fn bad_keys_count_by_the_client_a_trusted_proxy_names(pool: PgPool) {
    let t = TestApp::builder(pool)
        .trusted_proxies("127.0.0.1/32")
        .start()
        .await;
    let good = t.tenant("acme").await.key;
    let models = |http: reqwest::Client, forwarded: String, key: String| {
        let url = t.url("/v1/models");
        async move {
            http.get(url)
                .bearer_auth(key)
                .header("x-forwarded-for", forwarded)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let ingress = t.http.clone();
    let over = tokenfactory::gateway::auth::FAILURES_PER_WINDOW + 3;
    let mut last = 0;
    for i in 0..over {
        last = models(
            ingress.clone(),
            "203.0.113.7".into(),
            format!("tf-bad-a{i}"),
        )
        .await;
    }
    assert_eq!(last, 429, "the flooding client is refused");
    assert_eq!(
        models(ingress.clone(), "198.51.100.20".into(), "tf-bad-b".into()).await,
        401,
        "its neighbour behind the same ingress is not"
    );
    assert_eq!(
        models(ingress.clone(), "203.0.113.7".into(), good.clone()).await,
        200,
        "a real key from the flooding client still works"
    );

    // IPv6: one /64 is one client, whichever addresses in it are used.
    for i in 0..over {
        let addr = format!("2001:db8:1:2::{:x}", i + 1);
        last = models(ingress.clone(), addr, format!("tf-bad-c{i}")).await;
    }
    assert_eq!(last, 429);
    assert_eq!(
        models(
            ingress.clone(),
            "2001:db8:1:2:ffff::9".into(),
            "tf-bad-d".into()
        )
        .await,
        429,
        "same /64"
    );
    assert_eq!(
        models(ingress.clone(), "2001:db8:1:3::1".into(), "tf-bad-e".into()).await,
        401,
        "another /64"
    );

    // 127.0.0.2 is not a trusted proxy: its forwarded addresses are ignored, all its failures
    // are its own.
    let direct = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    for i in 0..over {
        last = models(
            direct.clone(),
            format!("192.0.2.{i}"),
            format!("tf-bad-f{i}"),
        )
        .await;
    }
    assert_eq!(last, 429);
    assert_eq!(
        models(ingress, "192.0.2.200".into(), "tf-bad-g".into()).await,
        401,
        "the addresses it named were never counted"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn engine_control_fields_are_stripped_and_salts_cannot_be_borrowed(pool: PgPool) {
    let t = TestApp::builder(pool.clone()).start().await;
    // A base with the default policy (the test base lets `sim` through to drive the simulator).
    fleet::register_bases(
        &pool,
        "static",
        &[BaseRegistration {
            name: "strict-base".into(),
            graph: "graph-b".into(),
            upstream_url: format!("http://{}/v1", t.sim_addr),
            upstream_model: BASE.into(),
            continuous_usage: true,
            denied_fields: None,
            prompt_estimator: Default::default(),
            kind: tf_core::endpoint::ModelKind::Chat,
            nvext_allowed: None,
        }],
    )
    .await
    .unwrap();
    t.app.gateway.routes.reload().await.unwrap();
    let a = t.tenant("acme").await;
    let mut body = chat("strict-base", "hello world", 5);
    body["sim"] = json!({"completion_tokens": 400});
    body["priority"] = json!(-100);
    body["nvext"] = json!({"cache_salt": "victim-salt", "top_k": 3});
    let r = t
        .post(&a.key, "/v1/chat/completions", body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = request_id(&r);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["usage"]["completion_tokens"], 5,
        "the client's sim block was honoured"
    );
    let truth = t.ledger_entry(&id).await;
    assert_eq!(truth.completion_tokens, 5);
    assert_eq!(
        truth.cache_salt.as_deref(),
        Some(format!("{}:victim-salt", a.id).as_str()),
        "a client's own salt stays inside its tenant"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn n_and_best_of_count_in_the_admission_estimate(pool: PgPool) {
    let t = TestApp::builder(pool.clone()).start().await;
    let a = t.tenant("acme").await;
    admin_limits(&pool, &["--key", &a.key, "--tpm", "100"]).await;
    // 7 prompt tokens + 30: fits once; with n = 4 the engine may write 120: refused.
    let mut body = chat(BASE, "hello world", 30);
    body["n"] = json!(4);
    let r = t
        .post(&a.key, "/v1/chat/completions", body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429, "{}", r.text().await.unwrap());
    body["n"] = json!(1);
    body["best_of"] = json!(3);
    let r = t
        .post(&a.key, "/v1/completions", body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let r = t
        .post(
            &a.key,
            "/v1/chat/completions",
            chat(BASE, "hello world", 30),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[sqlx::test(migrations = "../migrations")]
async fn stream_options_are_checked_as_openai_does(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;
    for (extra, param) in [
        (
            json!({"stream": false, "stream_options": {"include_usage": true}}),
            "stream_options",
        ),
        (
            json!({"stream": true, "stream_options": {"include_usage": "yes"}}),
            "stream_options.include_usage",
        ),
        (
            json!({"stream": true, "stream_options": 3}),
            "stream_options",
        ),
    ] {
        let mut body = chat(BASE, "hello", 3);
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = t
            .post(&a.key, "/v1/chat/completions", body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    assert!(t.sim.ledger().is_empty(), "nothing was forwarded");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_long_model_name_is_echoed_truncated(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;
    let name = "é".repeat(10_000);
    let r = t
        .post(&a.key, "/v1/chat/completions", chat(&name, "hello", 3))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.chars().count() < 300, "{} chars", message.len());
    assert!(message.contains(&"é".repeat(128)));
}
