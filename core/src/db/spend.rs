//! Spend billed in PostgreSQL: what the spend reconciler raises Redis's counters to, what the
//! limits pages and `admin limits` show. Refused requests cost nothing (they carry no tokens).
//!
//! Both statements sum `usage_daily.cost_micros`, where each event was priced once, when it was
//! stored, by the one cost function (the price book's rates in effect at its start for the
//! tenant's tier, rounded once per event: migration 20261209100000_one_cost_function.sql, the
//! rule of [`crate::money::line_micros`]). Summing days instead of events keeps a pass over every
//! limited subject a read of a few rows each. The test below proves the figures agree with
//! `line_micros` and with the rater's charge lines.

use sqlx::PgPool;
use time::Date;
use uuid::Uuid;

/// Whose spend a row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Tenant(Uuid),
    Key(Uuid),
}

/// Billed spend of the UTC days from `since` on of every tenant and key that has a spend limit
/// (zero when it has no events).
pub async fn billed_by_limited_subject(
    pool: &PgPool,
    since: Date,
) -> sqlx::Result<Vec<(Subject, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT 't' AS "kind!", l.tenant_id AS "id!",
                  COALESCE(SUM(d.cost_micros), 0)::bigint AS "billed!"
           FROM tenant_limits l
                LEFT JOIN usage_daily d ON d.tenant_id = l.tenant_id AND d.day >= $1
           WHERE l.spend_limit_micros IS NOT NULL
           GROUP BY l.tenant_id
           UNION ALL
           SELECT 'k', l.api_key_id, COALESCE(SUM(d.cost_micros), 0)::bigint
           FROM key_limits l
                LEFT JOIN usage_daily d ON d.tenant_id = l.tenant_id AND d.day >= $1
                                       AND d.api_key_id = l.api_key_id
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
    /// Spend of the UTC days from `since` on, in micro-units.
    pub spend_micros: i64,
}

/// Consumption of a tenant, or of one of its keys when `key` is given; spend since the UTC day
/// `since` (a period's first day).
pub async fn consumption(
    pool: &PgPool,
    tenant: Uuid,
    key: Option<Uuid>,
    since: Date,
) -> sqlx::Result<Consumption> {
    sqlx::query_as!(
        Consumption,
        r#"SELECT count(*) AS "requests_last_minute!",
                  COALESCE(SUM(e.prompt_tokens + e.completion_tokens), 0)::bigint AS "tokens_last_minute!",
                  (SELECT COALESCE(SUM(d.cost_micros), 0)::bigint FROM usage_daily d
                   WHERE d.tenant_id = $2 AND d.day >= $3
                     AND ($1::uuid IS NULL OR d.api_key_id = $1)) AS "spend_micros!"
           FROM usage_events e
           WHERE e.tenant_id = $2 AND ($1::uuid IS NULL OR e.api_key_id = $1)
             AND e.started_at >= now() - interval '1 minute' AND e.status <> 'rejected'"#,
        key as Option<Uuid>,
        tenant,
        since,
    )
    .fetch_one(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::money::{line_micros, Quantities, Rates};
    use crate::usage::{Provenance, UsageEvent, UsageStatus};
    use time::OffsetDateTime;

    fn event(tenant: Uuid, key: Uuid, price_key: &str, q: (i64, i64, i64)) -> UsageEvent {
        UsageEvent {
            request_id: Uuid::now_v7(),
            tenant_id: tenant,
            api_key_id: Some(key),
            served_name: price_key.into(),
            base_model: price_key.into(),
            adapter: None,
            graph: price_key.into(),
            price_key: price_key.into(),
            prompt_tokens: q.0 + q.1,
            cached_tokens: q.1,
            completion_tokens: q.2,
            reasoning_tokens: 0,
            endpoint: crate::endpoint::Endpoint::Chat,
            provenance: Provenance::Engine,
            status: UsageStatus::Ok,
            stream: false,
            ttft_ms: None,
            duration_ms: 1,
            started_at: OffsetDateTime::now_utc(),
        }
    }

    fn rates(fresh_per_m: i64, cached_per_m: i64, output_per_m: i64) -> Rates {
        Rates {
            fresh_per_m,
            cached_per_m,
            output_per_m,
        }
    }

    /// INVARIANT of the one cost function: the stored spend prices each event as
    /// `money::line_micros` does (the tenant's tier, else 'standard'; no price: 0; refused: 0),
    /// and equals what the rater charges for the same events.
    #[sqlx::test(migrator = "crate::db::MIGRATOR")]
    async fn sql_spend_agrees_with_line_micros_and_the_rater(pool: PgPool) {
        let tenant = crate::db::accounts::insert_tenant(&pool, "acme", "Acme")
            .await
            .unwrap();
        crate::db::billing::add_tier(&pool, "gold").await.unwrap();
        assert!(
            crate::db::billing::set_tenant_tier(&pool, tenant.id, "gold")
                .await
                .unwrap()
        );
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
        // (key, the rates the gold tenant pays): "odd" has a gold price beside its standard
        // one, the others fall back to standard, "none" has no price at all.
        let paid = [
            ("free", rates(0, 0, 0)),
            ("one", rates(1_000_000, 1_000_000, 1_000_000)),
            ("odd", rates(999, 333_333, 1_234_567)),
            ("dear", rates(1_000_000_000, 250_000_000, 4_000_000_000)),
            ("none", rates(0, 0, 0)),
        ];
        crate::db::billing::set_prices(
            &pool,
            OffsetDateTime::now_utc() - time::Duration::hours(2),
            &[
                ("free", "standard", paid[0].1),
                ("one", "standard", paid[1].1),
                ("odd", "standard", rates(5_000_000, 5_000_000, 5_000_000)),
                ("odd", "gold", paid[2].1),
                ("dear", "standard", paid[3].1),
            ],
            "test",
        )
        .await
        .unwrap()
        .unwrap();
        // (fresh, cached, output)
        let counts = [
            (0, 0, 0),
            (1, 0, 0),
            (0, 0, 999),
            (500, 7, 500),
            (1000, 0, 1),
            (7, 3, 3),
            (123_456, 4_000, 789),
        ];
        let mut events = Vec::new();
        let mut expected = 0;
        for (name, r) in paid {
            for (fresh, cached, output) in counts {
                events.push(event(tenant.id, key.id, name, (fresh, cached, output)));
                expected += line_micros(
                    Quantities {
                        fresh,
                        cached,
                        output,
                    },
                    r,
                );
            }
        }
        let mut refused = event(tenant.id, key.id, "dear", (10, 0, 10));
        refused.status = UsageStatus::Rejected;
        events.push(refused);
        crate::db::usage::insert_batch(&pool, &events)
            .await
            .unwrap();
        let all = crate::db::limits::RateChange::default();
        let limited = crate::db::limits::Change {
            given: true,
            value: Some(1),
        };
        let limit = crate::db::limits::RateChange {
            spend_limit_micros: limited,
            ..all
        };
        crate::db::limits::update_tenant(&pool, tenant.id, &limit, &Default::default())
            .await
            .unwrap();
        crate::db::limits::update_key(&pool, key.id, tenant.id, &limit)
            .await
            .unwrap();
        let since = OffsetDateTime::now_utc().date() - time::Duration::days(1);
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
        // The days after today hold nothing.
        let tomorrow = OffsetDateTime::now_utc().date() + time::Duration::days(1);
        let later = consumption(&pool, tenant.id, None, tomorrow).await.unwrap();
        assert_eq!(later.spend_micros, 0);

        let run = crate::db::billing::live_run(&pool).await.unwrap();
        crate::db::billing::drain(&pool, run, 1000).await.unwrap();
        let rated: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(amount_micros), 0)::bigint FROM charge_lines
             WHERE run_id = $1 AND tenant_id = $2",
        )
        .bind(run)
        .bind(tenant.id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(rated, expected);
    }
}
