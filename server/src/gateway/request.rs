//! Reading a client's request body and writing the upstream's: validate what we must (JSON
//! object, string `model`), rewrite `model`, force usage reporting, set `cache_salt`; every other
//! field passes through untouched.

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

/// A parsed client request.
#[derive(Debug)]
pub struct ClientRequest {
    pub body: Map<String, Value>,
    pub model: String,
    pub stream: bool,
    pub wants: ClientWants,
}

/// Parses and validates the body. Errors are 400s; nothing has been forwarded.
pub fn parse(bytes: &[u8]) -> Result<ClientRequest, GatewayError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        GatewayError::bad_request(
            format!("We could not parse the JSON body of your request: {e}"),
            None,
        )
    })?;
    let Value::Object(body) = value else {
        return Err(GatewayError::bad_request(
            "The request body must be a JSON object.",
            None,
        ));
    };
    let model = match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(Value::String(_)) | None => {
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
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(GatewayError::bad_request(
                "`stream` must be a boolean",
                Some("stream"),
            ))
        }
    };
    let options = body.get("stream_options");
    let flag = |name: &str| {
        options
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

/// The upstream body for `route`, as `tenant` sends it (consumes the parsed body: no copy).
pub fn upstream_body(
    mut body: Map<String, Value>,
    stream: bool,
    route: &Route,
    tenant: Uuid,
) -> Result<Vec<u8>, GatewayError> {
    body.insert("model".into(), Value::String(route.upstream_model.clone()));
    if stream {
        let mut options = match body.remove("stream_options") {
            Some(Value::Object(o)) => o,
            _ => Map::new(),
        };
        options.insert("include_usage".into(), Value::Bool(true));
        if route.continuous_usage {
            options.insert("continuous_usage_stats".into(), Value::Bool(true));
        }
        body.insert("stream_options".into(), Value::Object(options));
    }
    if route.salt == SaltPolicy::PerTenant {
        // A client's own salt partitions further within its tenant, never across tenants.
        let salt = match body.get("cache_salt").and_then(Value::as_str) {
            Some(own) => format!("{tenant}:{own}"),
            None => tenant.to_string(),
        };
        body.insert("cache_salt".into(), Value::String(salt));
    }
    serde_json::to_vec(&body)
        .map_err(|_| GatewayError::bad_request("The request body could not be re-encoded.", None))
}

/// The prompt length as the base's tokenizer counts it, for billing a request that was cut before
/// the engine reported usage. Takes the client's raw body: it is parsed again only in that rare case.
pub fn estimate_prompt_tokens(endpoint: Endpoint, raw: &[u8]) -> u64 {
    match serde_json::from_slice::<Value>(raw) {
        Ok(Value::Object(body)) => estimate_parsed(endpoint, &body),
        _ => 0,
    }
}

/// [`estimate_prompt_tokens`] over an already parsed body.
pub fn estimate_parsed(endpoint: Endpoint, body: &Map<String, Value>) -> u64 {
    use tf_engine_sim::tokenizer;
    let n = match endpoint {
        Endpoint::Chat => body
            .get("messages")
            .map(tokenizer::chat_prompt_tokens)
            .unwrap_or(0),
        Endpoint::Completions => body
            .get("prompt")
            .map(tokenizer::completion_prompt_tokens)
            .unwrap_or(0),
    };
    u64::from(n)
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
}
