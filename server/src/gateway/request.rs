//! Reading a client's request body and writing the upstream's: validate what we must (JSON
//! object, string `model`), rewrite `model`, force usage reporting, set `cache_salt`; every other
//! field passes through untouched.

use std::collections::BTreeMap;

use serde_json::value::{to_raw_value, RawValue};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::error::GatewayError;
use super::resolve::{Route, SaltPolicy};
use crate::metering::meter::ClientWants;

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

/// A parsed client request: the top-level fields with their values left as the client wrote
/// them (a prompt of 100k tokens is scanned once, never built into a tree and written again).
#[derive(Debug)]
pub struct ClientRequest<'a> {
    pub body: BTreeMap<String, &'a RawValue>,
    pub model: String,
    pub stream: bool,
    pub wants: ClientWants,
}

fn field<'de, T: serde::Deserialize<'de>>(
    body: &BTreeMap<String, &'de RawValue>,
    name: &str,
) -> Option<Result<T, serde_json::Error>> {
    body.get(name).map(|raw| serde_json::from_str(raw.get()))
}

/// Parses and validates the body. Errors are 400s; nothing has been forwarded.
pub fn parse(bytes: &[u8]) -> Result<ClientRequest<'_>, GatewayError> {
    let unparsable = |e: serde_json::Error| {
        GatewayError::bad_request(
            format!("We could not parse the JSON body of your request: {e}"),
            None,
        )
    };
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') {
        // Valid JSON of another kind gets the clearer message; invalid JSON the parser's.
        serde_json::from_slice::<serde::de::IgnoredAny>(bytes).map_err(unparsable)?;
        return Err(GatewayError::bad_request(
            "The request body must be a JSON object.",
            None,
        ));
    }
    let body: BTreeMap<String, &RawValue> = serde_json::from_slice(bytes).map_err(unparsable)?;
    let model = match field::<Value>(&body, "model") {
        Some(Ok(Value::String(m))) if !m.is_empty() => m,
        Some(Ok(Value::String(_))) | None => {
            return Err(GatewayError::bad_request(
                "you must provide a model parameter",
                Some("model"),
            ))
        }
        Some(_) => {
            return Err(GatewayError::bad_request(
                "`model` must be a string",
                Some("model"),
            ))
        }
    };
    let stream = match field::<Option<bool>>(&body, "stream") {
        None => false,
        Some(Ok(b)) => b.unwrap_or(false),
        Some(Err(_)) => {
            return Err(GatewayError::bad_request(
                "`stream` must be a boolean",
                Some("stream"),
            ))
        }
    };
    let options = field::<Value>(&body, "stream_options").and_then(Result::ok);
    let flag = |name: &str| {
        options
            .as_ref()
            .and_then(|o| o.get(name))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    let wants = ClientWants {
        usage: flag("include_usage"),
        continuous: flag("include_usage") && flag("continuous_usage_stats"),
    };
    Ok(ClientRequest {
        body,
        model,
        stream,
        wants,
    })
}

impl ClientRequest<'_> {
    /// `max_completion_tokens` or `max_tokens`, if the request set one.
    pub fn max_tokens(&self) -> Option<u64> {
        ["max_completion_tokens", "max_tokens"]
            .into_iter()
            .find_map(|name| field::<Value>(&self.body, name).and_then(Result::ok))
            .and_then(|v| v.as_u64())
    }

    /// The prompt length as the base's tokenizer counts it (parses only the prompt field).
    pub fn estimate_prompt_tokens(&self, endpoint: Endpoint) -> u64 {
        use tf_engine_sim::tokenizer;
        match endpoint {
            Endpoint::Chat => match field::<Value>(&self.body, "messages") {
                Some(Ok(v)) => u64::from(tokenizer::chat_prompt_tokens(&v)),
                _ => 0,
            },
            // Long prompts are often token ids: counted as scanned, never built into values.
            Endpoint::Completions => self.body.get("prompt").map_or(0, |raw| {
                u64::from(tokenizer::completion_prompt_tokens(raw.get()))
            }),
        }
    }

    /// The upstream body for `route`, as `tenant` sends it: `model` rewritten, usage reporting
    /// forced on streams, `cache_salt` set per the model's policy; every other field's bytes
    /// exactly as the client sent them.
    pub fn upstream_body(
        &self,
        stream: bool,
        route: &Route,
        tenant: Uuid,
    ) -> Result<Vec<u8>, GatewayError> {
        let reencode =
            |_| GatewayError::bad_request("The request body could not be re-encoded.", None);
        let mut replaced: BTreeMap<&str, Box<RawValue>> = BTreeMap::new();
        replaced.insert(
            "model",
            to_raw_value(&route.upstream_model).map_err(reencode)?,
        );
        if stream {
            let mut options = match field::<Value>(&self.body, "stream_options") {
                Some(Ok(Value::Object(o))) => o,
                _ => Map::new(),
            };
            options.insert("include_usage".into(), Value::Bool(true));
            if route.continuous_usage {
                options.insert("continuous_usage_stats".into(), Value::Bool(true));
            }
            replaced.insert("stream_options", to_raw_value(&options).map_err(reencode)?);
        }
        if route.salt == SaltPolicy::PerTenant {
            // A client's own salt partitions further within its tenant, never across tenants.
            let salt = match field::<Value>(&self.body, "cache_salt") {
                Some(Ok(Value::String(own))) => format!("{tenant}:{own}"),
                _ => tenant.to_string(),
            };
            replaced.insert("cache_salt", to_raw_value(&salt).map_err(reencode)?);
        }
        let mut out: BTreeMap<&str, &RawValue> =
            self.body.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        for (k, v) in &replaced {
            out.insert(k, v);
        }
        serde_json::to_vec(&out).map_err(reencode)
    }
}

/// The prompt length as the base's tokenizer counts it, for billing a request that was cut before
/// the engine reported usage. Takes the client's raw body: it is parsed again only in that rare case.
pub fn estimate_prompt_tokens(endpoint: Endpoint, raw: &[u8]) -> u64 {
    parse(raw).map_or(0, |r| r.estimate_prompt_tokens(endpoint))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_cannot_be_forwarded() {
        for (body, param) in [
            (&b"{not json"[..], None),
            (b"[1,2]", None),
            (b"{\"messages\":[]}", Some("model")),
            (b"{\"model\":7}", Some("model")),
            (b"{\"model\":\"\"}", Some("model")),
            (b"{\"model\":\"m\",\"stream\":\"yes\"}", Some("stream")),
        ] {
            match parse(body) {
                Err(GatewayError::BadRequest { param: p, .. }) => assert_eq!(p, param),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn reads_stream_options() {
        let r = parse(br#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#)
            .unwrap();
        assert!(r.stream && r.wants.usage && !r.wants.continuous);
    }

    fn route(salt: SaltPolicy) -> Route {
        let options = crate::gateway::upstream::UpstreamOptions {
            connect_timeout: std::time::Duration::from_secs(1),
            first_byte_timeout: std::time::Duration::from_secs(1),
            chunk_timeout: std::time::Duration::from_secs(1),
            pool_idle_per_host: 1,
        };
        Route {
            served_name: "m".into(),
            owner: None,
            base: "m".into(),
            adapter: None,
            graph: "g".into(),
            upstream: std::sync::Arc::new(
                crate::gateway::upstream::Upstream::new("http://127.0.0.1:9/v1", &options).unwrap(),
            ),
            upstream_model: "engine-m".into(),
            price_key: "m".into(),
            salt,
            continuous_usage: true,
            created: 0,
        }
    }

    #[test]
    fn upstream_body_changes_only_what_it_must() {
        let body = br#"{"model":"m","temperature":0.70,"messages":[{"role":"user","content":"h\u00e9 \"x\""}],"stream":true,"stream_options":{"include_usage":false,"x":1},"cache_salt":"mine","max_tokens":12}"#;
        let r = parse(body).unwrap();
        assert_eq!(r.max_tokens(), Some(12));
        let tenant = Uuid::nil();
        let out = r
            .upstream_body(true, &route(SaltPolicy::PerTenant), tenant)
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        // Untouched fields keep the client's exact bytes (number format, escapes).
        assert!(text.contains(r#""temperature":0.70"#), "{text}");
        assert!(text.contains(r#""content":"h\u00e9 \"x\"""#), "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["model"], "engine-m");
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["stream_options"]["continuous_usage_stats"], true);
        assert_eq!(v["stream_options"]["x"], 1);
        assert_eq!(v["cache_salt"], format!("{tenant}:mine"));
        assert_eq!(v["max_tokens"], 12);
        // A shared-cache model leaves the client's salt alone; a non-stream adds no options.
        let r = parse(br#"{"model":"m","max_completion_tokens":5,"max_tokens":9}"#).unwrap();
        assert_eq!(r.max_tokens(), Some(5));
        let out = r
            .upstream_body(false, &route(SaltPolicy::Shared), tenant)
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"max_completion_tokens":5,"max_tokens":9,"model":"engine-m"}"#
        );
    }

    #[test]
    fn estimates_the_prompt_from_its_field_only() {
        let chat =
            parse(br#"{"model":"m","messages":[{"role":"user","content":"one two three"}]}"#)
                .unwrap();
        let parsed: Value =
            serde_json::from_str(r#"[{"role":"user","content":"one two three"}]"#).unwrap();
        assert_eq!(
            chat.estimate_prompt_tokens(Endpoint::Chat),
            u64::from(tf_engine_sim::tokenizer::chat_prompt_tokens(&parsed))
        );
        assert_eq!(chat.estimate_prompt_tokens(Endpoint::Completions), 0);
    }
}
