//! Keeps this replica's caches in step with PostgreSQL: LISTENs for `tf_auth_changed` (keys,
//! tenants) and `tf_catalog_changed` (models). On every (re)connection it also drops the key
//! cache and reloads the routes, since notifications sent while disconnected are lost.
//! `tf_limits_changed` (quota limits) and catalog changes (prices) drop the limits cache.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::gateway::auth::KeyCache;
use crate::gateway::resolve::RouteTable;
use crate::quota::limits::LimitCache;

const AUTH_CHANNEL: &str = "tf_auth_changed";
const CATALOG_CHANNEL: &str = "tf_catalog_changed";
const LIMITS_CHANNEL: &str = "tf_limits_changed";

/// Runs until `cancel`; reconnects with a short pause when the connection drops.
pub async fn listen(
    pool: PgPool,
    keys: Arc<KeyCache>,
    routes: Arc<RouteTable>,
    limits: Arc<LimitCache>,
    cancel: CancellationToken,
) {
    while !cancel.is_cancelled() {
        tokio::select! {
            () = cancel.cancelled() => return,
            result = listen_once(&pool, &keys, &routes, &limits) => {
                if let Err(e) = result {
                    tracing::warn!(error = %e, "change listener disconnected; retrying");
                }
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

async fn listen_once(
    pool: &PgPool,
    keys: &KeyCache,
    routes: &RouteTable,
    limits: &LimitCache,
) -> anyhow::Result<()> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener
        .listen_all([AUTH_CHANNEL, CATALOG_CHANNEL, LIMITS_CHANNEL])
        .await?;
    keys.invalidate_all();
    limits.invalidate_all();
    routes.reload().await?;
    loop {
        match listener.try_recv().await? {
            Some(n) if n.channel() == AUTH_CHANNEL => keys.invalidate_all(),
            Some(n) if n.channel() == CATALOG_CHANNEL => {
                limits.invalidate_all();
                routes.reload().await?;
            }
            Some(n) if n.channel() == LIMITS_CHANNEL => limits.invalidate_all(),
            Some(_) => {}
            // The listener reconnected by itself: anything could have changed meanwhile.
            None => {
                keys.invalidate_all();
                limits.invalidate_all();
                routes.reload().await?;
            }
        }
    }
}
