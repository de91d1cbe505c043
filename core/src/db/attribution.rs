//! The attribution's statements (issue 36): who used a base on a UTC day (`usage_events`, with
//! the idle time before each request), each tenant's rated revenue on it (`rated_daily`, the
//! live run, price keys mapped to bases as in [`super::economics::revenue_by_base_day`]), and
//! [`attribution`], which splits the day's cost from [`super::economics::days`] through
//! [`crate::economics::attribution`].

use sqlx::{PgExecutor, PgPool};
use time::{Date, Duration, OffsetDateTime};
use uuid::Uuid;

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
    let from = day.midnight().assume_utc();
    let to = (from + Duration::DAY).min(now.max(from));
    let uses = uses(pool, base, from, to).await?;
    let f = row.figures;
    let shares = attribution::attribute(f.gpu_cost_micros, f.idle_floor_cost_micros, &uses);
    let revenue = tenant_revenue(pool, base, day).await?;
    let margins = attribution::tenant_margins(&shares, &revenue);
    Ok(Some(Attribution {
        base: base.to_owned(),
        day,
        figures: f,
        shares,
        margins,
    }))
}
