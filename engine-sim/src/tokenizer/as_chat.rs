//! Responses and Anthropic Messages prompts as chat messages, so the simulator renders and counts
//! them with the chat rules and the gateway's estimate of them equals what the simulator bills.
//!
//! Each message's content becomes one string: the texts of its parts joined by a space (a part
//! counts if it carries `text`: `text`, `input_text`, `output_text`); other parts (images, tool
//! calls) count nothing.

use serde_json::{json, Value};

/// Responses' `instructions` (a system message) then `input`: a string is one user message; an
/// array holds items with a `role` and a `content` (a string or parts). Items without a role
/// (function outputs, reasoning items) count their text, as a user message.
pub fn responses(instructions: Option<&Value>, input: Option<&Value>) -> Value {
    let mut out = Vec::new();
    if let Some(Value::String(s)) = instructions {
        out.push(message("system", s.clone()));
    }
    match input {
        Some(Value::String(s)) => out.push(message("user", s.clone())),
        Some(Value::Array(items)) => out.extend(items.iter().map(item)),
        _ => {}
    }
    Value::Array(out)
}

/// Anthropic's `system` (a string or text blocks; a system message) then `messages` (each with a
/// `role` and a `content` string or blocks).
pub fn anthropic(system: Option<&Value>, messages: Option<&Value>) -> Value {
    let mut out = Vec::new();
    if let Some(system) = system.filter(|s| !s.is_null()) {
        out.push(message("system", text_of(system)));
    }
    if let Some(Value::Array(items)) = messages {
        out.extend(items.iter().map(item));
    }
    Value::Array(out)
}

fn item(item: &Value) -> Value {
    let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
    let text = match item.get("content") {
        Some(content) => text_of(content),
        None => item
            .get("output")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
    };
    message(role, text)
}

fn message(role: &str, content: String) -> Value {
    json!({"role": role, "content": content})
}

/// A content value's text: a string as is, parts' `text` joined by a space.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::chat_prompt_tokens;

    #[test]
    fn both_shapes_count_like_chat() {
        let r = responses(
            Some(&json!("be brief")),
            Some(
                &json!([{"role":"user","content":[{"type":"input_text","text":"one two"},{"type":"input_image","image_url":"x"}]}]),
            ),
        );
        // 2 + (3 + 2) + (3 + 2)
        assert_eq!(chat_prompt_tokens(&r), 12);
        assert_eq!(
            chat_prompt_tokens(&responses(None, Some(&json!("a b c")))),
            8
        );
        let a = anthropic(
            Some(&json!([{"type":"text","text":"sys tem"}])),
            Some(
                &json!([{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"x y"}]}]),
            ),
        );
        assert_eq!(chat_prompt_tokens(&a), 2 + 5 + 4 + 5);
    }
}
