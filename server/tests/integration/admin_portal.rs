//! The admin pages (issue 15): tenants (create with a first user whose password is shown once,
//! suspend on every replica within a second, reactivate, limits through the CLI's code path),
//! users (password reset, ending sessions), the audit log (every action audited with actor and
//! address, CLI actions too; keyset pages and filters; append-only even for the application's
//! own connection), `/admin/ops` (every replica's own figures), the role-based top bar and the
//! 403 page.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::eventually::{eventually, wait_until};
use common::portal::{admin, assert_redirect, location, Browser, ADMIN, MEMBER, PASSWORD};
use common::TestApp;
use reqwest::{redirect::Policy, Client, StatusCode};
use sqlx::PgPool;
use tf_core::accounts::{self, Role};

const ROOT: &str = "root@ops.test";

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

async fn admin_browser(pool: &PgPool, base: &str) -> Browser {
    accounts::create_user(pool, ROOT, PASSWORD, Role::Admin, None)
        .await
        .unwrap();
    let b = browser_at(base);
    assert_redirect(&b.login(ROOT, PASSWORD).await, "/admin");
    b
}

/// Posts an admin form with the CSRF token of `page`; returns where it redirected to.
async fn post(b: &Browser, page: &str, path: &str, fields: &[(&str, &str)]) -> String {
    let token = b.token_on(page).await;
    let mut form = vec![("csrf", token.as_str())];
    form.extend_from_slice(fields);
    let res = b.post(path, &form).await;
    assert!(res.status().is_redirection(), "{path}: {}", res.status());
    location(&res).unwrap().to_owned()
}

/// The password a page shows once, if it shows one.
fn shown_password(html: &str) -> Option<String> {
    let marker = r#"id="new-password""#;
    let at = html.find(marker)?;
    let start = at + html[at..].find('>')? + 1;
    let len = html[start..].find('<')?;
    Some(html[start..start + len].to_owned())
}

async fn api_status(http: &Client, base: &str, key: &str) -> StatusCode {
    http.get(format!("{base}/v1/models"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .status()
}

struct AuditRow {
    actor: String,
    action: String,
    target: String,
    source_ip: Option<String>,
}

async fn audit_rows(pool: &PgPool) -> Vec<AuditRow> {
    sqlx::query_as!(
        AuditRow,
        "SELECT actor, action, target, source_ip FROM audit_log ORDER BY id"
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn an_admin_creates_suspends_and_reactivates_a_tenant_on_every_replica(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let replica = TestApp::builder(t.pool.clone())
        .replica_of(&t)
        .start()
        .await;
    let b = admin_browser(&t.pool, &t.url("")).await;

    let to = post(
        &b,
        "/admin/tenants",
        "/api/admin_create_tenant",
        &[
            ("name", "globex"),
            ("display_name", "Globex Corp"),
            ("email", "Boss@Globex.test"),
        ],
    )
    .await;
    assert_eq!(to, "/admin/tenants");
    let html = b.html("/admin/tenants").await;
    assert!(html.contains("Tenant created."), "{html}");
    let password = shown_password(&html).expect("the first user's password is shown");
    assert!(html.contains("boss@globex.test"));
    assert!(html.contains("Globex Corp"));
    // Shown once only.
    assert_eq!(shown_password(&b.html("/admin/tenants").await), None);

    // The first user signs in with it; a key of the tenant works on both replicas.
    let boss = browser_at(&t.url(""));
    assert_redirect(&boss.login("boss@globex.test", &password).await, "/");
    let tenant = accounts::find_tenant(&t.pool, "globex").await.unwrap();
    let (_, key) = tf_core::keys::issue(&t.pool, tenant.id, "prod")
        .await
        .unwrap();
    for base in [t.url(""), replica.url("")] {
        assert_eq!(api_status(&t.http, &base, &key).await, StatusCode::OK);
    }

    // Suspension from the tenant's page: 403 on every replica within a second, sessions ended.
    let to = post(
        &b,
        "/admin/tenants/globex",
        "/api/admin_suspend_tenant",
        &[("tenant", "globex"), ("from", "detail")],
    )
    .await;
    assert_eq!(to, "/admin/tenants/globex");
    let suspended = Instant::now();
    for base in [t.url(""), replica.url("")] {
        wait_until(Duration::from_secs(1), "403 within a second", || async {
            api_status(&t.http, &base, &key).await == StatusCode::FORBIDDEN
        })
        .await;
    }
    assert!(suspended.elapsed() < Duration::from_secs(2));
    assert_redirect(&boss.get("/").await, "/login");
    assert_eq!(
        common::portal::sessions_of(&t.pool, "boss@globex.test").await,
        0
    );
    let page = b.html("/admin/tenants/globex").await;
    assert!(page.contains("Tenant suspended"), "{page}");
    assert!(page.contains("Reactivate"));

    post(
        &b,
        "/admin/tenants",
        "/api/admin_reactivate_tenant",
        &[("tenant", "globex"), ("from", "list")],
    )
    .await;
    for base in [t.url(""), replica.url("")] {
        wait_until(Duration::from_secs(1), "working again", || async {
            api_status(&t.http, &base, &key).await == StatusCode::OK
        })
        .await;
    }

    // Every action is in the audit log with who and from where.
    let rows = audit_rows(&t.pool).await;
    let seen: Vec<_> = rows
        .iter()
        .map(|r| (r.action.as_str(), r.target.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("tenant.create", "globex"),
            ("tenant.suspend", "globex"),
            ("tenant.reactivate", "globex")
        ]
    );
    for r in &rows {
        assert_eq!(r.actor, ROOT);
        assert_eq!(r.source_ip.as_deref(), Some("127.0.0.1"));
    }
    // A duplicate handle changes nothing and says so.
    post(
        &b,
        "/admin/tenants",
        "/api/admin_create_tenant",
        &[("name", "globex"), ("email", "other@globex.test")],
    )
    .await;
    assert!(b.html("/admin/tenants").await.contains("already exists"));
    assert_eq!(audit_rows(&t.pool).await.len(), 3);
}

#[sqlx::test(migrations = "../migrations")]
async fn limit_forms_take_the_cli_path_and_are_audited(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    assert_redirect(&b.login(ADMIN, PASSWORD).await, "/admin");
    let acme = accounts::find_tenant(&portal.pool, "acme").await.unwrap();
    let (key, _) = tf_core::keys::issue(&portal.pool, acme.id, "batch")
        .await
        .unwrap();
    let other = accounts::create_tenant(&portal.pool, "initech", "Initech")
        .await
        .unwrap();
    let (foreign, _) = tf_core::keys::issue(&portal.pool, other.id, "x")
        .await
        .unwrap();

    let page = "/admin/tenants/acme";
    post(
        &b,
        page,
        "/api/admin_tenant_limits",
        &[
            ("tenant", "acme"),
            ("rpm", "120"),
            ("tpm", ""),
            ("spend_limit", "$5"),
            ("max_in_flight", "none"),
            ("max_long_prompts", ""),
            ("long_prompt_tokens", ""),
        ],
    )
    .await;
    let shown = common::admin_limits(&portal.pool, &["--tenant", "acme"]).await;
    assert!(
        shown.contains("requests per minute          120"),
        "{shown}"
    );
    assert!(
        shown.contains("spend limit (micros/month)   5000000"),
        "{shown}"
    );
    assert!(
        shown.contains("tokens per minute            unlimited"),
        "{shown}"
    );
    let html = b.html(page).await;
    assert!(html.contains("Limits saved"), "{html}");
    assert!(html.contains(r#"name="rpm" value="120""#), "{html}");

    // A key's limits, by its prefix; a key of another tenant is refused and left alone.
    post(
        &b,
        page,
        "/api/admin_key_limits",
        &[
            ("tenant", "acme"),
            ("key", &key.prefix),
            ("rpm", "7"),
            ("tpm", ""),
            ("spend_limit", ""),
        ],
    )
    .await;
    let shown = common::admin_limits(&portal.pool, &["--key", &key.prefix]).await;
    assert!(shown.contains("requests per minute          7"), "{shown}");
    post(
        &b,
        page,
        "/api/admin_key_limits",
        &[
            ("tenant", "acme"),
            ("key", &foreign.prefix),
            ("rpm", "1"),
            ("tpm", ""),
            ("spend_limit", ""),
        ],
    )
    .await;
    assert!(b.html(page).await.contains("No such key of this tenant"));
    let shown = common::admin_limits(&portal.pool, &["--key", &foreign.prefix]).await;
    assert!(
        shown.contains("requests per minute          unlimited"),
        "{shown}"
    );

    // A value that is not a limit changes nothing.
    post(
        &b,
        page,
        "/api/admin_tenant_limits",
        &[("tenant", "acme"), ("rpm", "-3"), ("spend_limit", "")],
    )
    .await;
    assert!(b.html(page).await.contains("nothing was changed"));
    let shown = common::admin_limits(&portal.pool, &["--tenant", "acme"]).await;
    assert!(
        shown.contains("requests per minute          120"),
        "{shown}"
    );

    let rows = audit_rows(&portal.pool).await;
    let seen: Vec<_> = rows
        .iter()
        .map(|r| (r.action.as_str(), r.target.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("limits.tenant", "acme"),
            ("limits.key", key.prefix.as_str())
        ]
    );
    assert!(rows.iter().all(|r| r.actor == ADMIN));
}

#[sqlx::test(migrations = "../migrations")]
async fn cli_operator_actions_write_audit_rows(pool: PgPool) {
    admin(
        &pool,
        &[
            "create-tenant",
            "--name",
            "hooli",
            "--member-email",
            "g@hooli.test",
        ],
    )
    .await;
    let out = admin(&pool, &["issue-key", "--tenant", "hooli", "--name", "ci"]).await;
    let secret = out.lines().last().unwrap().to_owned();
    let prefix = tf_core::keys::visible_prefix(&secret).to_owned();
    common::admin_limits(&pool, &["--tenant", "hooli", "--rpm", "10"]).await;
    common::admin_limits(&pool, &["--key", &prefix, "--tpm", "100"]).await;
    // Showing limits changes nothing and is not recorded.
    common::admin_limits(&pool, &["--tenant", "hooli"]).await;
    admin(&pool, &["revoke-key", &prefix]).await;
    admin(&pool, &["suspend-tenant", "--tenant", "hooli"]).await;
    admin(&pool, &["reactivate-tenant", "--tenant", "hooli"]).await;

    let rows = audit_rows(&pool).await;
    let seen: Vec<_> = rows
        .iter()
        .map(|r| (r.action.as_str(), r.target.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("tenant.create", "hooli"),
            ("key.issue", prefix.as_str()),
            ("limits.tenant", "hooli"),
            ("limits.key", prefix.as_str()),
            ("key.revoke", prefix.as_str()),
            ("tenant.suspend", "hooli"),
            ("tenant.reactivate", "hooli"),
        ]
    );
    assert!(rows
        .iter()
        .all(|r| r.actor == "cli" && r.source_ip.is_none()));
    // The tenant's id is on every row, so the tenant filter finds them all.
    let hooli = accounts::find_tenant(&pool, "hooli").await.unwrap();
    let of_hooli = tf_core::db::audit::search(&pool, Some(hooli.id), None, None, 100)
        .await
        .unwrap();
    assert_eq!(of_hooli.len(), 7);
}

#[sqlx::test(migrations = "../migrations")]
async fn the_audit_log_refuses_update_and_delete_from_the_applications_connection(pool: PgPool) {
    tf_core::operator::suspend_tenant(
        &pool,
        &tf_core::operator::Actor::CLI,
        accounts::create_tenant(&pool, "acme", "Acme")
            .await
            .unwrap()
            .id,
    )
    .await
    .unwrap();
    // The pool the application runs on: the same role and connection settings.
    for statement in [
        "UPDATE audit_log SET actor = 'someone else'",
        "DELETE FROM audit_log",
        "TRUNCATE audit_log",
    ] {
        let err = sqlx::query(statement).execute(&pool).await.unwrap_err();
        let code = err.as_database_error().and_then(|d| d.code()).unwrap();
        assert_eq!(code, "42501", "{statement}: {err}");
    }
    let rows = audit_rows(&pool).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].actor, "cli");
}

#[sqlx::test(migrations = "../migrations")]
async fn the_audit_page_pages_by_id_and_filters_by_tenant_and_action(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let acme = accounts::find_tenant(&portal.pool, "acme").await.unwrap();
    let other = accounts::create_tenant(&portal.pool, "initech", "Initech")
        .await
        .unwrap();
    let cli = tf_core::operator::Actor::CLI;
    for i in 0..60 {
        let t = if i % 2 == 0 { &acme } else { &other };
        let rates = tf_core::db::limits::RateChange {
            requests_per_minute: tf_core::operator::parse_limit(&i.to_string()).unwrap(),
            ..Default::default()
        };
        tf_core::operator::set_tenant_limits(&portal.pool, &cli, t, &rates, &Default::default())
            .await
            .unwrap();
    }
    tf_core::operator::suspend_tenant(&portal.pool, &cli, other.id)
        .await
        .unwrap();
    let b = portal.browser();
    assert_redirect(&b.login(ADMIN, PASSWORD).await, "/admin");

    let ids = |html: &str| -> Vec<i64> {
        html.match_indices(r#"data-audit-id=""#)
            .map(|(at, m)| {
                let rest = &html[at + m.len()..];
                rest[..rest.find('"').unwrap()].parse().unwrap()
            })
            .collect()
    };
    let first = b.html("/admin/audit").await;
    let page1 = ids(&first);
    assert_eq!(page1.len(), 50);
    assert!(page1.windows(2).all(|w| w[0] > w[1]), "newest first");
    assert!(first.contains("tenant.suspend"));
    let older = first
        .split(r#"rel="next" href=""#)
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .replace("&amp;", "&");
    assert!(!older.contains("offset"));
    let page2 = ids(&b.html(&older).await);
    assert_eq!(page2.len(), 11);
    assert!(page2[0] < *page1.last().unwrap());

    let acme_only = ids(&b.html("/admin/audit?tenant=acme").await);
    assert_eq!(acme_only.len(), 30);
    let suspensions = b.html("/admin/audit?action=tenant").await;
    assert_eq!(ids(&suspensions).len(), 1);
    assert_eq!(
        ids(&b
            .html("/admin/audit?action=limits.tenant&tenant=initech")
            .await)
        .len(),
        30
    );
    assert!(b
        .html("/admin/audit?tenant=nobody")
        .await
        .contains("No tenant has that handle"));
}

#[sqlx::test(migrations = "../migrations")]
async fn an_admin_resets_a_password_once_and_ends_sessions(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let member = portal.browser();
    assert_redirect(&member.login(MEMBER, PASSWORD).await, "/");
    let b = portal.browser();
    assert_redirect(&b.login(ADMIN, PASSWORD).await, "/admin");

    let page = b.html("/admin/users").await;
    assert!(page.contains(MEMBER) && page.contains("tenant member") && page.contains("acme"));
    assert!(page.contains(ADMIN) && page.contains("(you)"));
    let id: String = sqlx::query_scalar!(
        "SELECT id::text AS \"id!\" FROM users WHERE email = $1",
        MEMBER
    )
    .fetch_one(&portal.pool)
    .await
    .unwrap();

    post(
        &b,
        "/admin/users",
        "/api/admin_end_sessions",
        &[("user", &id)],
    )
    .await;
    assert_redirect(&member.get("/").await, "/login");
    assert_redirect(&member.login(MEMBER, PASSWORD).await, "/");

    post(
        &b,
        "/admin/users",
        "/api/admin_reset_password",
        &[("user", &id)],
    )
    .await;
    let html = b.html("/admin/users").await;
    let password = shown_password(&html).expect("the new password is shown");
    assert_eq!(shown_password(&b.html("/admin/users").await), None);
    assert_redirect(&member.get("/").await, "/login");
    assert_redirect(&member.login(MEMBER, PASSWORD).await, "/login");
    assert_redirect(&member.login(MEMBER, &password).await, "/");

    let actions: Vec<_> = audit_rows(&portal.pool)
        .await
        .into_iter()
        .map(|r| (r.action, r.target, r.actor))
        .collect();
    assert_eq!(
        actions,
        [
            (
                "user.end_sessions".to_owned(),
                MEMBER.to_owned(),
                ADMIN.to_owned()
            ),
            (
                "user.reset_password".to_owned(),
                MEMBER.to_owned(),
                ADMIN.to_owned()
            ),
        ]
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn the_top_bar_offers_what_the_role_may_reach_and_others_get_403(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    assert_redirect(&b.login(ADMIN, PASSWORD).await, "/admin");
    let html = b.html("/admin/tenants").await;
    for link in [
        "/admin/tenants",
        "/admin/users",
        "/admin/audit",
        "/admin/fleet",
        "/admin/economics",
        "/admin/ops",
    ] {
        assert!(html.contains(&format!(r#"href="{link}""#)), "{link}");
    }
    assert!(!html.contains(r#"href="/keys""#));
    assert_eq!(
        b.get("/admin/nothing-here").await.status(),
        StatusCode::NOT_FOUND
    );

    let m = portal.browser();
    assert_redirect(&m.login(MEMBER, PASSWORD).await, "/");
    let home = m.html("/").await;
    assert!(home.contains(r#"href="/keys""#));
    assert!(
        !home.contains("/admin/"),
        "a member is offered no admin page"
    );
    for path in [
        "/admin",
        "/admin/tenants",
        "/admin/tenants/acme",
        "/admin/users",
        "/admin/audit",
        "/admin/ops",
        "/admin/fleet",
        "/admin/economics",
        "/admin/nothing-here",
    ] {
        let res = m.get(path).await;
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{path}");
        let html = res.text().await.unwrap();
        assert!(
            html.contains("Forbidden") && html.contains(r#"href="/""#),
            "{path}: {html}"
        );
        assert!(
            !html.contains("Create a tenant") && !html.contains(ADMIN),
            "{path}"
        );
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn ops_lists_every_replica_with_its_own_figures(pool: PgPool) {
    use tokenfactory::journal::{Durability, Journal, JournalMetrics};
    let open = |dir: &std::path::Path| {
        Arc::new(
            Journal::open(
                dir,
                Durability::Process,
                Duration::from_millis(5),
                Arc::new(JournalMetrics::default()),
            )
            .unwrap(),
        )
    };
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = TestApp::builder(pool)
        .journal(open(d1.path()))
        .start()
        .await;
    let b = TestApp::builder(a.pool.clone())
        .replica_of(&a)
        .journal(open(d2.path()))
        .start()
        .await;
    let tenant = a.tenant("acme").await;
    // Three requests through replica A, one through B: each reports its own count.
    for (app, n) in [(&a, 3), (&b, 1)] {
        for _ in 0..n {
            let r = app
                .post(
                    &tenant.key,
                    "/v1/chat/completions",
                    common::chat(common::BASE, "hi", 4),
                )
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
        }
    }
    let browser = admin_browser(&a.pool, &b.url("")).await;
    let row_of = |html: &str, id: uuid::Uuid| -> Option<String> {
        let at = html.find(&format!(r#"data-replica="{id}""#))?;
        Some(html[at..at + html[at..].find("</tr>")?].to_owned())
    };
    let cell = |row: &str, class: &str| -> String {
        let at = row.find(&format!(r#"class="num {class}""#)).unwrap();
        let start = at + row[at..].find('>').unwrap() + 1;
        row[start..start + row[start..].find('<').unwrap()].to_owned()
    };
    // Rendered by replica B; both replicas listed, each with its own figures.
    let (ra, rb) = eventually(
        Duration::from_secs(10),
        "both replicas reported",
        || async {
            let html = browser.html("/admin/ops").await;
            let (ra, rb) = (
                row_of(&html, a.app.replica_id)?,
                row_of(&html, b.app.replica_id)?,
            );
            (cell(&ra, "journaled") == "3"
                && cell(&rb, "journaled") == "1"
                && cell(&ra, "shipped") == "3"
                && cell(&rb, "shipped") == "1")
                .then_some((ra, rb))
        },
    )
    .await;
    for r in [&ra, &rb] {
        assert!(r.contains("s ago") && !r.contains("stale"), "{r}");
    }
    // A replica that stops reporting is marked stale (its last report made a minute old).
    a.app.cancel.cancel();
    eventually(Duration::from_secs(10), "replica A shown stale", || async {
        sqlx::query!(
            "UPDATE replica_reports SET seen_at = now() - interval '1 minute' WHERE replica_id = $1",
            a.app.replica_id
        )
        .execute(&a.pool)
        .await
        .unwrap();
        let html = browser.html("/admin/ops").await;
        row_of(&html, a.app.replica_id).filter(|r| r.contains("stale"))
    })
    .await;
    let html = browser.html("/admin/ops").await;
    assert!(!row_of(&html, b.app.replica_id).unwrap().contains("stale"));
}
