//! Cross-tenant isolation (issue 15): walks EVERY route of the real router — the paths are read
//! from the built axum router itself (pages, server functions, `/v1`, `/api/v1`, whatever is
//! registered, including routes added after this test was written) — signed in as tenant A's
//! user and with A's API key, substituting tenant B's ids (key id, request id, user id, handle,
//! adapter name) wherever a route, a query string, a form or a JSON body can take one. It asserts
//! that
//! - a foreign id is answered exactly like a made-up one (same status), never with a 5xx;
//! - none of B's marker strings (key name, key prefix, display name, email, B's ids) appears in
//!   any response, unless the same request with made-up ids echoes its own input there too;
//! - every `/admin` page and admin server function answers 403 to a tenant user;
//! - B is untouched afterwards (its key works, it is active, its key name and limits unchanged).
//!
//! It can fail: with `db::keys::list_of_tenant`'s `WHERE tenant_id = $1` loosened to
//! `(tenant_id = $1 OR true)`, it fails at `GET /api/keys` showing B's key label (checked by hand
//! when it was written, then reverted).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::collections::BTreeSet;

use common::portal::{assert_redirect, csrf, Browser, PASSWORD};
use common::{Tenant, TestApp};
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{redirect::Policy, Client, StatusCode};
use sqlx::PgPool;
use tf_core::accounts::{self, Role};
use uuid::Uuid;

/// Routes not walked, and why.
const SKIPPED: &[(&str, &str)] = &[
    ("/api/logout", "ends the walking session (it takes no id)"),
    (
        "/api/login",
        "signs in by email and password; takes no tenant id",
    ),
];

/// The ids a request can carry, by every name a route, a form or a query string uses for them.
#[derive(Clone, Debug)]
struct Ids {
    tenant: String,
    key: String,
    key_prefix: String,
    request: String,
    user: String,
    adapter: String,
}

impl Ids {
    /// Form and query fields (a superset of what any form takes; unknown fields are ignored).
    fn fields(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("key", self.key.clone()),
            ("id", self.key.clone()),
            ("key_id", self.key.clone()),
            ("prefix", self.key_prefix.clone()),
            ("request_id", self.request.clone()),
            ("request", self.request.clone()),
            ("user", self.user.clone()),
            ("user_id", self.user.clone()),
            ("member", self.user.clone()),
            ("tenant", self.tenant.clone()),
            // Free text where forms take a name (a new key's): A's own, never B's.
            ("name", "walk-made-this".to_owned()),
            ("adapter", self.adapter.clone()),
            ("model", self.adapter.clone()),
        ];
        // Server functions taking a parameter struct read it as `params[field]`.
        let nested: Vec<_> = v
            .iter()
            .map(|(k, val)| (leak(format!("params[{k}]")), val.clone()))
            .collect();
        v.extend(nested);
        v
    }

    /// A path parameter's value by its name.
    fn param(&self, name: &str) -> String {
        let n = name.trim_start_matches('*');
        match n {
            "name" | "tenant" => self.tenant.clone(),
            "user" | "user_id" | "member" => self.user.clone(),
            "request" | "request_id" => self.request.clone(),
            "adapter" | "model" | "rest" => self.adapter.clone(),
            _ => self.key.clone(),
        }
    }

    fn all(&self) -> [&str; 6] {
        [
            &self.tenant,
            &self.key,
            &self.key_prefix,
            &self.request,
            &self.user,
            &self.adapter,
        ]
    }
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The paths the router serves, read from the router itself (axum prints its route table in its
/// `Debug` output: `RouteId(n): "/path"`).
fn router_paths(router: &axum::Router) -> BTreeSet<String> {
    let dbg = format!("{router:?}");
    dbg.split("RouteId(")
        .skip(1)
        .filter_map(|part| {
            let rest = &part[part.find(": \"")? + 3..];
            Some(rest[..rest.find('"')?].to_owned())
        })
        .filter(|p| p.starts_with('/'))
        .collect()
}

/// `path` with every `{param}` replaced from `ids`.
fn fill(path: &str, ids: &Ids) -> String {
    path.split('/')
        .map(
            |seg| match seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                Some(name) => ids.param(name),
                None => seg.to_owned(),
            },
        )
        .collect::<Vec<_>>()
        .join("/")
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn query(fields: &[(&str, String)]) -> String {
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

struct Answer {
    status: StatusCode,
    body: String,
}

/// One way of calling a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    /// GET, no query string.
    Get,
    /// GET with every id field in the query string.
    GetWithIds,
    /// A form post (CSRF token included) with every id field.
    Form,
    /// A JSON post with every id field (and `model`), with A's API key.
    Json,
}

struct Walker {
    base: String,
    browser: Client,
    key: String,
    token: String,
}

impl Walker {
    async fn call(&self, path: &str, call: Call, ids: &Ids) -> Answer {
        let url = format!("{}{}", self.base, fill(path, ids));
        let fields = ids.fields();
        let req = match call {
            Call::Get => self.browser.get(&url),
            Call::GetWithIds => self.browser.get(format!("{url}?{}", query(&fields))),
            Call::Form => {
                let mut f = vec![("csrf", self.token.clone())];
                f.extend(fields);
                self.browser
                    .post(&url)
                    .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(query(&f))
            }
            Call::Json => {
                let mut body = serde_json::Map::new();
                for (k, v) in &fields {
                    body.insert((*k).to_owned(), serde_json::Value::String(v.clone()));
                }
                body.insert(
                    "messages".into(),
                    serde_json::json!([{"role": "user", "content": "hi"}]),
                );
                body.insert("prompt".into(), "hi".into());
                body.insert("max_tokens".into(), 2.into());
                self.browser.post(&url).json(&body)
            }
        };
        let res = req
            .header(ACCEPT, "text/html,application/json;q=0.9,*/*;q=0.8")
            .bearer_auth(&self.key)
            .send()
            .await
            .unwrap();
        Answer {
            status: res.status(),
            body: res.text().await.unwrap_or_default(),
        }
    }
}

struct Side {
    tenant: Tenant,
    ids: Ids,
    display: String,
    email: String,
    key_name: String,
    /// A word of the stored prompt of its request.
    prompt_marker: String,
}

/// A tenant with a user, a named key, an adapter, one request through the gateway and limits.
/// `name` is the handle; `tag` makes every other marker, none a substring of another.
async fn side(t: &TestApp, name: &str, tag: &str, display: &str) -> Side {
    let tenant = t.tenant(name).await;
    sqlx::query!(
        "UPDATE tenants SET display_name = $2 WHERE id = $1",
        tenant.id,
        display
    )
    .execute(&t.pool)
    .await
    .unwrap();
    let email = format!("person@{tag}-corp.test");
    let user = accounts::create_user(
        &t.pool,
        &email,
        PASSWORD,
        Role::TenantMember,
        Some(tenant.id),
    )
    .await
    .unwrap();
    let key_name = format!("label-{tag}-q9x");
    sqlx::query!(
        "UPDATE api_keys SET name = $2 WHERE id = $1",
        tenant.key_id,
        key_name
    )
    .execute(&t.pool)
    .await
    .unwrap();
    let adapter = format!("adp-{tag}-7k2");
    t.adapter(&tenant, &adapter).await;
    // Opted in to body logging, so the request's prompt is stored and `/logs/{request_id}`
    // has something of B's to leak.
    sqlx::query!(
        "UPDATE tenants SET body_logging = true WHERE id = $1",
        tenant.id
    )
    .execute(&t.pool)
    .await
    .unwrap();
    let prompt_marker = format!("said-{tag}-w4v");
    let r = t
        .post(
            &tenant.key,
            "/v1/chat/completions",
            common::chat(&adapter, &format!("hello there {prompt_marker}"), 3),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let request = common::request_id(&r);
    t.event(&request).await;
    let id: Uuid = request.parse().unwrap();
    common::eventually(
        std::time::Duration::from_secs(5),
        "the stored body",
        || async {
            tf_core::db::bodies::of_request(&t.pool, tenant.id, id)
                .await
                .unwrap()
        },
    )
    .await;
    common::admin_limits(&t.pool, &["--tenant", name, "--rpm", "1000"]).await;
    let prefix = tf_core::keys::visible_prefix(&tenant.key).to_owned();
    common::admin_limits(&t.pool, &["--key", &prefix, "--tpm", "99999"]).await;
    Side {
        ids: Ids {
            tenant: name.to_owned(),
            key: tenant.key_id.to_string(),
            key_prefix: prefix,
            request,
            user: user.id.to_string(),
            adapter,
        },
        tenant,
        display: display.to_owned(),
        email,
        key_name,
        prompt_marker,
    }
}

/// Made-up ids of the same shapes as `like`'s.
fn made_up() -> Ids {
    Ids {
        tenant: "zz-nobody".into(),
        key: Uuid::now_v7().to_string(),
        key_prefix: "tf-ZZZZZZZZ".into(),
        request: Uuid::now_v7().to_string(),
        user: Uuid::now_v7().to_string(),
        adapter: "zz-no-such-adapter".into(),
    }
}

fn is_admin_route(path: &str) -> bool {
    path == "/admin" || path.starts_with("/admin/") || path.starts_with("/api/admin_")
}

#[sqlx::test(migrations = "../migrations")]
async fn no_route_shows_or_changes_another_tenants_data(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let a = side(&t, "alpha", "aa", "Widgets Ltd of A").await;
    let b = side(&t, "bravo", "bb", "Marker Industries of B").await;
    // A admin, so the admin routes and their data exist.
    accounts::create_user(&t.pool, "root@iso.test", PASSWORD, Role::Admin, None)
        .await
        .unwrap();

    let paths = router_paths(&t.app.router);
    for known in [
        "/v1/chat/completions",
        "/v1/models",
        "/keys",
        "/logs",
        "/logs/{request_id}",
        "/admin/tenants",
        "/api/revoke_key",
        "/api/admin_suspend_tenant",
    ] {
        assert!(
            paths.contains(known),
            "route table read from the router lacks {known}: {paths:?}"
        );
    }
    let admin_routes = paths.iter().filter(|p| is_admin_route(p)).count();
    assert!(admin_routes >= 10, "{paths:?}");

    let browser = Client::builder()
        .cookie_store(true)
        .redirect(Policy::none())
        .build()
        .unwrap();
    let signed_in = Browser {
        base: t.url(""),
        http: browser.clone(),
    };
    assert_redirect(&signed_in.login(&a.email, PASSWORD).await, "/");
    let token = csrf(&signed_in.html("/keys").await);
    // Before the walk (it posts A's own "delete all stored bodies"): A reads its own prompt.
    let own = signed_in.html(&format!("/logs/{}", a.ids.request)).await;
    assert!(own.contains(&a.prompt_marker), "A reads its own prompt");
    let walker = Walker {
        base: t.url(""),
        browser,
        key: a.tenant.key.clone(),
        token,
    };

    // Never sent by A, so never allowed in an answer.
    let secret_markers = [
        b.display.as_str(),
        b.email.as_str(),
        b.key_name.as_str(),
        b.ids.key_prefix.as_str(),
        b.prompt_marker.as_str(),
    ];
    let fake = made_up();
    let mut walked = 0;
    let mut refused = BTreeSet::new();
    for path in &paths {
        if SKIPPED.iter().any(|(p, _)| p == path) {
            continue;
        }
        for call in [Call::Get, Call::GetWithIds, Call::Form, Call::Json] {
            let foreign = walker.call(path, call, &b.ids).await;
            let missing = walker.call(path, call, &fake).await;
            walked += 1;
            let what = format!("{call:?} {path}");
            assert!(
                !foreign.status.is_server_error(),
                "{what}: {}",
                foreign.status
            );
            assert_eq!(
                foreign.status, missing.status,
                "{what}: a foreign id must answer like a missing one"
            );
            if is_admin_route(path) {
                // 403 to the method the route serves; another method is 405 before any check,
                // and a post without the CSRF token (the JSON call) is sent back before the role
                // is looked at (CSRF is checked first).
                let csrf_refusal = call == Call::Json && foreign.status.is_redirection();
                assert!(
                    csrf_refusal
                        || [StatusCode::FORBIDDEN, StatusCode::METHOD_NOT_ALLOWED]
                            .contains(&foreign.status),
                    "{what}: admin route for a tenant user answered {}",
                    foreign.status
                );
                if foreign.status == StatusCode::FORBIDDEN {
                    refused.insert(path.clone());
                }
            }
            for m in secret_markers {
                assert!(
                    !foreign.body.contains(m),
                    "{what} shows B's {m:?}:\n{}",
                    foreign.body
                );
            }
            for (theirs, ours) in b.ids.all().iter().zip(fake.all()) {
                if foreign.body.contains(theirs) {
                    assert!(
                        missing.body.contains(ours),
                        "{what} shows B's id {theirs:?} (not an echo of the input):\n{}",
                        foreign.body
                    );
                }
            }
        }
    }
    assert!(walked > 100, "walked only {walked} calls");
    let admin: BTreeSet<_> = paths
        .iter()
        .filter(|p| is_admin_route(p))
        .cloned()
        .collect();
    assert_eq!(
        refused, admin,
        "every admin route refuses a tenant user with 403"
    );

    // A's own data is there (the walk looked at real pages, not at empty shells).
    let logs = signed_in.html("/logs").await;
    assert!(logs.contains(&a.ids.request), "A sees its own request");
    // (A's own prompt was read before the walk, which posts A's "delete all stored bodies".)
    let own = signed_in.get(&format!("/logs/{}", a.ids.request)).await;
    assert_eq!(own.status(), StatusCode::OK);
    let theirs = signed_in.get(&format!("/logs/{}", b.ids.request)).await;
    assert_eq!(
        theirs.status(),
        StatusCode::NOT_FOUND,
        "B's request is not A's to see"
    );
    assert!(signed_in.html("/keys").await.contains(&a.key_name));
    // `/models` lists A's adapter and never B's.
    let page = signed_in.html("/models").await;
    assert!(page.contains(&a.ids.adapter), "{page}");
    assert!(!page.contains(&b.ids.adapter), "{page}");

    // B is untouched.
    let models = t
        .http
        .get(t.url("/v1/models"))
        .bearer_auth(&b.tenant.key)
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), StatusCode::OK, "B's key still works");
    assert!(models.text().await.unwrap().contains(&b.ids.adapter));
    let tb = accounts::find_tenant(&t.pool, "bravo").await.unwrap();
    assert_eq!(tb.status, tf_core::TenantStatus::Active);
    assert_eq!(tb.display_name, b.display);
    let keys = tf_core::db::keys::list_of_tenant(&t.pool, b.tenant.id)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "no key made or rotated for B");
    assert_eq!(keys[0].name, b.key_name);
    assert!(keys[0].revoked_at.is_none() && keys[0].expires_at.is_none());
    let shown = common::admin_limits(&t.pool, &["--tenant", "bravo"]).await;
    assert!(
        shown.contains("requests per minute          1000"),
        "{shown}"
    );
    let shown = common::admin_limits(&t.pool, &["--key", &b.ids.key_prefix]).await;
    assert!(
        shown.contains("tokens per minute            99999"),
        "{shown}"
    );
    let b_browser = common::portal::TestPortal {
        base: t.url(""),
        pool: t.pool.clone(),
        redis_prefix: t.redis_prefix.clone(),
    }
    .browser();
    assert_redirect(&b_browser.login(&b.email, PASSWORD).await, "/");
}
