//! The orchestrator's probes on the real binary: `/healthz` answers while the process serves,
//! whatever PostgreSQL does; `/readyz` answers 503 while PostgreSQL is unreachable (a TCP proxy
//! the test cuts between the binary and the database) and 200 again once it is back, and 503
//! while a migration the binary embeds is missing. Also: `serve --fleet kubernetes` refuses a
//! local adapter store before it starts anything, naming the fix.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::time::{Duration, Instant};

use common::chaos::ChaosProxy;
use common::eventually::eventually_every;
use common::TestApp;
use serde_json::Value;
use sqlx::PgPool;

/// Probes every 100 ms: each one is a request to the binary.
const EVERY: Duration = Duration::from_millis(100);

async fn get(http: &reqwest::Client, url: &str) -> (u16, Value) {
    let r = http
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn readyz_follows_postgres_and_healthz_does_not(pool: PgPool) {
    let proxy = ChaosProxy::start("127.0.0.1:5432").await;
    let dir = tempfile::tempdir().unwrap();
    let deployment = TestApp::builder(pool.clone())
        .database_via(proxy.addr)
        .process(dir.path())
        .await;
    let gw = deployment.start().await;
    let http = reqwest::Client::new();

    let (status, body) = get(&http, &gw.url("/healthz")).await;
    assert_eq!((status, body), (200, Value::String("ok".into())));
    let (status, body) = get(&http, &gw.url("/readyz")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ready"], true);
    assert_eq!(body["postgres"]["state"], "ok");
    assert!(body["redis"].is_string(), "Redis is reported: {body}");

    proxy.cut();
    let cut_at = Instant::now();
    let body = eventually_every(EVERY, Duration::from_secs(10), "/readyz 503", || async {
        match get(&http, &gw.url("/readyz")).await {
            (503, body) => Ok(body),
            other => Err(other),
        }
    })
    .await;
    let noticed = cut_at.elapsed();
    assert_eq!(body["ready"], false);
    assert_eq!(body["postgres"]["state"], "unreachable");
    // Within the cached verdict's life plus one bounded check.
    assert!(noticed < Duration::from_secs(4), "took {noticed:?}");
    // Alive all the same: liveness must not restart a pod for its database.
    let started = Instant::now();
    let (status, _) = get(&http, &gw.url("/healthz")).await;
    assert_eq!(status, 200);
    assert!(started.elapsed() < Duration::from_millis(500));
    // While down, a probe answers promptly (bounded check), never hangs on the pool.
    let started = Instant::now();
    let (status, _) = get(&http, &gw.url("/readyz")).await;
    assert_eq!(status, 503);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    proxy.restore();
    eventually_every(
        EVERY,
        Duration::from_secs(15),
        "/readyz 200 again",
        || async {
            match get(&http, &gw.url("/readyz")).await {
                (200, body) if body["ready"] == true => Ok(()),
                other => Err(other),
            }
        },
    )
    .await;
    gw.kill().await;
}

/// A database one migration behind the binary (its row removed, as if it had not run) is not
/// ready, and the answer names the version; once it is back, ready again. A burst of probes
/// costs one check: they are all answered, fast.
#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn readyz_wants_every_embedded_migration(pool: PgPool) {
    let app = TestApp::builder(pool.clone()).start().await;
    let http = reqwest::Client::new();
    let url = app.url("/readyz");
    let (status, body) = get(&http, &url).await;
    assert_eq!(status, 200, "{body}");

    let last = tf_core::db::MIGRATOR
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap();
    let row: (i64, String, Vec<u8>, i64) = sqlx::query_as(
        "DELETE FROM _sqlx_migrations WHERE version = $1
         RETURNING version, description, checksum, execution_time",
    )
    .bind(last)
    .fetch_one(&pool)
    .await
    .unwrap();
    let body = eventually_every(EVERY, Duration::from_secs(5), "/readyz 503", || async {
        match get(&http, &url).await {
            (503, body) => Ok(body),
            other => Err(other),
        }
    })
    .await;
    assert_eq!(body["postgres"]["missing"], serde_json::json!([last]));
    assert!(body["postgres"]["state"]
        .as_str()
        .unwrap()
        .contains("tokenfactory migrate"));

    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES ($1, $2, true, $3, $4)",
    )
    .bind(row.0)
    .bind(row.1)
    .bind(row.2)
    .bind(row.3)
    .execute(&pool)
    .await
    .unwrap();
    eventually_every(EVERY, Duration::from_secs(5), "/readyz 200", || async {
        get(&http, &url).await.0 == 200
    })
    .await;

    // A probe storm: 200 at once, all answered (one check in flight, the rest share it).
    let started = Instant::now();
    let answers = futures::future::join_all((0..200).map(|_| get(&http, &url))).await;
    assert!(answers.iter().all(|(s, _)| *s == 200));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// Workers on Kubernetes fetch adapters from the store themselves: a local directory is refused
/// at start-up (before any connection), with the flag that fixes it.
#[tokio::test]
async fn kubernetes_fleet_refuses_a_local_adapter_store() {
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tokenfactory"))
        .args(["serve", "--fleet", "kubernetes", "--adapter-store"])
        .arg(dir.path())
        // Unreachable on purpose: the refusal must come before any connection is tried.
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
        .env("TF_LISTEN", "127.0.0.1:0")
        .env_remove("TF_ADAPTER_STORE")
        .env_remove("TF_FLEET")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--adapter-store s3://"), "{stderr}");
    assert!(stderr.contains("--fleet kubernetes"), "{stderr}");
    assert!(
        !stderr.contains("PostgreSQL"),
        "refused before connecting: {stderr}"
    );
}
