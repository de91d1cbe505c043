//! The rater's batch stays linear in its own size whatever the plan cache holds (issue 35): a
//! pooled connection that has called `billing_rate_batch` on an empty queue many times (so
//! PL/pgSQL would have cached a generic plan) still takes a batch from a long queue without
//! reading the queue. And the integrity charge_lines' foreign keys gave is kept by the
//! statement-level check that replaced them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sqlx::{Connection, PgConnection, PgPool};
use tf_core::db::billing;
use uuid::Uuid;

async fn tenant(pool: &PgPool) -> Uuid {
    tf_core::db::accounts::insert_tenant(pool, "plan", "Plan")
        .await
        .unwrap()
        .id
}

/// `n` unrated events of `tenant`, through the real triggers (so they are queued for rating).
async fn queue_events(pool: &PgPool, tenant: Uuid, n: i64) {
    sqlx::query(
        "INSERT INTO usage_events (request_id, tenant_id, served_name, base_model, graph,
             price_key, prompt_tokens, cached_tokens, completion_tokens, provenance, status,
             stream, duration_ms, started_at)
         SELECT gen_random_uuid(), $1, 'm', 'm', 'm', 'm', 10, 0, 5, 'engine', 'ok', false, 1,
                now() - i * interval '1 ms'
         FROM generate_series(1, $2) i",
    )
    .bind(tenant)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

async fn batch(conn: &mut PgConnection, run: i64, limit: i32) -> i32 {
    sqlx::query_scalar("SELECT billing_rate_batch($1, $2)")
        .bind(run)
        .bind(limit)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Queue rows this transaction read by sequential scan so far (this backend's pending counts).
async fn queue_seq_reads(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT COALESCE(seq_tup_read, 0) FROM pg_stat_xact_user_tables
         WHERE relname = 'rating_queue'",
    )
    .fetch_optional(conn)
    .await
    .unwrap()
    .unwrap_or(0)
}

#[sqlx::test(migrations = "../migrations")]
async fn a_batch_after_idling_on_an_empty_queue_reads_only_its_own_rows(pool: PgPool) {
    let tenant = tenant(&pool).await;
    let run = billing::live_run(&pool).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    // The rater's idle passes: more than the five custom plans after which PL/pgSQL may switch
    // to a cached generic plan.
    for _ in 0..12 {
        assert_eq!(batch(&mut conn, run, 100).await, 0);
    }
    queue_events(&pool, tenant, 3000).await;

    let mut tx = conn.begin().await.unwrap();
    let before = queue_seq_reads(&mut tx).await;
    assert_eq!(batch(&mut tx, run, 100).await, 100);
    let read = queue_seq_reads(&mut tx).await - before;
    tx.commit().await.unwrap();
    // A generic plan scans the whole queue (2,970 rows read here) for every batch.
    assert_eq!(read, 0, "the batch scanned the queue: {read} rows read");

    // And the rest drains on the same connection, each event rated once.
    let mut taken = 100;
    loop {
        let n = batch(&mut conn, run, 500).await;
        if n == 0 {
            break;
        }
        taken += n;
    }
    assert_eq!(taken, 3000);
    let lines: i64 = sqlx::query_scalar("SELECT count(*) FROM charge_lines WHERE run_id = $1")
        .bind(run)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(lines, 3000);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_line_cannot_name_a_missing_run_or_version_and_runs_are_kept(pool: PgPool) {
    let tenant = tenant(&pool).await;
    let run = billing::live_run(&pool).await.unwrap();
    let insert = |run: i64, version: Option<i64>| {
        sqlx::query(
            "INSERT INTO charge_lines (run_id, request_id, tenant_id, price_key, started_at,
                 price_version_id, fresh_tokens, cached_tokens, output_tokens, amount_micros, flag)
             VALUES ($1, $2, $3, 'm', now(), $4, 1, 0, 1, 1, '')",
        )
        .bind(run)
        .bind(Uuid::now_v7())
        .bind(tenant)
        .bind(version)
    };
    let code = |e: sqlx::Error| {
        e.as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.into_owned())
    };
    let missing_run = insert(run + 1000, None).execute(&pool).await.unwrap_err();
    assert_eq!(code(missing_run).as_deref(), Some("23503"));
    let missing_version = insert(run, Some(987_654)).execute(&pool).await.unwrap_err();
    assert_eq!(code(missing_version).as_deref(), Some("23503"));
    insert(run, None).execute(&pool).await.unwrap();

    let deleted = sqlx::query("DELETE FROM rating_runs WHERE id = $1")
        .bind(run)
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(
        code(deleted).as_deref(),
        Some("23000"),
        "a rating run was deleted"
    );
    let renumbered = sqlx::query("UPDATE rating_runs SET id = id + 1000 WHERE id = $1")
        .bind(run)
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(
        code(renumbered).as_deref(),
        Some("23000"),
        "a rating run was renumbered"
    );
}
