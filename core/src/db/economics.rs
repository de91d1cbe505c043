//! Unit economics, the statements (issue 17): base cost versions (`base_costs`, append-only),
//! graph state history (`lifecycle_history`), tokens served and revenue (`usage_daily`), and
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

/// Whether the catalog has a base of this name.
pub async fn base_exists(db: impl PgExecutor<'_>, name: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM base_models WHERE name = $1) AS "exists!""#,
        name
    )
    .fetch_one(db)
    .await
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
                peak_tokens_per_second, created_by, created_at
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
/// THE one place revenue comes from. Until billing (issue 16) lands it is the placeholder price:
/// `usage_daily.cost_micros`, the sum over events of `money::cost_micros` (the SQL twin proven
/// equal in `db::spend`). When the billing branch merges, switch this function to its rated
/// charge lines (`rated_daily` of the newest rating run, summed per price key's base and day);
/// nothing else reads revenue.
pub async fn revenue_by_base_day(
    db: impl PgExecutor<'_>,
    from: Date,
    to: Date,
) -> sqlx::Result<Vec<(String, Date, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT base_model, day, SUM(cost_micros)::bigint AS "revenue!"
           FROM usage_daily WHERE day >= $1 AND day < $2
           GROUP BY base_model, day"#,
        from,
        to,
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.base_model, r.day, r.revenue))
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
