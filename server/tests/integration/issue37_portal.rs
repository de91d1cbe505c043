//! Issue 37's portal fixes that change what the server answers, driven like a browser with
//! JavaScript off: rotating a key twice never gives two keys one name and long-revoked keys are
//! listed only on request (item 8); a stored request reads as a conversation with its finish
//! reason, streaming and token provenance (item 1); a tenant's owners read their own audit log,
//! as key: value rows, and never another tenant's rows (item 7); the request log's "Newer" link
//! walks back what "Older" walked, and its endpoint filter (items 8 and 5).

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test helper that fails should fail the test loudly"
)]

use crate::common;

use common::portal::{assert_redirect, location, Browser, TestPortal, MEMBER, PASSWORD};
use common::TestApp;
use sqlx::PgPool;
use tf_core::accounts::{self, Role};
use tf_core::usage::{Provenance, UsageEvent, UsageStatus};
use time::{Duration, OffsetDateTime};
use uuid::Uuid;

async fn signed_in(p: &TestPortal, email: &str) -> Browser {
    let b = p.browser();
    assert_redirect(&b.login(email, PASSWORD).await, "/");
    b
}

/// Posts a `/keys` form with the page's CSRF token; the answer must be a redirect back.
async fn keys_form(b: &Browser, path: &str, fields: &[(&str, &str)]) {
    let token = b.token_on("/keys").await;
    let mut form = vec![("csrf", token.as_str())];
    form.extend_from_slice(fields);
    let res = b.post(path, &form).await;
    assert_eq!(location(&res), Some("/keys"), "{path}: {}", res.status());
}

async fn tenant_id(pool: &PgPool, name: &str) -> Uuid {
    accounts::find_tenant(pool, name).await.unwrap().id
}

async fn key_named(pool: &PgPool, tenant: Uuid, name: &str) -> Uuid {
    sqlx::query_scalar("SELECT id FROM api_keys WHERE tenant_id = $1 AND name = $2")
        .bind(tenant)
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn key_names(pool: &PgPool, tenant: Uuid) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM api_keys WHERE tenant_id = $1 ORDER BY created_at, id")
        .bind(tenant)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn rotating_twice_gives_distinct_names_and_old_revoked_keys_hide(pool: PgPool) {
    let p = TestApp::builder(pool).start_portal().await;
    let acme = tenant_id(&p.pool, "acme").await;
    let b = signed_in(&p, MEMBER).await;
    keys_form(&b, "/api/create_key", &[("name", "ci")]).await;
    let ci = key_named(&p.pool, acme, "ci").await;
    // The original rotated twice (it keeps working for its grace period), then its replacement.
    for _ in 0..2 {
        keys_form(
            &b,
            "/api/rotate_key",
            &[("key", &ci.to_string()), ("grace", "3600")],
        )
        .await;
    }
    let second = key_named(&p.pool, acme, "ci (rotated 2)").await;
    keys_form(
        &b,
        "/api/rotate_key",
        &[("key", &second.to_string()), ("grace", "0")],
    )
    .await;
    let names = key_names(&p.pool, acme).await;
    assert_eq!(
        names,
        ["ci", "ci (rotated)", "ci (rotated 2)", "ci (rotated 3)"]
    );
    let html = b.html("/keys").await;
    assert!(html.contains("ci (rotated 3)"), "{html}");

    // A key revoked eight days ago is listed only behind "Show revoked keys"; one revoked now is.
    keys_form(&b, "/api/create_key", &[("name", "old-batch")]).await;
    let old = key_named(&p.pool, acme, "old-batch").await;
    keys_form(&b, "/api/revoke_key", &[("key", &old.to_string())]).await;
    let html = b.html("/keys").await;
    assert!(html.contains("old-batch"), "revoked just now: still listed");
    sqlx::query("UPDATE api_keys SET revoked_at = now() - interval '8 days' WHERE id = $1")
        .bind(old)
        .execute(&p.pool)
        .await
        .unwrap();
    let html = b.html("/keys").await;
    assert!(!html.contains("old-batch"), "revoked 8 days ago: hidden");
    assert!(html.contains(r#"href="/keys?revoked=all""#), "{html}");
    // The renderer's text-node markers (`<!>`) aside.
    assert!(
        html.replace("<!>", "")
            .contains("1 key revoked or expired more than 7 days ago"),
        "{html}"
    );
    // "ci (rotated 2)" was revoked at once, today: still listed.
    assert!(html.contains("ci (rotated 2)"));
    let all = b.html("/keys?revoked=all").await;
    assert!(all.contains("old-batch"));
    assert!(all.contains(r#"href="/keys""#));
}

fn event(
    tenant: Uuid,
    at: OffsetDateTime,
    endpoint: tokenfactory::endpoint::Endpoint,
) -> UsageEvent {
    UsageEvent {
        request_id: Uuid::now_v7(),
        tenant_id: tenant,
        api_key_id: None,
        served_name: "llama".into(),
        base_model: "llama".into(),
        adapter: None,
        graph: "llama".into(),
        price_key: "llama".into(),
        prompt_tokens: 12,
        cached_tokens: 0,
        completion_tokens: 2,
        reasoning_tokens: 0,
        endpoint,
        provenance: Provenance::Engine,
        status: UsageStatus::Ok,
        stream: false,
        ttft_ms: Some(5),
        duration_ms: 40,
        started_at: at,
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_stored_stream_reads_as_a_conversation(pool: PgPool) {
    let p = TestApp::builder(pool).start_portal().await;
    let acme = tenant_id(&p.pool, "acme").await;
    let mut e = event(
        acme,
        OffsetDateTime::now_utc(),
        tokenfactory::endpoint::Endpoint::Chat,
    );
    e.stream = true;
    e.provenance = Provenance::Partial;
    e.status = UsageStatus::ClientAbort;
    tf_core::db::usage::insert_batch(&p.pool, std::slice::from_ref(&e))
        .await
        .unwrap();
    let sse = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
               data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n\
               data: {\"choices\":[{\"delta\":{\"content\":\"lo <b>there</b>\"},\"finish_reason\":\"length\"}]}\n\n\
               data: [DONE]\n\n";
    let prompt = r#"{"model":"llama","stream":true,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say hello"}]}"#;
    tf_core::db::bodies::insert_batch(
        &p.pool,
        &[tf_core::db::bodies::StoredBody {
            request_id: e.request_id,
            tenant_id: acme,
            prompt: prompt.into(),
            prompt_truncated: false,
            prompt_bytes: i32::try_from(prompt.len()).unwrap(),
            completion: sse.into(),
            completion_truncated: false,
            completion_bytes: i32::try_from(sse.len()).unwrap(),
        }],
    )
    .await
    .unwrap();
    let b = signed_in(&p, MEMBER).await;
    let html = b.html(&format!("/logs/{}", e.request_id)).await;
    let conversation = html
        .split(r#"id="conversation""#)
        .nth(1)
        .and_then(|s| s.split("</ol>").next())
        .unwrap_or_else(|| panic!("{html}"));
    let system = conversation.find("Be brief.").unwrap();
    let user = conversation.find("Say hello").unwrap();
    let answer = conversation
        .find(r#"id="completion-text" class="text">Hello &lt;b&gt;there&lt;/b&gt;</div>"#)
        .unwrap_or_else(|| panic!("the chunks joined, escaped: {conversation}"));
    assert!(system < user && user < answer, "in order");
    assert!(conversation.contains("role-system") && conversation.contains("role-user"));
    assert!(conversation.contains("assembled from 3 stream events"));
    assert!(
        html.contains(r#"<dd id="finish-reason">length</dd>"#),
        "{html}"
    );
    assert!(html.contains(r#"<dd id="streamed">yes</dd>"#));
    assert!(html.contains(r#"data-provenance="partial""#));
    assert!(html.contains(r#"<dd id="endpoint">chat</dd>"#));
    // The raw bodies stay, behind a closed disclosure.
    assert!(
        html.contains(r#"<details id="raw-bodies" class="raw">"#),
        "closed: {html}"
    );
    let raw = html.split(r#"id="raw-bodies""#).nth(1).unwrap();
    assert!(raw.contains(r#"id="completion-body""#) && raw.contains("data: [DONE]"));
}

async fn audit(pool: &PgPool, tenant: Uuid, action: &str, target: &str, detail: serde_json::Value) {
    tf_core::db::audit::record(
        pool,
        &tf_core::db::audit::Entry {
            actor_user_id: None,
            actor: "someone@example.test",
            tenant_id: Some(tenant),
            action,
            target,
            detail,
            source_ip: Some("192.0.2.7"),
        },
    )
    .await
    .unwrap();
}

#[sqlx::test(migrations = "../migrations")]
async fn a_tenant_audit_shows_only_its_own_rows(pool: PgPool) {
    let p = TestApp::builder(pool).start_portal().await;
    let acme = tenant_id(&p.pool, "acme").await;
    let globex = accounts::create_tenant(&p.pool, "globex", "Globex")
        .await
        .unwrap()
        .id;
    accounts::create_user(
        &p.pool,
        "eve@globex.test",
        PASSWORD,
        Role::TenantMember,
        Some(globex),
    )
    .await
    .unwrap();
    // Rows of both tenants, and one platform-wide row.
    for i in 0..3 {
        audit(
            &p.pool,
            globex,
            "key.create",
            &format!("tf-glbx000{i}"),
            serde_json::json!({"name": "secret-globex-key"}),
        )
        .await;
    }
    tf_core::db::audit::record(
        &p.pool,
        &tf_core::db::audit::Entry {
            actor_user_id: None,
            actor: "cli",
            tenant_id: None,
            action: "prices.set",
            target: "platform-row",
            detail: serde_json::json!({}),
            source_ip: None,
        },
    )
    .await
    .unwrap();
    let owner = signed_in(&p, MEMBER).await;
    keys_form(&owner, "/api/create_key", &[("name", "backend")]).await;
    let backend = key_named(&p.pool, acme, "backend").await;
    keys_form(
        &owner,
        "/api/rotate_key",
        &[("key", &backend.to_string()), ("grace", "0")],
    )
    .await;

    let html = owner.html("/audit").await;
    let rows: Vec<&str> = html.split("data-audit-id=").skip(1).collect();
    assert_eq!(rows.len(), 2, "acme's two rows: {html}");
    assert!(
        rows[0].contains("key.rotate") && rows[1].contains("key.create"),
        "newest first"
    );
    assert!(rows[0].contains(MEMBER), "who");
    // The detail reads as key: value rows, not JSON.
    assert!(
        rows[0].contains("<dt>name</dt><dd>backend (rotated)</dd>"),
        "{}",
        rows[0]
    );
    assert!(rows[0].contains("<dt>grace_secs</dt><dd>0</dd>"));
    assert!(
        !html.contains("secret-globex-key")
            && !html.contains("tf-glbx")
            && !html.contains("platform-row")
    );
    // No query parameter reaches another tenant's rows.
    for path in [
        "/audit?tenant=globex",
        "/audit?action=key",
        "/audit?before=999999999",
    ] {
        let html = owner.html(path).await;
        assert!(
            !html.contains("secret-globex-key") && !html.contains("tf-glbx"),
            "{path}"
        );
    }
    // The family filter.
    let html = owner.html("/audit?action=member").await;
    assert!(!html.contains("data-audit-id="), "no member actions yet");

    // Globex's owner sees its three, none of acme's.
    let eve = signed_in(&p, "eve@globex.test").await;
    let html = eve.html("/audit").await;
    assert_eq!(html.matches("data-audit-id=").count(), 3);
    assert!(!html.contains("backend"));

    // A member who is not an owner is refused (403), and shown nothing.
    sqlx::query("UPDATE users SET tenant_role = 'member' WHERE email = 'eve@globex.test'")
        .execute(&p.pool)
        .await
        .unwrap();
    let res = eve.get("/audit").await;
    assert_eq!(res.status(), reqwest::StatusCode::FORBIDDEN);
    let html = res.text().await.unwrap();
    assert!(html.contains("Only the tenant's owners") && !html.contains("data-audit-id="));

    // The admin's action filter offers the families the issue names.
    let admin = p.browser();
    assert_redirect(
        &admin.login(common::portal::ADMIN, PASSWORD).await,
        "/admin",
    );
    let html = admin.html("/admin/audit").await;
    for family in ["model", "member", "bodies", "prices", "invoice", "fleet"] {
        assert!(
            html.contains(&format!(r#"<option value="{family}""#)),
            "{family}"
        );
    }
    let html = admin.html("/admin/audit?action=key").await;
    assert!(
        html.contains("<dt>name</dt><dd>backend</dd>"),
        "readable detail on the admin view"
    );
}

/// The ids of a log page in order, its "Older" and its "Newer" link.
fn log_page(html: &str) -> (Vec<String>, Option<String>, Option<String>) {
    let ids = html
        .split(r#"data-request-id=""#)
        .skip(1)
        .map(|s| s[..s.find('"').unwrap()].to_owned())
        .collect();
    let link = |rel: &str| {
        html.split_once(&format!(r#"rel="{rel}" href=""#))
            .map(|(_, s)| s[..s.find('"').unwrap()].replace("&amp;", "&"))
    };
    (ids, link("next"), link("prev"))
}

#[sqlx::test(migrations = "../migrations")]
async fn newer_walks_back_what_older_walked_and_endpoints_filter(pool: PgPool) {
    use tokenfactory::endpoint::Endpoint;
    let p = TestApp::builder(pool).start_portal().await;
    let acme = tenant_id(&p.pool, "acme").await;
    let now = OffsetDateTime::now_utc();
    let events: Vec<UsageEvent> = (0..120_i64)
        .map(|i| {
            // Pairs share a start time: the request id breaks ties both ways.
            let endpoint = if i % 3 == 0 {
                Endpoint::Responses
            } else {
                Endpoint::Chat
            };
            event(acme, now - Duration::seconds(i / 2 * 5), endpoint)
        })
        .collect();
    tf_core::db::usage::insert_batch(&p.pool, &events)
        .await
        .unwrap();
    let b = signed_in(&p, MEMBER).await;

    // Older, page by page, to the end.
    let mut pages = Vec::new();
    let mut next = Some("/logs".to_owned());
    while let Some(path) = next {
        let (ids, older, newer) = log_page(&b.html(&path).await);
        assert_eq!(
            newer.is_some(),
            !pages.is_empty(),
            "{path}: Newer on every page but the first"
        );
        pages.push(ids);
        next = older;
        assert!(pages.len() < 10);
    }
    assert_eq!(pages.len(), 3);
    let mut all: Vec<&UsageEvent> = events.iter().collect();
    all.sort_by_key(|e| std::cmp::Reverse((e.started_at, e.request_id)));
    let ids: Vec<String> = all.iter().map(|e| e.request_id.to_string()).collect();
    assert_eq!(pages.concat(), ids);

    // From the last page, Newer walks the same pages back, then stops at the newest.
    let last = {
        let (_, older, _) = log_page(&b.html("/logs").await);
        let (_, older2, _) = log_page(&b.html(&older.unwrap()).await);
        older2.unwrap()
    };
    let (_, _, newer) = log_page(&b.html(&last).await);
    let (ids, _, newer) = log_page(&b.html(&newer.unwrap()).await);
    assert_eq!(ids, pages[1]);
    let (ids, older, newer) = log_page(&b.html(&newer.unwrap()).await);
    assert_eq!(ids, pages[0]);
    assert_eq!(newer, None, "the newest page has no Newer link");
    let (ids, _, _) = log_page(&b.html(&older.unwrap()).await);
    assert_eq!(ids, pages[1], "and Older from there goes forward again");

    // The endpoint filter and column.
    let html = b.html("/logs?endpoint=responses").await;
    let (ids, _, _) = log_page(&html);
    let responses: Vec<String> = all
        .iter()
        .filter(|e| e.endpoint == Endpoint::Responses)
        .map(|e| e.request_id.to_string())
        .collect();
    assert_eq!(ids, responses);
    assert!(html.contains(r#"<td class="endpoint">responses</td>"#));
    assert!(!html.contains(r#"<td class="endpoint">chat</td>"#));
    let html = b.html("/logs?endpoint=bogus").await;
    assert!(html.contains("Ignored a filter that did not parse (endpoint)"));
}
