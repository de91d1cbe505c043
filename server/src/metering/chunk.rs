//! One streamed chunk (chat or completions), as the engine wrote it: the fields the meter and the
//! whole-answer assembler read, borrowed from the event's bytes. One type for both, so an
//! assembled answer costs one parse per event, not two (issue 35). Values relayed as written stay
//! raw JSON; nothing here is built into a `Value` tree.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::borrowed::{from_event, opt_str, str_of};

#[derive(Deserialize)]
pub struct Chunk<'a> {
    #[serde(borrow, default, deserialize_with = "opt_str")]
    pub id: Option<Cow<'a, str>>,
    #[serde(default)]
    pub created: Option<u64>,
    #[serde(borrow, default)]
    pub model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub system_fingerprint: Option<&'a RawValue>,
    /// `None` when the chunk has no `choices` member at all (a usage chunk may omit it).
    #[serde(borrow, default)]
    pub choices: Option<Vec<ChunkChoice<'a>>>,
    /// `Some` for `"usage": null` too (the member is still there for the meter to strip).
    #[serde(borrow, default, deserialize_with = "present")]
    pub usage: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
    /// `error` in vLLM's older error body (`{"object":"error","message":..}`).
    #[serde(borrow, default, deserialize_with = "opt_str")]
    pub object: Option<Cow<'a, str>>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// A choice of a chunk. Its optional raw values read `null` as `None` (only `usage` is kept
/// when `null`, for the meter to strip).
#[derive(Deserialize)]
pub struct ChunkChoice<'a> {
    #[serde(default)]
    pub index: u32,
    #[serde(borrow, default)]
    pub delta: Option<Delta<'a>>,
    #[serde(borrow, default, deserialize_with = "opt_str")]
    pub text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub logprobs: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub finish_reason: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub stop_reason: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub struct Delta<'a> {
    #[serde(borrow, default, deserialize_with = "opt_str")]
    pub role: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_str")]
    pub content: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "opt_str")]
    pub reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub tool_calls: Option<&'a RawValue>,
}

impl<'a> Chunk<'a> {
    pub fn parse(data: &'a [u8]) -> Option<Self> {
        from_event(data)
    }

    /// The choices (none when the member is absent).
    pub fn choices(&self) -> &[ChunkChoice<'a>] {
        self.choices.as_deref().unwrap_or_default()
    }

    /// The usage value, unless it is `null`.
    pub fn usage(&self) -> Option<&'a RawValue> {
        self.usage.filter(|u| u.get() != "null")
    }

    /// The engine reported an error in the stream (either of vLLM's shapes).
    pub fn is_error(&self) -> bool {
        self.error.is_some() || self.object.as_deref() == Some("error")
    }
}

impl ChunkChoice<'_> {
    /// The finish reason as a string, when the choice finished.
    pub fn finish_reason(&self) -> Option<Cow<'_, str>> {
        self.finish_reason.and_then(str_of)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_members_read_as_absent_but_a_null_usage_is_kept() {
        let c = Chunk::parse(
            br#"{"choices":[{"index":0,"finish_reason":null,"stop_reason":null,"logprobs":null,"delta":{"tool_calls":null}}],"usage":null,"error":null}"#,
        )
        .unwrap();
        let choice = &c.choices()[0];
        assert!(choice.finish_reason.is_none() && choice.stop_reason.is_none());
        assert!(choice.logprobs.is_none() && c.error.is_none() && !c.is_error());
        assert!(choice.delta.as_ref().unwrap().tool_calls.is_none());
        assert_eq!(c.usage.map(RawValue::get), Some("null"));
        assert!(c.usage().is_none());
        let done = Chunk::parse(br#"{"choices":[{"finish_reason":"length"}]}"#).unwrap();
        assert_eq!(done.choices()[0].finish_reason().as_deref(), Some("length"));
        assert!(matches!(
            done.choices()[0].finish_reason(),
            Some(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn a_chunks_strings_are_borrowed_from_its_bytes() {
        let c = Chunk::parse(
            br#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"hi","reasoning_content":"r"},"text":"t"}]}"#,
        )
        .unwrap();
        let choice = &c.choices()[0];
        let delta = choice.delta.as_ref().unwrap();
        for s in [
            &c.id,
            &c.object,
            &choice.text,
            &delta.role,
            &delta.content,
            &delta.reasoning_content,
        ] {
            assert!(matches!(s, Some(Cow::Borrowed(_))), "copied: {s:?}");
        }
    }
}
