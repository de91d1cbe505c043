//! `/usage` and `/logs` against known usage events: every figure the usage page shows equals the
//! sum of the stored events (priced with `money::line_micros` under the price book, as the spend
//! limit and the invoices count them), replays keep it so, a new price applies from its time on,
//! the request log walks every event once in order across its pages, and nothing of another
//! tenant ever shows, even with its ids in the query string.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test helper that fails should fail the test loudly"
)]

use crate::common;

use std::collections::{BTreeMap, HashSet};

use common::portal::*;
use common::TestApp;
use reqwest::StatusCode;
use sqlx::PgPool;
use tf_app::money::Decimals;
use tf_app::usage::{UsageFigures, UsageReport};
use tf_core::accounts::{self, Role};
use tf_core::money::{line_micros, Quantities, Rates};
use tf_core::usage::{Provenance, UsageEvent, UsageStatus};
use time::{Date, Duration, OffsetDateTime};
use uuid::Uuid;

const OTHER: &str = "eve@globex.test";

struct World {
    portal: TestPortal,
    acme: Uuid,
    globex: Uuid,
    keys: [Uuid; 2],
    globex_key: Uuid,
}

async fn world(pool: PgPool) -> World {
    let portal = TestApp::builder(pool.clone())
        .shared_redis()
        .start_portal()
        .await;
    let acme = accounts::find_tenant(&pool, "acme").await.unwrap().id;
    let globex = accounts::create_tenant(&pool, "globex", "Globex")
        .await
        .unwrap()
        .id;
    accounts::create_user(&pool, OTHER, PASSWORD, Role::TenantMember, Some(globex))
        .await
        .unwrap();
    let key = |tenant, name: &'static str, prefix: &'static str| {
        let pool = pool.clone();
        async move {
            tf_core::db::keys::insert(
                &pool,
                &tf_core::db::keys::NewKey {
                    tenant_id: tenant,
                    name,
                    prefix,
                    sha256: &rand_hash(),
                },
            )
            .await
            .unwrap()
            .id
        }
    };
    let keys = [
        key(acme, "prod", "tf-prod0001").await,
        key(acme, "ci", "tf-ci000001").await,
    ];
    let globex_key = key(globex, "theirs", "tf-glbx0001").await;
    let bases: Vec<_> = ["llama", "qwen"]
        .iter()
        .map(|name| tf_core::db::catalog::BaseUpsert {
            name,
            graph: name,
            upstream_url: "http://127.0.0.1:1/v1",
            upstream_model: name,
            continuous_usage: true,
            denied_fields: None,
            prompt_estimator: "byte-bound",
            kind: "chat",
            nvext_allowed: None,
        })
        .collect();
    tf_core::db::catalog::upsert_bases(&pool, "static", &bases)
        .await
        .unwrap();
    set_prices(
        &pool,
        OffsetDateTime::now_utc() - Duration::days(60),
        &start_prices(),
    )
    .await;
    World {
        portal,
        acme,
        globex,
        keys,
        globex_key,
    }
}

fn rand_hash() -> [u8; 32] {
    *Uuid::new_v4().as_bytes().repeat(2).first_chunk().unwrap()
}

/// Rates per million (fresh, cached, output): odd figures, so per-line rounding shows.
fn rates(fresh_per_m: i64, cached_per_m: i64, output_per_m: i64) -> Rates {
    Rates {
        fresh_per_m,
        cached_per_m,
        output_per_m,
    }
}

fn start_prices() -> BTreeMap<&'static str, Rates> {
    BTreeMap::from([
        ("llama", rates(1_500_000, 750_001, 3_000_003)),
        ("qwen", rates(7_000, 3_499, 14_001)),
    ])
}

/// A new version of the price book from `from` on, in the standard tier.
async fn set_prices(pool: &PgPool, from: OffsetDateTime, prices: &BTreeMap<&str, Rates>) {
    let list: Vec<_> = prices.iter().map(|(k, r)| (*k, "standard", *r)).collect();
    tf_core::db::billing::set_prices(pool, from, &list, "test")
        .await
        .unwrap()
        .unwrap();
}

fn cost(e: &UsageEvent, prices: &BTreeMap<&str, Rates>) -> i64 {
    if e.status == UsageStatus::Rejected {
        return 0;
    }
    let q = Quantities {
        fresh: e.prompt_tokens - e.cached_tokens,
        cached: e.cached_tokens,
        output: e.completion_tokens,
    };
    line_micros(
        q,
        prices
            .get(e.price_key.as_str())
            .copied()
            .unwrap_or_default(),
    )
}

#[expect(clippy::too_many_arguments, reason = "a test's event literal")]
fn event(
    tenant: Uuid,
    key: Option<Uuid>,
    served: &str,
    base: &str,
    at: OffsetDateTime,
    prompt: i64,
    cached: i64,
    completion: i64,
) -> UsageEvent {
    UsageEvent {
        request_id: Uuid::now_v7(),
        tenant_id: tenant,
        api_key_id: key,
        served_name: served.into(),
        base_model: base.into(),
        adapter: None,
        graph: base.into(),
        price_key: base.into(),
        prompt_tokens: prompt,
        cached_tokens: cached,
        completion_tokens: completion,
        reasoning_tokens: 0,
        endpoint: tokenfactory::endpoint::Endpoint::Chat,
        provenance: Provenance::Engine,
        status: if prompt == 0 && completion == 0 {
            UsageStatus::Rejected
        } else {
            UsageStatus::Ok
        },
        stream: true,
        ttft_ms: Some(12),
        duration_ms: 345,
        started_at: at,
    }
}

/// Events of both tenants over 50 days: two models (one an adapter on `llama`), two keys and
/// none, token counts that exercise per-request rounding, a refused request.
fn events(w: &World, now: OffsetDateTime) -> Vec<UsageEvent> {
    let mut out = Vec::new();
    let [k1, k2] = w.keys;
    for (i, days_ago) in [0_i64, 0, 1, 3, 6, 7, 29, 30, 45].into_iter().enumerate() {
        let at = now - Duration::days(days_ago) - Duration::minutes(i64::try_from(i).unwrap());
        let i = i64::try_from(i).unwrap();
        out.push(event(
            w.acme,
            Some(k1),
            "llama",
            "llama",
            at,
            333 + i,
            100,
            17 * i + 1,
        ));
        out.push(event(
            w.acme,
            Some(k2),
            "support-bot",
            "llama",
            at,
            1001,
            1,
            999,
        ));
        out.push(event(w.acme, None, "qwen", "qwen", at, 7 * i, i, 3));
        out.push(event(w.acme, Some(k1), "qwen", "qwen", at, 0, 0, 0));
        // Another tenant's events on the same days and models, which must never show.
        out.push(event(
            w.globex,
            Some(w.globex_key),
            "llama",
            "llama",
            at,
            5_000,
            0,
            5_000,
        ));
        out.push(event(w.globex, None, "qwen", "qwen", at, 9_999, 0, 1));
    }
    out
}

/// The figures the page must show for `tenant`'s events kept by `keep`, per day and model.
fn expected(
    events: &[UsageEvent],
    tenant: Uuid,
    prices: &BTreeMap<&str, Rates>,
    keep: impl Fn(&UsageEvent) -> bool,
) -> BTreeMap<(Date, String), UsageFigures> {
    let mut out: BTreeMap<(Date, String), UsageFigures> = BTreeMap::new();
    for e in events.iter().filter(|e| e.tenant_id == tenant && keep(e)) {
        let f = out
            .entry((e.started_at.date(), e.served_name.clone()))
            .or_default();
        f.add(&UsageFigures {
            requests: 1,
            prompt_tokens: e.prompt_tokens,
            cached_tokens: e.cached_tokens,
            completion_tokens: e.completion_tokens,
            cost_micros: cost(e, prices),
        });
    }
    out
}

async fn report(b: &Browser, query: &str) -> UsageReport {
    let res = b
        .http
        .get(format!("{}/api/usage?{query}", b.base))
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "GET /api/usage?{query}: {:?} {:?}",
        location(&res),
        res.headers()
    );
    res.json().await.unwrap()
}

fn check(report: &UsageReport, want: &BTreeMap<(Date, String), UsageFigures>) {
    let got: BTreeMap<(String, String), UsageFigures> = report
        .rows
        .iter()
        .map(|r| ((r.day.clone(), r.model.clone()), r.figures.clone()))
        .collect();
    let want_rows: BTreeMap<(String, String), UsageFigures> = want
        .iter()
        .map(|((d, m), f)| ((d.to_string(), m.clone()), f.clone()))
        .collect();
    assert_eq!(got, want_rows, "every day and model row");
    let mut total = UsageFigures::default();
    want.values().for_each(|f| total.add(f));
    assert_eq!(report.totals, total, "totals");
    let mut days = UsageFigures::default();
    report.days.iter().for_each(|(_, f)| days.add(f));
    assert_eq!(days, total, "the chart's days add up to the totals");
}

fn in_last(days: i64, now: OffsetDateTime) -> impl Fn(&UsageEvent) -> bool {
    let first = now.date() - Duration::days(days - 1);
    move |e: &UsageEvent| e.started_at.date() >= first
}

#[sqlx::test(migrations = "../migrations")]
async fn usage_figures_equal_the_stored_events_and_the_spend_limit(pool: PgPool) {
    let w = world(pool.clone()).await;
    let now = OffsetDateTime::now_utc();
    let events = events(&w, now);
    // Shipped in two batches, as the journal does.
    let (a, b) = events.split_at(events.len() / 2);
    tf_core::db::usage::insert_batch(&pool, a).await.unwrap();
    tf_core::db::usage::insert_batch(&pool, b).await.unwrap();
    let prices = start_prices();

    let browser = w.portal.browser();
    assert_redirect(&browser.login(MEMBER, PASSWORD).await, "/");
    for days in [7, 30, 90] {
        let r = report(&browser, &format!("params[range]={days}")).await;
        assert_eq!(r.days.len(), usize::try_from(days).unwrap());
        check(&r, &expected(&events, w.acme, &prices, in_last(days, now)));
    }
    // The default range is 30 days; the page shows the same totals as the server function.
    let r = report(&browser, "").await;
    let want = expected(&events, w.acme, &prices, in_last(30, now));
    check(&r, &want);
    let html = browser.html("/usage").await;
    assert!(html.contains("<svg"), "a chart is drawn");
    // The total's cost has the column's decimals (issue 37, item 4: one format per column).
    let column = Decimals::for_amounts(
        r.rows
            .iter()
            .map(|row| row.figures.cost_micros)
            .chain([r.totals.cost_micros]),
    );
    assert!(html.contains(&format!(
        r#"<td class="num cost">{}</td>"#,
        column.show(r.totals.cost_micros)
    )));
    assert!(r.totals.cost_micros > 0 && r.totals.requests > 0);

    // The cost is what the spend limit counts (db::spend, one formula).
    let all = report(&browser, "params[range]=90").await;
    let since = now.date() - Duration::days(89);
    let spend = tf_core::db::spend::consumption(&pool, w.acme, None, since)
        .await
        .unwrap();
    assert_eq!(all.totals.cost_micros, spend.spend_micros);

    // Filters: by key, by requests without a key, by model, and a custom range.
    let [k1, k2] = w.keys;
    let r = report(&browser, &format!("params[range]=90&params[key]={k1}")).await;
    check(
        &r,
        &expected(&events, w.acme, &prices, |e| {
            e.api_key_id == Some(k1) && in_last(90, now)(e)
        }),
    );
    let r = report(&browser, "params[range]=90&params[key]=none").await;
    check(
        &r,
        &expected(&events, w.acme, &prices, |e| {
            e.api_key_id.is_none() && in_last(90, now)(e)
        }),
    );
    let r = report(&browser, "params[range]=90&params[model]=support-bot").await;
    check(
        &r,
        &expected(&events, w.acme, &prices, |e| {
            e.served_name == "support-bot" && in_last(90, now)(e)
        }),
    );
    assert!(r.rows.iter().all(|row| row.model == "support-bot") && !r.rows.is_empty());
    let (from, to) = (
        now.date() - Duration::days(30),
        now.date() - Duration::days(3),
    );
    let r = report(
        &browser,
        &format!("params[range]=custom&params[from]={from}&params[to]={to}&params[key]={k2}"),
    )
    .await;
    check(
        &r,
        &expected(&events, w.acme, &prices, |e| {
            let d = e.started_at.date();
            e.api_key_id == Some(k2) && d >= from && d <= to
        }),
    );
    assert_eq!(
        (r.from.as_str(), r.to.as_str()),
        (&*from.to_string(), &*to.to_string())
    );

    // A replayed batch changes nothing.
    assert_eq!(
        tf_core::db::usage::insert_batch(&pool, &events)
            .await
            .unwrap(),
        0
    );
    check(&report(&browser, "").await, &want);

    // A new price applies from its time on: the stored events keep the price of their time
    // (as their rated lines do), an event after it costs the new one.
    let mut later = start_prices();
    later.insert("llama", rates(2_999_000, 1_000_000, 5_999_999));
    let change = OffsetDateTime::now_utc();
    set_prices(&pool, change, &later).await;
    let before = expected(&events, w.acme, &prices, in_last(90, now));
    check(&report(&browser, "params[range]=90").await, &before);
    let new = event(
        w.acme,
        Some(k1),
        "llama",
        "llama",
        change + Duration::milliseconds(1),
        4_321,
        321,
        77,
    );
    tf_core::db::usage::insert_batch(&pool, std::slice::from_ref(&new))
        .await
        .unwrap();
    let r = report(&browser, "params[range]=90").await;
    assert_eq!(
        r.totals.cost_micros,
        before.values().map(|f| f.cost_micros).sum::<i64>() + cost(&new, &later)
    );
    assert_ne!(cost(&new, &later), cost(&new, &prices));
}

#[sqlx::test(migrations = "../migrations")]
async fn usage_never_shows_another_tenant(pool: PgPool) {
    let w = world(pool.clone()).await;
    let now = OffsetDateTime::now_utc();
    let events = events(&w, now);
    tf_core::db::usage::insert_batch(&pool, &events)
        .await
        .unwrap();
    let prices = start_prices();

    let eve = w.portal.browser();
    assert_redirect(&eve.login(OTHER, PASSWORD).await, "/");
    let r = report(&eve, "params[range]=90").await;
    check(&r, &expected(&events, w.globex, &prices, in_last(90, now)));
    assert!(r.keys.iter().all(|k| k.value == w.globex_key.to_string()));
    assert!(
        !r.models.contains(&"support-bot".to_owned()),
        "acme's adapter is not listed"
    );
    // Acme's key id in the query string: ignored (said so), nothing of acme's shown.
    let r = report(&eve, &format!("params[range]=90&params[key]={}", w.keys[0])).await;
    assert!(r.notice.is_some());
    check(&r, &expected(&events, w.globex, &prices, in_last(90, now)));
    let html = eve
        .html(&format!("/usage?range=90&key={}", w.keys[0]))
        .await;
    assert!(!html.contains("support-bot") && !html.contains("tf-prod0001"));

    // Admins and anonymous callers get no tenant's usage.
    let admin = w.portal.browser();
    admin.login(ADMIN, PASSWORD).await;
    assert_eq!(
        admin.get("/api/usage?params[range]=90").await.status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(admin.get("/api/logs").await.status(), StatusCode::FORBIDDEN);
    let anonymous = w.portal.browser();
    assert_eq!(
        anonymous.get("/api/usage").await.status(),
        StatusCode::FORBIDDEN
    );
    assert_redirect(&anonymous.get("/usage").await, "/login");
    assert_redirect(&anonymous.get("/logs").await, "/login");
}

/// The request ids of a log page, in order, and its "Older" link.
fn log_page(html: &str) -> (Vec<String>, Option<String>) {
    let ids = html
        .split(r#"data-request-id=""#)
        .skip(1)
        .map(|s| s[..s.find('"').unwrap()].to_owned())
        .collect();
    let older = html
        .split_once(r#"rel="next" href=""#)
        .map(|(_, s)| s[..s.find('"').unwrap()].replace("&amp;", "&"));
    (ids, older)
}

/// Follows "Older" from `first` to the end; every id seen, in order.
async fn walk(b: &Browser, first: &str) -> (Vec<String>, usize) {
    let mut seen = Vec::new();
    let mut next = Some(first.to_owned());
    let mut pages = 0;
    while let Some(path) = next {
        let html = b.html(&path).await;
        let (ids, older) = log_page(&html);
        assert!(!ids.is_empty() || pages > 0, "{html}");
        assert!(ids.len() <= 50);
        if older.is_some() {
            assert_eq!(ids.len(), 50, "a page with an Older link is full");
        }
        seen.extend(ids);
        next = older;
        pages += 1;
        assert!(pages < 100, "pagination ends");
    }
    (seen, pages)
}

#[sqlx::test(migrations = "../migrations")]
async fn the_log_walks_every_event_once_newest_first(pool: PgPool) {
    let w = world(pool.clone()).await;
    let now = OffsetDateTime::now_utc();
    let [k1, k2] = w.keys;
    let mut events = Vec::new();
    for i in 0..130_i64 {
        // Pairs share a start time, so the request id must break ties.
        let at = now - Duration::seconds(i / 2 * 7);
        let (key, served) = match i % 3 {
            0 => (Some(k1), "llama"),
            1 => (Some(k2), "qwen"),
            _ => (None, "qwen"),
        };
        let mut e = event(w.acme, key, served, served, at, 10 + i, i % 5, 2 * i);
        if i % 4 == 0 {
            e.status = UsageStatus::ClientAbort;
        }
        events.push(e);
        events.push(event(
            w.globex,
            Some(w.globex_key),
            served,
            served,
            at,
            1,
            0,
            1,
        ));
    }
    // Shipped out of order, in small batches.
    for chunk in events.rchunks(17) {
        tf_core::db::usage::insert_batch(&pool, chunk)
            .await
            .unwrap();
    }
    let newest_first = |keep: &dyn Fn(&UsageEvent) -> bool| {
        let mut mine: Vec<&UsageEvent> = events
            .iter()
            .filter(|e| e.tenant_id == w.acme && keep(e))
            .collect();
        mine.sort_by_key(|e| std::cmp::Reverse((e.started_at, e.request_id)));
        mine.iter()
            .map(|e| e.request_id.to_string())
            .collect::<Vec<_>>()
    };
    let theirs: HashSet<String> = events
        .iter()
        .filter(|e| e.tenant_id == w.globex)
        .map(|e| e.request_id.to_string())
        .collect();

    let b = w.portal.browser();
    b.login(MEMBER, PASSWORD).await;
    let (seen, pages) = walk(&b, "/logs").await;
    assert_eq!(pages, 3);
    assert_eq!(
        seen,
        newest_first(&|_| true),
        "every event once, newest first"
    );
    assert!(seen.iter().all(|id| !theirs.contains(id)));

    // Filters hold on every page.
    let (seen, _) = walk(&b, "/logs?model=qwen&status=ok").await;
    assert_eq!(
        seen,
        newest_first(&|e| e.served_name == "qwen" && e.status == UsageStatus::Ok)
    );
    assert!(!seen.is_empty());
    let (seen, _) = walk(&b, &format!("/logs?key={k1}")).await;
    assert_eq!(seen, newest_first(&|e| e.api_key_id == Some(k1)));
    let (seen, _) = walk(&b, "/logs?key=none").await;
    assert_eq!(seen, newest_first(&|e| e.api_key_id.is_none()));
    let since = now - Duration::seconds(200);
    let until = now - Duration::seconds(100);
    let fmt = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]");
    let (seen, _) = walk(
        &b,
        &format!(
            "/logs?since={}&until={}",
            since.format(fmt).unwrap(),
            until.format(fmt).unwrap()
        ),
    )
    .await;
    let floor = |t: OffsetDateTime| t.replace_nanosecond(0).unwrap();
    assert_eq!(
        seen,
        newest_first(&|e| e.started_at >= floor(since) && e.started_at < floor(until))
    );
    assert!(!seen.is_empty());

    // A row shows its figures; the cost is the one cost function's, at the price book's rates.
    let first = events
        .iter()
        .filter(|e| e.tenant_id == w.acme)
        .max_by_key(|e| (e.started_at, e.request_id))
        .unwrap();
    let html = b.html("/logs").await;
    let row = html
        .split(&format!(r#"data-request-id="{}""#, first.request_id))
        .nth(1)
        .unwrap();
    let row = &row[..row.find("</tr>").unwrap()];
    // The first page's costs share one number of decimals (issue 37, item 4).
    let first_page: Vec<String> = newest_first(&|_| true).into_iter().take(50).collect();
    let column = Decimals::for_amounts(
        events
            .iter()
            .filter(|e| first_page.contains(&e.request_id.to_string()))
            .map(|e| cost(e, &start_prices())),
    );
    let cost = cost(first, &start_prices());
    assert!(row.contains(&column.show(cost)), "{row}");
    assert!(
        row.contains(r#"<td class="num">345</td>"#) && row.contains(r#"<td class="num">12</td>"#),
        "{row}"
    );

    // Another tenant walks only its own rows, even with acme's key id and a forged cursor.
    let eve = w.portal.browser();
    eve.login(OTHER, PASSWORD).await;
    let (seen, _) = walk(&eve, "/logs").await;
    assert_eq!(seen.len(), theirs.len());
    assert!(seen.iter().all(|id| theirs.contains(id)));
    let (seen, _) = walk(&eve, &format!("/logs?key={k1}")).await;
    assert!(seen.iter().all(|id| theirs.contains(id)));
    let html = eve.html(&format!("/logs?key={k1}")).await;
    assert!(!html.contains("tf-prod0001"));
}
