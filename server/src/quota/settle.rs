//! The admitted request's guard. It holds the request's slots and spend reservation until the usage
//! event is final, then settles: token windows corrected to the real usage, the real spend queued
//! for Redis (group-committed with the next SYNC; the usage writers wait for it before the event
//! reaches PostgreSQL), slots and reservation given back to this replica's holding. If the request
//! ends any other way (an error path, a dropped future, a panic) the guard's `Drop` still gives
//! back the slots and the reservation, counting no tokens; if the whole replica dies, its holdings
//! stop being renewed and expire.

use std::sync::Arc;

use tf_core::money::{line_micros, Quantities, Rates};

use super::answer::RateStatus;
use super::plan::{Check, Dim};
use super::state::{now_ms, Inner};

/// An admitted request's hold on its limits; settle it with the final usage event.
pub struct Admitted {
    inner: Arc<Inner>,
    checks: Vec<Check>,
    /// Per check: the window bucket its cost was charged to.
    buckets: Vec<i64>,
    /// Admitted on credit this replica granted itself (Redis down), so settled against it.
    own: bool,
    /// The rates the spend settles at (the price book's, as the event will be rated).
    rates: Rates,
    status: RateStatus,
    /// Settled-spend keys of the subjects without a spend limit: spend is counted for them too
    /// (see `plan::uncounted`), never on credit this replica granted itself.
    counted: Vec<super::plan::Key>,
    open: bool,
}

impl Admitted {
    pub(super) fn new(
        inner: Arc<Inner>,
        checks: Vec<Check>,
        buckets: Vec<i64>,
        own: bool,
        rates: Rates,
        status: RateStatus,
        counted: Vec<super::plan::Key>,
    ) -> Self {
        Self {
            inner,
            checks,
            buckets,
            own,
            rates,
            status,
            counted,
            open: true,
        }
    }

    /// The windows' standing at admission (the gateway sends it as `x-ratelimit-*` headers).
    pub fn rate_status(&self) -> RateStatus {
        self.status
    }

    /// Settles with the request's real usage (before the response ends, so the next request of
    /// the same client already sees the freed slot): token windows count all its tokens, spend
    /// is what the usage event will be charged (`line_micros`, the one cost function). Never
    /// waits for Redis.
    pub async fn settle(mut self, usage: Quantities) {
        self.open = false;
        let (inner, own) = (&self.inner, self.own);
        let now = now_ms();
        let used = usage
            .fresh
            .saturating_add(usage.cached)
            .saturating_add(usage.output);
        for (c, bucket) in self.checks.iter().zip(&self.buckets) {
            if let Check::Window {
                key,
                cost,
                dim: Dim::Tokens,
                ..
            } = c
            {
                inner.credits.correct(key, *bucket, used - cost, now, own);
            }
        }
        let is_spend = |c: &&Check| matches!(c, Check::Spend { .. });
        inner.credits.release(
            self.checks
                .iter()
                .filter(|c| matches!(c, Check::Cap { .. })),
            own,
        );
        let counted = std::mem::take(&mut self.counted);
        if counted.is_empty() && !self.checks.iter().any(|c| is_spend(&c)) {
            return;
        }
        let actual = line_micros(usage, self.rates);
        let spends = self.checks.iter().filter(is_spend);
        super::sync::settle_spend(inner, || {
            let mut owed: Vec<_> = spends
                .filter_map(|c| inner.credits.spend(c, actual, own))
                .collect();
            if !own && actual > 0 {
                owed.extend(counted.into_iter().map(|key| (key, actual)));
            }
            owed
        })
        .await;
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if self.open {
            // INVARIANT: a request that never settles still frees its slots (test:
            // quota::slots_are_freed_on_every_path). Tokens are not refunded: usage is unknown.
            self.inner.credits.release(self.checks.iter(), self.own);
        }
    }
}
