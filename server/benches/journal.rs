//! Journal benchmark, in one run: (1) append + ship throughput into PostgreSQL (events/s), (2)
//! the latency each durability level adds to recording an event, at p50/p99, against a baseline
//! that records nothing, under 50 concurrent writers, and (3) what the in-flight log costs:
//! requests recorded per second with their in-flight start and end records against the same
//! appends without them (a ratio of the same run).
//!
//! `cargo bench -p tokenfactory --bench journal` (needs PostgreSQL; recreates database
//! `tokenfactory_bench_journal`). Env: `TF_BENCH_EVENTS` (default 100000).

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenfactory::journal::{Durability, Journal, JournalMetrics, Shipper};
use tokenfactory::usage::{Provenance, UsageEvent, UsageStatus};
use uuid::Uuid;

fn event(tenant: Uuid) -> UsageEvent {
    UsageEvent {
        request_id: Uuid::now_v7(),
        tenant_id: tenant,
        api_key_id: None,
        served_name: "bench-model".into(),
        base_model: "bench-base".into(),
        adapter: None,
        graph: "bench".into(),
        price_key: "bench-base".into(),
        prompt_tokens: 512,
        cached_tokens: 256,
        completion_tokens: 128,
        reasoning_tokens: 0,
        endpoint: tokenfactory::endpoint::Endpoint::Chat,
        provenance: Provenance::Engine,
        status: UsageStatus::Ok,
        stream: true,
        ttft_ms: Some(40),
        duration_ms: 900,
        started_at: time::OffsetDateTime::now_utc(),
    }
}

fn pct(v: &mut [u64], p: f64) -> f64 {
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * p) as usize] as f64
}

/// Records `writers * per_writer` events from `writers` tasks; each with its in-flight start (when
/// forwarded) and end (dropped once journaled) if `inflight`. Returns events per second.
async fn requests_per_sec(
    journal: Arc<Journal>,
    tenant: Uuid,
    inflight: bool,
    writers: usize,
    per_writer: usize,
) -> f64 {
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|_| {
            let journal = journal.clone();
            tokio::spawn(async move {
                for _ in 0..per_writer {
                    let e = event(tenant);
                    let ticket = inflight.then(|| journal.inflight.start(&e, 512));
                    journal.append(&e).await.unwrap();
                    drop(ticket);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (writers * per_writer) as f64 / t0.elapsed().as_secs_f64()
}

async fn latencies(
    journal: Option<Arc<Journal>>,
    tenant: Uuid,
    writers: usize,
    per_writer: usize,
) -> Vec<u64> {
    let tasks: Vec<_> = (0..writers)
        .map(|_| {
            let journal = journal.clone();
            tokio::spawn(async move {
                let mut out = Vec::with_capacity(per_writer);
                for _ in 0..per_writer {
                    let e = event(tenant);
                    let t0 = Instant::now();
                    if let Some(j) = &journal {
                        j.append(&e).await.unwrap();
                    } else {
                        // Journaling off: the event is dropped where it would be recorded.
                        std::hint::black_box(&e);
                    }
                    out.push(t0.elapsed().as_micros() as u64);
                }
                out
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

fn main() {
    let n: usize = std::env::var("TF_BENCH_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let (pool, _) = common::fresh_database("tokenfactory_bench_journal", 8).await;
        let tenant = tf_core::accounts::create_tenant(&pool, "bench", "Bench").await.unwrap().id;

        // (1) Throughput: append n events from 50 writers while the shipper runs.
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(JournalMetrics::default());
        let journal = Arc::new(Journal::open(dir.path(), Durability::Process, Duration::from_millis(5), metrics.clone()).unwrap());
        let shipper = Arc::new(Shipper::new(dir.path().to_owned(), pool.clone(), metrics.clone()));
        let cancel = tokio_util::sync::CancellationToken::new();
        let t0 = Instant::now();
        let ship_task = tokio::spawn(shipper.clone().run(cancel.clone()));
        latencies(Some(journal.clone()), tenant, 50, n / 50).await;
        let appended = t0.elapsed();
        while metrics.shipped.load(Ordering::Relaxed) < (n / 50 * 50) as u64 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let shipped = t0.elapsed();
        cancel.cancel();
        ship_task.await.unwrap();
        let rows: i64 = sqlx::query_scalar!(r#"SELECT count(*) AS "n!" FROM usage_events"#).fetch_one(&pool).await.unwrap();
        println!("journal benchmark: {} events", n / 50 * 50);
        println!(
            "append: {:.0} events/s; append + ship into PostgreSQL: {:.0} events/s (target >= 20000); rows {rows}",
            (n / 50 * 50) as f64 / appended.as_secs_f64(),
            (n / 50 * 50) as f64 / shipped.as_secs_f64()
        );
        journal.close();

        // (2) Latency per durability level against a baseline that records nothing.
        let per = 400;
        let mut base = latencies(None, tenant, 50, per).await;
        let (b50, b99) = (pct(&mut base, 0.5), pct(&mut base, 0.99));
        println!("record latency, 50 concurrent writers: baseline p50 {b50:.0} us p99 {b99:.0} us");
        for level in [Durability::Process, Durability::Machine] {
            let dir = tempfile::tempdir().unwrap();
            let j = Arc::new(Journal::open(dir.path(), level, Duration::from_millis(5), Arc::new(JournalMetrics::default())).unwrap());
            let mut l = latencies(Some(j.clone()), tenant, 50, per).await;
            let (p50, p99) = (pct(&mut l, 0.5), pct(&mut l, 0.99));
            println!(
                "  {level:?}: p50 {p50:.0} us p99 {p99:.0} us; added p50 {:.0} us p99 {:.0} us{}; fsyncs {}",
                p50 - b50,
                p99 - b99,
                if level == Durability::Process { " (target p99 <= 50 us)" } else { "" },
                j.metrics.fsyncs.load(Ordering::Relaxed)
            );
            j.close();
        }

        // (3) The in-flight log: the same appends with and without each request's start and end
        // records, alternated three times so drift hits both alike.
        let dir = tempfile::tempdir().unwrap();
        let j = Arc::new(Journal::open(dir.path(), Durability::Process, Duration::from_millis(5), Arc::new(JournalMetrics::default())).unwrap());
        let per = (n / 50 / 4).max(20);
        let (mut without, mut with) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            without.push(requests_per_sec(j.clone(), tenant, false, 50, per).await);
            with.push(requests_per_sec(j.clone(), tenant, true, 50, per).await);
        }
        let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        println!(
            "in-flight log, 50 writers, {} events a pass, best of 3: without {:.0} events/s, with start + end records {:.0} events/s ({:.2}x)",
            50 * per,
            best(&without),
            best(&with),
            best(&with) / best(&without)
        );
        j.close();
    });
}
