//! Billing benchmark: (1) events rated per second by the live rater's set-based batches
//! (`billing_rate_batch`, target >= 50,000/s), (2) a month's invoice for one tenant built from
//! the rated rollup (target < 10 s for 10,000,000 events). The events are inserted with one SQL
//! statement per million (through the real `usage_events` triggers: usage rollup and rating
//! queue), spread over November 2026 UTC, two price keys and a price change mid-month. Their
//! request ids are time-ordered as the gateway's are (UUIDv7: the millisecond first), so index
//! inserts land where production's do; random ids made every insert a random page once the
//! indexes outgrew PostgreSQL's cache (24,382 events/s rated on that data, 2026-12-03).
//!
//! The rater's connection first idles on the empty queue (as a leader does between traffic), so a
//! plan PL/pgSQL caches for an empty queue is the one that meets the backlog (issue 35: a cached
//! generic plan once made each batch scan the whole queue). Batch times are printed for the
//! first and last tenth of the drain: flat means linear in the batch, not in the queue.
//!
//! `cargo bench -p tokenfactory --bench billing` (needs PostgreSQL; recreates database
//! `tokenfactory_bench_billing`). Env: `TF_BENCH_EVENTS` (default 10000000),
//! `TF_BENCH_BATCH` (events per rating statement, default 20000).

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod common;

use std::time::Instant;

use tf_core::db::billing::{self, Runs};
use tf_core::money::Rates;
use time::macros::{date, datetime};

fn env(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let n = env("TF_BENCH_EVENTS", 10_000_000);
    let batch = i32::try_from(env("TF_BENCH_BATCH", 20_000)).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let (pool, url) = common::fresh_database("tokenfactory_bench_billing", 4).await;
        // The rater's own long-lived connection, idled on the empty queue before the backlog.
        let rater = tf_core::db::connect(&url, 1).await.unwrap();
        let run = billing::live_run(&rater).await.unwrap();
        for _ in 0..50 {
            assert_eq!(billing::rate_batch(&rater, run, batch).await.unwrap(), 0);
        }
        let tenant = tf_core::db::accounts::insert_tenant(&pool, "bench", "Bench")
            .await
            .unwrap();
        let rates = |m: i64| Rates {
            fresh_per_m: 150_000 * m,
            cached_per_m: 75_000 * m,
            output_per_m: 600_000 * m,
        };
        billing::set_prices(
            &pool,
            datetime!(2026-11-01 0:00 UTC),
            &[("llama", "standard", rates(1)), ("qwen", "standard", rates(1))],
            "bench",
        )
        .await
        .unwrap()
        .unwrap();
        billing::set_price(&pool, datetime!(2026-11-15 12:00 UTC), "llama", "standard", rates(2), "bench")
            .await
            .unwrap()
            .unwrap();

        let t = Instant::now();
        let mut inserted = 0;
        while inserted < n {
            let chunk = (n - inserted).min(1_000_000);
            sqlx::query(
                "INSERT INTO usage_events (request_id, tenant_id, served_name, base_model, graph,
                     price_key, prompt_tokens, cached_tokens, completion_tokens, provenance, status,
                     stream, duration_ms, started_at)
                 SELECT (lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7'
                         || substr(md5(i::text), 1, 19))::uuid,
                        $1, k, k, k, k, 100 + i % 4000, (i % 7) * 10,
                        1 + i % 900, CASE WHEN i % 50 = 0 THEN 'estimated' ELSE 'engine' END,
                        CASE WHEN i % 100 = 0 THEN 'rejected' ELSE 'ok' END, true, 5, at
                 FROM (SELECT i, CASE WHEN i % 3 = 0 THEN 'qwen' ELSE 'llama' END AS k,
                              timestamptz '2026-11-01 00:00:00+00'
                                + (i::double precision / $3::bigint::double precision)
                                  * interval '30 days' AS at
                       FROM generate_series($2::bigint, $2::bigint + $4::bigint - 1) i) s",
            )
            .bind(tenant.id)
            .bind(inserted)
            .bind(n)
            .bind(chunk)
            .execute(&pool)
            .await
            .unwrap();
            inserted += chunk;
        }
        println!("billing benchmark");
        println!(
            "inserted {n} events (November 2026 UTC) in {:.1} s",
            t.elapsed().as_secs_f64()
        );

        let t = Instant::now();
        let mut times = Vec::new();
        let mut taken = 0;
        loop {
            let b = Instant::now();
            let n = billing::rate_batch(&rater, run, batch).await.unwrap();
            if n == 0 {
                break;
            }
            times.push(b.elapsed().as_secs_f64());
            taken += n;
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "rated {taken} events in {secs:.1} s: {:.0} events/s (batches of {batch}; target >= 50000/s)",
            taken as f64 / secs
        );
        assert!(!times.is_empty(), "nothing was rated");
        let tenth = (times.len() / 10).max(1);
        let mean = |t: &[f64]| t.iter().sum::<f64>() / t.len().max(1) as f64;
        let (first, last) = (mean(&times[..tenth]), mean(&times[times.len() - tenth..]));
        println!(
            "batch time: first tenth {:.3} s, last tenth {:.3} s (last/first {:.2}; flat is ~1)",
            first,
            last,
            last / first
        );

        let t = Instant::now();
        let draft = billing::build_draft(&pool, tenant.id, date!(2026 - 11 - 01), Runs::Kept)
            .await
            .unwrap();
        let secs = t.elapsed().as_secs_f64();
        let billing::Draft::Built(id) = draft else {
            panic!("no draft: {draft:?}")
        };
        let invoice = billing::invoice(&pool, tenant.id, id).await.unwrap().unwrap();
        let lines: i64 = sqlx::query_scalar(
            "SELECT COALESCE(sum(amount_micros), 0)::bigint FROM charge_lines WHERE run_id = $1",
        )
        .bind(run)
        .fetch_one(&pool)
        .await
        .unwrap();
        println!(
            "invoice of the month ({n} events) built in {:.3} s (target < 10 s): total {} micros, sum of lines {lines}",
            secs, invoice.total_micros
        );
        assert_eq!(invoice.total_micros, lines);
    });
}
