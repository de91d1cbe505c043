//! Where portal sessions are kept: the `portal_sessions` table, through tower-sessions'
//! [`SessionStore`] trait. Two differences from the stock PostgreSQL store:
//!
//! - the session id is stored only as its SHA-256, so a copy of the table (a backup, a read
//!   replica, a leaked dump) holds no cookie that signs anybody in;
//! - every row names its user (`user_id`), so an operator can end all of a user's sessions (after
//!   a password reset) or of a tenant's users (on suspension) with one statement.
//!
//! A session is stored only while it has a signed-in user: anonymous visitors keep their CSRF
//! token and flash message in cookies (see [`super::cookies`]), so a page load creates no row.
//! `save` only updates: a session deleted elsewhere (logout on another tab, an operator ending
//! it) is never written back by a request that was in flight meanwhile.

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tf_core::db::sessions::{self, SessionWrite};
use tower_sessions::session::{Id, Record};
use tower_sessions::session_store::{self, ExpiredDeletion, SessionStore};
use uuid::Uuid;

use super::session::USER_KEY;

/// How many fresh ids `create` tries when one collides (each is 128 random bits: never, really).
const CREATE_ATTEMPTS: usize = 3;

/// The portal's session store (cheap to clone: a pool handle).
#[derive(Debug, Clone)]
pub struct PortalStore {
    pool: PgPool,
}

impl PortalStore {
    /// A store on the database's `portal_sessions` table (created by migration).
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

/// The stored form of a session id.
fn digest(id: &Id) -> Vec<u8> {
    Sha256::digest(id.0.to_le_bytes()).to_vec()
}

fn backend(e: impl std::fmt::Display) -> session_store::Error {
    session_store::Error::Backend(e.to_string())
}

/// The signed-in user a record belongs to, if any.
fn user_of(record: &Record) -> Option<Uuid> {
    record
        .data
        .get(USER_KEY)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
}

fn data_of(record: &Record) -> session_store::Result<serde_json::Value> {
    serde_json::to_value(&record.data).map_err(|e| session_store::Error::Encode(e.to_string()))
}

#[async_trait]
impl SessionStore for PortalStore {
    async fn create(&self, record: &mut Record) -> session_store::Result<()> {
        // INVARIANT: no row without a user (test: portal::anonymous_visits_store_no_session).
        let Some(user) = user_of(record) else {
            return Err(backend(
                "a portal session is stored only once a user is signed in; \
                 keep anonymous state in a cookie",
            ));
        };
        let data = data_of(record)?;
        for _ in 0..CREATE_ATTEMPTS {
            let row = SessionWrite {
                id_sha256: &digest(&record.id),
                user_id: user,
                data: &data,
                expiry_date: record.expiry_date,
            };
            if sessions::insert(&self.pool, &row).await.map_err(backend)? {
                return Ok(());
            }
            record.id = Id::default();
        }
        Err(backend("could not find a free session id"))
    }

    // INVARIANT: an UPDATE, never an upsert, so an ended session stays ended (test:
    // portal::a_session_ended_elsewhere_is_not_written_back).
    async fn save(&self, record: &Record) -> session_store::Result<()> {
        let Some(user) = user_of(record) else {
            // The user was taken out of the session: nothing is left to keep.
            return self.delete(&record.id).await;
        };
        let row = SessionWrite {
            id_sha256: &digest(&record.id),
            user_id: user,
            data: &data_of(record)?,
            expiry_date: record.expiry_date,
        };
        sessions::update(&self.pool, &row).await.map_err(backend)
    }

    async fn load(&self, id: &Id) -> session_store::Result<Option<Record>> {
        let row = sessions::load(&self.pool, &digest(id))
            .await
            .map_err(backend)?;
        row.map(|row| {
            Ok(Record {
                id: *id,
                data: serde_json::from_value(row.data)
                    .map_err(|e| session_store::Error::Decode(e.to_string()))?,
                expiry_date: row.expiry_date,
            })
        })
        .transpose()
    }

    async fn delete(&self, id: &Id) -> session_store::Result<()> {
        sessions::delete(&self.pool, &digest(id))
            .await
            .map_err(backend)
    }
}

#[async_trait]
impl ExpiredDeletion for PortalStore {
    async fn delete_expired(&self) -> session_store::Result<()> {
        sessions::delete_expired(&self.pool)
            .await
            .map_err(backend)?;
        Ok(())
    }
}

/// Ends every portal session of one user (after a password reset). Returns how many ended.
pub async fn end_sessions_of_user(pool: &PgPool, user_id: Uuid) -> sqlx::Result<u64> {
    sessions::delete_of_user(pool, user_id).await
}

/// Ends every portal session of a tenant's users (on suspension). Returns how many ended.
pub async fn end_sessions_of_tenant(pool: &PgPool, tenant_id: Uuid) -> sqlx::Result<u64> {
    sessions::delete_of_tenant(pool, tenant_id).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stored_hashed() {
        let id = Id::default();
        let d = digest(&id);
        assert_eq!(d.len(), 32);
        assert_ne!(d, id.0.to_le_bytes().to_vec());
        assert_eq!(d, digest(&Id(id.0)));
    }
}
