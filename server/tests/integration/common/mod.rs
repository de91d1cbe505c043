//! Test harness: one builder ([`TestApp::builder`]) for every way a test runs Token Factory
//! (in-process server, portal alone, child process), one way to start the engine simulator
//! ([`sim::start`]), one way to wait for something ([`eventually`]), on the fresh database
//! `#[sqlx::test]` made for the test.

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test harness: fails loudly

pub mod app;
pub mod chaos;
pub mod client;
pub mod embed;
pub mod eventually;
pub mod fleet_contract;
pub mod helm;
pub mod lifecycle;
pub mod portal;
pub mod process;
pub mod raw_http;
pub mod sim;
pub mod sleepy;
pub mod sse;
pub mod usage_event;

use futures::StreamExt;
use sqlx::PgPool;

// Each test binary uses its own subset of the harness.
#[allow(unused_imports)]
pub use app::{Tenant, TestApp, TestAppBuilder, REDIS};
#[allow(unused_imports)]
pub use embed::{with_embeddings, EMBED};
#[allow(unused_imports)]
pub use eventually::eventually;
#[allow(unused_imports)]
pub use sim::BASE;

pub fn request_id(r: &reqwest::Response) -> String {
    r.headers()["x-request-id"].to_str().unwrap().to_owned()
}

/// Reads a whole SSE response into its `data:` payloads.
pub async fn sse_data(r: reqwest::Response) -> Vec<String> {
    let text = r.text().await.unwrap();
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

/// Reads `n` SSE events, then drops the response (a client hanging up).
pub async fn read_events_then_hang_up(r: reqwest::Response, n: usize) -> usize {
    let mut body = r.bytes_stream();
    let mut buf = Vec::new();
    let mut seen = 0;
    while seen < n {
        match body.next().await {
            Some(Ok(b)) => {
                buf.extend_from_slice(&b);
                seen = buf.windows(2).filter(|w| w == b"\n\n").count();
            }
            _ => break,
        }
    }
    drop(body);
    seen
}

pub fn chat(model: &str, content: &str, max_tokens: u32) -> serde_json::Value {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})
}

/// Runs `tokenfactory admin limits ARGS` against the test database; returns what it prints.
pub async fn admin_limits(pool: &PgPool, args: &[&str]) -> String {
    use clap::Parser;
    use tokenfactory::cli::{AdminCommand, Cli, Command};
    let argv = ["tokenfactory", "admin", "limits"]
        .iter()
        .chain(args)
        .copied();
    let Some(Command::Admin(AdminCommand::Limits(a))) = Cli::try_parse_from(argv).unwrap().command
    else {
        panic!("not parsed as admin limits")
    };
    tokenfactory::admin::limits::run(pool, &a).await.unwrap()
}

/// Prices every model's price key at `micros_per_token` micro-units for each token (fresh, cached
/// and output alike) in the standard tier, from an hour ago on: a new version of the price book,
/// which quota, the spend limit, the usage pages and the invoices all price by.
pub async fn price_every_token(pool: &PgPool, micros_per_token: i64) {
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT price_key FROM base_models UNION SELECT price_key FROM adapters",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let per_m = micros_per_token * 1_000_000;
    let rates = tf_core::money::Rates {
        fresh_per_m: per_m,
        cached_per_m: per_m,
        output_per_m: per_m,
    };
    let prices: Vec<_> = keys
        .iter()
        .map(|k| (k.as_str(), "standard", rates))
        .collect();
    let from = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    tf_core::db::billing::set_prices(pool, from, &prices, "test")
        .await
        .unwrap()
        .expect("a new price version");
}
