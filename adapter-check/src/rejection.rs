//! The one error of adapter validation: a message for the adapter's owner, by kind.

use std::fmt;

/// Why an adapter was refused; shown to its owner as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// The weights file is not a valid safetensors file.
    Format(String),
    /// `adapter_config.json` is missing, malformed or asks for something not served.
    Config(String),
    /// The base's own description is unusable (an operator problem, not the tenant's).
    Base(String),
    /// The tensors do not fit the base or the graph.
    Shape(String),
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Format(m) => write!(f, "not a valid safetensors file: {m}"),
            Rejection::Config(m) => write!(f, "adapter configuration: {m}"),
            Rejection::Base(m) => write!(f, "base model configuration: {m}"),
            Rejection::Shape(m) => write!(f, "weights do not fit the base: {m}"),
        }
    }
}

impl std::error::Error for Rejection {}
