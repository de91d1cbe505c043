//! The usage sinks' contract, run against every `UsageSink` the server assembles (PgSink,
//! JournalSink): once `record` resolves the event is as durable as the sink promises (in
//! PostgreSQL, or in the journal and shipped from it after the process is gone), a retried
//! emission counts once, concurrent records all land, and every field arrives as recorded.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tempfile::TempDir;
use tokenfactory::journal::{Durability, Journal, JournalMetrics, JournalSink, Shipper};
use tokenfactory::usage::{Provenance, UsageEvent, UsageSink, UsageStatus};
use tokenfactory::usage_store::{self, PgSink};
use uuid::Uuid;

/// One implementation under test, and how to bring what it recorded to PostgreSQL.
enum Subject {
    Pg(PgSink),
    Journaled(JournalSink, TempDir),
}

impl Subject {
    fn sink(&self) -> &dyn UsageSink {
        match self {
            Self::Pg(s) => s,
            Self::Journaled(s, _) => s,
        }
    }

    /// Ends the sink (as a crash would leave it) and moves what it made durable to PostgreSQL:
    /// nothing for PgSink (PostgreSQL is where `record` writes); for JournalSink the journal is
    /// dropped unclosed, then opened again and drained by a new shipper, as a restarted process
    /// does.
    async fn settle(self, pool: &PgPool) {
        if let Self::Journaled(sink, dir) = self {
            drop(sink);
            let journal = Journal::open(
                dir.path(),
                Durability::Process,
                Duration::from_millis(5),
                Arc::new(JournalMetrics::default()),
            )
            .unwrap();
            let shipper =
                Shipper::new(dir.path().to_owned(), pool.clone(), journal.metrics.clone());
            shipper.drain(Duration::from_secs(10)).await.unwrap();
            journal.close();
        }
    }
}

fn pg(pool: &PgPool) -> Subject {
    Subject::Pg(PgSink::new(pool.clone()))
}

fn journaled(pool: &PgPool) -> Subject {
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(
        dir.path(),
        Durability::Process,
        Duration::from_millis(5),
        Arc::new(JournalMetrics::default()),
    )
    .unwrap();
    let sink = JournalSink {
        journal: Arc::new(journal),
        pool: pool.clone(),
        spend: None,
    };
    Subject::Journaled(sink, dir)
}

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
        served_name: format!("served-{n}"),
        base_model: "base".into(),
        adapter: (n % 2 == 0).then(|| format!("adapter-{n}")),
        graph: "graph".into(),
        price_key: "price".into(),
        prompt_tokens: n,
        cached_tokens: n / 2,
        completion_tokens: 2 * n,
        reasoning_tokens: 0,
        endpoint: tokenfactory::endpoint::Endpoint::Chat,
        provenance: [
            Provenance::Engine,
            Provenance::Partial,
            Provenance::Estimated,
        ][(n % 3) as usize],
        status: [
            UsageStatus::Ok,
            UsageStatus::ClientAbort,
            UsageStatus::UpstreamError,
            UsageStatus::Interrupted,
        ][(n % 4) as usize],
        stream: n % 2 == 1,
        ttft_ms: (n % 2 == 1).then_some(n as i32),
        duration_ms: 10 + n as i32,
        started_at: time::OffsetDateTime::now_utc()
            .replace_nanosecond(0)
            .unwrap(),
    }
}

async fn stored(pool: &PgPool) -> Vec<UsageEvent> {
    usage_store::query(pool, None, None, None).await.unwrap()
}

/// Once `record` resolves, the event survives the sink and arrives exactly as recorded.
async fn a_recorded_event_is_durable_and_intact(pool: PgPool, make: fn(&PgPool) -> Subject) {
    let t = tenant(&pool).await;
    let subject = make(&pool);
    let events: Vec<_> = (1..=12).map(|n| event(t, n)).collect();
    for e in &events {
        subject.sink().record(e).await.unwrap();
    }
    subject.settle(&pool).await;
    let mut got = stored(&pool).await;
    got.sort_by_key(|e| e.request_id);
    assert_eq!(got, events, "stored events differ from the recorded ones");
}

/// A retried emission (the same request id recorded again) counts once.
async fn a_retried_event_counts_once(pool: PgPool, make: fn(&PgPool) -> Subject) {
    let t = tenant(&pool).await;
    let subject = make(&pool);
    let e = event(t, 3);
    for _ in 0..3 {
        subject.sink().record(&e).await.unwrap();
    }
    subject.settle(&pool).await;
    assert_eq!(stored(&pool).await, vec![e]);
}

/// Concurrent records from many requests all land, each once.
async fn concurrent_records_all_land_once(pool: PgPool, make: fn(&PgPool) -> Subject) {
    let t = tenant(&pool).await;
    let subject = make(&pool);
    let events: Vec<_> = (1..=200).map(|n| event(t, n)).collect();
    futures::future::join_all(events.iter().map(|e| subject.sink().record(e)))
        .await
        .into_iter()
        .for_each(|r| r.unwrap());
    subject.settle(&pool).await;
    let got = stored(&pool).await;
    assert_eq!(got.len(), 200);
    let ids: std::collections::HashSet<_> = got.iter().map(|e| e.request_id).collect();
    assert_eq!(ids.len(), 200);
    assert_eq!(
        got.iter().map(|e| e.completion_tokens).sum::<i64>(),
        2 * (200 * 201 / 2)
    );
}

/// One `#[sqlx::test]` per (property, implementation).
macro_rules! contract {
    ($($property:ident),* $(,)?) => {
        mod pg_sink {
            use super::*;
            $(
                #[sqlx::test(migrations = "../migrations")]
                async fn $property(pool: PgPool) {
                    super::$property(pool, pg).await;
                }
            )*
        }
        mod journal_sink {
            use super::*;
            $(
                #[sqlx::test(migrations = "../migrations")]
                async fn $property(pool: PgPool) {
                    super::$property(pool, journaled).await;
                }
            )*
        }
    };
}

contract!(
    a_recorded_event_is_durable_and_intact,
    a_retried_event_counts_once,
    concurrent_records_all_land_once,
);

/// JournalSink's own promise: when the journal cannot take an event, `record` still resolves
/// only once the event is in PostgreSQL.
#[sqlx::test(migrations = "../migrations")]
async fn journal_sink_falls_back_to_postgres_when_the_journal_is_closed(pool: PgPool) {
    let t = tenant(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let journal = Arc::new(
        Journal::open(
            dir.path(),
            Durability::Process,
            Duration::from_millis(5),
            Arc::new(JournalMetrics::default()),
        )
        .unwrap(),
    );
    journal.close();
    let sink = JournalSink {
        journal,
        pool: pool.clone(),
        spend: None,
    };
    let e = event(t, 5);
    sink.record(&e).await.unwrap();
    assert_eq!(stored(&pool).await, vec![e]);
}
