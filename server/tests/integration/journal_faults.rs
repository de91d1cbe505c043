//! Failure policy with real processes: the gateway is a child process the test kills. Each test
//! checks the usage table against the engine simulator's ground-truth ledger.

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::chaos::ChaosProxy;
use common::client::{self, Outcome};
use common::process::Gateway;
use common::{eventually, TestApp};
use serde_json::json;
use sqlx::PgPool;
use tokenfactory::usage::UsageStatus;
use tokenfactory::usage_store;

fn stream_body(max_tokens: u32, interval_ms: u64) -> serde_json::Value {
    json!({"model": "sim-base", "messages": [{"role": "user", "content": "fault tolerant metering"}],
           "max_tokens": max_tokens, "stream": true, "sim": {"token_interval_ms": interval_ms}})
}

/// Waits (bounded) until the usage table has at least `n` rows; returns them all.
async fn wait_for_events(pool: &PgPool, n: usize) -> Vec<tokenfactory::usage::UsageEvent> {
    eventually(
        Duration::from_secs(30),
        &format!("{n} usage events"),
        || async {
            let events = usage_store::query(pool, None, None, None).await.unwrap();
            if events.len() >= n {
                Ok(events)
            } else {
                Err(format!("{} events", events.len()))
            }
        },
    )
    .await
}

/// `n` clients each streaming `body` once; resolves once every response head has arrived (each
/// stream is in flight), with the clients still reading.
async fn in_flight(
    gw: &Gateway,
    n: usize,
    body: serde_json::Value,
) -> Vec<tokio::task::JoinHandle<Outcome>> {
    let (url, key) = (gw.url("/v1/chat/completions"), gw.key.clone());
    let http = reqwest::Client::new();
    let heads = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..n)
        .map(|_| {
            let (http, url, key, body, heads) = (
                http.clone(),
                url.clone(),
                key.clone(),
                body.clone(),
                heads.clone(),
            );
            tokio::spawn(async move {
                client::send_counting_heads(&http, &url, &key, &body, None, &heads).await
            })
        })
        .collect();
    eventually(
        Duration::from_secs(10),
        &format!("{n} streams in flight"),
        || async { heads.load(Ordering::SeqCst) == n },
    )
    .await;
    clients
}

/// Runs `clients` loops sending `body` until `stop`.
fn load(
    gw: &Gateway,
    clients: usize,
    body: serde_json::Value,
    stop: Instant,
) -> tokio::task::JoinHandle<Vec<Outcome>> {
    let url = gw.url("/v1/chat/completions");
    let key = gw.key.clone();
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        let tasks: Vec<_> = (0..clients)
            .map(|_| {
                let (http, url, key, body) = (http.clone(), url.clone(), key.clone(), body.clone());
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    while Instant::now() < stop {
                        let o = client::send(&http, &url, &key, &body, None).await;
                        let failed = o.request_id.is_none();
                        out.push(o);
                        if failed {
                            break;
                        }
                    }
                    out
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    })
}

#[sqlx::test(migrations = "../migrations")]
async fn sigkill_loses_no_answered_request_and_invents_none(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let deployment = TestApp::builder(pool.clone())
        .durability("process")
        .drain_seconds(5)
        .process(dir.path())
        .await;
    let sim = &deployment.sim;
    let gw = deployment.start().await;
    let outcomes = load(
        &gw,
        32,
        stream_body(6, 2),
        Instant::now() + Duration::from_secs(30),
    );
    // Killed under load: once the engine has served enough requests to prove something, with
    // every client's next stream in flight.
    eventually(
        Duration::from_secs(25),
        "200 requests served before the kill",
        || async { sim.ledger().len() >= 200 },
    )
    .await;
    gw.kill().await;
    let outcomes = outcomes.await.unwrap();
    let answered: Vec<_> = outcomes
        .iter()
        .filter(|o| o.completed)
        .filter_map(|o| o.request_id.clone())
        .collect();
    assert!(
        answered.len() > 50,
        "load too small to prove anything: {}",
        answered.len()
    );

    let gw = deployment.start().await; // replays the journal
    let events = wait_for_events(&pool, answered.len()).await;
    let by_id: HashMap<String, _> = events
        .iter()
        .map(|e| (e.request_id.to_string(), e))
        .collect();
    let ledger: HashMap<String, _> = sim
        .ledger()
        .into_iter()
        .filter_map(|l| Some((l.request_id.clone()?, l)))
        .collect();
    for id in &answered {
        let e = by_id
            .get(id)
            .unwrap_or_else(|| panic!("answered request {id} has no event"));
        assert_eq!(e.completion_tokens, i64::from(ledger[id].completion_tokens));
    }
    for e in &events {
        assert!(
            ledger.contains_key(&e.request_id.to_string()),
            "event {} was never served",
            e.request_id
        );
    }
    println!(
        "sigkill: {} answered, {} events after restart",
        answered.len(),
        events.len()
    );
    gw.terminate();
    assert_eq!(gw.wait().await, Some(0));
}

#[sqlx::test(migrations = "../migrations")]
async fn sigterm_drains_in_flight_streams_and_bills_them(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let deployment = TestApp::builder(pool.clone())
        .durability("machine")
        .drain_seconds(20)
        .process(dir.path())
        .await;
    let sim = &deployment.sim;
    let gw = deployment.start().await;
    let clients = in_flight(&gw, 16, stream_body(60, 10)).await;
    gw.terminate();
    let mut ids = Vec::new();
    for c in clients {
        let o = c.await.unwrap();
        assert!(o.completed, "in-flight stream was not drained");
        ids.push(o.request_id.unwrap());
    }
    assert_eq!(gw.wait().await, Some(0), "clean exit");
    // The final flush shipped everything before exit.
    let events = usage_store::query(&pool, None, None, None).await.unwrap();
    assert_eq!(events.len(), 16);
    // The events are exactly those of the 16 drained requests.
    let mut billed: Vec<String> = events.iter().map(|e| e.request_id.to_string()).collect();
    billed.sort();
    ids.sort();
    assert_eq!(billed, ids, "the drained requests are the ones billed");
    let ledger = sim.ledger();
    for e in events {
        let truth = ledger
            .iter()
            .find(|l| l.request_id.as_deref() == Some(&e.request_id.to_string()))
            .unwrap();
        assert_eq!(e.status, UsageStatus::Ok);
        assert_eq!(e.completion_tokens, 60);
        assert_eq!(e.completion_tokens, i64::from(truth.completion_tokens));
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn sigterm_deadline_cuts_and_bills_the_streams_still_running(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let deployment = TestApp::builder(pool.clone())
        .durability("process")
        .drain_seconds(1)
        .process(dir.path())
        .await;
    let sim = &deployment.sim;
    let gw = deployment.start().await;
    let clients = in_flight(&gw, 8, stream_body(1000, 10)).await;
    gw.terminate();
    for c in clients {
        assert!(!c.await.unwrap().completed);
    }
    assert_eq!(gw.wait().await, Some(0));
    let events = usage_store::query(&pool, None, None, None).await.unwrap();
    assert_eq!(events.len(), 8);
    let ledger = sim.ledger();
    for e in events {
        let truth = ledger
            .iter()
            .find(|l| l.request_id.as_deref() == Some(&e.request_id.to_string()))
            .unwrap();
        assert_eq!(e.status, UsageStatus::Interrupted);
        assert!(
            e.completion_tokens > 0 && e.completion_tokens <= i64::from(truth.completion_tokens)
        );
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn postgres_outage_keeps_serving_and_every_event_arrives_once(pool: PgPool) {
    let proxy = ChaosProxy::start("127.0.0.1:5432").await;
    let dir = tempfile::tempdir().unwrap();
    let deployment = TestApp::builder(pool.clone())
        .database_via(proxy.addr)
        .durability("process")
        .drain_seconds(5)
        .process(dir.path())
        .await;
    let sim = &deployment.sim;
    let gw = deployment.start().await;
    let http = reqwest::Client::new();
    let url = gw.url("/v1/chat/completions");
    // Warm the key cache, then cut PostgreSQL.
    assert!(
        client::send(&http, &url, &gw.key, &stream_body(2, 0), None)
            .await
            .completed
    );
    wait_for_events(&pool, 1).await;
    proxy.cut();
    let mut ids = Vec::new();
    for _ in 0..100 {
        let o = client::send(&http, &url, &gw.key, &stream_body(3, 0), None).await;
        assert!(o.completed, "serving continues while PostgreSQL is down");
        ids.push(o.request_id.unwrap());
    }
    assert!(
        gw.metric("tf_journal_backlog_bytes").await > 0.0
            || gw.metric("tf_journal_ship_failures_total").await > 0.0
    );
    assert_eq!(
        usage_store::query(&pool, None, None, None)
            .await
            .unwrap()
            .len(),
        1
    );
    proxy.restore();
    let events = wait_for_events(&pool, 101).await;
    assert_eq!(events.len(), 101, "every event arrives once");
    let ledger = sim.ledger();
    for id in ids {
        let e = events
            .iter()
            .find(|e| e.request_id.to_string() == id)
            .unwrap();
        let truth = ledger
            .iter()
            .find(|l| l.request_id.as_deref() == Some(id.as_str()))
            .unwrap();
        assert_eq!(e.completion_tokens, i64::from(truth.completion_tokens));
    }
    gw.terminate();
    assert_eq!(gw.wait().await, Some(0));
}

/// Issue 34: a SIGKILL used to forget every request in flight (the journal recorded a request only
/// when it ended). Now each forwarded request has an in-flight record with its progress (at most
/// once a second), and the next start bills each one that never ended once, as `interrupted`, at
/// its last progress: within one progress interval of what the client received, never more than
/// the engine produced, and never twice across further restarts.
#[sqlx::test(migrations = "../migrations")]
async fn a_sigkill_bills_what_was_in_flight_once(pool: PgPool) {
    const STREAMS: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let deployment = TestApp::builder(pool.clone())
        .durability("process")
        .process(dir.path())
        .await;
    let sim = &deployment.sim;
    let gw = deployment.start().await;
    // Long streams (1,000 tokens, one per 10 ms), each client counting the tokens it received.
    let http = reqwest::Client::new();
    let relayed: Vec<Arc<AtomicUsize>> = (0..STREAMS).map(|_| Arc::default()).collect();
    let mut ids = Vec::new();
    for count in &relayed {
        let r = http
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(&gw.key)
            .json(&stream_body(1000, 10))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        ids.push(r.headers()["x-request-id"].to_str().unwrap().to_owned());
        let count = count.clone();
        tokio::spawn(async move {
            use futures::StreamExt;
            let mut body = r.bytes_stream();
            while let Some(Ok(chunk)) = body.next().await {
                let text = String::from_utf8_lossy(&chunk);
                count.fetch_add(text.matches("\"content\":\"").count(), Ordering::SeqCst);
            }
        });
    }
    // Past the first progress record of every stream (written at 1 s).
    eventually(
        Duration::from_secs(20),
        "1.5 s of tokens on every stream",
        || async { relayed.iter().all(|c| c.load(Ordering::SeqCst) >= 150) },
    )
    .await;
    gw.kill().await;
    let received: Vec<i64> = relayed
        .iter()
        .map(|c| c.load(Ordering::SeqCst) as i64)
        .collect();

    let gw = deployment.start().await; // recovers the in-flight records
    let events = wait_for_events(&pool, STREAMS).await;
    assert_eq!(events.len(), STREAMS, "one event per request in flight");
    let ledger = sim.ledger();
    for (id, got) in ids.iter().zip(&received) {
        let e = events
            .iter()
            .find(|e| e.request_id.to_string() == *id)
            .unwrap_or_else(|| panic!("request {id} in flight at the kill has no event"));
        assert_eq!(e.status, UsageStatus::Interrupted);
        let produced = ledger
            .iter()
            .find(|l| l.request_id.as_deref() == Some(id.as_str()))
            .map(|l| i64::from(l.completion_tokens));
        // Progress is written at most once a second (100 tokens at this pace): billed within one
        // interval below what the client received (+ slack for a loaded machine), never above
        // what it received or the engine produced.
        assert!(
            e.completion_tokens <= *got && *got - e.completion_tokens <= 150,
            "request {id}: billed {} of {got} received",
            e.completion_tokens
        );
        if let Some(produced) = produced {
            assert!(e.completion_tokens <= produced);
        }
        assert!(e.prompt_tokens > 0, "the engine had the prompt");
    }
    // Recovered requests are forgotten once journaled: another crash and restart finds only the
    // new process' generation (nothing to bill twice), and the table keeps one row per request.
    gw.kill().await;
    let gw = deployment.start().await;
    let generations = std::fs::read_dir(dir.path().join("journal").join("inflight"))
        .unwrap()
        .count();
    assert_eq!(generations, 1, "old in-flight generations are removed");
    let again = usage_store::query(&pool, None, None, None).await.unwrap();
    assert_eq!(again.len(), STREAMS);
    gw.kill().await;
}

/// One request of the mixed load: its endpoint's path, body, and whether the stored event must
/// name that endpoint.
fn mixed_request(
    i: usize,
) -> (
    tokenfactory::endpoint::Endpoint,
    &'static str,
    serde_json::Value,
) {
    use tokenfactory::endpoint::Endpoint;
    let max = 2 + (i % 5) as u32;
    let stream = i.is_multiple_of(2);
    let sim = json!({"token_interval_ms": 2});
    let text = format!("mixed endpoint load {}", i % 7);
    match i % 5 {
        0 => (
            Endpoint::Chat,
            "/v1/chat/completions",
            json!({"model": "sim-base", "messages": [{"role": "user", "content": text}],
                   "max_tokens": max, "stream": stream, "sim": sim}),
        ),
        1 => (
            Endpoint::Completions,
            "/v1/completions",
            json!({"model": "sim-base", "prompt": text, "max_tokens": max, "stream": stream, "sim": sim}),
        ),
        2 => {
            let mut body = json!({"model": "sim-base", "input": text, "max_output_tokens": max,
                                  "stream": stream, "sim": sim});
            if i.is_multiple_of(3) {
                body["reasoning"] = json!({"effort": "low"});
            }
            (Endpoint::Responses, "/v1/responses", body)
        }
        3 => (
            Endpoint::Embeddings,
            "/v1/embeddings",
            json!({"model": common::EMBED, "input": [text, "second input"]}),
        ),
        _ => (
            Endpoint::Messages,
            "/v1/messages",
            json!({"model": "sim-base", "max_tokens": max, "stream": stream, "sim": sim,
                   "messages": [{"role": "user", "content": text}]}),
        ),
    }
}

/// Sends one request and reads the whole answer; `Some(request id, completed)` once a response
/// head arrived. Completed: a whole 200 body, or a stream that reached its protocol's end
/// (`[DONE]`, Responses' final `response.completed`/`incomplete`, Anthropic's `message_stop`).
async fn send_mixed(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    body: &serde_json::Value,
) -> Option<(String, bool)> {
    let resp = http
        .post(url)
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .ok()?;
    let id = resp
        .headers()
        .get("x-request-id")?
        .to_str()
        .ok()?
        .to_owned();
    let ok = resp.status().is_success();
    let Ok(bytes) = resp.bytes().await else {
        return Some((id, false));
    };
    if !ok {
        return Some((id, false));
    }
    let stream = body["stream"].as_bool().unwrap_or(false);
    let text = String::from_utf8_lossy(&bytes);
    let completed = if !stream {
        serde_json::from_slice::<serde_json::Value>(&bytes).is_ok()
    } else {
        text.ends_with("data: [DONE]\n\n")
            || (text.contains("\"type\":\"response.incomplete\"")
                || text.contains("\"type\":\"response.completed\""))
                && text.ends_with("\n\n")
            || text.ends_with("data: {\"type\":\"message_stop\"}\n\n")
    };
    Some((id, completed))
}

/// SIGKILL under a mixed load of every endpoint (chat, completions, responses, embeddings,
/// messages; streamed and not): after the restart every answered request has exactly one event,
/// naming its endpoint, with the engine's counts; no event is duplicated or invented, and none
/// bills more than the engine produced.
#[sqlx::test(migrations = "../migrations")]
async fn sigkill_under_mixed_endpoints_loses_and_duplicates_nothing(pool: PgPool) {
    use std::collections::HashSet;
    let dir = tempfile::tempdir().unwrap();
    let deployment = TestApp::builder(pool.clone())
        .sim(tf_engine_sim::SimConfig {
            models: vec![common::BASE.into(), common::EMBED.into()],
            ..tf_engine_sim::SimConfig::default()
        })
        .durability("process")
        .drain_seconds(5)
        .process(dir.path())
        .await;
    let sim = &deployment.sim;
    let gw = deployment.start().await;
    let (base, key) = (gw.url(""), gw.key.clone());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let next = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..32)
        .map(|_| {
            let (base, key, stop, next) = (base.clone(), key.clone(), stop.clone(), next.clone());
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                let mut out = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let (endpoint, path, body) = mixed_request(i);
                    let Some((id, completed)) =
                        send_mixed(&http, &format!("{base}{path}"), &key, &body).await
                    else {
                        break; // the gateway is gone
                    };
                    out.push((id, endpoint, completed));
                }
                out
            })
        })
        .collect();
    eventually(
        Duration::from_secs(30),
        "500 requests served before the kill",
        || async { sim.ledger().len() >= 500 },
    )
    .await;
    gw.kill().await;
    stop.store(true, Ordering::Relaxed);
    let mut outcomes = Vec::new();
    for c in clients {
        outcomes.extend(c.await.unwrap());
    }
    let answered: Vec<_> = outcomes.iter().filter(|o| o.2).collect();
    let kinds: HashSet<_> = answered.iter().map(|o| o.1).collect();
    assert_eq!(kinds.len(), 5, "every endpoint answered before the kill");

    let gw = deployment.start().await; // replays the journal and the in-flight log
    let events = wait_for_events(&pool, answered.len()).await;
    let counted = sqlx::query!(
        r#"SELECT count(*) AS "rows!", count(DISTINCT request_id) AS "distinct!" FROM usage_events"#
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(counted.rows, counted.distinct, "duplicated events");
    let by_id: HashMap<String, _> = events
        .iter()
        .map(|e| (e.request_id.to_string(), e))
        .collect();
    // A request cut by the kill reaches the engine's ledger once the engine sees the hang-up.
    let ledger: HashMap<String, _> = eventually(
        Duration::from_secs(10),
        "every event's request in the engine's ledger",
        || async {
            let ledger: HashMap<String, _> = sim
                .ledger()
                .into_iter()
                .filter_map(|l| Some((l.request_id.clone()?, l)))
                .collect();
            let missing = events
                .iter()
                .filter(|e| !ledger.contains_key(&e.request_id.to_string()))
                .count();
            if missing == 0 {
                Ok(ledger)
            } else {
                Err(format!("{missing} events not (yet) in the ledger"))
            }
        },
    )
    .await;
    let mut per_endpoint: HashMap<_, usize> = HashMap::new();
    for (id, endpoint, _) in &answered {
        let e = by_id
            .get(id)
            .unwrap_or_else(|| panic!("answered {endpoint:?} request {id} has no event"));
        let truth = &ledger[id];
        assert_eq!(e.endpoint, *endpoint, "{id}");
        assert_eq!(e.status, UsageStatus::Ok, "{id}");
        assert_eq!(
            (
                e.prompt_tokens,
                e.cached_tokens,
                e.completion_tokens,
                e.reasoning_tokens
            ),
            (
                i64::from(truth.prompt_tokens),
                i64::from(truth.cached_tokens),
                i64::from(truth.completion_tokens),
                i64::from(truth.reasoning_tokens)
            ),
            "{endpoint:?} {id}"
        );
        *per_endpoint.entry(*endpoint).or_default() += 1;
    }
    let sent: HashMap<&String, _> = outcomes.iter().map(|o| (&o.0, o.1)).collect();
    for e in &events {
        let id = e.request_id.to_string();
        let truth = ledger
            .get(&id)
            .unwrap_or_else(|| panic!("event {id} was never served"));
        assert!(
            e.completion_tokens <= i64::from(truth.completion_tokens),
            "{id} billed {} of {} produced",
            e.completion_tokens,
            truth.completion_tokens
        );
        if let Some(endpoint) = sent.get(&id) {
            assert_eq!(e.endpoint, *endpoint, "{id}");
        }
    }
    let mut per: Vec<_> = per_endpoint.into_iter().collect();
    per.sort_by_key(|(e, _)| e.index());
    println!(
        "sigkill mixed: {} sent, {} answered ({per:?}), {} engine requests, {} events after restart, 0 lost, 0 duplicated",
        outcomes.len(),
        answered.len(),
        ledger.len(),
        events.len()
    );
    gw.terminate();
    assert_eq!(gw.wait().await, Some(0));
}
