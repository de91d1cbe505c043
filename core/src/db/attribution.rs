//! The attribution's statements (issue 36): who used a base on a UTC day (`usage_events`, with
//! the idle time before each request), each tenant's rated revenue on it (`rated_daily`, the
//! live run, price keys mapped to bases as in [`super::economics::revenue_by_base_day`]), and
//! [`attribution`], which splits the day's cost from [`super::economics::days`] through
//! [`crate::economics::attribution`].

use sqlx::{PgExecutor, PgPool};
use time::{Date, Duration, OffsetDateTime};
use uuid::Uuid;

use super::economics::BaseDay;
use crate::economics::attribution::{self, Share, TenantMargin, Use};
use crate::economics::{Figures, Served};

/// Each tenant and served model's use of `base` in `[from, to)`: requests, tokens, and the idle
/// time before its requests (since the base's previous request, or `from` for the first), by
/// tenant and adapter.
pub async fn uses(
    db: impl PgExecutor<'_>,
    base: &str,
    from: OffsetDateTime,
    to: OffsetDateTime,
) -> sqlx::Result<Vec<Use>> {
    let rows = sqlx::query!(
        r#"SELECT tenant_id, adapter, count(*) AS "requests!",
                  sum(prompt_tokens)::bigint AS "prompt!", sum(cached_tokens)::bigint AS "cached!",
                  sum(completion_tokens)::bigint AS "completion!",
                  sum(gap_ms)::bigint AS "waited_for_ms!"
           FROM (SELECT tenant_id, adapter, prompt_tokens, cached_tokens, completion_tokens,
                        (extract(epoch FROM started_at - COALESCE(
                            lag(started_at) OVER (ORDER BY started_at, request_id), $2)) * 1000
                        )::bigint AS gap_ms
                   FROM usage_events
                  WHERE base_model = $1 AND started_at >= $2 AND started_at < $3
                    AND status <> 'rejected') e
           GROUP BY tenant_id, adapter
           ORDER BY tenant_id, adapter"#,
        base,
        from,
        to
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Use {
            tenant_id: r.tenant_id,
            adapter: r.adapter,
            requests: r.requests,
            served: Served {
                prompt_tokens: r.prompt,
                cached_tokens: r.cached,
                completion_tokens: r.completion,
            },
            waited_for_ms: r.waited_for_ms,
        })
        .collect())
}

/// Each tenant's live rated revenue on `base` on `day`, by tenant.
pub async fn tenant_revenue(
    db: impl PgExecutor<'_>,
    base: &str,
    day: Date,
) -> sqlx::Result<Vec<(Uuid, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT r.tenant_id, SUM(r.amount_micros)::bigint AS "revenue!"
           FROM rated_daily r
                JOIN rating_runs k ON k.id = r.run_id AND k.kind = 'live'
           WHERE r.day = $2 AND COALESCE(
                 (SELECT b.name FROM base_models b WHERE b.price_key = r.price_key
                   ORDER BY b.name = r.price_key DESC, b.name LIMIT 1), r.price_key) = $1
           GROUP BY r.tenant_id ORDER BY r.tenant_id"#,
        base,
        day
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.tenant_id, r.revenue)).collect())
}

/// Tenants' handles by id (for printing).
pub async fn tenant_names(
    db: impl PgExecutor<'_>,
    ids: &[Uuid],
) -> sqlx::Result<Vec<(Uuid, String)>> {
    let rows = sqlx::query!("SELECT id, name FROM tenants WHERE id = ANY($1)", ids)
        .fetch_all(db)
        .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.name)).collect())
}

/// A base-day's cost, who it is for, and each tenant's margin.
#[derive(Debug, Clone)]
pub struct Attribution {
    pub base: String,
    pub day: Date,
    pub figures: Figures,
    pub shares: Vec<Share>,
    pub margins: Vec<TenantMargin>,
}

/// Attributes `base`'s cost on `day` (today's window ends at `now`, as on the economics page).
/// `None`: the base has no cost, graph history or usage that day.
pub async fn attribution(
    pool: &PgPool,
    base: &str,
    day: Date,
    now: OffsetDateTime,
) -> sqlx::Result<Option<Attribution>> {
    let Some(row) = super::economics::days(pool, day, 1, now)
        .await?
        .into_iter()
        .find(|r| r.base == base)
    else {
        return Ok(None);
    };
    Ok(Some(of_row(pool, &row, now).await?))
}

/// The attribution of one base-day of [`super::economics::days`] (its figures already read).
pub async fn of_row(
    pool: &PgPool,
    row: &BaseDay,
    now: OffsetDateTime,
) -> sqlx::Result<Attribution> {
    let (base, day) = (row.base.as_str(), row.day);
    let from = day.midnight().assume_utc();
    let to = (from + Duration::DAY).min(now.max(from));
    let uses = uses(pool, base, from, to).await?;
    let f = row.figures;
    let shares = attribution::attribute(f.gpu_cost_micros, f.idle_floor_cost_micros, &uses);
    let revenue = tenant_revenue(pool, base, day).await?;
    let margins = attribution::tenant_margins(&shares, &revenue);
    Ok(Attribution {
        base: base.to_owned(),
        day,
        figures: f,
        shares,
        margins,
    })
}

/// A tenant's gross margin on one base over a run of days: the sums of its daily
/// [`TenantMargin`]s (each day's cost attributed by the rule of
/// [`crate::economics::attribution`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseMargin {
    pub base: String,
    /// Days the tenant used the base or was rated on it.
    pub days: i64,
    pub revenue_micros: i64,
    pub cost_micros: i64,
    pub margin_micros: i64,
    /// Of the revenue, in basis points; `None` without revenue.
    pub margin_bp: Option<i64>,
}

/// The base-days in `[first, last]` on which `tenant` made requests (not rejected) or has live
/// rated revenue, by base and day.
pub async fn tenant_base_days(
    db: impl PgExecutor<'_>,
    tenant: Uuid,
    first: Date,
    last: Date,
) -> sqlx::Result<Vec<(String, Date)>> {
    let from = first.midnight().assume_utc();
    let to = (last + Duration::DAY).midnight().assume_utc();
    let rows = sqlx::query!(
        r#"SELECT base AS "base!", day AS "day!" FROM (
               SELECT DISTINCT base_model AS base, (started_at AT TIME ZONE 'UTC')::date AS day
                 FROM usage_events
                WHERE tenant_id = $1 AND started_at >= $2 AND started_at < $3
                  AND status <> 'rejected'
               UNION
               SELECT COALESCE(
                        (SELECT b.name FROM base_models b WHERE b.price_key = r.price_key
                          ORDER BY b.name = r.price_key DESC, b.name LIMIT 1), r.price_key),
                      r.day
                 FROM rated_daily r JOIN rating_runs k ON k.id = r.run_id AND k.kind = 'live'
                WHERE r.tenant_id = $1 AND r.day >= $4 AND r.day <= $5) d
           ORDER BY base, day"#,
        tenant,
        from,
        to,
        first,
        last
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.base, r.day)).collect())
}

/// `tenant`'s gross margin on each base it used in the `days` UTC days from `first` (today's
/// window ends at `now`), by base name: each base-day attributed as on the economics page and
/// the tenant's part summed. Only the base-days the tenant touched are attributed.
pub async fn tenant_margins(
    pool: &PgPool,
    tenant: Uuid,
    first: Date,
    days: u16,
    now: OffsetDateTime,
) -> sqlx::Result<Vec<BaseMargin>> {
    let last = first.saturating_add(Duration::days(i64::from(days.max(1)) - 1));
    let touched = tenant_base_days(pool, tenant, first, last).await?;
    if touched.is_empty() {
        return Ok(Vec::new());
    }
    let rows = super::economics::days(pool, first, days.max(1), now).await?;
    let mut out: Vec<BaseMargin> = Vec::new();
    for (base, day) in touched {
        let m = match rows.iter().find(|r| r.base == base && r.day == day) {
            Some(row) => of_row(pool, row, now)
                .await?
                .margins
                .into_iter()
                .find(|m| m.tenant_id == tenant),
            None => None,
        };
        // Rated on a base-day the economics has no row for (a price key of no base): revenue
        // with no cost.
        let (revenue, cost) = match m {
            Some(m) => (m.revenue_micros, m.cost_micros),
            None => (
                tenant_revenue(pool, &base, day)
                    .await?
                    .into_iter()
                    .find(|(t, _)| *t == tenant)
                    .map_or(0, |(_, r)| r),
                0,
            ),
        };
        if out.last().is_none_or(|b| b.base != base) {
            out.push(BaseMargin {
                base: base.clone(),
                days: 0,
                revenue_micros: 0,
                cost_micros: 0,
                margin_micros: 0,
                margin_bp: None,
            });
        }
        if let Some(b) = out.last_mut() {
            b.days += 1;
            b.revenue_micros = b.revenue_micros.saturating_add(revenue);
            b.cost_micros = b.cost_micros.saturating_add(cost);
        }
    }
    for b in &mut out {
        b.margin_micros = b.revenue_micros.saturating_sub(b.cost_micros);
        b.margin_bp = (b.revenue_micros > 0).then(|| {
            crate::economics::div_half_up(
                i128::from(b.margin_micros) * 10_000,
                i128::from(b.revenue_micros),
            )
        });
    }
    Ok(out)
}
