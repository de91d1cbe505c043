//! Ledger reconciliation: a thousand mixed requests (streaming or not, usage asked or not, a fifth
//! aborted at random points, repeated prompts for cache hits, two tenants on one base); every
//! usage event must match the simulator's ground truth, and every request must have exactly one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use serde_json::json;
use sqlx::PgPool;
use tokenfactory::usage::{Provenance, UsageStatus};

const REQUESTS: usize = 1_000;
const CONCURRENCY: usize = 32;

#[sqlx::test(migrations = "../migrations")]
async fn every_event_matches_the_engine_ledger(pool: PgPool) {
    let t = Arc::new(TestApp::builder(pool).start().await);
    let tenants = Arc::new([t.tenant("acme").await, t.tenant("beta").await]);
    let seed: u64 = std::env::var("TF_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261201);
    println!("seed {seed}");
    let prompts: Arc<Vec<String>> = Arc::new(
        (0..10)
            .map(|i| {
                format!("prompt {i}: ") + &"lorem ipsum dolor sit amet consectetur ".repeat(8 + i)
            })
            .collect(),
    );

    let plans: Vec<_> = {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..REQUESTS)
            .map(|_| {
                let stream = rng.gen_bool(0.6);
                let usage = rng.gen_bool(0.5);
                let continuous = usage && rng.gen_bool(0.25);
                let max_tokens: u32 = rng.gen_range(1..=24);
                let abort = rng.gen_bool(0.2);
                let abort_after: usize = rng.gen_range(0..=max_tokens as usize + 1);
                let abort_ms: u64 = rng.gen_range(1..=15);
                (
                    rng.gen_range(0..2usize),
                    rng.gen_range(0..10usize),
                    stream,
                    usage,
                    continuous,
                    max_tokens,
                    abort,
                    abort_after,
                    abort_ms,
                )
            })
            .collect()
    };

    futures::stream::iter(plans)
        .for_each_concurrent(CONCURRENCY, |(tenant, prompt, stream, usage, continuous, max_tokens, abort, abort_after, abort_ms)| {
            let t = t.clone();
            let tenants = tenants.clone();
            let prompts = prompts.clone();
            async move {
                let mut body = chat(BASE, &prompts[prompt], max_tokens);
                if stream {
                    body["stream"] = json!(true);
                    if usage {
                        body["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": continuous});
                    }
                }
                if abort {
                    // Paced like a real engine (50 tokens/s) so a hang-up reaches the engine before its next token.
                    body["sim"] = json!({"token_interval_ms": if stream { 20 } else { 2 }});
                }
                let req = t.post(&tenants[tenant].key, "/v1/chat/completions", body);
                match (abort, stream) {
                    (false, _) => {
                        let r = req.send().await.unwrap();
                        assert_eq!(r.status(), 200);
                        r.bytes().await.unwrap();
                    }
                    (true, true) => {
                        let r = req.send().await.unwrap();
                        read_events_then_hang_up(r, abort_after).await;
                    }
                    (true, false) => {
                        let _ = tokio::time::timeout(Duration::from_millis(abort_ms), req.send()).await;
                    }
                }
            }
        })
        .await;

    // Wait (bounded) until every request the engine saw has its event.
    let settled = || async {
        let ledger = t.sim.ledger();
        let events = t.events().await;
        let ids: std::collections::HashSet<_> =
            events.iter().map(|e| e.request_id.to_string()).collect();
        let truth: std::collections::HashSet<_> =
            ledger.iter().filter_map(|l| l.request_id.clone()).collect();
        let settled = ledger
            .iter()
            .all(|l| l.request_id.as_ref().is_some_and(|id| ids.contains(id)))
            && events
                .iter()
                .all(|e| e.prompt_tokens == 0 || truth.contains(&e.request_id.to_string()));
        let counts = format!("{} engine requests, {} events", ledger.len(), events.len());
        settled.then_some((ledger, events)).ok_or(counts)
    };
    let (ledger, events) = eventually(
        Duration::from_secs(20),
        "an event for every request",
        settled,
    )
    .await;
    // Non-streamed aborts may hang up before the gateway forwards anything: those never reach
    // the engine. Everything else does.
    assert!(
        ledger.len() >= REQUESTS * 9 / 10,
        "engine saw {} requests",
        ledger.len()
    );
    let by_id: HashMap<String, _> = events
        .iter()
        .map(|e| (e.request_id.to_string(), e))
        .collect();
    assert_eq!(by_id.len(), events.len(), "request ids are unique");
    let truth_ids: std::collections::HashSet<_> =
        ledger.iter().filter_map(|l| l.request_id.clone()).collect();
    for e in &events {
        if !truth_ids.contains(&e.request_id.to_string()) {
            // Cut before the engine had the request: recorded, but nothing billed.
            assert_eq!(e.status, UsageStatus::ClientAbort);
            assert_eq!(
                (e.prompt_tokens, e.completion_tokens),
                (0, 0),
                "{}",
                e.request_id
            );
        }
    }

    let (mut completed, mut aborted, mut partial, mut cache_hits) = (0, 0, 0, 0);
    for truth in &ledger {
        let id = truth
            .request_id
            .clone()
            .expect("gateway sends x-request-id");
        let ev = by_id
            .get(&id)
            .unwrap_or_else(|| panic!("no event for {id}"));
        let tenant = tenants.iter().find(|x| x.id == ev.tenant_id).unwrap();
        assert_eq!(
            truth.cache_salt.as_deref(),
            Some(tenant.id.to_string().as_str())
        );
        if truth.cached_tokens > 0 {
            cache_hits += 1;
        }
        // Never more than the engine produced, whatever happened.
        assert!(ev.prompt_tokens <= i64::from(truth.prompt_tokens), "{id}");
        assert!(
            ev.completion_tokens <= i64::from(truth.completion_tokens),
            "{id}: billed more than produced"
        );
        match ev.status {
            UsageStatus::Ok => {
                completed += 1;
                assert!(!truth.cancelled, "{id}");
                assert_eq!(ev.provenance, Provenance::Engine, "{id}");
                assert_eq!(ev.prompt_tokens, i64::from(truth.prompt_tokens), "{id}");
                assert_eq!(ev.cached_tokens, i64::from(truth.cached_tokens), "{id}");
                assert_eq!(
                    ev.completion_tokens,
                    i64::from(truth.completion_tokens),
                    "{id}"
                );
            }
            UsageStatus::ClientAbort => {
                aborted += 1;
                if ev.provenance != Provenance::Estimated {
                    // The engine's own counts were seen: they are exact.
                    partial += 1;
                    assert_eq!(ev.prompt_tokens, i64::from(truth.prompt_tokens), "{id}");
                    // The hang-up reaches the engine as a half-close: everything it produced
                    // before it stopped is still read, so the count is exact.
                    assert_eq!(
                        ev.completion_tokens,
                        i64::from(truth.completion_tokens),
                        "{id}: an aborted stream billed from engine counts"
                    );
                }
            }
            other => panic!("{id}: unexpected status {other:?}"),
        }
    }
    println!("completed {completed}, aborted {aborted} ({partial} billed from continuous usage), cache hits {cache_hits}");
    assert!(
        aborted >= REQUESTS / 10,
        "the mix aborted too few requests to prove anything"
    );
    assert!(partial > 0 && cache_hits > 0);
}
