//! Optional strings borrowed from the bytes being read. serde's `#[serde(borrow)]` borrows a
//! `Cow<str>` only when it is the field's whole type: an `Option<Cow<str>>` is always copied
//! into a new `String`. On the meter's path that was several allocations and copies per streamed
//! chunk (its `id`, `object`, `role`, `content`), so every such field reads through
//! [`opt_str`] (issue 35). A string with escapes is still decoded into an owned one.
//!
//! The meters and the assemblers read each engine event, and the meter its kept usage, with
//! [`from_event`]: one UTF-8 check of the whole text, then serde_json reads it as a `str`. Read
//! from bytes, serde_json checks every string it reads again, keys included: a dozen checks per
//! streamed chunk, and a fifth of the cost of reading a `usage` object (2,713 against 2,194
//! instructions).

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// The one shape serde borrows: a `Cow<str>` that is a type's whole content.
#[derive(Deserialize)]
struct Borrowed<'a>(#[serde(borrow)] Cow<'a, str>);

/// `deserialize_with` for `Option<Cow<'a, str>>` fields (with `borrow` and `default`).
pub fn opt_str<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'de, str>>, D::Error> {
    Ok(Option::<Borrowed<'de>>::deserialize(d)?.map(|b| b.0))
}

/// `T` read from one event's data; `None` if it is not UTF-8 JSON of that shape.
pub fn from_event<'a, T: Deserialize<'a>>(data: &'a [u8]) -> Option<T> {
    serde_json::from_str(std::str::from_utf8(data).ok()?).ok()
}

/// A raw JSON value read as a string (borrowed unless it has escapes); `None` if it is not one.
pub fn str_of(raw: &RawValue) -> Option<Cow<'_, str>> {
    serde_json::from_str::<Borrowed<'_>>(raw.get())
        .ok()
        .map(|b| b.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_read_only_if_it_is_utf8_json() {
        let ok: Option<Probe<'_>> = from_event(br#"{"s":"h\u00e9","plain":"x"}"#);
        assert_eq!(ok.unwrap().s.as_deref(), Some("h\u{e9}"));
        assert!(from_event::<Probe<'_>>(b"{\"s\":\"\xff\"}").is_none());
        assert!(from_event::<Probe<'_>>(b"{\"s\":").is_none());
    }

    #[derive(Deserialize)]
    struct Probe<'a> {
        #[serde(borrow, default, deserialize_with = "opt_str")]
        s: Option<Cow<'a, str>>,
        /// The attribute alone, as the fields had it: copied.
        #[serde(borrow, default)]
        plain: Option<Cow<'a, str>>,
    }

    #[test]
    fn optional_strings_borrow_unless_escaped() {
        let p: Probe<'_> = serde_json::from_str(r#"{"s":"chunk","plain":"chunk"}"#).unwrap();
        assert!(matches!(p.s, Some(Cow::Borrowed("chunk"))));
        assert!(matches!(p.plain, Some(Cow::Owned(_))), "serde copies these");
        let p: Probe<'_> = serde_json::from_str(r#"{"s":"a\nb"}"#).unwrap();
        assert!(matches!(p.s.as_deref(), Some("a\nb")));
        let p: Probe<'_> = serde_json::from_str(r#"{"s":null}"#).unwrap();
        assert!(p.s.is_none() && p.plain.is_none());
        assert!(serde_json::from_str::<Probe<'_>>(r#"{"s":1}"#).is_err());
    }

    #[test]
    fn a_raw_string_reads_borrowed() {
        let raw: &RawValue = serde_json::from_str(r#""length""#).unwrap();
        assert!(matches!(str_of(raw), Some(Cow::Borrowed("length"))));
        let raw: &RawValue = serde_json::from_str("3").unwrap();
        assert!(str_of(raw).is_none());
    }
}
