//! Admission prices a request as the rater will (issue 31): an adapter's own price key before its
//! base's, each in the tenant's tier before the standard one. Over every combination of which of
//! the four prices (own or base key, tier or standard) the book holds, the limit cache's rates
//! equal the rater's `price_by_keys`, for a tenant in a tier and one without.

#![allow(
    clippy::unwrap_used,
    reason = "a test helper that fails should fail the test loudly"
)]

use sqlx::PgPool;
use tf_core::db::billing;
use tf_core::money::Rates;
use time::macros::datetime;
use tokenfactory::quota::limits::LimitCache;

/// Distinct rates per (combination, slot), so a wrong pick cannot match by accident.
fn rates(case: i64, slot: i64) -> Rates {
    Rates {
        fresh_per_m: case * 100 + slot,
        cached_per_m: case * 100 + slot + 10,
        output_per_m: case * 100 + slot + 20,
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn admission_prices_an_adapter_as_the_rater_does(pool: PgPool) {
    billing::add_tier(&pool, "gold").await.unwrap();
    // Slots: 0 own key in gold, 1 own key standard, 2 base key in gold, 3 base key standard.
    let slots = [
        ("own", "gold"),
        ("own", "standard"),
        ("base", "gold"),
        ("base", "standard"),
    ];
    let keys = |case: i64| (format!("adapter:acme/bot{case}"), format!("base{case}"));
    let mut book = Vec::new();
    for case in 0..16_i64 {
        let (own, base) = keys(case);
        for (slot, (which, tier)) in slots.iter().enumerate() {
            if case & (1 << slot) != 0 {
                let key = if *which == "own" {
                    own.clone()
                } else {
                    base.clone()
                };
                book.push((key, *tier, rates(case, i64::try_from(slot).unwrap())));
            }
        }
    }
    let entries: Vec<(&str, &str, Rates)> =
        book.iter().map(|(k, t, r)| (k.as_str(), *t, *r)).collect();
    let version = billing::set_prices(&pool, datetime!(2000-01-01 0:00 UTC), &entries, "t")
        .await
        .unwrap()
        .unwrap();

    let cache = LimitCache::new(pool.clone());
    let mut priced = 0;
    for case in 0..16_i64 {
        let (own, base) = keys(case);
        for tier in [Some("gold"), None] {
            let got = cache.price(tier, Some(&own), &base).await;
            let want = sqlx::query_as::<_, (i64, i64, i64)>(
                "SELECT fresh_input_per_m, cached_input_per_m, output_per_m
                 FROM price_by_keys($1, $2, $3, $4)",
            )
            .bind(version)
            .bind(tier.unwrap_or("standard"))
            .bind(&own)
            .bind(&base)
            .fetch_optional(&pool)
            .await
            .unwrap()
            .map(|(fresh, cached, output)| Rates {
                fresh_per_m: fresh,
                cached_per_m: cached,
                output_per_m: output,
            })
            .unwrap_or_default();
            assert_eq!(got, want, "case {case:04b}, tier {tier:?}");
            priced += i32::from(want != Rates::default());
            // A base's request (no own key) is priced by the base's key alone.
            let base_only = cache.price(tier, None, &base).await;
            let expected = if tier.is_some() && case & 0b0100 != 0 {
                rates(case, 2)
            } else if case & 0b1000 != 0 {
                rates(case, 3)
            } else {
                Rates::default()
            };
            assert_eq!(
                base_only, expected,
                "base only, case {case:04b}, tier {tier:?}"
            );
        }
    }
    assert!(priced >= 20, "most combinations have a price: {priced}");
}
