//! Stored request bodies (issue 15): an opted-in tenant's prompt and completion (whole and
//! streamed) are captured off the request path and shown on `/logs/{request_id}`; a tenant that
//! did not opt in gets nothing stored; bodies are cut at the bound and say so; opting out stops
//! capture on every replica within a second; "delete all" removes them (audited); the retention
//! job deletes only what is older than each tenant's own period.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test helper that fails should fail the test loudly"
)]

use crate::common;

use std::time::Duration;

use common::eventually::wait_until;
use common::portal::{assert_redirect, csrf, location, Browser, PASSWORD};
use common::{chat, eventually, request_id, Tenant, TestApp, BASE};
use reqwest::{redirect::Policy, Client, StatusCode};
use sqlx::PgPool;
use tf_core::accounts::{self, Role};
use tf_core::db::bodies::{self, StoredBody};
use tokenfactory::bodies::capture::MAX_BODY_BYTES;
use uuid::Uuid;

const SETTLE: Duration = Duration::from_secs(5);

fn browser_at(base: &str) -> Browser {
    Browser {
        base: base.to_owned(),
        http: Client::builder()
            .cookie_store(true)
            .redirect(Policy::none())
            .build()
            .unwrap(),
    }
}

/// An owner of `tenant`, signed in.
async fn owner(t: &TestApp, tenant: &Tenant) -> Browser {
    let email = format!("owner@{}.test", tenant.name);
    accounts::create_user(
        &t.pool,
        &email,
        PASSWORD,
        Role::TenantMember,
        Some(tenant.id),
    )
    .await
    .unwrap();
    let b = browser_at(&t.url(""));
    assert_redirect(&b.login(&email, PASSWORD).await, "/");
    b
}

async fn set_logging(pool: &PgPool, tenant: Uuid, on: bool) {
    sqlx::query!(
        "UPDATE tenants SET body_logging = $2 WHERE id = $1",
        tenant,
        on
    )
    .execute(pool)
    .await
    .unwrap();
}

async fn stored(t: &TestApp, tenant: Uuid, request: &str) -> StoredBody {
    let id: Uuid = request.parse().unwrap();
    eventually(SETTLE, &format!("the stored body of {request}"), || async {
        bodies::of_request(&t.pool, tenant, id).await.unwrap()
    })
    .await
}

async fn count(pool: &PgPool, tenant: Uuid) -> i64 {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM stored_bodies WHERE tenant_id = $1"#,
        tenant
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn an_opted_in_tenants_bodies_are_stored_and_shown(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let acme = t.tenant("acme").await;
    let b = owner(&t, &acme).await;

    // Opting in on the settings page (audited) reaches the gateway.
    let token = csrf(&b.html("/settings").await);
    let res = b
        .post(
            "/api/save_tenant_settings",
            &[
                ("csrf", token.as_str()),
                ("display_name", "Acme"),
                ("body_logging", "on"),
                ("retention_days", "30"),
            ],
        )
        .await;
    assert_eq!(location(&res), Some("/settings"));

    // Whole answer.
    let r = t
        .post(
            &acme.key,
            "/v1/chat/completions",
            chat(BASE, "tell me <b>about</b> cats", 5),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let whole_id = request_id(&r);
    let answer = r.text().await.unwrap();
    t.event(&whole_id).await;
    let row = stored(&t, acme.id, &whole_id).await;
    assert!(
        row.prompt.contains("tell me <b>about</b> cats"),
        "{}",
        row.prompt
    );
    assert_eq!(
        row.completion, answer,
        "the completion is the answer as sent"
    );
    assert!(!row.prompt_truncated && !row.completion_truncated);

    let page = b.get(&format!("/logs/{whole_id}")).await;
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"id="prompt-body""#), "{html}");
    // Escaped, never markup.
    assert!(
        html.contains("tell me &lt;b&gt;about&lt;/b&gt; cats"),
        "{html}"
    );
    assert!(!html.contains("<b>about</b>"));
    assert!(html.contains(BASE), "the row's model is shown");
    // The log links the row to it.
    assert!(b
        .html("/logs")
        .await
        .contains(&format!(r#"href="/logs/{whole_id}""#)));

    // A stream: the events as relayed.
    let mut body = chat(BASE, "stream some words", 5);
    body["stream"] = true.into();
    let r = t
        .post(&acme.key, "/v1/chat/completions", body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let stream_id = request_id(&r);
    let sent = r.text().await.unwrap();
    t.event(&stream_id).await;
    let row = stored(&t, acme.id, &stream_id).await;
    assert!(row.prompt.contains("stream some words"));
    assert_eq!(row.completion, sent);
    assert!(row.completion.contains("data: [DONE]"));
    let html = b.html(&format!("/logs/{stream_id}")).await;
    assert!(html.contains(r#"id="completion-body""#), "{html}");

    let audit: Vec<String> =
        sqlx::query_scalar!(r#"SELECT action AS "a!" FROM audit_log ORDER BY id"#)
            .fetch_all(&t.pool)
            .await
            .unwrap();
    assert!(audit.contains(&"bodies.opt_in".to_owned()), "{audit:?}");
}

#[sqlx::test(migrations = "../migrations")]
async fn nothing_is_stored_without_opting_in(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let acme = t.tenant("acme").await;
    let b = owner(&t, &acme).await;
    let r = t
        .post(
            &acme.key,
            "/v1/chat/completions",
            chat(BASE, "private words", 5),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let id = request_id(&r);
    t.event(&id).await;
    // Capture happens (or not) before the answer is sent: the counter is final here.
    assert_eq!(t.app.gateway.bodies.queued(), 0, "nothing was captured");
    assert_eq!(count(&t.pool, acme.id).await, 0);
    let html = b.html(&format!("/logs/{id}")).await;
    assert!(html.contains(r#"id="no-bodies""#), "{html}");
    assert!(!html.contains("private words"));
}

#[sqlx::test(migrations = "../migrations")]
async fn bodies_are_cut_at_the_bound(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let acme = t.tenant("acme").await;
    set_logging(&t.pool, acme.id, true).await;
    let long = "word ".repeat(MAX_BODY_BYTES / 5 + 100);
    let r = t
        .post(&acme.key, "/v1/chat/completions", chat(BASE, &long, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let id = request_id(&r);
    let row = stored(&t, acme.id, &id).await;
    assert!(row.prompt_truncated);
    assert_eq!(row.prompt.len(), MAX_BODY_BYTES);
    assert!(usize::try_from(row.prompt_bytes).unwrap() > MAX_BODY_BYTES);
    assert!(!row.completion_truncated);
    t.event(&id).await;
    let b = owner(&t, &acme).await;
    assert!(b.html(&format!("/logs/{id}")).await.contains("Truncated"));
}

#[sqlx::test(migrations = "../migrations")]
async fn opting_out_stops_capture_on_every_replica_within_a_second(pool: PgPool) {
    let t = TestApp::builder(pool.clone()).start().await;
    let replica = TestApp::builder(pool).replica_of(&t).start().await;
    let acme = t.tenant("acme").await;
    set_logging(&t.pool, acme.id, true).await;
    // Both replicas capture (the key, with its flag, is now cached on each).
    for app in [&t, &replica] {
        let r = app
            .post(&acme.key, "/v1/chat/completions", chat(BASE, "before", 2))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let _ = r.text().await;
        assert_eq!(app.app.gateway.bodies.queued(), 1);
    }

    set_logging(&t.pool, acme.id, false).await;
    for app in [&t, &replica] {
        wait_until(Duration::from_secs(1), "capture stopped", || async {
            let before = app.app.gateway.bodies.queued();
            let r = app
                .post(&acme.key, "/v1/chat/completions", chat(BASE, "after", 2))
                .send()
                .await
                .unwrap();
            let _ = r.text().await;
            app.app.gateway.bodies.queued() == before
        })
        .await;
    }
    // And it stays off.
    for app in [&t, &replica] {
        let before = app.app.gateway.bodies.queued();
        let r = app
            .post(&acme.key, "/v1/chat/completions", chat(BASE, "later", 2))
            .send()
            .await
            .unwrap();
        let _ = r.text().await;
        assert_eq!(app.app.gateway.bodies.queued(), before);
    }
}

fn row(tenant: Uuid, text: &str) -> StoredBody {
    StoredBody {
        request_id: Uuid::now_v7(),
        tenant_id: tenant,
        prompt: text.to_owned(),
        prompt_truncated: false,
        prompt_bytes: 1,
        completion: text.to_owned(),
        completion_truncated: false,
        completion_bytes: 1,
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn delete_all_removes_the_tenants_bodies_and_is_audited(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let acme = t.tenant("acme").await;
    let globex = t.tenant("globex").await;
    let rows = [row(acme.id, "a1"), row(acme.id, "a2"), row(globex.id, "g1")];
    bodies::insert_batch(&t.pool, &rows).await.unwrap();
    let b = owner(&t, &acme).await;
    let settings = b.html("/settings").await;
    assert!(settings.contains("Delete all stored bodies"), "{settings}");
    let res = b
        .post(
            "/api/delete_stored_bodies",
            &[("csrf", csrf(&settings).as_str())],
        )
        .await;
    assert_eq!(location(&res), Some("/settings"));
    assert!(b
        .html("/settings")
        .await
        .contains("Every stored request body was deleted."));
    assert_eq!(count(&t.pool, acme.id).await, 0);
    assert_eq!(
        count(&t.pool, globex.id).await,
        1,
        "another tenant's are kept"
    );
    let audit = sqlx::query!(
        r#"SELECT action, detail AS "detail!" FROM audit_log WHERE action = 'bodies.delete_all'"#
    )
    .fetch_one(&t.pool)
    .await
    .unwrap();
    assert_eq!(audit.detail["deleted"], 2);

    // Without the CSRF token nothing is deleted.
    bodies::insert_batch(&t.pool, &[row(acme.id, "a3")])
        .await
        .unwrap();
    let res = b
        .post("/api/delete_stored_bodies", &[("csrf", "forged")])
        .await;
    assert!(res.status().is_redirection());
    assert_eq!(count(&t.pool, acme.id).await, 1);
}

#[sqlx::test(migrations = "../migrations")]
async fn retention_deletes_only_old_rows_of_each_tenant(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let short = t.tenant("short").await;
    let long = t.tenant("long").await;
    sqlx::query!(
        "UPDATE tenants SET body_retention_days = 7 WHERE id = $1",
        short.id
    )
    .execute(&t.pool)
    .await
    .unwrap();
    sqlx::query!(
        "UPDATE tenants SET body_retention_days = 30 WHERE id = $1",
        long.id
    )
    .execute(&t.pool)
    .await
    .unwrap();
    let now = time::macros::datetime!(2026-12-03 12:00 UTC);
    let at = |days: i64| now - time::Duration::days(days);
    // (tenant, age in days, kept?)
    let cases = [
        (short.id, 1, true),
        (short.id, 8, false),
        (long.id, 8, true),
        (long.id, 29, true),
        (long.id, 31, false),
    ];
    let mut ids = Vec::new();
    for (tenant, age, _) in cases {
        let r = row(tenant, "x");
        bodies::insert_batch(&t.pool, std::slice::from_ref(&r))
            .await
            .unwrap();
        sqlx::query!(
            "UPDATE stored_bodies SET created_at = $2 WHERE request_id = $1",
            r.request_id,
            at(age)
        )
        .execute(&t.pool)
        .await
        .unwrap();
        ids.push(r.request_id);
    }
    let deleted = tokenfactory::bodies::retention::pass(&t.pool, now)
        .await
        .unwrap();
    assert_eq!(deleted, 2);
    for ((tenant, age, kept), id) in cases.iter().zip(&ids) {
        let there = bodies::of_request(&t.pool, *tenant, *id)
            .await
            .unwrap()
            .is_some();
        assert_eq!(there, *kept, "a {age}-day-old body");
    }
    // A second pass finds nothing more.
    assert_eq!(
        tokenfactory::bodies::retention::pass(&t.pool, now)
            .await
            .unwrap(),
        0
    );
}

/// Capture rides beside metering, never in it: the same requests meter the same with and
/// without it, and a client hanging up mid-stream is still billed what the engine produced
/// (as without capture), with the events relayed until then stored.
#[sqlx::test(migrations = "../migrations")]
async fn capture_leaves_metering_alone_and_a_hang_up_keeps_what_was_relayed(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let on = t.tenant("acme").await;
    let off = t.tenant("globex").await;
    set_logging(&t.pool, on.id, true).await;

    let mut metered = Vec::new();
    for tenant in [&on, &off] {
        let mut row = Vec::new();
        for stream in [false, true] {
            let mut body = chat(BASE, "count the same words", 6);
            body["stream"] = stream.into();
            let r = t
                .post(&tenant.key, "/v1/chat/completions", body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            let id = request_id(&r);
            let _ = r.text().await.unwrap();
            let ev = t.event(&id).await;
            row.push((
                ev.status,
                ev.provenance,
                ev.prompt_tokens,
                ev.completion_tokens,
            ));
        }
        metered.push(row);
    }
    assert_eq!(metered[0], metered[1], "with capture as without");

    let mut body = chat(BASE, "tell me a long story", 200);
    body["stream"] = true.into();
    body["sim"] = serde_json::json!({"token_interval_ms": 20});
    let r = t
        .post(&on.key, "/v1/chat/completions", body)
        .send()
        .await
        .unwrap();
    let id = request_id(&r);
    common::read_events_then_hang_up(r, 4).await;
    let truth = t.ledger_entry(&id).await;
    assert!(truth.cancelled, "upstream work cancelled");
    let ev = t.event(&id).await;
    assert_eq!(ev.status, tokenfactory::usage::UsageStatus::ClientAbort);
    assert_eq!(ev.completion_tokens, i64::from(truth.completion_tokens));
    let row = stored(&t, on.id, &id).await;
    assert!(row.completion.starts_with("data: "), "{}", row.completion);
    assert!(!row.completion.contains("[DONE]"), "cut at the hang-up");
    assert!(!row.completion_truncated);
}

/// The next notification's payload within 300 ms, if any.
async fn next(l: &mut sqlx::postgres::PgListener) -> Option<String> {
    tokio::time::timeout(Duration::from_millis(300), l.recv())
        .await
        .ok()
        .map(|n| n.unwrap().payload().to_owned())
}

/// The opt-in flag is cached with the key, so only a real change of it may empty every
/// replica's key cache: saving the settings with the flag as it was sends no notification.
#[sqlx::test(migrations = "../migrations")]
async fn only_a_change_of_the_opt_in_notifies_the_key_caches(pool: PgPool) {
    let acme = tf_core::accounts::create_tenant(&pool, "acme", "Acme")
        .await
        .unwrap();
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .unwrap();
    listener.listen("tf_auth_changed").await.unwrap();
    let save = |logging: bool| {
        sqlx::query!(
            "UPDATE tenants SET display_name = 'Acme', body_logging = $2 WHERE id = $1",
            acme.id,
            logging
        )
        .execute(&pool)
    };
    save(false).await.unwrap();
    assert_eq!(
        next(&mut listener).await,
        None,
        "unchanged: no notification"
    );
    save(true).await.unwrap();
    assert_eq!(next(&mut listener).await.as_deref(), Some("tenants"));
    save(true).await.unwrap();
    assert_eq!(next(&mut listener).await, None);
}
