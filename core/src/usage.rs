//! The usage event: the metered fact billing is derived from. One per request that reached an
//! upstream (or was refused at admission), keyed by its request id; storage enforces uniqueness,
//! so a retried emission can never count twice.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::endpoint::Endpoint;

/// How an event's counts were obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum Provenance {
    /// The engine's final usage.
    Engine,
    /// The engine's last running usage before the stream was cut.
    Partial,
    /// Counted by the gateway from the chunks it received; prompt from the base's tokenizer.
    Estimated,
}

impl Provenance {
    /// The stored name (as sqlx and serde write it).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Engine => "engine",
            Self::Partial => "partial",
            Self::Estimated => "estimated",
        }
    }
}

/// How the request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum UsageStatus {
    Ok,
    ClientAbort,
    UpstreamError,
    /// Cut by the gateway at its shutdown deadline; billed like an abort.
    Interrupted,
    /// Refused at admission (the quotas issue); carries no tokens.
    Rejected,
}

impl UsageStatus {
    /// The stored name (as sqlx and serde write it).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ClientAbort => "client_abort",
            Self::UpstreamError => "upstream_error",
            Self::Interrupted => "interrupted",
            Self::Rejected => "rejected",
        }
    }
}

/// One metered request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct UsageEvent {
    pub request_id: Uuid,
    pub tenant_id: Uuid,
    pub api_key_id: Option<Uuid>,
    pub served_name: String,
    pub base_model: String,
    pub adapter: Option<String>,
    pub graph: String,
    pub price_key: String,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub completion_tokens: i64,
    /// Of `completion_tokens`, the reasoning (thinking) tokens the engine reported: billed as
    /// output, shown as their own figure. 0 when the engine did not say (older journal records).
    #[serde(default)]
    pub reasoning_tokens: i64,
    /// Which endpoint served it (older journal records lack it: chat, see [`Endpoint`]).
    #[serde(default)]
    pub endpoint: Endpoint,
    pub provenance: Provenance,
    pub status: UsageStatus,
    pub stream: bool,
    pub ttft_ms: Option<i32>,
    pub duration_ms: i32,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_match_the_serde_and_sqlx_names() {
        let serde_name = |v: serde_json::Value| v.as_str().map(str::to_owned);
        for p in [
            Provenance::Engine,
            Provenance::Partial,
            Provenance::Estimated,
        ] {
            assert_eq!(
                serde_name(serde_json::json!(p)).as_deref(),
                Some(p.as_str())
            );
        }
        for s in [
            UsageStatus::Ok,
            UsageStatus::ClientAbort,
            UsageStatus::UpstreamError,
            UsageStatus::Interrupted,
            UsageStatus::Rejected,
        ] {
            assert_eq!(
                serde_name(serde_json::json!(s)).as_deref(),
                Some(s.as_str())
            );
        }
    }
}
