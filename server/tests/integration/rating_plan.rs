//! The rater's batch stays linear in its own size whatever the plan cache holds (issue 35): a
//! pooled connection that has called `billing_rate_batch` on an empty queue many times (so
//! PL/pgSQL would have cached a generic plan) still takes a batch from a long queue without
//! reading the queue. And the integrity charge_lines' foreign keys gave is kept by the
//! statement-level check that replaced them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sqlx::{Connection, PgConnection, PgPool};
use tf_core::db::billing;
use uuid::Uuid;

async fn tenant(pool: &PgPool) -> Uuid {
    tf_core::db::accounts::insert_tenant(pool, "plan", "Plan")
        .await
        .unwrap()
        .id
}

/// `n` unrated events of `tenant`, through the real triggers (so they are queued for rating).
async fn queue_events(pool: &PgPool, tenant: Uuid, n: i64) {
    sqlx::query(
        "INSERT INTO usage_events (request_id, tenant_id, served_name, base_model, graph,
             price_key, prompt_tokens, cached_tokens, completion_tokens, provenance, status,
             stream, duration_ms, started_at)
         SELECT gen_random_uuid(), $1, 'm', 'm', 'm', 'm', 10, 0, 5, 'engine', 'ok', false, 1,
                now() - i * interval '1 ms'
         FROM generate_series(1, $2) i",
    )
    .bind(tenant)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

async fn batch(conn: &mut PgConnection, run: i64, limit: i32) -> i32 {
    sqlx::query_scalar("SELECT billing_rate_batch($1, $2)")
        .bind(run)
        .bind(limit)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Queue rows this transaction read by sequential scan so far (this backend's pending counts).
async fn queue_seq_reads(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT COALESCE(seq_tup_read, 0) FROM pg_stat_xact_user_tables
         WHERE relname = 'rating_queue'",
    )
    .fetch_optional(conn)
    .await
    .unwrap()
    .unwrap_or(0)
}

#[sqlx::test(migrations = "../migrations")]
async fn a_batch_after_idling_on_an_empty_queue_reads_only_its_own_rows(pool: PgPool) {
    let tenant = tenant(&pool).await;
    let run = billing::live_run(&pool).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    // The rater's idle passes: more than the five custom plans after which PL/pgSQL may switch
    // to a cached generic plan.
    for _ in 0..12 {
        assert_eq!(batch(&mut conn, run, 100).await, 0);
    }
    queue_events(&pool, tenant, 3000).await;

    let mut tx = conn.begin().await.unwrap();
    let before = queue_seq_reads(&mut tx).await;
    assert_eq!(batch(&mut tx, run, 100).await, 100);
    let read = queue_seq_reads(&mut tx).await - before;
    tx.commit().await.unwrap();
    // A generic plan scans the whole queue (2,970 rows read here) for every batch.
    assert_eq!(read, 0, "the batch scanned the queue: {read} rows read");

    // And the rest drains on the same connection, each event rated once.
    let mut taken = 100;
    loop {
        let n = batch(&mut conn, run, 500).await;
        if n == 0 {
            break;
        }
        taken += n;
    }
    assert_eq!(taken, 3000);
    let lines: i64 = sqlx::query_scalar("SELECT count(*) FROM charge_lines WHERE run_id = $1")
        .bind(run)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(lines, 3000);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_line_cannot_name_a_missing_run_or_version_and_runs_are_kept(pool: PgPool) {
    let tenant = tenant(&pool).await;
    let run = billing::live_run(&pool).await.unwrap();
    let insert = |run: i64, version: Option<i64>| {
        sqlx::query(
            "INSERT INTO charge_lines (run_id, request_id, tenant_id, price_key, started_at,
                 price_version_id, fresh_tokens, cached_tokens, output_tokens, amount_micros, flag)
             VALUES ($1, $2, $3, 'm', now(), $4, 1, 0, 1, 1, '')",
        )
        .bind(run)
        .bind(Uuid::now_v7())
        .bind(tenant)
        .bind(version)
    };
    let code = |e: sqlx::Error| {
        e.as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.into_owned())
    };
    let missing_run = insert(run + 1000, None).execute(&pool).await.unwrap_err();
    assert_eq!(code(missing_run).as_deref(), Some("23503"));
    let missing_version = insert(run, Some(987_654)).execute(&pool).await.unwrap_err();
    assert_eq!(code(missing_version).as_deref(), Some("23503"));
    insert(run, None).execute(&pool).await.unwrap();

    let deleted = sqlx::query("DELETE FROM rating_runs WHERE id = $1")
        .bind(run)
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(
        code(deleted).as_deref(),
        Some("23000"),
        "a rating run was deleted"
    );
    let renumbered = sqlx::query("UPDATE rating_runs SET id = id + 1000 WHERE id = $1")
        .bind(run)
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(
        code(renumbered).as_deref(),
        Some("23000"),
        "a rating run was renumbered"
    );
}

/// A deterministic stream of numbers (a linear congruential generator): the same events each run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// The rollup's trigger and the rater price each distinct key of a batch once (issue 35); every
/// event must still get what pricing it alone gives: `price_of_event` (the version in effect at
/// its start, the tenant's tier before 'standard', an adapter's own key before its base's), in
/// charge lines, their version, the unpriced flag, the daily rollup's cost, and a re-rate's lines.
/// Events sit before the first version, on version boundaries and across a UTC midnight, for
/// tenants in and out of a tier, on bases and adapters, priced and not, rejected or not.
#[sqlx::test(migrations = "../migrations")]
async fn batch_pricing_equals_pricing_each_event(pool: PgPool) {
    use tf_core::money::Rates;
    use tf_core::usage::{UsageEvent, UsageStatus};
    use time::macros::datetime;
    use time::Duration;

    billing::add_tier(&pool, "gold").await.unwrap();
    let mut tenants = Vec::new();
    for (name, tier) in [("acme", "gold"), ("globex", "standard")] {
        let id = tf_core::db::accounts::insert_tenant(&pool, name, name)
            .await
            .unwrap()
            .id;
        sqlx::query("UPDATE tenants SET tier = $2 WHERE id = $1")
            .bind(id)
            .bind(tier)
            .execute(&pool)
            .await
            .unwrap();
        tenants.push(id);
    }
    // Three versions an hour apart from 23:00, each changing a few of the prices: bases b0 and
    // b1 (b2 never priced), acme's adapter ad0 and globex's ad1 (ad2 never priced), gold and
    // standard.
    let v0 = datetime!(2031-03-04 23:00 UTC);
    let rates = |n: i64| Rates {
        fresh_per_m: 1_000 + n,
        cached_per_m: 100 + n,
        output_per_m: 3_000 + n,
    };
    let books: [&[(&str, &str)]; 3] = [
        &[
            ("b0", "standard"),
            ("b1", "gold"),
            ("adapter:acme/ad0", "standard"),
        ],
        &[
            ("b1", "standard"),
            ("adapter:globex/ad1", "gold"),
            ("b0", "gold"),
        ],
        &[
            ("b0", "standard"),
            ("adapter:acme/ad0", "gold"),
            ("adapter:globex/ad1", "standard"),
        ],
    ];
    let mut versions = Vec::new();
    for (i, book) in books.iter().enumerate() {
        let entries: Vec<(&str, &str, Rates)> = book
            .iter()
            .enumerate()
            .map(|(j, (k, t))| (*k, *t, rates(i64::try_from(i * 10 + j).unwrap())))
            .collect();
        let at = v0 + Duration::hours(i64::try_from(i).unwrap());
        versions.push(
            billing::set_prices(&pool, at, &entries, "test")
                .await
                .unwrap()
                .unwrap(),
        );
    }

    let mut rng = Lcg(7);
    let mut batches: Vec<Vec<UsageEvent>> = vec![Vec::new(); 3];
    for n in 0..600_u64 {
        // Before the first version, on a boundary (exactly, or a microsecond before), or
        // anywhere in the four hours from 22:30.
        let at = match rng.below(4) {
            0 => v0 + Duration::hours(i64::try_from(rng.below(3)).unwrap()),
            1 => {
                v0 + Duration::hours(i64::try_from(rng.below(3)).unwrap())
                    - Duration::microseconds(1)
            }
            _ => {
                v0 - Duration::minutes(30)
                    + Duration::seconds(i64::try_from(rng.below(4 * 3600)).unwrap())
            }
        };
        let tenant = tenants[usize::try_from(rng.below(2)).unwrap()];
        let base = format!("b{}", rng.below(3));
        let adapter = (rng.below(2) == 0).then(|| format!("ad{}", rng.below(3)));
        let prompt = i64::try_from(rng.below(100_000)).unwrap();
        let status = match rng.below(6) {
            0 => UsageStatus::Rejected,
            1 => UsageStatus::ClientAbort,
            _ => UsageStatus::Ok,
        };
        batches[usize::try_from(n % 3).unwrap()].push(UsageEvent {
            served_name: adapter.clone().unwrap_or_else(|| base.clone()),
            base_model: base.clone(),
            adapter,
            graph: base.clone(),
            price_key: base,
            prompt_tokens: prompt,
            cached_tokens: prompt * i64::try_from(rng.below(101)).unwrap() / 100,
            completion_tokens: i64::try_from(rng.below(20_000)).unwrap(),
            status,
            ..stored_event(tenant, at)
        });
    }
    for batch in &batches {
        tf_core::db::usage::insert_batch(&pool, batch)
            .await
            .unwrap();
    }
    let live = billing::live_run(&pool).await.unwrap();
    billing::drain(&pool, live, 250).await.unwrap();

    // Each event priced alone: its version, and its amount (None: no price) under `version`
    // (the one in effect at its start when None).
    let alone = |version: Option<i64>| {
        sqlx::query_as::<_, (Uuid, Option<i64>, Option<i64>)>(
            "SELECT e.request_id, v.id,
                    (SELECT line_amount(e.prompt_tokens - e.cached_tokens, e.cached_tokens,
                                        e.completion_tokens, p.fresh_input_per_m,
                                        p.cached_input_per_m, p.output_per_m)
                     FROM price_in_version(v.id, e.tenant_id, e.price_key, e.served_name,
                                           e.adapter IS NOT NULL) p)
             FROM usage_events e
                  LEFT JOIN LATERAL (
                      SELECT COALESCE($1, (SELECT pv.id FROM price_versions pv
                                           WHERE pv.book = 'default'
                                             AND pv.effective_from <= e.started_at
                                           ORDER BY pv.effective_from DESC LIMIT 1)) AS id) v
                  ON true
             WHERE e.status <> 'rejected'",
        )
        .bind(version)
        .fetch_all(&pool)
    };
    let lines = |run: i64| {
        sqlx::query_as::<_, (Uuid, Option<i64>, i64, String)>(
            "SELECT request_id, price_version_id, amount_micros, flag FROM charge_lines
             WHERE run_id = $1",
        )
        .bind(run)
        .fetch_all(&pool)
    };
    let check = |want: Vec<(Uuid, Option<i64>, Option<i64>)>,
                 got: Vec<(Uuid, Option<i64>, i64, String)>| {
        let got: std::collections::HashMap<Uuid, (Option<i64>, i64, String)> = got
            .into_iter()
            .map(|(id, v, amount, flag)| (id, (v, amount, flag)))
            .collect();
        assert_eq!(got.len(), want.len(), "one line per event not rejected");
        let mut priced = 0;
        for (id, version, amount) in want {
            let (v, a, flag) = &got[&id];
            assert_eq!((*v, *a), (version, amount.unwrap_or(0)), "event {id}");
            assert_eq!(
                flag == "unpriced",
                amount.is_none(),
                "event {id}: flag {flag}"
            );
            priced += usize::from(amount.is_some());
        }
        priced
    };
    let priced = check(alone(None).await.unwrap(), lines(live).await.unwrap());
    assert!(priced > 100, "only {priced} of the events had a price");

    // The rollup's cost per day and model: the sum of the events' own amounts.
    let mismatched: Vec<(Uuid, String, Option<i64>, Option<i64>)> = sqlx::query_as(
        "WITH each AS (
             SELECT e.tenant_id, (e.started_at AT TIME ZONE 'UTC')::date AS day, e.served_name,
                    e.base_model,
                    CASE WHEN e.status = 'rejected' THEN 0 ELSE COALESCE(
                        (SELECT line_amount(e.prompt_tokens - e.cached_tokens, e.cached_tokens,
                                            e.completion_tokens, p.fresh_input_per_m,
                                            p.cached_input_per_m, p.output_per_m)
                         FROM price_of_event(e.tenant_id, e.price_key, e.served_name,
                                             e.adapter IS NOT NULL, e.started_at) p), 0) END
                        AS amount
             FROM usage_events e)
         SELECT tenant_id, served_name, d.cost_micros, w.cost::bigint
         FROM usage_daily d
              FULL JOIN (SELECT tenant_id, day, served_name, base_model, sum(amount) AS cost
                         FROM each GROUP BY 1, 2, 3, 4) w
              USING (tenant_id, day, served_name, base_model)
         WHERE d.cost_micros IS DISTINCT FROM w.cost",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(mismatched.is_empty(), "rollup cost differs: {mismatched:?}");
    let days: i64 = sqlx::query_scalar("SELECT count(DISTINCT day) FROM usage_daily")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(days, 2, "the events cross a UTC midnight");

    // A re-rate of each tenant under the middle version prices every event by that version.
    for tenant in &tenants {
        let run = billing::rerate(
            &pool,
            *tenant,
            v0 - Duration::hours(1),
            v0 + Duration::hours(4),
            versions[1],
            "test",
        )
        .await
        .unwrap();
        let want: Vec<_> = alone(Some(versions[1])).await.unwrap();
        let ids: std::collections::HashSet<Uuid> = batches
            .iter()
            .flatten()
            .filter(|e| e.tenant_id == *tenant)
            .map(|e| e.request_id)
            .collect();
        let want = want.into_iter().filter(|w| ids.contains(&w.0)).collect();
        check(want, lines(run).await.unwrap());
    }
}

/// A small stored event of `tenant` (the shipper's insert).
fn stored_event(tenant: Uuid, at: time::OffsetDateTime) -> tf_core::usage::UsageEvent {
    crate::common::usage_event::stored(tenant, at, (10, 2, 5))
}

/// How many times each of a tenant's events is counted: (events stored, queued, in the daily
/// rollup, live lines, distinct live lines).
async fn counts(pool: &PgPool, tenant: Uuid) -> (i64, i64, i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM usage_events WHERE tenant_id = $1),
                (SELECT count(*) FROM rating_queue WHERE tenant_id = $1),
                (SELECT COALESCE(sum(requests), 0)::bigint FROM usage_daily WHERE tenant_id = $1),
                (SELECT count(*) FROM charge_lines WHERE tenant_id = $1),
                (SELECT count(DISTINCT request_id) FROM charge_lines WHERE tenant_id = $1)",
    )
    .bind(tenant)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The shipper inserts plainly and only a batch that meets a stored event (a replay after a
/// crash) or holds one twice is inserted again with ON CONFLICT (migration
/// 20261223100000_plain_inserts.sql): such a batch still stores, queues and rolls up only what
/// is new.
#[sqlx::test(migrations = "../migrations")]
async fn a_batch_replayed_with_stored_and_doubled_events_counts_each_once(pool: PgPool) {
    let tenant = tenant(&pool).await;
    let now = time::OffsetDateTime::now_utc();
    let events: Vec<_> = (0..15)
        .map(|i| stored_event(tenant, now - time::Duration::milliseconds(i)))
        .collect();
    let insert = tf_core::db::usage::insert_batch;
    assert_eq!(insert(&pool, &events[..10]).await.unwrap(), 10);
    assert_eq!(counts(&pool, tenant).await, (10, 10, 10, 0, 0));

    // Five stored already, five new, one of the new twice.
    let mut replay = events[5..].to_vec();
    replay.push(events[12].clone());
    assert_eq!(insert(&pool, &replay).await.unwrap(), 5);
    assert_eq!(counts(&pool, tenant).await, (15, 15, 15, 0, 0));
    // A batch of events all stored stores nothing.
    assert_eq!(insert(&pool, &events).await.unwrap(), 0);

    let live = billing::live_run(&pool).await.unwrap();
    assert_eq!(billing::drain(&pool, live, 4).await.unwrap(), 15);
    assert_eq!(counts(&pool, tenant).await, (15, 0, 15, 15, 15));
    let rolled: i64 = sqlx::query_scalar(
        "SELECT sum(events)::bigint FROM rated_daily WHERE run_id = $1 AND tenant_id = $2",
    )
    .bind(live)
    .bind(tenant)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(rolled, 15);
}

/// Two batches of one re-rate at once (a draft built while the re-rate drains) write each line
/// once and neither fails: the second waits for the first's cursor, then walks on from it. The
/// lines' `NOT EXISTS` (migration 20261223100000_plain_inserts.sql) cannot see uncommitted lines,
/// so a second batch that did not wait would fail on their key.
#[sqlx::test(migrations = "../migrations")]
async fn two_batches_of_one_rerate_at_once_write_each_line_once(pool: PgPool) {
    let tenant = tenant(&pool).await;
    queue_events(&pool, tenant, 300).await;
    let now = time::OffsetDateTime::now_utc();
    let version = billing::set_price(
        &pool,
        now - time::Duration::days(1),
        "m",
        "standard",
        tf_core::money::Rates {
            fresh_per_m: 1_000_000,
            cached_per_m: 0,
            output_per_m: 2_000_000,
        },
        "test",
    )
    .await
    .unwrap()
    .unwrap();
    let run: i64 = sqlx::query_scalar(
        "INSERT INTO rating_runs (kind, tenant_id, period_start, period_end, price_version_id)
         VALUES ('rerate', $1, $2, $3, $4) RETURNING id",
    )
    .bind(tenant)
    .bind(now - time::Duration::hours(1))
    .bind(now + time::Duration::hours(1))
    .bind(version)
    .fetch_one(&pool)
    .await
    .unwrap();

    // One batch done, so the cursor row exists (a first batch's insert of it would itself make
    // the second wait).
    assert_eq!(batch(&mut pool.acquire().await.unwrap(), run, 50).await, 50);
    let mut first = pool.begin().await.unwrap();
    assert_eq!(batch(&mut first, run, 150).await, 150);
    // The second starts while the first's lines are uncommitted.
    #[allow(
        clippy::disallowed_methods,
        reason = "the test awaits the task below; no shutdown to wait for"
    )]
    let second = tokio::spawn({
        let pool = pool.clone();
        async move { billing::rate_batch(&pool, run, 200).await }
    });
    // Until the first commits, the second waits on the cursor (it holds no other lock a
    // statement here would meet): the first's commit below is what releases it.
    let waiting: i64 = loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'
               AND query LIKE '%billing_rate_batch%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if n > 0 || second.is_finished() {
            break n;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(waiting, 1, "the second batch did not wait for the first");
    first.commit().await.unwrap();
    let taken = second.await.unwrap().expect("the second batch failed");
    assert_eq!(
        taken, 100,
        "the second batch walks on from the first's cursor"
    );

    let (lines, distinct, amount): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT request_id), COALESCE(sum(amount_micros), 0)::bigint
         FROM charge_lines WHERE run_id = $1",
    )
    .bind(run)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((lines, distinct), (300, 300));
    // 10 fresh input tokens at 1 and 5 output at 2 per token: 20 each.
    assert_eq!(amount, 300 * 20);
    let rolled: i64 =
        sqlx::query_scalar("SELECT sum(events)::bigint FROM rated_daily WHERE run_id = $1")
            .bind(run)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(rolled, 300);
}
