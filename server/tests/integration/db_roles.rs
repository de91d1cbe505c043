//! Two database roles (issue 31): `serve` connected as a member of `tokenfactory_app` can do
//! everything billing does (store usage, rate, re-rate, grant credit, build and issue invoices,
//! audit) and cannot rewrite history: no trigger disabled, no issued invoice or burned grant
//! changed, no usage event, charge line or audit row updated or deleted. `serve` refuses to run
//! as a superuser or an owner of the schema without `--allow-owner-role`, and says why.
//!
//! Roles are cluster-wide: each test makes its own login role (a unique name) and drops it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use clap::Parser;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tf_core::billing_ops::{self as ops, NewGrant};
use tf_core::db::billing::{self, Draft, Runs};
use tf_core::db::roles::{self, APP_ROLE};
use tf_core::money::Rates;
use tf_core::operator::Actor;
use tf_core::usage::UsageEvent;
use time::macros::{date, datetime};
use time::OffsetDateTime;
use uuid::Uuid;

/// A login role of this test, connected to the test's database; dropped by [`LoginRole::drop`].
struct LoginRole {
    name: String,
    pool: PgPool,
    url: String,
}

impl LoginRole {
    /// `CREATE ROLE <unique> LOGIN <extra>` and a pool connected as it.
    async fn create(admin: &PgPool, extra: &str) -> Self {
        let name = format!("tf_test_{}", Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE ROLE {name} LOGIN {extra}"))
            .execute(admin)
            .await
            .unwrap();
        let db: String = sqlx::query_scalar("SELECT current_database()")
            .fetch_one(admin)
            .await
            .unwrap();
        let opts = admin.connect_options();
        let url = format!(
            "postgres://{name}@{}:{}/{db}",
            opts.get_host(),
            opts.get_port()
        );
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect(&url)
            .await
            .unwrap();
        Self { name, pool, url }
    }

    async fn drop(self, admin: &PgPool) {
        self.pool.close().await;
        sqlx::query(&format!("DROP ROLE {}", self.name))
            .execute(admin)
            .await
            .unwrap();
    }
}

fn event(tenant: Uuid, at: OffsetDateTime) -> UsageEvent {
    crate::common::usage_event::stored(tenant, at, (10, 3, 7))
}

/// The SQLSTATE of a refused statement (panics if it was not refused).
async fn refused(pool: &PgPool, sql: &str) -> String {
    match sqlx::query(sql).execute(pool).await {
        Ok(done) => panic!("{sql} was allowed ({} rows)", done.rows_affected()),
        Err(e) => e
            .as_database_error()
            .and_then(|d| d.code())
            .unwrap_or_else(|| panic!("{sql}: {e}"))
            .into_owned(),
    }
}

const INSUFFICIENT_PRIVILEGE: &str = "42501";
const INTEGRITY: &str = "23000";

#[sqlx::test(migrations = "../migrations")]
async fn the_application_role_bills_but_cannot_rewrite_history(admin: PgPool) {
    let app = LoginRole::create(&admin, &format!("IN ROLE {APP_ROLE}")).await;
    let pool = &app.pool;
    let standing = roles::standing(pool).await.unwrap();
    assert_eq!(standing.too_powerful(), None, "{standing:?}");

    // Everything billing does, as the application role.
    let t = tf_core::db::accounts::insert_tenant(pool, "acme", "acme")
        .await
        .unwrap()
        .id;
    let rates = Rates {
        fresh_per_m: 1_000_000,
        cached_per_m: 500_000,
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
    let events: Vec<_> = [
        datetime!(2026-03-02 10:00 UTC),
        datetime!(2026-03-20 10:00 UTC),
    ]
    .iter()
    .map(|at| event(t, *at))
    .collect();
    tf_core::db::usage::insert_batch(pool, &events)
        .await
        .unwrap();
    let live = billing::live_run(pool).await.unwrap();
    assert_eq!(billing::drain(pool, live, 100).await.unwrap(), 2);
    let version = billing::versions(pool).await.unwrap().last().unwrap().id;
    let rerate = ops::rerate(
        pool,
        &Actor::CLI,
        t,
        "acme",
        datetime!(2026-03-01 0:00 UTC),
        datetime!(2026-03-10 0:00 UTC),
        version,
    )
    .await
    .unwrap();
    let grant = ops::grant_credit(
        pool,
        &Actor::CLI,
        &NewGrant {
            tenant: t,
            tenant_name: "acme",
            amount_micros: 30,
            priority: 0,
            expires_at: None,
            note: "",
        },
    )
    .await
    .unwrap();
    let march = date!(2026 - 03 - 01);
    let draft = ops::build_draft(pool, &Actor::CLI, t, march, Runs::Chosen(&[rerate]))
        .await
        .unwrap();
    let Draft::Built(invoice) = draft else {
        panic!("{draft:?}")
    };
    // Rebuilt once (entries and sources deleted and written again), then issued.
    ops::build_draft(pool, &Actor::CLI, t, march, Runs::Kept)
        .await
        .unwrap();
    ops::issue(pool, &Actor::CLI, invoice).await.unwrap();
    let issued = billing::invoice(pool, t, invoice).await.unwrap().unwrap();
    assert_eq!(
        issued.total_micros,
        2 * 23 - 30,
        "two events less the credit"
    );

    // History stays as it is.
    let denied = [
        "UPDATE usage_events SET completion_tokens = 0".to_owned(),
        "DELETE FROM usage_events".to_owned(),
        "DELETE FROM charge_lines".to_owned(),
        "UPDATE charge_lines SET amount_micros = 0".to_owned(),
        format!(
            "INSERT INTO charge_lines (run_id, request_id, tenant_id, price_key, started_at, \
             fresh_tokens, cached_tokens, output_tokens, amount_micros) \
             VALUES ({live}, gen_random_uuid(), '{t}', 'm', now(), 0, 0, 0, -1000)"
        ),
        "UPDATE rated_daily SET amount_micros = 0".to_owned(),
        format!("UPDATE credit_grants SET amount_micros = 1000000 WHERE id = '{grant}'"),
        "DELETE FROM credit_grants".to_owned(),
        "UPDATE audit_log SET actor = 'nobody'".to_owned(),
        "DELETE FROM audit_log".to_owned(),
        "UPDATE prices SET output_per_m = 0".to_owned(),
        "DELETE FROM price_versions".to_owned(),
        "DELETE FROM invoices".to_owned(),
        "UPDATE invoice_entries SET amount_micros = 0".to_owned(),
        "TRUNCATE invoices CASCADE".to_owned(),
        "TRUNCATE usage_events".to_owned(),
        "DELETE FROM _sqlx_migrations".to_owned(),
        "CREATE TABLE sneaky (a int)".to_owned(),
    ];
    for sql in &denied {
        assert_eq!(refused(pool, sql).await, INSUFFICIENT_PRIVILEGE, "{sql}");
    }
    // Disabling the guard needs ownership (the owner could, then rewrite the invoice).
    for sql in [
        "ALTER TABLE invoices DISABLE TRIGGER invoices_immutable",
        "ALTER TABLE invoice_entries DISABLE TRIGGER ALL",
        "DROP TRIGGER invoices_immutable ON invoices",
    ] {
        assert_eq!(refused(pool, sql).await, INSUFFICIENT_PRIVILEGE, "{sql}");
    }
    // What it may do on drafts, the triggers refuse on the issued invoice.
    for sql in [
        format!("UPDATE invoices SET total_micros = 0 WHERE id = '{invoice}'"),
        format!("DELETE FROM invoice_entries WHERE invoice_id = '{invoice}'"),
        format!("DELETE FROM invoice_sources WHERE invoice_id = '{invoice}'"),
    ] {
        assert_eq!(refused(pool, &sql).await, INTEGRITY, "{sql}");
    }
    let after = billing::invoice(&admin, t, invoice).await.unwrap().unwrap();
    assert_eq!(after.total_micros, issued.total_micros);
    let usage: i64 = sqlx::query_scalar("SELECT sum(completion_tokens)::bigint FROM usage_events")
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(usage, 14);

    // The same statements are what an owner could do: the test's superuser is refused nothing.
    sqlx::query("ALTER TABLE invoices DISABLE TRIGGER invoices_immutable")
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query("ALTER TABLE invoices ENABLE TRIGGER invoices_immutable")
        .execute(&admin)
        .await
        .unwrap();
    app.drop(&admin).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn serve_refuses_a_superuser_or_an_owner_unless_allowed(admin: PgPool) {
    let app = LoginRole::create(&admin, &format!("IN ROLE {APP_ROLE}")).await;
    let owner = LoginRole::create(&admin, "").await;
    sqlx::raw_sql(&format!(
        "CREATE TABLE owned_scratch (a int); ALTER TABLE owned_scratch OWNER TO {}",
        owner.name
    ))
    .execute(&admin)
    .await
    .unwrap();

    let super_standing = roles::standing(&admin).await.unwrap();
    assert!(super_standing
        .too_powerful()
        .is_some_and(|why| why.contains("superuser")));
    let owner_standing = roles::standing(&owner.pool).await.unwrap();
    assert_eq!(
        owner_standing.too_powerful().unwrap(),
        format!("{} owns table owned_scratch", owner.name)
    );

    // The real `serve`, as the superuser: refused at start-up, naming the flag.
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&admin)
        .await
        .unwrap();
    let opts = admin.connect_options();
    let super_url = format!(
        "postgres://{}@{}:{}/{db}",
        opts.get_username(),
        opts.get_host(),
        opts.get_port()
    );
    for url in [&super_url, &owner.url] {
        let args =
            tokenfactory::cli::ServeArgs::parse_from(["tokenfactory", "--database-url", url]);
        let err = tokenfactory::serve::run(args)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("refusing to serve") && err.contains("--allow-owner-role"),
            "{err}"
        );
    }
    // The start-up check itself: the owner passes with the flag (and migrates: nothing left to
    // apply), the application role passes without it and migrates nothing.
    tokenfactory::db_start::for_serve(&admin, &super_url, true)
        .await
        .unwrap();
    tokenfactory::db_start::for_serve(&app.pool, &app.url, false)
        .await
        .unwrap();
    let err = tokenfactory::db_start::for_serve(&owner.pool, &owner.url, false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("owns table owned_scratch"), "{err}");

    sqlx::query("DROP TABLE owned_scratch")
        .execute(&admin)
        .await
        .unwrap();
    owner.drop(&admin).await;
    app.drop(&admin).await;
}
