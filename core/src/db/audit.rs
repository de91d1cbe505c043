//! The audit log (`audit_log`): appended inside the transaction of the action it records, so an
//! action and its record commit or roll back together. The table refuses UPDATE and DELETE.

use serde_json::Value;
use sqlx::PgExecutor;
use time::OffsetDateTime;
use uuid::Uuid;

/// One action to record.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    pub actor_user_id: Option<Uuid>,
    /// An email, `cli` or `system`.
    pub actor: &'a str,
    pub tenant_id: Option<Uuid>,
    /// Dotted verb: `key.create`, `tenant.suspend`, `bodies.opt_in`.
    pub action: &'a str,
    pub target: &'a str,
    pub detail: Value,
    pub source_ip: Option<&'a str>,
}

/// A recorded action.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: i64,
    pub at: OffsetDateTime,
    pub actor: String,
    pub tenant_id: Option<Uuid>,
    pub action: String,
    pub target: String,
    pub detail: Value,
    pub source_ip: Option<String>,
}

pub async fn record(db: impl PgExecutor<'_>, e: &Entry<'_>) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO audit_log (actor_user_id, actor, tenant_id, action, target, detail, source_ip)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        e.actor_user_id,
        e.actor,
        e.tenant_id,
        e.action,
        e.target,
        e.detail,
        e.source_ip,
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Newest first, keyset-paginated by id: `before` is the last id of the previous page. `tenant`
/// `Some` is one tenant's rows only (a tenant owner's view); `None` is every row (admins).
pub async fn page(
    db: impl PgExecutor<'_>,
    tenant: Option<Uuid>,
    before: Option<i64>,
    limit: i64,
) -> sqlx::Result<Vec<Row>> {
    sqlx::query_as!(
        Row,
        "SELECT id, at, actor, tenant_id, action, target, detail, source_ip FROM audit_log
          WHERE ($1::uuid IS NULL OR tenant_id = $1) AND ($2::bigint IS NULL OR id < $2)
          ORDER BY id DESC LIMIT $3",
        tenant,
        before,
        limit,
    )
    .fetch_all(db)
    .await
}
