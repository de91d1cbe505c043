//! The per-replica limiter used while Redis is unreachable. It runs the same plan as the Redis
//! scripts, on the same keys, in memory, with every limit scaled by the local fraction: rates are
//! fail-open (each replica admits its share, so the cluster may admit up to N x share of a limit
//! during an outage); spend allows this replica its share of what was left when Redis was last
//! seen. Its window counts are merged into Redis when Redis returns; its slots die with the
//! process, so it never leaks capacity.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::plan::{Check, Key};

/// How one check of a locally admitted request is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleOp {
    /// Add `delta` to the bucket of second `bucket` (token windows only).
    Window { bucket: i64, delta: i64 },
    /// Drop the reservation, add `actual` micros to the settled spend.
    Spend { actual: i64 },
    /// Free the slot.
    Release,
    /// Nothing to do (request windows).
    Skip,
}

enum Slot {
    Window(BTreeMap<i64, i64>),
    Spend {
        settled: i64,
        reserved: HashMap<Key, i64>,
    },
    Cap(HashMap<Key, ()>),
}

/// Result of a local admission, shaped like the ADMIT script's answer.
pub struct LocalAnswer {
    /// 1-based index of the first failing check, 0 if admitted.
    pub failed: usize,
    pub retry_ms: i64,
    /// Per check: amount used before this request, and ms until the window's oldest bucket leaves.
    pub used_reset: Vec<(i64, i64)>,
}

/// In-memory limits of this replica.
#[derive(Default)]
pub struct LocalLimiter {
    slots: Mutex<HashMap<Key, Slot>>,
    /// Settled + reserved spend per settled-spend key, as Redis last reported it.
    last_spend: Mutex<HashMap<Key, i64>>,
    /// What of each (window, bucket) was merged into Redis already.
    merged: Mutex<HashMap<(Key, i64), i64>>,
}

fn scaled(limit: i64, fraction: f64) -> i64 {
    // A replica's share rounds down; `as` saturates, and a share of an i64 fits an i64.
    let share = (limit as f64 * fraction).floor() as i64;
    share.max(0)
}

impl LocalLimiter {
    /// Remembers spend Redis reported, so an outage starts from it.
    pub fn observe_spend(&self, key: &str, used: i64) {
        if let Ok(mut m) = self.last_spend.lock() {
            m.insert(key.into(), used);
        }
    }

    /// Checks every step, then applies all or none.
    pub fn admit(&self, checks: &[Check], member: &str, now_ms: i64, fraction: f64) -> LocalAnswer {
        let sec = now_ms.div_euclid(1000);
        let last_spend = self
            .last_spend
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default();
        let Ok(mut slots) = self.slots.lock() else {
            // A poisoned lock means a panic elsewhere; admit rather than block serving.
            return LocalAnswer {
                failed: 0,
                retry_ms: 0,
                used_reset: vec![(0, 0); checks.len()],
            };
        };
        let mut answer = LocalAnswer {
            failed: 0,
            retry_ms: 0,
            used_reset: Vec::with_capacity(checks.len()),
        };
        for (i, c) in checks.iter().enumerate() {
            let (used, reset, limit, retry) = match c {
                Check::Window {
                    key, limit, cost, ..
                } => {
                    let slot = slots
                        .entry(key.clone())
                        .or_insert_with(|| Slot::Window(BTreeMap::new()));
                    let Slot::Window(b) = slot else { continue };
                    b.retain(|s, _| *s > sec - 60);
                    let used: i64 = b.values().sum();
                    let reset = b.keys().next().map_or(60_000, |s| (s + 60) * 1000 - now_ms);
                    let limit = scaled(*limit, fraction);
                    let need = used + cost - limit;
                    let mut freed = 0;
                    let retry = b
                        .iter()
                        .find_map(|(s, c)| {
                            freed += c;
                            (freed >= need).then_some((s + 60) * 1000 - now_ms)
                        })
                        .unwrap_or(60_000);
                    (used, reset, limit, retry)
                }
                Check::Spend { settled, limit, .. } => {
                    let slot = slots.entry(settled.clone()).or_insert_with(|| Slot::Spend {
                        settled: 0,
                        reserved: HashMap::new(),
                    });
                    let Slot::Spend {
                        settled: s,
                        reserved,
                    } = slot
                    else {
                        continue;
                    };
                    let known = last_spend.get(settled).copied().unwrap_or(0);
                    let used = known + *s + reserved.values().sum::<i64>();
                    (used, 0, known + scaled(limit - known, fraction), 0)
                }
                Check::Cap {
                    leases: key, limit, ..
                } => {
                    let slot = slots
                        .entry(key.clone())
                        .or_insert_with(|| Slot::Cap(HashMap::new()));
                    let Slot::Cap(m) = slot else { continue };
                    let used = i64::try_from(m.len()).unwrap_or(i64::MAX);
                    (used, 0, scaled(*limit, fraction), 1000)
                }
            };
            answer.used_reset.push((used, reset));
            if answer.failed == 0 && used + c.cost() > limit {
                answer.failed = i + 1;
                answer.retry_ms = retry;
            }
        }
        if answer.failed == 0 {
            for c in checks {
                match (c, slots.get_mut(c.key())) {
                    (Check::Window { cost, .. }, Some(Slot::Window(b))) => {
                        *b.entry(sec).or_default() += cost
                    }
                    (Check::Spend { cost, .. }, Some(Slot::Spend { reserved, .. })) => {
                        reserved.insert(member.into(), *cost);
                    }
                    (Check::Cap { .. }, Some(Slot::Cap(m))) => {
                        m.insert(member.into(), ());
                    }
                    _ => {}
                }
            }
        }
        answer
    }

    /// Ends a locally admitted request.
    pub fn settle(&self, checks: &[Check], ops: &[SettleOp], member: &str, now_ms: i64) {
        let sec = now_ms.div_euclid(1000);
        let Ok(mut slots) = self.slots.lock() else {
            return;
        };
        for (c, op) in checks.iter().zip(ops) {
            match (slots.get_mut(c.key()), *op) {
                (Some(Slot::Window(b)), SettleOp::Window { bucket, delta })
                    if bucket > sec - 60 =>
                {
                    if let Some(n) = b.get_mut(&bucket) {
                        *n += delta;
                    }
                }
                (Some(Slot::Spend { settled, reserved }), SettleOp::Spend { actual }) => {
                    reserved.remove(member);
                    *settled += actual;
                }
                (Some(Slot::Cap(m)), SettleOp::Release) => {
                    m.remove(member);
                }
                _ => {}
            }
        }
    }

    /// The live window counts not yet merged into Redis, as (key, bucket, delta). The local
    /// counts themselves stay for the rest of their minute: if Redis flaps, a second outage in
    /// the same minute continues from them instead of granting the local share again.
    pub fn drain_windows(&self, now_ms: i64) -> Vec<(Key, i64, i64)> {
        let sec = now_ms.div_euclid(1000);
        let (Ok(mut slots), Ok(mut merged)) = (self.slots.lock(), self.merged.lock()) else {
            return Vec::new();
        };
        merged.retain(|(_, b), _| *b > sec - 60);
        let mut out = Vec::new();
        for (key, slot) in slots.iter_mut() {
            if let Slot::Window(b) = slot {
                b.retain(|s, _| *s > sec - 60);
                for (s, c) in b.iter() {
                    let done = merged.entry((key.clone(), *s)).or_default();
                    if *c != *done {
                        out.push((key.clone(), *s, *c - *done));
                        *done = *c;
                    }
                }
            }
        }
        // Spend counted locally is rebuilt from PostgreSQL by the reconciler, so it starts over.
        slots.retain(|_, s| !matches!(s, Slot::Spend { reserved, .. } if reserved.is_empty()));
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::quota::local::*; // not `super`: scripts/import-cycles.py reads it as the parent
    use crate::quota::plan::{CapKind, Dim};

    #[test]
    fn enforces_a_share_and_releases() {
        let l = LocalLimiter::default();
        let w = Check::Window {
            key: "w".into(),
            limit: 10,
            cost: 1,
            dim: Dim::Requests,
        };
        let c = Check::Cap {
            leases: "c".into(),
            amounts: "ca".into(),
            limit: 4,
            kind: CapKind::InFlight,
        };
        let checks = [w, c];
        let now = 1_000_000;
        assert_eq!(l.admit(&checks, "a", now, 0.5).failed, 0);
        assert_eq!(l.admit(&checks, "b", now, 0.5).failed, 0);
        assert_eq!(l.admit(&checks, "c", now, 0.5).failed, 2, "cap share is 2");
        l.settle(&checks, &[SettleOp::Skip, SettleOp::Release], "a", now);
        assert_eq!(l.admit(&checks, "d", now, 0.5).failed, 0);
        assert_eq!(l.admit(&checks[..1], "e", now, 0.5).failed, 0);
        assert_eq!(l.admit(&checks[..1], "f", now, 0.5).failed, 0);
        assert_eq!(
            l.admit(&checks[..1], "g", now, 0.5).failed,
            1,
            "rate share is 5 (the refused request took nothing)"
        );
        assert_eq!(l.drain_windows(now), vec![("w".into(), 1000, 5)]);
        assert_eq!(l.drain_windows(now), vec![], "merged once");
        assert_eq!(
            l.admit(&checks[..1], "h", now + 1000, 0.5).failed,
            1,
            "a second outage in the same minute does not grant the share again"
        );
    }
}
