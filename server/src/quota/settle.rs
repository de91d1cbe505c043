//! The admitted request's guard. It holds the request's slots and spend reservation until the usage
//! event is final, then settles: token windows corrected to the real usage, the real spend queued
//! for Redis (group-committed with the next SYNC; the usage writers wait for it before the event
//! reaches PostgreSQL), slots and reservation given back to this replica's holding. If the request
//! ends any other way (an error path, a dropped future, a panic) the guard's `Drop` still gives
//! back the slots and the reservation, counting no tokens; if the whole replica dies, its holdings
//! stop being renewed and expire.

use std::sync::Arc;

use super::answer::RateStatus;
use super::limits::cost_micros;
use super::local::SettleOp;
use super::plan::{Check, Dim};
use super::state::{now_ms, Inner};

/// Where a request was admitted, so it is settled in the same place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Against Redis, directly or on credit it granted.
    Redis,
    Local,
}

/// An admitted request's hold on its limits; settle it with the final usage event.
pub struct Admitted {
    inner: Arc<Inner>,
    /// The local limiter's name for the request (empty on Redis).
    member: String,
    checks: Vec<Check>,
    /// Per check: the window bucket its cost was charged to.
    buckets: Vec<i64>,
    backend: Backend,
    micros_per_1k: i64,
    status: RateStatus,
    open: bool,
}

impl Admitted {
    pub(super) fn new(
        inner: Arc<Inner>,
        member: String,
        checks: Vec<Check>,
        buckets: Vec<i64>,
        backend: Backend,
        micros_per_1k: i64,
        status: RateStatus,
    ) -> Self {
        Self {
            inner,
            member,
            checks,
            buckets,
            backend,
            micros_per_1k,
            status,
            open: true,
        }
    }

    /// The windows' standing at admission (the gateway sends it as `x-ratelimit-*` headers).
    pub fn rate_status(&self) -> RateStatus {
        self.status
    }

    /// Settles with the request's real usage, prompt plus completion `tokens` (before the
    /// response ends, so the next request of the same client already sees the freed slot).
    /// Never waits for Redis.
    pub async fn settle(mut self, tokens: u64) {
        self.open = false;
        let inner = &self.inner;
        if self.backend == Backend::Local {
            let ops = self.local_ops(Some(tokens));
            inner
                .local
                .settle(&self.checks, &ops, &self.member, now_ms());
            return;
        }
        let now = now_ms();
        let used = i64::try_from(tokens).unwrap_or(i64::MAX);
        let actual = cost_micros(tokens, self.micros_per_1k);
        let mut spend = Vec::new();
        for (c, bucket) in self.checks.iter().zip(&self.buckets) {
            match c {
                Check::Window {
                    key,
                    cost,
                    dim: Dim::Tokens,
                    ..
                } => inner.credits.correct(key, *bucket, used - cost, now),
                Check::Spend { settled, .. } => spend.push((settled.clone(), actual)),
                _ => {}
            }
        }
        inner.credits.release(
            self.checks
                .iter()
                .filter(|c| matches!(c, Check::Cap { .. })),
        );
        let spends = self
            .checks
            .iter()
            .filter(|c| matches!(c, Check::Spend { .. }));
        if spend.is_empty() {
            return;
        }
        super::sync::settle_spend(inner, spend, || {
            for c in spends {
                inner.credits.spend(c, actual);
            }
        })
        .await;
    }

    /// The local limiter's settle steps; `tokens`: the real usage, or `None` when unknown (then
    /// no token correction, no spend).
    fn local_ops(&self, tokens: Option<u64>) -> Vec<SettleOp> {
        self.checks
            .iter()
            .zip(&self.buckets)
            .map(|(c, bucket)| match (c, tokens) {
                (
                    Check::Window {
                        dim: Dim::Tokens,
                        cost,
                        ..
                    },
                    Some(t),
                ) => SettleOp::Window {
                    bucket: *bucket,
                    delta: i64::try_from(t).unwrap_or(i64::MAX) - cost,
                },
                (Check::Window { .. }, _) => SettleOp::Skip,
                (Check::Spend { .. }, t) => SettleOp::Spend {
                    actual: cost_micros(t.unwrap_or(0), self.micros_per_1k),
                },
                (Check::Cap { .. }, _) => SettleOp::Release,
            })
            .collect()
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        // INVARIANT: a request that never settles still frees its slots (test:
        // quota::slots_are_freed_on_every_path). Tokens are not refunded: usage is unknown.
        match self.backend {
            Backend::Local => {
                let ops = self.local_ops(None);
                self.inner
                    .local
                    .settle(&self.checks, &ops, &self.member, now_ms());
            }
            Backend::Redis => self.inner.credits.release(self.checks.iter()),
        }
    }
}
