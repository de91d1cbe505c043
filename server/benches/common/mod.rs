//! What every benchmark needs first: a database of its own, recreated and migrated.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // benchmarks fail loudly

pub mod machine;
pub mod passthrough;

/// Drops and recreates database `name` on the server of `DATABASE_URL` (or the local default),
/// migrates it and returns a pool of `connections` and its URL.
pub async fn fresh_database(name: &str, connections: u32) -> (sqlx::PgPool, String) {
    let admin = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let base = admin.rsplit_once('/').map(|(b, _)| b.to_owned()).unwrap();
    let maint = sqlx::PgPool::connect(&format!("{base}/postgres"))
        .await
        .unwrap();
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&maint)
        .await
        .unwrap();
    let url = format!("{base}/{name}");
    let pool = tf_core::db::connect(&url, connections).await.unwrap();
    tf_core::db::migrate(&pool, &url).await.unwrap();
    (pool, url)
}
