//! What one request must pass, in order, cheapest first: per-key then per-tenant requests per
//! minute, tokens per minute, spend, then the tenant's in-flight and long-prompt caps on the target
//! graph. A plan is pure data (Redis keys, limits, costs); the Redis scripts and the local limiter
//! both execute it, so the two paths cannot disagree about what is checked.

use time::OffsetDateTime;
use uuid::Uuid;

use super::limits::{cost_micros, Limits, RateLimits};

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

/// One check; its Redis keys double as the local limiter's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// A sliding 60 s window of one-second buckets (a hash: second -> amount, plus the running
    /// total `t` and the oldest live second `o`, so a check costs O(1), not a scan of 60 buckets).
    Window {
        key: String,
        limit: i64,
        cost: i64,
        dim: Dim,
    },
    /// Spend this period: settled micros plus live reservations (leases that expire).
    Spend {
        settled: String,
        leases: String,
        amounts: String,
        limit: i64,
        cost: i64,
    },
    /// Concurrent leases on a graph (a sorted set: request id -> expiry).
    Cap {
        key: String,
        limit: i64,
        kind: CapKind,
    },
}

impl Check {
    /// The lease sets this check adds the request to (renewed while it runs).
    pub fn lease_keys(&self) -> Vec<&str> {
        match self {
            Self::Window { .. } => Vec::new(),
            Self::Spend { leases, .. } => vec![leases.as_str()],
            Self::Cap { key, .. } => vec![key.as_str()],
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
    pub micros_per_1k: i64,
}

impl Estimate {
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    pub fn micros(&self) -> i64 {
        cost_micros(self.tokens(), self.micros_per_1k)
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

/// Builds the ordered checks. `prompt_long` says whether the prompt estimate reaches the
/// tenant's long-prompt threshold.
pub fn build(
    prefix: &str,
    limits: &Limits,
    t: Target<'_>,
    est: &Estimate,
    period: &str,
    prompt_long: bool,
) -> Vec<Check> {
    let tokens = i64::try_from(est.tokens()).unwrap_or(i64::MAX);
    let subjects = [
        (format!("k:{}", t.key), &limits.key),
        (format!("t:{}", t.tenant), &limits.tenant),
    ];
    let mut checks = Vec::new();
    let mut windows = |dim: Dim, pick: fn(&RateLimits) -> Option<i64>, cost: i64, tag: &str| {
        for (subject, l) in &subjects {
            if let Some(limit) = pick(l) {
                checks.push(Check::Window {
                    key: format!("{prefix}q:w:{subject}:{tag}"),
                    limit,
                    cost,
                    dim,
                });
            }
        }
    };
    windows(Dim::Requests, |l| l.requests_per_minute, 1, "rpm");
    windows(Dim::Tokens, |l| l.tokens_per_minute, tokens, "tpm");
    for (subject, l) in &subjects {
        if let Some(limit) = l.spend_limit_micros {
            checks.push(Check::Spend {
                settled: format!("{prefix}q:s:{subject}:{period}"),
                leases: format!("{prefix}q:sl:{subject}:{period}"),
                amounts: format!("{prefix}q:sa:{subject}:{period}"),
                limit,
                cost: est.micros(),
            });
        }
    }
    if let Some(limit) = limits.caps.max_in_flight {
        checks.push(Check::Cap {
            key: format!("{prefix}q:c:{}:{}:inflight", t.tenant, t.graph),
            limit,
            kind: CapKind::InFlight,
        });
    }
    if let (Some(limit), true) = (limits.caps.max_long_prompts, prompt_long) {
        checks.push(Check::Cap {
            key: format!("{prefix}q:c:{}:{}:long", t.tenant, t.graph),
            limit,
            kind: CapKind::LongPrompts,
        });
    }
    checks
}

/// The Redis key of a subject's settled spend (for the reconciler).
pub fn settled_key(prefix: &str, subject: &str, period: &str) -> String {
    format!("{prefix}q:s:{subject}:{period}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::limits::Caps;

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
        };
        let t = Target {
            tenant: Uuid::nil(),
            key: Uuid::max(),
            graph: "g",
        };
        let est = Estimate {
            prompt_tokens: 10,
            completion_tokens: 20,
            micros_per_1k: 1000,
        };
        let c = build("p:", &limits, t, &est, "202612", false);
        let kinds: Vec<_> = c.iter().map(|c| (c.limit(), c.cost())).collect();
        assert_eq!(kinds, vec![(3, 1), (10, 1), (100, 30), (5, 30), (2, 1)]);
        assert_eq!(build("p:", &limits, t, &est, "202612", true).len(), 6);
    }

    #[test]
    fn period_is_the_utc_month() {
        let now = time::macros::datetime!(2026-12-31 23:59:00 UTC);
        assert_eq!(period(now), ("202612".to_owned(), 60));
    }
}
