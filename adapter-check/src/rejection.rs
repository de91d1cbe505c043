//! The one error of adapter validation: a message for the adapter's owner, by kind. Every message
//! names the file it is about (and the field, where one is at fault), so the owner knows what to
//! fix without guessing.

use std::fmt;

/// The PEFT configuration file of an adapter.
pub const CONFIG_FILE: &str = "adapter_config.json";
/// The adapter's weights, safetensors only.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// Why an adapter was refused; shown to its owner as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// One of the two files was not uploaded (the file's name).
    Missing(&'static str),
    /// The weights file is not a valid safetensors file.
    Format(String),
    /// `adapter_config.json` is malformed or asks for something not served.
    Config(String),
    /// The base's own description is unusable (an operator problem, not the tenant's).
    Base(String),
    /// The tensors do not fit the base or the graph.
    Shape(String),
}

/// `file: message`, unless the message already starts with the file's name.
fn named(f: &mut fmt::Formatter<'_>, file: &str, message: &str) -> fmt::Result {
    if message.starts_with(file) {
        f.write_str(message)
    } else {
        write!(f, "{file}: {message}")
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Missing(file) => write!(f, "{file} is missing: upload both files"),
            Rejection::Format(m) => {
                write!(f, "{WEIGHTS_FILE} is not a valid safetensors file: {m}")
            }
            Rejection::Config(m) => named(f, CONFIG_FILE, m),
            Rejection::Base(m) => write!(f, "the base model's config.json: {m}"),
            Rejection::Shape(m) => write!(f, "{WEIGHTS_FILE}: weights do not fit the base: {m}"),
        }
    }
}

impl std::error::Error for Rejection {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_names_its_file() {
        let cases = [
            (Rejection::Missing(CONFIG_FILE), CONFIG_FILE),
            (Rejection::Missing(WEIGHTS_FILE), WEIGHTS_FILE),
            (Rejection::Format("short".into()), WEIGHTS_FILE),
            (
                Rejection::Config("r must be at least 1".into()),
                CONFIG_FILE,
            ),
            (Rejection::Base("zero heads".into()), "config.json"),
            (Rejection::Shape("no LoRA tensors".into()), WEIGHTS_FILE),
        ];
        for (r, file) in cases {
            assert!(r.to_string().contains(file), "{r}");
        }
        // Not twice when the message already names it.
        let r = Rejection::Config(format!("{CONFIG_FILE} is not UTF-8"));
        assert_eq!(r.to_string(), "adapter_config.json is not UTF-8");
    }
}
