//! Tenants and portal users. Errors are returned as sqlx gives them; `accounts` maps unique and
//! check violations to what the person typed wrong.

use sqlx::PgPool;
use uuid::Uuid;

use crate::tenancy::{Role, Tenant, TenantStatus, User};

pub async fn insert_tenant(
    pool: impl sqlx::PgExecutor<'_>,
    name: &str,
    display_name: &str,
) -> sqlx::Result<Tenant> {
    sqlx::query_as!(
        Tenant,
        r#"INSERT INTO tenants (id, name, display_name) VALUES ($1, $2, $3)
           RETURNING id, name, display_name, status AS "status: TenantStatus""#,
        Uuid::now_v7(),
        name,
        display_name,
    )
    .fetch_one(pool)
    .await
}

pub async fn tenant_by_name(pool: &PgPool, name: &str) -> sqlx::Result<Option<Tenant>> {
    sqlx::query_as!(
        Tenant,
        r#"SELECT id, name, display_name, status AS "status: TenantStatus"
           FROM tenants WHERE name = $1"#,
        name,
    )
    .fetch_optional(pool)
    .await
}

pub async fn tenant_by_id(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<Tenant>> {
    sqlx::query_as!(
        Tenant,
        r#"SELECT id, name, display_name, status AS "status: TenantStatus"
           FROM tenants WHERE id = $1"#,
        id,
    )
    .fetch_optional(pool)
    .await
}

/// Returns whether a tenant of that name exists (and now has `status`).
pub async fn set_tenant_status(
    pool: &PgPool,
    name: &str,
    status: TenantStatus,
) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "UPDATE tenants SET status = $2 WHERE name = $1",
        name,
        status as TenantStatus,
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// A user to insert; `email` is already normalised and `password_hash` a PHC string.
pub struct NewUser<'a> {
    pub email: &'a str,
    pub password_hash: &'a str,
    pub role: Role,
    pub tenant_id: Option<Uuid>,
}

pub async fn insert_user(
    pool: impl sqlx::PgExecutor<'_>,
    user: &NewUser<'_>,
) -> sqlx::Result<User> {
    sqlx::query_as!(
        User,
        r#"INSERT INTO users (id, email, password_hash, role, tenant_id) VALUES ($1, $2, $3, $4, $5)
           RETURNING id, email, role AS "role: Role", tenant_id"#,
        Uuid::now_v7(),
        user.email,
        user.password_hash,
        user.role as Role,
        user.tenant_id,
    )
    .fetch_one(pool)
    .await
}

/// Sets the password hash of the user with this (normalised) email; returns the user's id.
pub async fn set_password_hash(
    pool: impl sqlx::PgExecutor<'_>,
    email: &str,
    password_hash: &str,
) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar!(
        "UPDATE users SET password_hash = $2 WHERE email = $1 RETURNING id",
        email,
        password_hash,
    )
    .fetch_optional(pool)
    .await
}

/// What a login checks: the user, the hash to verify and the tenant's status (admins have none).
pub struct LoginRow {
    pub id: Uuid,
    pub email: String,
    pub role: Role,
    pub tenant_id: Option<Uuid>,
    pub password_hash: String,
    pub tenant_status: Option<TenantStatus>,
}

pub async fn login_row(pool: &PgPool, email: &str) -> sqlx::Result<Option<LoginRow>> {
    sqlx::query_as!(
        LoginRow,
        r#"SELECT u.id, u.email, u.role AS "role: Role", u.tenant_id, u.password_hash,
                  t.status AS "tenant_status?: TenantStatus"
           FROM users u LEFT JOIN tenants t ON t.id = u.tenant_id WHERE u.email = $1"#,
        email,
    )
    .fetch_optional(pool)
    .await
}

pub async fn user_by_id(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<User>> {
    sqlx::query_as!(
        User,
        r#"SELECT id, email, role AS "role: Role", tenant_id FROM users WHERE id = $1"#,
        id,
    )
    .fetch_optional(pool)
    .await
}
