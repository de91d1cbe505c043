//! Spend billed in PostgreSQL: what the spend reconciler raises Redis's counters to, and what
//! `admin limits` shows. Refused requests cost nothing (they carry no tokens).
//!
//! These two statements price each event in SQL, `((prompt + completion) * micros_per_1k + 999)
//! / 1000`, the formula of [`crate::money::cost_micros`], instead of calling it: the reconciler
//! sums a month of events for every limited subject on every pass, and shipping each event to
//! Rust to price it would move the whole month's rows per pass. The test below proves both agree.

use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

/// Whose spend a row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Tenant(Uuid),
    Key(Uuid),
}

/// Billed spend since `since` of every tenant and key that has a spend limit (zero when it has no
/// events).
pub async fn billed_by_limited_subject(
    pool: &PgPool,
    since: OffsetDateTime,
) -> sqlx::Result<Vec<(Subject, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT 't' AS "kind!", l.tenant_id AS "id!",
                  COALESCE(SUM(((e.prompt_tokens + e.completion_tokens) * b.micros_per_1k_tokens + 999) / 1000), 0)::bigint AS "billed!"
           FROM tenant_limits l
                LEFT JOIN usage_events e ON e.tenant_id = l.tenant_id AND e.started_at >= $1
                LEFT JOIN base_models b ON b.name = e.base_model
           WHERE l.spend_limit_micros IS NOT NULL
           GROUP BY l.tenant_id
           UNION ALL
           SELECT 'k', l.api_key_id,
                  COALESCE(SUM(((e.prompt_tokens + e.completion_tokens) * b.micros_per_1k_tokens + 999) / 1000), 0)::bigint
           FROM key_limits l
                LEFT JOIN usage_events e ON e.api_key_id = l.api_key_id AND e.tenant_id = l.tenant_id AND e.started_at >= $1
                LEFT JOIN base_models b ON b.name = e.base_model
           WHERE l.spend_limit_micros IS NOT NULL
           GROUP BY l.api_key_id"#,
        since,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let subject = if r.kind == "t" {
                Subject::Tenant(r.id)
            } else {
                Subject::Key(r.id)
            };
            (subject, r.billed)
        })
        .collect())
}

/// A subject's recent use and billed spend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Consumption {
    /// Requests started in the last minute (refusals excluded).
    pub requests_last_minute: i64,
    /// Prompt + completion tokens of those requests.
    pub tokens_last_minute: i64,
    /// Spend of the events since `month_start`, in micro-units.
    pub spend_micros: i64,
}

/// Consumption of a tenant, or of one of its keys when `key` is given.
pub async fn consumption(
    pool: &PgPool,
    tenant: Uuid,
    key: Option<Uuid>,
    month_start: OffsetDateTime,
) -> sqlx::Result<Consumption> {
    sqlx::query_as!(
        Consumption,
        r#"SELECT count(*) FILTER (WHERE e.started_at >= now() - interval '1 minute') AS "requests_last_minute!",
                  COALESCE(SUM(e.prompt_tokens + e.completion_tokens) FILTER (WHERE e.started_at >= now() - interval '1 minute'), 0)::bigint AS "tokens_last_minute!",
                  COALESCE(SUM(((e.prompt_tokens + e.completion_tokens) * b.micros_per_1k_tokens + 999) / 1000), 0)::bigint AS "spend_micros!"
           FROM usage_events e LEFT JOIN base_models b ON b.name = e.base_model
           WHERE e.tenant_id = $2 AND ($1::uuid IS NULL OR e.api_key_id = $1)
             AND e.started_at >= $3 AND e.status <> 'rejected'"#,
        key as Option<Uuid>,
        tenant,
        month_start,
    )
    .fetch_one(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::money::cost_micros;
    use crate::usage::{Provenance, UsageEvent, UsageStatus};

    fn event(tenant: Uuid, key: Uuid, base: &str, prompt: i64, completion: i64) -> UsageEvent {
        UsageEvent {
            request_id: Uuid::now_v7(),
            tenant_id: tenant,
            api_key_id: Some(key),
            served_name: base.into(),
            base_model: base.into(),
            adapter: None,
            graph: base.into(),
            price_key: base.into(),
            prompt_tokens: prompt,
            cached_tokens: 0,
            completion_tokens: completion,
            provenance: Provenance::Engine,
            status: UsageStatus::Ok,
            stream: false,
            ttft_ms: None,
            duration_ms: 1,
            started_at: OffsetDateTime::now_utc(),
        }
    }

    /// INVARIANT of `money::cost_micros`: the SQL aggregates price each event exactly as it does.
    #[sqlx::test(migrator = "crate::db::MIGRATOR")]
    async fn sql_spend_agrees_with_cost_micros(pool: PgPool) {
        let tenant = crate::db::accounts::insert_tenant(&pool, "acme", "Acme")
            .await
            .unwrap();
        let key = crate::db::keys::insert(
            &pool,
            &crate::db::keys::NewKey {
                tenant_id: tenant.id,
                name: "k",
                prefix: "tf-abcdefgh",
                sha256: &[7; 32],
            },
        )
        .await
        .unwrap();
        let prices = [
            ("free", 0_i64),
            ("one", 1),
            ("odd", 999),
            ("dear", 1_000_000),
        ];
        let bases: Vec<_> = prices
            .iter()
            .map(|(name, _)| crate::db::catalog::BaseUpsert {
                name,
                graph: name,
                upstream_url: "http://127.0.0.1:1/v1",
                upstream_model: name,
                continuous_usage: true,
                denied_fields: None,
                prompt_estimator: "byte-bound",
            })
            .collect();
        crate::db::catalog::upsert_bases(&pool, "static", &bases)
            .await
            .unwrap();
        for (name, price) in prices {
            sqlx::query!(
                "UPDATE base_models SET micros_per_1k_tokens = $2 WHERE name = $1",
                name,
                price
            )
            .execute(&pool)
            .await
            .unwrap();
        }
        let counts = [
            (0, 0),
            (1, 0),
            (0, 999),
            (500, 500),
            (1000, 1),
            (7, 3),
            (123_456, 789),
        ];
        let mut events = Vec::new();
        let mut expected = 0;
        for (name, price) in prices {
            for (prompt, completion) in counts {
                events.push(event(tenant.id, key.id, name, prompt, completion));
                expected += cost_micros(u64::try_from(prompt + completion).unwrap(), price);
            }
        }
        crate::db::usage::insert_batch(&pool, &events)
            .await
            .unwrap();
        let all = crate::db::limits::RateChange::default();
        let limited = crate::db::limits::Change {
            given: true,
            value: Some(1),
        };
        let rates = crate::db::limits::RateChange {
            spend_limit_micros: limited,
            ..all
        };
        crate::db::limits::update_tenant(&pool, tenant.id, &rates, &Default::default())
            .await
            .unwrap();
        crate::db::limits::update_key(&pool, key.id, tenant.id, &rates)
            .await
            .unwrap();
        let since = OffsetDateTime::now_utc() - time::Duration::hours(1);
        let mut billed = billed_by_limited_subject(&pool, since).await.unwrap();
        billed.sort_by_key(|(s, _)| matches!(s, Subject::Key(_)));
        assert_eq!(
            billed,
            vec![
                (Subject::Tenant(tenant.id), expected),
                (Subject::Key(key.id), expected)
            ]
        );
        let shown = consumption(&pool, tenant.id, Some(key.id), since)
            .await
            .unwrap();
        assert_eq!(shown.spend_micros, expected);
        assert!(expected > 0);
    }
}
