//! The request path's series: answers by endpoint, model, status class and error code; the
//! GenAI latency histograms and token counts per model; how finished requests ended; upstream
//! errors by kind; quota refusals by limit; requests held for a wake per graph.
//!
//! The `model` label is the route's base model: bounded by what the operator offers (a tenant's
//! adapters count under their base), never a name the client sent. No tenant label.
//! Each model's series are one [`ModelSeries`] of atomics, found once per request by a read-locked
//! map probe (no allocation once the model has been seen).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::histogram::{self, Histogram};
use crate::usage::{UsageEvent, UsageStatus};

/// A histogram family: its name, its help and where a model's series keeps it.
type HistogramFamily = (&'static str, &'static str, fn(&ModelSeries) -> &Histogram);

/// The `endpoint` label's values, by index.
/// The generating endpoints come first, in [`crate::endpoint::Endpoint::ALL`]'s order (the
/// handlers pass `Endpoint::index`), then `models` ([`MODELS`]).
pub const ENDPOINTS: [&str; 6] = [
    "chat_completions",
    "completions",
    "responses",
    "embeddings",
    "messages",
    "models",
];
/// The `models` label's index.
pub const MODELS: usize = 5;
/// The `code` label's values: `none` for a success, else the gateway error's `metric_label()`.
pub const CODES: [&str; 20] = [
    "none",
    "missing_key",
    "invalid_key",
    "too_many_key_failures",
    "tenant_suspended",
    "model_not_found",
    "bad_request",
    "payload_too_large",
    "body_timeout",
    "upstream_error",
    "upstream_unavailable",
    "upstream_too_large",
    "shutting_down",
    "method_not_allowed",
    "upstream_timeout",
    "service_unavailable",
    "model_starting",
    "model_waking",
    "model_wake_failed",
    "rate_limited",
];
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
/// How finished requests ended (the usage event's status).
const OUTCOMES: [UsageStatus; 5] = [
    UsageStatus::Ok,
    UsageStatus::ClientAbort,
    UsageStatus::UpstreamError,
    UsageStatus::Interrupted,
    UsageStatus::Rejected,
];
/// Upstream failure kinds (`tf_upstream_errors_total{kind}`).
const UPSTREAM_KINDS: [&str; 5] = [
    "unreachable",
    "timeout",
    "error_status",
    "too_large",
    "after_first_token",
];
/// Quota refusal kinds (`tf_quota_refusals_total{limit}`).
pub const LIMITS: [&str; 6] = [
    "requests",
    "tokens",
    "spend",
    "in_flight",
    "long_prompts",
    "bad_keys",
];

/// What a `/v1` error response carries for the metrics (set by `GatewayError::into_response`).
#[derive(Debug, Clone, Copy)]
pub struct ErrorLabel {
    pub code: &'static str,
    /// For a quota refusal: which limit (one of [`LIMITS`]).
    pub limit: Option<&'static str>,
}

/// One model's series.
#[derive(Debug)]
pub struct ModelSeries {
    /// `model="..."`, escaped once.
    label: String,
    /// Answers by [endpoint][status class][code].
    answers: Box<[AtomicU64]>,
    finished: [AtomicU64; OUTCOMES.len()],
    duration: Histogram,
    ttft: Histogram,
    tpot: Histogram,
    input_usage: Histogram,
    output_usage: Histogram,
    /// Prompt, cached (part of prompt), completion, reasoning (part of completion) tokens.
    tokens: [AtomicU64; 4],
}

impl ModelSeries {
    fn new(model: &str) -> Self {
        Self {
            label: format!("model=\"{}\"", escape(model)),
            answers: (0..ENDPOINTS.len() * CLASSES.len() * CODES.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            finished: Default::default(),
            duration: Histogram::new(histogram::DURATION_BOUNDS),
            ttft: Histogram::new(histogram::TTFT_BOUNDS),
            tpot: Histogram::new(histogram::TPOT_BOUNDS),
            input_usage: Histogram::new(histogram::TOKEN_BOUNDS),
            output_usage: Histogram::new(histogram::TOKEN_BOUNDS),
            tokens: Default::default(),
        }
    }
}

/// Label values are admin-chosen names: escaped as the text format requires.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// All request-path series of this replica.
#[derive(Debug)]
pub struct RequestMetrics {
    /// Read twice per request from every worker: copied on the rare insert (a base seen for the
    /// first time), so a read writes no shared cache line as a lock's would.
    models: ArcSwap<HashMap<String, Arc<ModelSeries>>>,
    /// Answers given before a model was resolved (bad key, unknown model, bad body).
    unresolved: Arc<ModelSeries>,
    upstream: [AtomicU64; UPSTREAM_KINDS.len()],
    refusals: [AtomicU64; LIMITS.len()],
    held: Mutex<BTreeMap<String, Arc<AtomicI64>>>,
}

impl Default for RequestMetrics {
    fn default() -> Self {
        Self {
            models: ArcSwap::default(),
            unresolved: Arc::new(ModelSeries::new("")),
            upstream: Default::default(),
            refusals: Default::default(),
            held: Mutex::default(),
        }
    }
}

/// Counts a request held for a wake while it lives.
pub struct Held(Arc<AtomicI64>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl RequestMetrics {
    /// The series of base model `model` (created the first time it is seen).
    pub fn model(&self, model: &str) -> Arc<ModelSeries> {
        if let Some(s) = self.models.load().get(model) {
            return s.clone();
        }
        let mut series = None;
        self.models.rcu(|map| {
            let mut map = HashMap::clone(map);
            series = Some(
                map.entry(model.to_owned())
                    .or_insert_with(|| Arc::new(ModelSeries::new(model)))
                    .clone(),
            );
            map
        });
        series.unwrap_or_else(|| self.unresolved.clone())
    }

    /// Counts an answer's head: `model` is `None` before resolution; `error` is the error
    /// response's label (`None`: a success).
    pub fn answered(
        &self,
        endpoint: usize,
        model: Option<&ModelSeries>,
        status: u16,
        error: Option<ErrorLabel>,
    ) {
        let series = model.unwrap_or(&self.unresolved);
        let class = usize::from((status / 100).clamp(1, 5) - 1);
        let code = error
            .and_then(|e| CODES.iter().position(|c| *c == e.code))
            .unwrap_or(0);
        let i = (endpoint.min(ENDPOINTS.len() - 1) * CLASSES.len() + class) * CODES.len() + code;
        if let Some(c) = series.answers.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let Some(error) = error else { return };
        let kind = match error.code {
            "upstream_unavailable" => Some(0),
            "upstream_timeout" => Some(1),
            "upstream_error" => Some(2),
            "upstream_too_large" => Some(3),
            _ => None,
        };
        if let Some(k) = kind {
            self.upstream[k].fetch_add(1, Ordering::Relaxed);
        }
        if let Some(limit) = error
            .limit
            .and_then(|l| LIMITS.iter().position(|x| *x == l))
        {
            self.refusals[limit].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Observes a finished request from its usage event (the sink sees every one: completed,
    /// aborted, failed, refused).
    pub fn finished(&self, e: &UsageEvent) {
        let s = self.model(&e.base_model);
        if let Some(i) = OUTCOMES.iter().position(|o| *o == e.status) {
            s.finished[i].fetch_add(1, Ordering::Relaxed);
        }
        if e.status == UsageStatus::Rejected {
            return;
        }
        let ms = |v: i32| u64::try_from(v).unwrap_or(0);
        let tok = |v: i64| u64::try_from(v).unwrap_or(0);
        s.duration.observe_ms(ms(e.duration_ms));
        if let Some(ttft) = e.ttft_ms {
            s.ttft.observe_ms(ms(ttft));
            // Time per output token after the first (OpenTelemetry's inter-token latency).
            let after = tok(e.completion_tokens).saturating_sub(1);
            if let Some(micros) =
                (ms(e.duration_ms).saturating_sub(ms(ttft)) * 1000).checked_div(after)
            {
                s.tpot.observe_micros(micros);
            }
            if e.status == UsageStatus::UpstreamError {
                self.upstream[4].fetch_add(1, Ordering::Relaxed);
            }
        }
        s.input_usage
            .observe_micros(tok(e.prompt_tokens).saturating_mul(1_000_000));
        s.output_usage
            .observe_micros(tok(e.completion_tokens).saturating_mul(1_000_000));
        for (i, n) in [
            e.prompt_tokens,
            e.cached_tokens,
            e.completion_tokens,
            e.reasoning_tokens,
        ]
        .into_iter()
        .enumerate()
        {
            s.tokens[i].fetch_add(tok(n), Ordering::Relaxed);
        }
    }

    /// Counts a request held for `graph`'s wake until the guard drops.
    pub fn held(&self, graph: &str) -> Held {
        let gauge = match self.held.lock() {
            Ok(mut map) => map.entry(graph.to_owned()).or_default().clone(),
            Err(_) => Arc::default(),
        };
        gauge.fetch_add(1, Ordering::Relaxed);
        Held(gauge)
    }

    pub fn render(&self, out: &mut String) {
        let mut models: Vec<Arc<ModelSeries>> = self.models.load().values().cloned().collect();
        models.sort_by(|a, b| a.label.cmp(&b.label));
        let with_unresolved: Vec<&ModelSeries> = std::iter::once(&*self.unresolved)
            .chain(models.iter().map(|m| &**m))
            .collect();

        family(out, "tf_http_requests_total", "counter", "Answers of the /v1 routes by endpoint, base model (empty before resolution), status class and error code (none: success).");
        for s in &with_unresolved {
            for (e, endpoint) in ENDPOINTS.iter().enumerate() {
                for (c, class) in CLASSES.iter().enumerate() {
                    for (k, code) in CODES.iter().enumerate() {
                        let i = (e * CLASSES.len() + c) * CODES.len() + k;
                        let n = s.answers[i].load(Ordering::Relaxed);
                        if n > 0 {
                            let _ = writeln!(out, "tf_http_requests_total{{endpoint=\"{endpoint}\",{},status_class=\"{class}\",code=\"{code}\"}} {n}", s.label);
                        }
                    }
                }
            }
        }
        family(out, "tf_requests_finished_total", "counter", "Requests that reached admission, by base model and how they ended (the usage event's status).");
        for s in &models {
            for (i, o) in OUTCOMES.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "tf_requests_finished_total{{{},outcome=\"{}\"}} {}",
                    s.label,
                    o.as_str(),
                    s.finished[i].load(Ordering::Relaxed)
                );
            }
        }
        let hists: [HistogramFamily; 3] = [
            ("gen_ai_server_request_duration_seconds", "Time from arrival to the last byte of the answer, per base model (refusals excluded).", |s| &s.duration),
            ("gen_ai_server_time_to_first_token_seconds", "Time from arrival to the first generated token of a stream, per base model.", |s| &s.ttft),
            ("gen_ai_server_time_per_output_token_seconds", "Inter-token latency: time per output token after the first, per streamed request and base model.", |s| &s.tpot),
        ];
        for (name, help, of) in hists {
            family(out, name, "histogram", help);
            for s in &models {
                of(s).render(out, name, &s.label);
            }
        }
        let name = "gen_ai_client_token_usage";
        family(
            out,
            name,
            "histogram",
            "Tokens per request by type (input: prompt, output: completion) and base model.",
        );
        for s in &models {
            s.input_usage.render(
                out,
                name,
                &format!("{},gen_ai_token_type=\"input\"", s.label),
            );
            s.output_usage.render(
                out,
                name,
                &format!("{},gen_ai_token_type=\"output\"", s.label),
            );
        }
        family(
            out,
            "tf_tokens_total",
            "counter",
            "Tokens metered by kind (prompt, cached: part of prompt, completion, reasoning: part of completion) and base model.",
        );
        for s in &models {
            for (i, kind) in ["prompt", "cached", "completion", "reasoning"]
                .iter()
                .enumerate()
            {
                let _ = writeln!(
                    out,
                    "tf_tokens_total{{{},kind=\"{kind}\"}} {}",
                    s.label,
                    s.tokens[i].load(Ordering::Relaxed)
                );
            }
        }
        family(out, "tf_upstream_errors_total", "counter", "Upstream failures by kind (unreachable, timeout, error_status, too_large, after_first_token).");
        for (i, kind) in UPSTREAM_KINDS.iter().enumerate() {
            let _ = writeln!(
                out,
                "tf_upstream_errors_total{{kind=\"{kind}\"}} {}",
                self.upstream[i].load(Ordering::Relaxed)
            );
        }
        family(
            out,
            "tf_quota_refusals_total",
            "counter",
            "Requests refused with 429 by limit kind.",
        );
        for (i, limit) in LIMITS.iter().enumerate() {
            let _ = writeln!(
                out,
                "tf_quota_refusals_total{{limit=\"{limit}\"}} {}",
                self.refusals[i].load(Ordering::Relaxed)
            );
        }
    }

    /// Requests held for `graph`'s wake now (0 when none ever was).
    pub fn held_now(&self, graph: &str) -> i64 {
        self.held
            .lock()
            .ok()
            .and_then(|m| m.get(graph).map(|n| n.load(Ordering::Relaxed)))
            .unwrap_or(0)
    }
}

/// `# HELP` and `# TYPE` of a family.
pub fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}
