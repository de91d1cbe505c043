//! The `static` backend: engines that already run (a Dynamo frontend, a vLLM server, the
//! simulator), listed in a TOML file. Token Factory routes to and meters them but never starts or
//! stops them. Every listed base is a public bare base.

use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

use super::BaseRegistration;
use crate::gateway::engine_policy::PromptEstimator;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StaticFleet {
    #[serde(default)]
    base: Vec<StaticBase>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StaticBase {
    /// Public served name.
    name: String,
    /// OpenAI-compatible base URL, e.g. `http://127.0.0.1:8180/v1`.
    upstream: String,
    /// Name the upstream knows the model by (defaults to `name`).
    upstream_model: Option<String>,
    /// Graph label for operators (defaults to `name`).
    graph: Option<String>,
    /// Whether the upstream accepts `continuous_usage_stats` (vLLM and Dynamo do).
    #[serde(default = "yes")]
    continuous_usage: bool,
    /// Engine-control fields stripped from client bodies (default: the gateway's deny-list).
    denied_fields: Option<Vec<String>>,
    /// `byte-bound` (default, any real engine) or `sim-words` (the engine simulator).
    prompt_estimator: Option<String>,
}

fn yes() -> bool {
    true
}

/// Parses the file's text.
pub fn parse(text: &str) -> anyhow::Result<Vec<BaseRegistration>> {
    let fleet: StaticFleet = toml::from_str(text)?;
    fleet
        .base
        .into_iter()
        .map(|b| {
            let url = b.upstream.trim_end_matches('/').to_owned();
            anyhow::ensure!(
                url.starts_with("http://") || url.starts_with("https://"),
                "base {}: upstream {url:?} must be an http(s) URL",
                b.name
            );
            let prompt_estimator = match b.prompt_estimator.as_deref() {
                None => PromptEstimator::default(),
                Some(name) => PromptEstimator::parse(name).with_context(|| {
                    format!(
                        "base {}: prompt_estimator {name:?} must be \"byte-bound\" or \"sim-words\"",
                        b.name
                    )
                })?,
            };
            Ok(BaseRegistration {
                graph: b.graph.unwrap_or_else(|| b.name.clone()),
                upstream_model: b.upstream_model.unwrap_or_else(|| b.name.clone()),
                name: b.name,
                upstream_url: url,
                continuous_usage: b.continuous_usage,
                denied_fields: b.denied_fields,
                prompt_estimator,
            })
        })
        .collect()
}

/// Reads and parses the fleet file.
pub fn load(path: &Path) -> anyhow::Result<Vec<BaseRegistration>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading fleet file {}", path.display()))?;
    parse(&text).with_context(|| format!("in fleet file {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn parses_the_documented_example() {
        let bases = parse(
            r#"
[[base]]
name = "tiny-llama"                       # public served name
upstream = "http://127.0.0.1:8180/v1/"    # OpenAI-compatible base URL
upstream_model = "tiny-llama"
"#,
        )
        .unwrap();
        assert_eq!(bases.len(), 1);
        assert_eq!(bases[0].upstream_url, "http://127.0.0.1:8180/v1");
        assert_eq!(bases[0].graph, "tiny-llama");
        assert!(bases[0].continuous_usage);
    }

    #[test]
    fn rejects_unknown_fields_and_bad_urls() {
        assert!(parse("[[base]]\nname='a'\nupstream='http://x/v1'\nbogus=1").is_err());
        assert!(parse("[[base]]\nname='a'\nupstream='ftp://x'").is_err());
    }
}
