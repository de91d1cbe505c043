//! The OpenAI endpoints the gateway serves and forwards to.

/// Which OpenAI endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Self::Chat => "/chat/completions",
            Self::Completions => "/completions",
        }
    }
}
