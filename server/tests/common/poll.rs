//! Waiting for a condition instead of sleeping for a guess: poll until it holds, fail the test
//! naming what never happened once the deadline passes.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `cond` every 20 ms until it returns true; panics with `what` after `deadline`.
/// Returns how long it took.
pub async fn wait_until<F, Fut>(deadline: Duration, what: &str, cond: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until_every(Duration::from_millis(20), deadline, what, cond).await
}

/// [`wait_until`] polling every `every` (for conditions that cost a request each time).
pub async fn wait_until_every<F, Fut>(
    every: Duration,
    deadline: Duration,
    what: &str,
    mut cond: F,
) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if cond().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < deadline, "{what} (waited {deadline:?})");
        tokio::time::sleep(every).await;
    }
}
