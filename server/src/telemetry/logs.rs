//! Log set-up: human text or JSON lines on stderr. The `/v1` handlers open a `request` span
//! carrying `request_id`; both formats print the span's fields on every line logged inside it,
//! so every line of a request names it.

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The filter when `RUST_LOG` is unset.
const DEFAULT_FILTER: &str = "info,sqlx=warn,tower_sessions=warn";

/// Installs the global subscriber on stderr (once, at start-up).
pub fn init(format: LogFormat) {
    init_with(format, std::io::stderr);
}

/// Installs the global subscriber writing to `writer` (a test passes a buffer). A second call
/// leaves the first subscriber in place.
pub fn init_with<W>(format: LogFormat, writer: W)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| DEFAULT_FILTER.into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
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
        Self {
            inner,
            span: tracing::Span::current(),
        }
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
