//! The portal driven like a browser with JavaScript off: plain form posts
//! (`application/x-www-form-urlencoded`, `Accept: text/html`, no server-function headers), redirects
//! followed by hand, cookies kept in a jar. Real PostgreSQL (a fresh database per test) and real
//! Redis (a unique key prefix per test).

use std::net::SocketAddr;

use reqwest::header::{ACCEPT, CONTENT_TYPE, LOCATION, SET_COOKIE};
use reqwest::{redirect::Policy, Client, Response, StatusCode};
use sqlx::PgPool;
use tf_app::ssr::PortalDeps;
use tf_core::accounts::{self, Role, TenantStatus};
use uuid::Uuid;

const PASSWORD: &str = "correct horse battery";
const MEMBER: &str = "ada@acme.test";
const ADMIN: &str = "root@tf.test";
const BROWSER_ACCEPT: &str = "text/html,application/xhtml+xml,*/*;q=0.8";

/// A running portal and the database behind it.
struct TestPortal {
    base: String,
    pool: PgPool,
}

impl TestPortal {
    /// Starts the portal with an `acme` tenant (member [`MEMBER`]) and an admin [`ADMIN`].
    async fn spawn(pool: PgPool) -> Self {
        Self::spawn_with(pool, true, false).await
    }

    async fn spawn_with(pool: PgPool, with_redis: bool, secure_cookies: bool) -> Self {
        let tenant = accounts::create_tenant(&pool, "acme", "Acme Corp").await.unwrap();
        accounts::create_user(&pool, MEMBER, PASSWORD, Role::TenantMember, Some(tenant.id))
            .await
            .unwrap();
        accounts::create_user(&pool, ADMIN, PASSWORD, Role::Admin, None).await.unwrap();
        let redis = if with_redis {
            let client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
            Some(redis::aio::ConnectionManager::new(client).await.unwrap())
        } else {
            None
        };
        let router = tokenfactory::portal::router(PortalDeps {
            pool: pool.clone(),
            redis,
            redis_prefix: format!("tftest:{}:", Uuid::new_v4()),
            secure_cookies,
        })
        .await
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
                .await
                .unwrap();
        });
        Self {
            base: format!("http://{addr}"),
            pool,
        }
    }

    /// A fresh browser (its own cookie jar) with JavaScript off.
    fn browser(&self) -> Browser {
        let http = Client::builder()
            .cookie_store(true)
            .redirect(Policy::none())
            .build()
            .unwrap();
        Browser {
            base: self.base.clone(),
            http,
        }
    }
}

struct Browser {
    base: String,
    http: Client,
}

impl Browser {
    async fn get(&self, path: &str) -> Response {
        self.http
            .get(format!("{}{path}", self.base))
            .header(ACCEPT, BROWSER_ACCEPT)
            .send()
            .await
            .unwrap()
    }

    /// GETs a page that must render (200) and returns its HTML.
    async fn html(&self, path: &str) -> String {
        let res = self.get(path).await;
        assert_eq!(res.status(), StatusCode::OK, "GET {path}");
        res.text().await.unwrap()
    }

    /// Posts a form the way a browser without JavaScript does.
    async fn post(&self, path: &str, form: &[(&str, &str)]) -> Response {
        self.post_accepting(path, form, BROWSER_ACCEPT).await
    }

    async fn post_accepting(&self, path: &str, form: &[(&str, &str)], accept: &str) -> Response {
        let body = form
            .iter()
            .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
            .collect::<Vec<_>>()
            .join("&");
        self.http
            .post(format!("{}{path}", self.base))
            .header(ACCEPT, accept)
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header("referer", format!("{}/login", self.base))
            .body(body)
            .send()
            .await
            .unwrap()
    }

    /// Fills in the login form (with the page's CSRF token) and submits it.
    async fn login(&self, email: &str, password: &str) -> Response {
        let token = csrf(&self.html("/login").await);
        self.post(
            "/api/login",
            &[("csrf", &token), ("email", email), ("password", password)],
        )
        .await
    }

    /// The CSRF token of a signed-in page.
    async fn token_on(&self, path: &str) -> String {
        csrf(&self.html(path).await)
    }
}

/// Minimal form encoding (the test inputs are ASCII).
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            b' ' => "+".to_owned(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of the hidden `csrf` input.
fn csrf(html: &str) -> String {
    let marker = r#"name="csrf" value=""#;
    let start = html.find(marker).expect("a csrf input") + marker.len();
    let len = html[start..].find('"').unwrap();
    html[start..start + len].to_owned()
}

fn location(res: &Response) -> Option<&str> {
    res.headers().get(LOCATION).and_then(|v| v.to_str().ok())
}

/// Asserts a redirect to `path` (302/303).
fn assert_redirect(res: &Response, path: &str) {
    assert!(res.status().is_redirection(), "expected a redirect, got {}", res.status());
    assert_eq!(location(res), Some(path));
}

fn session_cookie(res: &Response) -> Option<String> {
    res.headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("tf_session="))
        .map(str::to_owned)
}

fn cookie_value(set_cookie: &str) -> String {
    let pair = set_cookie.split(';').next().unwrap();
    pair.trim_start_matches("tf_session=").to_owned()
}

#[sqlx::test(migrations = "../migrations")]
async fn login_page_sets_a_safe_cookie_and_a_csrf_field(pool: PgPool) {
    let portal = TestPortal::spawn(pool).await;
    let res = portal.browser().get("/login").await;
    assert_eq!(res.status(), StatusCode::OK);
    let cookie = session_cookie(&res).expect("a session cookie");
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("SameSite=Lax"), "{cookie}");
    assert!(!cookie.contains("Secure"), "{cookie}");
    let h = res.headers();
    assert_eq!(h["x-frame-options"], "DENY");
    assert_eq!(h["referrer-policy"], "same-origin");
    assert!(h["content-security-policy"].to_str().unwrap().starts_with("default-src 'self'"));
    let html = res.text().await.unwrap();
    assert_eq!(csrf(&html).len(), 64);
    assert!(html.contains(r#"action="/api/login""#), "{html}");
    assert!(html.contains(r#"method="post""#));
    assert!(!html.contains("<script"), "pages need no JavaScript: {html}");
}

#[sqlx::test(migrations = "../migrations")]
async fn cookie_is_secure_when_configured(pool: PgPool) {
    let portal = TestPortal::spawn_with(pool, true, true).await;
    let cookie = session_cookie(&portal.browser().get("/login").await).unwrap();
    assert!(cookie.contains("Secure"), "{cookie}");
}

#[sqlx::test(migrations = "../migrations")]
async fn stylesheet_is_served_from_the_binary(pool: PgPool) {
    let portal = TestPortal::spawn(pool).await;
    let res = portal.browser().get("/style.css").await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers()[CONTENT_TYPE].to_str().unwrap().starts_with("text/css"));
    assert!(res.text().await.unwrap().contains(".card"));
    // Nothing else of the repository is reachable.
    assert_eq!(portal.browser().get("/Cargo.toml").await.status(), StatusCode::NOT_FOUND);
}

#[sqlx::test(migrations = "../migrations")]
async fn member_logs_in_with_a_new_session_id_and_sees_home(pool: PgPool) {
    let portal = TestPortal::spawn(pool).await;
    let b = portal.browser();
    let before = session_cookie(&b.get("/login").await).map(|c| cookie_value(&c));
    let res = b.login(MEMBER, PASSWORD).await;
    assert_redirect(&res, "/");
    let after = session_cookie(&res).map(|c| cookie_value(&c));
    assert!(after.is_some() && after != before, "the session id must change at login");
    let home = b.html("/").await;
    assert!(home.contains(MEMBER), "{home}");
    assert!(home.contains("Acme Corp"), "{home}");
    assert!(home.contains(r#"action="/api/logout""#), "{home}");
    // Signed in, the login page sends the user home.
    assert_redirect(&b.get("/login").await, "/");
}

#[sqlx::test(migrations = "../migrations")]
async fn wrong_password_and_unknown_email_get_the_same_generic_error(pool: PgPool) {
    let portal = TestPortal::spawn(pool).await;
    for (email, password) in [(MEMBER, "wrong password!"), ("nobody@acme.test", PASSWORD)] {
        let b = portal.browser();
        assert_redirect(&b.login(email, password).await, "/login");
        let page = b.html("/login").await;
        assert!(page.contains("Invalid email or password."), "{page}");
        assert_redirect(&b.get("/").await, "/login");
        // The message is shown once.
        assert!(!b.html("/login").await.contains("Invalid email or password."));
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn admin_lands_on_admin(pool: PgPool) {
    let portal = TestPortal::spawn(pool).await;
    let b = portal.browser();
    assert_redirect(&b.login("  Root@TF.test ", PASSWORD).await, "/admin");
    let page = b.html("/admin").await;
    assert!(page.contains("Administration") && page.contains(ADMIN), "{page}");
    assert_redirect(&b.get("/").await, "/admin");
}

#[sqlx::test(migrations = "../migrations")]
async fn member_is_refused_admin(pool: PgPool) {
    let portal = TestPortal::spawn(pool).await;
    let b = portal.browser();
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/");
    let res = b.get("/admin").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(!res.text().await.unwrap().contains("<h1>Administration"));
}

#[sqlx::test(migrations = "../migrations")]
async fn pages_without_a_session_redirect_to_login(pool: PgPool) {
    let portal = TestPortal::spawn(pool).await;
    let b = portal.browser();
    assert_redirect(&b.get("/").await, "/login");
    assert_redirect(&b.get("/admin").await, "/login");
    // Also for clients that do not ask for HTML.
    let res = b.http.get(format!("{}/", portal.base)).send().await.unwrap();
    assert_redirect(&res, "/login");
}

#[sqlx::test(migrations = "../migrations")]
async fn logout_deletes_the_session(pool: PgPool) {
    let portal = TestPortal::spawn(pool).await;
    let b = portal.browser();
    let res = b.login(MEMBER, PASSWORD).await;
    let id = cookie_value(&session_cookie(&res).unwrap());
    let token = b.token_on("/").await;
    assert_redirect(&b.post("/api/logout", &[("csrf", &token)]).await, "/login");
    assert_redirect(&b.get("/").await, "/login");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM tower_sessions.session WHERE id = $1")
        .bind(&id)
        .fetch_one(&portal.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn login_without_the_right_csrf_token_is_refused(pool: PgPool) {
    let portal = TestPortal::spawn(pool).await;
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
        .post_accepting("/api/login", &[("email", MEMBER), ("password", PASSWORD)], "*/*")
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_redirect(&b.get("/").await, "/login");
    // A token from another session is wrong too.
    let other = csrf(&portal.browser().html("/login").await);
    let res = b
        .post("/api/login", &[("csrf", &other), ("email", MEMBER), ("password", PASSWORD)])
        .await;
    assert_redirect(&res, "/login");
    assert_redirect(&b.get("/").await, "/login");
}

#[sqlx::test(migrations = "../migrations")]
async fn logout_without_the_right_csrf_token_is_refused(pool: PgPool) {
    let portal = TestPortal::spawn(pool).await;
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

async fn five_failures_then_the_right_password_is_refused(portal: &TestPortal) {
    let b = portal.browser();
    for _ in 0..5 {
        assert_redirect(&b.login(MEMBER, "wrong password!").await, "/login");
    }
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/login");
    let page = b.html("/login").await;
    assert!(page.contains("Too many failed attempts. Try again in 15 minutes."), "{page}");
    assert_redirect(&b.get("/").await, "/login");
    // Per email: another account from the same address is not affected.
    assert_redirect(&portal.browser().login(ADMIN, PASSWORD).await, "/admin");
}

#[sqlx::test(migrations = "../migrations")]
async fn repeated_failures_throttle_the_email_in_redis(pool: PgPool) {
    five_failures_then_the_right_password_is_refused(&TestPortal::spawn(pool).await).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn repeated_failures_throttle_the_email_without_redis(pool: PgPool) {
    let portal = TestPortal::spawn_with(pool, false, false).await;
    five_failures_then_the_right_password_is_refused(&portal).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_successful_login_clears_the_failures(pool: PgPool) {
    let portal = TestPortal::spawn(pool).await;
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
async fn suspended_tenant_cannot_log_in(pool: PgPool) {
    let portal = TestPortal::spawn(pool).await;
    accounts::set_tenant_status(&portal.pool, "acme", TenantStatus::Suspended)
        .await
        .unwrap();
    let b = portal.browser();
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/login");
    assert!(b.html("/login").await.contains("This tenant is suspended."));
    assert_redirect(&b.get("/").await, "/login");
    // A wrong password still gets the generic message (suspension is no oracle).
    b.login(MEMBER, "wrong password!").await;
    assert!(b.html("/login").await.contains("Invalid email or password."));
}

#[sqlx::test(migrations = "../migrations")]
async fn suspending_a_tenant_ends_its_sessions(pool: PgPool) {
    let portal = TestPortal::spawn(pool).await;
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
