//! Traces: OpenTelemetry spans made from the request path's `tracing` spans and exported over
//! OTLP/HTTP (protobuf) when an endpoint is configured (`--otlp-endpoint`,
//! `OTEL_EXPORTER_OTLP_ENDPOINT`). Off by default, and then nothing is installed: no layer, no
//! child span (each is [`tracing::Span::none`]), no attribute recorded, no header sent upstream.
//!
//! What a `/v1` request exports: a `request` span (kind server, named `{operation} {model}`,
//! carrying the OpenTelemetry GenAI attributes: `gen_ai.operation.name`, `gen_ai.request.model`,
//! `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, `gen_ai.response.finish_reasons`,
//! and `tf.tenant.id`), with children `auth`, `admission`, `hold` (only for a request held while
//! its model wakes) and `upstream` (kind client, until the engine's stream ends). The engine gets
//! a W3C `traceparent` naming the `upstream` span, so its own spans join the trace. Nothing else
//! is recorded: never a prompt, a body or a key.
//!
//! Spans are batched and exported on the SDK's own thread (a blocking HTTP client there), so a
//! slow or absent collector never holds a request: when the queue is full, spans are dropped.
//! [`Traces::shutdown`] flushes what is queued before the process exits.

use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderMap, HeaderValue};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Set once the trace layer is installed; every per-request use of tracing checks it first.
static ON: AtomicBool = AtomicBool::new(false);

/// Whether traces are exported (the layer is installed).
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Marks the layer installed (after the subscriber holding it became the global one).
pub(crate) fn mark_on() {
    ON.store(true, Ordering::Relaxed);
}

/// The exporter's pipeline; [`Traces::shutdown`] flushes it.
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Exports every span that has ended (a test's way to see them now, not in five seconds).
    /// Blocks: call it off the async runtime (`spawn_blocking`).
    pub fn force_flush(&self) -> anyhow::Result<()> {
        self.provider.force_flush()?;
        Ok(())
    }

    /// Flushes what is queued and stops the exporter's thread. Blocks (up to the exporter's
    /// timeout): call it off the async runtime.
    pub fn shutdown(&self) -> anyhow::Result<()> {
        self.provider.shutdown()?;
        Ok(())
    }
}

/// The OTLP/HTTP traces URL for `endpoint`, read as `OTEL_EXPORTER_OTLP_ENDPOINT` is defined: a
/// collector's base URL (`http://collector:4318`), to which `/v1/traces` is appended.
pub fn traces_url(endpoint: &str) -> String {
    format!("{}/v1/traces", endpoint.trim_end_matches('/'))
}

/// The layer that turns this crate's spans into OpenTelemetry spans exported to `endpoint`, and
/// the handle that flushes them. Only `tokenfactory` spans at INFO and above are exported (not
/// the HTTP client's or the database driver's, and never the exporter's own).
pub fn layer<S>(endpoint: &str) -> anyhow::Result<(impl Layer<S> + Send + Sync, Traces)>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(traces_url(endpoint))
        .build()?;
    let resource = match std::env::var_os("OTEL_SERVICE_NAME") {
        Some(_) => Resource::builder().build(),
        None => Resource::builder()
            .with_service_name("tokenfactory")
            .build(),
    };
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("tokenfactory");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(Targets::new().with_target("tokenfactory", tracing::Level::INFO));
    Ok((layer, Traces { provider }))
}

/// `make()` when traces are on, else a disabled span (nothing allocated, nothing recorded).
pub fn span(make: impl FnOnce() -> Span) -> Span {
    if on() {
        make()
    } else {
        Span::none()
    }
}

/// Makes `span` (not yet entered) a child of the caller's trace named by the W3C `traceparent`
/// (and `tracestate`) in `headers`. The caller decides whether the client may choose its trace.
/// A missing or malformed header leaves `span` the root of a new trace.
pub fn adopt_parent(span: &Span, headers: &HeaderMap) {
    use opentelemetry::propagation::TextMapPropagator;
    if !on() || !headers.contains_key("traceparent") {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// The W3C `traceparent` naming `span`, for the request sent upstream (`None` when traces are
/// off or the span is disabled).
pub fn traceparent(span: &Span) -> Option<HeaderValue> {
    if !on() {
        return None;
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return None;
    }
    HeaderValue::from_str(&format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    ))
    .ok()
}

/// The outcome's GenAI attributes on a request's span: the tokens billed (the engine's count, or
/// the gateway's when the engine gave none: `tf.usage.provenance` says which) and how it ended.
pub fn record_usage(span: &Span, event: &crate::usage::UsageEvent) {
    if span.is_none() {
        return;
    }
    span.set_attribute("gen_ai.usage.input_tokens", event.prompt_tokens);
    span.set_attribute("gen_ai.usage.output_tokens", event.completion_tokens);
    span.set_attribute("gen_ai.usage.cache_read.input_tokens", event.cached_tokens);
    span.set_attribute("tf.usage.provenance", event.provenance.as_str());
    span.set_attribute("tf.usage.status", event.status.as_str());
}

/// `gen_ai.response.finish_reasons` (a string array, as the convention has it).
pub fn record_finish_reasons(span: &Span, reasons: &[String]) {
    if span.is_none() || reasons.is_empty() {
        return;
    }
    let reasons: Vec<opentelemetry::StringValue> =
        reasons.iter().map(|r| r.clone().into()).collect();
    span.set_attribute(
        "gen_ai.response.finish_reasons",
        opentelemetry::Value::Array(reasons.into()),
    );
}

/// Reads trace headers from an `http::HeaderMap` (values that are not visible ASCII are skipped).
struct HeaderExtractor<'a>(&'a HeaderMap);

impl opentelemetry::propagation::Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_a_base_url() {
        assert_eq!(
            traces_url("http://collector:4318"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/"),
            "http://collector:4318/v1/traces"
        );
    }

    #[test]
    fn off_means_no_span_and_no_header() {
        // No layer is installed in unit tests.
        let s = span(|| tracing::info_span!("auth"));
        assert!(s.is_none());
        assert!(traceparent(&s).is_none());
    }
}
