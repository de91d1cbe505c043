//! The admitted request's guard. It holds the request's slots and spend reservation until the
//! usage event is final, then settles: token windows corrected to the real usage, the reservation
//! turned into settled spend, slots freed. If the request ends any other way (an error path, a
//! dropped future, a panic) the guard's `Drop` still frees the slots and the reservation (spawned,
//! counting no tokens); if the whole replica dies, its leases stop being renewed and expire.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::admission::{now_ms, Inner};
use super::headers::RateHeaders;
use super::limits::cost_micros;
use super::plan::{Check, Dim};
use super::scripts::{self, SettleOp};
use crate::metering::usage::UsageEvent;

/// Where a request was admitted, so it is settled in the same place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Redis,
    Local,
}

/// An admitted request's hold on its limits; settle it with the final usage event.
pub struct Admitted {
    inner: Arc<Inner>,
    member: String,
    checks: Vec<Check>,
    admitted_ms: i64,
    backend: Backend,
    micros_per_1k: i64,
    headers: RateHeaders,
    open: bool,
}

impl Admitted {
    pub(super) fn new(
        inner: Arc<Inner>,
        member: String,
        checks: Vec<Check>,
        admitted_ms: i64,
        backend: Backend,
        micros_per_1k: i64,
        headers: RateHeaders,
    ) -> Self {
        Self {
            inner,
            member,
            checks,
            admitted_ms,
            backend,
            micros_per_1k,
            headers,
            open: true,
        }
    }

    /// The `x-ratelimit-*` values to send with the response.
    pub fn headers(&self) -> RateHeaders {
        self.headers
    }

    /// Settles against the final usage event (awaited, so the next request of the same client
    /// already sees the freed slot).
    pub async fn settle(mut self, event: &UsageEvent) {
        self.open = false;
        let tokens =
            u64::try_from(event.prompt_tokens.saturating_add(event.completion_tokens)).unwrap_or(0);
        let ops = self.ops(Some(tokens));
        finish(&self.inner, self.backend, &self.checks, &ops, &self.member).await;
    }

    /// `tokens`: the real usage, or `None` when unknown (then no token correction, no spend).
    fn ops(&self, tokens: Option<u64>) -> Vec<SettleOp> {
        let bucket = self.admitted_ms.div_euclid(1000);
        self.checks
            .iter()
            .map(|c| match (c, tokens) {
                (
                    Check::Window {
                        dim: Dim::Tokens,
                        cost,
                        ..
                    },
                    Some(t),
                ) => SettleOp::Window {
                    bucket,
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
        let ops = self.ops(None);
        let (inner, checks, member, backend) = (
            self.inner.clone(),
            std::mem::take(&mut self.checks),
            std::mem::take(&mut self.member),
            self.backend,
        );
        if tokio::runtime::Handle::try_current().is_ok() {
            let tracker = inner.tracker.clone();
            tracker.spawn(async move { finish(&inner, backend, &checks, &ops, &member).await });
        } else if backend == Backend::Local {
            inner.local.settle(&checks, &ops, &member, now_ms());
        }
    }
}

async fn finish(inner: &Inner, backend: Backend, checks: &[Check], ops: &[SettleOp], member: &str) {
    if let Ok(mut l) = inner.leases.lock() {
        l.remove(member);
    }
    match backend {
        Backend::Local => inner.local.settle(checks, ops, member, now_ms()),
        Backend::Redis => {
            let mut inv = inner.scripts.settle.prepare_invoke();
            if scripts::settle_args(&mut inv, checks, ops, now_ms(), member)
                && inner.call::<i64>(&inv).await.is_none()
            {
                // Leases expire, the reconciler rebuilds spend; token windows stay high (safe side).
                tracing::warn!(request_id = member, "quota not settled in Redis");
            }
        }
    }
}

/// Renews this replica's live leases every third of the lease time, in one script call per batch.
pub(super) async fn renew_leases(inner: Arc<Inner>, cancel: CancellationToken) {
    let every = inner.cfg.lease() / 3;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if inner.halted.load(Ordering::Relaxed) || inner.redis.is_none() {
            continue;
        }
        let live: Vec<(String, String)> = match inner.leases.lock() {
            Ok(l) => l
                .iter()
                .flat_map(|(m, keys)| keys.iter().map(move |k| (k.clone(), m.clone())))
                .collect(),
            Err(_) => continue,
        };
        let lease = i64::try_from(inner.cfg.lease().as_millis()).unwrap_or(30_000);
        for batch in live.chunks(1000) {
            let mut inv = inner.scripts.renew.prepare_invoke();
            inv.arg(now_ms() + lease).arg(lease * 2);
            for (key, member) in batch {
                inv.key(key).arg(member);
            }
            if inner.call::<i64>(&inv).await.is_none() {
                break;
            }
        }
    }
}
