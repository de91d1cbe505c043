//! Optional strings borrowed from the bytes being read. serde's `#[serde(borrow)]` borrows a
//! `Cow<str>` only when it is the field's whole type: an `Option<Cow<str>>` is always copied
//! into a new `String`. On the meter's path that was several allocations and copies per streamed
//! chunk (its `id`, `object`, `role`, `content`), so every such field reads through
//! [`opt_str`] (issue 35). A string with escapes is still decoded into an owned one.

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

/// A raw JSON value read as a string (borrowed unless it has escapes); `None` if it is not one.
pub fn str_of(raw: &RawValue) -> Option<Cow<'_, str>> {
    serde_json::from_str::<Borrowed<'_>>(raw.get())
        .ok()
        .map(|b| b.0)
}

#[cfg(test)]
mod tests {
    use super::*;

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
