//! A client that records what it received, for checking the usage table afterwards.

use std::sync::atomic::{AtomicUsize, Ordering};

use futures::StreamExt;
use serde_json::Value;

/// What one request got.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub request_id: Option<String>,
    /// The final bytes arrived (`[DONE]`, or a whole 200 body).
    pub completed: bool,
}

/// Sends `body` and reads the answer; hangs up after `hang_up_after` SSE events if set.
pub async fn send(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    body: &Value,
    hang_up_after: Option<usize>,
) -> Outcome {
    send_counting_heads(http, url, key, body, hang_up_after, &AtomicUsize::new(0)).await
}

/// [`send`], adding 1 to `heads` when the response head arrives (the request is being served),
/// so a test can wait until its requests are in flight.
pub async fn send_counting_heads(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    body: &Value,
    hang_up_after: Option<usize>,
    heads: &AtomicUsize,
) -> Outcome {
    let resp = match http.post(url).bearer_auth(key).json(body).send().await {
        Ok(r) => r,
        Err(_) => {
            return Outcome {
                request_id: None,
                completed: false,
            }
        }
    };
    heads.fetch_add(1, Ordering::SeqCst);
    let request_id = resp
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let ok = resp.status().is_success();
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    if !stream {
        let body = resp.bytes().await;
        return Outcome {
            request_id,
            completed: ok && body.is_ok(),
        };
    }
    let mut s = resp.bytes_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = s.next().await {
        let Ok(chunk) = chunk else { break };
        buf.extend_from_slice(&chunk);
        if let Some(n) = hang_up_after {
            if buf.windows(2).filter(|w| w == b"\n\n").count() >= n {
                return Outcome {
                    request_id,
                    completed: false,
                };
            }
        }
    }
    let completed = ok && buf.ends_with(b"data: [DONE]\n\n");
    Outcome {
        request_id,
        completed,
    }
}
