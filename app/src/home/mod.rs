//! The server function of the tenant home `/`: this month's usage, the number of working keys
//! and the models the tenant may call, all scoped by the session's tenant and computed in SQL.

pub mod page;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;

/// A model the tenant may call, as the home lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelView {
    pub name: String,
    /// "base model" or "adapter on <base>".
    pub kind: String,
    /// Prices per million tokens now, formatted: fresh input, cached input, output ("-" for
    /// each when the model has no price).
    pub input_price: String,
    pub cached_price: String,
    pub output_price: String,
}

/// Everything the home shows, formatted on the server from integers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomeView {
    /// The tenant's display name.
    pub tenant: String,
    /// "December 2026" (UTC).
    pub month: String,
    pub requests: String,
    pub prompt_tokens: String,
    pub cached_tokens: String,
    pub completion_tokens: String,
    pub cost: String,
    pub active_keys: String,
    pub models: Vec<ModelView>,
    /// The OpenAI-compatible base URL, as this request reached the portal.
    pub api_base: String,
}

/// The home's figures for the session's tenant.
#[server(prefix = "/api", endpoint = "home", input = leptos::server_fn::codec::GetUrl)]
pub async fn load_home() -> Result<HomeView, PortalError> {
    use crate::money::{format_micros, group_thousands, Decimals};
    use tf_core::db::{dashboard, keys};

    use crate::ssr::{internal, member, session, Portal};

    let portal = Portal::current()?;
    let s = session::current().await?;
    let m = member::required(&portal, &s).await?;
    let pool = &portal.deps.pool;
    let now = time::OffsetDateTime::now_utc();
    let month_start = tf_core::period::month_of(now);
    let (totals, active, models) = tokio::try_join!(
        dashboard::totals_since(pool, m.tenant.id, month_start),
        keys::count_active(pool, m.tenant.id),
        dashboard::usable_models(pool, m.tenant.id),
    )
    .map_err(|e| internal("loading the tenant home", e))?;
    let n = |v: i64| group_thousands(u64::try_from(v).unwrap_or(0));
    // The price table's columns align: one number of decimals for all its prices.
    let prices = Decimals::for_amounts(
        models
            .iter()
            .filter_map(|u| u.rates)
            .flat_map(|r| [r.fresh_per_m, r.cached_per_m, r.output_per_m]),
    );
    Ok(HomeView {
        tenant: m.tenant.display_name,
        month: format!("{} {}", now.month(), now.year()),
        requests: n(totals.requests),
        prompt_tokens: n(totals.prompt_tokens),
        cached_tokens: n(totals.cached_tokens),
        completion_tokens: n(totals.completion_tokens),
        cost: format_micros(totals.cost_micros),
        active_keys: n(active),
        models: models
            .into_iter()
            .map(|u| ModelView {
                kind: u
                    .base
                    .map_or_else(|| "base model".to_owned(), |b| format!("adapter on {b}")),
                input_price: u.rates.map_or("-".into(), |r| prices.show(r.fresh_per_m)),
                cached_price: u.rates.map_or("-".into(), |r| prices.show(r.cached_per_m)),
                output_price: u.rates.map_or("-".into(), |r| prices.show(r.output_per_m)),
                name: u.name,
            })
            .collect(),
        api_base: api_base(portal.deps.secure_cookies),
    })
}

/// `http(s)://<host>/v1` for the host this request named (a page shows it to the same user only).
#[cfg(feature = "ssr")]
pub(crate) fn api_base(tls: bool) -> String {
    let host = use_context::<http::request::Parts>()
        .and_then(|p| {
            p.headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned)
        })
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{host}/v1")
}
