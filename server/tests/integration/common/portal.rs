//! Helpers for the portal tests: the portal alone on an ephemeral port (started by
//! [`TestAppBuilder::start_portal`](super::TestAppBuilder::start_portal)) with a seeded tenant,
//! member and admin, and a cookie-keeping "browser" that posts forms the way one does with
//! JavaScript off.

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]

use reqwest::header::{ACCEPT, CONTENT_TYPE, LOCATION, SET_COOKIE};
use reqwest::{redirect::Policy, Client, Response, StatusCode};
use sqlx::PgPool;

pub const PASSWORD: &str = "correct horse battery";
pub const MEMBER: &str = "ada@acme.test";
pub const ADMIN: &str = "root@tf.test";
const BROWSER_ACCEPT: &str = "text/html,application/xhtml+xml,*/*;q=0.8";

/// A running portal and the database behind it; its tenant is `acme` (member [`MEMBER`]), its
/// admin [`ADMIN`], both with [`PASSWORD`].
pub struct TestPortal {
    pub base: String,
    pub pool: PgPool,
    pub redis_prefix: String,
}

impl TestPortal {
    /// A fresh browser (its own cookie jar) with JavaScript off.
    pub fn browser(&self) -> Browser {
        self.browser_from("127.0.0.1")
    }

    /// A browser connecting from another loopback address (Linux routes all of 127/8 to `lo`),
    /// so the portal sees a different client address.
    pub fn browser_from(&self, ip: &str) -> Browser {
        self.browser_via(ip, None)
    }

    /// A browser connecting from `peer` whose requests carry `X-Forwarded-For: forwarded` (a
    /// client behind a proxy, or one pretending to be).
    pub fn browser_via(&self, peer: &str, forwarded: Option<&str>) -> Browser {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(f) = forwarded {
            headers.insert("x-forwarded-for", f.parse().unwrap());
        }
        let http = Client::builder()
            .cookie_store(true)
            .redirect(Policy::none())
            .local_address(peer.parse::<std::net::IpAddr>().unwrap())
            .default_headers(headers)
            .build()
            .unwrap();
        Browser {
            base: self.base.clone(),
            http,
        }
    }
}

pub struct Browser {
    pub base: String,
    pub http: Client,
}

impl Browser {
    pub async fn get(&self, path: &str) -> Response {
        self.http
            .get(format!("{}{path}", self.base))
            .header(ACCEPT, BROWSER_ACCEPT)
            .send()
            .await
            .unwrap()
    }

    /// GETs a page that must render (200) and returns its HTML.
    pub async fn html(&self, path: &str) -> String {
        let res = self.get(path).await;
        assert_eq!(res.status(), StatusCode::OK, "GET {path}");
        res.text().await.unwrap()
    }

    /// Posts a form the way a browser without JavaScript does.
    pub async fn post(&self, path: &str, form: &[(&str, &str)]) -> Response {
        self.post_accepting(path, form, BROWSER_ACCEPT).await
    }

    pub async fn post_accepting(
        &self,
        path: &str,
        form: &[(&str, &str)],
        accept: &str,
    ) -> Response {
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
    pub async fn login(&self, email: &str, password: &str) -> Response {
        let token = csrf(&self.html("/login").await);
        self.post(
            "/api/login",
            &[("csrf", &token), ("email", email), ("password", password)],
        )
        .await
    }

    /// The CSRF token of a signed-in page.
    pub async fn token_on(&self, path: &str) -> String {
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
pub fn csrf(html: &str) -> String {
    let marker = r#"name="csrf" value=""#;
    let start = html.find(marker).expect("a csrf input") + marker.len();
    let len = html[start..].find('"').unwrap();
    html[start..start + len].to_owned()
}

pub fn location(res: &Response) -> Option<&str> {
    res.headers().get(LOCATION).and_then(|v| v.to_str().ok())
}

/// Asserts a redirect to `path` (302/303).
pub fn assert_redirect(res: &Response, path: &str) {
    assert!(
        res.status().is_redirection(),
        "expected a redirect, got {}",
        res.status()
    );
    assert_eq!(location(res), Some(path));
}

pub fn session_cookie(res: &Response) -> Option<String> {
    set_cookie(res, "tf_session")
}

/// The `Set-Cookie` header of the cookie called `name`, if the response sets it.
pub fn set_cookie(res: &Response, name: &str) -> Option<String> {
    res.headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with(&format!("{name}=")))
        .map(str::to_owned)
}

/// Runs `tokenfactory admin ARGS` against the portal's database; returns what it prints.
pub async fn admin(pool: &PgPool, args: &[&str]) -> String {
    use clap::Parser;
    use tokenfactory::cli::{Cli, Command};
    let argv = ["tokenfactory", "admin"].iter().chain(args).copied();
    let Some(Command::Admin(cmd)) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not an admin command")
    };
    let mut out = Vec::new();
    tokenfactory::admin::run_on(pool, cmd, &mut out)
        .await
        .unwrap();
    String::from_utf8(out).unwrap()
}

/// Stored portal sessions of the user with this email.
pub async fn sessions_of(pool: &PgPool, email: &str) -> i64 {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM portal_sessions s JOIN users u ON u.id = s.user_id WHERE u.email = $1"#,
        email,
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

pub fn cookie_value(set_cookie: &str) -> String {
    let pair = set_cookie.split(';').next().unwrap();
    pair.trim_start_matches("tf_session=").to_owned()
}
