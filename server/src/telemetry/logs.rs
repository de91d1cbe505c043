//! Log set-up: human text or JSON lines on stderr. The `/v1` handlers open a `request` span
//! carrying `request_id`; both formats print the span's fields on every line logged inside it,
//! so every line of a request names it. The same subscriber carries the trace exporter when one
//! is configured (`super::traces`).

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use super::traces::Traces;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The filter when `RUST_LOG` is unset.
const DEFAULT_FILTER: &str = "info,sqlx=warn,tower_sessions=warn";

/// Installs the global subscriber on stderr (once, at start-up), with the trace exporter when
/// `otlp_endpoint` is given; the returned handle flushes it at exit.
pub fn init(format: LogFormat, otlp_endpoint: Option<&str>) -> anyhow::Result<Option<Traces>> {
    install(format, std::io::stderr, otlp_endpoint)
}

/// Installs the global subscriber writing to `writer` (a test passes a buffer). A second call
/// leaves the first subscriber in place.
pub fn init_with<W>(format: LogFormat, writer: W)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let _ = install(format, writer, None);
}

/// Installs the global subscriber: log lines to `writer` (filtered by `RUST_LOG`), and, when
/// `otlp_endpoint` is given, this crate's spans to an OTLP collector (filtered on their own, so
/// `RUST_LOG=warn` quiets the logs without losing traces). `None` when traces are off, or when
/// a subscriber was already installed (then this one is dropped and traces stay off).
pub fn install<W>(
    format: LogFormat,
    writer: W,
    otlp_endpoint: Option<&str>,
) -> anyhow::Result<Option<Traces>>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| DEFAULT_FILTER.into());
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    let fmt = match format {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        LogFormat::Json => fmt
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_filter(filter)
            .boxed(),
    };
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = vec![fmt];
    let traces = match otlp_endpoint.filter(|e| !e.is_empty()) {
        Some(endpoint) => {
            let (layer, traces) = super::traces::layer(endpoint)?;
            layers.push(layer.boxed());
            Some(traces)
        }
        None => None,
    };
    if tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .is_err()
    {
        return Ok(None);
    }
    if traces.is_some() {
        super::traces::mark_on();
    }
    Ok(traces)
}

/// A stream polled inside a span: a response body is polled by the server after its handler
/// has returned, and its log lines must still name the request.
pub struct InSpan<S> {
    inner: S,
    span: tracing::Span,
}

impl<S> InSpan<S> {
    /// Wraps `inner` in the span current now.
    pub fn current(inner: S) -> Self {
        Self::new(inner, tracing::Span::current())
    }

    /// Wraps `inner` in `span` (kept open until the stream is dropped).
    pub fn new(inner: S, span: tracing::Span) -> Self {
        Self { inner, span }
    }
}

impl<S: futures::Stream + Unpin> futures::Stream for InSpan<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        let this = &mut *self;
        let _entered = this.span.enter();
        std::pin::Pin::new(&mut this.inner).poll_next(cx)
    }
}
