//! The usage event (the metered fact) and the sink trait every store of it implements. Every
//! request that reached an upstream produces exactly one event, keyed by its request id; storage
//! enforces uniqueness, so a retried emission can never count twice. Stores: `usage_store`
//! (PostgreSQL) and `journal` (the local journal, shipped to PostgreSQL).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::Deserialize;

/// Token counts as an engine reports them (`usage` of the OpenAI API). Missing details are 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    pub completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct CompletionDetails {
    #[serde(default)]
    pub reasoning_tokens: Option<u64>,
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

    /// Reasoning tokens, part of the completion (never counted above it).
    pub fn reasoning_tokens(&self) -> u64 {
        self.completion_tokens_details
            .and_then(|d| d.reasoning_tokens)
            .unwrap_or(0)
            .min(self.completion_tokens)
    }
}

pub use tf_core::usage::{Provenance, UsageEvent, UsageStatus};

pub type SinkFuture<'a> = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + 'a>>;

/// Where finished events go. `record` resolves once the event is as durable as the sink
/// promises; the request path awaits it before the response's final bytes leave.
pub trait UsageSink: Send + Sync + 'static {
    fn record<'a>(&'a self, event: &'a UsageEvent) -> SinkFuture<'a>;
}

/// Resolves once every spend settled so far has reached the shared counters (Redis). Every writer
/// of usage to PostgreSQL waits on it first, so Redis never counts less than PostgreSQL has
/// billed and the spend reconciler only ever raises counters. A value built where the server is
/// assembled (from the quota), so the stores that wait on it need not know the quota.
#[derive(Clone)]
pub struct SpendBarrier(Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>);

impl SpendBarrier {
    pub fn new<F, Fut>(wait: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Self(Arc::new(move || Box::pin(wait())))
    }

    /// Waits for the spend settled before this call.
    pub async fn wait(&self) {
        (self.0)().await;
    }
}
