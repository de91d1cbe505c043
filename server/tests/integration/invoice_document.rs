//! The invoice as a document (issue 31): numbers given at issue, gapless per series and year
//! (a refused issue uses none), the issuer and the tenant's billing address copied onto the
//! invoice then (later edits never change it), a due date from the payment terms; owners set
//! the billing address and admins the issuer, each audited; the pages show the document and the
//! CSV names the number.

#![expect(
    clippy::unwrap_used,
    clippy::panic,
    reason = "a test helper that fails should fail the test loudly"
)]

use crate::common;

use common::portal::{assert_redirect, location, Browser, TestPortal, ADMIN, MEMBER, PASSWORD};
use common::TestApp;
use reqwest::header::CONTENT_DISPOSITION;
use sqlx::PgPool;
use tf_core::accounts::AccountError;
use tf_core::billing_ops as ops;
use tf_core::db::billing::{self, Draft, Runs};
use tf_core::db::documents::{self, Issuer};
use tf_core::money::Rates;
use tf_core::operator::Actor;
use tf_core::period::month_of;
use tf_core::usage::UsageEvent;
use time::macros::{date, datetime};
use time::{Duration, OffsetDateTime};
use uuid::Uuid;

fn event(tenant: Uuid, at: OffsetDateTime) -> UsageEvent {
    common::usage_event::stored(tenant, at, (10, 0, 5))
}

async fn priced(pool: &PgPool) {
    let rates = Rates {
        fresh_per_m: 1_000_000,
        cached_per_m: 0,
        output_per_m: 2_000_000,
    };
    billing::set_price(
        pool,
        datetime!(2000-01-01 0:00 UTC),
        "m",
        "standard",
        rates,
        "t",
    )
    .await
    .unwrap()
    .unwrap();
}

async fn rated(pool: &PgPool, tenant: Uuid, at: &[OffsetDateTime]) {
    let events: Vec<_> = at.iter().map(|t| event(tenant, *t)).collect();
    tf_core::db::usage::insert_batch(pool, &events)
        .await
        .unwrap();
    let live = billing::live_run(pool).await.unwrap();
    billing::drain(pool, live, 1000).await.unwrap();
}

async fn draft(pool: &PgPool, tenant: Uuid, month: time::Date) -> Uuid {
    match billing::build_draft(pool, tenant, month, Runs::Kept)
        .await
        .unwrap()
    {
        Draft::Built(id) => id,
        other => panic!("not built: {other:?}"),
    }
}

async fn document(pool: &PgPool, id: Uuid) -> documents::Document {
    documents::of_invoice(pool, None, id)
        .await
        .unwrap()
        .unwrap()
}

async fn actions(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar!(r#"SELECT action || ' ' || actor AS "a!" FROM audit_log ORDER BY id"#)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = "../migrations")]
async fn issued_invoices_are_numbered_without_gaps_and_keep_their_parties(pool: PgPool) {
    let acme = tf_core::db::accounts::insert_tenant(&pool, "acme", "Acme Labs")
        .await
        .unwrap()
        .id;
    let globex = tf_core::db::accounts::insert_tenant(&pool, "globex", "")
        .await
        .unwrap()
        .id;
    priced(&pool).await;
    let (may, june) = (date!(2026 - 05 - 01), date!(2026 - 06 - 01));
    for t in [acme, globex] {
        rated(
            &pool,
            t,
            &[
                datetime!(2026-05-10 12:00 UTC),
                datetime!(2026-06-10 12:00 UTC),
            ],
        )
        .await;
    }
    ops::set_billing_address(
        &pool,
        &Actor::CLI,
        acme,
        "Acme Labs GmbH\r\nMain St 1  \r\nBerlin\r\n",
    )
    .await
    .unwrap();
    let issuer = Issuer {
        name: "GPU Cloud Ltd".into(),
        address: "1 Dock Rd\nLondon\nVAT GB123".into(),
        due_days: 14,
    };
    ops::set_issuer(&pool, &Actor::CLI, &issuer).await.unwrap();

    let acme_may = draft(&pool, acme, may).await;
    let globex_may = draft(&pool, globex, may).await;
    let acme_june = draft(&pool, acme, june).await;
    // A draft has no number or due date, and shows the parties as they are now.
    let d = document(&pool, acme_may).await;
    assert_eq!(d.number, None);
    assert_eq!(d.due_at, None);
    assert_eq!(
        d.bill_to,
        "Acme Labs (acme)\nAcme Labs GmbH\nMain St 1\nBerlin"
    );
    assert_eq!(d.issuer, "GPU Cloud Ltd\n1 Dock Rd\nLondon\nVAT GB123");
    assert_eq!(d.due_days, 14);

    let year = OffsetDateTime::now_utc().year();
    ops::issue(&pool, &Actor::CLI, acme_may).await.unwrap();
    // The open month's issue is refused and uses no number.
    let now = OffsetDateTime::now_utc();
    rated(&pool, acme, &[now - Duration::seconds(1)]).await;
    let open = draft(&pool, acme, month_of(now)).await;
    assert!(matches!(
        ops::issue(&pool, &Actor::CLI, open).await,
        Err(AccountError::Invalid(_))
    ));
    ops::issue(&pool, &Actor::CLI, globex_may).await.unwrap();
    ops::issue(&pool, &Actor::CLI, acme_june).await.unwrap();
    let numbers: Vec<Option<String>> = {
        let mut n = Vec::new();
        for id in [acme_may, globex_may, acme_june, open] {
            n.push(document(&pool, id).await.number);
        }
        n
    };
    assert_eq!(
        numbers,
        [
            Some(format!("INV-{year}-000001")),
            Some(format!("INV-{year}-000002")),
            Some(format!("INV-{year}-000003")),
            None
        ]
    );

    // Issued: the parties and terms are the invoice's own; editing the sources changes drafts only.
    let issued = document(&pool, acme_may).await;
    let inv = billing::invoice(&pool, acme, acme_may)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        issued.due_at,
        Some(inv.issued_at.unwrap() + Duration::days(14))
    );
    let globex_doc = document(&pool, globex_may).await;
    assert_eq!(
        globex_doc.bill_to, "globex (globex)",
        "no display name, no address"
    );
    ops::set_billing_address(&pool, &Actor::CLI, acme, "Acme Labs Inc\nParis")
        .await
        .unwrap();
    let renamed = Issuer {
        name: "Other Cloud".into(),
        address: String::new(),
        due_days: 30,
    };
    ops::set_issuer(&pool, &Actor::CLI, &renamed).await.unwrap();
    assert_eq!(document(&pool, acme_may).await, issued);
    let open_doc = document(&pool, open).await;
    assert_eq!(open_doc.bill_to, "Acme Labs (acme)\nAcme Labs Inc\nParis");
    assert_eq!(open_doc.issuer, "Other Cloud");

    // Not even the owner role rewrites a number: an issued invoice is immutable.
    let rewrite = sqlx::query("UPDATE invoices SET number = 'INV-1-1' WHERE id = $1")
        .bind(acme_may)
        .execute(&pool)
        .await;
    assert!(rewrite.is_err(), "{rewrite:?}");

    // A credit note has its own series.
    let note = ops::correct(&pool, &Actor::CLI, acme_may).await.unwrap();
    assert_eq!(
        document(&pool, note).await.number,
        Some(format!("CN-{year}-000001"))
    );

    // Out of bounds: refused, nothing changed, nothing audited.
    for bad in [
        Issuer {
            name: "  ".into(),
            ..renamed.clone()
        },
        Issuer {
            due_days: 366,
            ..renamed.clone()
        },
        Issuer {
            address: "x".repeat(1001),
            ..renamed.clone()
        },
    ] {
        assert!(matches!(
            ops::set_issuer(&pool, &Actor::CLI, &bad).await,
            Err(AccountError::Invalid(_))
        ));
    }
    assert!(matches!(
        ops::set_billing_address(&pool, &Actor::CLI, acme, &"y".repeat(1001)).await,
        Err(AccountError::Invalid(_))
    ));
    assert_eq!(documents::issuer(&pool).await.unwrap(), renamed);
    let audited: Vec<String> = actions(&pool)
        .await
        .into_iter()
        .filter(|a| a.starts_with("invoice.issuer") || a.starts_with("tenant.billing_address"))
        .collect();
    assert_eq!(
        audited,
        [
            "tenant.billing_address cli",
            "invoice.issuer cli",
            "tenant.billing_address cli",
            "invoice.issuer cli"
        ]
    );
}

async fn signed_in(p: &TestPortal, email: &str) -> Browser {
    let b = p.browser();
    let res = b.login(email, PASSWORD).await;
    assert!(res.status().is_redirection(), "{}", res.status());
    b
}

async fn submit(b: &Browser, page: &str, action: &str, fields: &[(&str, &str)]) -> String {
    let token = b.token_on(page).await;
    let mut form = vec![("csrf", token.as_str())];
    form.extend_from_slice(fields);
    let res = b.post(action, &form).await;
    assert!(res.status().is_redirection(), "{action}: {}", res.status());
    location(&res).unwrap().to_owned()
}

#[sqlx::test(migrations = "../migrations")]
async fn the_pages_show_the_document_and_the_csv_names_its_number(pool: PgPool) {
    let p = TestApp::builder(pool.clone()).start_portal().await;
    let acme = tf_core::accounts::find_tenant(&pool, "acme")
        .await
        .unwrap()
        .id;
    priced(&pool).await;
    rated(&pool, acme, &[datetime!(2026-05-10 12:00 UTC)]).await;

    // The owner addresses the invoices (with the CSRF token; audited with their email).
    let owner = signed_in(&p, MEMBER).await;
    let to = submit(
        &owner,
        "/invoices",
        "/api/save_billing_address",
        &[("address", "Acme Labs GmbH\r\nBerlin")],
    )
    .await;
    assert_eq!(to, "/invoices");
    assert!(owner
        .html("/invoices")
        .await
        .contains("Acme Labs GmbH\nBerlin"));
    assert_eq!(
        documents::billing_address(&pool, acme).await.unwrap(),
        "Acme Labs GmbH\nBerlin"
    );
    assert!(actions(&pool)
        .await
        .contains(&format!("tenant.billing_address {MEMBER}")));
    // Without the token: nothing changes.
    let res = owner
        .post("/api/save_billing_address", &[("address", "forged")])
        .await;
    assert!(res.status().is_redirection() || res.status().is_client_error());
    assert_eq!(
        documents::billing_address(&pool, acme).await.unwrap(),
        "Acme Labs GmbH\nBerlin"
    );

    // The admin sets the issuer on /admin/invoices.
    let admin = p.browser();
    assert_redirect(&admin.login(ADMIN, PASSWORD).await, "/admin");
    submit(
        &admin,
        "/admin/invoices",
        "/api/admin_set_issuer",
        &[
            ("name", "GPU Cloud Ltd"),
            ("address", "1 Dock Rd\nLondon"),
            ("due_days", "14"),
        ],
    )
    .await;
    assert_eq!(documents::issuer(&pool).await.unwrap().due_days, 14);
    submit(
        &admin,
        "/admin/invoices",
        "/api/admin_set_issuer",
        &[
            ("name", "GPU Cloud Ltd"),
            ("address", ""),
            ("due_days", "fourteen"),
        ],
    )
    .await;
    assert_eq!(
        documents::issuer(&pool).await.unwrap().address,
        "1 Dock Rd\nLondon",
        "a refused form changes nothing"
    );

    let id = draft(&pool, acme, date!(2026 - 05 - 01)).await;
    let html = owner.html(&format!("/invoices/{id}")).await;
    assert!(html.contains("assigned when issued"), "{html}");
    assert!(html.contains("14 days after issue"), "{html}");
    ops::issue(&pool, &Actor::CLI, id).await.unwrap();
    let number = document(&pool, id).await.number.unwrap();
    let html = owner.html(&format!("/invoices/{id}")).await;
    for shown in [
        number.as_str(),
        "GPU Cloud Ltd",
        "1 Dock Rd",
        "Acme Labs GmbH",
        "Berlin",
        "2026-05-01 00:00",
        "2026-06-01 00:00",
    ] {
        assert!(html.contains(shown), "{shown} on the page");
    }
    let due = document(&pool, id).await.due_at.unwrap();
    let due = format!(
        "{}-{:02}-{:02}",
        due.year(),
        u8::from(due.month()),
        due.day()
    );
    assert!(html.contains(&due), "due {due} on the page");
    assert!(owner.html("/invoices").await.contains(&number));
    assert!(admin.html("/admin/invoices").await.contains(&number));
    assert!(admin
        .html(&format!("/admin/invoices/{id}"))
        .await
        .contains(&number));

    let res = owner.get(&format!("/invoices/{id}.csv")).await;
    assert_eq!(
        res.headers()[CONTENT_DISPOSITION],
        format!("attachment; filename=\"invoice-{number}.csv\"").as_str()
    );
    let csv = res.text().await.unwrap();
    let mut lines = csv.lines();
    assert!(lines.next().unwrap().ends_with(",invoice_number"));
    for line in lines {
        assert!(line.ends_with(&format!(",{number}")), "{line}");
    }
}
