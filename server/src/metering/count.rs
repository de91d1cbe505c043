//! Completion tokens the gateway counts itself, for an answer whose engine reported none (an
//! engine that ignores `include_usage`; a stream cut before its final usage on a base with
//! `continuous_usage = false`). Every path counts through ONE function, [`OutputCounter::count`],
//! over the output text the engine sent: a whole JSON answer ([`super::whole`]), a stream and an
//! aborted stream ([`super::meter`]) and both typed protocols ([`super::typed`]). So an engine
//! that puts several tokens in one delta is billed its tokens, not its deltas.
//!
//! With the base's own tokenizer (its `tokenizer.json`) the count is that tokenizer's; without
//! one, words, which no BPE tokenizer counts fewer of: billed `estimated`, never above what a
//! real engine produced, and exact for the simulator (a token is a word there). Each output field
//! of each choice is counted as one text (deltas joined first, so a word split across two deltas
//! is one word, as the engine counted it).

use std::sync::Arc;

use crate::base_tokenizer::BaseTokenizer;

/// Counts output text: the base's tokenizer, else words.
#[derive(Clone, Default)]
pub struct OutputCounter {
    tokenizer: Option<Arc<BaseTokenizer>>,
}

impl std::fmt::Debug for OutputCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputCounter")
            .field("tokenizer", &self.tokenizer.is_some())
            .finish()
    }
}

impl OutputCounter {
    /// A counter by `tokenizer` (the base's), or by words without one.
    pub fn new(tokenizer: Option<Arc<BaseTokenizer>>) -> Self {
        Self { tokenizer }
    }

    /// THE count of generated text (see the module doc).
    pub fn count(&self, text: &str) -> u64 {
        match &self.tokenizer {
            Some(t) => t.count(text, false),
            None => u64::from(tf_engine_sim::tokenizer::count_text(text)),
        }
    }
}

/// Which output text a piece belongs to: a choice's index and its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub choice: u32,
    pub field: Field,
}

/// An output field: what the client reads, each counted as its own text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The message's content, or a completion's text.
    Content,
    /// Reasoning (`reasoning_content`, Responses' reasoning, Anthropic's thinking).
    Reasoning,
    /// Tool-call names and arguments.
    Tool,
}

impl Part {
    pub const fn content(choice: u32) -> Self {
        Self {
            choice,
            field: Field::Content,
        }
    }
}

/// The output text of one answer as it arrives, kept until it is counted. The meter stops
/// keeping it once the engine reports usage (then the engine's count is billed).
#[derive(Debug, Default)]
pub struct OutputTally {
    parts: Vec<(Part, String)>,
}

impl OutputTally {
    /// Appends a piece of `part`'s text (empty pieces are ignored).
    pub fn push(&mut self, part: Part, text: &str) {
        if text.is_empty() {
            return;
        }
        match self.parts.iter_mut().find(|(p, _)| *p == part) {
            Some((_, s)) => s.push_str(text),
            None => self.parts.push((part, text.to_owned())),
        }
    }

    /// Forgets the text (the engine's usage makes it unnecessary).
    pub fn clear(&mut self) {
        self.parts = Vec::new();
    }

    /// The completion tokens of the text so far, each part counted by `counter`.
    pub fn tokens(&self, counter: &OutputCounter) -> u64 {
        self.parts.iter().map(|(_, text)| counter.count(text)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_are_joined_before_counting_and_parts_kept_apart() {
        let mut t = OutputTally::default();
        for piece in [" w1 w2", " w3", "w4", " w5"] {
            t.push(Part::content(0), piece);
        }
        t.push(Part::content(1), "a b");
        t.push(
            Part {
                choice: 0,
                field: Field::Reasoning,
            },
            "r1 r2",
        );
        // "w3w4" is one word: the engine's delta split it, it is one token.
        assert_eq!(t.tokens(&OutputCounter::default()), 4 + 2 + 2);
        t.clear();
        assert_eq!(t.tokens(&OutputCounter::default()), 0);
    }

    #[test]
    fn the_bases_tokenizer_counts_when_it_has_one() {
        let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0},"unk_token":"[UNK]"}}"#;
        let t = Arc::new(BaseTokenizer::from_json(json).unwrap());
        // Words and punctuation apart: "Hello" "," "world" "!".
        assert_eq!(OutputCounter::new(Some(t)).count("Hello, world!"), 4);
        assert_eq!(OutputCounter::default().count("Hello, world!"), 2);
    }
}
