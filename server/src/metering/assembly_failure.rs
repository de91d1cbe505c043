//! Why a whole answer could not be assembled from a stream: shared by both assemblers
//! ([`super::assemble`] for chunks, [`super::assemble_typed`] for typed events).

/// Why no answer was assembled (the event is recorded by the metered stream either way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The stream ended in an SSE error event; its `code` (the gateway's own: `upstream_timeout`,
    /// `server_shutdown`, ...) if any.
    Error(Option<String>),
    /// The stream broke off, or held nothing that could be read as an answer.
    Broken,
}
