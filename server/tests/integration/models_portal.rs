//! The tenant console's `/models` page, driven like a browser with JavaScript off against the
//! whole server: the offered base with its max LoRA rank, an adapter uploaded through `/api/v1`
//! with its state and engine name, and nothing of it on another tenant's page; the forms (upload,
//! start, stop, delete) over the same lifecycle service, refused for read-only members, without
//! the CSRF token and for another tenant's adapter.

#![expect(
    clippy::unwrap_used,
    reason = "a test helper that fails should fail the test loudly"
)]

use crate::common;

use common::lifecycle::{self, valid_adapter, LORA_BASE};
use common::portal::{assert_redirect, Browser, PASSWORD};
use reqwest::{redirect::Policy, Client};
use sqlx::PgPool;
use tf_core::accounts::{self, Role};
use tf_engine_sim::SimConfig;
use uuid::Uuid;

/// How long the simulated fleet may take to follow a command.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

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
    // The engine's name for it is the operator's: not shown to the tenant (it pushed the
    // buttons out of the card).
    assert!(!html.contains(&engine_name), "engine name hidden: {html}");
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
    // The owner by name, linked to its admin page; no bare UUID.
    assert!(html.contains(r#"href="/admin/tenants/acme""#), "{html}");
    assert!(!html.contains(&acme.id.to_string()), "{html}");

    let ada = signed_in(app, Some(acme.id), "ada@acme.test").await;
    let res = ada.get("/admin/fleet").await;
    assert_eq!(res.status(), 403);
    assert!(!res.text().await.unwrap().contains(">helper<"));
}

/// Posts the upload form like a browser with JavaScript off: the CSRF token first (as the page
/// orders it), then name, base and both files (the weights under `weights_file`).
async fn upload_form(
    b: &Browser,
    token: Option<&str>,
    name: &str,
    (config, weights, weights_file): (&[u8], &[u8], &str),
) -> reqwest::Response {
    let mut fields = Vec::new();
    if let Some(t) = token {
        fields.push(("csrf", t));
    }
    fields.extend([("name", name), ("base", LORA_BASE)]);
    let (ct, body) = lifecycle::multipart(
        &fields,
        &[
            ("adapter_config.json", "adapter_config.json", config),
            ("adapter_model.safetensors", weights_file, weights),
        ],
    );
    b.http
        .post(format!("{}/models/upload", b.base))
        .header("accept", "text/html,application/xhtml+xml,*/*;q=0.8")
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap()
}

/// Posts a start/stop/delete form of `/models` with `token` (and the delete confirmation).
async fn command(b: &Browser, name: &str, verb: &str, token: &str) -> reqwest::Response {
    b.post(
        &format!("/models/{name}/{verb}"),
        &[("csrf", token), ("confirm", "yes")],
    )
    .await
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn an_owner_uploads_starts_stops_and_deletes_through_the_forms(pool: PgPool) {
    let h = lifecycle::start(pool.clone(), SimConfig::default()).await;
    let app = &h.app;
    let acme = app.tenant("acme").await;
    let ada = signed_in(app, Some(acme.id), "ada@acme.test").await;

    let html = ada.html("/models").await;
    let form_at = html
        .find(r#"action="/models/upload""#)
        .expect("the upload form");
    let form = &html[form_at..];
    assert!(form.contains(r#"enctype="multipart/form-data""#), "{form}");
    let (token_at, file_at) = (
        form.find(r#"name="csrf""#).unwrap(),
        form.find(r#"type="file""#).unwrap(),
    );
    assert!(token_at < file_at, "the token goes before the files");
    assert!(
        form.contains(&format!(r#"<option value="{LORA_BASE}""#)),
        "{form}"
    );
    assert!(
        html.contains(r#"id="upload-progress""#),
        "progress bar for JavaScript"
    );
    let token = common::portal::csrf(&html);

    let (config, weights) = valid_adapter(LORA_BASE);
    let files = (&config[..], &weights[..], "adapter_model.safetensors");
    let res = upload_form(&ada, Some(&token), "helper", files).await;
    assert_eq!(res.status(), 303);
    assert_redirect(&res, "/models");
    let html = ada.html("/models").await;
    assert!(html.contains("Adapter uploaded and validated"), "{html}");
    assert!(html.contains(">stopped<"), "{html}");
    assert_eq!(app.state_of(&acme, "helper").await, "stopped");

    assert!(html.contains(r#"action="/models/helper/start""#), "{html}");
    let res = command(&ada, "helper", "start", &token).await;
    assert_eq!(res.status(), 303);
    assert_redirect(&res, "/models");
    common::eventually(SETTLE, "ready after Start", || async {
        app.state_of(&acme, "helper").await == "ready"
    })
    .await;
    // The gateway's routes follow the stored state by notification, a moment later: until then
    // the name answers 503 `model_starting`, never anything else.
    common::eventually(SETTLE, "the started adapter answers", || async {
        let (status, _, body) = app.ask(&acme, "helper").await;
        assert!(
            status == 200 || (status == 503 && body["error"]["code"] == "model_starting"),
            "{status} {body}"
        );
        status == 200
    })
    .await;
    let html = ada.html("/models").await;
    assert!(html.contains(">ready<"), "{html}");
    assert!(
        html.contains("$TOKENFACTORY_API_KEY"),
        "curl snippet: {html}"
    );
    assert!(
        html.contains("from openai import OpenAI"),
        "python snippet: {html}"
    );
    assert!(
        html.contains(&format!("{}/v1", app.url(""))),
        "public URL: {html}"
    );
    assert!(html.contains(r#"action="/models/helper/stop""#), "{html}");

    let res = command(&ada, "helper", "stop", &token).await;
    assert_redirect(&res, "/models");
    common::eventually(SETTLE, "stopped after Stop", || async {
        app.state_of(&acme, "helper").await == "stopped"
    })
    .await;

    // Delete needs its confirmation ticked.
    let res = ada
        .post("/models/helper/delete", &[("csrf", token.as_str())])
        .await;
    assert_redirect(&res, "/models");
    assert!(ada.html("/models").await.contains("Tick the confirmation"));
    assert_eq!(app.state_of(&acme, "helper").await, "stopped");
    let res = command(&ada, "helper", "delete", &token).await;
    assert_redirect(&res, "/models");
    common::eventually(SETTLE, "gone after Delete", || async {
        app.state_of(&acme, "helper").await == "absent"
    })
    .await;
    assert!(ada.html("/models").await.contains("No adapters yet."));
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn a_rejected_upload_shows_its_reason_on_the_page(pool: PgPool) {
    let h = lifecycle::start(pool.clone(), SimConfig::default()).await;
    let app = &h.app;
    let acme = app.tenant("acme").await;
    let ada = signed_in(app, Some(acme.id), "ada@acme.test").await;
    let token = ada.token_on("/models").await;
    let (config, weights) = valid_adapter(LORA_BASE);

    let files = (&config[..], &weights[..], "adapter_model.bin");
    let res = upload_form(&ada, Some(&token), "pickled", files).await;
    assert_redirect(&res, "/models");
    let html = ada.html("/models").await;
    assert!(html.contains("The adapter was rejected"), "{html}");
    assert!(html.contains(">rejected<"), "{html}");
    assert!(
        html.contains("is a PyTorch pickle file"),
        "precise reason: {html}"
    );

    // A bad name is refused before anything is stored.
    let files = (&config[..], &weights[..], "adapter_model.safetensors");
    let res = upload_form(&ada, Some(&token), "-bad name", files).await;
    assert_redirect(&res, "/models");
    assert!(ada
        .html("/models")
        .await
        .contains("A model name is 1 to 64"));
    assert_eq!(app.state_of(&acme, "-bad name").await, "absent");
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn read_only_csrf_and_other_tenants_are_refused(pool: PgPool) {
    let h = lifecycle::start(pool.clone(), SimConfig::default()).await;
    let app = &h.app;
    let acme = app.tenant("acme").await;
    let globex = app.tenant("globex").await;
    let (config, weights) = valid_adapter(LORA_BASE);
    let (status, body) = app
        .upload(&acme, "helper", LORA_BASE, &config, &weights)
        .await;
    assert_eq!(status, 201, "{body}");
    let files = (&config[..], &weights[..], "adapter_model.safetensors");

    // Read-only: no forms shown, and every post refused with 403.
    let rita = signed_in(app, Some(acme.id), "rita@acme.test").await;
    let rita_id: Uuid = sqlx::query_scalar("SELECT id FROM users WHERE email = $1")
        .bind("rita@acme.test")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    tf_core::db::members::set_role(&app.pool, acme.id, rita_id, tf_core::TenantRole::ReadOnly)
        .await
        .unwrap();
    let html = rita.html("/models").await;
    assert!(html.contains(">helper<"), "{html}");
    assert!(html.contains("Your role is read-only"), "{html}");
    assert!(!html.contains("/models/upload"), "no upload form: {html}");
    assert!(!html.contains("/models/helper/"), "no buttons: {html}");
    let token = common::portal::csrf(&html);
    for verb in ["start", "stop", "delete"] {
        // A browser is sent back to the page (its frame and navigation) with the reason.
        let res = command(&rita, "helper", verb, &token).await;
        assert_eq!(res.status(), 303, "{verb}");
        assert_eq!(res.headers()["location"], "/models", "{verb}");
        let html = rita.html("/models").await;
        assert!(
            html.contains(
                "Your role is read-only: you can see the models but not change them. Nothing"
            ),
            "{verb}: {html}"
        );
        assert!(html.contains(r#"href="/keys""#), "navigation shown: {html}");
        // Any other client gets the 403 as JSON.
        let res = rita
            .post_accepting(
                &format!("/models/helper/{verb}"),
                &[("csrf", token.as_str()), ("confirm", "yes")],
                "*/*",
            )
            .await;
        assert_eq!(res.status(), 403, "{verb}");
        let body: serde_json::Value = res.json().await.unwrap();
        assert!(
            body["error"].as_str().unwrap().contains("read-only"),
            "{body}"
        );
    }
    let res = upload_form(&rita, Some(&token), "sneaky", files).await;
    assert_eq!(res.status(), 303);
    assert_eq!(app.state_of(&acme, "helper").await, "stopped");
    assert_eq!(app.state_of(&acme, "sneaky").await, "absent");

    // An owner's forms without the token (or with a wrong one) are refused too.
    let ada = signed_in(app, Some(acme.id), "ada@acme.test").await;
    let token = ada.token_on("/models").await;
    assert_eq!(upload_form(&ada, None, "sneaky", files).await.status(), 403);
    let wrong = "0".repeat(64);
    assert_eq!(
        upload_form(&ada, Some(&wrong), "sneaky", files)
            .await
            .status(),
        403
    );
    assert_eq!(
        ada.post("/models/helper/start", &[("confirm", "yes")])
            .await
            .status(),
        403
    );
    assert_eq!(command(&ada, "helper", "start", &wrong).await.status(), 403);
    assert_eq!(app.state_of(&acme, "sneaky").await, "absent");
    assert_eq!(app.state_of(&acme, "helper").await, "stopped");

    // Another tenant's adapter is answered like one that does not exist.
    let bob = signed_in(app, Some(globex.id), "bob@globex.test").await;
    let bob_token = bob.token_on("/models").await;
    for verb in ["start", "stop", "delete"] {
        let foreign = command(&bob, "helper", verb, &bob_token).await.status();
        let made_up = command(&bob, "nothing-here", verb, &bob_token)
            .await
            .status();
        assert_eq!((foreign.as_u16(), made_up.as_u16()), (404, 404), "{verb}");
    }
    assert_eq!(app.state_of(&acme, "helper").await, "stopped");
    // The owner's own start works with the right token.
    assert_redirect(&command(&ada, "helper", "start", &token).await, "/models");
}

/// The upload form refuses a public model's name with 409 and a page saying why; nothing is
/// stored under that name.
#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn the_upload_form_refuses_a_public_models_name(pool: PgPool) {
    let h = lifecycle::start(pool.clone(), SimConfig::default()).await;
    let app = &h.app;
    let acme = app.tenant("acme").await;
    let ada = signed_in(app, Some(acme.id), "ada@acme.test").await;
    let token = ada.token_on("/models").await;
    let (config, weights) = valid_adapter(LORA_BASE);
    let files = (&config[..], &weights[..], "adapter_model.safetensors");
    let res = upload_form(&ada, Some(&token), LORA_BASE, files).await;
    assert_eq!(res.status().as_u16(), 409);
    let html = res.text().await.unwrap();
    assert!(html.contains("belongs to a public model"), "{html}");
    assert_eq!(app.state_of(&acme, LORA_BASE).await, "absent");
}
