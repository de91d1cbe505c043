//! The advisor's statements (issue 36): a base's template, cost and measured wake time, its
//! request arrivals over a window (`usage_events`), and its rated revenue; [`advise`] puts them
//! through [`crate::economics::advisor`].

use sqlx::{PgExecutor, PgPool};
use time::{Date, Duration, OffsetDateTime};
use uuid::Uuid;

use super::economics::revenue_by_base_day;
use crate::economics::advisor::{self, Advice, Arrival, Budget, Policy, Template};
use crate::economics::{CostVersion, Served};

/// What the advice starts from: the base's template and policy now, its cost in effect, and
/// its measured wakes.
#[derive(Debug, Clone)]
pub struct BaseInputs {
    pub base_id: Uuid,
    pub floor: i32,
    pub ceiling: i32,
    pub idle_after_secs: Option<i32>,
    /// `None`: no cost version is in effect (nothing to advise on).
    pub cost: Option<CostVersion>,
    /// Wakes (`waking` followed by `ready` in the graph's history) since the window's start, and
    /// the median of their durations.
    pub wakes: i64,
    pub median_wake_ms: Option<i64>,
}

/// The named templated base's inputs at `now`, wakes counted since `since`; `None`: no
/// templated base has that name.
pub async fn base_inputs(
    pool: &PgPool,
    base: &str,
    since: OffsetDateTime,
    now: OffsetDateTime,
) -> sqlx::Result<Option<BaseInputs>> {
    let Some(t) = sqlx::query!(
        "SELECT b.id, t.replicas_min, t.replicas_max, t.idle_after_secs
           FROM base_models b JOIN base_templates t ON t.base_model_id = b.id
          WHERE b.name = $1",
        base
    )
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    let cost = sqlx::query!(
        "SELECT effective_from, gpu_micros_per_hour, gpus_per_replica, peak_tokens_per_second
           FROM base_costs WHERE base_model = $1 AND effective_from <= $2
          ORDER BY effective_from DESC LIMIT 1",
        base,
        now
    )
    .fetch_optional(pool)
    .await?
    .map(|c| CostVersion {
        effective_from: c.effective_from,
        gpu_micros_per_hour: c.gpu_micros_per_hour,
        gpus_per_replica: i64::from(c.gpus_per_replica),
        peak_tokens_per_second: c.peak_tokens_per_second,
    });
    let (wakes, median_wake_ms) = wake_times(pool, t.id, since).await?;
    Ok(Some(BaseInputs {
        base_id: t.id,
        floor: t.replicas_min,
        ceiling: t.replicas_max,
        idle_after_secs: t.idle_after_secs,
        cost,
        wakes,
        median_wake_ms,
    }))
}

/// The graph's wakes since `since` (a `waking` row followed by `ready`) and their median
/// duration in milliseconds.
pub async fn wake_times(
    db: impl PgExecutor<'_>,
    base_id: Uuid,
    since: OffsetDateTime,
) -> sqlx::Result<(i64, Option<i64>)> {
    let r = sqlx::query!(
        r#"SELECT count(*) AS "n!",
                  percentile_disc(0.5) WITHIN GROUP (ORDER BY ms) AS "median"
           FROM (SELECT (extract(epoch FROM next_at - at) * 1000)::bigint AS ms
                   FROM (SELECT at, to_state, lead(to_state) OVER w AS next_state,
                                lead(at) OVER w AS next_at
                           FROM lifecycle_history
                          WHERE entity = 'graph' AND entity_id = $1 AND at >= $2
                         WINDOW w AS (ORDER BY at, id)) h
                  WHERE to_state = 'waking' AND next_state = 'ready') w"#,
        base_id,
        since
    )
    .fetch_one(db)
    .await?;
    Ok((r.n, r.median))
}

/// The base's requests started in `[from, to)` (rejected ones never reached a GPU), oldest
/// first, as arrivals: milliseconds from `from` and their capacity load.
pub async fn arrivals(
    db: impl PgExecutor<'_>,
    base: &str,
    from: OffsetDateTime,
    to: OffsetDateTime,
) -> sqlx::Result<Vec<Arrival>> {
    let rows = sqlx::query!(
        r#"SELECT (extract(epoch FROM started_at - $2) * 1000)::bigint AS "at_ms!",
                  prompt_tokens, cached_tokens, completion_tokens
           FROM usage_events
          WHERE base_model = $1 AND started_at >= $2 AND started_at < $3 AND status <> 'rejected'
          ORDER BY started_at"#,
        base,
        from,
        to
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Arrival {
            at_ms: r.at_ms,
            load_milli: i64::try_from(
                Served {
                    prompt_tokens: r.prompt_tokens,
                    cached_tokens: r.cached_tokens,
                    completion_tokens: r.completion_tokens,
                }
                .load_milli(),
            )
            .unwrap_or(i64::MAX),
        })
        .collect())
}

/// The advice for `base` over the `days` whole UTC days before `now`'s day, with the base's
/// current policy replayed too.
#[derive(Debug, Clone)]
pub struct Report {
    pub base: String,
    pub first_day: Date,
    pub days: u16,
    pub inputs: BaseInputs,
    /// Where the cold start came from: `measured` (the median wake) or `assumed` (the fallback).
    pub cold_start_source: &'static str,
    pub current: Policy,
    pub advice: Advice,
}

/// Why there is no advice.
#[derive(Debug, thiserror::Error)]
pub enum AdviseError {
    #[error("no templated base model is named {0}")]
    NoBase(String),
    #[error("base {0} has no cost in effect: set one with `admin economics` first")]
    NoCost(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Reads `base`'s last `days` whole UTC days and advises (`fallback_cold_ms`: the cold start
/// assumed when the history holds no wake).
pub async fn advise(
    pool: &PgPool,
    base: &str,
    days: u16,
    now: OffsetDateTime,
    budget: Budget,
    fallback_cold_ms: i64,
) -> Result<Report, AdviseError> {
    let last = now.date();
    let first = last.saturating_sub(Duration::days(i64::from(days)));
    let (from, to) = (first.midnight().assume_utc(), last.midnight().assume_utc());
    let inputs = base_inputs(pool, base, from, now)
        .await?
        .ok_or_else(|| AdviseError::NoBase(base.to_owned()))?;
    let cost = inputs
        .cost
        .ok_or_else(|| AdviseError::NoCost(base.to_owned()))?;
    let (cold_start_ms, cold_start_source) = match inputs.median_wake_ms {
        Some(ms) => (ms, "measured"),
        None => (fallback_cold_ms, "assumed"),
    };
    let template = Template {
        ceiling: i64::from(inputs.ceiling.max(inputs.floor).max(1)),
        peak_tokens_per_second: cost.peak_tokens_per_second,
        replica_micros_per_hour: cost
            .gpu_micros_per_hour
            .saturating_mul(cost.gpus_per_replica),
        cold_start_ms,
    };
    let current = Policy {
        floor: i64::from(inputs.floor.max(1)),
        idle_after_secs: inputs.idle_after_secs.map(i64::from),
    };
    let mut arrivals = arrivals(pool, base, from, to).await?;
    let revenue: i64 = revenue_by_base_day(pool, first, last)
        .await?
        .into_iter()
        .filter(|(b, _, _)| b == base)
        .map(|(_, _, r)| r)
        .fold(0, i64::saturating_add);
    let window_ms = i64::try_from((to - from).whole_milliseconds()).unwrap_or(0);
    let advice = advisor::advise(
        &mut arrivals,
        window_ms,
        &template,
        revenue,
        budget,
        Some(current),
    );
    Ok(Report {
        base: base.to_owned(),
        first_day: first,
        days,
        inputs,
        cold_start_source,
        current,
        advice,
    })
}
