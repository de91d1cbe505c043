//! Server function of `/limits`: the tenant's limits and caps and each working key's limits, with
//! this month's billed consumption, read from the same store and query as `tokenfactory admin
//! limits` (`tf_core::db::limits`, `tf_core::db::spend::consumption`). Read-only for every role:
//! admins set limits (on `/admin/tenants` or with the CLI).

pub mod page;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;

/// Rate and spend limits of a subject (`None`: unlimited) and its consumption.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubjectLimits {
    /// "Tenant" or the key's name and prefix.
    pub label: String,
    pub requests_per_minute: Option<i64>,
    pub tokens_per_minute: Option<i64>,
    pub spend_limit_micros: Option<i64>,
    pub requests_last_minute: i64,
    pub tokens_last_minute: i64,
    pub spend_micros: i64,
}

/// Everything `/limits` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsView {
    pub tenant: SubjectLimits,
    pub max_in_flight: Option<i64>,
    pub max_long_prompts: Option<i64>,
    pub long_prompt_tokens: Option<i64>,
    /// The tenant's working keys.
    pub keys: Vec<SubjectLimits>,
    /// First day of the month the spend counts from, `YYYY-MM-DD` (UTC).
    pub month: String,
    /// Prepaid credit left: the tenant's spend limit counts spend net of it.
    pub credit_micros: i64,
}

#[server(prefix = "/api", endpoint = "limits", input = leptos::server_fn::codec::GetUrl)]
pub async fn load_limits() -> Result<LimitsView, PortalError> {
    use crate::ssr::{internal, member, session, Portal};
    use tf_core::db::{keys, limits, spend};

    let portal = Portal::current()?;
    let s = session::current().await?;
    let m = member::required(&portal, &s).await?;
    let pool = &portal.deps.pool;
    let failed = |e| internal("reading limits", e);
    let now = time::OffsetDateTime::now_utc();
    let month = tf_core::period::month_of(now);
    let (rates, caps) = limits::of_tenant(pool, m.tenant.id)
        .await
        .map_err(failed)?
        .unwrap_or_default();
    let used = spend::consumption(pool, m.tenant.id, None, month)
        .await
        .map_err(failed)?;
    let credit_micros = tf_core::db::billing::credit_balance(pool, m.tenant.id)
        .await
        .map_err(failed)?;
    let subject = |label: String, r: limits::RateRow, c: spend::Consumption| SubjectLimits {
        label,
        requests_per_minute: r.requests_per_minute,
        tokens_per_minute: r.tokens_per_minute,
        spend_limit_micros: r.spend_limit_micros,
        requests_last_minute: c.requests_last_minute,
        tokens_last_minute: c.tokens_last_minute,
        spend_micros: c.spend_micros,
    };
    let mut key_rows = Vec::new();
    // A tenant has a handful of working keys; two small indexed queries each.
    for k in keys::list_of_tenant(pool, m.tenant.id)
        .await
        .map_err(failed)?
        .into_iter()
        .filter(|k| k.revoked_at.is_none() && k.expires_at.is_none_or(|at| at > now))
    {
        let r = limits::of_key(pool, k.id, m.tenant.id)
            .await
            .map_err(failed)?
            .unwrap_or_default();
        let c = spend::consumption(pool, m.tenant.id, Some(k.id), month)
            .await
            .map_err(failed)?;
        key_rows.push(subject(format!("{} ({}…)", k.name, k.prefix), r, c));
    }
    Ok(LimitsView {
        tenant: subject("Whole tenant".to_owned(), rates, used),
        max_in_flight: caps.max_in_flight,
        max_long_prompts: caps.max_long_prompts,
        long_prompt_tokens: caps.long_prompt_tokens,
        keys: key_rows,
        month: month.to_string(),
        credit_micros,
    })
}
