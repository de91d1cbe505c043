//! The Redis window script against a reference model: a sliding 60 s window of one-second
//! buckets, driven with synthetic clocks (the scripts take `now` as an argument), random costs,
//! extra credit granted to the replica, corrections and unspent credit given back, idle gaps
//! longer than the window and a lagging replica's clock. The script keeps a running total
//! instead of scanning the buckets; this proves the total never drifts from the sum of the live
//! buckets, and that a grant never exceeds a sixteenth of the room left.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use tokenfactory::quota::plan::{Check, Dim};
use tokenfactory::quota::scripts::{self, Scripts, SyncOp};

/// The reference: buckets by second; live means `second > now_sec - 60` (and not yet dropped by a
/// replica whose clock runs ahead).
#[derive(Default)]
struct Model(BTreeMap<i64, i64>);

impl Model {
    fn used(&self, sec: i64) -> i64 {
        self.0.range(sec - 59..).map(|(_, c)| c).sum()
    }
}

#[tokio::test]
async fn window_total_equals_the_sum_of_live_buckets() {
    let client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let scripts = Scripts::default();
    let key = format!("tftest-window-{}", uuid::Uuid::new_v4().simple());
    let limit = 500;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut model = Model::default();
    // A fixed start far from "now" is fine: the scripts only compare the times they are given.
    let mut now: i64 = 1_800_000_000_000;
    let (mut admitted, mut refused) = (0, 0);
    let mut floor = i64::MIN;
    for step in 0..3_000 {
        now += match rng.gen_range(0..100) {
            0 => rng.gen_range(61_000..400_000), // idle longer than the window
            1..=20 => rng.gen_range(1_000..5_000),
            _ => rng.gen_range(0..400),
        };
        // Another replica's clock, up to 2 s behind.
        let clock = if rng.gen_bool(0.1) {
            now - rng.gen_range(0..2_000)
        } else {
            now
        };
        let sec = clock.div_euclid(1000);
        let cost = rng.gen_range(1..40);
        let check = Check::Window {
            key: key.as_str().into(),
            limit,
            cost,
            dim: Dim::Tokens,
        };
        let want = if rng.gen_bool(0.5) {
            rng.gen_range(0..200)
        } else {
            0
        };
        let mut inv = scripts.acquire.prepare_invoke();
        scripts::acquire_args(
            &mut inv,
            std::slice::from_ref(&check),
            &[want],
            clock,
            "m",
            clock + 1000,
            2000,
        );
        let out: Vec<i64> = inv.invoke_async(&mut con).await.unwrap();
        let expected_used = model.used(sec);
        assert_eq!(out[2], expected_used, "used at step {step}");
        let ok = expected_used + cost <= limit;
        assert_eq!(out[0] == 0, ok, "decision at step {step}");
        let extra = want
            .min((limit - expected_used - cost).div_euclid(16))
            .max(0);
        assert_eq!(out[4], extra, "credit granted at step {step}");
        if ok {
            admitted += 1;
            *model.0.entry(sec).or_default() += cost + extra;
            // A correction (real usage below the estimate) or unspent credit given back.
            if rng.gen_bool(0.5) {
                let delta = -rng.gen_range(0..cost + extra);
                let mut inv = scripts.sync.prepare_invoke();
                let ops = [SyncOp::Window {
                    key: key.as_str().into(),
                    bucket: sec,
                    delta,
                }];
                assert!(scripts::sync_args(
                    &mut inv,
                    &ops,
                    clock,
                    "m",
                    clock + 1000,
                    2000
                ));
                let _: i64 = inv.invoke_async(&mut con).await.unwrap();
                *model.0.entry(sec).or_default() += delta;
            }
        } else {
            refused += 1;
        }
        // A bucket that left the window by the most advanced clock is gone for every replica
        // (the old scanning script behaved the same).
        floor = floor.max(sec - 59);
        model.0.retain(|s, _| *s >= floor);
    }
    assert!(
        admitted > 500 && refused > 100,
        "{admitted} admitted, {refused} refused"
    );
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut con)
        .await
        .unwrap();
}
