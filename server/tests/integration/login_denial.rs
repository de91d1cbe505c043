//! The login-denial script of issue 33 as a test: behind a trusted proxy, failures spread over
//! many forwarded addresses fill the victim's per-account slot, then every address polls a wrong
//! password; meanwhile the victim, from an address of their own, signs in with the right password
//! every time. X-Forwarded-For from a peer that is not a trusted proxy changes nothing.

#![allow(
    clippy::disallowed_methods,
    reason = "test load generators run until the test ends"
)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout
)] // tests may fail loudly

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::portal::*;
use common::TestApp;
use sqlx::PgPool;
use tf_app::ssr::throttle;

/// The proxy every client comes through (the portal trusts it).
const PROXY: &str = "127.0.0.1";
const ATTACKERS: u32 = 40;

async fn the_victim_signs_in_through_a_polling_attack(portal: TestPortal) {
    // Failures spread over many addresses, well past the account's free attempts.
    let attackers: Vec<Browser> = (0..ATTACKERS)
        .map(|i| portal.browser_via(PROXY, Some(&format!("198.51.100.{i}"))))
        .collect();
    let mut tokens = Vec::new();
    for a in &attackers {
        tokens.push(csrf(&a.html("/login").await));
    }
    for _ in 0..2 {
        for (a, token) in attackers.iter().zip(&tokens) {
            a.post(
                "/api/login",
                &[("csrf", token), ("email", MEMBER), ("password", "nope")],
            )
            .await;
        }
    }
    // Then every address polls a wrong password, one post every 20 ms, until the victim is done
    // and every address has polled at least twice.
    let polls = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (polls, done) = (polls.clone(), done.clone());
        tokio::spawn(async move {
            let mut i = 0usize;
            while !(done.load(Ordering::Relaxed) && i >= 2 * attackers.len()) {
                let a = &attackers[i % attackers.len()];
                let t = &tokens[i % attackers.len()];
                a.post(
                    "/api/login",
                    &[("csrf", t), ("email", MEMBER), ("password", "still wrong")],
                )
                .await;
                polls.fetch_add(1, Ordering::Relaxed);
                i += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    // The victim, behind the same proxy from their own address, signs in again and again while
    // the polling holds the account's slot.
    while polls.load(Ordering::Relaxed) < ATTACKERS {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..6 {
        let victim = portal.browser_via(PROXY, Some("203.0.113.7"));
        assert_redirect(&victim.login(MEMBER, PASSWORD).await, "/");
        assert!(victim.html("/").await.contains(MEMBER));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done.store(true, Ordering::Relaxed);
    poller.await.unwrap();
    println!(
        "the victim signed in 6 times out of 6 during {} attacker polls",
        polls.load(Ordering::Relaxed)
    );

    // The attackers' own addresses are held back: one that polled is throttled even with the
    // right password.
    let attacker = portal.browser_via(PROXY, Some("198.51.100.3"));
    assert_redirect(&attacker.login(MEMBER, PASSWORD).await, "/login");
    let page = attacker.html("/login").await;
    assert!(page.contains("Too many failed attempts"), "{page}");
}

#[sqlx::test(migrations = "../migrations")]
async fn polling_failures_cannot_keep_the_owner_out_in_redis(pool: PgPool) {
    let portal = TestApp::builder(pool)
        .shared_redis()
        .trusted_proxies("127.0.0.1/32")
        .start_portal()
        .await;
    the_victim_signs_in_through_a_polling_attack(portal).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn polling_failures_cannot_keep_the_owner_out_without_redis(pool: PgPool) {
    let portal = TestApp::builder(pool)
        .trusted_proxies("127.0.0.1/32")
        .start_portal()
        .await;
    the_victim_signs_in_through_a_polling_attack(portal).await;
}

#[sqlx::test(migrations = "../migrations")]
async fn forwarded_for_from_an_untrusted_peer_is_ignored(pool: PgPool) {
    let portal = TestApp::builder(pool)
        .trusted_proxies("127.0.0.1/32")
        .start_portal()
        .await;
    // 127.0.0.2 is not a trusted proxy: its header is ignored, its failures are its own.
    let spoofer = portal.browser_via("127.0.0.2", Some("203.0.113.7"));
    for _ in 0..throttle::PAIR_FREE {
        assert_redirect(&spoofer.login(MEMBER, "wrong").await, "/login");
    }
    assert_redirect(&spoofer.login(MEMBER, PASSWORD).await, "/login");
    assert!(spoofer
        .html("/login")
        .await
        .contains("Too many failed attempts"));
    // The address it named is untouched.
    let owner = portal.browser_via(PROXY, Some("203.0.113.7"));
    assert_redirect(&owner.login(MEMBER, PASSWORD).await, "/");
    // Without the header, the proxy's own address counts (nothing forwarded).
    let direct = portal.browser_via(PROXY, None);
    assert_redirect(&direct.login(MEMBER, PASSWORD).await, "/");
}
