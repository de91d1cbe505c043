//! Periods and corrections on real PostgreSQL (issue 31): a month is issued only once its period
//! has ended and its final draft is built; an early close ends the period at an instant and the
//! rest goes to the next invoice (every event on exactly one); a re-rate covers its part of the
//! month and the live run the rest, the draft keeps the runs and the scheduler's rebuild keeps
//! them too, every build audited; prices are never backdated; credit expires at its instant.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;

use sqlx::PgPool;
use tf_core::accounts::AccountError;
use tf_core::billing_ops::{self as ops, NewGrant, NewPrice};
use tf_core::db::billing::{self, Draft, Issue, Runs};
use tf_core::db::periods::{self, Segment};
use tf_core::money::Rates;
use tf_core::operator::Actor;
use tf_core::period::month_of;
use tf_core::usage::UsageEvent;
use time::macros::{date, datetime};
use time::{Duration, OffsetDateTime};
use tokenfactory::billing::rater::{self, Drafts, RaterOptions};
use uuid::Uuid;

fn event(tenant: Uuid, at: OffsetDateTime) -> UsageEvent {
    crate::common::usage_event::stored(tenant, at, (10, 3, 7))
}

const FULL: Rates = Rates {
    fresh_per_m: 1_000_000,
    cached_per_m: 500_000,
    output_per_m: 2_000_000,
};
/// 7 + 1.5 + 14 = 22.5 -> 23 per event under [`FULL`].
const PER_EVENT: i64 = 23;

async fn tenant(pool: &PgPool, name: &str) -> Uuid {
    tf_core::db::accounts::insert_tenant(pool, name, name)
        .await
        .unwrap()
        .id
}

/// Stores and rates events of `tenant` at these times.
async fn rated(pool: &PgPool, tenant: Uuid, at: &[OffsetDateTime]) -> Vec<UsageEvent> {
    let events: Vec<_> = at.iter().map(|t| event(tenant, *t)).collect();
    tf_core::db::usage::insert_batch(pool, &events)
        .await
        .unwrap();
    let live = billing::live_run(pool).await.unwrap();
    billing::drain(pool, live, 1000).await.unwrap();
    events
}

async fn priced(pool: &PgPool) {
    billing::set_price(
        pool,
        datetime!(2000-01-01 0:00 UTC),
        "m",
        "standard",
        FULL,
        "t",
    )
    .await
    .unwrap()
    .unwrap();
}

fn built(d: Draft) -> Uuid {
    match d {
        Draft::Built(id) => id,
        other => panic!("not built: {other:?}"),
    }
}

async fn total(pool: &PgPool, tenant: Uuid, id: Uuid) -> i64 {
    billing::invoice(pool, tenant, id)
        .await
        .unwrap()
        .unwrap()
        .total_micros
}

async fn line_ids(pool: &PgPool, tenant: Uuid, id: Uuid) -> Vec<Uuid> {
    billing::invoice_lines(pool, tenant, id)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.request_id)
        .collect()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_month_is_issued_only_after_it_closed_and_close_early_moves_the_rest_on(pool: PgPool) {
    let t = tenant(&pool, "acme").await;
    priced(&pool).await;
    let close = datetime!(2026-05-20 12:00 UTC);
    let may_events = rated(
        &pool,
        t,
        &[
            datetime!(2026-05-10 12:00 UTC),
            close - Duration::microseconds(1),
            close,
            datetime!(2026-05-31 23:59:59 UTC),
            datetime!(2026-06-03 08:00 UTC),
        ],
    )
    .await;
    let (may, june) = (date!(2026 - 05 - 01), date!(2026 - 06 - 01));

    // The open month cannot be issued.
    let now = OffsetDateTime::now_utc();
    rated(&pool, t, &[now - Duration::seconds(1)]).await;
    let open = built(
        ops::build_draft(&pool, &Actor::CLI, t, month_of(now), Runs::Kept)
            .await
            .unwrap(),
    );
    let refused = ops::issue(&pool, &Actor::CLI, open).await;
    assert!(
        matches!(&refused, Err(AccountError::Invalid(m)) if m.contains("open until")),
        "{refused:?}"
    );
    assert_eq!(
        billing::issue(&pool, open, "t").await.unwrap(),
        Issue::Open(
            (month_of(now) + Duration::days(40))
                .replace_day(1)
                .unwrap()
                .midnight()
                .assume_utc()
        )
    );

    // Close May early at the instant: May keeps what started before it, June gets the rest.
    ops::close_period(&pool, &Actor::CLI, t, "acme", may, close)
        .await
        .unwrap();
    assert_eq!(
        periods::period(&pool, t, may).await.unwrap(),
        (datetime!(2026-05-01 0:00 UTC), close)
    );
    assert_eq!(
        periods::period(&pool, t, june).await.unwrap(),
        (close, datetime!(2026-07-01 0:00 UTC))
    );
    // A close is never moved, and lies inside its month.
    for at in [close - Duration::hours(1), datetime!(2026-06-01 0:00 UTC)] {
        assert!(matches!(
            ops::close_period(&pool, &Actor::CLI, t, "acme", may, at).await,
            Err(AccountError::Invalid(_))
        ));
    }
    assert!(matches!(
        ops::close_period(
            &pool,
            &Actor::CLI,
            t,
            "acme",
            june,
            datetime!(2026-05-31 0:00 UTC)
        )
        .await,
        Err(AccountError::Invalid(_))
    ));

    let may_id = built(
        billing::build_draft(&pool, t, may, Runs::Kept)
            .await
            .unwrap(),
    );
    let june_id = built(
        billing::build_draft(&pool, t, june, Runs::Kept)
            .await
            .unwrap(),
    );
    assert_eq!(total(&pool, t, may_id).await, 2 * PER_EVENT);
    assert_eq!(total(&pool, t, june_id).await, 3 * PER_EVENT);
    let may_lines = line_ids(&pool, t, may_id).await;
    let june_lines = line_ids(&pool, t, june_id).await;
    assert_eq!(
        may_lines,
        may_events[..2]
            .iter()
            .map(|e| e.request_id)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        june_lines,
        may_events[2..]
            .iter()
            .map(|e| e.request_id)
            .collect::<Vec<_>>()
    );

    // A draft built before its period ended is not the final one.
    sqlx::query("UPDATE invoices SET built_at = covers_until - interval '1 second' WHERE id = $1")
        .bind(may_id)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        billing::issue(&pool, may_id, "t").await.unwrap(),
        Issue::NotFinal(close)
    );
    built(
        billing::build_draft(&pool, t, may, Runs::Kept)
            .await
            .unwrap(),
    );
    ops::issue(&pool, &Actor::CLI, may_id).await.unwrap();
    ops::issue(&pool, &Actor::CLI, june_id).await.unwrap();
    // An issued month is not closed again.
    assert!(matches!(
        ops::close_period(
            &pool,
            &Actor::CLI,
            t,
            "acme",
            june,
            datetime!(2026-06-10 0:00 UTC)
        )
        .await,
        Err(AccountError::Invalid(_))
    ));
    // Every event of May and June on exactly one issued invoice, once.
    let all: Vec<Uuid> = may_lines.iter().chain(&june_lines).copied().collect();
    let once: HashSet<Uuid> = all.iter().copied().collect();
    assert_eq!(all.len(), once.len());
    assert_eq!(once, may_events.iter().map(|e| e.request_id).collect());
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'period.close'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(audited, 1);
}

#[sqlx::test(migrations = "../migrations")]
async fn a_rerate_covers_its_part_the_live_run_the_rest_and_rebuilds_keep_it(pool: PgPool) {
    let t = tenant(&pool, "acme").await;
    // v1 charges output only (1 per token: 7 per event); v2, the live price, 23 per event.
    let v1 = billing::set_price(
        &pool,
        datetime!(1999-01-01 0:00 UTC),
        "m",
        "standard",
        Rates {
            fresh_per_m: 0,
            cached_per_m: 0,
            output_per_m: 1_000_000,
        },
        "t",
    )
    .await
    .unwrap()
    .unwrap();
    priced(&pool).await;
    let events = rated(
        &pool,
        t,
        &[
            datetime!(2026-05-03 09:00 UTC),
            datetime!(2026-05-10 12:00 UTC),
            datetime!(2026-05-10 18:00 UTC),
            datetime!(2026-05-20 00:00 UTC),
        ],
    )
    .await;
    let may = date!(2026 - 05 - 01);
    let (from, until) = (
        datetime!(2026-05-10 15:00 UTC),
        datetime!(2026-05-25 0:00 UTC),
    );
    let run = ops::rerate(&pool, &Actor::CLI, t, "acme", from, until, v1)
        .await
        .unwrap();
    let live = billing::live_run(&pool).await.unwrap();

    // Built from the re-rate: its two events at 7, the other two live at 23.
    let id = built(
        ops::build_draft(&pool, &Actor::CLI, t, may, Runs::Chosen(&[run]))
            .await
            .unwrap(),
    );
    let want = 2 * 7 + 2 * PER_EVENT;
    assert_eq!(total(&pool, t, id).await, want);
    let entries = billing::invoice_entries(&pool, t, id).await.unwrap();
    assert_eq!(entries.iter().map(|e| e.events).sum::<i64>(), 4);
    assert_eq!(
        periods::sources(&pool, id).await.unwrap(),
        vec![
            Segment {
                run: live,
                from: datetime!(2026-05-01 0:00 UTC),
                until: from
            },
            Segment { run, from, until },
            Segment {
                run: live,
                from: until,
                until: datetime!(2026-06-01 0:00 UTC)
            },
        ]
    );
    let csv = billing::invoice_lines(&pool, t, id).await.unwrap();
    assert_eq!(csv.len(), events.len());
    assert_eq!(csv.iter().map(|l| l.amount_micros).sum::<i64>(), want);

    // The scheduler's rebuild (the closed month's final draft) keeps the choice, audited.
    let options = RaterOptions::default();
    let mut state = Drafts::default();
    let b = rater::drafts_tick(&pool, datetime!(2026-06-01 02:00 UTC), &options, &mut state)
        .await
        .unwrap();
    assert_eq!(b.closed, 1);
    assert_eq!(total(&pool, t, id).await, want, "the re-rate is kept");
    let actors: Vec<String> = sqlx::query_scalar(
        "SELECT actor FROM audit_log WHERE action = 'invoice.build' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(actors, ["cli", "scheduler"]);

    // Overlapping runs and another tenant's run are refused; nothing changes.
    let overlapping = ops::rerate(
        &pool,
        &Actor::CLI,
        t,
        "acme",
        datetime!(2026-05-01 0:00 UTC),
        datetime!(2026-05-11 0:00 UTC),
        v1,
    )
    .await
    .unwrap();
    let refused = billing::build_draft(&pool, t, may, Runs::Chosen(&[run, overlapping]))
        .await
        .unwrap();
    assert!(
        matches!(refused, Draft::RunRefused(r) if r == run || r == overlapping),
        "{refused:?}"
    );
    let other = tenant(&pool, "globex").await;
    let theirs = ops::rerate(&pool, &Actor::CLI, other, "globex", from, until, v1)
        .await
        .unwrap();
    assert_eq!(
        billing::build_draft(&pool, t, may, Runs::Chosen(&[theirs]))
            .await
            .unwrap(),
        Draft::RunRefused(theirs)
    );
    assert_eq!(total(&pool, t, id).await, want);

    // Back to the live run alone: every event at 23.
    built(
        billing::build_draft(&pool, t, may, Runs::Chosen(&[]))
            .await
            .unwrap(),
    );
    assert_eq!(total(&pool, t, id).await, 4 * PER_EVENT);
}

#[sqlx::test(migrations = "../migrations")]
async fn prices_never_start_in_the_past(pool: PgPool) {
    let t = tenant(&pool, "acme").await;
    let price = |output_per_m| NewPrice {
        price_key: "m".into(),
        tier: "standard".into(),
        rates: Rates {
            fresh_per_m: 0,
            cached_per_m: 0,
            output_per_m,
        },
    };
    let before = billing::versions(&pool).await.unwrap().len();
    let now = OffsetDateTime::now_utc();
    let back = ops::set_prices(
        &pool,
        &Actor::CLI,
        Some(now - Duration::minutes(4)),
        &[price(1)],
    )
    .await;
    assert!(
        matches!(&back, Err(AccountError::Invalid(m)) if m == ops::FORWARD_ONLY),
        "{back:?}"
    );
    assert!(ops::FORWARD_ONLY.contains("re-rate"));
    // An event recorded later than now (a replica's clock ahead): not before it either.
    let ahead = now + Duration::minutes(30);
    rated(&pool, t, &[ahead]).await;
    assert!(ops::set_prices(
        &pool,
        &Actor::CLI,
        Some(ahead - Duration::minutes(1)),
        &[price(2)]
    )
    .await
    .is_err());
    let (_, from) = ops::set_prices(&pool, &Actor::CLI, None, &[price(3)])
        .await
        .unwrap();
    assert!(from > ahead, "now means after the last event: {from}");
    assert_eq!(billing::versions(&pool).await.unwrap().len(), before + 1);
}

#[sqlx::test(migrations = "../migrations")]
async fn credit_expires_at_its_instant_and_an_expired_grant_is_refused(pool: PgPool) {
    let t = tenant(&pool, "acme").await;
    priced(&pool).await;
    rated(&pool, t, &[datetime!(2026-05-10 12:00 UTC)]).await;
    let now = OffsetDateTime::now_utc();
    let grant = |expires_at| NewGrant {
        tenant: t,
        tenant_name: "acme",
        amount_micros: 10,
        priority: 0,
        expires_at,
        note: "",
    };
    assert!(matches!(
        ops::grant_credit(&pool, &Actor::CLI, &grant(Some(now - Duration::seconds(1)))).await,
        Err(AccountError::Invalid(_))
    ));
    // Expired after May began but before this build: by the month it would have counted.
    billing::grant_credit(&pool, t, 10, 0, Some(now - Duration::seconds(1)), "", "t")
        .await
        .unwrap();
    ops::grant_credit(&pool, &Actor::CLI, &grant(Some(now + Duration::days(1))))
        .await
        .unwrap();
    let id = built(
        billing::build_draft(&pool, t, date!(2026 - 05 - 01), Runs::Kept)
            .await
            .unwrap(),
    );
    let credits: Vec<i64> = billing::invoice_entries(&pool, t, id)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "credit")
        .map(|e| e.amount_micros)
        .collect();
    assert_eq!(credits, [-10], "only the unexpired grant burns");
    assert_eq!(total(&pool, t, id).await, PER_EVENT - 10);
}
