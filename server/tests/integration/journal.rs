//! The usage journal against real PostgreSQL: shipping, replay after a crash between insert and
//! cursor write, torn tails, and PostgreSQL outages through a proxy the test controls.

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::chaos::ChaosProxy;
use common::eventually::eventually;
use sqlx::PgPool;
use tokenfactory::journal::{segment, Durability, Journal, JournalMetrics, Shipper};
use tokenfactory::usage::{Provenance, UsageEvent, UsageStatus};
use tokenfactory::usage_store;
use uuid::Uuid;

async fn tenant(pool: &PgPool) -> Uuid {
    tf_core::accounts::create_tenant(pool, "acme", "Acme")
        .await
        .unwrap()
        .id
}

fn event(tenant: Uuid, n: i64) -> UsageEvent {
    UsageEvent {
        request_id: Uuid::now_v7(),
        tenant_id: tenant,
        api_key_id: None,
        served_name: "m".into(),
        base_model: "b".into(),
        adapter: None,
        graph: "g".into(),
        price_key: "b".into(),
        prompt_tokens: n,
        cached_tokens: 0,
        completion_tokens: 2 * n,
        reasoning_tokens: 0,
        endpoint: tokenfactory::endpoint::Endpoint::Chat,
        provenance: Provenance::Engine,
        status: UsageStatus::Ok,
        stream: false,
        ttft_ms: None,
        duration_ms: 1,
        started_at: time::OffsetDateTime::now_utc()
            .replace_nanosecond(0)
            .unwrap(),
    }
}

async fn sums(pool: &PgPool) -> (i64, i64) {
    let r = sqlx::query!(
        r#"SELECT count(*) AS "rows!", coalesce(sum(completion_tokens), 0)::bigint AS "completion!" FROM usage_events"#
    )
    .fetch_one(pool)
    .await
    .unwrap();
    (r.rows, r.completion)
}

fn open(dir: &std::path::Path, level: Durability) -> Arc<Journal> {
    Arc::new(
        Journal::open(
            dir,
            level,
            Duration::from_millis(5),
            Arc::new(JournalMetrics::default()),
        )
        .unwrap(),
    )
}

#[sqlx::test(migrations = "../migrations")]
async fn appended_events_ship_once_in_either_durability(pool: PgPool) {
    let t = tenant(&pool).await;
    for level in [Durability::Process, Durability::Machine] {
        let dir = tempfile::tempdir().unwrap();
        let journal = open(dir.path(), level);
        let events: Vec<_> = (1..=3000).map(|n| event(t, n)).collect();
        futures::future::join_all(events.iter().map(|e| journal.append(e)))
            .await
            .into_iter()
            .for_each(|r| r.unwrap());
        assert_eq!(journal.metrics.journaled.load(Ordering::Relaxed), 3000);
        if level == Durability::Machine {
            assert!(
                journal.metrics.fsyncs.load(Ordering::Relaxed) < 3000,
                "group commit shares fsyncs"
            );
        }
        let shipper = Shipper::new(dir.path().to_owned(), pool.clone(), journal.metrics.clone());
        shipper.drain(Duration::from_secs(10)).await.unwrap();
        assert_eq!(journal.metrics.shipped.load(Ordering::Relaxed), 3000);
        journal.close();
    }
    let (n, completion) = sums(&pool).await;
    assert_eq!(n, 6000);
    assert_eq!(completion, 2 * 2 * (3000 * 3001 / 2));
}

#[sqlx::test(migrations = "../migrations")]
async fn replay_after_a_crash_between_insert_and_cursor_counts_once(pool: PgPool) {
    let t = tenant(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path(), Durability::Process);
    for n in 1..=500 {
        journal.append(&event(t, n)).await.unwrap();
    }
    let shipper = Shipper::new(dir.path().to_owned(), pool.clone(), journal.metrics.clone());
    shipper.drain(Duration::from_secs(10)).await.unwrap();
    journal.close();
    drop(journal);
    // The crash: PostgreSQL has the rows, the cursor never moved.
    segment::write_cursor(dir.path(), segment::Cursor::default()).unwrap();
    let journal = open(dir.path(), Durability::Process);
    let again = Shipper::new(dir.path().to_owned(), pool.clone(), journal.metrics.clone());
    again.drain(Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        journal.metrics.shipped.load(Ordering::Relaxed),
        500,
        "replayed"
    );
    assert_eq!(
        sums(&pool).await,
        (500, 2 * (500 * 501 / 2)),
        "counted once"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_torn_tail_is_dropped_not_misread(pool: PgPool) {
    let t = tenant(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    {
        let journal = open(dir.path(), Durability::Machine);
        for n in 1..=10 {
            journal.append(&event(t, n)).await.unwrap();
        }
        journal.close();
    }
    // A crash mid-write: half a record at the end.
    let seg = segment::path(dir.path(), 0);
    let torn = tokenfactory::journal::record::encode(&event(t, 1000));
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes.extend_from_slice(&torn[..torn.len() / 2]);
    std::fs::write(&seg, bytes).unwrap();
    let journal = open(dir.path(), Durability::Machine);
    journal.append(&event(t, 11)).await.unwrap();
    let shipper = Shipper::new(dir.path().to_owned(), pool.clone(), journal.metrics.clone());
    shipper.drain(Duration::from_secs(10)).await.unwrap();
    assert_eq!(sums(&pool).await, (11, 2 * 66));
    assert_eq!(journal.metrics.corrupt_records.load(Ordering::Relaxed), 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn postgres_outage_grows_the_backlog_then_drains_once(pool: PgPool) {
    let t = tenant(&pool).await;
    let proxy = ChaosProxy::start("127.0.0.1:5432").await;
    let db = pool.connect_options().get_database().unwrap().to_owned();
    let via_proxy = tf_core::db::connect(&format!("postgres://postgres@{}/{db}", proxy.addr), 4)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path(), Durability::Process);
    let shipper = Arc::new(Shipper::new(
        dir.path().to_owned(),
        via_proxy,
        journal.metrics.clone(),
    ));
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(shipper.clone().run(cancel.clone()));

    proxy.cut();
    for n in 1..=200 {
        let mut e = event(t, n);
        if n == 1 {
            // The oldest unshipped event ended 30 s ago: the lag gauge must say at least that.
            e.started_at -= time::Duration::seconds(30);
        }
        journal.append(&e).await.unwrap();
    }
    let metrics = journal.metrics.clone();
    let on_disk = segment::backlog_bytes(
        dir.path(),
        segment::Cursor::default(),
        journal.metrics.active_segment(),
    )
    .unwrap();
    assert!(on_disk > 0);
    for _ in 0..300 {
        if metrics.ship_failures.load(Ordering::Relaxed) > 0
            && metrics.backlog_bytes.load(Ordering::Relaxed) == on_disk
            && metrics.ship_lag_ms.load(Ordering::Relaxed) >= 30_000
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        metrics.ship_failures.load(Ordering::Relaxed) > 0,
        "shipping failed while PostgreSQL was cut"
    );
    // The gauges are true during the outage, not frozen at the last successful pass.
    assert_eq!(metrics.backlog_bytes.load(Ordering::Relaxed), on_disk);
    let lag = metrics.ship_lag_ms.load(Ordering::Relaxed);
    assert!((30_000..60_000).contains(&lag), "lag {lag} ms");
    assert_eq!(sums(&pool).await.0, 0);

    proxy.restore();
    let shipped = || async {
        let s = sums(&pool).await;
        if s.0 == 200 {
            Ok(s)
        } else {
            Err(s)
        }
    };
    let shipped = eventually(Duration::from_secs(20), "every event shipped", shipped).await;
    assert_eq!(shipped, (200, 2 * (200 * 201 / 2)));
    cancel.cancel();
    task.await.unwrap();
    // Every shipped event is the tenant's own.
    let stored = usage_store::query(&pool, Some(t), None, None)
        .await
        .unwrap();
    assert_eq!(stored.len(), 200);
}

/// Issue 35: a caught-up shipper sleeps instead of scanning the journal 50 times a second; an
/// append wakes it. With the idle recheck set to a minute, only the append's signal can ship the
/// events in time; a gap between appends longer than the old 20 ms tick each time.
#[sqlx::test(migrations = "../migrations")]
async fn an_append_wakes_the_idle_shipper(pool: PgPool) {
    let t = tenant(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path(), Durability::Process);
    let shipper = Arc::new(
        Shipper::new(dir.path().to_owned(), pool.clone(), journal.metrics.clone())
            .waking_on(journal.appended.clone())
            .idle_recheck(Duration::from_secs(60)),
    );
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(shipper.clone().run(cancel.clone()));
    for n in 1..=3 {
        // Caught up and asleep.
        tokio::time::sleep(Duration::from_millis(300)).await;
        journal.append(&event(t, n)).await.unwrap();
        eventually(Duration::from_secs(10), "the append is shipped", || async {
            journal.metrics.shipped.load(Ordering::Relaxed) == n as u64
        })
        .await;
    }
    cancel.cancel();
    task.await.unwrap();
    assert_eq!(sums(&pool).await, (3, 2 * 6));
    journal.close();
}
