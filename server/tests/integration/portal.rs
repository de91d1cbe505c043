//! The portal driven like a browser with JavaScript off: plain form posts
//! (`application/x-www-form-urlencoded`, `Accept: text/html`, no server-function headers), redirects
//! followed by hand, cookies kept in a jar. Real PostgreSQL (a fresh database per test) and real
//! Redis (a unique key prefix per test).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use common::portal::*;
use common::TestApp;
use reqwest::header::{CONTENT_TYPE, SET_COOKIE};
use reqwest::StatusCode;
use sqlx::PgPool;
use tf_core::accounts::{self, TenantStatus};
#[sqlx::test(migrations = "../migrations")]
async fn login_page_sets_a_safe_csrf_cookie_and_a_csrf_field(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let res = portal.browser().get("/login").await;
    assert_eq!(res.status(), StatusCode::OK);
    // An anonymous visitor gets no session, only the CSRF cookie.
    assert_eq!(session_cookie(&res), None);
    let cookie = set_cookie(&res, "tf_csrf").expect("a CSRF cookie");
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("SameSite=Lax"), "{cookie}");
    assert!(cookie.contains("Path=/"), "{cookie}");
    assert!(!cookie.contains("Secure"), "{cookie}");
    let h = res.headers();
    assert_eq!(h["x-frame-options"], "DENY");
    assert_eq!(h["referrer-policy"], "same-origin");
    let csp = h["content-security-policy"].to_str().unwrap().to_owned();
    assert!(csp.starts_with("default-src 'self'"), "{csp}");
    let html = res.text().await.unwrap();
    assert_eq!(csrf(&html).len(), 64);
    assert!(
        cookie.starts_with(&format!("tf_csrf={};", csrf(&html))),
        "{cookie}"
    );
    assert!(html.contains(r#"action="/api/login""#), "{html}");
    assert!(html.contains(r#"method="post""#));
    // The only scripts are Leptos's inert bookkeeping, allowed by this response's nonce.
    for script in html.split("<script").skip(1) {
        let nonce = script
            .strip_prefix(r#" nonce=""#)
            .and_then(|s| s.split('"').next())
            .expect("every script has a nonce");
        assert!(csp.contains(&format!("'nonce-{nonce}'")), "{csp}");
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn cookie_is_secure_when_configured(pool: PgPool) {
    let portal = TestApp::builder(pool)
        .shared_redis()
        .secure_cookies()
        .start_portal()
        .await;
    // Behind TLS the CSRF cookie is host-only and HTTPS-only: no subdomain can plant one.
    let cookie = set_cookie(&portal.browser().get("/login").await, "__Host-tf_csrf").unwrap();
    assert!(
        cookie.contains("Secure") && cookie.contains("Path=/"),
        "{cookie}"
    );
    assert!(!cookie.contains("Domain"), "{cookie}");
}

#[sqlx::test(migrations = "../migrations")]
async fn stylesheet_is_served_from_the_binary(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let res = portal.browser().get("/style.css").await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers()[CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/css"));
    assert!(res.text().await.unwrap().contains(".card"));
    // Nothing else of the repository is reachable.
    assert_eq!(
        portal.browser().get("/Cargo.toml").await.status(),
        StatusCode::NOT_FOUND
    );
}

/// Issue 37, item 3: an unknown URL gets the 404 page inside the frame (a visitor the way to
/// sign in, a member their navigation), and a trailing slash is redirected to the page without
/// it, never off the site.
#[sqlx::test(migrations = "../migrations")]
async fn unknown_paths_get_the_framed_404_and_trailing_slashes_redirect(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    let res = b.get("/no-such-page").await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let html = res.text().await.unwrap();
    assert!(html.contains("Not found"), "{html}");
    assert!(html.contains(r#"href="/login""#), "{html}");

    let res = b.get("/usage/?range=7d").await;
    assert_eq!(res.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(res.headers()["location"], "/usage?range=7d");
    // `//host/` would be another site to a browser: not redirected.
    assert_eq!(
        b.get("//evil.example/").await.status(),
        StatusCode::NOT_FOUND
    );

    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/");
    let res = b.get("/keys/nope").await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let html = res.text().await.unwrap();
    assert!(html.contains("Not found"), "{html}");
    assert!(
        html.contains(r#"href="/usage""#),
        "the member's navigation: {html}"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn member_logs_in_with_a_new_session_id_and_sees_home(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    let before = session_cookie(&b.get("/login").await).map(|c| cookie_value(&c));
    let res = b.login(MEMBER, PASSWORD).await;
    assert_redirect(&res, "/");
    let after = session_cookie(&res).map(|c| cookie_value(&c));
    assert!(
        after.is_some() && after != before,
        "the session id must change at login"
    );
    let home = b.html("/").await;
    assert!(home.contains(MEMBER), "{home}");
    assert!(home.contains("Acme Corp"), "{home}");
    assert!(home.contains(r#"action="/api/logout""#), "{home}");
    // Signed in, the login page sends the user home.
    assert_redirect(&b.get("/login").await, "/");
}

#[sqlx::test(migrations = "../migrations")]
async fn wrong_password_and_unknown_email_get_the_same_generic_error(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    for (email, password) in [(MEMBER, "wrong password!"), ("nobody@acme.test", PASSWORD)] {
        let b = portal.browser();
        assert_redirect(&b.login(email, password).await, "/login");
        let page = b.html("/login").await;
        assert!(page.contains("Invalid email or password."), "{page}");
        assert_redirect(&b.get("/").await, "/login");
        // The message is shown once.
        assert!(!b
            .html("/login")
            .await
            .contains("Invalid email or password."));
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn admin_lands_on_admin(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    assert_redirect(&b.login("  Root@TF.test ", PASSWORD).await, "/admin");
    let page = b.html("/admin").await;
    assert!(
        page.contains("Administration") && page.contains(ADMIN),
        "{page}"
    );
    // The usage journal's backlog is on the admin home.
    assert!(
        page.contains("Usage journal") && page.contains("4242 bytes, oldest 31 ms"),
        "{page}"
    );
    assert_redirect(&b.get("/").await, "/admin");
}

#[sqlx::test(migrations = "../migrations")]
async fn member_is_refused_admin(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/");
    let res = b.get("/admin").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(!res.text().await.unwrap().contains("<h1>Administration"));
}

#[sqlx::test(migrations = "../migrations")]
async fn pages_without_a_session_redirect_to_login(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    assert_redirect(&b.get("/").await, "/login");
    assert_redirect(&b.get("/admin").await, "/login");
    // Also for clients that do not ask for HTML.
    let res = b
        .http
        .get(format!("{}/", portal.base))
        .send()
        .await
        .unwrap();
    assert_redirect(&res, "/login");
}

#[sqlx::test(migrations = "../migrations")]
async fn logout_deletes_the_session(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    b.login(MEMBER, PASSWORD).await;
    assert_eq!(sessions_of(&portal.pool, MEMBER).await, 1);
    let token = b.token_on("/").await;
    assert_redirect(&b.post("/api/logout", &[("csrf", &token)]).await, "/login");
    assert_redirect(&b.get("/").await, "/login");
    assert_eq!(sessions_of(&portal.pool, MEMBER).await, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn session_ids_are_stored_only_as_their_hash(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let res = portal.browser().login(MEMBER, PASSWORD).await;
    let id = cookie_value(&session_cookie(&res).unwrap());
    // The cookie is the id's 16 bytes in unpadded URL-safe base64; the row holds their SHA-256.
    let found = sqlx::query!(
        r#"SELECT
           (SELECT count(*) FROM portal_sessions
            WHERE id_sha256 = sha256(decode(translate($1, '-_', '+/') || '==', 'base64'))) AS "hashed!",
           (SELECT count(*) FROM portal_sessions
            WHERE position(convert_to($1, 'UTF8') IN id_sha256) > 0 OR data::text LIKE '%' || $1 || '%') AS "anywhere!""#,
        id,
    )
    .fetch_one(&portal.pool)
    .await
    .unwrap();
    assert_eq!((found.hashed, found.anywhere), (1, 0));
}

#[sqlx::test(migrations = "../migrations")]
async fn anonymous_visits_store_no_session(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    for _ in 0..30 {
        let res = portal.browser().get("/login").await;
        assert_eq!(session_cookie(&res), None);
    }
    // Failed logins and stale forms leave a flash message, in a cookie too.
    let b = portal.browser();
    assert_redirect(&b.login(MEMBER, "wrong password!").await, "/login");
    assert!(b
        .html("/login")
        .await
        .contains("Invalid email or password."));
    b.post("/api/login", &[("csrf", "00")]).await;
    assert!(b.html("/login").await.contains("This form has expired"));
    let rows = sqlx::query!(
        r#"SELECT (SELECT count(*) FROM portal_sessions) AS "portal!",
                  (SELECT count(*) FROM tower_sessions.session) AS "tower!""#,
    )
    .fetch_one(&portal.pool)
    .await
    .unwrap();
    assert_eq!((rows.portal, rows.tower), (0, 0));
}

#[sqlx::test(migrations = "../migrations")]
async fn login_without_the_right_csrf_token_is_refused(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    b.html("/login").await;
    for form in [
        vec![("email", MEMBER), ("password", PASSWORD)],
        vec![("csrf", "00"), ("email", MEMBER), ("password", PASSWORD)],
    ] {
        assert_redirect(&b.post("/api/login", &form).await, "/login");
        assert_redirect(&b.get("/").await, "/login");
    }
    assert!(b.html("/login").await.contains("This form has expired"));
    // The server-function client (no text/html) gets a plain 403.
    let res = b
        .post_accepting(
            "/api/login",
            &[("email", MEMBER), ("password", PASSWORD)],
            "*/*",
        )
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_redirect(&b.get("/").await, "/login");
    // A token from another session is wrong too.
    let other = csrf(&portal.browser().html("/login").await);
    let res = b
        .post(
            "/api/login",
            &[("csrf", &other), ("email", MEMBER), ("password", PASSWORD)],
        )
        .await;
    assert_redirect(&res, "/login");
    assert_redirect(&b.get("/").await, "/login");
}

#[sqlx::test(migrations = "../migrations")]
async fn cross_site_posts_do_not_replace_the_session_cookie(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    // SameSite=Lax: a cross-site form post arrives without the cookie. Were a session created
    // for it, its cookie would replace the visitor's.
    let stranger = portal.browser();
    for (path, form) in [
        (
            "/api/login",
            vec![("email", MEMBER), ("password", PASSWORD)],
        ),
        ("/api/logout", vec![]),
    ] {
        let res = stranger.post(path, &form).await;
        assert!(res.status().is_redirection());
        assert_eq!(res.headers().get(SET_COOKIE), None, "{path}");
    }
    // The page-state function is a GET, never a cookie-less cross-site POST.
    let res = stranger.post("/api/page", &[("access", "Public")]).await;
    assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);
}

#[sqlx::test(migrations = "../migrations")]
async fn logout_without_the_right_csrf_token_is_refused(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/");
    for form in [vec![], vec![("csrf", "0123")]] {
        assert_redirect(&b.post("/api/logout", &form).await, "/");
        b.html("/").await;
    }
    let res = b.post_accepting("/api/logout", &[], "*/*").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(b.html("/").await.contains(MEMBER));
}

/// What a legitimate user from another address sees while 127.0.0.1 hammers their account.
const OTHER_ADDRESS: &str = "127.0.0.2";

async fn failures_from_one_address_delay_only_that_address(portal: &TestPortal) {
    let attacker = portal.browser();
    for _ in 0..5 {
        assert_redirect(&attacker.login(MEMBER, "wrong password!").await, "/login");
    }
    // The sixth attempt from this address waits, even with the right password.
    assert_redirect(&attacker.login(MEMBER, PASSWORD).await, "/login");
    let page = attacker.html("/login").await;
    assert!(
        page.contains("Too many failed attempts. Try again in 30 seconds."),
        "{page}"
    );
    assert_redirect(&attacker.get("/").await, "/login");
    // Hammering on changes nothing for anybody else.
    for _ in 0..20 {
        attacker.login(MEMBER, "wrong password!").await;
    }
    // The account's owner, from another address, signs in: no lockout.
    assert_redirect(
        &portal
            .browser_from(OTHER_ADDRESS)
            .login(MEMBER, PASSWORD)
            .await,
        "/",
    );
    // Another account from the attacker's address is not affected either.
    assert_redirect(&portal.browser().login(ADMIN, PASSWORD).await, "/admin");
}

#[sqlx::test(migrations = "../migrations")]
async fn an_attacker_cannot_lock_an_account_in_redis(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    failures_from_one_address_delay_only_that_address(&portal).await;
    // The counters live in Redis (shared by replicas), under the prefix, with TTLs; refused
    // attempts counted for nothing.
    let client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let p = &portal.redis_prefix;
    for (key, failures, max_ttl_s) in [
        (format!("{p}login:pair:127.0.0.1/{MEMBER}"), 5, 3600),
        (format!("{p}login:account:{MEMBER}"), 5, 900),
    ] {
        let f: u32 = redis::cmd("HGET")
            .arg(&key)
            .arg("f")
            .query_async(&mut conn)
            .await
            .unwrap();
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(f, failures, "{key}");
        assert!(ttl > 0 && ttl <= max_ttl_s * 1000, "{key}: {ttl}");
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn an_attacker_cannot_lock_an_account_without_redis(pool: PgPool) {
    let portal = TestApp::builder(pool).start_portal().await;
    failures_from_one_address_delay_only_that_address(&portal).await;
}

#[tokio::test]
async fn guessing_spread_over_addresses_is_delayed_briefly_not_locked_out() {
    use tf_app::ssr::throttle::{self, LoginThrottle, Verdict};
    let client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
    let slot = Some(redis::aio::ConnectionManager::new(client).await.unwrap()).into();
    let t = LoginThrottle::new(slot, format!("tftest:{}:", uuid::Uuid::new_v4()));
    for i in 0..throttle::ACCOUNT_FREE {
        assert_eq!(
            t.begin("v@x", &format!("10.0.0.{}", i % 7)).await,
            Verdict::Allowed
        );
    }
    // Addresses that have been guessing on the account wait for its bound...
    let Verdict::Throttled { retry_after } = t.begin("v@x", "10.0.0.1").await else {
        panic!("the per-account bound must apply across addresses")
    };
    assert!(retry_after <= throttle::ACCOUNT_MAX, "{retry_after:?}");
    assert_eq!(t.begin("other@x", "10.0.0.1").await, Verdict::Allowed);
    // ...one that has not (the owner's) does not.
    assert_eq!(t.begin("v@x", "10.1.1.1").await, Verdict::Allowed);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_successful_login_clears_the_failures(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    for _ in 0..2 {
        for _ in 0..4 {
            assert_redirect(&b.login(MEMBER, "wrong password!").await, "/login");
        }
        assert_redirect(&b.login(MEMBER, PASSWORD).await, "/");
        let token = b.token_on("/").await;
        assert_redirect(&b.post("/api/logout", &[("csrf", &token)]).await, "/login");
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn resetting_a_password_ends_the_users_sessions(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let (b, other) = (portal.browser(), portal.browser_from(OTHER_ADDRESS));
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/");
    assert_redirect(&other.login(MEMBER, PASSWORD).await, "/");
    let admin_browser = portal.browser();
    assert_redirect(&admin_browser.login(ADMIN, PASSWORD).await, "/admin");
    let out = admin(
        &portal.pool,
        &[
            "reset-password",
            "--email",
            MEMBER,
            "--password",
            "a new one, long enough",
        ],
    )
    .await;
    assert!(out.contains("2 portal session(s) ended"), "{out}");
    assert_redirect(&b.get("/").await, "/login");
    assert_redirect(&other.get("/").await, "/login");
    assert_eq!(sessions_of(&portal.pool, MEMBER).await, 0);
    // Other users keep theirs; the new password works.
    assert!(admin_browser.html("/admin").await.contains(ADMIN));
    assert_redirect(&b.login(MEMBER, "a new one, long enough").await, "/");
}

#[sqlx::test(migrations = "../migrations")]
async fn suspended_tenant_cannot_log_in(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    accounts::set_tenant_status(&portal.pool, "acme", TenantStatus::Suspended)
        .await
        .unwrap();
    let b = portal.browser();
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/login");
    assert!(b.html("/login").await.contains("This tenant is suspended."));
    assert_redirect(&b.get("/").await, "/login");
    // A wrong password still gets the generic message (suspension is no oracle).
    b.login(MEMBER, "wrong password!").await;
    assert!(b
        .html("/login")
        .await
        .contains("Invalid email or password."));
}

#[sqlx::test(migrations = "../migrations")]
async fn suspending_a_tenant_ends_its_sessions(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/");
    b.html("/").await;
    accounts::set_tenant_status(&portal.pool, "acme", TenantStatus::Suspended)
        .await
        .unwrap();
    assert_redirect(&b.get("/").await, "/login");
    assert!(b.html("/login").await.contains("This tenant is suspended."));
    // Reactivation does not revive the session.
    accounts::set_tenant_status(&portal.pool, "acme", TenantStatus::Active)
        .await
        .unwrap();
    assert_redirect(&b.get("/").await, "/login");
}

#[sqlx::test(migrations = "../migrations")]
async fn the_suspend_command_deletes_the_tenants_sessions(pool: PgPool) {
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let b = portal.browser();
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/");
    let admin_browser = portal.browser();
    assert_redirect(&admin_browser.login(ADMIN, PASSWORD).await, "/admin");
    let out = admin(&portal.pool, &["suspend-tenant", "--tenant", "acme"]).await;
    assert!(out.contains("1 portal session(s) ended"), "{out}");
    assert_eq!(sessions_of(&portal.pool, MEMBER).await, 0);
    assert_redirect(&b.get("/").await, "/login");
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/login");
    assert!(b.html("/login").await.contains("This tenant is suspended."));
    assert!(admin_browser.html("/admin").await.contains(ADMIN));
    admin(&portal.pool, &["reactivate-tenant", "--tenant", "acme"]).await;
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/");
}

#[sqlx::test(migrations = "../migrations")]
async fn a_session_ended_elsewhere_is_not_written_back(pool: PgPool) {
    use tf_app::ssr::store::{self, PortalStore};
    use tower_sessions::session::{Id, Record};
    use tower_sessions::SessionStore;
    let portal = TestApp::builder(pool).shared_redis().start_portal().await;
    let user: uuid::Uuid = sqlx::query_scalar!("SELECT id FROM users WHERE email = $1", MEMBER)
        .fetch_one(&portal.pool)
        .await
        .unwrap();
    let s = PortalStore::new(portal.pool.clone());
    let mut record = Record {
        id: Id::default(),
        data: [("user_id".to_owned(), serde_json::json!(user))].into(),
        expiry_date: time::OffsetDateTime::now_utc() + time::Duration::hours(1),
    };
    s.create(&mut record).await.unwrap();
    assert!(s.load(&record.id).await.unwrap().is_some());
    // An operator ends it while a request that loaded it is still running ...
    assert_eq!(
        store::end_sessions_of_user(&portal.pool, user)
            .await
            .unwrap(),
        1
    );
    // ... and that request's save at the end does not bring it back.
    record
        .data
        .insert("seen".to_owned(), serde_json::json!(true));
    s.save(&record).await.unwrap();
    assert!(s.load(&record.id).await.unwrap().is_none());
    assert_eq!(sessions_of(&portal.pool, MEMBER).await, 0);
    // Nothing anonymous is ever stored.
    let mut anonymous = Record {
        id: Id::default(),
        data: Default::default(),
        expiry_date: record.expiry_date,
    };
    assert!(s.create(&mut anonymous).await.is_err());
}
