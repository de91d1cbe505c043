//! `tokenfactory admin economics measure-peak --base B [--url URL] [--concurrency N]
//! [--seconds S]`: what one replica of a base really serves at full load, measured rather than
//! configured (issue 17).
//!
//! It keeps `concurrency` chat completions in flight against the base's graph frontend (the
//! OpenAI endpoint the gateway forwards to; `--url` for another) for `seconds`, and reads the
//! engine's OWN token counters before and after, not the client's view: `vllm:prompt_tokens_total`
//! plus `vllm:generation_tokens_total` (summed over every series) on `/metrics` at the URL's
//! origin (`--metrics-url` for another; the simulator and its `local-sim` frontend export the
//! same names). Prompt and generated tokens both count, since the duty cycle counts both against
//! the peak. The first fifth of the run (at most 5 s) warms up and is not counted. The peak per
//! replica is `tokens x 1000 / elapsed ms / replicas`, rounded half-up; it is appended as a new
//! cost version effective now, with the GPU cost of the version in effect and the measurement kept
//! on the row (`base_costs.peak_measured`), audited.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use sqlx::PgPool;
use tf_core::operator::{self, Actor};

use crate::cli::MeasurePeakArgs;

/// The counters read, in the order summed.
const COUNTERS: [&str; 2] = ["vllm:prompt_tokens_total", "vllm:generation_tokens_total"];

/// Sums every series of [`COUNTERS`] in a Prometheus text page; `None` if neither appears.
pub fn engine_tokens(page: &str) -> Option<u64> {
    let mut found = false;
    let mut sum: u64 = 0;
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.trim().rsplit_once(' ') else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series);
        if !COUNTERS.contains(&name) {
            continue;
        }
        // Prometheus writes counters as floats (`1.5e+06` from vLLM's client).
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        if v.is_finite() && v >= 0.0 {
            found = true;
            // A counter is a whole number of tokens (finite and >= 0: the cast is exact enough).
            let whole = v.round() as u64;
            sum = sum.saturating_add(whole);
        }
    }
    found.then_some(sum)
}

/// `http://host:port/v1` -> `http://host:port/metrics`.
fn metrics_of(url: &str) -> String {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let origin_end = url[after_scheme..]
        .find('/')
        .map_or(url.len(), |i| after_scheme + i);
    format!("{}/metrics", &url[..origin_end])
}

async fn read_tokens(http: &reqwest::Client, url: &str) -> anyhow::Result<u64> {
    let page = http
        .get(url)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("reading the engine's counters at {url}"))?
        .text()
        .await?;
    engine_tokens(&page).with_context(|| {
        format!(
            "{url} has neither {} nor {}: point --metrics-url at the engine's /metrics",
            COUNTERS[0], COUNTERS[1]
        )
    })
}

/// What one run measured.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub tokens: u64,
    pub elapsed: Duration,
    pub requests_ok: u64,
    pub requests_failed: u64,
}

/// Keeps `concurrency` requests in flight on `url` for `seconds`; counts the engine's tokens
/// between the end of the warm-up and the end of the run.
pub async fn load(
    http: &reqwest::Client,
    url: &str,
    metrics_url: &str,
    model: &str,
    a: &MeasurePeakArgs,
) -> anyhow::Result<Measured> {
    let total = Duration::from_secs(a.seconds.max(1));
    let warm_up = (total / 5).min(Duration::from_secs(5));
    let started = Instant::now();
    let end = started + total;
    let endpoint = format!("{}/chat/completions", url.trim_end_matches('/'));
    let body = json!({
        "model": model,
        "messages": [{"role": "user", "content":
            "Measure the peak: write a long and detailed story about a token factory."}],
        "max_tokens": a.max_tokens,
        "stream": false,
    });
    let ok = std::sync::atomic::AtomicU64::new(0);
    let failed = std::sync::atomic::AtomicU64::new(0);
    let (endpoint, body, ok_ref, failed_ref) = (&endpoint, &body, &ok, &failed);
    let worker = move || async move {
        let (ok, failed) = (ok_ref, failed_ref);
        while Instant::now() < end {
            let sent = http.post(endpoint).json(body).send();
            let done = tokio::time::timeout_at(end.into(), sent).await;
            match done {
                // The deadline: the request in flight is dropped (the engine stops it).
                Err(_) => return,
                Ok(Ok(r)) if r.status().is_success() => {
                    // Drain the answer (its tokens are counted by the engine, not here).
                    if tokio::time::timeout_at(end.into(), r.bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                    ok.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok(_) => {
                    failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    };
    let counting = async {
        tokio::time::sleep_until((started + warm_up).into()).await;
        let (t0, c0) = (Instant::now(), read_tokens(http, metrics_url).await?);
        tokio::time::sleep_until(end.into()).await;
        let (c1, t1) = (read_tokens(http, metrics_url).await?, Instant::now());
        anyhow::Ok((c1.saturating_sub(c0), t1 - t0))
    };
    let workers = futures::future::join_all((0..a.concurrency.max(1)).map(|_| worker()));
    let (counted, ()) = tokio::join!(counting, async {
        workers.await;
    });
    let (tokens, elapsed) = counted?;
    Ok(Measured {
        tokens,
        elapsed,
        requests_ok: ok.load(std::sync::atomic::Ordering::Relaxed),
        requests_failed: failed.load(std::sync::atomic::Ordering::Relaxed),
    })
}

/// Tokens per second per replica, half-up: `tokens x 1000 / ms / replicas`.
pub fn per_replica(tokens: u64, elapsed: Duration, replicas: u32) -> i64 {
    let ms = elapsed.as_millis().max(1);
    let d = ms.saturating_mul(u128::from(replicas.max(1)));
    let n = u128::from(tokens).saturating_mul(1000);
    i64::try_from((n + d / 2) / d).unwrap_or(i64::MAX)
}

/// Runs the measurement and records it; returns what to print.
pub async fn run(pool: &PgPool, a: &MeasurePeakArgs) -> anyhow::Result<String> {
    let Some(served) = tf_core::db::economics::served_base(pool, &a.base).await? else {
        bail!("no base model {:?}", a.base);
    };
    // Refused before any load when there is no cost to add a peak to (checked again on write).
    let now = time::OffsetDateTime::now_utc();
    if !tf_core::db::economics::costs(pool)
        .await?
        .iter()
        .any(|c| c.base_model == a.base && c.effective_from <= now)
    {
        bail!(
            "{} has no cost in effect: set its GPU cost first (/admin/economics)",
            a.base
        );
    }
    let url = a.url.clone().unwrap_or(served.upstream_url);
    let metrics_url = a.metrics_url.clone().unwrap_or_else(|| metrics_of(&url));
    let replicas = a.replicas.unwrap_or_else(|| {
        served
            .replicas_ready
            .and_then(|r| u32::try_from(r).ok())
            .filter(|r| *r > 0)
            .unwrap_or(1)
    });
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(a.concurrency as usize)
        .build()?;
    // Fail before loading anything if the counters are not there.
    read_tokens(&http, &metrics_url).await?;
    let m = load(&http, &url, &metrics_url, &served.upstream_model, a).await?;
    if m.requests_ok == 0 {
        bail!(
            "no request to {url} succeeded ({} failed): nothing recorded",
            m.requests_failed
        );
    }
    let peak = per_replica(m.tokens, m.elapsed, replicas);
    let how = json!({
        "url": url,
        "metrics_url": metrics_url,
        "counters": COUNTERS,
        "concurrency": a.concurrency,
        "seconds": a.seconds,
        "max_tokens": a.max_tokens,
        "counted_ms": u64::try_from(m.elapsed.as_millis()).unwrap_or(u64::MAX),
        "tokens": m.tokens,
        "replicas": replicas,
        "requests_ok": m.requests_ok,
        "requests_failed": m.requests_failed,
    });
    let version = operator::record_measured_peak(pool, &Actor::CLI, &a.base, peak, &how)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(format!(
        "{}: measured peak {peak} tokens/s per replica ({} engine tokens in {} ms on {replicas} \
         replica(s), {} requests, {} failed); cost version {version} appended, effective now",
        a.base,
        m.tokens,
        m.elapsed.as_millis(),
        m.requests_ok,
        m.requests_failed,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_over_series_and_names() {
        let page = "# TYPE vllm:prompt_tokens_total counter\n\
                    vllm:prompt_tokens_total{model_name=\"m\"} 1000\n\
                    vllm:generation_tokens_total{model_name=\"m\",engine=\"0\"} 2.5e+03\n\
                    vllm:generation_tokens_total{model_name=\"m\",engine=\"1\"} 500.0\n\
                    vllm:num_requests_running 3\n";
        assert_eq!(engine_tokens(page), Some(4_000));
        assert_eq!(engine_tokens("other_total 5\n"), None);
    }

    #[test]
    fn the_metrics_url_is_at_the_origin() {
        assert_eq!(
            metrics_of("http://127.0.0.1:8000/v1"),
            "http://127.0.0.1:8000/metrics"
        );
        assert_eq!(metrics_of("http://h:1"), "http://h:1/metrics");
    }

    #[test]
    fn the_peak_per_replica_rounds_half_up() {
        // 10,001 tokens in 2 s on 2 replicas: 2,500.25 -> 2,500.
        assert_eq!(per_replica(10_001, Duration::from_secs(2), 2), 2_500);
        // 5 tokens in 2 s: 2.5 -> 3.
        assert_eq!(per_replica(5, Duration::from_secs(2), 1), 3);
    }
}
