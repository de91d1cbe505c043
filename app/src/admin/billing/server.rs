//! Server half of `/admin/prices` and `/admin/invoices`: reads the price book, the tiers and every
//! tenant's invoices and credit (`tf_core::db::billing`, `tf_core::db::invoicing`) and shapes
//! what the pages show. The forms' changes are `tf_core::billing_ops`'.

use sqlx::PgPool;
use tf_core::db::{billing, invoicing};
use time::macros::format_description;
use time::{Date, Month, OffsetDateTime};

use super::{
    AdminInvoiceItem, AdminInvoicesView, IssuerView, PriceItem, PricesView, TenantCredit,
    TenantTierItem, VersionItem,
};
use tf_core::period::month_of;

/// Invoices the admin list shows at most.
const MAX_LISTED: i64 = 500;

const SECOND: &[time::format_description::BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
const MINUTE: &[time::format_description::BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day] [hour]:[minute]");
const MONTH: &[time::format_description::BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]");

/// `YYYY-MM` as the first day of that month.
pub fn parse_month(typed: &str) -> Option<Date> {
    let (y, m) = typed.trim().split_once('-')?;
    let month = Month::try_from(m.parse::<u8>().ok()?).ok()?;
    Date::from_calendar_date(y.parse().ok()?, month, 1).ok()
}

/// When a stored draft's figures were computed, as the pages say it (`YYYY-MM-DD HH:MM:SS`, UTC).
pub fn as_of(t: OffsetDateTime) -> String {
    t.to_offset(time::UtcOffset::UTC)
        .format(SECOND)
        .unwrap_or_default()
}

/// What `/admin/prices` shows at `now`.
pub async fn prices(pool: &PgPool, now: OffsetDateTime) -> sqlx::Result<PricesView> {
    let all = billing::versions(pool).await?;
    let current = all
        .iter()
        .filter(|v| v.effective_from <= now)
        .map(|v| v.id)
        .next_back();
    let mut versions = Vec::with_capacity(all.len());
    // Newest first; a book has a version per price change, a handful a month at most.
    for v in all.into_iter().rev() {
        let prices = billing::prices_of_version(pool, v.id)
            .await?
            .into_iter()
            .map(|p| PriceItem {
                price_key: p.price_key,
                tier: p.tier,
                fresh_per_m: p.rates.fresh_per_m,
                cached_per_m: p.rates.cached_per_m,
                output_per_m: p.rates.output_per_m,
            })
            .collect();
        versions.push(VersionItem {
            id: v.id,
            effective_from: v.effective_from.format(SECOND).unwrap_or_default(),
            note: v.note,
            created_by: v.created_by,
            current: Some(v.id) == current,
            scheduled: v.effective_from > now,
            prices,
        });
    }
    let tenants = invoicing::tenant_tiers(pool)
        .await?
        .into_iter()
        .map(|t| TenantTierItem {
            name: t.name,
            display_name: t.display_name,
            tier: t.tier,
        })
        .collect();
    Ok(PricesView {
        versions,
        tiers: invoicing::tiers(pool).await?,
        tenants,
        keys: invoicing::price_keys(pool).await?,
    })
}

/// What `/admin/invoices` shows at `now`.
pub async fn invoices(pool: &PgPool, now: OffsetDateTime) -> sqlx::Result<AdminInvoicesView> {
    let invoices = invoicing::summaries(pool, None, MAX_LISTED)
        .await?
        .into_iter()
        .map(|s| AdminInvoiceItem {
            id: s.id.to_string(),
            tenant: s.tenant_name,
            month: s.period_start.format(MONTH).unwrap_or_default(),
            kind: s.kind,
            usage_micros: s.usage_micros,
            credit_micros: s.credit_micros,
            adjustment_micros: s.adjustment_micros,
            total_micros: s.total_micros,
            issued_at: s.issued_at.and_then(|t| t.format(MINUTE).ok()),
            number: s.number,
            as_of: s.built_at.filter(|_| s.status == "draft").map(as_of),
            status: s.status,
        })
        .collect();
    let balances: std::collections::HashMap<_, _> = billing::credit_balances(pool, None)
        .await?
        .into_iter()
        .collect();
    let tenants = invoicing::tenant_tiers(pool)
        .await?
        .into_iter()
        .map(|t| TenantCredit {
            balance_micros: balances.get(&t.id).copied().unwrap_or(0),
            tenant: t.name,
        })
        .collect();
    let issuer = tf_core::db::documents::issuer(pool).await?;
    Ok(AdminInvoicesView {
        invoices,
        tenants,
        open_month: month_of(now).format(MONTH).unwrap_or_default(),
        issuer: IssuerView {
            name: issuer.name,
            address: issuer.address,
            due_days: issuer.due_days,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::parse_month;
    use time::macros::date;

    #[test]
    fn months_parse_as_their_first_day() {
        assert_eq!(parse_month("2026-12"), Some(date!(2026 - 12 - 01)));
        assert_eq!(parse_month(" 2026-1 "), Some(date!(2026 - 01 - 01)));
        assert_eq!(parse_month("2026-13"), None);
        assert_eq!(parse_month("december"), None);
    }
}
