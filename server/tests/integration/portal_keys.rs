//! The tenant console's `/keys` page and home `/`, driven like a browser with JavaScript off against
//! the whole server (gateway and portal on one router, as `serve` runs them): a key created in the
//! portal works on `/v1` and its secret is shown once; revocation and the end of a rotation's
//! grace period are refused on every replica within a second; `last_used_at` costs at most one
//! write a minute; another tenant's key ids and forms without the CSRF token change nothing; the
//! home's figures are the tenant's own, computed exactly.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test helper that fails should fail the test loudly"
)]

use crate::common;

use std::time::{Duration, Instant};

use common::eventually::wait_until;
use common::portal::{assert_redirect, csrf, Browser, PASSWORD};
use common::TestApp;
use reqwest::{redirect::Policy, Client, StatusCode};
use sqlx::PgPool;
use tf_core::accounts::{self, Role};
use tf_core::usage::{Provenance, UsageEvent, UsageStatus};
use time::OffsetDateTime;
use uuid::Uuid;

/// A tenant with one member signed in through the portal's login form.
struct Member {
    tenant: Uuid,
    browser: Browser,
}

async fn member(t: &TestApp, tenant: &str) -> Member {
    let tn = accounts::create_tenant(&t.pool, tenant, &format!("{tenant} Inc"))
        .await
        .unwrap();
    let email = format!("ada@{tenant}.test");
    accounts::create_user(&t.pool, &email, PASSWORD, Role::TenantMember, Some(tn.id))
        .await
        .unwrap();
    let browser = browser_at(&t.url(""));
    assert_redirect(&browser.login(&email, PASSWORD).await, "/");
    Member {
        tenant: tn.id,
        browser,
    }
}

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

/// Posts one of `/keys`'s forms with the page's CSRF token; the answer must be a redirect back.
async fn post_form(b: &Browser, path: &str, fields: &[(&str, &str)]) {
    let token = b.token_on("/keys").await;
    let mut form = vec![("csrf", token.as_str())];
    form.extend_from_slice(fields);
    assert_redirect(&b.post(path, &form).await, "/keys");
}

/// The secret shown on `/keys`, if the page shows one.
fn shown_secret(html: &str) -> Option<String> {
    let marker = r#"id="new-key-secret""#;
    let at = html.find(marker)?;
    let start = at + html[at..].find('>')? + 1;
    let len = html[start..].find('<')?;
    Some(html[start..start + len].to_owned())
}

/// Creates a key on `/keys` and returns its secret as the page showed it.
async fn create_key(b: &Browser, name: &str) -> String {
    post_form(b, "/api/create_key", &[("name", name)]).await;
    shown_secret(&b.html("/keys").await).expect("the new key is shown")
}

async fn key_id(pool: &PgPool, secret: &str) -> Uuid {
    let prefix = tf_core::keys::visible_prefix(secret);
    tf_core::db::keys::by_prefix(pool, prefix)
        .await
        .unwrap()
        .unwrap()
        .id
}

async fn status(http: &Client, base: &str, key: &str) -> StatusCode {
    http.get(format!("{base}/v1/models"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .status()
}

/// A second replica of `primary` (same database; its own key cache and change listener), kept
/// running for the rest of the test; its base URL.
async fn second_replica(primary: &TestApp) -> String {
    let replica = TestApp::builder(primary.pool.clone())
        .replica_of(primary)
        .start()
        .await;
    let url = replica.url("");
    std::mem::forget(replica);
    url
}

#[sqlx::test(migrations = "../migrations")]
async fn a_new_key_is_shown_once_works_and_is_stored_only_hashed(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let acme = member(&t, "acme").await;
    let b = &acme.browser;
    assert!(b.html("/keys").await.contains("No keys yet"));

    post_form(b, "/api/create_key", &[("name", "  ci runner ")]).await;
    // Between the post and the page, neither the database nor the cookie jar holds the secret.
    let sessions: Vec<String> =
        sqlx::query_scalar!(r#"SELECT data::text AS "d!" FROM portal_sessions"#)
            .fetch_all(&t.pool)
            .await
            .unwrap();
    let html = b.html("/keys").await;
    let secret = shown_secret(&html).expect("shown right after creation");
    assert!(secret.starts_with("tf-") && secret.len() == 46, "{secret}");
    assert!(sessions.iter().all(|d| !d.contains(&secret[3..])));
    assert!(html.contains("Copy it now: it will not be shown again."));
    assert!(
        html.contains(r#"data-copy="new-key-secret" hidden"#),
        "{html}"
    );
    assert!(html.contains("ci runner"));
    assert!(!html.contains("  ci runner "));
    assert_eq!(status(&t.http, &t.url(""), &secret).await, StatusCode::OK);

    // Shown once: the next render lists the key by its prefix only.
    let again = b.html("/keys").await;
    assert_eq!(shown_secret(&again), None);
    assert!(!again.contains(&secret));
    assert!(again.contains(tf_core::keys::visible_prefix(&secret)));
    assert!(again.contains("Active"));
    let stored: i64 = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM portal_sessions WHERE data::text LIKE '%revealed_key%'"#
    )
    .fetch_one(&t.pool)
    .await
    .unwrap();
    assert_eq!(stored, 0);

    // A bad name changes nothing and says why.
    post_form(b, "/api/create_key", &[("name", "   ")]).await;
    let html = b.html("/keys").await;
    assert!(html.contains("A key name must be 1 to 100 characters"));
    let keys: i64 = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM api_keys"#)
        .fetch_one(&t.pool)
        .await
        .unwrap();
    assert_eq!(keys, 1);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_key_revoked_in_the_portal_is_refused_on_every_replica_within_a_second(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let other = second_replica(&t).await;
    let acme = member(&t, "acme").await;
    let secret = create_key(&acme.browser, "prod").await;
    let id = key_id(&t.pool, &secret).await;
    // Both replicas have the key cached as good.
    for base in [t.url(""), other.clone()] {
        assert_eq!(status(&t.http, &base, &secret).await, StatusCode::OK);
    }

    post_form(
        &acme.browser,
        "/api/revoke_key",
        &[("key", &id.to_string())],
    )
    .await;
    let revoked = Instant::now();
    for base in [t.url(""), other.clone()] {
        wait_until(
            Duration::from_secs(1),
            "refused within a second",
            || async { status(&t.http, &base, &secret).await == StatusCode::UNAUTHORIZED },
        )
        .await;
    }
    assert!(revoked.elapsed() < Duration::from_secs(2));
    let html = acme.browser.html("/keys").await;
    assert!(html.contains("Key revoked."));
    assert!(html.contains("Revoked "));
    // A revoked key has no forms left.
    assert!(!html.contains(&format!(r#"name="key" value="{id}""#)));

    // Revoking it again: nothing to do.
    post_form(
        &acme.browser,
        "/api/revoke_key",
        &[("key", &id.to_string())],
    )
    .await;
    assert!(acme.browser.html("/keys").await.contains("No such key"));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_rotated_key_works_for_its_grace_period_then_is_refused(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let other = second_replica(&t).await;
    let acme = member(&t, "acme").await;
    let old = create_key(&acme.browser, "backend").await;
    let old_id = key_id(&t.pool, &old).await;

    post_form(
        &acme.browser,
        "/api/rotate_key",
        &[("key", &old_id.to_string()), ("grace", "3600")],
    )
    .await;
    let html = acme.browser.html("/keys").await;
    let new = shown_secret(&html).expect("the new key is shown once");
    assert!(html.contains("Key rotated."));
    assert!(html.contains("backend (rotated)"));
    assert!(html.contains("The old key works until "));
    assert!(html.contains("Works until "));
    let ends: Option<OffsetDateTime> =
        sqlx::query_scalar!("SELECT expires_at FROM api_keys WHERE id = $1", old_id)
            .fetch_one(&t.pool)
            .await
            .unwrap();
    let left = ends.unwrap() - OffsetDateTime::now_utc();
    assert!(
        left > time::Duration::minutes(59) && left <= time::Duration::hours(1),
        "{left}"
    );
    for base in [t.url(""), other.clone()] {
        assert_eq!(status(&t.http, &base, &old).await, StatusCode::OK);
        assert_eq!(status(&t.http, &base, &new).await, StatusCode::OK);
    }

    // Bring the deadline close (as if the hour had passed), then watch both replicas: the old key
    // works until the deadline and is refused within a second after it; the new one keeps working.
    let deadline: OffsetDateTime = sqlx::query_scalar!(
        r#"UPDATE api_keys SET expires_at = now() + interval '1500 milliseconds' WHERE id = $1
           RETURNING expires_at AS "at!""#,
        old_id
    )
    .fetch_one(&t.pool)
    .await
    .unwrap();
    for base in [t.url(""), other.clone()] {
        assert_eq!(status(&t.http, &base, &old).await, StatusCode::OK);
    }
    let mut refused_at = [None, None];
    while refused_at.iter().any(Option::is_none) {
        for (i, base) in [t.url(""), other.clone()].iter().enumerate() {
            if refused_at[i].is_none()
                && status(&t.http, base, &old).await == StatusCode::UNAUTHORIZED
            {
                refused_at[i] = Some(OffsetDateTime::now_utc());
            }
        }
        assert!(
            OffsetDateTime::now_utc() - deadline < time::Duration::seconds(2),
            "the old key is still accepted after its grace period"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for at in refused_at.into_iter().flatten() {
        // Never refused before the deadline (a little slack for the two clocks' reading order).
        assert!(
            at >= deadline - time::Duration::milliseconds(50),
            "{at} < {deadline}"
        );
        assert!(
            at - deadline < time::Duration::seconds(1),
            "{at} {deadline}"
        );
    }
    assert_eq!(status(&t.http, &other, &new).await, StatusCode::OK);
    assert!(acme.browser.html("/keys").await.contains("Expired "));

    // Rotating with no grace revokes the old key at once; the new one is named without a second
    // suffix.
    let new_id = key_id(&t.pool, &new).await;
    post_form(
        &acme.browser,
        "/api/rotate_key",
        &[("key", &new_id.to_string()), ("grace", "0")],
    )
    .await;
    let html = acme.browser.html("/keys").await;
    let newest = shown_secret(&html).unwrap();
    assert!(html.contains("The old key was revoked."));
    assert!(!html.contains("(rotated) (rotated)"));
    wait_until(Duration::from_secs(1), "refused at once", || async {
        status(&t.http, &other, &new).await == StatusCode::UNAUTHORIZED
    })
    .await;
    assert_eq!(status(&t.http, &other, &newest).await, StatusCode::OK);

    // A grace period the form does not offer changes nothing.
    let newest_id = key_id(&t.pool, &newest).await;
    post_form(
        &acme.browser,
        "/api/rotate_key",
        &[("key", &newest_id.to_string()), ("grace", "999999999")],
    )
    .await;
    assert!(acme
        .browser
        .html("/keys")
        .await
        .contains("That form was not understood"));
    let keys: i64 = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM api_keys"#)
        .fetch_one(&t.pool)
        .await
        .unwrap();
    assert_eq!(keys, 3);
}

/// Every column of a key that a form could change.
async fn key_state(pool: &PgPool, id: Uuid) -> (Option<OffsetDateTime>, Option<OffsetDateTime>) {
    let r = sqlx::query!(
        "SELECT revoked_at, expires_at FROM api_keys WHERE id = $1",
        id
    )
    .fetch_one(pool)
    .await
    .unwrap();
    (r.revoked_at, r.expires_at)
}

#[sqlx::test(migrations = "../migrations")]
async fn another_tenants_key_ids_and_forms_without_csrf_change_nothing(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let acme = member(&t, "acme").await;
    let beta = member(&t, "beta").await;
    let beta_key = create_key(&beta.browser, "beta-secret-name").await;
    let beta_id = key_id(&t.pool, &beta_key).await;
    let acme_key = create_key(&acme.browser, "acme-key").await;
    let acme_id = key_id(&t.pool, &acme_key).await;

    // Acme never sees beta's keys.
    let html = acme.browser.html("/keys").await;
    assert!(!html.contains("beta-secret-name"));
    assert!(!html.contains(tf_core::keys::visible_prefix(&beta_key)));
    assert!(!html.contains(&beta_id.to_string()));

    // Acme posts beta's key id to every key form: "No such key", and nothing changes.
    for (path, extra) in [
        ("/api/revoke_key", None),
        ("/api/rotate_key", Some(("grace", "0"))),
        ("/api/rotate_key", Some(("grace", "3600"))),
    ] {
        let id = beta_id.to_string();
        let mut form = vec![("key", id.as_str())];
        form.extend(extra);
        post_form(&acme.browser, path, &form).await;
        assert!(acme.browser.html("/keys").await.contains("No such key"));
    }
    assert_eq!(key_state(&t.pool, beta_id).await, (None, None));
    let names: Vec<String> = sqlx::query_scalar!(
        "SELECT name FROM api_keys WHERE tenant_id = $1",
        beta.tenant
    )
    .fetch_all(&t.pool)
    .await
    .unwrap();
    assert_eq!(names, ["beta-secret-name"]);
    let acme_keys: i64 = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM api_keys WHERE tenant_id = $1"#,
        acme.tenant
    )
    .fetch_one(&t.pool)
    .await
    .unwrap();
    assert_eq!(acme_keys, 1);
    assert_eq!(status(&t.http, &t.url(""), &beta_key).await, StatusCode::OK);
    // Garbage ids are unknown ids.
    post_form(&acme.browser, "/api/revoke_key", &[("key", "1 OR 1=1")]).await;
    assert!(acme.browser.html("/keys").await.contains("No such key"));

    // Without the right CSRF token, no form changes anything (even the tenant's own key).
    let own = acme_id.to_string();
    for token in [None, Some("00"), Some(&"a".repeat(64)[..])] {
        for (path, fields) in [
            ("/api/create_key", vec![("name", "forged")]),
            ("/api/revoke_key", vec![("key", own.as_str())]),
            (
                "/api/rotate_key",
                vec![("key", own.as_str()), ("grace", "0")],
            ),
        ] {
            let mut form = fields.clone();
            if let Some(token) = token {
                form.push(("csrf", token));
            }
            let res = acme.browser.post(path, &form).await;
            assert_redirect(&res, "/keys");
        }
    }
    assert!(acme
        .browser
        .html("/keys")
        .await
        .contains("This form has expired"));
    assert_eq!(key_state(&t.pool, acme_id).await, (None, None));
    let total: i64 = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM api_keys"#)
        .fetch_one(&t.pool)
        .await
        .unwrap();
    assert_eq!(total, 2);

    // Signed out, the forms and the listing refuse.
    let stranger = browser_at(&t.url(""));
    let token = csrf(&stranger.html("/login").await);
    assert_redirect(
        &stranger
            .post("/api/revoke_key", &[("csrf", &token), ("key", &own)])
            .await,
        "/login",
    );
    assert_eq!(key_state(&t.pool, acme_id).await, (None, None));
    assert_eq!(
        stranger.get("/api/keys").await.status(),
        StatusCode::FORBIDDEN
    );
    assert_redirect(&stranger.get("/keys").await, "/login");
    // Beta's listing endpoint returns beta's keys only.
    let listed = beta.browser.get("/api/keys").await.text().await.unwrap();
    assert!(listed.contains("beta-secret-name") && !listed.contains("acme-key"));
}

#[sqlx::test(migrations = "../migrations")]
async fn last_use_is_written_at_most_once_a_minute_and_shown(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let acme = member(&t, "acme").await;
    let secret = create_key(&acme.browser, "busy").await;
    let id = key_id(&t.pool, &secret).await;
    assert!(acme.browser.html("/keys").await.contains("never"));
    let keys = &t.app.gateway.keys;
    let before = keys.last_used_writes();

    for _ in 0..40 {
        assert_eq!(status(&t.http, &t.url(""), &secret).await, StatusCode::OK);
    }
    keys.flush_last_used().await.unwrap();
    let first: Option<OffsetDateTime> =
        sqlx::query_scalar!("SELECT last_used_at FROM api_keys WHERE id = $1", id)
            .fetch_one(&t.pool)
            .await
            .unwrap();
    assert!(first.is_some());
    for _ in 0..40 {
        assert_eq!(status(&t.http, &t.url(""), &secret).await, StatusCode::OK);
    }
    // Nothing is queued: the key was marked less than a minute ago.
    assert_eq!(keys.flush_last_used().await.unwrap(), 0);
    let second: Option<OffsetDateTime> =
        sqlx::query_scalar!("SELECT last_used_at FROM api_keys WHERE id = $1", id)
            .fetch_one(&t.pool)
            .await
            .unwrap();
    assert_eq!(first, second);
    assert_eq!(keys.last_used_writes() - before, 1);

    // Another replica marking the same key within the minute writes nothing either.
    let other = tokenfactory::gateway::auth::KeyCache::new(t.pool.clone());
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(
        axum::http::header::AUTHORIZATION,
        format!("Bearer {secret}").parse().unwrap(),
    );
    other.authenticate(&headers, None).await.unwrap();
    assert_eq!(other.flush_last_used().await.unwrap(), 0);

    let html = acme.browser.html("/keys").await;
    assert!(!html.contains(">never<"), "{html}");
    assert!(html.contains(&super_when(first.unwrap())));
}

/// The portal's time format (`tf_app::keys::when`).
fn super_when(t: OffsetDateTime) -> String {
    tf_app::keys::when(t)
}

/// The figure shown in the home's `stat-<name>` element.
fn stat(html: &str, name: &str) -> String {
    let marker = format!(r#"id="stat-{name}""#);
    let at = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no {marker}: {html}"));
    let start = at + html[at..].find('>').unwrap() + 1;
    let len = html[start..].find('<').unwrap();
    html[start..start + len].to_owned()
}

fn event(tenant: Uuid, base: &str, prompt: i64, completion: i64, at: OffsetDateTime) -> UsageEvent {
    UsageEvent {
        request_id: Uuid::now_v7(),
        tenant_id: tenant,
        api_key_id: None,
        served_name: base.into(),
        base_model: base.into(),
        adapter: None,
        graph: "graph-a".into(),
        price_key: base.into(),
        prompt_tokens: prompt,
        cached_tokens: prompt / 2,
        completion_tokens: completion,
        reasoning_tokens: 0,
        endpoint: tokenfactory::endpoint::Endpoint::Chat,
        provenance: Provenance::Engine,
        status: UsageStatus::Ok,
        stream: false,
        ttft_ms: Some(5),
        duration_ms: 9,
        started_at: at,
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn the_home_shows_this_months_usage_keys_and_models_of_the_tenant_only(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let acme = member(&t, "acme").await;
    let beta = member(&t, "beta").await;
    let now = OffsetDateTime::now_utc();
    let month_start = now
        .replace_day(1)
        .unwrap()
        .replace_time(time::Time::MIDNIGHT);
    let rates = tf_core::money::Rates {
        fresh_per_m: 2_500_000,
        cached_per_m: 1_250_000,
        output_per_m: 5_000_000,
    };
    tf_core::db::billing::set_price(
        &t.pool,
        month_start - time::Duration::days(40),
        common::BASE,
        "standard",
        rates,
        "test",
    )
    .await
    .unwrap()
    .unwrap();
    let mut events = vec![
        event(acme.tenant, common::BASE, 1_000, 333, now),
        event(acme.tenant, common::BASE, 7, 0, month_start),
        event(acme.tenant, common::BASE, 400_000, 1_234_567, now),
        // Last month, and another tenant's: not counted.
        event(
            acme.tenant,
            common::BASE,
            999,
            999,
            month_start - time::Duration::seconds(1),
        ),
        event(beta.tenant, common::BASE, 5_000, 5_000, now),
    ];
    let mut refused = event(acme.tenant, common::BASE, 0, 0, now);
    refused.status = UsageStatus::Rejected;
    events.push(refused);
    tf_core::db::usage::insert_batch(&t.pool, &events)
        .await
        .unwrap();
    // Expected cost: each event rated once, half-up, as billed ((prompt, completion); half the
    // prompt is cached).
    let cost: i64 = [(1_000, 333), (7, 0), (400_000, 1_234_567)]
        .iter()
        .map(|(prompt, completion)| {
            let q = tf_core::money::Quantities {
                fresh: prompt - prompt / 2,
                cached: prompt / 2,
                output: *completion,
            };
            tf_core::money::line_micros(q, rates)
        })
        .sum();
    assert_eq!(cost, 3_540 + 14 + 6_922_835);
    create_key(&acme.browser, "one").await;
    let second = create_key(&acme.browser, "two").await;
    let second_id = key_id(&t.pool, &second).await;
    post_form(
        &acme.browser,
        "/api/revoke_key",
        &[("key", &second_id.to_string())],
    )
    .await;
    let beta_tenant = common::Tenant {
        id: beta.tenant,
        name: "beta".into(),
        key: String::new(),
        key_id: Uuid::nil(),
    };
    t.adapter(&beta_tenant, "beta-private-adapter").await;
    let acme_tenant = common::Tenant {
        id: acme.tenant,
        name: "acme".into(),
        key: String::new(),
        key_id: Uuid::nil(),
    };
    t.adapter(&acme_tenant, "acme-helper").await;
    // Unloaded for idleness: still callable (the next request loads it), so still listed.
    t.adapter(&acme_tenant, "acme-dozing").await;
    sqlx::query!("UPDATE adapters SET state = 'unloaded' WHERE name = 'acme-dozing'")
        .execute(&t.pool)
        .await
        .unwrap();

    let html = acme.browser.html("/").await;
    assert!(html.contains("acme Inc"), "{html}");
    assert_eq!(stat(&html, "requests"), "3");
    assert_eq!(stat(&html, "cost"), "$6.926389");
    assert_eq!(stat(&html, "cost"), tf_app::money::format_micros(cost));
    assert_eq!(stat(&html, "keys"), "1");
    assert!(html.contains("401,007"), "prompt tokens: {html}");
    assert!(html.contains("1,234,900"), "completion tokens: {html}");
    assert!(html.contains("200,503 cached"), "{html}");
    assert!(html.contains(common::BASE));
    assert!(html.contains("acme-helper") && html.contains("adapter on sim-base"));
    assert!(html.contains("acme-dozing"), "{html}");
    assert!(!html.contains("beta-private-adapter"));
    for price in ["$2.50", "$1.25", "$5.00"] {
        assert!(
            html.contains(&format!(r#"<td class="num">{price}</td>"#)),
            "price per million {price}: {html}"
        );
    }
    assert!(html.contains(&format!("{}/v1/chat/completions", t.url(""))));
    assert!(html.contains("Bearer YOUR_KEY"));
    for link in ["/keys", "/usage", "/logs"] {
        assert!(html.contains(&format!(r#"href="{link}""#)), "{link}");
    }
    assert!(!html.contains("will appear here"));

    let beta_home = beta.browser.html("/").await;
    assert_eq!(stat(&beta_home, "requests"), "1");
    assert_eq!(stat(&beta_home, "keys"), "0");
    assert!(!beta_home.contains("acme-helper"));
    assert!(beta_home.contains("beta-private-adapter"));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_tenant_cannot_create_keys_past_its_cap(pool: PgPool) {
    let t = TestApp::builder(pool).max_keys_per_tenant(3).start().await;
    let acme = member(&t, "acme").await;
    let b = &acme.browser;
    let first = create_key(b, "one").await;
    create_key(b, "two").await;
    create_key(b, "three").await;
    // The fourth is refused, with the reason on the page; nothing is stored.
    post_form(b, "/api/create_key", &[("name", "four")]).await;
    let html = b.html("/keys").await;
    assert!(
        html.contains("a tenant may have at most 3 working keys"),
        "{html}"
    );
    assert!(shown_secret(&html).is_none());
    let count = || async {
        tf_core::db::keys::count_active(&t.pool, acme.tenant)
            .await
            .unwrap()
    };
    assert_eq!(count().await, 3);
    // A revoked key frees its place.
    let id = key_id(&t.pool, &first).await;
    post_form(b, "/api/revoke_key", &[("key", &id.to_string())]).await;
    create_key(b, "four").await;
    assert_eq!(count().await, 3);
}

/// Issue 31: every key action a member takes in the portal is in the audit log, written in the
/// action's transaction, naming who, from where, and which key (by prefix, never the secret).
#[sqlx::test(migrations = "../migrations")]
async fn portal_key_actions_are_audited_with_the_member_and_the_key(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let acme = member(&t, "acme").await;
    let secret = create_key(&acme.browser, "backend").await;
    let id = key_id(&t.pool, &secret).await;
    post_form(
        &acme.browser,
        "/api/rotate_key",
        &[("key", &id.to_string()), ("grace", "0")],
    )
    .await;
    let rotated: Uuid = sqlx::query_scalar(
        "SELECT id FROM api_keys WHERE tenant_id = $1 AND revoked_at IS NULL AND expires_at IS NULL",
    )
    .bind(acme.tenant)
    .fetch_one(&t.pool)
    .await
    .unwrap();
    post_form(
        &acme.browser,
        "/api/revoke_key",
        &[("key", &rotated.to_string())],
    )
    .await;

    /// (action, target, actor user, tenant, actor name)
    type Row = (String, String, Option<Uuid>, Option<Uuid>, String);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT action, target, actor_user_id, tenant_id, actor FROM audit_log
         WHERE action LIKE 'key.%' ORDER BY id",
    )
    .fetch_all(&t.pool)
    .await
    .unwrap();
    let prefixes: Vec<String> =
        sqlx::query_scalar("SELECT prefix FROM api_keys WHERE tenant_id = $1 ORDER BY created_at")
            .bind(acme.tenant)
            .fetch_all(&t.pool)
            .await
            .unwrap();
    let actions: Vec<(&str, &str)> = rows.iter().map(|r| (r.0.as_str(), r.1.as_str())).collect();
    assert_eq!(
        actions,
        vec![
            ("key.create", prefixes[0].as_str()),
            ("key.rotate", prefixes[0].as_str()),
            ("key.revoke", prefixes[1].as_str()),
        ]
    );
    for r in &rows {
        assert_eq!(r.3, Some(acme.tenant));
        assert!(r.2.is_some(), "the member is named");
        assert_eq!(r.4, "ada@acme.test");
    }
    let all: String = sqlx::query_scalar("SELECT string_agg(detail::text, ' ') FROM audit_log")
        .fetch_one(&t.pool)
        .await
        .unwrap();
    assert!(!all.contains(&secret), "no secret in the audit log");
}
