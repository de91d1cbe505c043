//! The replica's Redis connection, as a slot that may be filled after start-up. Redis being down
//! when a replica starts must not pin it to per-replica limits forever: a background connector
//! (`tokenfactory::redis_conn`) keeps trying and fills the slot once; everything that uses Redis
//! (quota, login throttle) reads the slot on each use and falls back to its local rules while it
//! is empty. Once filled it stays filled: the `ConnectionManager` reconnects by itself after a
//! connection was established once.

use std::sync::{Arc, OnceLock};

use redis::aio::ConnectionManager;
use tokio::sync::Notify;

/// A shared, fill-once Redis connection. Cheap to clone (one `Arc`).
#[derive(Clone, Default)]
pub struct RedisSlot(Arc<Shared>);

#[derive(Default)]
struct Shared {
    conn: OnceLock<ConnectionManager>,
    filled: Notify,
}

impl RedisSlot {
    /// A slot with no connection yet (Redis not configured, or not reachable so far).
    pub fn empty() -> Self {
        Self::default()
    }

    /// A slot that already holds `conn`.
    pub fn filled(conn: ConnectionManager) -> Self {
        let slot = Self::default();
        slot.fill(conn);
        slot
    }

    /// The connection, if there is one (a cheap clone of the manager's handle).
    pub fn get(&self) -> Option<ConnectionManager> {
        self.0.conn.get().cloned()
    }

    /// Whether the slot holds a connection (no clone; for hot paths).
    pub fn is_filled(&self) -> bool {
        self.0.conn.get().is_some()
    }

    /// Puts the connection in; returns false (and keeps the first) when it was already filled.
    pub fn fill(&self, conn: ConnectionManager) -> bool {
        let first = self.0.conn.set(conn).is_ok();
        if first {
            self.0.filled.notify_waiters();
        }
        first
    }

    /// Waits until the slot is filled and returns the connection.
    pub async fn wait(&self) -> ConnectionManager {
        loop {
            let notified = self.0.filled.notified();
            tokio::pin!(notified);
            // Registered before the check, so a fill between the check and the wait is seen.
            notified.as_mut().enable();
            if let Some(conn) = self.get() {
                return conn;
            }
            notified.await;
        }
    }
}

impl From<Option<ConnectionManager>> for RedisSlot {
    fn from(conn: Option<ConnectionManager>) -> Self {
        conn.map_or_else(Self::empty, Self::filled)
    }
}

impl std::fmt::Debug for RedisSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSlot")
            .field("filled", &self.is_filled())
            .finish()
    }
}
