//! What admission tells its caller, as plain data: the standing of the tightest request and token
//! windows, and why a request was refused and when to retry. The gateway renders them as HTTP
//! (`gateway::rate_headers`); nothing here knows about HTTP.

use super::plan::{CapKind, Check, Dim};

/// One window as the client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub limit: i64,
    pub remaining: i64,
    pub reset_ms: i64,
}

/// The tightest request and token windows of one admission (absent when not limited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateStatus {
    pub requests: Option<Tally>,
    pub tokens: Option<Tally>,
}

impl RateStatus {
    /// From a plan and the store's answer; `admitted` says whether the costs were taken.
    pub fn from_answer(checks: &[Check], used_reset: &[(i64, i64)], admitted: bool) -> Self {
        let mut out = Self::default();
        for (c, (used, reset)) in checks.iter().zip(used_reset) {
            let Check::Window {
                limit, cost, dim, ..
            } = c
            else {
                continue;
            };
            let taken = if admitted { *cost } else { 0 };
            let t = Tally {
                limit: *limit,
                remaining: (limit - used - taken).max(0),
                reset_ms: (*reset).max(0),
            };
            let slot = match dim {
                Dim::Requests => &mut out.requests,
                Dim::Tokens => &mut out.tokens,
            };
            if slot.is_none_or(|s| t.remaining < s.remaining) {
                *slot = Some(t);
            }
        }
        out
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    Requests,
    Tokens,
    Spend,
    InFlight,
    LongPrompts,
}

/// A refused request: which limit, when a retry may pass, the windows' standing.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub kind: RefusalKind,
    pub retry_after_s: u64,
    pub status: RateStatus,
}

impl Refusal {
    pub fn new(check: &Check, retry_ms: i64, status: RateStatus) -> Self {
        let kind = match check {
            Check::Window {
                dim: Dim::Requests, ..
            } => RefusalKind::Requests,
            Check::Window {
                dim: Dim::Tokens, ..
            } => RefusalKind::Tokens,
            Check::Spend { .. } => RefusalKind::Spend,
            Check::Cap {
                kind: CapKind::InFlight,
                ..
            } => RefusalKind::InFlight,
            Check::Cap {
                kind: CapKind::LongPrompts,
                ..
            } => RefusalKind::LongPrompts,
        };
        let retry_after_s = u64::try_from((retry_ms.max(1) + 999) / 1000).unwrap_or(1);
        Self {
            kind,
            retry_after_s,
            status,
        }
    }

    /// Low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self.kind {
            RefusalKind::Requests => "requests",
            RefusalKind::Tokens => "tokens",
            RefusalKind::Spend => "spend",
            RefusalKind::InFlight => "in_flight",
            RefusalKind::LongPrompts => "long_prompts",
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::quota::answer::*; // not `super`: scripts/import-cycles.py reads it as the parent

    #[test]
    fn the_tightest_window_wins() {
        let w = |limit, dim| Check::Window {
            key: "".into(),
            limit,
            cost: 1,
            dim,
        };
        let checks = [
            w(10, Dim::Requests),
            w(100, Dim::Requests),
            w(1000, Dim::Tokens),
        ];
        let h = RateStatus::from_answer(&checks, &[(5, 1000), (98, 2000), (0, 0)], true);
        assert_eq!(
            h.requests,
            Some(Tally {
                limit: 100,
                remaining: 1,
                reset_ms: 2000
            })
        );
        assert_eq!(h.tokens.map(|t| t.remaining), Some(999));
    }
}
