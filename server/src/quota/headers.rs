//! What a client is told about its limits: the `x-ratelimit-*` headers (OpenAI's names) of the
//! tightest request and token windows, and the refusal (429 `rate_limit_exceeded`, or
//! `insufficient_quota` for spend) with `retry-after`. Writing headers cannot fail: a value that
//! does not fit a header is left out.

use axum::http::{HeaderMap, HeaderName, HeaderValue};

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
pub struct RateHeaders {
    pub requests: Option<Tally>,
    pub tokens: Option<Tally>,
}

impl RateHeaders {
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

    /// Adds the headers to a response.
    pub fn apply(&self, headers: &mut HeaderMap) {
        const NAMES: [[&str; 3]; 2] = [
            [
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
            ],
            [
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
            ],
        ];
        for (t, [limit, remaining, reset]) in [self.requests, self.tokens].into_iter().zip(NAMES) {
            let Some(t) = t else { continue };
            headers.insert(HeaderName::from_static(limit), HeaderValue::from(t.limit));
            headers.insert(
                HeaderName::from_static(remaining),
                HeaderValue::from(t.remaining),
            );
            if let Ok(v) = HeaderValue::from_str(&duration(t.reset_ms)) {
                headers.insert(HeaderName::from_static(reset), v);
            }
        }
    }
}

/// A duration the way OpenAI writes it: `250ms`, `1s`, `6m0s`.
pub fn duration(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = (ms + 999) / 1000;
    if s < 60 {
        format!("{s}s")
    } else {
        format!("{}m{}s", s / 60, s % 60)
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

/// A refused request: everything the 429 needs.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub kind: RefusalKind,
    pub retry_after_s: u64,
    pub headers: RateHeaders,
}

impl Refusal {
    pub fn new(check: &Check, retry_ms: i64, headers: RateHeaders) -> Self {
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
            headers,
        }
    }

    /// OpenAI's error code.
    pub fn code(&self) -> &'static str {
        match self.kind {
            RefusalKind::Spend => "insufficient_quota",
            _ => "rate_limit_exceeded",
        }
    }

    /// The message shown to the client.
    pub fn message(&self) -> &'static str {
        match self.kind {
            RefusalKind::Requests => {
                "Rate limit reached for requests per minute. Please retry later."
            }
            RefusalKind::Tokens => "Rate limit reached for tokens per minute. Please retry later.",
            RefusalKind::Spend => "You exceeded your current spend limit for this period.",
            RefusalKind::InFlight => {
                "Too many concurrent requests for this model. Please retry later."
            }
            RefusalKind::LongPrompts => {
                "Too many concurrent long prompts for this model. Please retry later."
            }
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

    /// `retry-after` and the `x-ratelimit-*` headers.
    pub fn write_headers(&self, headers: &mut HeaderMap) {
        headers.insert("retry-after", HeaderValue::from(self.retry_after_s));
        self.headers.apply(headers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_openai() {
        assert_eq!(duration(250), "250ms");
        assert_eq!(duration(1000), "1s");
        assert_eq!(duration(1200), "2s");
        assert_eq!(duration(360_000), "6m0s");
    }

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
        let h = RateHeaders::from_answer(&checks, &[(5, 1000), (98, 2000), (0, 0)], true);
        assert_eq!(
            h.requests,
            Some(Tally {
                limit: 100,
                remaining: 1,
                reset_ms: 2000
            })
        );
        assert_eq!(h.tokens.map(|t| t.remaining), Some(999));
        let mut m = HeaderMap::new();
        h.apply(&mut m);
        assert_eq!(m["x-ratelimit-remaining-requests"], "1");
        assert_eq!(m["x-ratelimit-reset-tokens"], "0ms");
    }
}
