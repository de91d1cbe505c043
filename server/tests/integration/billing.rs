//! Billing proofs on real PostgreSQL (issue 16): random events and price histories rated by the
//! SQL rater agree with `money::line_micros` under the version in effect at each event's start;
//! every event is charged exactly once per run (rejected never); re-running changes nothing;
//! re-rating under the same prices reproduces the amounts; invoices per UTC month sum their lines;
//! an issued invoice cannot be changed even with raw SQL; credits burn down and come back with a
//! credit note; the exports parse as CloudEvents 1.0 and Lago batch events.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use sqlx::PgPool;
use tf_core::db::billing::{self, Draft, Issue, Runs};
use tf_core::money::{line_micros, Quantities, Rates};
use tf_core::usage::{Provenance, UsageEvent, UsageStatus};
use time::{Date, Duration, Month, OffsetDateTime};
use tokenfactory::billing::export::{self, Format};
use uuid::Uuid;

/// A random event: (month 0..3, near a boundary?, offset seconds, key index, prompt, cached
/// percent, output, status index, provenance index).
type EventSpec = (i64, bool, i64, usize, i64, i64, i64, usize, usize);

/// One random case: price changes and events in a three-month window.
#[derive(Debug, Clone)]
struct Case {
    /// (seconds into the window, key index, rates).
    prices: Vec<(i64, usize, (i64, i64, i64))>,
    events: Vec<EventSpec>,
}

const KEYS: usize = 3; // key 2 is never priced
const DAY: i64 = 86_400;

fn case() -> impl Strategy<Value = Case> {
    let price = (
        0..90 * DAY,
        0..KEYS - 1,
        (0..5_000_000_i64, 0..5_000_000_i64, 0..5_000_000_i64),
    );
    let event = (
        0..3_i64,
        any::<bool>(),
        0..31 * DAY,
        0..KEYS,
        0..200_000_i64,
        0..=100_i64,
        0..50_000_i64,
        0..5_usize,
        0..3_usize,
    );
    (
        prop::collection::vec(price, 1..6),
        prop::collection::vec(event, 1..120),
    )
        .prop_map(|(prices, events)| Case { prices, events })
}

fn month_start(year: i32, m: i64) -> OffsetDateTime {
    let month = Month::January.nth_next(u8::try_from(m).unwrap());
    Date::from_calendar_date(year, month, 1)
        .unwrap()
        .midnight()
        .assume_utc()
}

fn rates((fresh_per_m, cached_per_m, output_per_m): (i64, i64, i64)) -> Rates {
    Rates {
        fresh_per_m,
        cached_per_m,
        output_per_m,
    }
}

const STATUSES: [UsageStatus; 5] = [
    UsageStatus::Ok,
    UsageStatus::ClientAbort,
    UsageStatus::Rejected,
    UsageStatus::Interrupted,
    UsageStatus::UpstreamError,
];
const PROVENANCES: [Provenance; 3] = [
    Provenance::Engine,
    Provenance::Partial,
    Provenance::Estimated,
];

fn event(tenant: Uuid, key: &str, at: OffsetDateTime, tokens: (i64, i64, i64)) -> UsageEvent {
    UsageEvent {
        request_id: Uuid::now_v7(),
        tenant_id: tenant,
        api_key_id: None,
        served_name: format!("{key}-served"),
        base_model: key.into(),
        adapter: None,
        graph: key.into(),
        price_key: key.into(),
        prompt_tokens: tokens.0,
        cached_tokens: tokens.1,
        completion_tokens: tokens.2,
        reasoning_tokens: 0,
        endpoint: tokenfactory::endpoint::Endpoint::Chat,
        provenance: Provenance::Engine,
        status: UsageStatus::Ok,
        stream: false,
        ttft_ms: None,
        duration_ms: 1,
        started_at: at,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct LineRow {
    request_id: Uuid,
    amount_micros: i64,
    flag: String,
    price_version_id: Option<i64>,
}

async fn lines(pool: &PgPool, run: i64, tenant: Uuid) -> HashMap<Uuid, LineRow> {
    sqlx::query_as!(
        LineRow,
        "SELECT request_id, amount_micros, flag, price_version_id FROM charge_lines
         WHERE run_id = $1 AND tenant_id = $2",
        run,
        tenant
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .map(|l| (l.request_id, l))
    .collect()
}

/// One case in its own years (case `n` uses year 2030 + 2n) with its own tenant and keys, so
/// cases share the database without seeing each other's prices or events.
async fn check(pool: &PgPool, n: usize, case: &Case) {
    let year = 2030 + 2 * i32::try_from(n).unwrap();
    let window = month_start(year, 0);
    let tenant = tf_core::db::accounts::insert_tenant(pool, &format!("t{n}"), "T")
        .await
        .unwrap()
        .id;
    let keys: Vec<String> = (0..KEYS).map(|k| format!("k{n}-{k}")).collect();

    // The price history, oldest first; Rust's model of it: key -> [(from, rates, version)].
    let mut prices = case.prices.clone();
    prices.sort_by_key(|p| p.0);
    prices.dedup_by_key(|p| p.0);
    let mut model: HashMap<usize, Vec<(OffsetDateTime, Rates, i64)>> = HashMap::new();
    let mut versions = Vec::new();
    for (at, k, r) in &prices {
        let from = window + Duration::seconds(*at);
        let v = billing::set_price(pool, from, &keys[*k], "standard", rates(*r), "test")
            .await
            .unwrap()
            .expect("versions go forward");
        model.entry(*k).or_default().push((from, rates(*r), v));
        versions.push((from, v));
    }
    // A price set before the latest version is refused (versions only go forward).
    let back = prices[0].0;
    assert_eq!(
        billing::set_price(
            pool,
            window + Duration::seconds(back),
            &keys[0],
            "standard",
            rates((1, 1, 1)),
            "t"
        )
        .await
        .unwrap(),
        None
    );
    let in_effect = |k: usize, at: OffsetDateTime| -> Option<(Rates, i64)> {
        model
            .get(&k)?
            .iter()
            .rev()
            .find(|(from, _, _)| *from <= at)
            .map(|(_, r, _)| *r)
            .zip(
                versions
                    .iter()
                    .rev()
                    .find(|(from, _)| *from <= at)
                    .map(|(_, v)| *v),
            )
    };

    let mut events = Vec::new();
    for &(month, edge, offset, k, prompt, cached_pct, output, status, prov) in &case.events {
        let start = month_start(year, month);
        let next = month_start(year, month + 1);
        // Near a boundary: within two minutes either side of the month's end.
        let at = if edge {
            next + Duration::seconds(offset % 240 - 120)
        } else {
            start + Duration::seconds(offset % (next - start).whole_seconds())
        };
        let mut e = event(
            tenant,
            &keys[k],
            at,
            (prompt, prompt * cached_pct / 100, output),
        );
        e.status = STATUSES[status];
        e.provenance = PROVENANCES[prov];
        events.push(e);
    }
    tf_core::db::usage::insert_batch(pool, &events)
        .await
        .unwrap();

    let live = billing::live_run(pool).await.unwrap();
    billing::drain(pool, live, 37).await.unwrap();
    // Idempotent: nothing left to take, and a second pass changes nothing.
    assert_eq!(billing::rate_batch(pool, live, 1000).await.unwrap(), 0);
    let rated = lines(pool, live, tenant).await;

    // Every event charged exactly once (rejected never), at the price in effect at its start.
    let mut expected: HashMap<Uuid, i64> = HashMap::new();
    for (e, spec) in events.iter().zip(&case.events) {
        let line = rated.get(&e.request_id);
        if e.status == UsageStatus::Rejected {
            assert!(line.is_none(), "rejected event charged: {e:?}");
            continue;
        }
        let line = line.unwrap_or_else(|| panic!("event not rated: {e:?}"));
        let q = Quantities {
            fresh: e.prompt_tokens - e.cached_tokens,
            cached: e.cached_tokens,
            output: e.completion_tokens,
        };
        match in_effect(spec.3, e.started_at) {
            Some((r, v)) => {
                assert_eq!(line.amount_micros, line_micros(q, r), "{e:?}");
                assert_eq!(line.price_version_id, Some(v), "{e:?}");
                let flag = match e.provenance {
                    Provenance::Engine => "",
                    Provenance::Partial => "partial",
                    Provenance::Estimated => "estimated",
                };
                assert_eq!(line.flag, flag);
            }
            None => {
                assert_eq!(line.amount_micros, 0);
                assert_eq!(line.flag, "unpriced");
            }
        }
        expected.insert(e.request_id, line.amount_micros);
    }
    assert_eq!(rated.len(), expected.len(), "no line without an event");

    // Invoices per UTC month: the total is the sum of the month's lines.
    for m in 0..3 {
        let (start, next) = (month_start(year, m), month_start(year, m + 1));
        let want: i64 = events
            .iter()
            .filter(|e| e.started_at >= start && e.started_at < next)
            .filter_map(|e| expected.get(&e.request_id))
            .sum();
        let Draft::Built(id) = billing::build_draft(pool, tenant, start.date(), Runs::Kept)
            .await
            .unwrap()
        else {
            panic!("month already issued")
        };
        let inv = billing::invoice(pool, tenant, id).await.unwrap().unwrap();
        assert_eq!(inv.total_micros, want, "month {m}");
        let entries = billing::invoice_entries(pool, tenant, id).await.unwrap();
        assert_eq!(entries.iter().map(|x| x.amount_micros).sum::<i64>(), want);
        let csv = billing::invoice_lines(pool, tenant, id).await.unwrap();
        assert_eq!(csv.iter().map(|l| l.amount_micros).sum::<i64>(), want);
        assert!(csv
            .iter()
            .all(|l| l.started_at >= start && l.started_at < next));
    }

    // Re-rating the whole window under each version: a new run, every non-rejected event once,
    // at that version's prices; events whose live version it was get the same amounts.
    for &(_, v) in &versions {
        let run = billing::rerate(
            pool,
            tenant,
            window,
            month_start(year, 3) + Duration::minutes(5),
            v,
            "test",
        )
        .await
        .unwrap();
        assert_ne!(run, live);
        let again = lines(pool, run, tenant).await;
        assert_eq!(again.len(), expected.len());
        for (id, line) in &again {
            // The line names its run's version, also when that version has no price for it.
            assert_eq!(line.price_version_id, Some(v));
            let live_line = &rated[id];
            if live_line.price_version_id == Some(v) {
                assert_eq!(line.amount_micros, live_line.amount_micros);
            }
        }
        assert_eq!(billing::rate_batch(pool, run, 1000).await.unwrap(), 0);
        // The live run is untouched.
        assert_eq!(lines(pool, live, tenant).await, rated);
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn random_events_and_price_histories_rate_and_invoice_exactly(pool: PgPool) {
    let cases: u32 = std::env::var("TF_BILLING_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let mut runner = TestRunner::new(Config::with_cases(cases));
    let strategy = case();
    for n in 0..usize::try_from(cases).unwrap() {
        let case = strategy.new_tree(&mut runner).unwrap().current();
        check(&pool, n, &case).await;
    }
}

async fn tenant(pool: &PgPool, name: &str) -> Uuid {
    tf_core::db::accounts::insert_tenant(pool, name, name)
        .await
        .unwrap()
        .id
}

/// A priced key ("m": 1 micro per fresh token, 0.5 per cached, 2 per output) and one rated event
/// per (day, tokens) given, for `tenant`.
async fn rated_events(pool: &PgPool, tenant: Uuid, at: &[OffsetDateTime]) -> Vec<UsageEvent> {
    let _ = billing::set_price(
        pool,
        time::macros::datetime!(2000-01-01 0:00 UTC),
        "m",
        "standard",
        rates((1_000_000, 500_000, 2_000_000)),
        "test",
    )
    .await
    .unwrap();
    let events: Vec<_> = at
        .iter()
        .map(|t| event(tenant, "m", *t, (10, 3, 7)))
        .collect();
    tf_core::db::usage::insert_batch(pool, &events)
        .await
        .unwrap();
    let live = billing::live_run(pool).await.unwrap();
    billing::drain(pool, live, 1000).await.unwrap();
    events
}

#[sqlx::test(migrations = "../migrations")]
async fn an_issued_invoice_cannot_be_changed_even_with_sql(pool: PgPool) {
    let t = tenant(&pool, "acme").await;
    let may = time::macros::datetime!(2026-05-10 12:00 UTC);
    rated_events(&pool, t, &[may, may]).await;
    let Draft::Built(id) =
        billing::build_draft(&pool, t, may.date().replace_day(1).unwrap(), Runs::Kept)
            .await
            .unwrap()
    else {
        panic!()
    };
    // 7 + 1.5 + 14 = 22.5 -> 23 per line, rounded once per line.
    assert_eq!(
        billing::invoice(&pool, t, id)
            .await
            .unwrap()
            .unwrap()
            .total_micros,
        46
    );
    // A draft may change.
    assert!(billing::adjust(&pool, id, "goodwill", -6).await.unwrap());
    assert_eq!(
        billing::issue(&pool, id, "test").await.unwrap(),
        Issue::Issued
    );
    assert_eq!(
        billing::issue(&pool, id, "test").await.unwrap(),
        Issue::NotDraft
    );
    assert!(!billing::adjust(&pool, id, "late", 1).await.unwrap());
    for sql in [
        "UPDATE invoices SET total_micros = 0",
        "UPDATE invoices SET status = 'draft', issued_at = NULL",
        "DELETE FROM invoices",
        "UPDATE invoice_entries SET amount_micros = 0",
        "DELETE FROM invoice_entries",
        "TRUNCATE invoices CASCADE",
        "TRUNCATE invoice_entries",
    ] {
        let err = sqlx::query(sql).execute(&pool).await;
        assert!(err.is_err(), "{sql} was allowed");
    }
    let inserted = sqlx::query(
        "INSERT INTO invoice_entries (invoice_id, position, kind, description, amount_micros)
         VALUES ($1, 999, 'adjustment', 'x', 1)",
    )
    .bind(id)
    .execute(&pool)
    .await;
    assert!(inserted.is_err(), "an entry was added to an issued invoice");
    assert_eq!(
        billing::invoice(&pool, t, id)
            .await
            .unwrap()
            .unwrap()
            .total_micros,
        40
    );
    // Prices are append-only too.
    assert!(sqlx::query("UPDATE prices SET output_per_m = 0")
        .execute(&pool)
        .await
        .is_err());
    // Rebuilding the issued month is refused until it is corrected.
    let month = may.date().replace_day(1).unwrap();
    assert_eq!(
        billing::build_draft(&pool, t, month, Runs::Kept)
            .await
            .unwrap(),
        Draft::AlreadyIssued(id)
    );
    // Another tenant sees none of it.
    let other = tenant(&pool, "globex").await;
    assert!(billing::invoice(&pool, other, id).await.unwrap().is_none());
    assert!(billing::invoice_entries(&pool, other, id)
        .await
        .unwrap()
        .is_empty());
    assert!(billing::invoice_lines(&pool, other, id)
        .await
        .unwrap()
        .is_empty());
    assert!(billing::invoices(&pool, other).await.unwrap().is_empty());
}

#[sqlx::test(migrations = "../migrations")]
async fn credits_burn_down_before_charges_and_a_correction_gives_them_back(pool: PgPool) {
    let t = tenant(&pool, "acme").await;
    let june = time::macros::datetime!(2026-06-03 08:00 UTC);
    rated_events(&pool, t, &[june; 4]).await; // 4 x 23 = 92
    let later = OffsetDateTime::now_utc() + Duration::days(3650);
    // Burn order: priority 0 (expiring) first, then priority 1.
    let first = billing::grant_credit(&pool, t, 50, 0, Some(later), "promo", "test")
        .await
        .unwrap();
    let second = billing::grant_credit(&pool, t, 100, 1, None, "prepaid", "test")
        .await
        .unwrap();
    assert_eq!(billing::credit_balance(&pool, t).await.unwrap(), 150);
    let month = june.date().replace_day(1).unwrap();
    let Draft::Built(id) = billing::build_draft(&pool, t, month, Runs::Kept)
        .await
        .unwrap()
    else {
        panic!()
    };
    let entries = billing::invoice_entries(&pool, t, id).await.unwrap();
    let credits: Vec<i64> = entries
        .iter()
        .filter(|e| e.kind == "credit")
        .map(|e| e.amount_micros)
        .collect();
    assert_eq!(credits, vec![-50, -42]);
    let inv = billing::invoice(&pool, t, id).await.unwrap().unwrap();
    assert_eq!(inv.total_micros, 0);
    // A draft burns nothing yet.
    assert_eq!(billing::credit_balance(&pool, t).await.unwrap(), 150);
    assert_eq!(
        billing::issue(&pool, id, "test").await.unwrap(),
        Issue::Issued
    );
    assert_eq!(billing::credit_balance(&pool, t).await.unwrap(), 58);
    let grants = billing::credit_grants(&pool, t).await.unwrap();
    assert_eq!(
        grants
            .iter()
            .map(|g| (g.id, g.remaining_micros))
            .collect::<Vec<_>>(),
        vec![(first, 0), (second, 58)]
    );

    // Correction: a credit note negating it (credits come back), then a new invoice.
    let note = billing::correct(&pool, id, "test").await.unwrap().unwrap();
    assert!(billing::correct(&pool, id, "test").await.unwrap().is_none());
    assert_eq!(billing::credit_balance(&pool, t).await.unwrap(), 150);
    let note_row = billing::invoice(&pool, t, note).await.unwrap().unwrap();
    assert_eq!(
        (
            note_row.kind.as_str(),
            note_row.status.as_str(),
            note_row.corrects
        ),
        ("credit_note", "issued", Some(id))
    );
    let Draft::Built(new) = billing::build_draft(&pool, t, month, Runs::Kept)
        .await
        .unwrap()
    else {
        panic!("a corrected month can be invoiced again")
    };
    assert_ne!(new, id);
    let new_row = billing::invoice(&pool, t, new).await.unwrap().unwrap();
    assert_eq!(new_row.corrects, Some(id));
    assert_eq!(billing::invoices(&pool, t).await.unwrap().len(), 3);
}

/// Exports parse as what the platforms ingest: required fields present with their JSON types.
#[sqlx::test(migrations = "../migrations")]
async fn exports_parse_as_cloudevents_and_lago_batches(pool: PgPool) {
    let t = tenant(&pool, "acme").await;
    let at = time::macros::datetime!(2026-07-01 00:00:01 UTC);
    let events = rated_events(&pool, t, &[at; 150]).await;
    let since = time::macros::datetime!(2026-07-01 0:00 UTC);
    let until = time::macros::datetime!(2026-08-01 0:00 UTC);
    let ids: std::collections::BTreeSet<String> =
        events.iter().map(|e| e.request_id.to_string()).collect();

    let mut out = Vec::new();
    export::export(
        &pool,
        Format::CloudEvents,
        since,
        until,
        "tf-test",
        &mut out,
    )
    .await
    .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for line in String::from_utf8(out).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["specversion"], "1.0");
        for field in ["id", "source", "type", "subject", "time", "datacontenttype"] {
            assert!(
                v[field].as_str().is_some_and(|s| !s.is_empty()),
                "{field}: {v}"
            );
        }
        assert_eq!(v["source"], "tf-test");
        assert_eq!(v["subject"], t.to_string());
        OffsetDateTime::parse(
            v["time"].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap();
        let data = &v["data"];
        assert!(data["model"].is_string());
        for n in [
            "prompt_tokens",
            "cached_tokens",
            "output_tokens",
            "total_tokens",
            "amount_micros",
        ] {
            assert!(data[n].is_i64(), "{n}: {data}");
        }
        assert_eq!(data["prompt_tokens"], 10);
        seen.insert(v["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(seen, ids, "one CloudEvent per event, id = request id");

    let mut out = Vec::new();
    export::export(&pool, Format::Lago, since, until, "tf-test", &mut out)
        .await
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let mut batches = 0;
    for line in String::from_utf8(out).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let batch = v["events"].as_array().unwrap();
        assert!(!batch.is_empty() && batch.len() <= export::LAGO_BATCH);
        batches += 1;
        for e in batch {
            assert!(e["transaction_id"].is_string());
            assert_eq!(e["external_subscription_id"], t.to_string());
            assert_eq!(e["code"], export::LAGO_CODE);
            assert_eq!(e["timestamp"].as_i64(), Some(at.unix_timestamp()));
            assert!(e["properties"].is_object());
            assert!(e["properties"]["output_tokens"].is_i64());
            seen.insert(e["transaction_id"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(batches, 2);
    assert_eq!(seen, ids);

    let mut out = Vec::new();
    export::export(&pool, Format::Csv, since, until, "tf-test", &mut out)
        .await
        .unwrap();
    let text = String::from_utf8(out).unwrap();
    let mut rows = text.lines();
    assert_eq!(rows.next(), Some(export::CSV_HEADER));
    let cols = export::CSV_HEADER.split(',').count();
    let rows: Vec<&str> = rows.collect();
    assert_eq!(rows.len(), 150);
    assert!(rows.iter().all(|r| r.split(',').count() == cols));
    // Outside the range: nothing.
    let mut out = Vec::new();
    let n = export::export(
        &pool,
        Format::CloudEvents,
        until,
        until + Duration::days(1),
        "x",
        &mut out,
    )
    .await
    .unwrap();
    assert_eq!(n, 0);
}

/// The CLI: prices set/show/versions (in dollars, never backdated), rerate, export (through
/// `admin::run_on`, as an operator).
#[sqlx::test(migrations = "../migrations")]
async fn admin_cli_sets_prices_rerates_and_exports(pool: PgPool) {
    use clap::Parser;
    let t = tenant(&pool, "acme").await;
    let at = time::macros::datetime!(2026-09-10 0:00 UTC);
    rated_events(&pool, t, &[at; 3]).await;
    let run = |args: &[&str]| {
        let mut argv = vec!["tokenfactory", "admin"];
        argv.extend_from_slice(args);
        let cli = tokenfactory::cli::Cli::try_parse_from(argv).unwrap();
        let Some(tokenfactory::cli::Command::Admin(cmd)) = cli.command else {
            panic!()
        };
        cmd
    };
    let mut out = Vec::new();
    let cmd = run(&[
        "prices", "set", "--key", "m", "--fresh", "$2", "--cached", "0", "--output", "0.00",
    ]);
    tokenfactory::admin::run_on(&pool, cmd, &mut out)
        .await
        .unwrap();
    for args in [
        &["prices", "versions"][..],
        &["prices", "show"],
        &[
            "rerate",
            "--tenant",
            "acme",
            "--since",
            "2026-09-01T00:00:00Z",
            "--until",
            "2026-10-01T00:00:00Z",
        ],
        &[
            "export",
            "--format",
            "csv",
            "--since",
            "2026-09-01T00:00:00Z",
            "--until",
            "2026-10-01T00:00:00Z",
        ],
        &[
            "invoices", "build", "--tenant", "acme", "--month", "2026-09",
        ],
        &["invoices", "list", "--tenant", "acme"],
    ] {
        tokenfactory::admin::run_on(&pool, run(args), &mut out)
            .await
            .unwrap();
    }
    let text = String::from_utf8(out).unwrap();
    // Typed in dollars per million, stored and echoed as exact micro-units.
    assert!(text.contains("fresh $2.00 (2000000 micros)"), "{text}");
    assert!(text.contains("m\tstandard\t2000000\t0\t0"), "{text}");
    // Re-rated under the version in effect now (the new one): 7 fresh tokens at 2 = 14 each.
    assert!(text.contains(": 3 events, 42 micros"), "{text}");
    assert!(text.contains("draft "), "{text}");
    // A backdated price is refused (correcting the past is what re-rating is for).
    let cmd = run(&[
        "prices",
        "set",
        "--key",
        "m",
        "--fresh",
        "1",
        "--cached",
        "1",
        "--output",
        "1",
        "--from",
        "2026-08-01T00:00:00Z",
    ]);
    assert!(tokenfactory::admin::run_on(&pool, cmd, &mut Vec::new())
        .await
        .is_err());
}
