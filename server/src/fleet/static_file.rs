//! The `static` backend: engines that already run (a Dynamo frontend, a vLLM server, the
//! simulator), listed in a TOML file. Token Factory routes to and meters them but never starts or
//! stops them. Every listed base is a public bare base. Every row is checked when the file is
//! loaded, so a row the gateway could not route to stops start-up with a message naming the row,
//! instead of failing every route reload later.

use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

use super::BaseRegistration;
use crate::engine_policy::PromptEstimator;

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
    /// `chat` (default) or `embedding`: which endpoints may call the base.
    #[serde(default)]
    kind: Option<String>,
    /// The `nvext` keys tenants may set (default: the gateway's allow-list).
    #[serde(default)]
    nvext_allowed: Option<Vec<String>>,
}

fn yes() -> bool {
    true
}

/// Why an upstream URL cannot be routed to, if it cannot. The gateway's connection pool speaks
/// plain HTTP/1.1 to `host[:port]` and appends the endpoint to the URL's path.
fn upstream_problem(url: &str) -> Option<String> {
    let uri: http::Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => return Some(format!("is not a URL ({e})")),
    };
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Some(
                "uses https://, which is not supported: engines are reached over plain http:// \
                 inside the cluster network"
                    .to_owned(),
            )
        }
        _ => return Some("must start with http://".to_owned()),
    }
    match uri.authority() {
        None => return Some("has no host".to_owned()),
        Some(a) if a.host().is_empty() => return Some("has no host".to_owned()),
        Some(a) if a.as_str().contains('@') => {
            return Some("must not carry credentials".to_owned())
        }
        Some(_) => {}
    }
    if uri.query().is_some() {
        return Some("must not have a query string".to_owned());
    }
    None
}

/// Parses the file's text; the first bad row is an error naming it (position and name).
pub fn parse(text: &str) -> anyhow::Result<Vec<BaseRegistration>> {
    let fleet: StaticFleet = toml::from_str(text)?;
    let mut seen = std::collections::HashMap::new();
    fleet
        .base
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            let row = format!("[[base]] #{} (name {:?})", i + 1, b.name);
            anyhow::ensure!(
                !b.name.trim().is_empty() && b.name.trim() == b.name,
                "{row}: the name must be non-empty, without surrounding spaces"
            );
            if let Some(first) = seen.insert(b.name.clone(), i + 1) {
                anyhow::bail!("{row}: the name is already used by [[base]] #{first}");
            }
            let url = b.upstream.trim_end_matches('/').to_owned();
            if let Some(problem) = upstream_problem(&url) {
                anyhow::bail!("{row}: upstream {url:?} {problem}");
            }
            let prompt_estimator = match b.prompt_estimator.as_deref() {
                None => PromptEstimator::default(),
                Some(name) => PromptEstimator::parse(name).with_context(|| {
                    format!(
                        "{row}: prompt_estimator {name:?} must be \"byte-bound\" or \"sim-words\""
                    )
                })?,
            };
            let kind = match b.kind.as_deref() {
                None => tf_core::endpoint::ModelKind::default(),
                Some(name) => tf_core::endpoint::ModelKind::parse(name).with_context(|| {
                    format!("{row}: kind {name:?} must be \"chat\" or \"embedding\"")
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
                kind,
                nvext_allowed: b.nvext_allowed,
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

    fn error(text: &str) -> String {
        format!("{:#}", parse(text).unwrap_err())
    }

    #[test]
    fn https_and_other_unroutable_rows_are_rejected_at_load_naming_the_row() {
        let ok = "[[base]]\nname='a'\nupstream='http://127.0.0.1:8000/v1'\n";
        let e = error(&format!(
            "{ok}[[base]]\nname='b'\nupstream='https://engine.internal/v1'\n"
        ));
        assert!(e.contains("[[base]] #2") && e.contains("\"b\""), "{e}");
        assert!(e.contains("https://") && e.contains("http://"), "{e}");
        for bad in [
            "http:///v1",
            "http://user:pw@x/v1",
            "http://x/v1?a=b",
            "not a url",
        ] {
            let e = error(&format!("[[base]]\nname='c'\nupstream='{bad}'\n"));
            assert!(e.contains("[[base]] #1 (name \"c\")"), "{bad}: {e}");
        }
        let e = error(&format!("{ok}{ok}"));
        assert!(
            e.contains("#2") && e.contains("already used by [[base]] #1"),
            "{e}"
        );
        assert!(error("[[base]]\nname=''\nupstream='http://x/v1'").contains("#1"));
    }
}
