//! Scale to zero (issue 18): gateways record when graphs were last used and ask for wakes; the
//! fleet controller starts and ends wakes. Each wake is one conditional UPDATE away from
//! happening twice, so many held requests on many replicas still make one wake.

use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use super::lifecycle::{record_history, HistoryEntry};

/// Marks the named graphs used now (a gateway's periodic flush).
pub async fn touch_graphs(pool: &PgPool, names: &[String]) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE graphs SET last_active_at = now() WHERE name = ANY($1)",
        names,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Asks for the graph to be woken; `true` when this call was the one that asked (the graph is
/// asleep and nobody had asked yet).
pub async fn request_wake(pool: &PgPool, graph: &str) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "UPDATE graphs SET wake_requested_at = now()
         WHERE name = $1 AND state = 'asleep' AND wake_requested_at IS NULL",
        graph,
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// An asleep graph starts waking (with `replicas` desired); `false` when it was not asleep.
pub async fn begin_wake(
    pool: &PgPool,
    base_model_id: Uuid,
    name: &str,
    replicas: i32,
) -> sqlx::Result<bool> {
    let mut tx = pool.begin().await?;
    let woke = sqlx::query!(
        "UPDATE graphs SET state = 'waking', reason = NULL, wakes = wakes + 1,
             replicas_desired = $2, state_since = now(), updated_at = now()
         WHERE base_model_id = $1 AND state = 'asleep'",
        base_model_id,
        replicas,
    )
    .execute(&mut *tx)
    .await?
    .rows_affected()
        > 0;
    if woke {
        record_history(
            &mut *tx,
            &HistoryEntry {
                entity: "graph",
                entity_id: base_model_id,
                tenant_id: None,
                name,
                from_state: Some("asleep"),
                to_state: "waking",
                reason: Some("a request arrived"),
                replicas: Some(replicas),
                floor: None,
            },
        )
        .await?;
    }
    tx.commit().await?;
    Ok(woke)
}

/// A wake that failed: back to asleep with zero replicas and the reason; held requests see
/// `wake_failures` grow and answer 503; the next request asks again.
pub async fn wake_failed(
    pool: &PgPool,
    base_model_id: Uuid,
    name: &str,
    reason: &str,
) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    let failed = sqlx::query!(
        "UPDATE graphs SET state = 'asleep', reason = $2, wake_failures = wake_failures + 1,
             wake_requested_at = NULL, replicas_ready = 0, replicas_desired = 0,
             state_since = now(), updated_at = now()
         WHERE base_model_id = $1 AND state = 'waking'",
        base_model_id,
        reason,
    )
    .execute(&mut *tx)
    .await?
    .rows_affected()
        > 0;
    if failed {
        record_history(
            &mut *tx,
            &HistoryEntry {
                entity: "graph",
                entity_id: base_model_id,
                tenant_id: None,
                name,
                from_state: Some("waking"),
                to_state: "asleep",
                reason: Some(reason),
                replicas: Some(0),
                floor: None,
            },
        )
        .await?;
    }
    tx.commit().await
}

/// Sets a base's sleep policy: `Some(secs)` sleeps its graph after that long without a request,
/// `None` keeps it always on (and asks an asleep graph of the base to wake, so always-on means
/// warm from now on). `false` when no templated base has that name. The one write of the policy:
/// the admin page and `tokenfactory admin fleet idle` reach it through
/// `operator::set_idle_policy`, which audits it in the same transaction.
pub async fn set_idle_after(
    db: impl PgExecutor<'_>,
    base: &str,
    idle_after_secs: Option<i32>,
) -> sqlx::Result<bool> {
    let set = sqlx::query_scalar!(
        r#"WITH t AS (
               UPDATE base_templates t SET idle_after_secs = $2, updated_at = now()
               FROM base_models b WHERE b.id = t.base_model_id AND b.name = $1
               RETURNING t.base_model_id),
           w AS (
               UPDATE graphs g SET wake_requested_at = now()
               FROM t
               WHERE $2::int4 IS NULL AND g.base_model_id = t.base_model_id
                 AND g.state = 'asleep' AND g.wake_requested_at IS NULL)
           SELECT count(*) AS "n!" FROM t"#,
        base,
        idle_after_secs,
    )
    .fetch_one(db)
    .await?;
    Ok(set > 0)
}
