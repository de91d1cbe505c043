//! One stored usage event for tests that write events straight to the database (billing, roles,
//! invoices): model `m` on a chat endpoint, engine-counted, `ok`, a fresh request id.

use tf_core::usage::{Provenance, UsageEvent, UsageStatus};
use time::OffsetDateTime;
use uuid::Uuid;

/// `tenant`'s event at `at` with `(prompt, cached, completion)` tokens.
pub fn stored(tenant: Uuid, at: OffsetDateTime, tokens: (i64, i64, i64)) -> UsageEvent {
    let (prompt_tokens, cached_tokens, completion_tokens) = tokens;
    UsageEvent {
        request_id: Uuid::now_v7(),
        tenant_id: tenant,
        api_key_id: None,
        served_name: "m".into(),
        base_model: "m".into(),
        adapter: None,
        graph: "m".into(),
        price_key: "m".into(),
        prompt_tokens,
        cached_tokens,
        completion_tokens,
        reasoning_tokens: 0,
        endpoint: tf_core::endpoint::Endpoint::Chat,
        provenance: Provenance::Engine,
        status: UsageStatus::Ok,
        stream: false,
        ttft_ms: None,
        duration_ms: 1,
        started_at: at,
    }
}
