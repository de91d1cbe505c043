//! `/admin/ops`: every replica's journal backlog and shipping, from what each replica reports to
//! PostgreSQL (`replica_reports`), with the time it was last seen; a replica silent for longer
//! than [`STALE_AFTER_SECS`] is marked stale.

pub mod page;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;

/// A replica that has not reported for this long is shown as stale (it reports every 2 s).
pub const STALE_AFTER_SECS: i64 = 10;
/// Replicas silent for longer than this are not listed.
pub const WINDOW_SECS: i64 = 86_400;

/// One replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaItem {
    pub id: String,
    pub hostname: String,
    pub started: String,
    pub seen_secs_ago: i64,
    pub stale: bool,
    pub backlog_bytes: i64,
    pub ship_lag_ms: i64,
    /// `never` when nothing was shipped since the replica started.
    pub last_shipped: String,
    pub journaled: i64,
    pub shipped: i64,
    pub ship_failures: i64,
    pub open_connections: i64,
}

/// Every replica seen in the last day, most recently seen first.
#[server(prefix = "/api", endpoint = "admin_ops", input = leptos::server_fn::codec::GetUrl)]
pub async fn admin_ops() -> Result<Vec<ReplicaItem>, PortalError> {
    use crate::admin::server as admin;
    use crate::ssr::{internal, Portal};

    let portal = Portal::current()?;
    admin::required(&portal).await?;
    let rows = tf_core::db::replicas::recent(&portal.deps.pool, WINDOW_SECS)
        .await
        .map_err(|e| internal("reading replica reports", e))?;
    let stamp = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    let fmt = |t: time::OffsetDateTime| {
        t.to_offset(time::UtcOffset::UTC)
            .format(stamp)
            .unwrap_or_default()
    };
    Ok(rows
        .into_iter()
        .map(|r| ReplicaItem {
            id: r.replica_id.to_string(),
            hostname: r.hostname,
            started: fmt(r.started_at),
            seen_secs_ago: r.seen_secs_ago,
            stale: r.seen_secs_ago > STALE_AFTER_SECS,
            backlog_bytes: r.backlog_bytes,
            ship_lag_ms: r.ship_lag_ms,
            last_shipped: r.last_shipped_at.map_or_else(|| "never".to_owned(), fmt),
            journaled: r.journaled,
            shipped: r.shipped,
            ship_failures: r.ship_failures,
            open_connections: r.open_connections,
        })
        .collect())
}
