//! What one request must pass, in order, cheapest first: per-key then per-tenant requests per
//! minute, tokens per minute, spend, then the tenant's in-flight and long-prompt caps on the target
//! graph. A plan is pure data (Redis keys, limits, costs); the Redis scripts and the credit book
//! both execute it, so the two paths cannot disagree about what is checked.

use std::collections::HashMap;
use std::sync::Arc;

use time::OffsetDateTime;
use uuid::Uuid;

use super::limits::Limits;
use tf_core::money::{line_micros, Quantities, Rates};

/// A Redis key, shared by every plan that uses it (cloning one is a reference count).
pub type Key = Arc<str>;

/// What a window counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    Requests,
    Tokens,
}

/// Which concurrency cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapKind {
    InFlight,
    LongPrompts,
}

/// One check; its Redis keys double as the credit book's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// A sliding 60 s window of one-second buckets (a hash: second -> amount, plus the running
    /// total `t` and the oldest live second `o`, so a check costs O(1), not a scan of 60 buckets).
    Window {
        key: Key,
        limit: i64,
        cost: i64,
        dim: Dim,
    },
    /// Spend this period: settled micros plus what each replica holds for requests in flight
    /// (a hash: replica -> micros, plus `~total`, under leases that expire).
    Spend {
        settled: Key,
        leases: Key,
        amounts: Key,
        limit: i64,
        cost: i64,
    },
    /// Concurrent requests on a graph: each replica's slots (a hash: replica -> slots, plus the
    /// total `~total`) under a lease (a sorted set: replica -> expiry).
    Cap {
        leases: Key,
        amounts: Key,
        limit: i64,
        kind: CapKind,
    },
}

impl Check {
    /// The Redis key that names this check (also the key of this replica's credit for it).
    pub fn key(&self) -> &Key {
        match self {
            Self::Window { key, .. } | Self::Cap { leases: key, .. } => key,
            Self::Spend { settled, .. } => settled,
        }
    }

    pub fn limit(&self) -> i64 {
        match self {
            Self::Window { limit, .. } | Self::Spend { limit, .. } | Self::Cap { limit, .. } => {
                *limit
            }
        }
    }

    pub fn cost(&self) -> i64 {
        match self {
            Self::Window { cost, .. } | Self::Spend { cost, .. } => *cost,
            Self::Cap { .. } => 1,
        }
    }
}

/// The admission-time estimate of a request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Estimate {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// What the tenant pays for the model now.
    pub rates: Rates,
}

impl Estimate {
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    pub fn micros(&self) -> i64 {
        // An upper bound: the whole prompt at the fresh rate (what the cache saves is unknown
        // until the engine answers), every sequence using its `max_tokens`.
        let q = Quantities {
            fresh: i64::try_from(self.prompt_tokens).unwrap_or(i64::MAX),
            cached: 0,
            output: i64::try_from(self.completion_tokens).unwrap_or(i64::MAX),
        };
        line_micros(q, self.rates)
    }
}

/// Who is asking and where the request goes.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub tenant: Uuid,
    pub key: Uuid,
    pub graph: &'a str,
}

/// The spend period (calendar month, UTC) as a key suffix, and the seconds until it ends.
pub fn period(now: OffsetDateTime) -> (String, u64) {
    let label = format!("{:04}{:02}", now.year(), u8::from(now.month()));
    let (y, m) = if now.month() == time::Month::December {
        (now.year() + 1, time::Month::January)
    } else {
        (now.year(), now.month().next())
    };
    let left = time::Date::from_calendar_date(y, m, 1)
        .map(|d| (d.midnight().assume_utc() - now).whole_seconds())
        .unwrap_or(86_400);
    (label, u64::try_from(left.max(1)).unwrap_or(1))
}

/// The Redis keys one (tenant, key, graph) uses in one period, formatted once and shared by
/// every plan (formatting them per request was a tenth of a limited request's cost).
#[derive(Debug)]
pub struct KeyNames {
    period: Arc<str>,
    /// Per subject (key, then tenant): rpm window, tpm window, settled, spend leases, amounts.
    subjects: [[Key; 5]; 2],
    /// In-flight and long-prompt caps: leases, amounts.
    caps: [[Key; 2]; 2],
}

impl KeyNames {
    pub fn new(prefix: &str, t: Target<'_>, period: &str) -> Self {
        let subject = |s: String| -> [Key; 5] {
            [
                format!("{prefix}q:w:{s}:rpm").into(),
                format!("{prefix}q:w:{s}:tpm").into(),
                format!("{prefix}q:s:{s}:{period}").into(),
                format!("{prefix}q:sl:{s}:{period}").into(),
                format!("{prefix}q:sa:{s}:{period}").into(),
            ]
        };
        let cap = |kind: &str| -> [Key; 2] {
            [
                format!("{prefix}q:cl:{}:{}:{kind}", t.tenant, t.graph).into(),
                format!("{prefix}q:ca:{}:{}:{kind}", t.tenant, t.graph).into(),
            ]
        };
        Self {
            period: period.into(),
            subjects: [
                subject(format!("k:{}", t.key)),
                subject(format!("t:{}", t.tenant)),
            ],
            caps: [cap("inflight"), cap("long")],
        }
    }
}

/// [`KeyNames`] by tenant, key and graph, rebuilt when the period changes.
#[derive(Default)]
pub struct NameCache(std::sync::Mutex<HashMap<(Uuid, Uuid), ByGraph>>);

type ByGraph = HashMap<Box<str>, Arc<KeyNames>>;

/// Entries kept before the cache starts over (names are cheap to rebuild).
const NAME_CACHE_MAX: usize = 100_000;

impl NameCache {
    pub fn get(&self, prefix: &str, t: Target<'_>, period: &str) -> Arc<KeyNames> {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = map.get(&(t.tenant, t.key)).and_then(|g| g.get(t.graph)) {
            if &*n.period == period {
                return n.clone();
            }
        }
        if map.len() >= NAME_CACHE_MAX {
            map.clear();
        }
        let names = Arc::new(KeyNames::new(prefix, t, period));
        map.entry((t.tenant, t.key))
            .or_default()
            .insert(t.graph.into(), names.clone());
        names
    }
}

/// Builds the ordered checks. `prompt_long` says whether the prompt estimate reaches the
/// tenant's long-prompt threshold.
pub fn build(names: &KeyNames, limits: &Limits, est: &Estimate, prompt_long: bool) -> Vec<Check> {
    let tokens = i64::try_from(est.tokens()).unwrap_or(i64::MAX);
    let subjects = [
        (&names.subjects[0], &limits.key),
        (&names.subjects[1], &limits.tenant),
    ];
    let mut checks = Vec::with_capacity(8);
    let windows = [(Dim::Requests, 0, 1), (Dim::Tokens, 1, tokens)];
    for (dim, at, cost) in windows {
        for (keys, l) in &subjects {
            let limit = match dim {
                Dim::Requests => l.requests_per_minute,
                Dim::Tokens => l.tokens_per_minute,
            };
            if let Some(limit) = limit {
                checks.push(Check::Window {
                    key: keys[at].clone(),
                    limit,
                    cost,
                    dim,
                });
            }
        }
    }
    for (keys, l) in &subjects {
        if let Some(limit) = l.spend_limit_micros {
            checks.push(Check::Spend {
                settled: keys[2].clone(),
                leases: keys[3].clone(),
                amounts: keys[4].clone(),
                limit,
                cost: est.micros(),
            });
        }
    }
    let caps = [
        (limits.caps.max_in_flight, CapKind::InFlight, true),
        (
            limits.caps.max_long_prompts,
            CapKind::LongPrompts,
            prompt_long,
        ),
    ];
    for ((limit, kind, applies), keys) in caps.into_iter().zip(&names.caps) {
        if let (Some(limit), true) = (limit, applies) {
            checks.push(Check::Cap {
                leases: keys[0].clone(),
                amounts: keys[1].clone(),
                limit,
                kind,
            });
        }
    }
    checks
}

/// The settled-spend keys of the subjects (key, tenant) that have no spend limit: no check
/// counts their spend, so the admitted request's guard adds it to them at completion, and a limit
/// set later starts from what was spent (issue 31: a fresh limit used to start from zero until
/// the reconciler's next pass).
pub fn uncounted(names: &KeyNames, limits: &Limits) -> Vec<Key> {
    [
        (&names.subjects[0], &limits.key),
        (&names.subjects[1], &limits.tenant),
    ]
    .into_iter()
    .filter(|(_, l)| l.spend_limit_micros.is_none())
    .map(|(keys, _)| keys[2].clone())
    .collect()
}

/// The Redis key of a subject's settled spend (for the reconciler).
pub fn settled_key(prefix: &str, subject: &str, period: &str) -> String {
    format!("{prefix}q:s:{subject}:{period}")
}

#[cfg(test)]
mod tests {
    use crate::quota::limits::{Caps, RateLimits};
    use crate::quota::plan::*; // not `super`: scripts/import-cycles.py reads it as the parent

    #[test]
    fn checks_come_cheapest_first_and_only_when_limited() {
        let limits = Limits {
            tenant: RateLimits {
                requests_per_minute: Some(10),
                tokens_per_minute: None,
                spend_limit_micros: Some(5),
            },
            key: RateLimits {
                requests_per_minute: Some(3),
                tokens_per_minute: Some(100),
                spend_limit_micros: None,
            },
            caps: Caps {
                max_in_flight: Some(2),
                max_long_prompts: Some(1),
                long_prompt_tokens: None,
            },
            tier: None,
        };
        let t = Target {
            tenant: Uuid::nil(),
            key: Uuid::max(),
            graph: "g",
        };
        let est = Estimate {
            prompt_tokens: 10,
            completion_tokens: 20,
            rates: Rates {
                fresh_per_m: 1_000_000,
                cached_per_m: 0,
                output_per_m: 1_000_000,
            },
        };
        let names = KeyNames::new("p:", t, "202612");
        let c = build(&names, &limits, &est, false);
        let kinds: Vec<_> = c.iter().map(|c| (c.limit(), c.cost())).collect();
        assert_eq!(kinds, vec![(3, 1), (10, 1), (100, 30), (5, 30), (2, 1)]);
        assert_eq!(build(&names, &limits, &est, true).len(), 6);
        let cache = NameCache::default();
        let a = cache.get("p:", t, "202612");
        assert!(
            Arc::ptr_eq(&a, &cache.get("p:", t, "202612")),
            "names are shared"
        );
        assert!(
            !Arc::ptr_eq(&a, &cache.get("p:", t, "202701")),
            "a new period renames"
        );
    }

    #[test]
    fn period_is_the_utc_month() {
        let now = time::macros::datetime!(2026-12-31 23:59:00 UTC);
        assert_eq!(period(now), ("202612".to_owned(), 60));
    }
}
