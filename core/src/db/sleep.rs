//! Scale to zero (issue 18): gateways record when graphs were last used and ask for wakes; the
//! fleet controller starts and ends wakes. Each wake is one conditional UPDATE away from
//! happening twice, so many held requests on many replicas still make one wake.

use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use super::lifecycle::{record_history, HistoryEntry, SleepFacts};

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

/// Marks the named adapters used now (a gateway's periodic flush). Adapters deleted meanwhile
/// are skipped.
pub async fn touch_adapters(pool: &PgPool, ids: &[Uuid]) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO adapter_use (adapter_id, last_active_at)
         SELECT id, now() FROM adapters WHERE id = ANY($1)
         ON CONFLICT (adapter_id) DO UPDATE SET last_active_at = now()",
        ids,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Asks for an idle adapter to be loaded again; `true` when this call was the one that asked
/// (the adapter is unloading or unloaded and nobody had asked yet).
pub async fn request_reload(pool: &PgPool, adapter: Uuid) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "INSERT INTO adapter_use (adapter_id, reload_requested_at)
         SELECT id, now() FROM adapters
         WHERE id = $1 AND desired = 'running' AND state IN ('unloading', 'unloaded')
         ON CONFLICT (adapter_id) DO UPDATE SET reload_requested_at = now()
         WHERE adapter_use.reload_requested_at IS NULL",
        adapter,
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Every managed adapter's [`SleepFacts`] (idle under its base's adapter policy; a held request
/// asked for a reload), by id, read against the database's clock.
pub async fn adapter_sleep(
    db: impl PgExecutor<'_>,
) -> sqlx::Result<std::collections::HashMap<Uuid, SleepFacts>> {
    let rows = sqlx::query!(
        r#"SELECT a.id,
                  COALESCE(GREATEST(u.last_active_at, a.updated_at)
                      < now() - make_interval(secs => t.adapter_idle_after_secs), false) AS "idle!",
                  COALESCE(u.last_active_at > a.updated_at, false) AS "used_since_change!",
                  extract(epoch FROM now() - a.updated_at)::float8 AS "changed_secs_ago!",
                  u.reload_requested_at IS NOT NULL AS "reload_requested!"
           FROM adapters a JOIN base_templates t ON t.base_model_id = a.base_model_id
                LEFT JOIN adapter_use u ON u.adapter_id = a.id
           WHERE a.storage_uri IS NOT NULL"#,
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            (
                r.id,
                SleepFacts {
                    idle: r.idle,
                    used_since_change: r.used_since_change,
                    changed_secs_ago: r.changed_secs_ago,
                    wake_requested: r.reload_requested,
                },
            )
        })
        .collect())
}

/// The counters and the reload request that go with an adapter's step into `to` (in the
/// transaction that moves it): a reload counts as it starts; `ready` answers the reload request;
/// a failed reload (`failed`) counts, and answers it too, so the next request asks again.
pub async fn adapter_stepped(
    conn: &mut sqlx::PgConnection,
    adapter: Uuid,
    to: &str,
    failed: bool,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE adapters SET reloads = reloads + ($2 = 'reloading')::int,
             reload_failures = reload_failures + $3::bool::int
         WHERE id = $1 AND ($2 = 'reloading' OR $3)",
        adapter,
        to,
        failed,
    )
    .execute(&mut *conn)
    .await?;
    if to == "ready" || failed {
        sqlx::query!(
            "UPDATE adapter_use SET reload_requested_at = NULL WHERE adapter_id = $1",
            adapter,
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Sets how long a base's adapters may sit idle before they are unloaded (`None`: they stay
/// loaded while the graph is up); `false` when no templated base has that name. Reached through
/// `operator::set_idle_policy`, audited.
pub async fn set_adapter_idle_after(
    db: impl PgExecutor<'_>,
    base: &str,
    idle_after_secs: Option<i32>,
) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "UPDATE base_templates t SET adapter_idle_after_secs = $2
         FROM base_models b WHERE b.id = t.base_model_id AND b.name = $1",
        base,
        idle_after_secs,
    )
    .execute(db)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Each managed adapter's reloads started and failed (the admin fleet page).
pub async fn reload_counts(
    pool: &PgPool,
) -> sqlx::Result<std::collections::HashMap<Uuid, (i64, i64)>> {
    let rows = sqlx::query!(
        "SELECT id, reloads, reload_failures FROM adapters WHERE storage_uri IS NOT NULL"
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.id, (r.reloads, r.reload_failures)))
        .collect())
}

/// A templated base's floor and ceiling now, its template row locked until the transaction
/// ends (so a floor is checked against the ceiling it is written under); `None`: no templated
/// base has that name.
pub async fn lock_floor(db: impl PgExecutor<'_>, base: &str) -> sqlx::Result<Option<(i32, i32)>> {
    let r = sqlx::query!(
        "SELECT t.replicas_min, t.replicas_max
           FROM base_templates t JOIN base_models b ON b.id = t.base_model_id
          WHERE b.name = $1 FOR UPDATE OF t",
        base,
    )
    .fetch_optional(db)
    .await?;
    Ok(r.map(|r| (r.replicas_min, r.replicas_max)))
}

/// Sets a base's floor (its template's `replicas_min`: the replicas while the graph is awake);
/// the controller rolls it out like any template change. Reached through
/// `operator::set_serving_policy`, audited; the caller checks it against the ceiling.
pub async fn set_floor(db: impl PgExecutor<'_>, base: &str, floor: i32) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "UPDATE base_templates t SET replicas_min = $2, updated_at = now()
         FROM base_models b WHERE b.id = t.base_model_id AND b.name = $1",
        base,
        floor,
    )
    .execute(db)
    .await?;
    Ok(done.rows_affected() > 0)
}
