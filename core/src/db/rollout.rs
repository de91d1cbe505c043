//! `graphs` rollouts (issue 30): the fingerprint of the spec last applied to each graph and how
//! far the backend is on it, and a starting adapter's latest word from the backend.

use std::collections::HashMap;

use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

/// A graph's last applied spec and its rollout state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    pub spec_hash: Option<String>,
    pub state: Option<String>,
    pub reason: Option<String>,
}

/// Every graph's rollout, by base id (one query per controller pass).
pub async fn rollouts(db: impl PgExecutor<'_>) -> sqlx::Result<HashMap<Uuid, Rollout>> {
    let rows = sqlx::query!("SELECT base_model_id, spec_hash, rollout, rollout_reason FROM graphs")
        .fetch_all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            (
                r.base_model_id,
                Rollout {
                    spec_hash: r.spec_hash,
                    state: r.rollout,
                    reason: r.rollout_reason,
                },
            )
        })
        .collect())
}

/// Records the spec applied to a base's graph and its state; a graph without a row yet is
/// recorded on a later pass (the row comes with the graph's first observation).
pub async fn set_rollout(
    pool: &PgPool,
    base_model_id: Uuid,
    spec_hash: &str,
    state: &str,
    reason: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE graphs SET spec_hash = $2, rollout = $3, rollout_reason = $4, rollout_at = now()
         WHERE base_model_id = $1",
        base_model_id,
        spec_hash,
        state,
        reason,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Keeps a starting adapter's latest message from the backend as its reason, without touching
/// `updated_at` (when it started: its start timeout counts from there).
pub async fn set_starting_reason(pool: &PgPool, id: Uuid, reason: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE adapters SET reason = $2 WHERE id = $1 AND state = 'starting'",
        id,
        reason,
    )
    .execute(pool)
    .await?;
    Ok(())
}
