//! The sinks that store usage events (the event itself is `tf_core::usage`, its SQL in
//! `tf_core::db::usage`). Every request that reached an upstream produces exactly one event, keyed
//! by its request id; storage enforces uniqueness, so a retried emission can never count twice.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use serde::Deserialize;
use sqlx::PgPool;

/// Token counts as an engine reports them (`usage` of the OpenAI API). Missing details are 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct PromptDetails {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

impl Usage {
    pub fn cached_tokens(&self) -> u64 {
        self.prompt_tokens_details
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0)
            .min(self.prompt_tokens)
    }
}

pub use tf_core::usage::{Provenance, UsageEvent, UsageStatus};

pub type SinkFuture<'a> = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + 'a>>;

/// Where finished events go. `record` resolves once the event is as durable as the sink
/// promises; the request path awaits it before the response's final bytes leave.
pub trait UsageSink: Send + Sync + 'static {
    fn record<'a>(&'a self, event: &'a UsageEvent) -> SinkFuture<'a>;
}

/// Keeps events in memory (tests, and a gateway run without a database).
#[derive(Default)]
pub struct MemorySink {
    events: Mutex<Vec<UsageEvent>>,
}

impl MemorySink {
    pub fn events(&self) -> Vec<UsageEvent> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

impl UsageSink for MemorySink {
    fn record<'a>(&'a self, event: &'a UsageEvent) -> SinkFuture<'a> {
        Box::pin(async move {
            self.events
                .lock()
                .map_err(|_| anyhow::anyhow!("memory sink poisoned"))?
                .push(event.clone());
            Ok(())
        })
    }
}

/// Inserts each event into PostgreSQL directly (idempotent on request id).
pub struct PgSink {
    pool: PgPool,
    quota: Option<crate::quota::Quota>,
}

impl PgSink {
    pub fn new(pool: PgPool) -> Self {
        Self { pool, quota: None }
    }

    /// Waits for `quota`'s spend to reach Redis before each insert (see quota/reconciler.rs).
    pub fn with_quota(mut self, quota: crate::quota::Quota) -> Self {
        self.quota = Some(quota);
        self
    }
}

impl UsageSink for PgSink {
    fn record<'a>(&'a self, event: &'a UsageEvent) -> SinkFuture<'a> {
        Box::pin(async move {
            store(&self.pool, self.quota.as_ref(), std::slice::from_ref(event)).await?;
            Ok(())
        })
    }
}

/// Writes events to PostgreSQL once `quota`'s settled spend has reached Redis. INVARIANT: every
/// usage write goes through here, so Redis never counts less than PostgreSQL has billed and the
/// spend reconciler only ever raises counters (test: spend_order).
pub async fn store(
    pool: &PgPool,
    quota: Option<&crate::quota::Quota>,
    events: &[UsageEvent],
) -> sqlx::Result<u64> {
    if let Some(q) = quota {
        q.spend_flushed().await;
    }
    tf_core::db::usage::insert_batch(pool, events).await
}

/// Stored events, oldest first, filtered by tenant and time (for `admin usage`).
pub use tf_core::db::usage::list as query;
