//! Adapter prices and invoice lines per model (issue 31): a price set for an adapter
//! (`adapter:<tenant>/<name>`) prices that tenant's adapter's requests, and only those; any other
//! request, and a re-rate under a version without it, pays the base's price. The rater, the
//! usage rollup (what the spend limit reconciles from), the request log and the models page
//! agree, and an invoice has one line per model whose amounts add up to the charge lines.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sqlx::PgPool;
use tf_core::accounts::AccountError;
use tf_core::billing_ops::{self as ops, NewPrice};
use tf_core::db::billing::{self, adapter_price_key, Draft, Runs};
use tf_core::money::Rates;
use tf_core::operator::Actor;
use tf_core::period::month_of;
use tf_core::usage::{Provenance, UsageEvent, UsageStatus};
use time::{Duration, OffsetDateTime};
use uuid::Uuid;

const BASE: Rates = Rates {
    fresh_per_m: 1_000_000,
    cached_per_m: 500_000,
    output_per_m: 2_000_000,
};
const OWN: Rates = Rates {
    fresh_per_m: 2_000_000,
    cached_per_m: 1_000_000,
    output_per_m: 4_000_000,
};
/// 10 prompt (3 cached) and 7 output tokens: 7 + 1.5 + 14 = 22.5 -> 23 at BASE, 45 at OWN.
const AT_BASE: i64 = 23;
const AT_OWN: i64 = 45;

fn event(tenant: Uuid, served: &str, adapter: bool, at: OffsetDateTime) -> UsageEvent {
    UsageEvent {
        request_id: Uuid::now_v7(),
        tenant_id: tenant,
        api_key_id: None,
        served_name: served.into(),
        base_model: "llama".into(),
        adapter: adapter.then(|| served.to_owned()),
        graph: "llama".into(),
        price_key: "llama".into(),
        prompt_tokens: 10,
        cached_tokens: 3,
        completion_tokens: 7,
        reasoning_tokens: 0,
        endpoint: tf_core::endpoint::Endpoint::Chat,
        provenance: Provenance::Engine,
        status: UsageStatus::Ok,
        stream: false,
        ttft_ms: None,
        duration_ms: 1,
        started_at: at,
    }
}

fn price(key: &str, rates: Rates) -> NewPrice {
    NewPrice {
        price_key: key.into(),
        tier: "standard".into(),
        rates,
    }
}

async fn tenant(pool: &PgPool, name: &str) -> Uuid {
    tf_core::db::accounts::insert_tenant(pool, name, name)
        .await
        .unwrap()
        .id
}

#[sqlx::test(migrator = "tf_core::db::MIGRATOR")]
async fn an_adapter_price_wins_for_its_adapter_only_and_invoices_list_models(pool: PgPool) {
    let acme = tenant(&pool, "acme").await;
    let globex = tenant(&pool, "globex").await;
    tf_core::db::catalog::upsert_bases(
        &pool,
        "static",
        &[tf_core::db::catalog::BaseUpsert {
            name: "llama",
            graph: "llama",
            upstream_url: "http://127.0.0.1:1/v1",
            upstream_model: "llama",
            continuous_usage: false,
            denied_fields: None,
            prompt_estimator: "byte-bound",
            kind: "chat",
            nvext_allowed: None,
        }],
    )
    .await
    .unwrap();
    for (t, name) in [(acme, "support"), (acme, "plain"), (globex, "support")] {
        tf_core::db::catalog::upsert_adapter(&pool, t, name, "llama", &format!("{t}-{name}"))
            .await
            .unwrap();
    }

    // The base alone first (the version a re-rate will use), then acme's support adapter.
    let (base_only, _) = ops::set_prices(&pool, &Actor::CLI, None, &[price("llama", BASE)])
        .await
        .unwrap();
    let own_key = adapter_price_key("acme", "support");
    let (with_own, from) = ops::set_prices(&pool, &Actor::CLI, None, &[price(&own_key, OWN)])
        .await
        .unwrap();
    // A key no adapter has is refused: it would price nothing.
    for key in ["adapter:acme/nope", "adapter:nobody/support"] {
        let refused = ops::set_prices(&pool, &Actor::CLI, None, &[price(key, OWN)]).await;
        assert!(
            matches!(&refused, Err(AccountError::Invalid(m)) if m.contains("no adapter")),
            "{refused:?}"
        );
    }

    let at = from + Duration::milliseconds(1);
    let events = vec![
        event(acme, "llama", false, at),
        event(acme, "llama", false, at),
        event(acme, "support", true, at),
        event(acme, "support", true, at),
        event(acme, "support", true, at),
        event(acme, "plain", true, at),
        event(globex, "support", true, at),
    ];
    tf_core::db::usage::insert_batch(&pool, &events)
        .await
        .unwrap();
    let live = billing::live_run(&pool).await.unwrap();
    billing::drain(&pool, live, 100).await.unwrap();

    // The rater: own price for acme's support, the base's for the rest.
    let lines: Vec<(Uuid, String, i64, Option<i64>)> = sqlx::query_as(
        "SELECT tenant_id, served_name, amount_micros, price_version_id FROM charge_lines
         WHERE run_id = $1 ORDER BY tenant_id, served_name",
    )
    .bind(live)
    .fetch_all(&pool)
    .await
    .unwrap();
    for (t, served, amount, version) in &lines {
        let want = if *t == acme && served == "support" {
            AT_OWN
        } else {
            AT_BASE
        };
        assert_eq!(*amount, want, "{served} of {t}");
        assert_eq!(*version, Some(with_own));
    }
    assert_eq!(lines.len(), events.len());

    // The usage rollup, the request log and the models page price the same way.
    let rollup: Vec<(Uuid, String, i64)> = sqlx::query_as(
        "SELECT tenant_id, served_name, sum(cost_micros)::bigint FROM usage_daily
         GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for (t, served, cost) in &rollup {
        let sum: i64 = lines
            .iter()
            .filter(|l| l.0 == *t && l.1 == *served)
            .map(|l| l.2)
            .sum();
        assert_eq!(*cost, sum, "{served} of {t}");
    }
    let logged = tf_core::db::reports::log_entry(&pool, acme, events[2].request_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(logged.cost_micros, AT_OWN);
    let theirs = tf_core::db::reports::log_entry(&pool, globex, events[6].request_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(theirs.cost_micros, AT_BASE);
    let models = tf_core::db::dashboard::usable_models(&pool, acme)
        .await
        .unwrap();
    let rates_of = |name: &str| models.iter().find(|m| m.name == name).unwrap().rates;
    assert_eq!(rates_of("support"), Some(OWN));
    assert_eq!(rates_of("plain"), Some(BASE));

    // The invoice: one line per model, under the base's key, adding up to the charge lines.
    let month = month_of(at);
    let Draft::Built(id) = ops::build_draft(&pool, &Actor::CLI, acme, month, Runs::Kept)
        .await
        .unwrap()
    else {
        panic!("not built")
    };
    let entries = billing::invoice_entries(&pool, acme, id).await.unwrap();
    let usage: Vec<(&str, Option<&str>, i64, i64)> = entries
        .iter()
        .filter(|e| e.kind == "usage")
        .map(|e| {
            (
                e.description.as_str(),
                e.price_key.as_deref(),
                e.events,
                e.amount_micros,
            )
        })
        .collect();
    assert_eq!(
        usage,
        [
            ("llama", Some("llama"), 2, 2 * AT_BASE),
            ("plain", Some("llama"), 1, AT_BASE),
            ("support", Some("llama"), 3, 3 * AT_OWN),
        ]
    );
    let invoice = billing::invoice(&pool, acme, id).await.unwrap().unwrap();
    let charged: i64 = lines.iter().filter(|l| l.0 == acme).map(|l| l.2).sum();
    assert_eq!(invoice.total_micros, charged);
    let csv_lines = billing::invoice_lines(&pool, acme, id).await.unwrap();
    assert_eq!(
        csv_lines
            .iter()
            .filter(|l| l.served_name == "support")
            .count(),
        3
    );

    // A re-rate under the version without the adapter's price: the base's price for it too.
    let run = ops::rerate(
        &pool,
        &Actor::CLI,
        acme,
        "acme",
        month.midnight().assume_utc(),
        at + Duration::seconds(1),
        base_only,
    )
    .await
    .unwrap();
    ops::build_draft(&pool, &Actor::CLI, acme, month, Runs::Chosen(&[run]))
        .await
        .unwrap();
    let entries = billing::invoice_entries(&pool, acme, id).await.unwrap();
    let support = entries.iter().find(|e| e.description == "support").unwrap();
    assert_eq!(support.amount_micros, 3 * AT_BASE);
    let invoice = billing::invoice(&pool, acme, id).await.unwrap().unwrap();
    assert_eq!(invoice.total_micros, 6 * AT_BASE);
}
