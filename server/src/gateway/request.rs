//! Reading a client's request body and writing the upstream's: validate what we must (JSON
//! object, string `model`, `stream_options`), rewrite `model`, force usage reporting, set
//! `cache_salt`, strip the base's denied engine-control fields; every other field passes through
//! untouched.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::value::RawValue;
use serde_json::Value;
use uuid::Uuid;

use super::error::GatewayError;
use super::resolve::{Route, SaltPolicy};
use crate::base_tokenizer::BaseTokenizer;
use crate::endpoint::Endpoint;
use crate::engine_policy::{EnginePolicy, PromptEstimator};
use crate::metering::meter::ClientWants;

/// Tokens a chat template or BOS adds beyond the prompt's own bytes (Llama 3.1's adds a dated
/// system preamble of about 25).
const TEMPLATE_TOKENS: u64 = 64;

/// The most sequences a request may ask for (`n`, `best_of`), as OpenAI bounds `n`.
const MAX_SEQUENCES: u64 = 128;
/// The largest completion limit accepted (engines read it as a 32-bit integer).
const MAX_COMPLETION_LIMIT: u64 = i32::MAX as u64;

/// A parsed client request: the top-level fields with their values left as the client wrote
/// them (a prompt of 100k tokens is scanned once, never built into a tree and written again).
#[derive(Debug)]
pub struct ClientRequest<'a> {
    pub body: BTreeMap<String, &'a RawValue>,
    /// The body's length in bytes (the rewritten body is about as long).
    pub body_len: usize,
    pub model: String,
    pub stream: bool,
    pub wants: ClientWants,
    /// The generation bounds, as the integers the engine will read.
    pub bounds: Bounds,
}

/// The fields that bound what the engine generates, read once as the engine reads them: JSON
/// integers only. A float (`100000.0`, `1e5`) or a string (`"100000"`) is refused, never read as
/// "unset": an engine that accepts it would generate up to it while admission reserved for the
/// default (issue 31).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bounds {
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub n: Option<u64>,
    pub best_of: Option<u64>,
    /// Responses' completion limit.
    pub max_output_tokens: Option<u64>,
}

impl Bounds {
    fn read(body: &BTreeMap<String, &RawValue>) -> Result<Self, GatewayError> {
        Ok(Self {
            max_tokens: integer(body, "max_tokens", 1, MAX_COMPLETION_LIMIT)?,
            max_completion_tokens: integer(body, "max_completion_tokens", 1, MAX_COMPLETION_LIMIT)?,
            n: integer(body, "n", 1, MAX_SEQUENCES)?,
            best_of: integer(body, "best_of", 1, MAX_SEQUENCES)?,
            max_output_tokens: integer(body, "max_output_tokens", 1, MAX_COMPLETION_LIMIT)?,
        })
    }
}

/// An optional integer field in `min..=max`, worded as OpenAI words its refusals; `null` is unset.
fn integer(
    body: &BTreeMap<String, &RawValue>,
    name: &'static str,
    min: u64,
    max: u64,
) -> Result<Option<u64>, GatewayError> {
    let value = match field::<Value>(body, name) {
        None | Some(Ok(Value::Null)) => return Ok(None),
        Some(Ok(v)) => v,
        Some(Err(_)) => {
            return Err(GatewayError::bad_request(
                format!("Invalid type for '{name}': expected an integer."),
                Some(name),
            ))
        }
    };
    let got = match &value {
        Value::Number(n) if n.is_u64() || n.is_i64() => None,
        Value::Number(_) => Some("a decimal number"),
        Value::String(_) => Some("a string"),
        Value::Bool(_) => Some("a boolean"),
        Value::Array(_) => Some("an array"),
        Value::Object(_) => Some("an object"),
        Value::Null => None,
    };
    if let Some(got) = got {
        return Err(GatewayError::bad_request(
            format!("Invalid type for '{name}': expected an integer, but got {got} instead."),
            Some(name),
        ));
    }
    match (value.as_u64(), value.as_i64()) {
        (Some(v), _) if (min..=max).contains(&v) => Ok(Some(v)),
        (Some(v), _) if v > max => Err(GatewayError::bad_request(
            format!(
                "Invalid '{name}': integer above maximum value. Expected a value <= {max}, but got {v} instead."
            ),
            Some(name),
        )),
        (_, v) => Err(GatewayError::bad_request(
            format!(
                "Invalid '{name}': integer below minimum value. Expected a value >= {min}, but got {} instead.",
                v.map_or_else(|| value.to_string(), |v| v.to_string())
            ),
            Some(name),
        )),
    }
}

fn field<'de, T: serde::Deserialize<'de>>(
    body: &BTreeMap<String, &'de RawValue>,
    name: &str,
) -> Option<Result<T, serde_json::Error>> {
    body.get(name).map(|raw| serde_json::from_str(raw.get()))
}

/// What the client asked of the stream, validated as OpenAI does: `stream_options` only with
/// `stream: true`, an object whose flags are booleans.
fn stream_options(
    body: &BTreeMap<String, &RawValue>,
    stream: bool,
) -> Result<ClientWants, GatewayError> {
    let options = match field::<Value>(body, "stream_options") {
        None | Some(Ok(Value::Null)) => return Ok(ClientWants::default()),
        Some(Ok(Value::Object(o))) => o,
        Some(_) => {
            return Err(GatewayError::bad_request(
                "Invalid type for 'stream_options': expected an object.",
                Some("stream_options"),
            ))
        }
    };
    if !stream {
        return Err(GatewayError::bad_request(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            Some("stream_options"),
        ));
    }
    let flag = |name: &str, param: &'static str| match options.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(GatewayError::bad_request(
            format!("Invalid type for '{param}': expected a boolean."),
            Some(param),
        )),
    };
    let usage = flag("include_usage", "stream_options.include_usage")?;
    let continuous = flag(
        "continuous_usage_stats",
        "stream_options.continuous_usage_stats",
    )?;
    Ok(ClientWants {
        usage,
        continuous: usage && continuous,
    })
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
    let wants = stream_options(&body, stream)?;
    let bounds = Bounds::read(&body)?;
    Ok(ClientRequest {
        body,
        body_len: bytes.len(),
        model,
        stream,
        wants,
        bounds,
    })
}

impl ClientRequest<'_> {
    /// The completion limit the engine applies, if the request set one: chat reads
    /// `max_completion_tokens`, then `max_tokens`; completions reads `max_tokens` only (as vLLM
    /// and the simulator do). Without one, [`Self::upstream_body`] sends the default explicitly.
    pub fn max_tokens(&self, endpoint: Endpoint) -> Option<u64> {
        match endpoint {
            Endpoint::Chat => self.bounds.max_completion_tokens.or(self.bounds.max_tokens),
            Endpoint::Completions | Endpoint::Messages => self.bounds.max_tokens,
            Endpoint::Responses => self.bounds.max_output_tokens,
            // Nothing is generated: no completion to bound.
            Endpoint::Embeddings => None,
        }
    }

    /// The field that carries the completion limit to the engine (`None`: the endpoint
    /// generates nothing).
    fn limit_field(endpoint: Endpoint) -> Option<&'static str> {
        match endpoint {
            Endpoint::Chat | Endpoint::Completions | Endpoint::Messages => Some("max_tokens"),
            Endpoint::Responses => Some("max_output_tokens"),
            Endpoint::Embeddings => None,
        }
    }

    /// The prompt as chat messages, for the endpoints whose prompt is a conversation (chat
    /// itself, Responses' `instructions` + `input`, Anthropic's `system` + `messages`), in the
    /// shape the simulator renders and counts (`tf_engine_sim::tokenizer::as_chat`).
    fn conversation(&self, endpoint: Endpoint) -> Option<Value> {
        use tf_engine_sim::tokenizer::as_chat;
        let get = |name: &str| match field::<Value>(&self.body, name) {
            Some(Ok(v)) => Some(v),
            _ => None,
        };
        match endpoint {
            Endpoint::Chat => get("messages"),
            Endpoint::Responses => Some(as_chat::responses(
                get("instructions").as_ref(),
                get("input").as_ref(),
            )),
            Endpoint::Messages => Some(as_chat::anthropic(
                get("system").as_ref(),
                get("messages").as_ref(),
            )),
            Endpoint::Completions | Endpoint::Embeddings => None,
        }
    }

    /// The field holding a completion-shaped prompt (a string, strings, token ids or arrays of
    /// them): `prompt` of completions, `input` of embeddings.
    fn prompt_field(endpoint: Endpoint) -> Option<&'static str> {
        match endpoint {
            Endpoint::Completions => Some("prompt"),
            Endpoint::Embeddings => Some("input"),
            Endpoint::Chat | Endpoint::Responses | Endpoint::Messages => None,
        }
    }

    /// Refuses what would make the engine keep or read state across requests: Responses'
    /// `store: true`, `previous_response_id`, `conversation` and `background: true` name
    /// responses the engine keeps and serves by id to whoever asks, which the gateway cannot
    /// scope to a tenant (a second tenant with the id could read the first one's
    /// conversation). Refused, not scoped: the engine's store is shared by every tenant on the
    /// graph. [`Self::upstream_body`] sends `store: false` so nothing is kept either.
    pub fn refuse_engine_state(&self, endpoint: Endpoint) -> Result<(), GatewayError> {
        if endpoint != Endpoint::Responses {
            return Ok(());
        }
        let set = |name: &str| match field::<Value>(&self.body, name) {
            None | Some(Ok(Value::Null | Value::Bool(false))) => false,
            Some(_) => true,
        };
        for (name, what) in [
            ("store", "Stored responses are not supported: send 'store': false or omit it."),
            (
                "previous_response_id",
                "'previous_response_id' is not supported: responses are not stored; send the conversation in 'input'.",
            ),
            (
                "conversation",
                "'conversation' is not supported: responses are not stored; send the conversation in 'input'.",
            ),
            ("background", "Background responses are not supported: 'background' must be false."),
        ] {
            if set(name) {
                return Err(GatewayError::bad_request(what, Some(name)));
            }
        }
        Ok(())
    }

    /// How many sequences the engine generates: `n` choices, or `best_of` candidates when
    /// larger (each is produced, and costs GPU time, even if not returned).
    pub fn sequences(&self) -> u64 {
        self.bounds
            .n
            .into_iter()
            .chain(self.bounds.best_of)
            .max()
            .unwrap_or(1)
    }

    /// The prompt's tokens for admission: counted by the base's tokenizer when it has one,
    /// else the fallback estimator's bound, erring high (see [`PromptEstimator`]). Reads only
    /// the prompt fields.
    pub fn admission_prompt_tokens(&self, endpoint: Endpoint, policy: &EnginePolicy) -> u64 {
        let counted = if let Some(tokenizer) = &policy.tokenizer {
            self.tokenizer_prompt_tokens(endpoint, tokenizer)
        } else {
            match policy.estimator {
                PromptEstimator::SimWords => self.word_prompt_tokens(endpoint),
                PromptEstimator::ByteBound => self.byte_bound_prompt_tokens(endpoint),
            }
        };
        // INVARIANT: token ids handed to the engine in `nvext.token_data` (used instead of the
        // prompt) are counted, exactly (test:
        // request::tests::nvext_token_data_is_counted_by_admission).
        counted.max(self.token_data_tokens(policy).unwrap_or(0))
    }

    /// The length of `nvext.token_data` when the base forwards it (Dynamo then uses those ids
    /// as the prompt); scanned, never built into values.
    fn token_data_tokens(&self, policy: &EnginePolicy) -> Option<u64> {
        #[derive(serde::Deserialize)]
        struct Probe<'a> {
            #[serde(borrow, default)]
            token_data: Option<&'a RawValue>,
        }
        if !policy.nvext_allowed.iter().any(|k| k == "token_data") {
            return None;
        }
        let nvext = self.body.get("nvext")?;
        let probe: Probe<'_> = serde_json::from_str(nvext.get()).ok()?;
        probe.token_data.map(|ids| {
            u64::from(tf_engine_sim::tokenizer::completion_prompt_tokens(
                ids.get(),
            ))
        })
    }

    /// The prompt's tokens by the base's own tokenizer (see [`BaseTokenizer`]); token-id
    /// prompts are counted as scanned, never built into values.
    fn tokenizer_prompt_tokens(&self, endpoint: Endpoint, tokenizer: &BaseTokenizer) -> u64 {
        if let Some(name) = Self::prompt_field(endpoint) {
            return match self.body.get(name) {
                Some(raw) if memchr::memchr(b'"', raw.get().as_bytes()).is_none() => u64::from(
                    tf_engine_sim::tokenizer::completion_prompt_tokens(raw.get()),
                ),
                Some(raw) => serde_json::from_str::<Value>(raw.get())
                    .map_or(0, |v| tokenizer.completion_prompt_tokens(&v)),
                None => 0,
            };
        }
        self.conversation(endpoint)
            .map_or(0, |m| tokenizer.chat_prompt_tokens(&m))
    }

    /// At most one token per byte of the prompt's JSON text (escapes and the keys around each
    /// message only add bytes), plus the template's fixed part; token-id prompts exactly.
    fn byte_bound_prompt_tokens(&self, endpoint: Endpoint) -> u64 {
        let len = |name: &str| self.body.get(name).map_or(0, |raw| raw.get().len() as u64);
        if let Some(name) = Self::prompt_field(endpoint) {
            return match self.body.get(name) {
                // Only numbers and arrays: token ids, counted exactly.
                Some(raw) if memchr::memchr(b'"', raw.get().as_bytes()).is_none() => u64::from(
                    tf_engine_sim::tokenizer::completion_prompt_tokens(raw.get()),
                ),
                Some(raw) => TEMPLATE_TOKENS + raw.get().len() as u64,
                None => 0,
            };
        }
        let conversation = match endpoint {
            Endpoint::Responses => len("instructions") + len("input"),
            Endpoint::Messages => len("system") + len("messages"),
            _ => len("messages") + len("functions"),
        };
        TEMPLATE_TOKENS + conversation + len("tools")
    }

    /// The prompt's words (the simulator's exact count; for a real engine a count no BPE
    /// tokenizer goes below, so billing a cut request by it never charges more than produced).
    fn word_prompt_tokens(&self, endpoint: Endpoint) -> u64 {
        use tf_engine_sim::tokenizer;
        if let Some(name) = Self::prompt_field(endpoint) {
            // Long prompts are often token ids: counted as scanned, never built into values.
            return self.body.get(name).map_or(0, |raw| {
                u64::from(tokenizer::completion_prompt_tokens(raw.get()))
            });
        }
        self.conversation(endpoint)
            .map_or(0, |m| u64::from(tokenizer::chat_prompt_tokens(&m)))
    }

    /// The upstream body for `route`, as `tenant` sends it: `model` rewritten, a stream with usage
    /// forced when `stream` (the gateway always passes true), `cache_salt` set per the model's policy, `max_tokens` set to
    /// `default_cap` when the request set no limit the engine reads (so the engine stops where
    /// admission's reservation assumed); every other field's bytes exactly as the client sent them.
    pub fn upstream_body(
        &self,
        endpoint: Endpoint,
        stream: bool,
        route: &Route,
        tenant: Uuid,
        default_cap: u64,
    ) -> Result<Vec<u8>, GatewayError> {
        // Our members as JSON text; the common ones are constants, not built per request.
        let mut replaced: BTreeMap<&str, Cow<'static, str>> = BTreeMap::new();
        replaced.insert("model", json(&route.upstream_model)?);
        if let (None, Some(limit)) = (self.max_tokens(endpoint), Self::limit_field(endpoint)) {
            // INVARIANT: the engine's limit is the one admission reserved for (test:
            // quota_bounds::omitted_max_tokens_is_capped_upstream).
            replaced.insert(limit, Cow::Owned(default_cap.to_string()));
        }
        if stream && endpoint.generates() {
            // The client may have asked for one JSON answer: the engine streams regardless.
            replaced.insert("stream", Cow::Borrowed("true"));
        }
        if endpoint == Endpoint::Responses {
            // INVARIANT: the engine keeps no response another tenant could fetch by id (test:
            // typed_endpoints::responses_refuse_engine_state_for_every_tenant).
            replaced.insert("store", Cow::Borrowed("false"));
        }
        // Responses and Messages report usage in their stream's final events unasked.
        if stream && matches!(endpoint, Endpoint::Chat | Endpoint::Completions) {
            let options = match field::<Value>(&self.body, "stream_options") {
                Some(Ok(Value::Object(mut o))) => {
                    o.insert("include_usage".into(), Value::Bool(true));
                    if route.continuous_usage {
                        o.insert("continuous_usage_stats".into(), Value::Bool(true));
                    }
                    json(&o)?
                }
                _ if route.continuous_usage => {
                    Cow::Borrowed(r#"{"continuous_usage_stats":true,"include_usage":true}"#)
                }
                _ => Cow::Borrowed(r#"{"include_usage":true}"#),
            };
            replaced.insert("stream_options", options);
        }
        // INVARIANT: only the base's allowed `nvext` keys reach the engine (worker pins and
        // agent hints are stripped by default; test:
        // request::tests::nvext_keeps_only_allowed_keys_and_the_gateways_salt).
        let mut nvext = match field::<Value>(&self.body, "nvext") {
            Some(Ok(Value::Object(mut o))) => {
                o.retain(|k, _| k == "cache_salt" || route.policy.nvext_allowed.contains(k));
                Some(o)
            }
            _ => None,
        };
        if route.salt == SaltPolicy::PerTenant {
            // A client's own salt partitions further within its tenant, never across tenants.
            // Dynamo frontends read `nvext.cache_salt` before the top-level field, so the same
            // salt is written to both places (the client's `nvext` one, if any, taken first).
            let own = nvext
                .as_ref()
                .and_then(|n| n.get("cache_salt"))
                .and_then(Value::as_str)
                .map(str::to_owned)
                .or_else(|| match field::<Value>(&self.body, "cache_salt") {
                    Some(Ok(Value::String(own))) => Some(own),
                    _ => None,
                });
            let salt = match own {
                Some(own) => format!("{tenant}:{own}"),
                None => tenant.to_string(),
            };
            if let Some(n) = &mut nvext {
                n.insert("cache_salt".into(), Value::String(salt.clone()));
            }
            replaced.insert("cache_salt", json(&salt)?);
        }
        if let Some(n) = nvext {
            replaced.insert("nvext", json(&n)?);
        }
        // The client's members (not `nvext`: not an object is nothing an engine could read
        // safely, an object was rebuilt above) and ours, merged in key order and written as they
        // are: no second map, no serializer over raw values.
        let mut client = self
            .body
            .iter()
            .map(|(k, v)| (k.as_str(), v.get()))
            .filter(|(k, _)| {
                *k != "nvext"
                    && !replaced.contains_key(k)
                    && !route.policy.denied_fields.iter().any(|d| d == k)
            })
            .peekable();
        let mut ours = replaced.iter().map(|(k, v)| (*k, v.as_ref())).peekable();
        let mut out = Vec::with_capacity(self.body_len + 256);
        out.push(b'{');
        loop {
            let next = match (client.peek(), ours.peek()) {
                (Some(c), Some(o)) if c.0 < o.0 => client.next(),
                (_, Some(_)) => ours.next(),
                (Some(_), None) => client.next(),
                (None, None) => break,
            };
            let Some((key, value)) = next else { break };
            if out.len() > 1 {
                out.push(b',');
            }
            serde_json::to_writer(&mut out, key).map_err(|_| unencodable())?;
            out.push(b':');
            out.extend_from_slice(value.as_bytes());
        }
        out.push(b'}');
        Ok(out)
    }
}

/// A member's value as JSON text.
fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Cow<'static, str>, GatewayError> {
    serde_json::to_string(value)
        .map(Cow::Owned)
        .map_err(|_| unencodable())
}

/// The rewritten body could not be written as JSON.
fn unencodable() -> GatewayError {
    GatewayError::bad_request("The request body could not be re-encoded.", None)
}

/// The prompt's tokens for billing a request that was cut before the engine reported usage: by
/// the base's tokenizer when it has one, else its words (see
/// [`ClientRequest::word_prompt_tokens`]). Takes the client's raw body: it is parsed again only in
/// that rare case.
pub fn estimate_prompt_tokens(
    endpoint: Endpoint,
    raw: &[u8],
    tokenizer: Option<&BaseTokenizer>,
) -> u64 {
    parse(raw).map_or(0, |r| match tokenizer {
        Some(t) => r.tokenizer_prompt_tokens(endpoint, t),
        None => r.word_prompt_tokens(endpoint),
    })
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
            (
                b"{\"model\":\"m\",\"stream_options\":{\"include_usage\":true}}",
                Some("stream_options"),
            ),
            (
                b"{\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
                Some("stream_options.include_usage"),
            ),
        ] {
            match parse(body) {
                Err(GatewayError::BadRequest { param: p, .. }) => assert_eq!(p, param),
                other => panic!("{other:?}"),
            }
        }
    }

    /// Issue 31: a limit the engine would read as a number but admission could not (a float, a
    /// string, `1e5`) is refused naming the field; `null` is unset; integers are range-checked.
    #[test]
    fn generation_bounds_are_integers_or_refused() {
        for (body, param, says) in [
            (r#""max_tokens":100000.0"#, "max_tokens", "decimal number"),
            (r#""max_tokens":1e5"#, "max_tokens", "decimal number"),
            (r#""max_tokens":"100000""#, "max_tokens", "string"),
            (
                r#""max_completion_tokens":2.5"#,
                "max_completion_tokens",
                "decimal",
            ),
            (r#""max_tokens":0"#, "max_tokens", ">= 1"),
            (r#""max_tokens":-3"#, "max_tokens", "got -3"),
            (r#""max_tokens":3000000000"#, "max_tokens", "<= 2147483647"),
            (r#""n":"10""#, "n", "string"),
            (r#""n":0"#, "n", ">= 1"),
            (r#""n":129"#, "n", "<= 128"),
            (r#""best_of":true"#, "best_of", "boolean"),
            (r#""best_of":[2]"#, "best_of", "array"),
        ] {
            let raw = format!(r#"{{"model":"m",{body}}}"#);
            match parse(raw.as_bytes()) {
                Err(GatewayError::BadRequest { param: p, message }) => {
                    assert_eq!(p, Some(param), "{raw}");
                    assert!(message.contains(says), "{raw}: {message}");
                }
                other => panic!("{raw}: {other:?}"),
            }
        }
        let r = parse(br#"{"model":"m","max_tokens":null,"n":null,"best_of":3}"#).unwrap();
        assert_eq!(r.max_tokens(Endpoint::Chat), None);
        assert_eq!(r.sequences(), 3);
        // Completions reads `max_tokens` only, as the engine does.
        let r = parse(br#"{"model":"m","max_completion_tokens":7}"#).unwrap();
        assert_eq!(r.max_tokens(Endpoint::Chat), Some(7));
        assert_eq!(r.max_tokens(Endpoint::Completions), None);
        let out = r
            .upstream_body(
                Endpoint::Completions,
                false,
                &route(SaltPolicy::Shared),
                Uuid::nil(),
                40,
            )
            .unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["max_tokens"], 40);
    }

    /// The rewritten body is the client's members and the gateway's merged in key order, each
    /// written once: a replaced member never appears twice, denied ones and a non-object
    /// `nvext` not at all, and a key that needs escaping stays valid JSON.
    #[test]
    fn the_rewrite_merges_members_in_key_order() {
        let r = parse(
            br#"{"zz":1,"model":"m","a\"b":[1, 2],"nvext":"x","sim":{},"stream":false,"max_tokens":3}"#,
        )
        .unwrap();
        let out = r
            .upstream_body(
                Endpoint::Chat,
                true,
                &route(SaltPolicy::Shared),
                Uuid::nil(),
                9,
            )
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a\"b":[1, 2],"max_tokens":3,"model":"engine-m","stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true},"zz":1}"#
        );
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
            own_price_key: None,
            salt,
            continuous_usage: true,
            policy: crate::engine_policy::EnginePolicy::default(),
            kind: tf_core::endpoint::ModelKind::Chat,
            created: 0,
            starting: false,
            asleep: false,
            wake_failures: 0,
            activity: std::sync::Arc::default(),
            adapter_activity: None,
        }
    }

    #[test]
    fn upstream_body_changes_only_what_it_must() {
        let body = br#"{"model":"m","temperature":0.70,"messages":[{"role":"user","content":"h\u00e9 \"x\""}],"stream":true,"stream_options":{"include_usage":false,"x":1},"cache_salt":"mine","max_tokens":12}"#;
        let r = parse(body).unwrap();
        assert_eq!(r.max_tokens(Endpoint::Chat), Some(12));
        let tenant = Uuid::nil();
        let out = r
            .upstream_body(
                Endpoint::Chat,
                true,
                &route(SaltPolicy::PerTenant),
                tenant,
                99,
            )
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
        // Without the client's own options ours are written as they always read.
        let r = parse(br#"{"model":"m","max_tokens":1}"#).unwrap();
        let out = r
            .upstream_body(Endpoint::Chat, true, &route(SaltPolicy::Shared), tenant, 99)
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"max_tokens":1,"model":"engine-m","stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true}}"#
        );
        // A shared-cache model leaves the client's salt alone; a non-stream adds no options.
        let r = parse(br#"{"model":"m","max_completion_tokens":5,"max_tokens":9}"#).unwrap();
        assert_eq!(r.max_tokens(Endpoint::Chat), Some(5));
        let out = r
            .upstream_body(
                Endpoint::Chat,
                false,
                &route(SaltPolicy::Shared),
                tenant,
                99,
            )
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"max_completion_tokens":5,"max_tokens":9,"model":"engine-m"}"#
        );
    }

    #[test]
    fn denied_fields_are_stripped_and_nvext_salt_overwritten() {
        let body = br#"{"model":"m","priority":-9,"vllm_xargs":{"a":1},"sim":{"completion_tokens":400},"kv_transfer_params":{},"nvext":{"cache_salt":"other-tenant","top_k":2},"temperature":1}"#;
        let r = parse(body).unwrap();
        let tenant = Uuid::from_u128(7);
        let out = r
            .upstream_body(
                Endpoint::Chat,
                false,
                &route(SaltPolicy::PerTenant),
                tenant,
                99,
            )
            .unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["max_tokens"], 99, "no limit: the default is sent");
        for denied in ["priority", "vllm_xargs", "sim", "kv_transfer_params"] {
            assert!(v.get(denied).is_none(), "{denied} forwarded: {v}");
        }
        assert_eq!(v["temperature"], 1);
        let salt = format!("{tenant}:other-tenant");
        assert_eq!(v["nvext"]["cache_salt"], salt.as_str(), "{v}");
        assert_eq!(v["nvext"]["top_k"], 2);
        assert_eq!(v["cache_salt"], salt.as_str());
    }

    /// Issue 32: worker pins and agent hints inside `nvext` are stripped unless the base
    /// allows them; the salt is the gateway's; a non-object `nvext` is dropped.
    #[test]
    fn nvext_keeps_only_allowed_keys_and_the_gateways_salt() {
        let body = br#"{"model":"m","nvext":{"backend_instance_id":7,"prefill_worker_id":1,"decode_worker_id":2,"agent_hints":{"priority":99},"cache_salt":"x","top_k":3,"token_data":[1,2]}}"#;
        let r = parse(body).unwrap();
        let tenant = Uuid::from_u128(9);
        let send = |route: &Route| -> Value {
            serde_json::from_slice(
                &r.upstream_body(Endpoint::Chat, true, route, tenant, 5)
                    .unwrap(),
            )
            .unwrap()
        };
        let v = send(&route(SaltPolicy::PerTenant));
        let nvext = v["nvext"].as_object().unwrap();
        let mut keys: Vec<&str> = nvext.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["cache_salt", "token_data", "top_k"], "{v}");
        assert_eq!(nvext["cache_salt"], format!("{tenant}:x"));
        // A base that trusts its tenants with pins lists them.
        let mut trusted = route(SaltPolicy::PerTenant);
        trusted.policy = trusted
            .policy
            .with_nvext_allowed(Some(vec!["agent_hints".into(), "decode_worker_id".into()]));
        let v = send(&trusted);
        assert_eq!(v["nvext"]["agent_hints"]["priority"], 99);
        assert_eq!(v["nvext"]["decode_worker_id"], 2);
        assert!(v["nvext"].get("backend_instance_id").is_none());
        assert!(v["nvext"].get("top_k").is_none());
        let r = parse(br#"{"model":"m","nvext":"pin-me"}"#).unwrap();
        let v: Value = serde_json::from_slice(
            &r.upstream_body(Endpoint::Chat, true, &route(SaltPolicy::Shared), tenant, 5)
                .unwrap(),
        )
        .unwrap();
        assert!(v.get("nvext").is_none(), "{v}");
    }

    /// Issue 32: 50,000 token ids in `nvext.token_data` are counted, not the two words beside.
    #[test]
    fn nvext_token_data_is_counted_by_admission() {
        let ids: Vec<u32> = (0..50_000).collect();
        let body = serde_json::to_vec(&serde_json::json!({
            "model": "m",
            "messages": [{"role": "user", "content": "two words"}],
            "nvext": {"token_data": ids},
        }))
        .unwrap();
        let r = parse(&body).unwrap();
        for estimator in [PromptEstimator::SimWords, PromptEstimator::ByteBound] {
            let policy = EnginePolicy::new(None, estimator);
            assert_eq!(r.admission_prompt_tokens(Endpoint::Chat, &policy), 50_000);
        }
        // A base that strips `token_data` does not forward it, so does not count it.
        let policy =
            EnginePolicy::new(None, PromptEstimator::SimWords).with_nvext_allowed(Some(Vec::new()));
        assert_eq!(r.admission_prompt_tokens(Endpoint::Chat, &policy), 7);
    }

    /// Issue 32: every shape of embeddings `input` is counted (token ids exactly), nothing is
    /// generated (no completion limit sent), and no stream is forced.
    #[test]
    fn embeddings_inputs_are_counted_and_nothing_is_forced() {
        let policy = EnginePolicy::new(None, PromptEstimator::SimWords);
        let bound = EnginePolicy::new(None, PromptEstimator::ByteBound);
        for (input, words, ids_exact) in [
            (r#""one two three""#, 4, false),
            (r#"["one two", "three"]"#, 5, false),
            (r#"[5, 6, 7, 8]"#, 4, true),
            (r#"[[5, 6], [7]]"#, 3, true),
        ] {
            let raw = format!(r#"{{"model":"e","input":{input}}}"#);
            let r = parse(raw.as_bytes()).unwrap();
            assert_eq!(
                r.admission_prompt_tokens(Endpoint::Embeddings, &policy),
                words,
                "{input}"
            );
            let b = r.admission_prompt_tokens(Endpoint::Embeddings, &bound);
            if ids_exact {
                assert_eq!(b, words, "{input}");
            } else {
                assert!(b >= words, "{input}");
            }
            assert_eq!(
                estimate_prompt_tokens(Endpoint::Embeddings, raw.as_bytes(), None),
                words
            );
            assert_eq!(r.max_tokens(Endpoint::Embeddings), None);
            let v: Value = serde_json::from_slice(
                &r.upstream_body(
                    Endpoint::Embeddings,
                    true,
                    &route(SaltPolicy::Shared),
                    Uuid::nil(),
                    9,
                )
                .unwrap(),
            )
            .unwrap();
            for absent in ["max_tokens", "stream", "stream_options"] {
                assert!(v.get(absent).is_none(), "{absent}: {v}");
            }
        }
    }

    #[test]
    fn the_admission_bound_is_never_below_the_words() {
        let chat = parse(
            br#"{"model":"m","messages":[{"role":"user","content":"Explain, briefly: tokenizers!"}]}"#,
        )
        .unwrap();
        let words = chat.word_prompt_tokens(Endpoint::Chat);
        let policy = |estimator| EnginePolicy::new(None, estimator);
        let bound =
            chat.admission_prompt_tokens(Endpoint::Chat, &policy(PromptEstimator::ByteBound));
        // A byte-level tokenizer counts at most one token per byte of the text.
        assert!(bound >= "Explain, briefly: tokenizers!".len() as u64 + words);
        assert_eq!(
            chat.admission_prompt_tokens(Endpoint::Chat, &policy(PromptEstimator::SimWords)),
            words
        );
        let ids = parse(br#"{"model":"m","prompt":[1,2,3,4]}"#).unwrap();
        assert_eq!(
            ids.admission_prompt_tokens(Endpoint::Completions, &policy(PromptEstimator::ByteBound)),
            4
        );
        assert_eq!(
            parse(br#"{"model":"m","n":3,"best_of":5}"#)
                .unwrap()
                .sequences(),
            5
        );
        assert_eq!(parse(br#"{"model":"m"}"#).unwrap().sequences(), 1);
    }

    #[test]
    fn estimates_the_prompt_from_its_field_only() {
        let chat =
            parse(br#"{"model":"m","messages":[{"role":"user","content":"one two three"}]}"#)
                .unwrap();
        let parsed: Value =
            serde_json::from_str(r#"[{"role":"user","content":"one two three"}]"#).unwrap();
        assert_eq!(
            chat.word_prompt_tokens(Endpoint::Chat),
            u64::from(tf_engine_sim::tokenizer::chat_prompt_tokens(&parsed))
        );
        assert_eq!(chat.word_prompt_tokens(Endpoint::Completions), 0);
    }

    #[test]
    fn the_bases_tokenizer_counts_when_it_has_one() {
        // Splits words from punctuation (`\w+|[^\w\s]+`), every piece one token, no BOS.
        let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,
            "decoder":null,"model":{"type":"WordLevel","vocab":{"[UNK]":0},"unk_token":"[UNK]"}}"#;
        let t = std::sync::Arc::new(BaseTokenizer::from_json(json).unwrap());
        let with =
            EnginePolicy::new(None, PromptEstimator::SimWords).with_tokenizer(Some(t.clone()));
        let without = EnginePolicy::new(None, PromptEstimator::SimWords);
        let raw = br#"{"model":"m","messages":[{"role":"user","content":"Hello, world!"}]}"#;
        let chat = parse(raw).unwrap();
        // By hand: 2 markers + `user` + `Hello` `,` `world` `!`, then the assistant header
        // (a marker + `assistant`): 9.
        assert_eq!(chat.admission_prompt_tokens(Endpoint::Chat, &with), 9);
        assert_eq!(estimate_prompt_tokens(Endpoint::Chat, raw, Some(&t)), 9);
        // No tokenizer: the fallback (the simulator's words, 3 + 2 + 2).
        assert_eq!(chat.admission_prompt_tokens(Endpoint::Chat, &without), 7);
        assert_eq!(estimate_prompt_tokens(Endpoint::Chat, raw, None), 7);
        let raw = br#"{"model":"m","prompt":["Hello, world!", [5, 6]]}"#;
        let completion = parse(raw).unwrap();
        assert_eq!(
            completion.admission_prompt_tokens(Endpoint::Completions, &with),
            6
        );
        assert_eq!(
            estimate_prompt_tokens(Endpoint::Completions, raw, Some(&t)),
            6
        );
        let ids = parse(br#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
        assert_eq!(ids.admission_prompt_tokens(Endpoint::Completions, &with), 3);
    }
}
