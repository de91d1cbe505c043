//! Tenants and portal users. Passwords are hashed with argon2id; verification runs on the blocking
//! pool because a good password hash is deliberately slow.

use argon2::password_hash::{
    rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString,
};
use argon2::Argon2;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

/// Whether a tenant may use the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum TenantStatus {
    Active,
    Suspended,
}

/// What a portal user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Sees and manages only their own tenant.
    TenantMember,
    /// Operates the platform.
    Admin,
}

#[derive(Debug, Clone, sqlx::FromRow, Serialize)]
pub struct Tenant {
    pub id: Uuid,
    pub name: String,
    pub display_name: String,
    pub status: TenantStatus,
}

#[derive(Debug, Clone, sqlx::FromRow, Serialize)]
pub struct User {
    pub id: Uuid,
    pub email: String,
    pub role: Role,
    pub tenant_id: Option<Uuid>,
}

/// Errors of account operations, worded for the CLI and the portal.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error("{0} already exists")]
    Exists(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("invalid input: {0}")]
    Invalid(String),
    #[error("password hashing failed")]
    Hash,
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

fn unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == "23505")
}

/// Minimum password length accepted anywhere (CLI, portal).
pub const MIN_PASSWORD_LEN: usize = 10;

/// Hashes a password with argon2id and a random salt.
pub async fn hash_password(password: &str) -> Result<String, AccountError> {
    let password = password.to_owned();
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::generate(&mut OsRng);
        Argon2::default()
            .hash_password(password.as_bytes(), &salt)
            .map(|h| h.to_string())
            .map_err(|_| AccountError::Hash)
    })
    .await
    .map_err(|_| AccountError::Hash)?
}

/// Checks a password against a PHC hash string.
pub async fn verify_password(password: &str, phc: &str) -> bool {
    let password = password.to_owned();
    let phc = phc.to_owned();
    tokio::task::spawn_blocking(move || {
        PasswordHash::new(&phc)
            .map(|h| {
                Argon2::default()
                    .verify_password(password.as_bytes(), &h)
                    .is_ok()
            })
            .unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}

/// A real hash, made once, to verify against when the email is unknown, so a login for a missing
/// user costs the same time as one with a wrong password (no user enumeration by timing).
static DUMMY_HASH: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();

async fn dummy_hash() -> &'static str {
    DUMMY_HASH
        .get_or_init(|| async {
            hash_password("not-a-real-password")
                .await
                .unwrap_or_default()
        })
        .await
}

pub async fn create_tenant(
    pool: &PgPool,
    name: &str,
    display_name: &str,
) -> Result<Tenant, AccountError> {
    sqlx::query_as::<_, Tenant>(
        "INSERT INTO tenants (id, name, display_name) VALUES ($1, $2, $3)
         RETURNING id, name, display_name, status",
    )
    .bind(Uuid::now_v7())
    .bind(name)
    .bind(display_name)
    .fetch_one(pool)
    .await
    .map_err(|e| {
        if unique_violation(&e) {
            AccountError::Exists(format!("tenant {name}"))
        } else if e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == "23514") {
            AccountError::Invalid(format!(
                "tenant name {name:?} must be 1-63 of a-z, 0-9, '_' or '-', starting with a letter or digit"
            ))
        } else {
            AccountError::Db(e)
        }
    })
}

pub async fn find_tenant(pool: &PgPool, name: &str) -> Result<Tenant, AccountError> {
    sqlx::query_as::<_, Tenant>(
        "SELECT id, name, display_name, status FROM tenants WHERE name = $1",
    )
    .bind(name)
    .fetch_optional(pool)
    .await?
    .ok_or_else(|| AccountError::NotFound(format!("tenant {name}")))
}

pub async fn tenant_by_id(pool: &PgPool, id: Uuid) -> Result<Tenant, AccountError> {
    sqlx::query_as::<_, Tenant>("SELECT id, name, display_name, status FROM tenants WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await?
        .ok_or_else(|| AccountError::NotFound("tenant".into()))
}

pub async fn set_tenant_status(
    pool: &PgPool,
    name: &str,
    status: TenantStatus,
) -> Result<(), AccountError> {
    let done = sqlx::query("UPDATE tenants SET status = $2 WHERE name = $1")
        .bind(name)
        .bind(status)
        .execute(pool)
        .await?;
    if done.rows_affected() == 0 {
        return Err(AccountError::NotFound(format!("tenant {name}")));
    }
    Ok(())
}

fn check_password(password: &str) -> Result<(), AccountError> {
    if password.chars().count() < MIN_PASSWORD_LEN {
        return Err(AccountError::Invalid(format!(
            "password must be at least {MIN_PASSWORD_LEN} characters"
        )));
    }
    Ok(())
}

/// Creates a portal user. `tenant_id` must be set for members and absent for admins.
pub async fn create_user(
    pool: &PgPool,
    email: &str,
    password: &str,
    role: Role,
    tenant_id: Option<Uuid>,
) -> Result<User, AccountError> {
    let email = email.trim().to_lowercase();
    if !email.contains('@') {
        return Err(AccountError::Invalid(format!(
            "{email:?} is not an email address"
        )));
    }
    if (role == Role::Admin) != tenant_id.is_none() {
        return Err(AccountError::Invalid(
            "admins belong to no tenant; tenant members belong to exactly one".into(),
        ));
    }
    check_password(password)?;
    let hash = hash_password(password).await?;
    sqlx::query_as::<_, User>(
        "INSERT INTO users (id, email, password_hash, role, tenant_id) VALUES ($1, $2, $3, $4, $5)
         RETURNING id, email, role, tenant_id",
    )
    .bind(Uuid::now_v7())
    .bind(&email)
    .bind(hash)
    .bind(role)
    .bind(tenant_id)
    .fetch_one(pool)
    .await
    .map_err(|e| {
        if unique_violation(&e) {
            AccountError::Exists(format!("user {email}"))
        } else {
            AccountError::Db(e)
        }
    })
}

/// Sets a user's password; returns the user's id (so the caller can end their sessions).
pub async fn reset_password(
    pool: &PgPool,
    email: &str,
    password: &str,
) -> Result<Uuid, AccountError> {
    check_password(password)?;
    let hash = hash_password(password).await?;
    let email = email.trim().to_lowercase();
    sqlx::query_scalar("UPDATE users SET password_hash = $2 WHERE email = $1 RETURNING id")
        .bind(&email)
        .bind(hash)
        .fetch_optional(pool)
        .await?
        .ok_or_else(|| AccountError::NotFound(format!("user {email}")))
}

/// Why a login was refused. The portal shows one message for both, so emails do not leak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginRefusal {
    BadCredentials,
    TenantSuspended,
}

/// Checks an email and password. Unknown emails cost the same as wrong passwords.
pub async fn authenticate(
    pool: &PgPool,
    email: &str,
    password: &str,
) -> Result<Result<User, LoginRefusal>, AccountError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: Uuid,
        email: String,
        role: Role,
        tenant_id: Option<Uuid>,
        password_hash: String,
        tenant_status: Option<TenantStatus>,
    }
    let email = email.trim().to_lowercase();
    let row = sqlx::query_as::<_, Row>(
        "SELECT u.id, u.email, u.role, u.tenant_id, u.password_hash, t.status AS tenant_status
         FROM users u LEFT JOIN tenants t ON t.id = u.tenant_id WHERE u.email = $1",
    )
    .bind(&email)
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else {
        verify_password(password, dummy_hash().await).await;
        return Ok(Err(LoginRefusal::BadCredentials));
    };
    if !verify_password(password, &row.password_hash).await {
        return Ok(Err(LoginRefusal::BadCredentials));
    }
    if row.tenant_status == Some(TenantStatus::Suspended) {
        return Ok(Err(LoginRefusal::TenantSuspended));
    }
    Ok(Ok(User {
        id: row.id,
        email: row.email,
        role: row.role,
        tenant_id: row.tenant_id,
    }))
}

/// Loads a user by id (sessions store only the id, so a deleted user or a suspended tenant
/// takes effect on the next page load).
pub async fn user_by_id(
    pool: &PgPool,
    id: Uuid,
) -> Result<Option<(User, Option<Tenant>)>, AccountError> {
    let Some(user) =
        sqlx::query_as::<_, User>("SELECT id, email, role, tenant_id FROM users WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await?
    else {
        return Ok(None);
    };
    let tenant = match user.tenant_id {
        Some(t) => Some(tenant_by_id(pool, t).await?),
        None => None,
    };
    Ok(Some((user, tenant)))
}
