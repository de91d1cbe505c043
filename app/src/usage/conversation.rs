//! A stored request body read as a conversation (issue 37, item 1): the prompt's messages with
//! their roles and the completion's text assembled from the answer, whether it was one JSON
//! document or a stream of server-sent events (the chunks' deltas joined), for each `/v1`
//! endpoint's shape. Reading is best effort: a body cut at 32 KiB or of an unknown shape gives
//! what could be read (the raw form stays on the page behind a disclosure).

use serde_json::Value;

use super::{Conversation, Turn};

/// The conversation of one request's stored bodies, read by the endpoint that served it.
pub fn read(endpoint: &str, prompt: &str, completion: &str) -> Conversation {
    let mut c = Conversation::default();
    if let Ok(p) = serde_json::from_str::<Value>(prompt) {
        c.messages = messages(endpoint, &p);
    }
    let events = answer_events(completion);
    for ev in &events {
        take_answer(endpoint, ev, &mut c);
    }
    c.streamed_events = if completion.trim_start().starts_with('{') {
        0
    } else {
        events.len()
    };
    c
}

/// The JSON documents of an answer: the one document, or every `data:` line of an event stream
/// (`[DONE]` and lines that do not parse, such as a cut last event, left out).
fn answer_events(completion: &str) -> Vec<Value> {
    let trimmed = completion.trim_start();
    if trimmed.starts_with('{') {
        return serde_json::from_str(trimmed).map_or_else(|_| Vec::new(), |v| vec![v]);
    }
    completion
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

/// The text of a message's `content`: a string, or the text of its parts (`text`, `input_text`,
/// `output_text`); other parts (images, tool calls) as a bracketed note.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p.get("text").and_then(Value::as_str) {
                Some(t) => t.to_owned(),
                None => match p.get("type").and_then(Value::as_str) {
                    Some(kind) => format!("[{kind}]"),
                    None => text_of(p),
                },
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn turn(role: &str, text: String) -> Turn {
    Turn {
        role: role.to_owned(),
        text,
    }
}

/// The prompt's turns: chat and messages' `messages` (and Anthropic's `system`), responses'
/// `instructions` and `input`, completions' `prompt`, embeddings' `input`.
fn messages(endpoint: &str, p: &Value) -> Vec<Turn> {
    let mut out = Vec::new();
    let listed = |v: &Value, out: &mut Vec<Turn>| {
        for m in v.as_array().into_iter().flatten() {
            let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
            let content = m.get("content").unwrap_or(&Value::Null);
            out.push(turn(role, text_of(content)));
        }
    };
    match endpoint {
        "messages" => {
            if let Some(system) = p.get("system") {
                out.push(turn("system", text_of(system)));
            }
            listed(p.get("messages").unwrap_or(&Value::Null), &mut out);
        }
        "responses" => {
            if let Some(i) = p.get("instructions").and_then(Value::as_str) {
                out.push(turn("system", i.to_owned()));
            }
            match p.get("input") {
                Some(Value::String(s)) => out.push(turn("user", s.clone())),
                Some(items) => listed(items, &mut out),
                None => {}
            }
        }
        "completions" | "embeddings" => {
            let field = if endpoint == "completions" {
                "prompt"
            } else {
                "input"
            };
            match p.get(field) {
                Some(Value::Array(items)) => {
                    for i in items {
                        out.push(turn("input", text_of(i)));
                    }
                }
                Some(v) => out.push(turn("input", text_of(v))),
                None => {}
            }
        }
        _ => listed(p.get("messages").unwrap_or(&Value::Null), &mut out),
    }
    out
}

fn push_text(c: &mut Conversation, t: &str) {
    c.completion.get_or_insert_with(String::new).push_str(t);
}

fn finish(c: &mut Conversation, v: Option<&Value>) {
    if let Some(r) = v.and_then(Value::as_str) {
        c.finish_reason = Some(r.to_owned());
    }
}

/// Adds what one answer document (or stream event) says to the conversation.
fn take_answer(endpoint: &str, ev: &Value, c: &mut Conversation) {
    match endpoint {
        "messages" => match ev.get("type").and_then(Value::as_str) {
            // The whole message (not streamed).
            Some("message") => {
                for block in ev
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(t) = block.get("text").and_then(Value::as_str) {
                        push_text(c, t);
                    }
                }
                finish(c, ev.get("stop_reason"));
            }
            Some("content_block_delta") => {
                if let Some(t) = ev.pointer("/delta/text").and_then(Value::as_str) {
                    push_text(c, t);
                }
            }
            Some("message_delta") => finish(c, ev.pointer("/delta/stop_reason")),
            _ => {}
        },
        "responses" => match ev.get("type").and_then(Value::as_str) {
            Some("response.output_text.delta") => {
                if let Some(t) = ev.get("delta").and_then(Value::as_str) {
                    push_text(c, t);
                }
            }
            Some("response.completed" | "response.incomplete" | "response.failed") => {
                let r = ev.get("response").unwrap_or(&Value::Null);
                responses_finish(r, c);
            }
            // The whole response (not streamed).
            _ if ev.get("object").and_then(Value::as_str) == Some("response") => {
                for item in ev
                    .get("output")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    for part in item
                        .get("content")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        if part.get("type").and_then(Value::as_str) == Some("output_text") {
                            push_text(c, part.get("text").and_then(Value::as_str).unwrap_or(""));
                        }
                    }
                }
                responses_finish(ev, c);
            }
            _ => {}
        },
        "embeddings" => {
            if let Some(data) = ev.get("data").and_then(Value::as_array) {
                let n = data.len();
                c.completion = Some(format!(
                    "{n} embedding{} (vectors not shown)",
                    if n == 1 { "" } else { "s" }
                ));
            }
        }
        // chat and completions: choices[0], whole (`message`) or a chunk (`delta`), or `text`.
        _ => {
            let Some(choice) = ev.pointer("/choices/0") else {
                return;
            };
            let text = choice
                .pointer("/message/content")
                .or_else(|| choice.pointer("/delta/content"))
                .or_else(|| choice.get("text"))
                .and_then(Value::as_str);
            if let Some(t) = text {
                push_text(c, t);
            }
            finish(c, choice.get("finish_reason"));
        }
    }
}

/// A Responses answer's end: `incomplete_details.reason` when incomplete, else its status.
fn responses_finish(r: &Value, c: &mut Conversation) {
    let reason = r
        .pointer("/incomplete_details/reason")
        .filter(|v| v.is_string())
        .or_else(|| r.get("status"));
    finish(c, reason);
}

#[cfg(test)]
mod tests {
    use super::read;

    #[test]
    fn a_streamed_chat_is_assembled_from_its_chunks() {
        let prompt = r#"{"model":"m","messages":[{"role":"system","content":"Be brief."},
            {"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url"}]}]}"#;
        let sse = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
                   data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n\
                   data: {\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"length\"}]}\n\n\
                   data: {\"choices\":[],\"usage\":{\"completion_tokens\":2}}\n\n\
                   data: [DONE]\n\n";
        let c = read("chat", prompt, sse);
        let turns: Vec<(&str, &str)> = c
            .messages
            .iter()
            .map(|t| (t.role.as_str(), t.text.as_str()))
            .collect();
        assert_eq!(
            turns,
            [("system", "Be brief."), ("user", "Hi\n[image_url]")]
        );
        assert_eq!(c.completion.as_deref(), Some("Hello"));
        assert_eq!(c.finish_reason.as_deref(), Some("length"));
        assert_eq!(c.streamed_events, 4);
    }

    #[test]
    fn whole_answers_of_each_endpoint() {
        let c = read(
            "chat",
            r#"{"messages":[{"role":"user","content":"Hi"}]}"#,
            r#"{"choices":[{"message":{"role":"assistant","content":"Yo"},"finish_reason":"stop"}]}"#,
        );
        assert_eq!(
            (c.completion.as_deref(), c.finish_reason.as_deref()),
            (Some("Yo"), Some("stop"))
        );
        assert_eq!(c.streamed_events, 0);

        let c = read(
            "completions",
            r#"{"prompt":"Once"}"#,
            r#"{"choices":[{"text":" upon","finish_reason":"length"}]}"#,
        );
        assert_eq!(c.messages[0].text, "Once");
        assert_eq!(c.completion.as_deref(), Some(" upon"));

        let c = read(
            "messages",
            r#"{"system":"S","messages":[{"role":"user","content":"Q"}]}"#,
            "event: message_start\ndata: {\"type\":\"message_start\"}\n\n\
             event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"A\"}}\n\n\
             event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\n",
        );
        assert_eq!(c.messages.len(), 2);
        assert_eq!(
            (c.completion.as_deref(), c.finish_reason.as_deref()),
            (Some("A"), Some("end_turn"))
        );

        let c = read(
            "responses",
            r#"{"instructions":"I","input":"Hello"}"#,
            r#"{"object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},
                "output":[{"type":"message","content":[{"type":"output_text","text":"Hi there"}]}]}"#,
        );
        assert_eq!(c.messages[1].text, "Hello");
        assert_eq!(c.completion.as_deref(), Some("Hi there"));
        assert_eq!(c.finish_reason.as_deref(), Some("max_output_tokens"));

        let c = read(
            "embeddings",
            r#"{"input":["a","b"]}"#,
            r#"{"data":[{"embedding":[0.1]},{"embedding":[0.2]}]}"#,
        );
        assert_eq!(c.messages.len(), 2);
        assert_eq!(
            c.completion.as_deref(),
            Some("2 embeddings (vectors not shown)")
        );
    }

    #[test]
    fn a_cut_body_gives_what_can_be_read() {
        let c = read(
            "chat",
            r#"{"messages":[{"role":"user","content":"Hi"#,
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\ndata: {\"choi",
        );
        assert!(c.messages.is_empty());
        assert_eq!(c.completion.as_deref(), Some("Hel"));
        assert_eq!(c.finish_reason, None);
    }
}
