//! Tenants and portal users. Passwords are hashed with argon2id; verification runs on the blocking
//! pool because a good password hash is deliberately slow.

use argon2::password_hash::{
    rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString,
};
use argon2::Argon2;
use sqlx::PgPool;
use uuid::Uuid;

use crate::db;
use crate::db::accounts::NewUser;
pub use crate::tenancy::{Role, Tenant, TenantStatus, User};

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
    pool: impl sqlx::PgExecutor<'_>,
    name: &str,
    display_name: &str,
) -> Result<Tenant, AccountError> {
    db::accounts::insert_tenant(pool, name, display_name)
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
    db::accounts::tenant_by_name(pool, name)
        .await?
        .ok_or_else(|| AccountError::NotFound(format!("tenant {name}")))
}

pub async fn tenant_by_id(pool: &PgPool, id: Uuid) -> Result<Tenant, AccountError> {
    db::accounts::tenant_by_id(pool, id)
        .await?
        .ok_or_else(|| AccountError::NotFound("tenant".into()))
}

pub async fn set_tenant_status(
    pool: &PgPool,
    name: &str,
    status: TenantStatus,
) -> Result<(), AccountError> {
    if !db::accounts::set_tenant_status(pool, name, status).await? {
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
    pool: impl sqlx::PgExecutor<'_>,
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
    let new = NewUser {
        email: &email,
        password_hash: &hash,
        role,
        tenant_id,
    };
    db::accounts::insert_user(pool, &new).await.map_err(|e| {
        if unique_violation(&e) {
            AccountError::Exists(format!("user {email}"))
        } else {
            AccountError::Db(e)
        }
    })
}

/// Sets a user's password; returns the user's id (so the caller can end their sessions).
pub async fn reset_password(
    pool: impl sqlx::PgExecutor<'_>,
    email: &str,
    password: &str,
) -> Result<Uuid, AccountError> {
    check_password(password)?;
    let hash = hash_password(password).await?;
    let email = email.trim().to_lowercase();
    db::accounts::set_password_hash(pool, &email, &hash)
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
    let email = email.trim().to_lowercase();
    let row = db::accounts::login_row(pool, &email).await?;
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
    let Some(user) = db::accounts::user_by_id(pool, id).await? else {
        return Ok(None);
    };
    let tenant = match user.tenant_id {
        Some(t) => Some(tenant_by_id(pool, t).await?),
        None => None,
    };
    Ok(Some((user, tenant)))
}

/// A password made for someone (a new tenant's first user, a reset): 16 random alphanumerics
/// (95 bits), shown once to the operator who asked for it.
pub fn generate_password() -> String {
    use rand::distributions::{Alphanumeric, DistString};
    Alphanumeric.sample_string(&mut rand::rngs::OsRng, 16)
}
