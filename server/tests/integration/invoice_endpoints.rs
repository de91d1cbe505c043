//! Invoices by endpoint (issue 32): an invoice shows its usage split by the API that served it
//! (chat, responses, embeddings, messages), each figure equal to the stored events of that
//! endpoint priced by hand, and the split adding up to the invoice's usage subtotal. Requests go
//! through the real gateway (simulator with a chat and an embedding base); the page is read like
//! a browser with JavaScript off. The issued-invoice and credit-note case uses stored events at
//! chosen times in the closed month.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test helper that fails should fail the test loudly"
)]

use crate::common;

use std::collections::BTreeMap;

use common::embed::{with_embeddings, EMBED};
use common::portal::*;
use common::{chat, request_id, TestApp, BASE};
use serde_json::{json, Value};
use sqlx::PgPool;
use tf_app::money::format_micros;
use tf_core::accounts;
use tf_core::db::billing::{self, Draft, Issue, Runs};
use tf_core::db::invoicing;
use tf_core::money::{line_micros, Quantities, Rates};
use tf_core::usage::{Provenance, UsageEvent, UsageStatus};
use time::macros::datetime;
use time::{Duration, OffsetDateTime};
use tokenfactory::billing::rater;
use tokenfactory::endpoint::Endpoint;
use uuid::Uuid;

/// Chat: $2 fresh, $0.50 cached, $8 output per million; embeddings: $0.02 input per million.
fn rates() -> BTreeMap<&'static str, Rates> {
    BTreeMap::from([
        (
            BASE,
            Rates {
                fresh_per_m: 2_000_000,
                cached_per_m: 500_000,
                output_per_m: 8_000_000,
            },
        ),
        (
            EMBED,
            Rates {
                fresh_per_m: 20_000,
                cached_per_m: 0,
                output_per_m: 0,
            },
        ),
    ])
}

async fn prices(pool: &PgPool) {
    let rows: Vec<(&str, &str, Rates)> = rates()
        .into_iter()
        .map(|(key, r)| (key, "standard", r))
        .collect();
    billing::set_prices(pool, datetime!(2020-01-01 00:00 UTC), &rows, "test")
        .await
        .unwrap()
        .unwrap();
}

/// What one event is billed, by hand: the rater's rule (`money::line_micros`) under [`rates`].
fn cost(e: &UsageEvent) -> i64 {
    let q = Quantities {
        fresh: e.prompt_tokens - e.cached_tokens,
        cached: e.cached_tokens,
        output: e.completion_tokens,
    };
    line_micros(q, rates()[e.price_key.as_str()])
}

/// Per endpoint: requests, fresh, cached, output, reasoning tokens and amount, summed by hand.
type Figures = BTreeMap<String, [i64; 6]>;

fn by_hand(events: &[UsageEvent]) -> Figures {
    let mut out = Figures::new();
    for e in events {
        let f = out.entry(e.endpoint.as_str().to_owned()).or_default();
        let add = [
            1,
            e.prompt_tokens - e.cached_tokens,
            e.cached_tokens,
            e.completion_tokens,
            e.reasoning_tokens,
            cost(e),
        ];
        for (sum, x) in f.iter_mut().zip(add) {
            *sum += x;
        }
    }
    out
}

/// The `<tr>` of a page whose attributes contain `marker`.
fn row_of<'a>(html: &'a str, marker: &str) -> &'a str {
    let at = html
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} in {html}"));
    let start = html[..at].rfind("<tr").unwrap();
    let end = at + html[at..].find("</tr>").unwrap();
    &html[start..end]
}

/// The text of the element with this id.
fn text_of<'a>(html: &'a str, id: &str) -> &'a str {
    let at = html
        .find(&format!(r#"id="{id}""#))
        .unwrap_or_else(|| panic!("#{id} in {html}"));
    let start = at + html[at..].find('>').unwrap() + 1;
    let end = start + html[start..].find('<').unwrap();
    &html[start..end]
}

fn group(n: i64) -> String {
    tf_app::money::group_thousands(u64::try_from(n).unwrap())
}

#[sqlx::test(migrations = "../migrations")]
async fn the_invoice_splits_usage_by_endpoint_and_the_split_adds_up(pool: PgPool) {
    let portal = TestApp::builder(pool.clone())
        .shared_redis()
        .start_portal()
        .await;
    let t = with_embeddings(pool.clone()).await;
    let acme = accounts::find_tenant(&pool, "acme").await.unwrap().id;
    let (_, key) = tf_core::keys::issue(&pool, acme, "test").await.unwrap();
    prices(&pool).await;

    // Chat (one repeated, so part of its prompt is cached), Responses whole and streamed with
    // reasoning, Embeddings, and Messages: every request through the gateway.
    let hello = "hello there from the invoice test, a prompt long enough to share a prefix";
    let mut responses = json!({"model": BASE, "input": "tell me about invoices",
                               "max_output_tokens": 8, "reasoning": {"effort": "low"}});
    let mut calls: Vec<(&str, Value)> = vec![
        ("/v1/chat/completions", chat(BASE, hello, 5)),
        ("/v1/chat/completions", chat(BASE, hello, 7)),
        ("/v1/responses", responses.clone()),
    ];
    responses["stream"] = json!(true);
    calls.push(("/v1/responses", responses));
    calls.push((
        "/v1/embeddings",
        json!({"model": EMBED, "input": ["first text to embed", "the second one"]}),
    ));
    calls.push((
        "/v1/messages",
        json!({"model": BASE, "max_tokens": 6,
               "messages": [{"role": "user", "content": "hello from messages"}]}),
    ));
    let mut events = Vec::new();
    for (path, body) in calls {
        let r = t.post(&key, path, body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let id = request_id(&r);
        r.bytes().await.unwrap();
        let ev = t.event(&id).await;
        assert_eq!(ev.status, UsageStatus::Ok, "{path}");
        events.push(ev);
    }
    assert!(
        events.iter().any(|e| e.cached_tokens > 0),
        "the repeated chat prompt was partly cached: {events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.endpoint == Endpoint::Responses && e.reasoning_tokens > 0),
        "the simulator reported reasoning tokens"
    );
    let live = billing::live_run(&pool).await.unwrap();
    billing::drain(&pool, live, 1000).await.unwrap();

    let want = by_hand(&events);
    assert_eq!(
        want.keys().map(String::as_str).collect::<Vec<_>>(),
        ["chat", "embeddings", "messages", "responses"]
    );
    let total: i64 = want.values().map(|f| f[5]).sum();
    assert!(total > 0);

    let b = portal.browser();
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/");
    let html = b.html("/invoices/current").await;
    for (endpoint, [requests, fresh, cached, output, reasoning, amount]) in &want {
        let row = row_of(&html, &format!(r#"data-endpoint="{endpoint}""#));
        for cell in [
            format!(r#"class="num events">{}<"#, group(*requests)),
            format!(r#"class="num fresh">{}<"#, group(*fresh)),
            format!(r#"class="num cached">{}<"#, group(*cached)),
            format!(r#"class="num output">{}<"#, group(*output)),
            format!(r#"class="num reasoning">{}<"#, group(*reasoning)),
            format!(r#"class="num amount">{}<"#, format_micros(*amount)),
        ] {
            assert!(row.contains(&cell), "{endpoint}: {cell} in {row}");
        }
    }
    assert!(
        !html.contains(r#"data-endpoint="completions""#),
        "no row for an endpoint without usage"
    );
    // The split adds up to the invoice's usage subtotal, which is the per-model entries' sum
    // (built from the daily rollup, not from the lines the split reads).
    assert_eq!(text_of(&html, "endpoint-usage-total"), format_micros(total));
    let usage_total = row_of(&html, r#"class="subtotal usage-total""#);
    assert!(usage_total.contains(&format_micros(total)), "{usage_total}");
    let model = row_of(&html, &format!(r#"data-model="{BASE}""#));
    let chat_side: i64 = events
        .iter()
        .filter(|e| e.price_key == BASE)
        .map(cost)
        .sum();
    assert!(
        model.contains(&format!(
            r#"class="num amount">{}<"#,
            format_micros(chat_side)
        )),
        "{model}"
    );
}

fn event(tenant: Uuid, key: &str, endpoint: Endpoint, at: OffsetDateTime) -> UsageEvent {
    UsageEvent {
        request_id: Uuid::now_v7(),
        tenant_id: tenant,
        api_key_id: None,
        served_name: key.into(),
        base_model: key.into(),
        adapter: None,
        graph: key.into(),
        price_key: key.into(),
        prompt_tokens: 1_000,
        cached_tokens: if endpoint == Endpoint::Embeddings {
            0
        } else {
            250
        },
        completion_tokens: if endpoint == Endpoint::Embeddings {
            0
        } else {
            333
        },
        reasoning_tokens: if endpoint == Endpoint::Responses {
            111
        } else {
            0
        },
        endpoint,
        provenance: Provenance::Engine,
        status: UsageStatus::Ok,
        stream: false,
        ttft_ms: None,
        duration_ms: 1,
        started_at: at,
    }
}

/// An issued invoice of a closed month keeps its split (events on several days: whole days come
/// from the daily rollup in its entries, the split from the lines), a credit note shows the same
/// split negated, and another tenant gets nothing for the id.
#[sqlx::test(migrations = "../migrations")]
async fn issued_invoices_and_credit_notes_keep_the_split(pool: PgPool) {
    let acme = accounts::create_tenant(&pool, "acme", "Acme")
        .await
        .unwrap()
        .id;
    let globex = accounts::create_tenant(&pool, "globex", "Globex")
        .await
        .unwrap()
        .id;
    prices(&pool).await;
    let month = rater::previous_month(rater::month_of(OffsetDateTime::now_utc()));
    let day = |d: u8, h: u8| {
        month
            .replace_day(d)
            .unwrap()
            .with_hms(h, 0, 0)
            .unwrap()
            .assume_utc()
    };
    let events = vec![
        event(acme, BASE, Endpoint::Chat, day(1, 0)),
        event(acme, BASE, Endpoint::Chat, day(3, 23)),
        event(acme, BASE, Endpoint::Completions, day(5, 12)),
        event(acme, BASE, Endpoint::Responses, day(5, 12)),
        event(acme, BASE, Endpoint::Responses, day(28, 1)),
        event(acme, BASE, Endpoint::Messages, day(9, 9)),
        event(acme, EMBED, Endpoint::Embeddings, day(9, 10)),
        event(
            acme,
            EMBED,
            Endpoint::Embeddings,
            day(9, 10) + Duration::seconds(1),
        ),
        event(globex, BASE, Endpoint::Chat, day(9, 10)),
    ];
    tf_core::db::usage::insert_batch(&pool, &events)
        .await
        .unwrap();
    let live = billing::live_run(&pool).await.unwrap();
    billing::drain(&pool, live, 1000).await.unwrap();
    let Draft::Built(id) = billing::build_draft(&pool, acme, month, Runs::Kept)
        .await
        .unwrap()
    else {
        panic!("a draft")
    };
    assert_eq!(
        billing::issue(&pool, id, "test").await.unwrap(),
        Issue::Issued
    );
    let ours: Vec<UsageEvent> = events
        .iter()
        .filter(|e| e.tenant_id == acme)
        .cloned()
        .collect();
    let want = by_hand(&ours);
    let split = invoicing::usage_by_endpoint(&pool, acme, id).await.unwrap();
    let got: Figures = split
        .iter()
        .map(|e| {
            (
                e.endpoint.clone(),
                [
                    e.events,
                    e.fresh_tokens,
                    e.cached_tokens,
                    e.output_tokens,
                    e.reasoning_tokens,
                    e.amount_micros,
                ],
            )
        })
        .collect();
    assert_eq!(got, want);
    let entries = billing::invoice_entries(&pool, acme, id).await.unwrap();
    let usage: i64 = entries
        .iter()
        .filter(|e| e.kind == "usage")
        .map(|e| e.amount_micros)
        .sum();
    assert_eq!(split.iter().map(|e| e.amount_micros).sum::<i64>(), usage);
    assert_eq!(usage, ours.iter().map(cost).sum::<i64>());

    // Another tenant asking for this invoice gets nothing.
    assert!(invoicing::usage_by_endpoint(&pool, globex, id)
        .await
        .unwrap()
        .is_empty());

    // The credit note: the same split with the amounts negated, adding up to its usage entries.
    let note = billing::correct(&pool, id, "test").await.unwrap().unwrap();
    let negated = invoicing::usage_by_endpoint(&pool, acme, note)
        .await
        .unwrap();
    assert_eq!(negated.len(), split.len());
    for (n, e) in negated.iter().zip(&split) {
        assert_eq!(
            (&n.endpoint, n.events, n.output_tokens, n.amount_micros),
            (&e.endpoint, e.events, e.output_tokens, -e.amount_micros)
        );
    }
    let note_usage: i64 = billing::invoice_entries(&pool, acme, note)
        .await
        .unwrap()
        .iter()
        .filter(|e| e.kind == "usage")
        .map(|e| e.amount_micros)
        .sum();
    assert_eq!(
        negated.iter().map(|e| e.amount_micros).sum::<i64>(),
        note_usage
    );
}
