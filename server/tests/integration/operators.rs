//! Operator commands and operator-facing start-up behaviour, against the real server on port 0,
//! real PostgreSQL and Redis: `admin revoke-key`, `suspend-tenant`, `reactivate-tenant`,
//! `limits --key` with odd input, the demo credentials kept between starts, and a replica that
//! starts before Redis and switches to shared limits once Redis is up.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use crate::common;

use std::time::Duration;

use clap::Parser;
use common::chaos::ChaosProxy;
use common::eventually::eventually_every;
use common::*;
use sqlx::PgPool;
use tokenfactory::cli::{Cli, Command};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Runs `tokenfactory admin ARGS` on the test database; returns what it prints, or the error.
async fn admin(pool: &PgPool, args: &[&str]) -> Result<String, String> {
    let argv = ["tokenfactory", "admin"].iter().chain(args).copied();
    let Some(Command::Admin(cmd)) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not an admin command")
    };
    let mut out = Vec::new();
    tokenfactory::admin::run_on(pool, cmd, &mut out)
        .await
        .map_err(|e| format!("{e:#}"))?;
    Ok(String::from_utf8(out).unwrap())
}

/// Polls `/v1/models` with `key` until it answers `status` (at most 3 s: NOTIFY plus the 1 s
/// cache freshness bound).
async fn wait_for_status(t: &TestApp, key: &str, status: u16) {
    let what = format!("/v1/models to answer {status}");
    eventually(Duration::from_secs(3), &what, || async {
        let s = t
            .http
            .get(t.url("/v1/models"))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .status();
        if s == status {
            Ok(())
        } else {
            Err(s)
        }
    })
    .await;
}

#[sqlx::test(migrations = "../migrations")]
async fn revoke_key_by_prefix_or_id_is_refused_on_the_next_requests(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let acme = t.tenant("acme").await;
    wait_for_status(&t, &acme.key, 200).await;
    let prefix = tf_core::keys::visible_prefix(&acme.key).to_owned();
    let out = admin(&t.pool, &["revoke-key", &prefix]).await.unwrap();
    assert!(out.contains(&prefix) && out.contains("acme"), "{out}");
    wait_for_status(&t, &acme.key, 401).await;
    // Twice is an error naming the key, not a silent success.
    let again = admin(&t.pool, &["revoke-key", &acme.key])
        .await
        .unwrap_err();
    assert!(again.contains(&prefix), "{again}");

    let (second, key) = tf_core::keys::issue(&t.pool, acme.id, "second")
        .await
        .unwrap();
    wait_for_status(&t, &key, 200).await;
    admin(&t.pool, &["revoke-key", &second.id.to_string()])
        .await
        .unwrap();
    wait_for_status(&t, &key, 401).await;
    // An odd argument (not ASCII, not a key) is answered, not a panic.
    let e = admin(&t.pool, &["revoke-key", "tf-abcdefgéxyz"])
        .await
        .unwrap_err();
    assert!(e.contains("no unrevoked key"), "{e}");
}

#[sqlx::test(migrations = "../migrations")]
async fn suspend_tenant_makes_its_keys_403_and_reactivate_restores_them(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    let acme = t.tenant("acme").await;
    let beta = t.tenant("beta").await;
    wait_for_status(&t, &acme.key, 200).await;
    let out = admin(&t.pool, &["suspend-tenant", "--tenant", "acme"])
        .await
        .unwrap();
    assert!(out.contains("suspended tenant acme"), "{out}");
    wait_for_status(&t, &acme.key, 403).await;
    wait_for_status(&t, &beta.key, 200).await;
    admin(&t.pool, &["reactivate-tenant", "--tenant", "acme"])
        .await
        .unwrap();
    wait_for_status(&t, &acme.key, 200).await;
    let e = admin(&t.pool, &["suspend-tenant", "--tenant", "nope"])
        .await
        .unwrap_err();
    assert!(e.contains("tenant nope not found"), "{e}");
}

#[sqlx::test(migrations = "../migrations")]
async fn limits_for_a_non_ascii_key_prefix_is_an_error_not_a_panic(pool: PgPool) {
    let t = TestApp::builder(pool).start().await;
    t.tenant("acme").await;
    // Byte 11 falls inside the 'é': slicing there used to panic.
    for given in ["tf-abcdefgéxyz", "tf-aééééééééé"] {
        let e = admin(&t.pool, &["limits", "--key", given])
            .await
            .unwrap_err();
        assert!(e.contains("no key with prefix"), "{given}: {e}");
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn demo_credentials_survive_a_restart_and_another_replica_revokes_nothing(pool: PgPool) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join(".tokenfactory/demo.json");
    let first = tokenfactory::demo::ensure(&pool, None, &state)
        .await
        .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&state).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }
    // A restart prints the same credentials, and they work.
    let again = tokenfactory::demo::ensure(&pool, None, &state)
        .await
        .unwrap();
    assert_eq!(again, first);
    for (email, password) in [
        (&first.member_email, &first.member_password),
        (&first.admin_email, &first.admin_password),
    ] {
        assert!(
            tf_core::accounts::authenticate(&pool, email, password)
                .await
                .unwrap()
                .is_ok(),
            "{email}"
        );
    }
    let t = TestApp::builder(pool.clone()).start().await;
    wait_for_status(&t, &first.api_key, 200).await;

    // A replica elsewhere (no state file) gets its own key; the first one keeps working.
    let elsewhere = dir.path().join("other/demo.json");
    let other = tokenfactory::demo::ensure(&pool, None, &elsewhere)
        .await
        .unwrap();
    assert_ne!(other.api_key, first.api_key);
    let revoked: i64 = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM api_keys WHERE revoked_at IS NOT NULL"#
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(revoked, 0);
    wait_for_status(&t, &first.api_key, 200).await;

    // A stale file (say, of another database) is repaired, not trusted.
    std::fs::write(
        &state,
        serde_json::json!({
            "member_email": "demo@tokenfactory.local", "member_password": "not it at all",
            "admin_email": "admin@tokenfactory.local", "admin_password": "not it either",
            "api_key": "tf-not-a-key"
        })
        .to_string(),
    )
    .unwrap();
    let repaired = tokenfactory::demo::ensure(&pool, None, &state)
        .await
        .unwrap();
    assert_ne!(repaired.api_key, "tf-not-a-key");
    assert_ne!(repaired.member_password, "not it at all");
    wait_for_status(&t, &repaired.api_key, 200).await;
}

/// The demo costs its simulated bases so the economics page has figures, from the start of the
/// day it first runs; a restart adds no version and an operator's cost is never replaced.
#[sqlx::test(migrations = "../migrations")]
async fn the_demo_costs_its_bases_once_and_keeps_an_operators_cost(pool: PgPool) {
    use tokenfactory::fleet::local_sim;
    local_sim::offer(&pool).await.unwrap();
    let (ours, other) = (local_sim::BASES[0].0, local_sim::BASES[1].0);
    // An operator costed one base before the demo ever ran.
    let operator = tf_core::operator::Actor {
        user_id: None,
        name: "ops@example.com",
        source_ip: None,
    };
    let cost = tf_core::db::economics::NewCost {
        base_model: other,
        effective_from: time::macros::datetime!(2026-11-01 0:00 UTC),
        gpu_micros_per_hour: 1_250_000,
        gpus_per_replica: 1,
        peak_tokens_per_second: 500,
        created_by: "ops@example.com",
    };
    tf_core::operator::set_base_cost(&pool, &operator, &cost)
        .await
        .unwrap();
    let now = time::macros::datetime!(2026-12-04 17:30 UTC);
    for _ in 0..2 {
        tokenfactory::demo::costs(&pool, now).await.unwrap();
    }
    let costs = tf_core::db::economics::costs(&pool).await.unwrap();
    let of = |base: &str| {
        costs
            .iter()
            .filter(|c| c.base_model == base)
            .collect::<Vec<_>>()
    };
    let demo = of(ours);
    assert_eq!(demo.len(), 1, "one version, whatever the restarts");
    assert_eq!(
        demo[0].effective_from,
        time::macros::datetime!(2026-12-04 0:00 UTC)
    );
    assert_eq!(
        demo[0].gpu_micros_per_hour,
        tokenfactory::demo::DEMO_GPU_MICROS_PER_HOUR
    );
    assert_eq!(
        demo[0].peak_tokens_per_second,
        tokenfactory::demo::DEMO_PEAK_TOKENS_PER_SECOND
    );
    assert_eq!(demo[0].created_by, "demo");
    let kept = of(other);
    assert_eq!(kept.len(), 1, "the operator's cost stays the only one");
    assert_eq!(kept[0].gpu_micros_per_hour, 1_250_000);
}

#[test]
fn serve_runs_no_demo_unless_asked() {
    let parse = |argv: &[&str]| match Cli::try_parse_from(argv).unwrap().command {
        Some(Command::Serve(a)) => a.demo,
        _ => panic!("not serve"),
    };
    assert!(!parse(&["tokenfactory", "serve"]));
    assert!(parse(&["tokenfactory", "serve", "--demo"]));
    assert!(!parse(&["tokenfactory", "serve", "--demo", "false"]));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_replica_started_before_redis_switches_to_shared_limits_when_it_comes_up(pool: PgPool) {
    let proxy = ChaosProxy::start("127.0.0.1:6379").await;
    proxy.cut();
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let slot = tokenfactory::redis_conn::connect(
        &format!("redis://{}", proxy.addr),
        &tracker,
        cancel.clone(),
    )
    .await;
    assert!(!slot.is_filled(), "Redis was down at start-up");
    let prefix = format!("tftest-{}:", uuid::Uuid::new_v4().simple());
    let t = TestApp::builder(pool.clone())
        .redis_slot(slot.clone())
        .redis_prefix(&prefix)
        .quota(tokenfactory::quota::QuotaOptions {
            quota_reconcile_ms: 100,
            ..Default::default()
        })
        .start()
        .await;
    let acme = t.tenant("acme").await;
    admin(
        &pool,
        &[
            "limits",
            "--tenant",
            "acme",
            "--rpm",
            "1000",
            "--spend-limit",
            "1",
        ],
    )
    .await
    .unwrap();
    let send = || async {
        t.post(&acme.key, "/v1/chat/completions", chat(BASE, "hello", 2))
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(send().await, 200);
    assert_eq!(t.app.gateway.quota.admissions(), (0, 0), "decided locally");

    proxy.restore();
    let redis = redis::Client::open("redis://127.0.0.1:6379")
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let redis = &tokio::sync::Mutex::new(redis);
    let period = tokenfactory::quota::plan::period(time::OffsetDateTime::now_utc()).0;
    let spend_key = format!("{prefix}q:s:t:{}:{period}", acme.id);
    eventually_every(
        Duration::from_millis(100),
        Duration::from_secs(20),
        "shared limits and reconciled spend after Redis came up",
        || async {
            assert_eq!(send().await, 200);
            let (_, via_redis) = t.app.gateway.quota.admissions();
            // The reconciler runs only once there is Redis: it writes the billed spend.
            let reconciled: Option<i64> = redis::cmd("GET")
                .arg(&spend_key)
                .query_async(&mut *redis.lock().await)
                .await
                .unwrap();
            if slot.is_filled() && via_redis > 0 && reconciled.is_some() {
                return Ok(());
            }
            Err(format!(
                "still local (filled {}, admissions {:?}, spend {reconciled:?})",
                slot.is_filled(),
                t.app.gateway.quota.admissions(),
            ))
        },
    )
    .await;
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
}
