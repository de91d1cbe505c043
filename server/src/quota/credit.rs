//! This replica's credit from Redis, so most admissions touch no network. When Redis admits a
//! request it may grant more than the request costs (see the ACQUIRE script): for a window, extra
//! requests or tokens already counted in the shared window; for spend or a cap, extra micros or
//! slots added to this replica's holding. Later requests are admitted from that credit in memory,
//! all checks or none, exactly as Redis would have: credit is taken out of the limit before it is
//! spent, so replicas together never admit more than the limit. Grants shrink to a sixteenth of
//! the room left, so a limit near exhaustion is shared out one request at a time.
//!
//! Credit that is not spent goes back: window credit after [`GRANT_TTL_MS`] (a refund to the
//! bucket it was charged to), holdings beyond what requests use after [`HOLD_IDLE_MS`] without
//! an admission. [`Credits::due`] lists what Redis must hear; the syncer sends it. Holdings
//! change in Redis by deltas (ACQUIRE adds grants, SYNC sends what this replica gave back), so
//! both may be in flight at once and no lock spans a Redis call.
//!
//! While Redis is unreachable the replica grants itself credit from its own share of each limit
//! (`QuotaOptions::local_limit_fraction`) and spends it the same way, so there is one model of
//! the limits in memory: rates are fail-open (each replica admits its share, so the cluster may
//! admit up to N x share of a limit during an outage); spend allows this replica its share of
//! what was left when Redis was last seen. Self-granted window counts are merged into Redis when
//! it returns and kept for the rest of their minute; self-granted slots die with the process.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::answer::RateStatus;
use super::plan::{Check, Key};
use super::scripts::SyncOp;

/// How long window credit may be spent after Redis granted it. It is charged to the second it
/// was granted in, so the shared window forgets a request admitted from it up to this much early.
pub const GRANT_TTL_MS: i64 = 250;
/// Held spend or slots beyond what requests use go back after this long without an admission.
pub const HOLD_IDLE_MS: i64 = 100;
/// The first extra credit asked for, in multiples of the request's cost.
const FIRST_WANT: i64 = 8;
/// The most extra credit asked for, in multiples of the request's cost.
const MAX_WANT: i64 = 1 << 16;
/// How long a refusal from Redis is answered locally (for requests that would not fit either).
/// Without it a client hammering past its limit costs one serialized Redis call per request.
pub const REFUSAL_TTL_MS: i64 = 50;

/// Redis refused a check: what it had used then, so requests that cannot fit are refused here.
struct Refused {
    used: i64,
    at_ms: i64,
    retry_at_ms: i64,
    headers: RateStatus,
}

struct WindowCredit {
    avail: i64,
    granted: i64,
    bucket: i64,
    granted_ms: i64,
    /// The shared window's total right after the grant (every replica, our whole grant included).
    used_after: i64,
    reset_at_ms: i64,
}

impl WindowCredit {
    fn live(&self, now_ms: i64) -> bool {
        now_ms < self.granted_ms + GRANT_TTL_MS
    }
}

struct Holding {
    amounts: Key,
    /// What this replica holds, by its own count (Redis's figure plus `unsent`).
    held: i64,
    in_use: i64,
    last_used_ms: i64,
    /// Change of `held` made here that Redis has not been sent yet.
    unsent: i64,
    renewed_ms: i64,
}

impl Holding {
    /// Sets `held`, recording the change for Redis.
    fn set_held(&mut self, held: i64) {
        self.unsent += held - self.held;
        self.held = held;
    }

    fn op(&mut self, leases: &Key, now_ms: i64) -> SyncOp {
        let delta = std::mem::take(&mut self.unsent);
        self.renewed_ms = now_ms;
        SyncOp::Hold {
            leases: leases.clone(),
            amounts: self.amounts.clone(),
            delta,
            amount: self.held,
        }
    }
}

#[derive(Default)]
struct Book {
    /// By window key.
    windows: HashMap<Key, WindowCredit>,
    /// By lease key (spend budgets and caps).
    holdings: HashMap<Key, Holding>,
    /// Window deltas owed to Redis, by (key, bucket).
    corrections: HashMap<(Key, i64), i64>,
    /// Extra credit to ask for next, by key; doubles while credit runs out fast.
    wants: HashMap<Key, i64>,
    /// Recent refusals, by check key.
    refused: HashMap<Key, Refused>,
    /// Until when an ACQUIRE asking credit for a key may still answer: meanwhile others ask for
    /// their own cost only, so a burst does not take a limit's room as credit many times over.
    asking: HashMap<Key, i64>,
    /// Credit this replica granted itself while Redis was unreachable, by check key.
    own: HashMap<Key, Own>,
    /// Settled plus held spend as Redis last reported it, by settled key: an outage starts there.
    known_spend: HashMap<Key, i64>,
}

/// What this replica granted itself (and spent at once) for one check while Redis was down.
#[derive(Default)]
struct Own {
    /// Windows: per second of the last minute, (amount granted, part of it Redis has not had).
    buckets: BTreeMap<i64, (i64, i64)>,
    /// Spend and caps: micros or slots of the requests in flight.
    in_use: i64,
    /// Spend: micros settled on this credit during the outage.
    settled: i64,
}

/// A replica's share of a limit (rounded down; `as` saturates, and a share of an i64 fits one).
fn share(limit: i64, fraction: f64) -> i64 {
    ((limit as f64 * fraction).floor() as i64).max(0)
}

impl Book {
    fn covers(&self, c: &Check, now_ms: i64) -> bool {
        let cost = c.cost();
        match c {
            Check::Window { key, .. } => self
                .windows
                .get(key)
                .is_some_and(|w| w.live(now_ms) && w.avail >= cost),
            Check::Spend { leases, .. } | Check::Cap { leases, .. } => self
                .holdings
                .get(leases)
                .is_some_and(|h| h.held - h.in_use >= cost),
        }
    }

    /// This replica's own standing on `c` under its share `fraction` of the limit: (used, ms
    /// until the window's oldest bucket leaves, the share, ms until a retry may fit).
    fn own_standing(&mut self, c: &Check, now_ms: i64, fraction: f64) -> (i64, i64, i64, i64) {
        let sec = now_ms.div_euclid(1000);
        let known = match c {
            Check::Spend { settled, .. } => self.known_spend.get(settled).copied().unwrap_or(0),
            _ => 0,
        };
        let own = self.own.entry(c.key().clone()).or_default();
        match c {
            Check::Window { limit, cost, .. } => {
                own.buckets.retain(|s, _| *s > sec - 60);
                let used: i64 = own.buckets.values().map(|b| b.0).sum();
                let reset = own
                    .buckets
                    .keys()
                    .next()
                    .map_or(60_000, |s| (s + 60) * 1000 - now_ms);
                let limit = share(*limit, fraction);
                let mut short = used + cost - limit;
                let retry = own
                    .buckets
                    .iter()
                    .find_map(|(s, b)| {
                        short -= b.0;
                        (short <= 0).then_some((s + 60) * 1000 - now_ms)
                    })
                    .unwrap_or(60_000);
                (used, reset, limit, retry)
            }
            Check::Spend { limit, .. } => {
                let used = known + own.settled + own.in_use;
                (used, 0, known + share(limit - known, fraction), 0)
            }
            Check::Cap { limit, .. } => (own.in_use, 0, share(*limit, fraction), 1000),
        }
    }
}

/// What a request took from credit: per check, the bucket its window cost was charged to (0 for
/// other checks) and the (used, reset_ms) its headers are computed from.
#[derive(Debug)]
pub struct Taken {
    pub buckets: Vec<i64>,
    pub used_reset: Vec<(i64, i64)>,
}

/// Why this replica's own share refused a request: the index of the first check that did not
/// fit, ms until a retry may, and every check's (used, reset_ms) for the headers.
#[derive(Debug)]
pub struct Short {
    pub failed: usize,
    pub retry_ms: i64,
    pub used_reset: Vec<(i64, i64)>,
}

/// Redis's answer for one check of an ACQUIRE: total used before it, ms until the window's
/// oldest bucket leaves, extra credit granted.
#[derive(Debug, Clone, Copy)]
pub struct Grant {
    pub used: i64,
    pub reset_ms: i64,
    pub extra: i64,
}

/// The credit book of one replica.
#[derive(Default)]
pub struct Credits(Mutex<Book>);

impl Credits {
    /// A recent refusal that this request could not pass either: (index of the check, ms until
    /// a retry may succeed, the headers Redis's answer gave).
    pub fn refused(&self, checks: &[Check], now_ms: i64) -> Option<(usize, i64, RateStatus)> {
        let book = self.0.lock().ok()?;
        if book.refused.is_empty() {
            return None;
        }
        checks.iter().enumerate().find_map(|(i, c)| {
            let r = book.refused.get(c.key())?;
            (now_ms < r.at_ms + REFUSAL_TTL_MS && r.used + c.cost() > c.limit())
                .then(|| (i, (r.retry_at_ms - now_ms).max(1), r.headers))
        })
    }

    /// Remembers Redis's refusal of `check` (which had `used` counted).
    pub fn remember_refusal(
        &self,
        check: &Check,
        used: i64,
        retry_ms: i64,
        headers: RateStatus,
        now_ms: i64,
    ) {
        let Ok(mut book) = self.0.lock() else { return };
        // The refused ACQUIRE asked for nothing in the end: the next one may ask again.
        book.asking.clear();
        book.refused
            .retain(|_, r| now_ms < r.at_ms + REFUSAL_TTL_MS);
        book.refused.insert(
            check.key().clone(),
            Refused {
                used,
                at_ms: now_ms,
                retry_at_ms: now_ms + retry_ms,
                headers,
            },
        );
    }

    /// The keys of the checks credit does not cover now (what an ACQUIRE would ask for).
    pub fn uncovered(&self, checks: &[Check], now_ms: i64) -> Vec<Key> {
        let Ok(book) = self.0.lock() else {
            return checks.iter().map(|c| c.key().clone()).collect();
        };
        checks
            .iter()
            .filter(|c| !book.covers(c, now_ms))
            .map(|c| c.key().clone())
            .collect()
    }

    /// Takes every check's cost from credit, or nothing.
    pub fn try_take(&self, checks: &[Check], now_ms: i64) -> Option<Taken> {
        let mut book = self.0.lock().ok()?;
        if !checks.iter().all(|c| book.covers(c, now_ms)) {
            return None;
        }
        let mut taken = Taken {
            buckets: Vec::with_capacity(checks.len()),
            used_reset: Vec::with_capacity(checks.len()),
        };
        for c in checks {
            let cost = c.cost();
            let (bucket, used_reset) = match c {
                Check::Window { key, .. } => match book.windows.get_mut(key) {
                    Some(w) => {
                        let used = w.used_after - w.avail;
                        w.avail -= cost;
                        (w.bucket, (used, (w.reset_at_ms - now_ms).max(0)))
                    }
                    None => (0, (0, 0)),
                },
                Check::Spend { leases, .. } | Check::Cap { leases, .. } => {
                    if let Some(h) = book.holdings.get_mut(leases) {
                        h.in_use += cost;
                        h.last_used_ms = now_ms;
                    }
                    (0, (0, 0))
                }
            };
            taken.buckets.push(bucket);
            taken.used_reset.push(used_reset);
        }
        Some(taken)
    }

    /// Grants this replica every check's cost from its own share `fraction` of the limit (Redis
    /// is unreachable) and spends it at once, all checks or none: what Redis would answer if the
    /// limits were that share and this replica alone.
    pub fn take_own(&self, checks: &[Check], now_ms: i64, fraction: f64) -> Result<Taken, Short> {
        let sec = now_ms.div_euclid(1000);
        let mut taken = Taken {
            buckets: vec![sec; checks.len()],
            used_reset: Vec::with_capacity(checks.len()),
        };
        let Ok(mut guard) = self.0.lock() else {
            // A poisoned lock means a panic elsewhere; admit rather than block serving.
            taken.used_reset.resize(checks.len(), (0, 0));
            return Ok(taken);
        };
        let book = &mut *guard;
        let mut short = None;
        for (i, c) in checks.iter().enumerate() {
            let (used, reset, limit, retry_ms) = book.own_standing(c, now_ms, fraction);
            taken.used_reset.push((used, reset));
            if short.is_none() && used + c.cost() > limit {
                short = Some((i, retry_ms));
            }
        }
        if let Some((failed, retry_ms)) = short {
            return Err(Short {
                failed,
                retry_ms,
                used_reset: taken.used_reset,
            });
        }
        for c in checks {
            let own = book.own.entry(c.key().clone()).or_default();
            match c {
                Check::Window { cost, .. } => {
                    let b = own.buckets.entry(sec).or_default();
                    (b.0, b.1) = (b.0 + cost, b.1 + cost);
                }
                _ => own.in_use += c.cost(),
            }
        }
        Ok(taken)
    }

    /// Remembers the spend Redis reported in an ACQUIRE's answer, so an outage starts from it.
    pub fn observe_spend(&self, checks: &[Check], grants: &[Grant]) {
        let Ok(mut book) = self.0.lock() else { return };
        for (c, g) in checks.iter().zip(grants) {
            if let Check::Spend { settled, .. } = c {
                book.known_spend.insert(settled.clone(), g.used);
            }
        }
    }

    /// The extra credit to ask Redis for, per check: nothing where credit still covers the
    /// check or another ACQUIRE is asking for it (until `answer_by_ms`); twice the last ask where
    /// credit ran out quickly.
    pub fn wants(&self, checks: &[Check], now_ms: i64, answer_by_ms: i64) -> Vec<i64> {
        let Ok(mut guard) = self.0.lock() else {
            return vec![0; checks.len()];
        };
        let book = &mut *guard;
        checks
            .iter()
            .map(|c| {
                if book.covers(c, now_ms) {
                    return 0;
                }
                let asking = book.asking.entry(c.key().clone()).or_insert(0);
                if now_ms < *asking {
                    return 0;
                }
                *asking = answer_by_ms;
                let cost = c.cost().max(1);
                let (key, ran_out_fast) = match c {
                    Check::Window { key, .. } => (
                        key,
                        book.windows
                            .get(key)
                            .is_some_and(|w| now_ms < w.granted_ms + GRANT_TTL_MS / 2),
                    ),
                    Check::Spend { leases, .. } | Check::Cap { leases, .. } => (
                        leases,
                        book.holdings.get(leases).is_some_and(|h| h.in_use > 0),
                    ),
                };
                let want = book
                    .wants
                    .entry(key.clone())
                    .or_insert_with(|| cost.saturating_mul(FIRST_WANT));
                if ran_out_fast {
                    *want = want.saturating_mul(2).min(cost.saturating_mul(MAX_WANT));
                }
                *want
            })
            .collect()
    }

    /// Books what Redis granted a request: its own costs are spent at once (charged to
    /// `now_ms`'s bucket), the extra is credit for later requests. Returns the buckets.
    pub fn deposit(&self, checks: &[Check], grants: &[Grant], now_ms: i64) -> Vec<i64> {
        let sec = now_ms.div_euclid(1000);
        let buckets = vec![sec; checks.len()];
        let Ok(mut guard) = self.0.lock() else {
            return buckets;
        };
        let book = &mut *guard;
        for (c, g) in checks.iter().zip(grants) {
            book.asking.remove(c.key());
            let cost = c.cost();
            match c {
                Check::Window { key, .. } => {
                    let used_after = g.used + cost + g.extra;
                    match book.windows.get_mut(key) {
                        Some(w) if w.bucket == sec && w.live(now_ms) => {
                            w.avail += g.extra;
                            w.granted += g.extra;
                            w.granted_ms = now_ms;
                            w.used_after = used_after;
                        }
                        _ => {
                            if let Some(old) = book.windows.remove(key) {
                                if old.avail > 0 {
                                    *book
                                        .corrections
                                        .entry((key.clone(), old.bucket))
                                        .or_default() -= old.avail;
                                }
                            }
                            if g.extra > 0 {
                                book.windows.insert(
                                    key.clone(),
                                    WindowCredit {
                                        avail: g.extra,
                                        granted: g.extra,
                                        bucket: sec,
                                        granted_ms: now_ms,
                                        used_after,
                                        reset_at_ms: now_ms + g.reset_ms,
                                    },
                                );
                            }
                        }
                    }
                }
                Check::Spend {
                    leases, amounts, ..
                }
                | Check::Cap {
                    leases, amounts, ..
                } => {
                    let h = book
                        .holdings
                        .entry(leases.clone())
                        .or_insert_with(|| Holding {
                            amounts: amounts.clone(),
                            held: 0,
                            in_use: 0,
                            last_used_ms: now_ms,
                            unsent: 0,
                            renewed_ms: now_ms,
                        });
                    h.held += cost + g.extra;
                    h.in_use += cost;
                    h.last_used_ms = now_ms;
                }
            }
        }
        buckets
    }

    /// Corrects a window by `delta` (real tokens minus the estimate) in the bucket the request
    /// was charged to: on `own` credit, in this replica's own count (merged into Redis with it);
    /// else a refund goes straight back into live credit of that bucket, anything else is owed
    /// to Redis.
    pub fn correct(&self, key: &str, bucket: i64, delta: i64, now_ms: i64, own: bool) {
        if delta == 0 {
            return;
        }
        let Ok(mut book) = self.0.lock() else { return };
        if own {
            if let Some(b) = book
                .own
                .get_mut(key)
                .and_then(|o| o.buckets.get_mut(&bucket))
            {
                (b.0, b.1) = (b.0 + delta, b.1 + delta);
            }
            return;
        }
        if delta < 0 {
            book.refused.remove(key);
            if let Some(w) = book.windows.get_mut(key) {
                if w.bucket == bucket && w.live(now_ms) {
                    w.avail -= delta;
                    return;
                }
            }
        }
        *book.corrections.entry((key.into(), bucket)).or_default() += delta;
    }

    /// Gives back what a finished or abandoned request held of the spend budgets and caps (of
    /// this replica's `own` credit, or of its holdings in Redis).
    pub fn release<'a>(&self, checks: impl Iterator<Item = &'a Check>, own: bool) {
        let Ok(mut guard) = self.0.lock() else { return };
        let book = &mut *guard;
        for c in checks {
            if let Check::Spend { leases, .. } | Check::Cap { leases, .. } = c {
                let in_use = if own {
                    book.own.get_mut(c.key()).map(|o| &mut o.in_use)
                } else {
                    book.holdings.get_mut(leases).map(|h| &mut h.in_use)
                };
                if let Some(n) = in_use {
                    *n = (*n - c.cost()).max(0);
                }
                // Room was made here: the last refusal no longer says what Redis would answer.
                book.refused.remove(c.key());
            }
        }
    }

    /// Settles a spend check: the request's reservation leaves `in_use`, its real spend leaves
    /// the holding and is returned as settled spend owed to Redis (sent in the same SYNC as the
    /// new holding); what it reserved beyond that stays as credit.
    pub fn spend(&self, check: &Check, actual: i64, own: bool) -> Option<(Key, i64)> {
        let Check::Spend {
            settled,
            leases,
            cost,
            ..
        } = check
        else {
            return None;
        };
        let mut book = self.0.lock().ok()?;
        if own {
            // INVARIANT: spend settled on self-granted credit is never sent to Redis: it reaches
            // PostgreSQL as usage, and the reconciler raises Redis to that when Redis returns.
            // Sent by SYNC as well, it would count twice whenever the leader's pass (which cannot
            // wait for other replicas' SYNCs) came first (tests: credit::tests::
            // own_spend_is_counted_here_and_never_owed_to_redis, quota::
            // serving_continues_on_local_limits_while_redis_is_down_and_counters_recover).
            if let Some(o) = book.own.get_mut(settled) {
                o.in_use = (o.in_use - cost).max(0);
                o.settled += actual.max(0);
            }
            return None;
        }
        if let Some(h) = book.holdings.get_mut(leases) {
            h.in_use = (h.in_use - cost).max(0);
            let held = (h.held - actual.max(0)).max(h.in_use);
            h.set_held(held);
        }
        Some((settled.clone(), actual))
    }

    /// The holdings changed since Redis last heard of them.
    pub fn dirty_holds(&self, now_ms: i64) -> Vec<SyncOp> {
        let Ok(mut book) = self.0.lock() else {
            return Vec::new();
        };
        book.holdings
            .iter_mut()
            .filter(|(_, h)| h.unsent != 0)
            .map(|(leases, h)| h.op(leases, now_ms))
            .collect()
    }

    /// Drops all window credit (Redis failed: it stays counted there, which errs on the safe
    /// side, and admission turns to this replica's own share at once).
    pub fn forget_windows(&self) {
        if let Ok(mut book) = self.0.lock() {
            book.windows.clear();
        }
    }

    /// Redis is back: the self-granted window counts it has not had, as (key, bucket, delta),
    /// for MERGE. The counts stay for the rest of their minute: if Redis flaps, a second outage
    /// in the same minute continues from them instead of granting the share again. Self-granted
    /// spend starts over (see [`Self::spend`]); slots stay until their requests end.
    pub fn unmerged(&self, now_ms: i64) -> Vec<(Key, i64, i64)> {
        let sec = now_ms.div_euclid(1000);
        let Ok(mut book) = self.0.lock() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (key, own) in &mut book.own {
            own.buckets.retain(|s, _| *s > sec - 60);
            for (s, b) in &mut own.buckets {
                if b.1 != 0 {
                    out.push((key.clone(), *s, std::mem::take(&mut b.1)));
                }
            }
        }
        book.own
            .retain(|_, o| !o.buckets.is_empty() || o.in_use > 0);
        out
    }

    /// What Redis must hear now: corrections owed, expired window credit given back, holdings
    /// shrunk to their use after an idle spell, and holdings whose lease is due for renewal
    /// (`all`: every holding, after a failed sync: one whose lease lapsed in Redis is rebuilt).
    pub fn due(&self, now_ms: i64, renew_every_ms: i64, all: bool) -> Vec<SyncOp> {
        let Ok(mut guard) = self.0.lock() else {
            return Vec::new();
        };
        let book = &mut *guard;
        let mut ops: Vec<SyncOp> = Vec::new();
        let expired: Vec<Key> = book
            .windows
            .iter()
            .filter(|(_, w)| !w.live(now_ms))
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            let Some(w) = book.windows.remove(&key) else {
                continue;
            };
            if w.avail > 0 {
                *book.corrections.entry((key.clone(), w.bucket)).or_default() -= w.avail;
                if w.avail * 2 > w.granted {
                    if let Some(want) = book.wants.get_mut(&key) {
                        *want = (*want / 2).max(1);
                    }
                }
            }
        }
        ops.extend(
            book.corrections
                .drain()
                .filter(|(_, d)| *d != 0)
                .map(|((key, bucket), delta)| SyncOp::Window { key, bucket, delta }),
        );
        for (leases, h) in &mut book.holdings {
            if now_ms - h.last_used_ms >= HOLD_IDLE_MS && h.held > h.in_use {
                h.set_held(h.in_use);
                book.wants.remove(leases);
            }
            if h.unsent != 0 || all || now_ms - h.renewed_ms >= renew_every_ms {
                ops.push(h.op(leases, now_ms));
            }
        }
        book.holdings.retain(|_, h| h.held > 0 || h.in_use > 0);
        book.asking.retain(|_, until| now_ms < *until);
        let sec = now_ms.div_euclid(1000);
        book.own.retain(|_, o| {
            o.in_use > 0
                || o.settled > 0
                || o.buckets.keys().next_back().is_some_and(|s| *s > sec - 60)
        });
        ops
    }
}

#[cfg(test)]
mod tests {
    use crate::quota::credit::*; // not `super`: scripts/import-cycles.py reads it as the parent
    use crate::quota::plan::{CapKind, Dim};

    fn window(key: &str, cost: i64) -> Check {
        Check::Window {
            key: key.into(),
            limit: 1000,
            cost,
            dim: Dim::Tokens,
        }
    }

    fn cap() -> Check {
        Check::Cap {
            leases: "cl".into(),
            amounts: "ca".into(),
            limit: 10,
            kind: CapKind::InFlight,
        }
    }

    fn grant(extra: i64) -> Grant {
        Grant {
            used: 100,
            reset_ms: 60_000,
            extra,
        }
    }

    #[test]
    fn credit_admits_all_checks_or_none() {
        let c = Credits::default();
        let checks = [window("w", 10), cap()];
        let now = 5_000_000;
        assert!(c.try_take(&checks, now).is_none(), "no credit yet");
        assert_eq!(c.wants(&checks, now, now + 250), vec![80, 8]);
        assert_eq!(
            c.wants(&checks, now, now + 250),
            vec![0, 0],
            "an ACQUIRE is already asking"
        );
        c.deposit(&checks, &[grant(25), grant(1)], now);
        // 25 tokens and 1 slot of credit: two requests of 10 tokens fit the window, one the cap.
        let t = c.try_take(&checks, now + 1).expect("covered");
        assert_eq!(t.buckets, vec![5000, 0]);
        // Headers: the window had 100 + 10 + 25 after the grant, 25 of it unspent before this.
        assert_eq!(t.used_reset[0], (110, 59_999));
        assert!(c.try_take(&checks, now + 2).is_none(), "the cap is used up");
        c.release([cap()].iter(), false);
        assert!(c.try_take(&checks, now + 3).is_some());
        assert!(c.try_take(&checks[..1], now + 4).is_none(), "5 tokens left");
    }

    #[test]
    fn unspent_credit_goes_back_to_its_bucket() {
        let c = Credits::default();
        let checks = [window("w", 10), cap()];
        let now = 5_000_900;
        c.deposit(&checks, &[grant(30), grant(2)], now);
        c.try_take(&checks, now + 10).expect("covered");
        // A refund in the same bucket is credit again; one for an older bucket is owed.
        c.correct("w", 5000, -4, now + 20, false);
        c.correct("w", 4999, -3, now + 20, false);
        c.release(checks[1..].iter(), false);
        c.release(checks[1..].iter(), false);
        assert!(
            c.try_take(&checks[..1], now + GRANT_TTL_MS).is_none(),
            "expired"
        );
        let ops = c.due(now + GRANT_TTL_MS + HOLD_IDLE_MS, 10_000, false);
        let mut windows: Vec<_> = ops
            .iter()
            .filter_map(|o| match o {
                SyncOp::Window { bucket, delta, .. } => Some((*bucket, *delta)),
                _ => None,
            })
            .collect();
        windows.sort_unstable();
        assert_eq!(windows, vec![(4999, -3), (5000, -24)]);
        assert!(ops.contains(&SyncOp::Hold {
            leases: "cl".into(),
            amounts: "ca".into(),
            delta: -3,
            amount: 0
        }));
        assert!(c.due(now + 2 * GRANT_TTL_MS, 10_000, true).is_empty());
    }

    #[test]
    fn a_new_grant_in_a_later_second_returns_the_old_credit() {
        let c = Credits::default();
        let w = [window("w", 10)];
        c.deposit(&w, &[grant(5)], 7_000_950);
        c.deposit(&w, &[grant(20)], 7_001_010);
        let ops = c.due(7_001_020, 10_000, false);
        assert_eq!(
            ops,
            vec![SyncOp::Window {
                key: "w".into(),
                bucket: 7000,
                delta: -5
            }]
        );
        assert_eq!(
            c.try_take(&w, 7_001_020).expect("covered").buckets,
            vec![7001]
        );
    }

    #[test]
    fn own_credit_enforces_a_share_and_releases() {
        let c = Credits::default();
        let w = Check::Window {
            key: "w".into(),
            limit: 10,
            cost: 1,
            dim: Dim::Requests,
        };
        let c4 = Check::Cap {
            leases: "c".into(),
            amounts: "ca".into(),
            limit: 4,
            kind: CapKind::InFlight,
        };
        let checks = [w, c4];
        let now = 1_000_000;
        let failed = |r: Result<Taken, Short>| r.err().map(|s| s.failed);
        assert_eq!(failed(c.take_own(&checks, now, 0.5)), None);
        assert_eq!(failed(c.take_own(&checks, now, 0.5)), None);
        assert_eq!(
            failed(c.take_own(&checks, now, 0.5)),
            Some(1),
            "cap share is 2"
        );
        c.release(checks[1..].iter(), true);
        assert_eq!(failed(c.take_own(&checks, now, 0.5)), None);
        assert_eq!(failed(c.take_own(&checks[..1], now, 0.5)), None);
        assert_eq!(failed(c.take_own(&checks[..1], now, 0.5)), None);
        assert_eq!(
            failed(c.take_own(&checks[..1], now, 0.5)),
            Some(0),
            "rate share is 5 (the refused request took nothing)"
        );
        assert_eq!(c.unmerged(now), vec![("w".into(), 1000, 5)]);
        assert_eq!(c.unmerged(now), vec![], "merged once");
        assert_eq!(
            failed(c.take_own(&checks[..1], now + 1000, 0.5)),
            Some(0),
            "a second outage in the same minute does not grant the share again"
        );
    }

    #[test]
    fn own_spend_is_counted_here_and_never_owed_to_redis() {
        let c = Credits::default();
        let spend_of = |cost| Check::Spend {
            settled: "s".into(),
            leases: "sl".into(),
            amounts: "sa".into(),
            limit: 1000,
            cost,
        };
        let spend = spend_of(100);
        let now = 9_000_000;
        // Redis last saw 600 of 1000: this replica may use half of the 400 left.
        let seen = Grant {
            used: 600,
            ..grant(0)
        };
        c.observe_spend(std::slice::from_ref(&spend), &[seen]);
        let a = c
            .take_own(std::slice::from_ref(&spend), now, 0.5)
            .expect("100 of 200");
        assert_eq!(a.used_reset, vec![(600, 0)]);
        c.take_own(std::slice::from_ref(&spend), now, 0.5)
            .expect("200 of 200");
        assert_eq!(
            c.take_own(std::slice::from_ref(&spend), now, 0.5)
                .unwrap_err()
                .failed,
            0
        );
        assert_eq!(c.spend(&spend, 30, true), None, "not owed to Redis");
        // The reservation of 100 became 30 settled: 70 of the share are free again.
        assert!(c.take_own(&[spend_of(70)], now, 0.5).is_ok());
        assert!(c.dirty_holds(now).is_empty() && c.due(now, 0, true).is_empty());
        assert_eq!(c.unmerged(now), vec![]);
    }
}
