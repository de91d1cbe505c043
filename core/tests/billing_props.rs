//! Property test of the operator's workflow around rating (issue 31): for random sequences of
//! usage, rating, re-rates, early closes, builds (an admin's choice of runs or the scheduler's
//! rebuild that keeps it) and issues, over a fixed schedule of price changes with awkward rates:
//! - an issued invoice never changes (total, entries, lines);
//! - every invoice's total is the sum of its entries, and its usage entries the sum of the charge
//!   lines behind it, to the micro-unit;
//! - every line is the event's quantities at the rates of the version its run prices by
//!   (the live run: the version in effect at the event's start; a re-rate: its version);
//! - in the end every event is on exactly one invoice, once.
//!
//! One database for the whole test (created here and dropped after), one tenant per case, so
//! shrinking replays a case on a clean tenant.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tf_core::billing_ops as ops;
use tf_core::db::billing::{self, Draft, Entry, Invoice, Line, Runs};
use tf_core::money::{line_micros, Quantities, Rates};
use tf_core::operator::Actor;
use tf_core::usage::{Provenance, UsageEvent, UsageStatus};
use time::macros::{date, datetime};
use time::{Date, Duration, OffsetDateTime};
use uuid::Uuid;

/// The price schedule of key `m`: (effective from, rates).
const SCHEDULE: [(OffsetDateTime, Rates); 3] = [
    (
        datetime!(2025-01-01 0:00 UTC),
        Rates {
            fresh_per_m: 1_000_000,
            cached_per_m: 500_000,
            output_per_m: 2_000_000,
        },
    ),
    (
        datetime!(2025-01-15 12:00 UTC),
        Rates {
            fresh_per_m: 333_333,
            cached_per_m: 111_111,
            output_per_m: 777_777,
        },
    ),
    (
        datetime!(2025-02-10 6:30 UTC),
        Rates {
            fresh_per_m: 1_500_001,
            cached_per_m: 3,
            output_per_m: 2_499_999,
        },
    ),
];
const START: OffsetDateTime = datetime!(2025-01-01 0:00 UTC);
/// Events fall in January and February; a February close moves some onto March.
const SPAN_MINUTES: u32 = 59 * 24 * 60;
const MONTHS: [Date; 3] = [
    date!(2025 - 01 - 01),
    date!(2025 - 02 - 01),
    date!(2025 - 03 - 01),
];

#[derive(Debug, Clone)]
enum Op {
    /// Events at these minutes after START with (prompt, cached share in %, completion) tokens.
    Events(Vec<(u32, i64, i64, i64)>),
    /// The live rater catches up.
    Rate,
    /// A re-rate of the tenant over [from, from + len) hours after START under a version.
    Rerate { from: u32, len: u32, version: usize },
    /// Closes a month early, this many hours after its start.
    Close { month: usize, hours: u32 },
    /// Builds a month's draft: the scheduler's rebuild (`None`: the runs kept) or an admin's
    /// choice of one of the re-rates made so far.
    Build { month: usize, rerate: Option<usize> },
    /// The rater catches up, the final draft is built, and it is issued.
    Issue { month: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let event = (0..SPAN_MINUTES, 0i64..4_000, 0i64..=100, 0i64..4_000);
    prop_oneof![
        3 => prop::collection::vec(event, 1..6).prop_map(Op::Events),
        2 => Just(Op::Rate),
        1 => (0u32..59 * 24, 1u32..40 * 24, 0usize..3)
            .prop_map(|(from, len, version)| Op::Rerate { from, len, version }),
        1 => (0usize..2, 1u32..27 * 24).prop_map(|(month, hours)| Op::Close { month, hours }),
        2 => (0usize..3, prop::option::of(0usize..4))
            .prop_map(|(month, rerate)| Op::Build { month, rerate }),
        1 => (0usize..3).prop_map(|month| Op::Issue { month }),
    ]
}

/// What an issued invoice was when it was issued.
#[derive(Debug, Clone, PartialEq)]
struct Frozen {
    invoice: Invoice,
    entries: Vec<Entry>,
    lines: Vec<Line>,
}

struct Case<'a> {
    pool: &'a PgPool,
    versions: &'a [i64],
    tenant: Uuid,
    name: String,
    /// Quantities of every event stored.
    events: HashMap<Uuid, Quantities>,
    /// Re-rate runs made: (run, version).
    rerates: Vec<(i64, i64)>,
    issued: BTreeMap<Date, (Uuid, Frozen)>,
}

macro_rules! check {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(TestCaseError::fail(format!($($msg)+)));
        }
    };
}

impl Case<'_> {
    async fn frozen(&self, id: Uuid) -> Frozen {
        Frozen {
            invoice: billing::invoice(self.pool, self.tenant, id)
                .await
                .unwrap()
                .unwrap(),
            entries: billing::invoice_entries(self.pool, self.tenant, id)
                .await
                .unwrap(),
            lines: billing::invoice_lines(self.pool, self.tenant, id)
                .await
                .unwrap(),
        }
    }

    /// The month whose period holds `at` now (closes included).
    async fn month_holding(&self, at: OffsetDateTime) -> Option<Date> {
        for m in MONTHS {
            let (from, until) = tf_core::db::periods::period(self.pool, self.tenant, m)
                .await
                .unwrap();
            if from <= at && at < until {
                return Some(m);
            }
        }
        None
    }

    async fn rate(&self) {
        let live = billing::live_run(self.pool).await.unwrap();
        billing::drain(self.pool, live, 1000).await.unwrap();
    }

    async fn apply(&mut self, op: &Op) {
        let actor = Actor::CLI;
        match op {
            Op::Events(list) => {
                let mut batch = Vec::new();
                for &(minute, prompt, cached_pct, completion) in list {
                    let at = START + Duration::minutes(i64::from(minute));
                    // Usage for a period already invoiced is not what this test is about (a late
                    // event there needs a credit note): only open periods get events.
                    let Some(m) = self.month_holding(at).await else {
                        continue;
                    };
                    if self.issued.contains_key(&m) {
                        continue;
                    }
                    let cached = prompt * cached_pct / 100;
                    let e = UsageEvent {
                        request_id: Uuid::now_v7(),
                        tenant_id: self.tenant,
                        api_key_id: None,
                        served_name: "m".into(),
                        base_model: "m".into(),
                        adapter: None,
                        graph: "m".into(),
                        price_key: "m".into(),
                        prompt_tokens: prompt,
                        cached_tokens: cached,
                        completion_tokens: completion,
                        reasoning_tokens: 0,
                        endpoint: tf_core::endpoint::Endpoint::Chat,
                        provenance: Provenance::Engine,
                        status: UsageStatus::Ok,
                        stream: false,
                        ttft_ms: None,
                        duration_ms: 1,
                        started_at: at,
                    };
                    self.events.insert(
                        e.request_id,
                        Quantities {
                            fresh: prompt - cached,
                            cached,
                            output: completion,
                        },
                    );
                    batch.push(e);
                }
                tf_core::db::usage::insert_batch(self.pool, &batch)
                    .await
                    .unwrap();
            }
            Op::Rate => self.rate().await,
            Op::Rerate { from, len, version } => {
                let start = START + Duration::hours(i64::from(*from));
                let end = start + Duration::hours(i64::from(*len));
                let v = self.versions[*version];
                let run = ops::rerate(self.pool, &actor, self.tenant, &self.name, start, end, v)
                    .await
                    .unwrap();
                self.rerates.push((run, v));
            }
            Op::Close { month, hours } => {
                let m = MONTHS[*month];
                let at = m.midnight().assume_utc() + Duration::hours(i64::from(*hours));
                // Refused when the month or the next one is issued, or already closed.
                let _ = ops::close_period(self.pool, &actor, self.tenant, &self.name, m, at).await;
            }
            Op::Build { month, rerate } => {
                let m = MONTHS[*month];
                let chosen: Vec<i64> = match rerate {
                    Some(i) if !self.rerates.is_empty() => {
                        vec![self.rerates[i % self.rerates.len()].0]
                    }
                    _ => Vec::new(),
                };
                let runs = if rerate.is_some() {
                    Runs::Chosen(&chosen)
                } else {
                    Runs::Kept
                };
                // A re-rate that does not touch the month's period is refused (nothing written).
                let _ = ops::build_draft(self.pool, &actor, self.tenant, m, runs).await;
            }
            Op::Issue { month } => {
                let m = MONTHS[*month];
                if self.issued.contains_key(&m) {
                    return;
                }
                self.rate().await;
                match ops::build_draft(self.pool, &actor, self.tenant, m, Runs::Kept).await {
                    Ok(Draft::Built(id)) => {
                        ops::issue(self.pool, &actor, id).await.unwrap();
                        let frozen = self.frozen(id).await;
                        self.issued.insert(m, (id, frozen));
                    }
                    other => panic!("building {m} to issue: {other:?}"),
                }
            }
        }
    }

    /// Issued invoices are as they were issued.
    async fn issued_unchanged(&self) -> Result<(), TestCaseError> {
        for (m, (id, was)) in &self.issued {
            let now = self.frozen(*id).await;
            check!(now == *was, "issued invoice of {m} changed");
        }
        Ok(())
    }

    /// Totals, entries and lines agree, and every line is priced as its run prices.
    async fn adds_up(&self, id: Uuid) -> Result<Vec<Uuid>, TestCaseError> {
        let f = self.frozen(id).await;
        let entries: i64 = f.entries.iter().map(|e| e.amount_micros).sum();
        check!(
            f.invoice.total_micros == entries,
            "total {} != entries {entries}",
            f.invoice.total_micros
        );
        let usage: i64 = f
            .entries
            .iter()
            .filter(|e| e.kind == "usage")
            .map(|e| e.amount_micros)
            .sum();
        let usage_events: i64 = f
            .entries
            .iter()
            .filter(|e| e.kind == "usage")
            .map(|e| e.events)
            .sum();
        let lines: i64 = f.lines.iter().map(|l| l.amount_micros).sum();
        check!(
            usage == lines,
            "usage entries {usage} != charge lines {lines}"
        );
        check!(
            usage_events == i64::try_from(f.lines.len()).unwrap(),
            "{usage_events} events on entries, {} lines",
            f.lines.len()
        );
        let sources = tf_core::db::periods::sources(self.pool, id).await.unwrap();
        for l in &f.lines {
            let q = self.events[&l.request_id];
            let seg = sources
                .iter()
                .find(|s| s.from <= l.started_at && l.started_at < s.until)
                .unwrap();
            let want_version = match self.rerates.iter().find(|r| r.0 == seg.run) {
                Some(&(_, v)) => v,
                None => {
                    let i = SCHEDULE
                        .iter()
                        .rposition(|(from, _)| *from <= l.started_at)
                        .unwrap();
                    self.versions[i]
                }
            };
            check!(
                l.price_version_id == Some(want_version),
                "line of {} priced by {:?}, want {want_version}",
                l.request_id,
                l.price_version_id
            );
            let i = self
                .versions
                .iter()
                .position(|v| *v == want_version)
                .unwrap();
            let want = line_micros(q, SCHEDULE[i].1);
            check!(
                l.amount_micros == want,
                "line {} != {want}",
                l.amount_micros
            );
        }
        Ok(f.lines.iter().map(|l| l.request_id).collect())
    }

    /// After the rater catches up and every open month is built: each event on exactly one
    /// invoice, once.
    async fn finish(&self) -> Result<(), TestCaseError> {
        self.rate().await;
        let mut seen: HashMap<Uuid, usize> = HashMap::new();
        for m in MONTHS {
            let id = match self.issued.get(&m) {
                Some((id, _)) => *id,
                None => {
                    let built =
                        ops::build_draft(self.pool, &Actor::CLI, self.tenant, m, Runs::Kept)
                            .await
                            .unwrap();
                    match built {
                        Draft::Built(id) => id,
                        other => panic!("final build of {m}: {other:?}"),
                    }
                }
            };
            for r in self.adds_up(id).await? {
                *seen.entry(r).or_default() += 1;
            }
        }
        for (r, n) in &seen {
            check!(*n == 1, "event {r} on {n} invoices");
        }
        check!(
            seen.len() == self.events.len(),
            "{} of {} events invoiced",
            seen.len(),
            self.events.len()
        );
        Ok(())
    }
}

async fn fresh_database() -> (PgPool, String, String) {
    let server = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&server)
        .await
        .unwrap();
    let name = format!("tf_billing_props_{}", Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let base = server.rsplit_once('/').unwrap().0.to_owned();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&format!("{base}/{name}"))
        .await
        .unwrap();
    tf_core::db::MIGRATOR.run(&pool).await.unwrap();
    (pool, server, name)
}

#[test]
fn close_rerate_rebuild_and_issue_keep_invoices_whole() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (pool, server, db_name) = rt.block_on(fresh_database());
    let versions: Vec<i64> = rt.block_on(async {
        let mut out = Vec::new();
        for (from, rates) in SCHEDULE {
            let v = billing::set_price(&pool, from, "m", "standard", rates, "test")
                .await
                .unwrap()
                .unwrap();
            out.push(v);
        }
        out
    });
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(32);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let n = AtomicU32::new(0);
    let result = runner.run(&prop::collection::vec(op(), 1..14), |ops| {
        rt.block_on(async {
            let i = n.fetch_add(1, Ordering::Relaxed);
            let name = format!("p{i}");
            let tenant = tf_core::db::accounts::insert_tenant(&pool, &name, &name)
                .await
                .unwrap()
                .id;
            let mut case = Case {
                pool: &pool,
                versions: &versions,
                tenant,
                name,
                events: HashMap::new(),
                rerates: Vec::new(),
                issued: BTreeMap::new(),
            };
            for op in &ops {
                case.apply(op).await;
                case.issued_unchanged().await?;
            }
            case.finish().await?;
            case.issued_unchanged().await
        })
    });
    rt.block_on(async {
        pool.close().await;
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(&server)
            .await
            .unwrap();
        sqlx::query(&format!("DROP DATABASE {db_name} WITH (FORCE)"))
            .execute(&admin)
            .await
            .unwrap();
    });
    result.unwrap();
}
