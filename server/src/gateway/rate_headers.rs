//! How admission's answer reaches the client: the `x-ratelimit-*` headers (OpenAI's names) of the
//! tightest request and token windows, and a refusal's 429 (`rate_limit_exceeded`, or
//! `insufficient_quota` for spend) with `retry-after`. Writing headers cannot fail: a value that
//! does not fit a header is left out.

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::quota::answer::{RateStatus, Refusal, RefusalKind};

/// Adds the `x-ratelimit-*` headers of `status` to a response.
pub fn apply(status: &RateStatus, headers: &mut HeaderMap) {
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
    for (t, [limit, remaining, reset]) in [status.requests, status.tokens].into_iter().zip(NAMES) {
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

/// `retry-after` and the `x-ratelimit-*` headers of a refusal.
pub fn write_refusal(r: &Refusal, headers: &mut HeaderMap) {
    headers.insert("retry-after", HeaderValue::from(r.retry_after_s));
    apply(&r.status, headers);
}

/// OpenAI's error code for a refusal.
pub fn code(r: &Refusal) -> &'static str {
    match r.kind {
        RefusalKind::Spend => "insufficient_quota",
        _ => "rate_limit_exceeded",
    }
}

/// The message shown to the client.
pub fn message(r: &Refusal) -> &'static str {
    match r.kind {
        RefusalKind::Requests => "Rate limit reached for requests per minute. Please retry later.",
        RefusalKind::Tokens => "Rate limit reached for tokens per minute. Please retry later.",
        RefusalKind::Spend => "You exceeded your current spend limit for this period.",
        RefusalKind::InFlight => "Too many concurrent requests for this model. Please retry later.",
        RefusalKind::LongPrompts => {
            "Too many concurrent long prompts for this model. Please retry later."
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

#[cfg(test)]
mod tests {
    use crate::gateway::rate_headers::*; // not `super`: scripts/import-cycles.py reads it as the parent
    use crate::quota::answer::Tally;

    #[test]
    fn durations_read_like_openai() {
        assert_eq!(duration(250), "250ms");
        assert_eq!(duration(1000), "1s");
        assert_eq!(duration(1200), "2s");
        assert_eq!(duration(360_000), "6m0s");
    }

    #[test]
    fn headers_of_the_tightest_windows() {
        let status = RateStatus {
            requests: Some(Tally {
                limit: 100,
                remaining: 1,
                reset_ms: 2000,
            }),
            tokens: Some(Tally {
                limit: 1000,
                remaining: 999,
                reset_ms: 0,
            }),
        };
        let mut m = HeaderMap::new();
        apply(&status, &mut m);
        assert_eq!(m["x-ratelimit-remaining-requests"], "1");
        assert_eq!(m["x-ratelimit-reset-tokens"], "0ms");
    }
}
