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

/// A recorded action with its tenant's handle, as `/admin/audit` lists it.
#[derive(Debug, Clone)]
pub struct Found {
    pub id: i64,
    pub at: OffsetDateTime,
    pub actor: String,
    /// The tenant's handle (`None`: platform-wide, or the tenant is gone).
    pub tenant_name: Option<String>,
    pub action: String,
    pub target: String,
    pub detail: Value,
    pub source_ip: Option<String>,
}

/// Newest first, keyset-paginated by id (`before`: the last id of the previous page), filtered by
/// tenant and by action: `action` is a whole action (`tenant.suspend`) or a family (`tenant`,
/// every `tenant.*`). For `/admin/audit`.
pub async fn search(
    db: impl PgExecutor<'_>,
    tenant: Option<Uuid>,
    action: Option<&str>,
    before: Option<i64>,
    limit: i64,
) -> sqlx::Result<Vec<Found>> {
    sqlx::query_as!(
        Found,
        r#"SELECT a.id, a.at, a.actor, t.name AS "tenant_name?", a.action, a.target, a.detail,
                  a.source_ip
           FROM audit_log a LEFT JOIN tenants t ON t.id = a.tenant_id
          WHERE ($1::uuid IS NULL OR a.tenant_id = $1)
            AND ($2::text IS NULL OR a.action = $2
                 OR (a.action >= $2 || '.' AND a.action < $2 || '/'))
            AND ($3::bigint IS NULL OR a.id < $3)
          ORDER BY a.id DESC LIMIT $4"#,
        tenant,
        action,
        before,
        limit,
    )
    .fetch_all(db)
    .await
}
