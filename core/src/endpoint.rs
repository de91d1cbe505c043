//! The `/v1` endpoints that generate (and are metered): one enum for the gateway, the usage event
//! and the stored `usage_events.endpoint` name, so that name is written in exactly one place.

use serde::{Deserialize, Serialize};

/// Which endpoint served a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `/v1/chat/completions`. The default: a journal record written before events named their
    /// endpoint came from chat or completions, which are priced and metered alike.
    #[default]
    Chat,
    /// `/v1/completions`.
    Completions,
    /// `/v1/responses` (OpenAI Responses).
    Responses,
    /// `/v1/embeddings`.
    Embeddings,
    /// `/v1/messages` (Anthropic Messages).
    Messages,
}

impl Endpoint {
    /// Every endpoint, in the order of metrics labels.
    pub const ALL: [Self; 5] = [
        Self::Chat,
        Self::Completions,
        Self::Responses,
        Self::Embeddings,
        Self::Messages,
    ];

    /// The position in [`Self::ALL`] (metrics and per-endpoint tables index by it).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The stored name (as sqlx and serde write it; the `usage_events.endpoint` CHECK lists them).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Completions => "completions",
            Self::Responses => "responses",
            Self::Embeddings => "embeddings",
            Self::Messages => "messages",
        }
    }

    /// The path below an upstream's `/v1` base URL (the same path the gateway serves).
    pub fn path(self) -> &'static str {
        match self {
            Self::Chat => "/chat/completions",
            Self::Completions => "/completions",
            Self::Responses => "/responses",
            Self::Embeddings => "/embeddings",
            Self::Messages => "/messages",
        }
    }

    /// Whether the endpoint generates text (and so needs a chat base, not an embedding one).
    pub fn generates(self) -> bool {
        !matches!(self, Self::Embeddings)
    }
}

/// What a base model does, from its registration: generates text or embeds it. Each endpoint
/// serves one kind ([`Endpoint::serves`]); the stored name is `base_models.kind`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// Generates text: chat, completions, Responses, Messages.
    #[default]
    Chat,
    /// Embeds text: `/v1/embeddings` only.
    Embedding,
}

impl ModelKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Embedding => "embedding",
        }
    }

    /// Parses a stored or configured name.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "chat" => Some(Self::Chat),
            "embedding" => Some(Self::Embedding),
            _ => None,
        }
    }
}

impl Endpoint {
    /// Whether this endpoint can be served by a base of `kind`.
    pub fn serves(self, kind: ModelKind) -> bool {
        self.generates() == (kind == ModelKind::Chat)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_match_the_serde_names() {
        for e in Endpoint::ALL {
            assert_eq!(serde_json::json!(e).as_str(), Some(e.as_str()));
            assert_eq!(Endpoint::ALL[e.index()], e);
        }
        for k in [ModelKind::Chat, ModelKind::Embedding] {
            assert_eq!(ModelKind::parse(k.as_str()), Some(k));
        }
        assert!(Endpoint::Embeddings.serves(ModelKind::Embedding));
        assert!(!Endpoint::Embeddings.serves(ModelKind::Chat));
        assert!(!Endpoint::Responses.serves(ModelKind::Embedding));
    }
}
