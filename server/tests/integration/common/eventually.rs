//! Waiting for something to happen without guessing how long it takes: poll a condition until it
//! holds or a deadline passes, then fail naming what was awaited and the last thing seen.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

/// Pause between two probes: short next to every deadline used, long enough not to spin.
const POLL: Duration = Duration::from_millis(10);

/// What a probe answers: done (with a value), or not yet (with what it saw instead).
pub trait Probe {
    type Value;
    fn check(self) -> Result<Self::Value, String>;
}

impl Probe for bool {
    type Value = ();
    fn check(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("false".into())
        }
    }
}

impl<T> Probe for Option<T> {
    type Value = T;
    fn check(self) -> Result<T, String> {
        self.ok_or_else(|| "None".into())
    }
}

impl<T, E: Debug> Probe for Result<T, E> {
    type Value = T;
    fn check(self) -> Result<T, String> {
        self.map_err(|e| format!("{e:?}"))
    }
}

/// Runs `probe` until it answers done, and returns its value; panics once `within` has passed
/// with `what` and the probe's last answer. The probe runs at least once, even at a zero deadline.
pub async fn eventually<P, F, Fut>(within: Duration, what: &str, probe: F) -> P::Value
where
    P: Probe,
    F: FnMut() -> Fut,
    Fut: Future<Output = P>,
{
    eventually_every(POLL, within, what, probe).await
}

/// [`eventually`], probing every `every` (for probes that cost a request each time).
pub async fn eventually_every<P, F, Fut>(
    every: Duration,
    within: Duration,
    what: &str,
    mut probe: F,
) -> P::Value
where
    P: Probe,
    F: FnMut() -> Fut,
    Fut: Future<Output = P>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let last = match probe().await.check() {
            Ok(value) => return value,
            Err(last) => last,
        };
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {within:?} waiting for {what} (last seen: {last})");
        }
        tokio::time::sleep(every).await;
    }
}

/// [`eventually`] for a condition; returns how long it took to hold (tests that report it).
pub async fn wait_until<F, Fut>(within: Duration, what: &str, cond: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until_every(POLL, within, what, cond).await
}

/// [`wait_until`], probing every `every`.
pub async fn wait_until_every<F, Fut>(
    every: Duration,
    within: Duration,
    what: &str,
    cond: F,
) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    eventually_every(every, within, what, cond).await;
    start.elapsed()
}
