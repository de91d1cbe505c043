//! Shared helpers for the integration tests: start a simulator on a loopback port, post JSON,
//! parse SSE bodies and poll the ledger with a bounded loop.

#![allow(
    clippy::disallowed_methods,
    reason = "test scaffolding (fake engines, load generators) runs until the test ends; nothing waits for it at shutdown"
)]
#![allow(dead_code, clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use serde_json::Value;
use tf_engine_sim::{EngineSim, LedgerEntry, SimConfig};
use tokio::sync::oneshot;

pub struct Sim {
    pub url: String,
    pub sim: EngineSim,
    pub client: reqwest::Client,
    _stop: oneshot::Sender<()>,
}

pub async fn start(config: SimConfig) -> Sim {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let sim = EngineSim::new(config);
    let (stop, stopped) = oneshot::channel::<()>();
    let served = sim.clone();
    tokio::spawn(async move {
        tf_engine_sim::serve(listener, served, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    Sim {
        url,
        sim,
        client: reqwest::Client::new(),
        _stop: stop,
    }
}

pub fn config() -> SimConfig {
    SimConfig {
        models: vec!["tiny-llama".into()],
        ..SimConfig::default()
    }
}

impl Sim {
    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        let response = self.post(path, body).await;
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap()
    }

    /// Posts a streaming request and returns its events and whether `[DONE]` ended it.
    pub async fn stream(&self, path: &str, body: &Value) -> (Vec<Value>, bool) {
        let response = self.post(path, body).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        parse_sse(&response.text().await.unwrap())
    }

    /// The ledger through `GET /sim/ledger`.
    pub async fn ledger(&self) -> Vec<LedgerEntry> {
        let response = self.get("/sim/ledger").await;
        assert_eq!(response.headers()["content-type"], "application/x-ndjson");
        let text = response.text().await.unwrap();
        text.lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    /// Polls the ledger (bounded, 3 s) until an entry with this request id appears.
    pub async fn wait_entry(&self, request_id: &str) -> LedgerEntry {
        for _ in 0..300 {
            if let Some(entry) = self
                .sim
                .ledger()
                .into_iter()
                .find(|e| e.request_id.as_deref() == Some(request_id))
            {
                return entry;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no ledger entry for {request_id}");
    }
}

/// Splits an SSE body into JSON events; checks the exact `data: …\n\n` framing.
pub fn parse_sse(text: &str) -> (Vec<Value>, bool) {
    let mut events = Vec::new();
    let mut done = false;
    assert!(
        text.is_empty() || text.ends_with("\n\n"),
        "unterminated event in {text:?}"
    );
    for raw in text.split_terminator("\n\n") {
        let data = raw
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("bad event {raw:?}"));
        assert!(!done, "event after [DONE]");
        if data == "[DONE]" {
            done = true;
        } else {
            assert!(!data.contains('\n'));
            events.push(serde_json::from_str(data).unwrap());
        }
    }
    (events, done)
}

/// Content text of a chat or completion chunk (empty if none).
pub fn chunk_text(event: &Value) -> String {
    let choice = &event["choices"][0];
    choice["delta"]["content"]
        .as_str()
        .or(choice["text"].as_str())
        .unwrap_or("")
        .to_owned()
}

/// Events that carry a generated token.
pub fn content_chunks(events: &[Value]) -> usize {
    events.iter().filter(|e| !chunk_text(e).is_empty()).count()
}
