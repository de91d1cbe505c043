//! Billing in the portal (issue 16): `/invoices` with figures worked out by hand from known events
//! and prices, the open month's draft computed live, the CSV of an invoice, isolation between
//! tenants, `/admin/prices` and `/admin/invoices` with their forms (CSRF, audited, role-checked,
//! a price change a new version, an issued invoice immutable), the monthly drafts the rater's
//! leader builds (driven by calling its tick with chosen times, no sleeping), and credit
//! raising the spend limit. Pages are read like a browser with JavaScript off.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a test helper that fails should fail the test loudly"
)]

use crate::common;

use common::eventually::wait_until;
use common::portal::*;
use common::{admin_limits, chat, TestApp, BASE};
use reqwest::header::{CONTENT_DISPOSITION, CONTENT_TYPE};
use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;
use tf_core::accounts::{self, Role};
use tf_core::billing_ops::{self, NewGrant, NewPrice};
use tf_core::db::billing::{self, Draft, Runs};
use tf_core::money::Rates;
use tf_core::operator::Actor;
use tf_core::usage::{Provenance, UsageEvent, UsageStatus};
use time::macros::datetime;
use time::{Duration, OffsetDateTime};
use tokenfactory::billing::rater::{self, Drafts, DraftsBuilt, RaterOptions};
use uuid::Uuid;

const OTHER: &str = "eve@globex.test";

fn event(
    tenant: Uuid,
    key: &str,
    at: OffsetDateTime,
    prompt: i64,
    cached: i64,
    out: i64,
) -> UsageEvent {
    UsageEvent {
        request_id: Uuid::now_v7(),
        tenant_id: tenant,
        api_key_id: None,
        served_name: key.into(),
        base_model: key.into(),
        adapter: None,
        graph: key.into(),
        price_key: key.into(),
        prompt_tokens: prompt,
        cached_tokens: cached,
        completion_tokens: out,
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

async fn rate_all(pool: &PgPool) {
    let live = billing::live_run(pool).await.unwrap();
    billing::drain(pool, live, 1000).await.unwrap();
}

fn price(key: &str, fresh: i64, cached: i64, output: i64) -> NewPrice {
    NewPrice {
        price_key: key.into(),
        tier: "standard".into(),
        rates: Rates {
            fresh_per_m: fresh,
            cached_per_m: cached,
            output_per_m: output,
        },
    }
}

/// llama: $2 fresh, $0.50 cached, $8 output per million; qwen: odd rates to show rounding.
/// Dated before every event of these tests: the book's own function, as operators may not
/// backdate a version (`billing_ops::set_prices` refuses it).
async fn prices(pool: &PgPool) {
    let list = [
        price("llama", 2_000_000, 500_000, 8_000_000),
        price("qwen", 1_234_567, 0, 3_000_001),
    ];
    let rows: Vec<(&str, &str, Rates)> = list
        .iter()
        .map(|p| (p.price_key.as_str(), p.tier.as_str(), p.rates))
        .collect();
    billing::set_prices(pool, datetime!(2020-01-01 00:00 UTC), &rows, "test")
        .await
        .unwrap()
        .unwrap();
}

/// The text of the element with this id.
fn text_of<'a>(html: &'a str, id: &str) -> &'a str {
    let at = html
        .find(&format!(r#"id="{id}""#))
        .unwrap_or_else(|| panic!("#{id} in {html}"));
    let start = at + html[at..].find('>').unwrap() + 1;
    let end = start + html[start..].find('<').unwrap();
    &html[start..end]
}

/// The `<tr>` of a page whose attributes contain `marker`.
fn row_of<'a>(html: &'a str, marker: &str) -> &'a str {
    let at = html
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} in {html}"));
    let start = html[..at].rfind("<tr").unwrap();
    let end = at + html[at..].find("</tr>").unwrap();
    &html[start..end]
}

async fn audited(pool: &PgPool, action: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = $1 AND actor = $2")
        .bind(action)
        .bind(ADMIN)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The month before the current one (closed), its 10th at noon, and now.
fn months() -> (String, OffsetDateTime, String) {
    let now = OffsetDateTime::now_utc();
    let closed = rater::previous_month(rater::month_of(now));
    let fmt = |d: time::Date| format!("{}-{:02}", d.year(), u8::from(d.month()));
    let at = closed
        .replace_day(10)
        .unwrap()
        .with_hms(12, 0, 0)
        .unwrap()
        .assume_utc();
    (fmt(closed), at, fmt(rater::month_of(now)))
}

#[sqlx::test(migrations = "../migrations")]
async fn invoices_show_hand_computed_figures_csv_and_nothing_of_another_tenant(pool: PgPool) {
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
    prices(&pool).await;
    let (closed, at, open) = months();
    let now = OffsetDateTime::now_utc();
    tf_core::db::usage::insert_batch(
        &pool,
        &[
            // 600 fresh x 2 + 400 cached x 0.5 + 500 out x 8 = 5,400 micros.
            event(acme, "llama", at, 1_000, 400, 500),
            // 333 x 2 + 77 x 8 = 1,282.
            event(acme, "llama", at + Duration::hours(1), 333, 0, 77),
            // (10 x 1,234,567 + 3 x 3,000,001) / 10^6 = 21.345673 -> 21 (half-up, once per line).
            event(acme, "qwen", at, 10, 0, 3),
            // The open month: 100 x 2 + 10 x 8 = 280.
            event(acme, "llama", now - Duration::seconds(1), 100, 0, 10),
            // And acme's adapter on llama, priced by its base: 200 x 2 + 25 x 8 = 600, a line
            // of its own under its own name.
            UsageEvent {
                served_name: "support-bot".into(),
                adapter: Some("support-bot".into()),
                ..event(acme, "llama", now - Duration::seconds(2), 200, 0, 25)
            },
            // Globex: 50 x 2 = 100.
            event(globex, "llama", at, 50, 0, 0),
        ],
    )
    .await
    .unwrap();
    rate_all(&pool).await;
    billing_ops::grant_credit(
        &pool,
        &Actor::CLI,
        &NewGrant {
            tenant: acme,
            tenant_name: "acme",
            amount_micros: 1_000,
            priority: 0,
            expires_at: None,
            note: "welcome",
        },
    )
    .await
    .unwrap();
    let month = rater::previous_month(rater::month_of(now));
    let Draft::Built(id) = billing::build_draft(&pool, acme, month, Runs::Kept)
        .await
        .unwrap()
    else {
        panic!("a draft")
    };
    let Draft::Built(theirs) = billing::build_draft(&pool, globex, month, Runs::Kept)
        .await
        .unwrap()
    else {
        panic!("a draft")
    };

    let b = portal.browser();
    assert_redirect(&b.get("/invoices").await, "/login");
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/");
    let html = b.html("/invoices").await;
    assert!(html.contains(r#"href="/invoices""#), "nav entry");
    assert_eq!(text_of(&html, "credit-balance"), "$0.001");
    // The closed month: usage 6,703, credit -1,000, total 5,703.
    let row = row_of(&html, &format!(r#"data-id="{id}""#));
    assert!(row.contains(&format!(r#"data-month="{closed}""#)), "{row}");
    for shown in ["$0.006703", "-$0.001", "$0.005703", "draft"] {
        assert!(row.contains(shown), "{shown} in {row}");
    }
    // The open month, live: 880 of usage, all of it covered by the (unburned) grant.
    let row = row_of(&html, r#"data-id="current""#);
    assert!(row.contains(&format!(r#"data-month="{open}""#)), "{row}");
    assert!(row.contains("draft (live)"), "{row}");
    assert!(row.contains("$0.00088"), "{row}");
    assert!(row.contains("-$0.00088"), "{row}");
    assert!(
        !html.contains(&theirs.to_string()),
        "globex's invoice is not listed"
    );

    let detail = b.html(&format!("/invoices/{id}")).await;
    let llama = row_of(&detail, r#"data-model="llama""#);
    for cell in [
        r#"class="num events">2<"#,
        r#"class="num fresh">933<"#,
        r#"class="num cached">400<"#,
        r#"class="num output">577<"#,
        r#"class="num amount">$0.006682<"#,
    ] {
        assert!(llama.contains(cell), "{cell} in {llama}");
    }
    let qwen = row_of(&detail, r#"data-model="qwen""#);
    assert!(qwen.contains(r#"class="num amount">$0.000021<"#), "{qwen}");
    let credit = row_of(&detail, r#"class="entry credit""#);
    assert!(credit.contains("-$0.001"), "{credit}");
    assert_eq!(text_of(&detail, "invoice-total"), "$0.005703");
    let live_page = b.html("/invoices/current").await;
    assert_eq!(text_of(&live_page, "invoice-total"), "$0.00");
    // A model per line, named as the request named it: the adapter is not shown as its base.
    let base = row_of(&live_page, r#"data-model="llama""#);
    assert!(base.contains(r#"<td>llama</td>"#), "{base}");
    assert!(base.contains(r#"class="num amount">$0.00028<"#), "{base}");
    let adapter = row_of(&live_page, r#"data-model="support-bot""#);
    assert!(adapter.contains(r#"<td>support-bot</td>"#), "{adapter}");
    assert!(
        adapter.contains(r#"class="num amount">$0.0006<"#),
        "{adapter}"
    );
    assert!(live_page.contains("computed now"), "{live_page}");

    // The CSV: the same entries, exactly.
    let res = b.get(&format!("/invoices/{id}.csv")).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()[CONTENT_TYPE], "text/csv; charset=utf-8");
    assert_eq!(
        res.headers()[CONTENT_DISPOSITION],
        format!("attachment; filename=\"invoice-acme-{closed}.csv\"").as_str()
    );
    let expected = format!(
        "invoice,month,status,kind,description,events,fresh_input_tokens,cached_input_tokens,output_tokens,amount_micros,amount,invoice_number\n\
         {id},{closed},draft,usage,llama,2,933,400,577,6682,$0.006682,\n\
         {id},{closed},draft,usage,qwen,1,10,0,3,21,$0.000021,\n\
         {id},{closed},draft,credit,prepaid credit,0,0,0,0,-1000,-$0.001,\n\
         {id},{closed},draft,total,total,,,,,5703,$0.005703,\n"
    );
    assert_eq!(res.text().await.unwrap(), expected);

    // Globex's member: acme's invoice is not found, page or CSV; an unknown id the same.
    let g = portal.browser();
    assert_redirect(&g.login(OTHER, PASSWORD).await, "/");
    let res = g.get(&format!("/invoices/{id}")).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let page = res.text().await.unwrap();
    assert!(
        page.contains("Invoice not found") && page.contains("topbar"),
        "inside the frame"
    );
    assert!(!page.contains("$0.005703") && !page.contains("qwen"));
    let res = g.get(&format!("/invoices/{id}.csv")).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert!(!res.text().await.unwrap().contains("6682"));
    assert_eq!(
        g.get(&format!("/invoices/{}", Uuid::now_v7()))
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        g.get("/invoices/not-an-id").await.status(),
        StatusCode::NOT_FOUND
    );
    let theirs_page = g.html(&format!("/invoices/{theirs}")).await;
    assert_eq!(text_of(&theirs_page, "invoice-total"), "$0.0001");

    // An admin has no tenant: the tenant page sends it home, the CSV is refused.
    let a = portal.browser();
    assert_redirect(&a.login(ADMIN, PASSWORD).await, "/admin");
    assert_redirect(&a.get("/invoices").await, "/admin");
    assert_eq!(
        a.get(&format!("/invoices/{id}.csv")).await.status(),
        StatusCode::FORBIDDEN
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn the_open_month_is_computed_live_and_nothing_is_stored(pool: PgPool) {
    let portal = TestApp::builder(pool.clone())
        .shared_redis()
        .start_portal()
        .await;
    let acme = accounts::find_tenant(&pool, "acme").await.unwrap().id;
    prices(&pool).await;
    let now = OffsetDateTime::now_utc();
    tf_core::db::usage::insert_batch(&pool, &[event(acme, "llama", now, 1_000_000, 0, 0)])
        .await
        .unwrap();
    rate_all(&pool).await;
    let b = portal.browser();
    assert_redirect(&b.login(MEMBER, PASSWORD).await, "/");
    let html = b.html("/invoices").await;
    assert!(
        row_of(&html, r#"data-id="current""#).contains("$2.00"),
        "{html}"
    );
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 0, "reading the page wrote no invoice");
    // More usage shows at once, without any build.
    tf_core::db::usage::insert_batch(&pool, &[event(acme, "llama", now, 500_000, 0, 0)])
        .await
        .unwrap();
    rate_all(&pool).await;
    let html = b.html("/invoices/current").await;
    assert_eq!(text_of(&html, "invoice-total"), "$3.00");
    let csv = b.get("/invoices/current.csv").await.text().await.unwrap();
    assert!(
        csv.contains(",usage,llama,2,1500000,0,0,3000000,$3.00,\n"),
        "{csv}"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn admins_issue_adjust_and_grant_from_the_invoices_page(pool: PgPool) {
    let portal = TestApp::builder(pool.clone())
        .shared_redis()
        .start_portal()
        .await;
    let acme = accounts::find_tenant(&pool, "acme").await.unwrap().id;
    prices(&pool).await;
    let (_, at, _) = months();
    tf_core::db::usage::insert_batch(&pool, &[event(acme, "llama", at, 1_000_000, 0, 0)])
        .await
        .unwrap();
    rate_all(&pool).await;
    let month = rater::previous_month(rater::month_of(OffsetDateTime::now_utc()));
    let Draft::Built(id) = billing::build_draft(&pool, acme, month, Runs::Kept)
        .await
        .unwrap()
    else {
        panic!("a draft")
    };
    let status = |pool: PgPool| async move {
        sqlx::query_scalar::<_, String>("SELECT status FROM invoices WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
    };

    // A member: 403 on the page and on every form, nothing changed.
    let m = portal.browser();
    assert_redirect(&m.login(MEMBER, PASSWORD).await, "/");
    let res = m.get("/admin/invoices").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(!res.text().await.unwrap().contains(&id.to_string()));
    let token = m.token_on("/invoices").await;
    let id_s = id.to_string();
    let res = m
        .post(
            "/api/admin_issue_invoice",
            &[("csrf", &token), ("id", &id_s)],
        )
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let res = m
        .post(
            "/api/admin_grant_credit",
            &[("csrf", &token), ("tenant", "acme"), ("amount", "5")],
        )
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(status(pool.clone()).await, "draft");
    assert_eq!(billing::credit_balance(&pool, acme).await.unwrap(), 0);

    let a = portal.browser();
    assert_redirect(&a.login(ADMIN, PASSWORD).await, "/admin");
    let html = a.html("/admin/invoices").await;
    assert!(html.contains(r#"href="/admin/invoices""#), "nav entry");
    let row = row_of(&html, &format!(r#"data-id="{id}""#));
    assert!(
        row.contains("Issue invoice") && row.contains("$2.00"),
        "{row}"
    );
    let token = csrf(&html);

    // An adjustment: refused without the CSRF token, then added and audited.
    let adjust = |t: &str| {
        let body = [
            ("csrf", t.to_owned()),
            ("id", id_s.clone()),
            ("description", "goodwill".to_owned()),
            ("amount", "-$0.50".to_owned()),
        ];
        let a = &a;
        async move {
            let form: Vec<(&str, &str)> = body.iter().map(|(k, v)| (*k, v.as_str())).collect();
            a.post("/api/admin_adjust_invoice", &form).await
        }
    };
    let res = adjust("wrong").await;
    assert!(res.status().is_redirection() || res.status() == StatusCode::FORBIDDEN);
    assert_eq!(
        billing::invoice_entries(&pool, acme, id)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_redirect(&adjust(&token).await, "/admin/invoices");
    let inv = billing::invoice(&pool, acme, id).await.unwrap().unwrap();
    assert_eq!(inv.total_micros, 1_500_000);
    assert_eq!(audited(&pool, "invoice.adjust").await, 1);

    // The operator's view of the invoice: whose it is, each entry, the total; the member gets
    // none of it; an unknown id is a 404.
    let html = a.html("/admin/invoices").await;
    assert!(html.contains(&format!(r#"href="/admin/invoices/{id}""#)));
    let html = a.html(&format!("/admin/invoices/{id}")).await;
    assert!(html.contains(r#"href="/admin/tenants/acme""#), "{html}");
    let usage = row_of(&html, r#"data-model="llama""#);
    assert!(
        usage.contains("$2.00") && usage.contains("1,000,000"),
        "{usage}"
    );
    assert!(
        html.contains("goodwill") && html.contains("-$0.50"),
        "{html}"
    );
    let total = &html[html.find(r#"id="invoice-total""#).unwrap()..];
    assert!(
        total[total.find('>').unwrap()..].starts_with(">$1.50<"),
        "{html}"
    );
    assert!(
        !html.contains("Download CSV"),
        "the tenant's CSV route is not the admin's"
    );
    let res = a.get(&format!("/admin/invoices/{}", Uuid::now_v7())).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let res = m.get(&format!("/admin/invoices/{id}")).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(!res.text().await.unwrap().contains("goodwill"));

    // Issue: refused without the token, then issued, audited and immutable.
    let res = a
        .post(
            "/api/admin_issue_invoice",
            &[("csrf", "nope"), ("id", &id_s)],
        )
        .await;
    assert!(res.status().is_redirection() || res.status() == StatusCode::FORBIDDEN);
    assert_eq!(status(pool.clone()).await, "draft");
    let res = a
        .post(
            "/api/admin_issue_invoice",
            &[("csrf", &token), ("id", &id_s)],
        )
        .await;
    assert_redirect(&res, "/admin/invoices");
    assert_eq!(status(pool.clone()).await, "issued");
    assert_eq!(audited(&pool, "invoice.issue").await, 1);
    assert!(
        a.html("/admin/invoices").await.contains("Invoice issued"),
        "flash"
    );
    let edit = sqlx::query("UPDATE invoices SET total_micros = 1 WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await;
    assert!(edit.is_err(), "an issued invoice cannot be updated");
    let edit = sqlx::query("DELETE FROM invoice_entries WHERE invoice_id = $1")
        .bind(id)
        .execute(&pool)
        .await;
    assert!(edit.is_err(), "nor its entries deleted");
    // Issuing again or adjusting it now changes nothing.
    a.post(
        "/api/admin_issue_invoice",
        &[("csrf", &token), ("id", &id_s)],
    )
    .await;
    assert!(a.html("/admin/invoices").await.contains("already issued"));
    adjust(&token).await;
    assert_eq!(
        billing::invoice(&pool, acme, id)
            .await
            .unwrap()
            .unwrap()
            .total_micros,
        1_500_000
    );
    assert_eq!(audited(&pool, "invoice.issue").await, 1);

    // A credit grant, audited; the tenant sees its balance.
    let res = a
        .post(
            "/api/admin_grant_credit",
            &[
                ("csrf", &token),
                ("tenant", "acme"),
                ("amount", "$5"),
                ("priority", "1"),
                ("expires", "2099-01-01T00:00"),
                ("note", "prepaid"),
            ],
        )
        .await;
    assert_redirect(&res, "/admin/invoices");
    assert_eq!(
        billing::credit_balance(&pool, acme).await.unwrap(),
        5_000_000
    );
    assert_eq!(audited(&pool, "credit.grant").await, 1);
    let grants = billing::credit_grants(&pool, acme).await.unwrap();
    assert_eq!(grants[0].expires_at, Some(datetime!(2099-01-01 00:00 UTC)));
    assert_eq!(grants[0].priority, 1);
    a.post(
        "/api/admin_grant_credit",
        &[("csrf", &token), ("tenant", "acme"), ("amount", "-3")],
    )
    .await;
    assert_eq!(billing::credit_grants(&pool, acme).await.unwrap().len(), 1);
    let html = m.html("/invoices").await;
    assert_eq!(text_of(&html, "credit-balance"), "$5.00");
    assert!(row_of(&html, &format!(r#"data-id="{id}""#)).contains("issued"));
}

#[sqlx::test(migrations = "../migrations")]
async fn a_price_set_on_the_page_is_a_new_version_and_tiers_are_assigned(pool: PgPool) {
    let portal = TestApp::builder(pool.clone())
        .shared_redis()
        .start_portal()
        .await;
    prices(&pool).await;
    let before = billing::versions(&pool).await.unwrap();
    let old = before.last().unwrap().id;
    let old_prices = billing::prices_of_version(&pool, old).await.unwrap();

    let a = portal.browser();
    assert_redirect(&a.login(ADMIN, PASSWORD).await, "/admin");
    let html = a.html("/admin/prices").await;
    assert!(html.contains(r#"href="/admin/prices""#), "nav entry");
    let current = row_of(&html, r#"data-key="llama""#);
    for shown in ["$2.00", "$0.50", "$8.00"] {
        assert!(current.contains(shown), "{shown} in {current}");
    }
    let token = csrf(&html);
    let set = |t: &'static str, from: &'static str| {
        vec![
            ("csrf", t),
            ("price_key", "llama"),
            ("tier", "standard"),
            ("fresh_per_m", "1"),
            ("cached_per_m", "$0.25"),
            ("output_per_m", "4.00"),
            ("effective_from", from),
        ]
    };
    let res = a.post("/api/admin_set_price", &set("wrong", "")).await;
    assert!(res.status().is_redirection() || res.status() == StatusCode::FORBIDDEN);
    assert_eq!(billing::versions(&pool).await.unwrap().len(), before.len());
    // Backdated before the latest version: refused.
    let token: &'static str = Box::leak(token.into_boxed_str());
    let res = a
        .post("/api/admin_set_price", &set(token, "2019-06-01T00:00"))
        .await;
    assert_redirect(&res, "/admin/prices");
    assert!(a.html("/admin/prices").await.contains("nothing was saved"));
    assert_eq!(billing::versions(&pool).await.unwrap().len(), before.len());
    let res = a.post("/api/admin_set_price", &set(token, "")).await;
    assert_redirect(&res, "/admin/prices");
    let after = billing::versions(&pool).await.unwrap();
    assert_eq!(after.len(), before.len() + 1, "a new version");
    assert_eq!(
        billing::prices_of_version(&pool, old).await.unwrap(),
        old_prices,
        "the old version is kept as it was"
    );
    let new = billing::prices_of_version(&pool, after.last().unwrap().id)
        .await
        .unwrap();
    let llama = new.iter().find(|p| p.price_key == "llama").unwrap();
    assert_eq!(
        llama.rates,
        Rates {
            fresh_per_m: 1_000_000,
            cached_per_m: 250_000,
            output_per_m: 4_000_000
        }
    );
    assert!(
        new.iter().any(|p| p.price_key == "qwen"),
        "others carried over"
    );
    assert_eq!(after.last().unwrap().created_by, ADMIN);
    assert_eq!(audited(&pool, "prices.set").await, 1);
    let html = a.html("/admin/prices").await;
    assert!(html.contains("Price version saved"), "flash");
    assert!(
        row_of(&html, r#"data-key="llama""#).contains("$4.00"),
        "the new one in effect"
    );
    assert!(
        html.contains(&format!(r#"data-version="{old}""#)),
        "the old one listed"
    );

    // Tiers: add one, put acme in it, audited.
    let res = a
        .post(
            "/api/admin_add_tier",
            &[("csrf", token), ("name", "enterprise")],
        )
        .await;
    assert_redirect(&res, "/admin/prices");
    let res = a
        .post(
            "/api/admin_set_tier",
            &[("csrf", token), ("tenant", "acme"), ("tier", "enterprise")],
        )
        .await;
    assert_redirect(&res, "/admin/prices");
    let tier: String = sqlx::query_scalar("SELECT tier FROM tenants WHERE name = 'acme'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(tier, "enterprise");
    assert_eq!(audited(&pool, "tenant.tier").await, 1);
    a.post(
        "/api/admin_set_tier",
        &[("csrf", token), ("tenant", "acme"), ("tier", "nope")],
    )
    .await;
    assert!(a.html("/admin/prices").await.contains("No such tier"));

    // A member: 403 on the page and the form, nothing changed.
    let m = portal.browser();
    assert_redirect(&m.login(MEMBER, PASSWORD).await, "/");
    let res = m.get("/admin/prices").await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(!res.text().await.unwrap().contains("$8.00"));
    let t = m.token_on("/invoices").await;
    let res = m
        .post(
            "/api/admin_set_price",
            &[
                ("csrf", &t),
                ("price_key", "llama"),
                ("tier", "standard"),
                ("fresh_per_m", "1"),
                ("cached_per_m", "1"),
                ("output_per_m", "1"),
            ],
        )
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(billing::versions(&pool).await.unwrap().len(), after.len());
}

/// The rater's leader keeps the drafts: the open month's every `drafts_every`, the closed month's
/// once after the grace; never issued. Driven by calling the tick with chosen times.
#[sqlx::test(migrations = "../migrations")]
async fn drafts_are_rebuilt_while_open_and_finalised_after_the_grace(pool: PgPool) {
    let acme = accounts::create_tenant(&pool, "acme", "Acme")
        .await
        .unwrap()
        .id;
    let idle = accounts::create_tenant(&pool, "idle", "Idle")
        .await
        .unwrap()
        .id;
    prices(&pool).await;
    // 1M fresh llama tokens = $2 each.
    let ev = |at| event(acme, "llama", at, 1_000_000, 0, 0);
    tf_core::db::usage::insert_batch(
        &pool,
        &[
            ev(datetime!(2026-05-31 23:59:59 UTC)),
            ev(datetime!(2026-06-01 00:00 UTC)),
        ],
    )
    .await
    .unwrap();
    rate_all(&pool).await;
    let options = RaterOptions {
        drafts_every: std::time::Duration::from_secs(300),
        close_grace: std::time::Duration::from_secs(3_600),
        ..RaterOptions::default()
    };
    let mut state = Drafts::default();
    let total = |month: time::Date| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT total_micros FROM invoices WHERE tenant_id = $1 AND period_start = $2",
            )
            .bind(acme)
            .bind(month)
            .fetch_optional(&pool)
            .await
            .unwrap()
        }
    };
    let june = time::macros::date!(2026 - 06 - 01);
    let may = time::macros::date!(2026 - 05 - 01);

    let t0 = datetime!(2026-06-01 00:10 UTC);
    let built = rater::drafts_tick(&pool, t0, &options, &mut state)
        .await
        .unwrap();
    assert_eq!(
        built,
        DraftsBuilt {
            open: 1,
            closed: 0,
            issued: 0
        },
        "within the grace"
    );
    assert_eq!(total(june).await, Some(2_000_000));
    assert_eq!(total(may).await, None);
    // Not due a minute later; more usage waits for the next build.
    tf_core::db::usage::insert_batch(&pool, &[ev(datetime!(2026-06-01 00:10 UTC))])
        .await
        .unwrap();
    rate_all(&pool).await;
    let built = rater::drafts_tick(&pool, t0 + Duration::minutes(1), &options, &mut state)
        .await
        .unwrap();
    assert_eq!(built, DraftsBuilt::default());
    assert_eq!(total(june).await, Some(2_000_000));
    let built = rater::drafts_tick(&pool, t0 + Duration::minutes(5), &options, &mut state)
        .await
        .unwrap();
    assert_eq!(built.open, 1);
    assert_eq!(total(june).await, Some(4_000_000), "rebuilt, not added to");
    // A late May event (journaled while PostgreSQL was away) arrives within the grace.
    tf_core::db::usage::insert_batch(&pool, &[ev(datetime!(2026-05-20 08:00 UTC))])
        .await
        .unwrap();
    rate_all(&pool).await;
    let t1 = datetime!(2026-06-01 01:00 UTC);
    let built = rater::drafts_tick(&pool, t1, &options, &mut state)
        .await
        .unwrap();
    assert_eq!(
        built,
        DraftsBuilt {
            open: 1,
            closed: 1,
            issued: 0
        }
    );
    assert_eq!(total(may).await, Some(4_000_000), "both May events");
    let built = rater::drafts_tick(&pool, t1 + Duration::minutes(1), &options, &mut state)
        .await
        .unwrap();
    assert_eq!(built, DraftsBuilt::default(), "the closed month once");
    let statuses: Vec<String> = sqlx::query_scalar("SELECT DISTINCT status FROM invoices")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(statuses, ["draft"], "never issued automatically");
    let idle_invoices: i64 =
        sqlx::query_scalar("SELECT count(*) FROM invoices WHERE tenant_id = $1")
            .bind(idle)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(idle_invoices, 0, "no draft without usage");

    // Once issued, a new leader's first tick leaves the month alone.
    let may_id: Uuid = sqlx::query_scalar("SELECT id FROM invoices WHERE period_start = $1")
        .bind(may)
        .fetch_one(&pool)
        .await
        .unwrap();
    billing_ops::issue(&pool, &Actor::CLI, may_id)
        .await
        .unwrap();
    let mut fresh = Drafts::default();
    let built = rater::drafts_tick(&pool, t1 + Duration::minutes(2), &options, &mut fresh)
        .await
        .unwrap();
    assert_eq!(
        built,
        DraftsBuilt {
            open: 1,
            closed: 0,
            issued: 1
        }
    );
    let may_count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM invoices WHERE period_start = $1")
            .bind(may)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(may_count, 1);
    // A new month: its drafts start at once.
    let july = datetime!(2026-07-01 00:00:30 UTC);
    tf_core::db::usage::insert_batch(&pool, &[ev(july)])
        .await
        .unwrap();
    rate_all(&pool).await;
    let built = rater::drafts_tick(&pool, july, &options, &mut fresh)
        .await
        .unwrap();
    assert_eq!(built.open, 1);
    assert_eq!(
        total(time::macros::date!(2026 - 07 - 01)).await,
        Some(2_000_000)
    );
}

/// The spend limit counts a tenant's charges net of its remaining credit: the limit enforced is
/// the stored one plus the balance; expired grants and burned credit do not count; no limit
/// stays no limit; key limits are untouched.
#[sqlx::test(migrations = "../migrations")]
async fn credit_raises_the_tenant_spend_limit_by_what_is_left(pool: PgPool) {
    use tf_core::db::limits::{self, Change, RateChange};
    let t = accounts::create_tenant(&pool, "acme", "Acme")
        .await
        .unwrap()
        .id;
    let key = tf_core::db::keys::insert(
        &pool,
        &tf_core::db::keys::NewKey {
            tenant_id: t,
            name: "k",
            prefix: "tf-abcdefgh",
            sha256: &[7; 32],
        },
    )
    .await
    .unwrap()
    .id;
    let enforced = || {
        let pool = pool.clone();
        async move {
            let row = limits::for_key(&pool, t, key).await.unwrap();
            (row.tenant.spend_limit_micros, row.key.spend_limit_micros)
        }
    };
    let grant = |amount, expires_at| {
        let pool = pool.clone();
        async move {
            billing_ops::grant_credit(
                &pool,
                &Actor::CLI,
                &NewGrant {
                    tenant: t,
                    tenant_name: "acme",
                    amount_micros: amount,
                    priority: 0,
                    expires_at,
                    note: "",
                },
            )
            .await
            .unwrap()
        }
    };
    grant(700, None).await;
    assert_eq!(enforced().await, (None, None), "credit creates no limit");
    let set = |value| RateChange {
        spend_limit_micros: Change {
            given: true,
            value: Some(value),
        },
        ..RateChange::default()
    };
    limits::update_tenant(&pool, t, &set(1_000), &Default::default())
        .await
        .unwrap();
    limits::update_key(&pool, key, t, &set(10)).await.unwrap();
    assert_eq!(enforced().await, (Some(1_700), Some(10)));
    // Expired before the month the invoice below is for, so nothing burns it there either.
    let month = rater::previous_month(rater::month_of(OffsetDateTime::now_utc()));
    // Recorded directly: an operator's grant with a past expiry is refused.
    billing::grant_credit(
        &pool,
        t,
        5_000,
        0,
        Some(month.midnight().assume_utc() - Duration::hours(1)),
        "",
        "test",
    )
    .await
    .unwrap();
    assert_eq!(
        enforced().await,
        (Some(1_700), Some(10)),
        "expired credit counts for nothing"
    );
    // An issued invoice burns 200 of the grant: the limit comes down by as much.
    prices(&pool).await;
    let (_, at, _) = months();
    tf_core::db::usage::insert_batch(&pool, &[event(t, "llama", at, 100, 0, 0)])
        .await
        .unwrap();
    rate_all(&pool).await;
    let Draft::Built(id) = billing::build_draft(&pool, t, month, Runs::Kept)
        .await
        .unwrap()
    else {
        panic!("a draft")
    };
    assert_eq!(
        enforced().await,
        (Some(1_700), Some(10)),
        "a draft burns nothing"
    );
    billing_ops::issue(&pool, &Actor::CLI, id).await.unwrap();
    assert_eq!(billing::credit_balance(&pool, t).await.unwrap(), 500);
    assert_eq!(enforced().await, (Some(1_500), Some(10)));
    // Saturates instead of overflowing.
    limits::update_tenant(&pool, t, &set(i64::MAX), &Default::default())
        .await
        .unwrap();
    assert_eq!(enforced().await, (Some(i64::MAX), Some(10)));
}

/// The same through the gateway: a request refused at the spend limit is admitted once credit is
/// granted, within the limits' cache refresh (a second), without touching the limit.
#[sqlx::test(migrations = "../migrations")]
async fn a_request_refused_at_the_spend_limit_goes_through_once_credit_is_granted(pool: PgPool) {
    let app = TestApp::builder(pool.clone()).shared_redis().start().await;
    let acme = app.tenant("acme").await;
    common::price_every_token(&pool, 1).await;
    admin_limits(&pool, &["--tenant", "acme", "--spend-limit", "0.00006"]).await;
    let mut body = chat(BASE, "hello world", 23);
    body["sim"] = json!({"completion_tokens": 3});
    let mut refused = false;
    for _ in 0..40 {
        let r = app
            .post(&acme.key, "/v1/chat/completions", body.clone())
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "insufficient_quota");
            refused = true;
            break;
        }
        assert!(r.status().is_success(), "{}", r.status());
    }
    assert!(refused, "the spend limit is reached");
    billing_ops::grant_credit(
        &pool,
        &Actor::CLI,
        &NewGrant {
            tenant: acme.id,
            tenant_name: "acme",
            amount_micros: 100_000,
            priority: 0,
            expires_at: None,
            note: "top-up",
        },
    )
    .await
    .unwrap();
    wait_until(
        std::time::Duration::from_secs(5),
        "credit raises the spend limit",
        || {
            let r = app.post(&acme.key, "/v1/chat/completions", body.clone());
            async move { r.send().await.unwrap().status().is_success() }
        },
    )
    .await;
}
