//! The ledger: one entry per finished completion request (completed, cancelled, died or failed),
//! written exactly once by a drop guard. It is the ground truth the gateway's metering is
//! checked against, so `completion_tokens` counts exactly the tokens handed to the response.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::lock::lock;

/// What the engine did for one request.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct LedgerEntry {
    /// The `x-request-id` header the caller sent.
    pub request_id: Option<String>,
    /// The W3C `traceparent` header the caller sent (a traced gateway sends one).
    #[serde(default)]
    pub traceparent: Option<String>,
    /// The requested served name (base or LoRA).
    pub model: String,
    /// The LoRA adapter used, if the name was one.
    pub adapter: Option<String>,
    /// The request's top-level `cache_salt`.
    pub cache_salt: Option<String>,
    /// Whether the response was streamed.
    pub stream: bool,
    /// Prompt tokens by the simulated tokenizer.
    pub prompt_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
    /// Tokens actually produced (handed to the response body).
    pub completion_tokens: u32,
    /// Of those, reasoning tokens (Responses with `reasoning` set: the first half).
    #[serde(default)]
    pub reasoning_tokens: u32,
    /// The client went away before the end.
    pub cancelled: bool,
    /// A fault killed the response.
    pub died: bool,
    /// HTTP status answered.
    pub status: u16,
}

/// The shared, bounded list of entries in completion order.
#[derive(Debug)]
pub struct Ledger {
    capacity: usize,
    entries: Mutex<VecDeque<LedgerEntry>>,
}

impl Ledger {
    /// An empty ledger keeping at most `capacity` entries (the oldest are dropped).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: Mutex::new(VecDeque::new()),
        }
    }

    /// Appends one entry.
    pub fn push(&self, entry: LedgerEntry) {
        let mut entries = lock(&self.entries);
        if entries.len() >= self.capacity {
            entries.pop_front();
        }
        if self.capacity > 0 {
            entries.push_back(entry);
        }
    }

    /// A copy of all entries.
    pub fn snapshot(&self) -> Vec<LedgerEntry> {
        lock(&self.entries).iter().cloned().collect()
    }

    /// Forgets all entries.
    pub fn clear(&self) {
        lock(&self.entries).clear();
    }
}

/// Owns one request's entry while it runs; writes it on [`LedgerGuard::finish`] or, failing
/// that, on drop as cancelled (the client went away), so every request is recorded once.
#[derive(Debug)]
pub struct LedgerGuard {
    ledger: Arc<Ledger>,
    /// The entry being built; handlers update its counters as they go.
    pub entry: LedgerEntry,
    written: bool,
}

impl LedgerGuard {
    /// Starts recording a request.
    pub fn new(ledger: Arc<Ledger>, entry: LedgerEntry) -> Self {
        Self {
            ledger,
            entry,
            written: false,
        }
    }

    /// Writes the entry with its final status (later calls and the drop do nothing).
    pub fn finish(&mut self, status: u16) {
        if !self.written {
            self.written = true;
            self.entry.status = status;
            self.ledger.push(self.entry.clone());
        }
    }
}

impl Drop for LedgerGuard {
    fn drop(&mut self) {
        if !self.written {
            self.entry.cancelled = !self.entry.died;
            self.finish(self.entry.status);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> LedgerEntry {
        LedgerEntry {
            request_id: Some("r".into()),
            traceparent: None,
            model: "m".into(),
            adapter: None,
            cache_salt: None,
            stream: true,
            prompt_tokens: 5,
            cached_tokens: 0,
            completion_tokens: 0,
            reasoning_tokens: 0,
            cancelled: false,
            died: false,
            status: 200,
        }
    }

    #[test]
    fn guard_writes_once_and_marks_drops_cancelled() {
        let ledger = Arc::new(Ledger::new(10));
        let mut done = LedgerGuard::new(ledger.clone(), entry());
        done.finish(200);
        done.finish(500);
        drop(done);
        let mut dropped = LedgerGuard::new(ledger.clone(), entry());
        dropped.entry.completion_tokens = 3;
        drop(dropped);
        let entries = ledger.snapshot();
        assert_eq!(entries.len(), 2);
        assert!(!entries[0].cancelled);
        assert_eq!(entries[0].status, 200);
        assert!(entries[1].cancelled);
        assert_eq!(entries[1].completion_tokens, 3);
    }

    #[test]
    fn capacity_drops_oldest() {
        let ledger = Ledger::new(2);
        for i in 0..3 {
            let mut e = entry();
            e.prompt_tokens = i;
            ledger.push(e);
        }
        let kept: Vec<u32> = ledger.snapshot().iter().map(|e| e.prompt_tokens).collect();
        assert_eq!(kept, vec![1, 2]);
        ledger.clear();
        assert!(ledger.snapshot().is_empty());
    }
}
