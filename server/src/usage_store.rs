//! Usage events in PostgreSQL: the direct sink ([`PgSink`]), the one insert every writer goes
//! through ([`store`]) and the read for `admin usage` (the SQL itself is `tf_core::db::usage`).

use sqlx::PgPool;

use crate::usage::{SinkFuture, SpendBarrier, UsageEvent, UsageSink};

/// Inserts each event into PostgreSQL directly (idempotent on request id).
pub struct PgSink {
    pool: PgPool,
    spend: Option<SpendBarrier>,
}

impl PgSink {
    pub fn new(pool: PgPool) -> Self {
        Self { pool, spend: None }
    }

    /// Waits on `spend` before each insert (see [`SpendBarrier`]).
    pub fn with_spend_barrier(mut self, spend: SpendBarrier) -> Self {
        self.spend = Some(spend);
        self
    }
}

impl UsageSink for PgSink {
    fn record<'a>(&'a self, event: &'a UsageEvent) -> SinkFuture<'a> {
        Box::pin(async move {
            store(&self.pool, self.spend.as_ref(), std::slice::from_ref(event)).await?;
            Ok(())
        })
    }
}

/// Writes events to PostgreSQL once the settled spend has reached Redis. INVARIANT: every
/// usage write goes through here, so Redis never counts less than PostgreSQL has billed and the
/// spend reconciler only ever raises counters (test: spend_order).
pub async fn store(
    pool: &PgPool,
    spend: Option<&SpendBarrier>,
    events: &[UsageEvent],
) -> sqlx::Result<u64> {
    if let Some(spend) = spend {
        spend.wait().await;
    }
    tf_core::db::usage::insert_batch(pool, events).await
}

/// Stored events, oldest first, filtered by tenant and time (for `admin usage`).
pub use tf_core::db::usage::list as query;
