//! The tenant console's `/models` page, read like a browser with JavaScript off against the whole
//! server: the offered base with its max LoRA rank, an adapter uploaded through `/api/v1` with its
//! state and engine name, and nothing of it on another tenant's page.

#![expect(
    clippy::unwrap_used,
    reason = "a test helper that fails should fail the test loudly"
)]

mod common;

use common::lifecycle::{self, valid_adapter, LORA_BASE};
use common::portal::{assert_redirect, Browser, PASSWORD};
use reqwest::{redirect::Policy, Client};
use sqlx::PgPool;
use tf_core::accounts::{self, Role};
use tf_engine_sim::SimConfig;
use uuid::Uuid;

/// Signs in a new member of `tenant` (an admin with `None`) through the login form.
async fn signed_in(app: &common::TestApp, tenant: Option<Uuid>, email: &str) -> Browser {
    let role = if tenant.is_some() {
        Role::TenantMember
    } else {
        Role::Admin
    };
    accounts::create_user(&app.pool, email, PASSWORD, role, tenant)
        .await
        .unwrap();
    let browser = Browser {
        base: app.url(""),
        http: Client::builder()
            .cookie_store(true)
            .redirect(Policy::none())
            .build()
            .unwrap(),
    };
    let home = if tenant.is_some() { "/" } else { "/admin" };
    assert_redirect(&browser.login(email, PASSWORD).await, home);
    browser
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn models_page_shows_bases_and_only_the_tenants_own_adapters(pool: PgPool) {
    let h = lifecycle::start(pool.clone(), SimConfig::default()).await;
    let app = &h.app;
    let acme = app.tenant("acme").await;
    let globex = app.tenant("globex").await;
    let (config, weights) = valid_adapter(LORA_BASE);
    let (status, body) = app
        .upload(&acme, "helper", LORA_BASE, &config, &weights)
        .await;
    assert_eq!(status, 201, "{body}");
    let engine_name = body["engine_name"].as_str().unwrap().to_owned();

    let ada = signed_in(app, Some(acme.id), "ada@acme.test").await;
    let html = ada.html("/models").await;
    assert!(html.contains(r#"href="/models""#), "nav link: {html}");
    assert!(html.contains(LORA_BASE), "base listed: {html}");
    assert!(html.contains(">helper<"), "adapter listed: {html}");
    assert!(html.contains(">stopped<"), "state shown: {html}");
    assert!(html.contains(&engine_name), "engine name shown: {html}");
    // Stopped is settled: the page does not reload itself.
    assert!(!html.contains("http-equiv=\"refresh\""), "{html}");

    let bob = signed_in(app, Some(globex.id), "bob@globex.test").await;
    let other = bob.html("/models").await;
    assert!(
        other.contains(LORA_BASE),
        "the base is offered to every tenant"
    );
    assert!(
        !other.contains(">helper<"),
        "another tenant's adapter leaked: {other}"
    );
    assert!(!other.contains(&engine_name), "{other}");
    assert!(other.contains("No adapters yet."), "{other}");
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn admin_fleet_shows_templates_graphs_and_every_tenants_adapters(pool: PgPool) {
    let h = lifecycle::start(pool.clone(), SimConfig::default()).await;
    let app = &h.app;
    let acme = app.tenant("acme").await;
    let (config, weights) = valid_adapter(LORA_BASE);
    let (status, body) = app
        .upload(&acme, "helper", LORA_BASE, &config, &weights)
        .await;
    assert_eq!(status, 201, "{body}");

    let root = signed_in(app, None, "root@platform.test").await;
    let html = root.html("/admin/fleet").await;
    assert!(html.contains(LORA_BASE), "{html}");
    assert!(html.contains(">helper<"), "{html}");
    assert!(html.contains(&acme.id.to_string()), "{html}");

    let ada = signed_in(app, Some(acme.id), "ada@acme.test").await;
    let res = ada.get("/admin/fleet").await;
    assert_eq!(res.status(), 403);
    assert!(!res.text().await.unwrap().contains(">helper<"));
}
