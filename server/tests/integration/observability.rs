//! What an operator sees: after a scripted mix of requests (answered, streamed, refused with
//! 4xx and 429, failed upstream, abandoned by the client), `/metrics` on the metrics listener,
//! parsed by a real Prometheus text parser, counts exactly that mix (every counter and every
//! histogram bucket checked against the stored usage events), every series and label the chart's
//! dashboard and alert rules name exists in it, the client port has no `/metrics`, and JSON logs
//! name the request on the lines logged while serving it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use prometheus_parse::{Scrape, Value as Pv};
use serde_json::json;
use sqlx::PgPool;
use tokenfactory::journal::{Durability, Journal, JournalMetrics};
use tokenfactory::telemetry::histogram::{DURATION_BOUNDS, TOKEN_BOUNDS, TPOT_BOUNDS, TTFT_BOUNDS};
use tokenfactory::usage::{UsageEvent, UsageStatus};

fn parse(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap()
}

fn label<'a>(s: &'a prometheus_parse::Sample, name: &str) -> &'a str {
    s.labels.get(name).unwrap_or("")
}

/// The counter or gauge `name` with exactly these label values.
fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| label(s, k) == *v))
        .map(|s| match s.value {
            Pv::Counter(v) | Pv::Gauge(v) | Pv::Untyped(v) => v,
            _ => panic!("{name} is not a scalar"),
        })
        .collect();
    assert_eq!(found.len(), 1, "{name}{labels:?}: {found:?}");
    found[0]
}

/// The histogram `name` of model `model` (plus `extra` labels): (upper bound, cumulative count).
fn buckets(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
    let found: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| label(s, k) == *v))
        .collect();
    assert_eq!(found.len(), 1, "{name}{labels:?}");
    match &found[0].value {
        Pv::Histogram(h) => h.iter().map(|b| (b.less_than, b.count)).collect(),
        v => panic!("{name} is not a histogram: {v:?}"),
    }
}

/// Checks every bucket of a histogram against the values it should have observed (each value
/// as the binary computes it, in millionths), and its `_count` and `_sum`.
fn check_histogram(
    scrape: &Scrape,
    name: &str,
    labels: &[(&str, &str)],
    bounds: &[f64],
    micros: &[u64],
) {
    let got = buckets(scrape, name, labels);
    assert_eq!(
        got.len(),
        bounds.len() + 1,
        "{name}: one bucket per bound and +Inf"
    );
    for (i, (le, count)) in got.iter().enumerate() {
        if i < bounds.len() {
            assert_eq!(*le, bounds[i], "{name}: bucket {i}");
        } else {
            assert!(le.is_infinite());
        }
        let expected = micros.iter().filter(|m| **m as f64 / 1e6 <= *le).count();
        assert_eq!(
            *count as usize, expected,
            "{name}{labels:?} le={le}: {micros:?}"
        );
    }
    assert_eq!(
        value(scrape, &format!("{name}_count"), labels) as usize,
        micros.len()
    );
    let sum: u64 = micros.iter().sum();
    let got_sum = value(scrape, &format!("{name}_sum"), labels);
    assert!(
        (got_sum - sum as f64 / 1e6).abs() < 1e-6,
        "{name}_sum {got_sum}"
    );
}

fn ms(v: i32) -> u64 {
    u64::try_from(v).unwrap() * 1000
}

#[sqlx::test(migrations = "../migrations")]
async fn metrics_count_a_scripted_mix_exactly(pool: PgPool) {
    // As in production: events go through the journal and its shipper.
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::open(
        dir.path(),
        Durability::Process,
        Duration::from_millis(5),
        Arc::new(JournalMetrics::default()),
    )
    .unwrap();
    let t = TestApp::builder(pool.clone())
        .journal(Arc::new(journal))
        .start()
        .await;
    let a = t.tenant("acme").await;
    let b = t.tenant("bobco").await;
    admin_limits(&pool, &["--tenant", "bobco", "--tpm", "10"]).await;
    let chat_url = "/v1/chat/completions";
    let paced = json!({"ttft_ms": 30, "token_interval_ms": 15});

    // 2 answered whole, 1 streamed chat, 1 streamed completion.
    for _ in 0..2 {
        let r = t
            .post(&a.key, chat_url, chat(BASE, "hello there", 4))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    let mut body = chat(BASE, "one two three", 6);
    body["stream"] = json!(true);
    body["sim"] = paced.clone();
    let r = t.post(&a.key, chat_url, body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(sse_data(r).await.last().is_some_and(|d| d == "[DONE]"));
    let body = json!({"model": BASE, "prompt": "once upon", "max_tokens": 5, "stream": true, "sim": paced});
    let r = t
        .post(&a.key, "/v1/completions", body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    sse_data(r).await;
    // 4xx before a model is resolved: a bad key, an unknown model, a malformed body.
    let r = t
        .post("tf-not-a-key", chat_url, chat(BASE, "x", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = t
        .post(&a.key, chat_url, chat("no-such-model", "x", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let mut body = chat(BASE, "x", 2);
    body["stream"] = json!("yes");
    let r = t.post(&a.key, chat_url, body).send().await.unwrap();
    assert_eq!(r.status(), 400);
    // 429: over bobco's tokens per minute.
    let r = t
        .post(&b.key, chat_url, chat(BASE, "hello", 30))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    // The engine answers 503.
    let mut body = chat(BASE, "x", 3);
    body["sim"] = json!({"fail_status": 503});
    let r = t.post(&a.key, chat_url, body).send().await.unwrap();
    assert_eq!(r.status(), 503);
    // A stream the client abandons after three events.
    let mut body = chat(BASE, "long story", 200);
    body["stream"] = json!(true);
    body["sim"] = json!({"ttft_ms": 10, "token_interval_ms": 20, "completion_tokens": 200});
    let r = t.post(&a.key, chat_url, body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    read_events_then_hang_up(r, 3).await;
    // The model list.
    let r = t
        .http
        .get(t.url("/v1/models"))
        .bearer_auth(&a.key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let events: Vec<UsageEvent> =
        eventually(Duration::from_secs(10), "the mix's 7 events", || async {
            let e = t.events().await;
            if e.len() == 7 {
                Ok(e)
            } else {
                Err(e.len())
            }
        })
        .await;
    // The abandoned stream's accounting has finished (its graph is no longer in flight).
    let scrape = eventually(Duration::from_secs(10), "nothing in flight", || async {
        let s = parse(&t.metrics().await);
        let in_flight: Vec<f64> = s
            .samples
            .iter()
            .filter(|x| x.metric == "tf_requests_in_flight")
            .map(|x| match x.value {
                Pv::Gauge(v) => v,
                _ => panic!(),
            })
            .collect();
        let shipped = value(&s, "tf_usage_events_shipped_total", &[]);
        if in_flight == [0.0] && shipped == 7.0 {
            Ok(s)
        } else {
            Err((in_flight, shipped))
        }
    })
    .await;

    // The usage pipeline: every event journaled and shipped, nothing left behind.
    assert_eq!(value(&scrape, "tf_usage_events_journaled_total", &[]), 7.0);
    assert_eq!(value(&scrape, "tf_journal_backlog_bytes", &[]), 0.0);

    // Answers by endpoint, model, status class and code: exactly the mix, nothing else.
    let mut expected: BTreeMap<(&str, &str, &str, &str), f64> = BTreeMap::new();
    for (k, n) in [
        (("chat_completions", BASE, "2xx", "none"), 4.0),
        (("completions", BASE, "2xx", "none"), 1.0),
        (("chat_completions", "", "4xx", "invalid_key"), 1.0),
        (("chat_completions", "", "4xx", "model_not_found"), 1.0),
        (("chat_completions", "", "4xx", "bad_request"), 1.0),
        (("chat_completions", BASE, "4xx", "rate_limited"), 1.0),
        (("chat_completions", BASE, "5xx", "upstream_error"), 1.0),
        (("models", "", "2xx", "none"), 1.0),
    ] {
        expected.insert(k, n);
    }
    let got: BTreeMap<(&str, &str, &str, &str), f64> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "tf_http_requests_total")
        .map(|s| {
            let v = match s.value {
                Pv::Counter(v) => v,
                _ => panic!(),
            };
            (
                (
                    label(s, "endpoint"),
                    label(s, "model"),
                    label(s, "status_class"),
                    label(s, "code"),
                ),
                v,
            )
        })
        .collect();
    assert_eq!(got, expected);

    // How the requests that reached admission ended, against the stored events.
    let count = |st: UsageStatus| events.iter().filter(|e| e.status == st).count() as f64;
    assert_eq!(count(UsageStatus::Ok), 4.0);
    assert_eq!(count(UsageStatus::ClientAbort), 1.0);
    for (outcome, st) in [
        ("ok", UsageStatus::Ok),
        ("client_abort", UsageStatus::ClientAbort),
        ("upstream_error", UsageStatus::UpstreamError),
        ("interrupted", UsageStatus::Interrupted),
        ("rejected", UsageStatus::Rejected),
    ] {
        assert_eq!(
            value(
                &scrape,
                "tf_requests_finished_total",
                &[("model", BASE), ("outcome", outcome)]
            ),
            count(st),
            "{outcome}"
        );
    }
    assert_eq!(
        value(&scrape, "tf_quota_refusals_total", &[("limit", "tokens")]),
        1.0
    );
    assert_eq!(
        value(&scrape, "tf_quota_refusals_total", &[("limit", "requests")]),
        0.0
    );
    assert_eq!(
        value(
            &scrape,
            "tf_upstream_errors_total",
            &[("kind", "error_status")]
        ),
        1.0
    );
    assert_eq!(
        value(&scrape, "tf_upstream_errors_total", &[("kind", "timeout")]),
        0.0
    );
    assert_eq!(
        value(
            &scrape,
            "tf_upstream_errors_total",
            &[("kind", "unreachable")]
        ),
        0.0
    );

    // Every histogram bucket, from the events' own numbers.
    let served: Vec<&UsageEvent> = events
        .iter()
        .filter(|e| e.status != UsageStatus::Rejected)
        .collect();
    let m = [("model", BASE)];
    check_histogram(
        &scrape,
        "gen_ai_server_request_duration_seconds",
        &m,
        DURATION_BOUNDS,
        &served.iter().map(|e| ms(e.duration_ms)).collect::<Vec<_>>(),
    );
    let streamed: Vec<&&UsageEvent> = served.iter().filter(|e| e.ttft_ms.is_some()).collect();
    assert_eq!(
        streamed.len(),
        5,
        "two streams, the two whole answers (streamed upstream, assembled by the gateway) and the \
         abandoned one had a first token"
    );
    check_histogram(
        &scrape,
        "gen_ai_server_time_to_first_token_seconds",
        &m,
        TTFT_BOUNDS,
        &streamed
            .iter()
            .map(|e| ms(e.ttft_ms.unwrap()))
            .collect::<Vec<_>>(),
    );
    let per_token = |e: &UsageEvent| {
        (ms(e.duration_ms) - ms(e.ttft_ms.unwrap())) / (e.completion_tokens as u64 - 1)
    };
    let tpot: Vec<u64> = streamed
        .iter()
        .filter(|e| e.completion_tokens > 1)
        .map(|e| per_token(e))
        .collect();
    // The engine paces what the client streams; a whole answer comes as fast as it can.
    let paced: Vec<u64> = streamed
        .iter()
        .filter(|e| e.stream && e.completion_tokens > 1)
        .map(|e| per_token(e))
        .collect();
    assert!(
        !paced.is_empty() && paced.iter().all(|t| *t >= 10_000),
        "paced at 15-20 ms a token: {paced:?}"
    );
    check_histogram(
        &scrape,
        "gen_ai_server_time_per_output_token_seconds",
        &m,
        TPOT_BOUNDS,
        &tpot,
    );
    let input: fn(&UsageEvent) -> i64 = |e| e.prompt_tokens;
    for (kind, of) in [("input", input), ("output", |e| e.completion_tokens)] {
        check_histogram(
            &scrape,
            "gen_ai_client_token_usage",
            &[("model", BASE), ("gen_ai_token_type", kind)],
            TOKEN_BOUNDS,
            &served
                .iter()
                .map(|e| of(e) as u64 * 1_000_000)
                .collect::<Vec<_>>(),
        );
    }
    for (kind, of) in [
        (
            "prompt",
            (|e: &UsageEvent| e.prompt_tokens) as fn(&UsageEvent) -> i64,
        ),
        ("cached", |e| e.cached_tokens),
        ("completion", |e| e.completion_tokens),
        ("reasoning", |e| e.reasoning_tokens),
    ] {
        let sum: i64 = events.iter().map(of).sum();
        assert_eq!(
            value(
                &scrape,
                "tf_tokens_total",
                &[("model", BASE), ("kind", kind)]
            ),
            sum as f64,
            "{kind}"
        );
    }
    assert!(
        value(
            &scrape,
            "tf_tokens_total",
            &[("model", BASE), ("kind", "completion")]
        ) > 0.0
    );

    // The client port does not publish the platform's counters.
    let r = t.http.get(t.url("/metrics")).send().await.unwrap();
    let text = r.text().await.unwrap();
    assert!(!text.contains("tf_http_requests_total"), "{text}");

    every_query_names_what_is_exported(&scrape);
}

/// Every series a dashboard panel or an alert rule names is in the scrape, with every label it
/// selects on, and each exact label value it selects (`le="1"`, `kind="timeout"`) exists.
fn every_query_names_what_is_exported(scrape: &Scrape) {
    let histograms: BTreeSet<&str> = scrape
        .samples
        .iter()
        .filter(|s| matches!(s.value, Pv::Histogram(_)))
        .map(|s| s.metric.as_str())
        .collect();
    let base = |name: &str| -> String {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(b) = name.strip_suffix(suffix) {
                if histograms.contains(b) {
                    return b.to_owned();
                }
            }
        }
        name.to_owned()
    };
    let mut names: BTreeSet<String> = scrape.samples.iter().map(|s| s.metric.clone()).collect();
    for h in &histograms {
        for suffix in ["_bucket", "_sum", "_count"] {
            names.insert(format!("{h}{suffix}"));
        }
    }
    let label_names: BTreeSet<&str> = scrape
        .samples
        .iter()
        .flat_map(|s| s.labels.keys().map(String::as_str))
        .chain(["le"])
        .collect();
    let token = regex::Regex::new(r"\b((?:tf|gen_ai)_[a-z0-9_]+)(\s*\{([^}]*)\})?").unwrap();
    let matcher = regex::Regex::new(r#"([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)""#).unwrap();
    let queries = common::helm::monitoring_queries();
    assert!(queries.len() > 30, "{}", queries.len());
    let mut series_named = 0;
    for (place, expr) in &queries {
        for c in token.captures_iter(expr) {
            let name = &c[1];
            if !names.contains(name) {
                assert!(
                    label_names.contains(name) && c.get(2).is_none(),
                    "{place}: `{name}` is neither an exported series nor a label: {expr}"
                );
                continue;
            }
            series_named += 1;
            let Some(selector) = c.get(3) else { continue };
            let b = base(name);
            let samples: Vec<_> = scrape.samples.iter().filter(|s| s.metric == b).collect();
            for m in matcher.captures_iter(selector.as_str()) {
                let (l, op, v) = (&m[1], &m[2], &m[3]);
                if l == "le" {
                    let le: f64 = v.parse().unwrap();
                    assert!(
                        samples.iter().any(|s| matches!(&s.value, Pv::Histogram(h) if h.iter().any(|x| x.less_than == le))),
                        "{place}: no bucket le={v} in {name}"
                    );
                    continue;
                }
                assert!(
                    samples.iter().any(|s| s.labels.get(l).is_some()),
                    "{place}: {name} has no label {l}"
                );
                if op == "=" && !v.contains('$') {
                    assert!(
                        samples.iter().any(|s| s.labels.get(l) == Some(v)),
                        "{place}: {name} never has {l}=\"{v}\""
                    );
                }
            }
        }
    }
    assert!(series_named > queries.len(), "{series_named}");
}

/// Rating lag: with no rater running, the stored events wait in the rating queue; every scrape
/// shows how many and how old the oldest is (growing while it waits), and once they are rated
/// both fall to zero.
#[sqlx::test(migrations = "../migrations")]
async fn rating_lag_shows_what_waits_to_be_rated(pool: PgPool) {
    let t = TestApp::builder(pool.clone()).without_rater().start().await;
    let scrape = parse(&t.metrics().await);
    assert_eq!(value(&scrape, "tf_rating_queue_events", &[]), 0.0);
    assert_eq!(value(&scrape, "tf_rating_lag_seconds", &[]), 0.0);

    let acme = t.tenant("acme").await;
    let sent = std::time::Instant::now();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let r = t
            .post(&acme.key, "/v1/chat/completions", chat(BASE, "hello", 3))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        ids.push(request_id(&r));
        r.bytes().await.unwrap();
    }
    for id in &ids {
        t.event(id).await;
    }
    // A scrape reads the queue at most once a second: wait for one that has the three events,
    // then for the age to pass a second (it is an age, not a timestamp).
    let lag = eventually(Duration::from_secs(5), "three events waiting", || async {
        let scrape = parse(&t.metrics().await);
        (value(&scrape, "tf_rating_queue_events", &[]) == 3.0)
            .then(|| value(&scrape, "tf_rating_lag_seconds", &[]))
    })
    .await;
    assert!(lag <= sent.elapsed().as_secs_f64() + 0.01, "{lag}");
    eventually(
        Duration::from_secs(5),
        "the lag to grow past 1 s",
        || async { value(&parse(&t.metrics().await), "tf_rating_lag_seconds", &[]) >= 1.0 },
    )
    .await;
    assert!(
        value(&parse(&t.metrics().await), "tf_rating_lag_seconds", &[])
            <= sent.elapsed().as_secs_f64() + 0.01
    );

    let rated =
        tokenfactory::billing::rater::pass(&pool, 100, &tokio_util::sync::CancellationToken::new())
            .await
            .unwrap();
    assert_eq!(rated, 3);
    eventually(Duration::from_secs(5), "an empty rating queue", || async {
        let scrape = parse(&t.metrics().await);
        value(&scrape, "tf_rating_queue_events", &[]) == 0.0
            && value(&scrape, "tf_rating_lag_seconds", &[]) == 0.0
    })
    .await;
}

#[sqlx::test(migrations = "../migrations")]
async fn json_logs_name_the_request_on_its_lines(pool: PgPool) {
    let logs = Logs::default();
    tokenfactory::telemetry::logs::init_with(
        tokenfactory::telemetry::logs::LogFormat::Json,
        logs.clone(),
    );
    let t = TestApp::builder(pool).start().await;
    let a = t.tenant("acme").await;
    // The engine breaks the stream after two tokens: logged while the body is being sent.
    let mut body = chat(BASE, "hello", 8);
    body["stream"] = json!(true);
    body["sim"] = json!({"die_after_chunks": 2});
    let r = t
        .post(&a.key, "/v1/chat/completions", body)
        .send()
        .await
        .unwrap();
    let id = request_id(&r);
    r.bytes().await.ok();
    t.event(&id).await;
    let lines = logs.lines();
    let mine: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["span"]["request_id"] == id.as_str())
        .collect();
    assert!(
        mine.iter().any(|l| l["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("upstream"))),
        "the stream's failure is logged with its request id: {lines:#?}"
    );
    for l in &mine {
        assert_eq!(l["spans"][0]["name"], "request");
    }
}

/// A log sink the test reads back.
#[derive(Clone, Default)]
struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    fn lines(&self) -> Vec<serde_json::Value> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}
