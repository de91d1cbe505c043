//! Streamed (SSE) generation, lazily: each token is generated when hyper polls the body for the
//! next chunk, so a client that goes away stops generation at once. The stream state owns the
//! request's ledger guard; whatever way the stream ends (done, died, dropped), the entry is
//! written once, counting exactly the token chunks handed to the body.

use std::io;

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;

use crate::engine::Job;
use crate::faults::LineEnding;
use crate::openai::{sse_event, Usage, SSE_DONE};
use crate::reply::{token_text, Reply};
use crate::typed_reply::TypedReply;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Prefill,
    Tokens,
    Usage,
    Done,
    End,
}

#[derive(Debug)]
struct Generation {
    job: Job,
    reply: Reply,
    phase: Phase,
    text: String,
}

/// The `200 text/event-stream` response whose body generates the tokens.
pub fn response(mut job: Job, reply: Reply) -> Response {
    job.guard.entry.status = 200;
    let ending = job.line_ending;
    let state = Generation {
        job,
        reply,
        phase: Phase::Prefill,
        text: String::with_capacity(16),
    };
    let body = futures::stream::unfold(state, |mut g| async move {
        let item = g.step().await?;
        Some((item, g))
    });
    let mut response = Response::new(Body::from_stream(reframed(body, ending)));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The stream with every line ending written as `ending` (the events are built with `\n`; no
/// JSON they carry holds a raw newline).
fn reframed(
    body: impl futures::Stream<Item = Result<Bytes, io::Error>> + Send + 'static,
    ending: LineEnding,
) -> impl futures::Stream<Item = Result<Bytes, io::Error>> + Send + 'static {
    use futures::StreamExt;
    body.map(move |item| {
        item.map(|b| {
            if ending == LineEnding::Lf {
                return b;
            }
            let mut out = Vec::with_capacity(b.len() + 8);
            for &byte in b.iter() {
                if byte == b'\n' {
                    out.extend_from_slice(ending.bytes());
                } else {
                    out.push(byte);
                }
            }
            Bytes::from(out)
        })
    })
}

impl Generation {
    /// The next body item, or `None` at the end.
    async fn step(&mut self) -> Option<Result<Bytes, io::Error>> {
        loop {
            match self.phase {
                Phase::Prefill => {
                    self.job.prefill().await;
                    self.phase = Phase::Tokens;
                    if self.reply.chat {
                        let usage = self.running_usage();
                        return Some(Ok(self.reply.chunk(true, "", None, usage)));
                    }
                }
                Phase::Tokens => {
                    if self.job.produced() >= self.job.target {
                        self.phase = Phase::Usage;
                        if self.job.target == 0 {
                            // Nothing generated: one empty chunk still carries the finish reason.
                            let usage = self.running_usage().or(self.last_chunk_usage());
                            let finish = Some(self.job.finish_reason);
                            return Some(Ok(self.reply.chunk(false, "", finish, usage)));
                        }
                        continue;
                    }
                    if self.job.dies_now() {
                        return Some(Err(self.die().await));
                    }
                    if self.job.errors_now() {
                        // vLLM's streaming error: an error object, then `[DONE]`.
                        self.job.guard.entry.died = true;
                        self.phase = Phase::Done;
                        return Some(Ok(sse_event(&serde_json::json!({
                            "object": "error",
                            "message": "Simulated engine error during generation.",
                            "type": "InternalServerError",
                            "param": null,
                            "code": 500,
                        }))));
                    }
                    if self.job.hangs_now() {
                        std::future::pending::<()>().await;
                    }
                    self.text.clear();
                    let mut in_delta = 0;
                    while !self.job.delta_ends(in_delta) {
                        self.job.wait_next().await;
                        token_text(self.job.produced(), &mut self.text);
                        self.job.commit();
                        in_delta += 1;
                    }
                    let last = self.job.produced() >= self.job.target;
                    let finish = last.then_some(self.job.finish_reason);
                    let usage = if last {
                        self.running_usage().or(self.last_chunk_usage())
                    } else {
                        self.running_usage()
                    };
                    return Some(Ok(self.reply.chunk(false, &self.text, finish, usage)));
                }
                Phase::Usage => {
                    self.phase = Phase::Done;
                    if self.reply.include_usage && !self.reply.usage_on_last_chunk {
                        return Some(Ok(self.reply.usage_chunk(self.usage())));
                    }
                }
                Phase::Done => {
                    self.job.guard.finish(200);
                    self.phase = Phase::End;
                    return Some(Ok(Bytes::from_static(SSE_DONE)));
                }
                Phase::End => return None,
            }
        }
    }

    /// Records the death, lets hyper flush what was already handed over, then breaks the body.
    async fn die(&mut self) -> io::Error {
        self.phase = Phase::End;
        self.job.guard.entry.died = true;
        self.job.guard.finish(200);
        tokio::task::yield_now().await;
        io::Error::other("simulated engine death")
    }

    fn usage(&self) -> Usage {
        let entry = &self.job.guard.entry;
        Usage::new(
            entry.prompt_tokens,
            entry.cached_tokens,
            entry.completion_tokens,
        )
    }

    /// Running usage on every chunk when continuous usage was asked for.
    fn running_usage(&self) -> Option<Usage> {
        self.reply.continuous_usage.then(|| self.usage())
    }

    /// Final usage on the last content chunk when that knob is on.
    fn last_chunk_usage(&self) -> Option<Usage> {
        self.reply.usage_on_last_chunk.then(|| self.usage())
    }
}

/// A typed-event stream (Responses, Anthropic Messages) being generated.
#[derive(Debug)]
struct TypedGeneration {
    job: Job,
    reply: TypedReply,
    phase: Phase,
    /// The whole text so far (Responses' final event repeats it).
    text: String,
    token: String,
}

/// The `200 text/event-stream` response of a typed endpoint; same lazy generation and ledger
/// rules as [`response`].
pub fn typed_response(mut job: Job, reply: TypedReply) -> Response {
    job.guard.entry.status = 200;
    let ending = job.line_ending;
    let state = TypedGeneration {
        job,
        reply,
        phase: Phase::Prefill,
        text: String::new(),
        token: String::with_capacity(16),
    };
    let body = futures::stream::unfold(state, |mut g| async move {
        let item = g.step().await?;
        Some((item, g))
    });
    let mut response = Response::new(Body::from_stream(reframed(body, ending)));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

impl TypedGeneration {
    async fn step(&mut self) -> Option<Result<Bytes, io::Error>> {
        match self.phase {
            Phase::Prefill => {
                self.job.prefill().await;
                self.phase = Phase::Tokens;
                Some(Ok(self.reply.start(self.job.counts())))
            }
            Phase::Tokens => {
                if self.job.produced() >= self.job.target {
                    self.job.guard.finish(200);
                    self.phase = Phase::End;
                    let counts = self.job.counts();
                    return Some(Ok(self.reply.end(
                        &self.text,
                        self.job.finish_reason,
                        counts,
                    )));
                }
                if self.job.dies_now() {
                    self.phase = Phase::End;
                    self.job.guard.entry.died = true;
                    self.job.guard.finish(200);
                    tokio::task::yield_now().await;
                    return Some(Err(io::Error::other("simulated engine death")));
                }
                if self.job.hangs_now() {
                    std::future::pending::<()>().await;
                }
                self.token.clear();
                let mut in_delta = 0;
                while in_delta == 0 || !self.job.delta_ends(in_delta) {
                    self.job.wait_next().await;
                    token_text(self.job.produced(), &mut self.token);
                    self.job.commit();
                    in_delta += 1;
                }
                self.text.push_str(&self.token);
                Some(Ok(self.reply.delta(&self.token)))
            }
            Phase::Usage | Phase::Done | Phase::End => None,
        }
    }
}
