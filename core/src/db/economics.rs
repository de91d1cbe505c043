//! Unit economics, the statements (issue 17): base cost versions (`base_costs`, append-only),
//! graph state history (`lifecycle_history`), tokens served (`usage_daily`), revenue (billing's
//! rated lines, `rated_daily`), and
//! [`days`], which puts them through the arithmetic of [`crate::economics`].

use std::collections::{BTreeMap, BTreeSet};

use sqlx::{PgExecutor, PgPool};
use time::{Date, Duration, OffsetDateTime};

use crate::economics::{self, CostVersion, Figures, GraphState, Served};

/// One stored cost version of a base.
#[derive(Debug, Clone)]
pub struct CostRow {
    pub id: i64,
    pub base_model: String,
    pub effective_from: OffsetDateTime,
    pub gpu_micros_per_hour: i64,
    pub gpus_per_replica: i32,
    pub peak_tokens_per_second: i64,
    pub created_by: String,
    pub created_at: OffsetDateTime,
    /// How the peak was measured (`measure-peak`); `None`: configured.
    pub peak_measured: Option<serde_json::Value>,
}

impl CostRow {
    pub fn version(&self) -> CostVersion {
        CostVersion {
            effective_from: self.effective_from,
            gpu_micros_per_hour: self.gpu_micros_per_hour,
            gpus_per_replica: i64::from(self.gpus_per_replica),
            peak_tokens_per_second: self.peak_tokens_per_second,
        }
    }
}

/// A new cost version (a change is always a new row).
#[derive(Debug, Clone)]
pub struct NewCost<'a> {
    pub base_model: &'a str,
    pub effective_from: OffsetDateTime,
    pub gpu_micros_per_hour: i64,
    pub gpus_per_replica: i32,
    pub peak_tokens_per_second: i64,
    pub created_by: &'a str,
}

/// Appends a cost version; returns its id. A second version of the same base with the same
/// `effective_from` is refused by the unique key (the caller reports it).
pub async fn insert_cost(db: impl PgExecutor<'_>, c: &NewCost<'_>) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "INSERT INTO base_costs (base_model, effective_from, gpu_micros_per_hour, gpus_per_replica,
             peak_tokens_per_second, created_by)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
        c.base_model,
        c.effective_from,
        c.gpu_micros_per_hour,
        c.gpus_per_replica,
        c.peak_tokens_per_second,
        c.created_by,
    )
    .fetch_one(db)
    .await
}

/// Appends a cost version whose peak was measured (`how`: the measurement, kept on the row).
pub async fn insert_measured_cost(
    db: impl PgExecutor<'_>,
    c: &NewCost<'_>,
    how: &serde_json::Value,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "INSERT INTO base_costs (base_model, effective_from, gpu_micros_per_hour, gpus_per_replica,
             peak_tokens_per_second, created_by, peak_measured)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        c.base_model,
        c.effective_from,
        c.gpu_micros_per_hour,
        c.gpus_per_replica,
        c.peak_tokens_per_second,
        c.created_by,
        how,
    )
    .fetch_one(db)
    .await
}

/// Where a base is served, for a measurement: its frontend URL, the model name the engine
/// knows, and its graph's ready replicas (`None`: no managed graph, e.g. a static base).
#[derive(Debug, Clone)]
pub struct ServedBase {
    pub upstream_url: String,
    pub upstream_model: String,
    pub replicas_ready: Option<i32>,
}

pub async fn served_base(db: impl PgExecutor<'_>, name: &str) -> sqlx::Result<Option<ServedBase>> {
    sqlx::query_as!(
        ServedBase,
        r#"SELECT b.upstream_url, b.upstream_model, g.replicas_ready AS "replicas_ready?"
           FROM base_models b LEFT JOIN graphs g ON g.base_model_id = b.id
           WHERE b.name = $1"#,
        name
    )
    .fetch_optional(db)
    .await
}

/// Whether the catalog has a base of this name.
pub async fn base_exists(db: impl PgExecutor<'_>, name: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM base_models WHERE name = $1) AS "exists!""#,
        name
    )
    .fetch_one(db)
    .await
}

/// Each templated base's floor now (its template's minimum replicas), by name.
pub async fn template_floors(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<(String, i32)>> {
    let rows = sqlx::query!(
        "SELECT b.name, t.replicas_min FROM base_models b
           JOIN base_templates t ON t.base_model_id = b.id ORDER BY b.name"
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.name, r.replicas_min)).collect())
}

/// Every base name of the catalog, by name (what a cost may be set for).
pub async fn base_names(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("SELECT name FROM base_models ORDER BY name")
        .fetch_all(db)
        .await
}

/// Every cost version, by base, oldest first.
pub async fn costs(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<CostRow>> {
    sqlx::query_as!(
        CostRow,
        "SELECT id, base_model, effective_from, gpu_micros_per_hour, gpus_per_replica,
                peak_tokens_per_second, created_by, created_at, peak_measured
         FROM base_costs ORDER BY base_model, effective_from",
    )
    .fetch_all(db)
    .await
}

/// A graph's recorded state change, named by its base.
#[derive(Debug, Clone)]
pub struct GraphChange {
    pub base: String,
    pub at: OffsetDateTime,
    pub to_state: String,
    pub replicas: i32,
    pub floor: i32,
}

/// The graph rows in `[from, to)` and, per graph, the last row before `from` (the state the
/// window starts in), by graph and time. A row without a floor (written before the economics)
/// takes its template's current floor.
pub async fn graph_history(
    db: impl PgExecutor<'_>,
    from: OffsetDateTime,
    to: OffsetDateTime,
) -> sqlx::Result<Vec<GraphChange>> {
    sqlx::query_as!(
        GraphChange,
        r#"SELECT COALESCE(b.name, h.name) AS "base!", h.at, h.to_state,
                  COALESCE(h.replicas, 0) AS "replicas!",
                  COALESCE(h.floor, t.replicas_min, h.replicas, 0) AS "floor!"
           FROM lifecycle_history h
                LEFT JOIN base_models b ON b.id = h.entity_id
                LEFT JOIN base_templates t ON t.base_model_id = h.entity_id
           WHERE h.entity = 'graph' AND h.at < $2
             AND (h.at >= $1 OR h.id IN (
                 SELECT DISTINCT ON (entity_id) id FROM lifecycle_history
                 WHERE entity = 'graph' AND at < $1 ORDER BY entity_id, at DESC, id DESC))
           ORDER BY h.entity_id, h.at, h.id"#,
        from,
        to,
    )
    .fetch_all(db)
    .await
}

/// Tokens served per base and UTC day in `[from, to)`, from the `usage_daily` rollup.
pub async fn served_by_base_day(
    db: impl PgExecutor<'_>,
    from: Date,
    to: Date,
) -> sqlx::Result<Vec<(String, Date, Served)>> {
    let rows = sqlx::query!(
        r#"SELECT base_model, day,
                  SUM(prompt_tokens)::bigint AS "prompt!", SUM(cached_tokens)::bigint AS "cached!",
                  SUM(completion_tokens)::bigint AS "completion!"
           FROM usage_daily WHERE day >= $1 AND day < $2
           GROUP BY base_model, day"#,
        from,
        to,
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let served = Served {
                prompt_tokens: r.prompt,
                cached_tokens: r.cached,
                completion_tokens: r.completion,
            };
            (r.base_model, r.day, served)
        })
        .collect())
}

/// Revenue per base and UTC day in `[from, to)`, in micro-units.
///
/// THE one place revenue comes from: billing's rated lines, the live rating run's per-day rollup
/// (`rated_daily`, every event rated under the price-book version in effect at its start, fresh,
/// cached and output tokens each at their own rate), so the blended price is the price book's,
/// not a flat per-base price. `rated_daily` is keyed by price key; a key counts for the base whose
/// `price_key` it is (adapters inherit their base's key), preferring the base named like the key,
/// else the first by name; a key no base uses counts under its own name. Re-rates (an admin's
/// chosen version for one tenant's period, kept for audit and invoice corrections) are not
/// revenue here. Events the rater has not reached yet are not revenue yet.
pub async fn revenue_by_base_day(
    db: impl PgExecutor<'_>,
    from: Date,
    to: Date,
) -> sqlx::Result<Vec<(String, Date, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT COALESCE(b.name, r.price_key) AS "base!", r.day,
                  SUM(r.amount_micros)::bigint AS "revenue!"
           FROM rated_daily r
                JOIN rating_runs k ON k.id = r.run_id AND k.kind = 'live'
                LEFT JOIN LATERAL (
                    SELECT b.name FROM base_models b WHERE b.price_key = r.price_key
                    ORDER BY b.name = r.price_key DESC, b.name LIMIT 1) b ON true
           WHERE r.day >= $1 AND r.day < $2
           GROUP BY 1, 2"#,
        from,
        to,
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.base, r.day, r.revenue))
        .collect())
}

/// One base on one UTC day.
#[derive(Debug, Clone)]
pub struct BaseDay {
    pub base: String,
    pub day: Date,
    /// The cost version in effect at the end of the window (`None`: none set yet).
    pub cost: Option<CostVersion>,
    pub figures: Figures,
}

/// Every base with a cost, graph history or usage in the `days` UTC days from `first`, per base
/// (by name) and day (oldest first). Today's window ends at `now`.
pub async fn days(
    pool: &PgPool,
    first: Date,
    days: u16,
    now: OffsetDateTime,
) -> sqlx::Result<Vec<BaseDay>> {
    let last = first.saturating_add(Duration::days(i64::from(days)));
    let (from, to) = (first.midnight().assume_utc(), last.midnight().assume_utc());
    let mut costs: BTreeMap<String, Vec<CostVersion>> = BTreeMap::new();
    for c in self::costs(pool).await? {
        costs
            .entry(c.base_model.clone())
            .or_default()
            .push(c.version());
    }
    let mut history: BTreeMap<String, Vec<GraphState>> = BTreeMap::new();
    for h in graph_history(pool, from, to).await? {
        history.entry(h.base).or_default().push(GraphState {
            at: h.at,
            warm: h.to_state == "ready",
            replicas: i64::from(h.replicas),
            floor: i64::from(h.floor),
        });
    }
    // Several graphs of one base name (a base deleted and offered again) are merged in time.
    for states in history.values_mut() {
        states.sort_by_key(|s| s.at);
    }
    let served: BTreeMap<(String, Date), Served> = served_by_base_day(pool, first, last)
        .await?
        .into_iter()
        .map(|(b, d, s)| ((b, d), s))
        .collect();
    let revenue: BTreeMap<(String, Date), i64> = revenue_by_base_day(pool, first, last)
        .await?
        .into_iter()
        .map(|(b, d, r)| ((b, d), r))
        .collect();
    let bases: BTreeSet<String> = costs
        .keys()
        .chain(history.keys())
        .chain(served.keys().map(|(b, _)| b))
        .chain(revenue.keys().map(|(b, _)| b))
        .cloned()
        .collect();
    let mut out = Vec::new();
    for base in bases {
        let no_costs = Vec::new();
        let versions = costs.get(&base).unwrap_or(&no_costs);
        let states = history.get(&base).map_or(&[][..], Vec::as_slice);
        let mut day = first;
        while day < last {
            let start = day.midnight().assume_utc();
            let end = (start + Duration::DAY).min(now.max(start));
            let key = (base.clone(), day);
            let f = economics::fleet(states, versions, start, end);
            let figures = economics::figures(
                &f,
                served.get(&key).copied().unwrap_or_default(),
                revenue.get(&key).copied().unwrap_or(0),
            );
            let cost = versions
                .iter()
                .rev()
                .find(|c| c.effective_from < end.max(start + Duration::SECOND))
                .copied();
            out.push(BaseDay {
                base: base.clone(),
                day,
                cost,
                figures,
            });
            day = day.saturating_add(Duration::DAY);
        }
    }
    Ok(out)
}
