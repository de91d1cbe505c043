//! A base model's own tokenizer (its Hugging Face `tokenizer.json`, run by the `tokenizers`
//! crate), for the prompt counts the gateway makes before the engine has reported usage: the
//! admission estimate and the prompt of a request billed `estimated`. Loaded once per base and
//! shared by every route on it ([`crate::gateway::resolve::RouteTable`] caches it by the
//! template's version).
//!
//! What is counted: a completion prompt as the tokenizer encodes it with its special tokens (a
//! BOS where the base adds one), token-id prompts by their length; a chat prompt as the tokens of
//! each message's role and text parts plus two template markers per message, and the assistant
//! header (a marker and `assistant`). Chat templates are not run (they are Jinja, outside
//! `tokenizer.json`), so a real base's fixed template overhead is approximated by those markers;
//! the content, which is what grows, is counted exactly. A base without a `tokenizer.json`
//! falls back to its [`crate::engine_policy::PromptEstimator`].

use std::str::FromStr;

use serde_json::Value;

/// Template markers counted around each chat message (start and end).
const MARKERS_PER_MESSAGE: u64 = 2;

/// One base's tokenizer.
pub struct BaseTokenizer {
    inner: tokenizers::Tokenizer,
}

impl std::fmt::Debug for BaseTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BaseTokenizer").finish_non_exhaustive()
    }
}

impl BaseTokenizer {
    /// Parses a `tokenizer.json`; the reason names what the `tokenizers` crate refused.
    pub fn from_json(json: &str) -> Result<Self, String> {
        tokenizers::Tokenizer::from_str(json)
            .map(|inner| Self { inner })
            .map_err(|e| format!("not a usable tokenizer.json: {e}"))
    }

    /// Tokens of `text`, with the base's special tokens (BOS, ...) when `special`. A text the
    /// tokenizer cannot encode counts its bytes (no tokenizer makes more tokens than bytes).
    pub fn count(&self, text: &str, special: bool) -> u64 {
        self.inner
            .encode_fast(text, special)
            .map_or(text.len() as u64, |e| e.len() as u64)
    }

    /// Prompt tokens of a chat request's `messages` (0 if it is not an array).
    pub fn chat_prompt_tokens(&self, messages: &Value) -> u64 {
        let Some(list) = messages.as_array() else {
            return 0;
        };
        let mut total = 1 + self.count("assistant", false);
        for message in list {
            let role = message
                .get("role")
                .and_then(Value::as_str)
                .unwrap_or("user");
            total += MARKERS_PER_MESSAGE + self.count(role, false);
            total += texts(message.get("content"))
                .map(|t| self.count(t, false))
                .sum::<u64>();
        }
        total
    }

    /// Prompt tokens of a completion request's `prompt`: a string (with special tokens), or an
    /// array of strings, token ids or arrays of token ids.
    pub fn completion_prompt_tokens(&self, prompt: &Value) -> u64 {
        match prompt {
            Value::String(s) => self.count(s, true),
            Value::Array(items) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => self.count(s, true),
                    Value::Number(_) => 1,
                    Value::Array(ids) => ids.len() as u64,
                    _ => 0,
                })
                .sum(),
            _ => 0,
        }
    }
}

/// The text parts of a message's `content`: a string, or the `text` of `{"type":"text"}` parts.
fn texts(content: Option<&Value>) -> impl Iterator<Item = &str> {
    let (single, parts) = match content {
        Some(Value::String(s)) => (Some(s.as_str()), None),
        Some(Value::Array(parts)) => (None, Some(parts.iter())),
        _ => (None, None),
    };
    let parts = parts.into_iter().flatten().filter_map(|part| {
        (part.get("type").and_then(Value::as_str) == Some("text"))
            .then(|| part.get("text").and_then(Value::as_str))
            .flatten()
    });
    single.into_iter().chain(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Splits words from punctuation (`\w+|[^\w\s]+`), every piece one token.
    const PUNCT_SPLIT: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
        "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
        "model":{"type":"WordLevel","vocab":{"[UNK]":0},"unk_token":"[UNK]"}}"#;

    #[test]
    fn counts_by_the_bases_own_rules() {
        let t = BaseTokenizer::from_json(PUNCT_SPLIT).unwrap();
        // "Hello" "," "world" "!": four pieces, though two words.
        assert_eq!(t.count("Hello, world!", true), 4);
        // user: 2 markers + "user" + 4 ; assistant header: 1 + "assistant".
        let messages = json!([{"role": "user", "content": "Hello, world!"}]);
        assert_eq!(t.chat_prompt_tokens(&messages), 2 + 1 + 4 + 2);
        assert_eq!(
            t.completion_prompt_tokens(&json!(["a b", [1, 2, 3], 7])),
            2 + 3 + 1
        );
    }

    #[test]
    fn the_simulators_tokenizer_counts_like_the_simulator() {
        use tf_engine_sim::tokenizer as sim;
        let t = BaseTokenizer::from_json(sim::TOKENIZER_JSON).unwrap();
        for text in [
            "",
            "Hello,  world !",
            "  tabs\tand\nnew lines\u{a0}nbsp\u{2003}em-space <s> <|start|> ",
            "ünïcödé wörds, 漢字 かな",
        ] {
            assert_eq!(
                t.count(text, false),
                u64::from(sim::count_text(text)),
                "{text:?}"
            );
            let prompt = Value::String(text.to_owned());
            assert_eq!(
                t.completion_prompt_tokens(&prompt),
                u64::from(sim::completion_prompt_tokens(&prompt.to_string())),
                "{text:?}"
            );
            let chat = json!([
                {"role": "system", "content": text},
                {"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url"}]},
                {"role": "assistant"}
            ]);
            assert_eq!(
                t.chat_prompt_tokens(&chat),
                u64::from(sim::chat_prompt_tokens(&chat)),
                "{text:?}"
            );
        }
    }

    #[test]
    fn a_broken_tokenizer_is_refused_with_its_reason() {
        assert!(BaseTokenizer::from_json("{}")
            .err()
            .is_some_and(|e| e.starts_with("not a usable tokenizer.json")));
    }
}
