//! The simulated tokenizer: deterministic and simple enough that a test (or the gateway's
//! estimator) can predict every count by hand.
//!
//! Rules:
//! - A token is a maximal run of non-whitespace characters (`str::split_whitespace`), so
//!   `count_text("Hello,  world !")` is 3.
//! - Chat prompt = sum over messages of `3 + words(content)` (start marker, role, end marker,
//!   plus the content words), then `+ 2` for the assistant header. `content` may be a string, an
//!   array of parts (only `{"type":"text","text":..}` parts count) or absent/null (0 words).
//!   Rendered sequence: `<|start|> ROLE words.. <|end|>` per message, then `<|start|> assistant`.
//! - Completion prompt = `words(prompt) + 1` (a BOS token). An array of strings counts as the sum
//!   of `words + 1` over its strings; an array of token ids counts as its length (no BOS); an
//!   array of token-id arrays as the sum of their lengths.
//!
//! The `*_ids` functions return the rendered sequence as token ids (a hash of each token's text,
//! or the id itself for token-id prompts); their length always equals the matching count.
//!
//! The same tokenizer as a Hugging Face `tokenizer.json` ([`TOKENIZER_JSON`]: `WhitespaceSplit`
//! pre-tokenizer, a word-level model where every unknown word is one token, a `<s>` BOS added
//! to each sequence) ships with the simulated bases, so the gateway's estimates through the
//! `tokenizers` crate equal what the simulator bills (the server's `base_tokenizer` tests hold
//! the two to the same counts).

use serde_json::Value;

pub mod as_chat;

/// The simulator's tokenizer as a Hugging Face `tokenizer.json`, for the simulated bases.
pub const TOKENIZER_JSON: &str = include_str!("../tokenizer.json");

const START: &str = "<|start|>";
const END: &str = "<|end|>";
const BOS: &str = "<s>";
const ASSISTANT: &str = "assistant";

/// Number of tokens in a text: its whitespace-separated words.
pub fn count_text(s: &str) -> u32 {
    saturate(s.split_whitespace().count())
}

/// Prompt tokens of a chat request's `messages` (0 if it is not an array).
pub fn chat_prompt_tokens(messages: &Value) -> u32 {
    let Some(list) = messages.as_array() else {
        return 0;
    };
    let mut total: u32 = 2;
    for message in list {
        let words = content_texts(message.get("content")).map(count_text);
        total = total
            .saturating_add(3)
            .saturating_add(words.fold(0, u32::saturating_add));
    }
    total
}

/// Prompt tokens of a completion request's `prompt`, given as its JSON text (0 if it is neither a
/// string nor an array, or not JSON). Counted while the text is parsed: a 100k-token id array is
/// scanned once and never built into values.
pub fn completion_prompt_tokens(prompt_json: &str) -> u32 {
    serde_json::from_str::<PromptCount>(prompt_json).map_or(0, |c| c.0)
}

/// The count of a whole `prompt`: a string or an array of items.
struct PromptCount(u32);
/// The count of one item of a `prompt` array: a string, a token id or an array of ids.
struct ItemCount(u32);

impl<'de> serde::Deserialize<'de> for PromptCount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CountVisitor { top: true }).map(Self)
    }
}

impl<'de> serde::Deserialize<'de> for ItemCount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CountVisitor { top: false }).map(Self)
    }
}

/// At the top a string counts its words plus BOS and an array sums its items; inside the array a
/// string counts the same, a number 1 and an array its length; anything else counts 0.
struct CountVisitor {
    top: bool,
}

impl<'de> serde::de::Visitor<'de> for CountVisitor {
    type Value = u32;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a prompt")
    }
    fn visit_str<E>(self, s: &str) -> Result<u32, E> {
        Ok(count_text(s).saturating_add(1))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<u32, A::Error> {
        let mut total: u32 = 0;
        if self.top {
            while let Some(ItemCount(n)) = seq.next_element()? {
                total = total.saturating_add(n);
            }
        } else {
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                total = total.saturating_add(1);
            }
        }
        Ok(total)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<u32, A::Error> {
        while map
            .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
            .is_some()
        {}
        Ok(0)
    }
    fn visit_u64<E>(self, _: u64) -> Result<u32, E> {
        Ok(u32::from(!self.top))
    }
    fn visit_i64<E>(self, _: i64) -> Result<u32, E> {
        Ok(u32::from(!self.top))
    }
    fn visit_f64<E>(self, _: f64) -> Result<u32, E> {
        Ok(u32::from(!self.top))
    }
    fn visit_bool<E>(self, _: bool) -> Result<u32, E> {
        Ok(0)
    }
    fn visit_unit<E>(self) -> Result<u32, E> {
        Ok(0)
    }
}

/// The rendered chat prompt as token ids, for the prefix cache.
pub fn chat_prompt_ids(messages: &Value) -> Vec<u64> {
    let mut ids = Vec::new();
    for message in messages.as_array().map(Vec::as_slice).unwrap_or_default() {
        ids.push(token_id(START));
        ids.push(token_id(
            message
                .get("role")
                .and_then(Value::as_str)
                .unwrap_or("user"),
        ));
        for text in content_texts(message.get("content")) {
            ids.extend(text.split_whitespace().map(token_id));
        }
        ids.push(token_id(END));
    }
    if messages.is_array() {
        ids.push(token_id(START));
        ids.push(token_id(ASSISTANT));
    }
    ids
}

/// The completion prompt as token ids, for the prefix cache.
pub fn completion_prompt_ids(prompt: &Value) -> Vec<u64> {
    let mut ids = Vec::new();
    let push_text = |ids: &mut Vec<u64>, s: &str| {
        ids.push(token_id(BOS));
        ids.extend(s.split_whitespace().map(token_id));
    };
    match prompt {
        Value::String(s) => push_text(&mut ids, s),
        Value::Array(items) => {
            for item in items {
                match item {
                    Value::String(s) => push_text(&mut ids, s),
                    Value::Number(n) => ids.push(n.as_u64().unwrap_or(0)),
                    Value::Array(list) => ids.extend(list.iter().map(|n| n.as_u64().unwrap_or(0))),
                    _ => {}
                }
            }
        }
        _ => {}
    }
    ids
}

/// The text parts of a message's `content`.
fn content_texts(content: Option<&Value>) -> impl Iterator<Item = &str> {
    let (single, parts) = match content {
        Some(Value::String(s)) => (Some(s.as_str()), None),
        Some(Value::Array(parts)) => (None, Some(parts.iter())),
        _ => (None, None),
    };
    let parts = parts.into_iter().flatten().filter_map(|part| {
        let is_text = part.get("type").and_then(Value::as_str) == Some("text");
        if is_text {
            part.get("text").and_then(Value::as_str)
        } else {
            None
        }
    });
    single.into_iter().chain(parts)
}

/// A token's id: FNV-1a of its text.
fn token_id(token: &str) -> u64 {
    token.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn saturate(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_counts_whitespace_separated_words() {
        assert_eq!(count_text(""), 0);
        assert_eq!(count_text("   "), 0);
        assert_eq!(count_text("Hello,  world !\n\tok"), 4);
        assert_eq!(count_text(" w0 w1 w2"), 3);
    }

    #[test]
    fn chat_counts_markers_and_parts() {
        let messages = json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "one two"},
                {"type": "image_url", "image_url": {"url": "x y z"}},
                {"type": "text", "text": "three"}
            ]},
            {"role": "assistant", "content": null}
        ]);
        assert_eq!(chat_prompt_tokens(&messages), (3 + 2) + (3 + 3) + 3 + 2);
        assert_eq!(chat_prompt_ids(&messages).len(), 16);
        assert_eq!(chat_prompt_tokens(&json!([])), 2);
        assert_eq!(chat_prompt_tokens(&json!("nope")), 0);
        assert!(chat_prompt_ids(&json!("nope")).is_empty());
    }

    fn completion_count(prompt: &Value) -> u32 {
        completion_prompt_tokens(&prompt.to_string())
    }

    #[test]
    fn completion_counts_bos_and_token_ids() {
        assert_eq!(completion_count(&json!("a b c")), 4);
        assert_eq!(completion_count(&json!(["a b", "c"])), 3 + 2);
        assert_eq!(completion_count(&json!([1, 2, 3])), 3);
        assert_eq!(completion_count(&json!([[1, 2], [3]])), 3);
        assert_eq!(completion_count(&json!(42)), 0);
        assert_eq!(completion_prompt_tokens("[1, 2"), 0);
        // The estimate is what the engine bills: the length of the ids it renders.
        for prompt in [
            json!("a b c"),
            json!("esc\"aped \u{00e9} words"),
            json!(["a b", "c"]),
            json!([1, 2, 3]),
            json!([1, -2, 3.5]),
            json!([[1, 2], [3]]),
            json!([[1, 2], [3, "x", null], []]),
            json!([{"a": [1, 2]}, true, null, "w", 7]),
            json!(42),
            json!(null),
            json!({"prompt": "a b"}),
            json!([]),
        ] {
            assert_eq!(
                completion_prompt_ids(&prompt).len() as u32,
                completion_count(&prompt),
                "{prompt}"
            );
        }
    }

    #[test]
    fn ids_are_deterministic_and_content_sensitive() {
        let a = json!([{"role": "user", "content": "hello there"}]);
        let b = json!([{"role": "user", "content": "hello world"}]);
        assert_eq!(chat_prompt_ids(&a), chat_prompt_ids(&a));
        assert_ne!(chat_prompt_ids(&a), chat_prompt_ids(&b));
        assert_eq!(chat_prompt_ids(&a)[..3], chat_prompt_ids(&b)[..3]);
    }
}
