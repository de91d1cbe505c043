//! `/limits`: the tenant's and each working key's limits as an admin set them, beside this
//! minute's and this month's consumption; every role reads it, nobody in the tenant edits it,
//! and another tenant's keys are not on it.

use crate::common;

use common::portal::{assert_redirect, MEMBER, PASSWORD};
use common::{admin_limits, TestApp};
use sqlx::PgPool;
use tf_core::usage::{Provenance, UsageEvent, UsageStatus};
use time::OffsetDateTime;
use uuid::Uuid;

fn event(tenant: Uuid, key: Uuid, prompt: i64, completion: i64) -> UsageEvent {
    UsageEvent {
        request_id: Uuid::now_v7(),
        tenant_id: tenant,
        api_key_id: Some(key),
        served_name: "m".into(),
        base_model: "m".into(),
        adapter: None,
        graph: "g".into(),
        price_key: "m".into(),
        prompt_tokens: prompt,
        cached_tokens: 0,
        completion_tokens: completion,
        reasoning_tokens: 0,
        endpoint: tokenfactory::endpoint::Endpoint::Chat,
        provenance: Provenance::Engine,
        status: UsageStatus::Ok,
        stream: false,
        ttft_ms: Some(5),
        duration_ms: 9,
        started_at: OffsetDateTime::now_utc(),
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn limits_and_consumption_of_the_tenant_only(pool: PgPool) {
    let p = TestApp::builder(pool).start_portal().await;
    let acme = tf_core::accounts::find_tenant(&p.pool, "acme")
        .await
        .unwrap();
    let globex = tf_core::accounts::create_tenant(&p.pool, "globex", "Globex")
        .await
        .unwrap();
    let (key, _) = tf_core::keys::issue(&p.pool, acme.id, "backend")
        .await
        .unwrap();
    let (foreign, _) = tf_core::keys::issue(&p.pool, globex.id, "theirs")
        .await
        .unwrap();
    admin_limits(
        &p.pool,
        &["--tenant", "acme", "--rpm", "120", "--max-in-flight", "7"],
    )
    .await;
    admin_limits(&p.pool, &["--key", &key.prefix, "--tpm", "4321"]).await;
    tf_core::db::usage::insert_batch(
        &p.pool,
        &[
            event(acme.id, key.id, 1000, 234),
            event(globex.id, foreign.id, 5, 5),
        ],
    )
    .await
    .unwrap();

    let b = p.browser();
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/");
    let html = b.html("/limits").await;
    assert!(html.contains(&key.prefix), "{html}");
    assert!(
        !html.contains(&foreign.prefix),
        "another tenant's key is not shown"
    );
    assert!(
        html.contains("1 / 120"),
        "tenant: one request of 120 a minute: {html}"
    );
    assert!(
        html.contains("1,234 / 4,321"),
        "key: tokens of the last minute against its TPM: {html}"
    );
    assert!(html.contains(">7<"), "max in flight");
    assert!(html.contains("unlimited"));
    assert_eq!(
        html.matches("<form").count(),
        1,
        "only the logout form: nothing edits limits"
    );
}
