//! `/admin/tenants` and `/admin/tenants/{name}`: every tenant with its status and this month's
//! usage, creating one (its first user's password shown once), suspending and reactivating, and
//! a tenant's limits and its keys' limits (the semantics of `tokenfactory admin limits`: an empty
//! field or `none` removes a limit).

pub mod detail;
pub mod page;

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::PortalError;
use crate::keys::FreshKey;

/// One tenant of the list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantItem {
    pub name: String,
    pub display_name: String,
    pub suspended: bool,
    pub created: String,
    pub users: i64,
    pub active_keys: i64,
    pub requests: i64,
    pub tokens: i64,
    pub cost_micros: i64,
}

/// What `/admin/tenants` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantsView {
    pub tenants: Vec<TenantItem>,
    /// The cursor of the next page (the last handle shown), when there is one.
    pub next: Option<String>,
    /// The month the usage columns cover, `YYYY-MM`.
    pub month: String,
    /// A first user just created: `name` is the email, `prefix` the tenant, `secret` the
    /// password, shown this once.
    pub fresh: Option<FreshKey>,
}

/// Limits as the forms show them: `""` is no limit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitFields {
    pub rpm: String,
    pub tpm: String,
    pub spend_limit: String,
    pub max_in_flight: String,
    pub max_long_prompts: String,
    pub long_prompt_tokens: String,
}

/// A key of the tenant with its own limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyLimits {
    pub name: String,
    pub prefix: String,
    pub revoked: bool,
    pub limits: LimitFields,
}

/// One model's usage this month.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelUsage {
    pub model: String,
    pub requests: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_micros: i64,
}

/// The tenant's gross margin on one base this month (issue 36): its rated revenue less the GPU
/// cost attributed to it (`tf_core::economics::attribution`, day by day, summed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseMargin {
    pub base: String,
    pub days: i64,
    pub revenue_micros: i64,
    pub cost_micros: i64,
    pub margin_micros: i64,
    pub margin_bp: Option<i64>,
}

/// What `/admin/tenants/{name}` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantDetail {
    pub name: String,
    pub display_name: String,
    pub suspended: bool,
    pub month: String,
    pub models: Vec<ModelUsage>,
    pub requests_last_minute: i64,
    pub tokens_last_minute: i64,
    pub spend_micros: i64,
    pub limits: LimitFields,
    pub keys: Vec<KeyLimits>,
    /// Gross margin per base this month, by base.
    pub margins: Vec<BaseMargin>,
}

#[cfg(feature = "ssr")]
fn field(v: Option<i64>) -> String {
    v.map(|n| n.to_string()).unwrap_or_default()
}

/// A money limit as the form shows it and reads it back: dollars (`$5.00`), never micro-units.
fn money_field(v: Option<i64>) -> String {
    v.map(crate::money::format_micros).unwrap_or_default()
}

/// The first day of this month (UTC).
#[cfg(feature = "ssr")]
fn month_start() -> time::Date {
    tf_core::period::month_of(time::OffsetDateTime::now_utc())
}

#[cfg(feature = "ssr")]
fn month_label(d: time::Date) -> String {
    format!("{:04}-{:02}", d.year(), u8::from(d.month()))
}

/// A page of tenants after the handle `after`, and a first user's password waiting to be shown.
#[server(prefix = "/api", endpoint = "admin_tenants", input = leptos::server_fn::codec::GetUrl)]
pub async fn admin_tenants(
    #[server(default)] after: Option<String>,
) -> Result<TenantsView, PortalError> {
    use crate::admin::server as admin;
    use crate::keys::reveal;
    use crate::keys::when;
    use crate::ssr::{cookies, internal, session, Portal};

    let portal = Portal::current()?;
    admin::required(&portal).await?;
    let s = session::current().await?;
    let fresh = reveal::take(reveal::Slot::Password, &s, &cookies::jar().await?).await?;
    let month = month_start();
    let after = after.filter(|a| !a.is_empty());
    let mut rows = tf_core::db::overview::tenant_page(
        &portal.deps.pool,
        after.as_deref(),
        month,
        super::PAGE_SIZE + 1,
    )
    .await
    .map_err(|e| internal("listing tenants", e))?;
    let more = rows.len() > usize::try_from(super::PAGE_SIZE).unwrap_or(usize::MAX);
    rows.truncate(usize::try_from(super::PAGE_SIZE).unwrap_or(0));
    let next = more.then(|| rows.last().map(|r| r.name.clone())).flatten();
    Ok(TenantsView {
        tenants: rows
            .into_iter()
            .map(|r| TenantItem {
                name: r.name,
                display_name: r.display_name,
                suspended: r.status == tf_core::TenantStatus::Suspended,
                created: when(r.created_at),
                users: r.users,
                active_keys: r.active_keys,
                requests: r.requests,
                tokens: r.tokens,
                cost_micros: r.cost_micros,
            })
            .collect(),
        next,
        month: month_label(month),
        fresh,
    })
}

/// One tenant's usage this month, consumption and limits; `None` (and 404) for no such tenant.
#[server(prefix = "/api", endpoint = "admin_tenant", input = leptos::server_fn::codec::GetUrl)]
pub async fn admin_tenant(
    #[server(default)] name: String,
) -> Result<Option<TenantDetail>, PortalError> {
    use crate::admin::server as admin;
    use crate::ssr::{internal, session, Portal};
    use tf_core::db;

    let portal = Portal::current()?;
    admin::required(&portal).await?;
    let pool = &portal.deps.pool;
    let Some(t) = db::accounts::tenant_by_name(pool, &name)
        .await
        .map_err(|e| internal("loading a tenant", e))?
    else {
        session::set_status(http::StatusCode::NOT_FOUND);
        return Ok(None);
    };
    let month = month_start();
    let models = db::overview::tenant_models_since(pool, t.id, month)
        .await
        .map_err(|e| internal("reading a tenant's usage", e))?;
    let used = db::spend::consumption(pool, t.id, None, month)
        .await
        .map_err(|e| internal("reading a tenant's consumption", e))?;
    let (r, c) = db::limits::of_tenant(pool, t.id)
        .await
        .map_err(|e| internal("reading a tenant's limits", e))?
        .unwrap_or_default();
    let keys = db::overview::keys_with_limits(pool, t.id)
        .await
        .map_err(|e| internal("reading a tenant's key limits", e))?;
    let now = time::OffsetDateTime::now_utc();
    let days = u16::try_from((now.date() - month).whole_days() + 1).unwrap_or(31);
    let margins = db::attribution::tenant_margins(pool, t.id, month, days, now)
        .await
        .map_err(|e| internal("attributing a tenant's cost", e))?
        .into_iter()
        .map(|m| BaseMargin {
            base: m.base,
            days: m.days,
            revenue_micros: m.revenue_micros,
            cost_micros: m.cost_micros,
            margin_micros: m.margin_micros,
            margin_bp: m.margin_bp,
        })
        .collect();
    Ok(Some(TenantDetail {
        margins,
        name: t.name,
        display_name: t.display_name,
        suspended: t.status == tf_core::TenantStatus::Suspended,
        month: month_label(month),
        models: models
            .into_iter()
            .map(|m| ModelUsage {
                model: m.served_name,
                requests: m.requests,
                prompt_tokens: m.prompt_tokens,
                completion_tokens: m.completion_tokens,
                cost_micros: m.cost_micros,
            })
            .collect(),
        requests_last_minute: used.requests_last_minute,
        tokens_last_minute: used.tokens_last_minute,
        spend_micros: used.spend_micros,
        limits: LimitFields {
            rpm: field(r.requests_per_minute),
            tpm: field(r.tokens_per_minute),
            spend_limit: money_field(r.spend_limit_micros),
            max_in_flight: field(c.max_in_flight),
            max_long_prompts: field(c.max_long_prompts),
            long_prompt_tokens: field(c.long_prompt_tokens),
        },
        keys: keys
            .into_iter()
            .map(|k| KeyLimits {
                name: k.name,
                prefix: k.prefix,
                revoked: k.revoked,
                limits: LimitFields {
                    rpm: field(k.requests_per_minute),
                    tpm: field(k.tokens_per_minute),
                    spend_limit: money_field(k.spend_limit_micros),
                    ..LimitFields::default()
                },
            })
            .collect(),
    }))
}

/// The page a tenant form goes back to: the tenant's page when posted from it, else the list.
#[cfg(feature = "ssr")]
fn back_to(from: &str, tenant: &str) -> String {
    let handle_ok = !tenant.is_empty()
        && tenant
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if from == "detail" && handle_ok {
        format!("/admin/tenants/{tenant}")
    } else {
        "/admin/tenants".to_owned()
    }
}

/// Creates a tenant and its first user (a generated password, shown once on the list).
#[server(prefix = "/api", endpoint = "admin_create_tenant")]
pub async fn admin_create_tenant(
    #[server(default)] csrf: String,
    #[server(default)] name: String,
    #[server(default)] display_name: String,
    #[server(default)] email: String,
) -> Result<(), PortalError> {
    use crate::keys::reveal;
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::accounts::AccountError;
    use tf_core::operator::{self, FirstUser};

    let Some(f) = super::form(&csrf, "/admin/tenants").await? else {
        return Ok(());
    };
    let name = name.trim().to_lowercase();
    let display = display_name.trim();
    let display = if display.is_empty() { &name } else { display };
    let email = email.trim().to_lowercase();
    if email.is_empty() || email.len() > crate::model::MAX_INPUT_LEN {
        return f.back("/admin/tenants", Some(AdminFlash::UserInvalid));
    }
    let password = tf_core::accounts::generate_password();
    let first = FirstUser {
        email: &email,
        password: &password,
    };
    let made =
        operator::create_tenant(&f.portal.deps.pool, &f.actor(), &name, display, Some(first)).await;
    let (tenant, user) = match made {
        Ok(made) => made,
        Err(AccountError::Exists(what)) if what.starts_with("tenant") => {
            return f.back("/admin/tenants", Some(AdminFlash::TenantExists));
        }
        Err(AccountError::Invalid(what)) if what.starts_with("tenant") => {
            return f.back("/admin/tenants", Some(AdminFlash::TenantNameInvalid));
        }
        Err(AccountError::Exists(_) | AccountError::Invalid(_)) => {
            return f.back("/admin/tenants", Some(AdminFlash::UserInvalid));
        }
        Err(e) => return Err(internal("creating a tenant", e)),
    };
    tracing::info!(tenant = %tenant.name, admin = %f.user.email, "tenant created in the portal");
    if let Some(user) = user {
        let fresh = FreshKey {
            name: user.email,
            prefix: tenant.name,
            secret: password,
            note: None,
        };
        reveal::stash(reveal::Slot::Password, &f.session, &f.jar, &fresh).await?;
    }
    f.back("/admin/tenants", Some(AdminFlash::TenantCreated))
}

/// Suspends a tenant: keys refused within a second on every replica, users signed out.
#[server(prefix = "/api", endpoint = "admin_suspend_tenant")]
pub async fn admin_suspend_tenant(
    #[server(default)] csrf: String,
    #[server(default)] tenant: String,
    #[server(default)] from: String,
) -> Result<(), PortalError> {
    change_status(&csrf, &tenant, &from, true).await
}

/// Reactivates a suspended tenant.
#[server(prefix = "/api", endpoint = "admin_reactivate_tenant")]
pub async fn admin_reactivate_tenant(
    #[server(default)] csrf: String,
    #[server(default)] tenant: String,
    #[server(default)] from: String,
) -> Result<(), PortalError> {
    change_status(&csrf, &tenant, &from, false).await
}

/// Suspension and reactivation: the same form, the one audited operator call each.
#[cfg(feature = "ssr")]
async fn change_status(
    csrf: &str,
    tenant: &str,
    from: &str,
    suspend: bool,
) -> Result<(), PortalError> {
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;

    let back = back_to(from, tenant);
    let Some(f) = super::form(csrf, &back).await? else {
        return Ok(());
    };
    let pool = &f.portal.deps.pool;
    let found = tf_core::db::accounts::tenant_by_name(pool, tenant)
        .await
        .map_err(|e| internal("loading a tenant", e))?;
    let Some(t) = found else {
        return f.back("/admin/tenants", Some(AdminFlash::NoSuchTenant));
    };
    let (done, flash) = if suspend {
        tf_core::operator::suspend_tenant(pool, &f.actor(), t.id)
            .await
            .map_err(|e| internal("suspending a tenant", e))?;
        ("suspended", AdminFlash::TenantSuspended)
    } else {
        tf_core::operator::reactivate_tenant(pool, &f.actor(), t.id)
            .await
            .map_err(|e| internal("reactivating a tenant", e))?;
        ("reactivated", AdminFlash::TenantReactivated)
    };
    tracing::info!(tenant = %t.name, admin = %f.user.email, "tenant {done} in the portal");
    f.back(&back, Some(flash))
}

/// Sets every limit of a tenant from its form (empty: no limit).
#[server(prefix = "/api", endpoint = "admin_tenant_limits")]
#[allow(clippy::too_many_arguments, reason = "one argument per form field")]
pub async fn admin_tenant_limits(
    #[server(default)] csrf: String,
    #[server(default)] tenant: String,
    #[server(default)] rpm: String,
    #[server(default)] tpm: String,
    #[server(default)] spend_limit: String,
    #[server(default)] max_in_flight: String,
    #[server(default)] max_long_prompts: String,
    #[server(default)] long_prompt_tokens: String,
) -> Result<(), PortalError> {
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::db::limits::{CapsChange, RateChange};
    use tf_core::operator::{self, parse_limit, parse_money_limit};

    let back = back_to("detail", &tenant);
    let Some(f) = super::form(&csrf, &back).await? else {
        return Ok(());
    };
    let pool = &f.portal.deps.pool;
    let found = tf_core::db::accounts::tenant_by_name(pool, &tenant)
        .await
        .map_err(|e| internal("loading a tenant", e))?;
    let Some(t) = found else {
        return f.back("/admin/tenants", Some(AdminFlash::NoSuchTenant));
    };
    let parsed = (
        parse_limit(&rpm),
        parse_limit(&tpm),
        parse_money_limit(&spend_limit),
        parse_limit(&max_in_flight),
        parse_limit(&max_long_prompts),
        parse_limit(&long_prompt_tokens),
    );
    let (Some(rpm), Some(tpm), Some(spend), Some(mif), Some(mlp), Some(lpt)) = parsed else {
        return f.back(&back, Some(AdminFlash::LimitsInvalid));
    };
    // A zero threshold would make every prompt long; the table refuses it, so does the form.
    if lpt.value == Some(0) {
        return f.back(&back, Some(AdminFlash::LimitsInvalid));
    }
    let rates = RateChange {
        requests_per_minute: rpm,
        tokens_per_minute: tpm,
        spend_limit_micros: spend,
    };
    let caps = CapsChange {
        max_in_flight: mif,
        max_long_prompts: mlp,
        long_prompt_tokens: lpt,
    };
    operator::set_tenant_limits(pool, &f.actor(), &t, &rates, &caps)
        .await
        .map_err(|e| internal("setting a tenant's limits", e))?;
    f.back(&back, Some(AdminFlash::LimitsSaved))
}

/// Sets the limits of one of the tenant's keys (by its visible prefix).
#[server(prefix = "/api", endpoint = "admin_key_limits")]
pub async fn admin_key_limits(
    #[server(default)] csrf: String,
    #[server(default)] tenant: String,
    #[server(default)] key: String,
    #[server(default)] rpm: String,
    #[server(default)] tpm: String,
    #[server(default)] spend_limit: String,
) -> Result<(), PortalError> {
    use crate::ssr::admin_flash::AdminFlash;
    use crate::ssr::internal;
    use tf_core::accounts::AccountError;
    use tf_core::db::limits::RateChange;
    use tf_core::operator::{self, parse_limit, parse_money_limit};

    let back = back_to("detail", &tenant);
    let Some(f) = super::form(&csrf, &back).await? else {
        return Ok(());
    };
    let pool = &f.portal.deps.pool;
    let found = tf_core::db::accounts::tenant_by_name(pool, &tenant)
        .await
        .map_err(|e| internal("loading a tenant", e))?;
    let Some(t) = found else {
        return f.back("/admin/tenants", Some(AdminFlash::NoSuchTenant));
    };
    let (Some(rpm), Some(tpm), Some(spend)) = (
        parse_limit(&rpm),
        parse_limit(&tpm),
        parse_money_limit(&spend_limit),
    ) else {
        return f.back(&back, Some(AdminFlash::LimitsInvalid));
    };
    let rates = RateChange {
        requests_per_minute: rpm,
        tokens_per_minute: tpm,
        spend_limit_micros: spend,
    };
    match operator::set_key_limits(pool, &f.actor(), t.id, key.trim(), &rates).await {
        Ok(()) => f.back(&back, Some(AdminFlash::LimitsSaved)),
        Err(AccountError::NotFound(_)) => f.back(&back, Some(AdminFlash::NoSuchKey)),
        Err(e) => Err(internal("setting a key's limits", e)),
    }
}
