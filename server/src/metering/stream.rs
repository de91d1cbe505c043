//! A metered streamed response: the response body itself reads the upstream, meters each event
//! and yields what the client receives, so a chunk costs no task hop or channel. The accounting
//! never depends on the client staying: when the body is dropped unfinished (the client hung up),
//! its `Drop` half-closes the upstream connection (the engine sees end-of-file and cancels at
//! once) and, on a tracked task, reads what the engine sent until it stopped, then records the
//! event. The event is recorded before the stream's final bytes are released.
//!
//! An engine that falls silent is not waited on forever: after the inter-chunk timeout (the
//! first-byte timeout, if longer, before the first body bytes) the stream ends as an upstream
//! failure, with an SSE error event, billed for what it produced. An engine that sent its final
//! usage but closed the stream without `[DONE]` (or without the blank line after it) completed:
//! the client gets a proper `[DONE]` and the event is `ok`.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use tokio_util::sync::WaitForCancellationFutureOwned;
use tokio_util::task::TaskTracker;

use super::context::MeterContext;
use super::meter::{Outgoing, StreamMeter};
use super::sse::SseParser;
use super::typed::Dialect;
use crate::usage::UsageStatus;

/// The engine's response body as the stream reads it: its bytes, and a way to tell the engine the
/// client left while the body stays readable (so what it produced until it stopped is billed).
/// Dropping the body closes the connection; a body that reached its end may be reused.
pub trait EngineBody: Stream<Item = Result<Bytes, Self::Error>> + Unpin + Send + 'static {
    type Error: std::fmt::Display;
    fn half_close(&mut self);
}

/// The SSE event a client receives when the upstream breaks mid-stream.
const UPSTREAM_ERROR_EVENT: &[u8] = b"data: {\"error\":{\"message\":\"The model backend failed during generation.\",\"type\":\"api_error\",\"param\":null,\"code\":\"upstream_error\"}}\n\n";
/// How long a half-closed upstream may keep sending before its connection is closed outright.
const HANG_UP_READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);
/// The SSE event a client receives when the upstream fell silent for longer than allowed.
const UPSTREAM_STALLED_EVENT: &[u8] = b"data: {\"error\":{\"message\":\"The model backend stopped sending during generation.\",\"type\":\"api_error\",\"param\":null,\"code\":\"upstream_timeout\"}}\n\n";
/// The end a client receives when the engine completed without sending `[DONE]` itself.
const DONE_EVENT: &[u8] = b"data: [DONE]\n\n";
/// The SSE event a client receives when shutdown cuts its stream.
const CUT_EVENT: &[u8] = b"data: {\"error\":{\"message\":\"The server is restarting; the response was cut.\",\"type\":\"service_unavailable\",\"param\":null,\"code\":\"server_shutdown\"}}\n\n";

/// How a stream ended.
enum End {
    /// `[DONE]` (or the end of a stream after it), with the final bytes if any.
    Complete(Option<Bytes>),
    ClientGone,
    UpstreamBroken,
    /// No bytes from the upstream for longer than the inter-chunk timeout.
    UpstreamStalled,
    Cut,
}

/// How long the upstream may stay silent.
#[derive(Debug, Clone, Copy)]
pub struct Silence {
    /// Before the first body bytes (the engine may still be queueing or prefilling).
    pub first: Duration,
    /// Between two reads once bytes flow.
    pub between: Duration,
}

enum State<B> {
    Reading {
        upstream: Box<B>,
        ctx: Box<MeterContext>,
    },
    /// The event is being recorded; `tail` is released once it is.
    Settling {
        record: BoxFuture<'static, ()>,
        tail: Option<Bytes>,
        /// A completed stream's upstream whose body end has not arrived yet.
        upstream: Option<Box<B>>,
    },
    Finished,
}

/// The body of a streamed response (see the module doc).
pub struct MeteredStream<B: EngineBody> {
    state: State<B>,
    parser: SseParser,
    meter: StreamMeter,
    /// Bytes ready for the client.
    ready: VecDeque<Bytes>,
    scratch: Vec<Outgoing>,
    ttft: Option<i32>,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    tracker: TaskTracker,
    silence: Silence,
    /// When the upstream last sent bytes (or the stream started).
    last_read: tokio::time::Instant,
    got_bytes: bool,
    /// Fires at the earliest moment the upstream can have been silent too long; re-armed only
    /// when it fires (not per chunk), from `last_read`.
    stall_timer: Pin<Box<tokio::time::Sleep>>,
}

impl<B: EngineBody> MeteredStream<B> {
    pub fn new(upstream: B, meter: StreamMeter, ctx: MeterContext, silence: Silence) -> Self {
        let now = tokio::time::Instant::now();
        Self {
            silence,
            last_read: now,
            got_bytes: false,
            stall_timer: Box::pin(tokio::time::sleep_until(now + silence.first)),
            cut: Box::pin(ctx.cut.clone().cancelled_owned()),
            tracker: ctx.tracker.clone(),
            state: State::Reading {
                upstream: Box::new(upstream),
                ctx: Box::new(ctx),
            },
            parser: SseParser::default(),
            meter,
            ready: VecDeque::new(),
            scratch: Vec::with_capacity(4),
            ttft: None,
        }
    }

    /// The whole answer its meter assembled (see [`StreamMeter::assembling`]); `None` once the
    /// meter went to record a hang-up or a cut.
    pub fn take_assembler(&mut self) -> Option<super::assemble::Assembler> {
        self.meter.take_assembler()
    }

    /// Meters one upstream read; returns the final bytes (`[DONE]`) if the stream completed in it.
    fn absorb(&mut self, bytes: Bytes, started: Instant) -> Option<Bytes> {
        self.parser.push(bytes);
        while let Some(event) = self.parser.next_event() {
            self.meter.on_event(event, &mut self.scratch);
        }
        if self.ttft.is_none() && self.meter.generated_chunks() > 0 {
            self.ttft = Some(ms_since(started));
            if let State::Reading { ctx, .. } = &mut self.state {
                if let Some(first_token) = ctx.first_token.take() {
                    first_token(started.elapsed());
                }
            }
        }
        if let State::Reading { ctx, .. } = &mut self.state {
            if let Some(ticket) = &mut ctx.inflight {
                ticket.progress(|| self.meter.progress());
            }
        }
        for o in self.scratch.drain(..) {
            match o {
                Outgoing::Send(b) => self.ready.push_back(b),
                Outgoing::Done(b) => return Some(b),
            }
        }
        None
    }

    /// The upstream's body ended: complete if `[DONE]` came (perhaps without its blank line) or
    /// the engine's final usage did; else the stream broke.
    fn end_of_body(&mut self) -> End {
        if let Some(event) = self.parser.finish() {
            self.meter.on_event(event, &mut self.scratch);
        }
        let done = self.meter.completed();
        if !done && self.meter.usage_final() && !self.meter.saw_error() {
            self.meter.on_end(&mut self.scratch);
        }
        let mut tail = None;
        for o in self.scratch.drain(..) {
            match o {
                Outgoing::Send(b) => self.ready.push_back(b),
                Outgoing::Done(b) if self.meter.dialect() != Dialect::Chunks => tail = Some(b),
                Outgoing::Done(_) => tail = Some(Bytes::from_static(DONE_EVENT)),
            }
        }
        if done || (self.meter.usage_final() && !self.meter.saw_error()) {
            End::Complete(tail.or_else(|| self.done_event()))
        } else {
            End::UpstreamBroken
        }
    }

    /// The end a client gets when the engine completed without sending its own: chunks'
    /// `[DONE]`; typed-event protocols have none.
    fn done_event(&self) -> Option<Bytes> {
        (self.meter.dialect() == Dialect::Chunks).then(|| Bytes::from_static(DONE_EVENT))
    }

    /// One of the chunk error events above, in the stream's own protocol.
    fn error_event(&self, chunks: &'static [u8]) -> Bytes {
        let dialect = self.meter.dialect();
        if dialect == Dialect::Chunks {
            return Bytes::from_static(chunks);
        }
        // The constants are the gateway's own JSON: their fields are read back, not re-typed.
        let parsed: serde_json::Value = std::str::from_utf8(chunks)
            .ok()
            .and_then(|t| t.strip_prefix("data: "))
            .and_then(|t| serde_json::from_str(t.trim_end()).ok())
            .unwrap_or_default();
        let field = |name: &str| {
            parsed["error"][name]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        dialect.error_event(&field("type"), &field("code"), &field("message"))
    }

    /// Whether the upstream has been silent too long (re-arming the timer when it fired early).
    fn stalled(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.stall_timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            let limit = if self.got_bytes {
                self.silence.between
            } else {
                self.silence.first
            };
            let deadline = self.last_read + limit;
            if tokio::time::Instant::now() >= deadline {
                return true;
            }
            self.stall_timer.as_mut().reset(deadline);
        }
    }

    /// Ends the stream and starts recording the event. A completed stream's connection goes back
    /// to the pool; a hung-up or cut one is half-closed (the engine stops) and read to its end.
    fn finish(&mut self, end: End) {
        let State::Reading { mut upstream, ctx } =
            std::mem::replace(&mut self.state, State::Finished)
        else {
            return;
        };
        let status = match (&end, self.meter.saw_error()) {
            (End::ClientGone, _) => UsageStatus::ClientAbort,
            (End::Cut, _) => UsageStatus::Interrupted,
            (End::UpstreamBroken | End::UpstreamStalled, _) | (_, true) => {
                UsageStatus::UpstreamError
            }
            (End::Complete(_), false) => UsageStatus::Ok,
        };
        // A chunk the meter still holds back is not sent on a broken or cut stream: the client
        // gets the error event instead. INVARIANT: recorded before the final bytes leave
        // (test: reconciliation).
        let (tail, completed) = match end {
            End::Complete(done) => (done, true),
            End::ClientGone => (None, false),
            End::UpstreamBroken => (Some(self.error_event(UPSTREAM_ERROR_EVENT)), false),
            End::UpstreamStalled => (Some(self.error_event(UPSTREAM_STALLED_EVENT)), false),
            End::Cut => (Some(self.error_event(CUT_EVENT)), false),
        };
        let ttft = self.ttft;
        crate::telemetry::traces::record_finish_reasons(&ctx.span, self.meter.finish_reasons());
        if matches!(status, UsageStatus::ClientAbort | UsageStatus::Interrupted) {
            // INVARIANT: an aborted stream bills every token the engine sent before it saw the
            // hang-up, including those still on the wire (test: reconciliation, exact for
            // engine counts).
            upstream.half_close();
            let parser = std::mem::take(&mut self.parser);
            let meter = std::mem::take(&mut self.meter);
            let record = async move {
                let meter = read_to_end(upstream, parser, meter).await;
                let usage = meter.last_usage();
                ctx.settle(
                    usage,
                    meter.usage_final(),
                    meter.generated_tokens(),
                    status,
                    ttft,
                )
                .await;
            }
            .boxed();
            self.state = State::Settling {
                record,
                tail,
                upstream: None,
            };
            return;
        }
        // Dropping a broken response closes its connection. A completed stream's connection goes
        // back to the pool once its body's end has arrived (usually with `[DONE]`; else by the
        // time the event is recorded).
        let upstream = (completed && !drained(&mut *upstream)).then_some(upstream);
        let mut ctx = ctx;
        if self.meter.saw_error()
            && self.meter.last_usage().is_none()
            && self.meter.generated_chunks() == 0
        {
            // The engine's error came before any output or count: it produced nothing to bill
            // (as an error answered instead of a stream).
            ctx.estimate_prompt = Box::new(|| 0);
        }
        let record = ctx
            .settle(
                self.meter.last_usage(),
                self.meter.usage_final(),
                self.meter.generated_tokens(),
                status,
                ttft,
            )
            .map(drop)
            .boxed();
        self.state = State::Settling {
            record,
            tail,
            upstream,
        };
    }
}

/// Meters what a half-closed upstream still sends: the engine's output up to the moment it saw
/// the hang-up. Bounded, for an engine that keeps generating after end-of-file.
async fn read_to_end<B: EngineBody>(
    mut upstream: Box<B>,
    mut parser: SseParser,
    mut meter: StreamMeter,
) -> StreamMeter {
    let mut discard = Vec::new();
    let read = async {
        while let Some(Ok(bytes)) = upstream.next().await {
            parser.push(bytes);
            while let Some(event) = parser.next_event() {
                meter.on_event(event, &mut discard);
            }
            discard.clear();
        }
        if let Some(event) = parser.finish() {
            meter.on_event(event, &mut discard);
        }
    };
    if tokio::time::timeout(HANG_UP_READ_LIMIT, read)
        .await
        .is_err()
    {
        tracing::warn!("upstream kept streaming after the hang-up; closed");
    }
    meter
}

/// Reads what already arrived of a finished stream's upstream without waiting; true once its
/// body ended (its connection is then back in the pool).
fn drained<B: EngineBody>(upstream: &mut B) -> bool {
    loop {
        match upstream.next().now_or_never() {
            Some(Some(Ok(_))) => continue,
            Some(None) => return true,
            Some(Some(Err(_))) | None => return false,
        }
    }
}

fn ms_since(start: Instant) -> i32 {
    i32::try_from(start.elapsed().as_millis()).unwrap_or(i32::MAX)
}

impl<B: EngineBody> Stream for MeteredStream<B> {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(b) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(b)));
            }
            match &mut this.state {
                State::Finished => return Poll::Ready(None),
                State::Settling {
                    record,
                    tail,
                    upstream,
                } => {
                    std::task::ready!(record.as_mut().poll(cx));
                    if let Some(mut u) = upstream.take() {
                        // Last chance to pool the connection; dropped unfinished, it is closed.
                        drained(&mut *u);
                    }
                    this.ready.extend(tail.take());
                    this.state = State::Finished;
                }
                State::Reading { upstream, ctx } => {
                    if this.cut.as_mut().poll(cx).is_ready() {
                        this.finish(End::Cut);
                        continue;
                    }
                    let (started, request_id) = (ctx.started, ctx.event.request_id);
                    let end = match upstream.poll_next_unpin(cx) {
                        Poll::Pending => {
                            if !this.stalled(cx) {
                                return Poll::Pending;
                            }
                            tracing::warn!(
                                %request_id,
                                "upstream fell silent mid-stream; cut"
                            );
                            End::UpstreamStalled
                        }
                        Poll::Ready(Some(Ok(bytes))) => {
                            this.last_read = tokio::time::Instant::now();
                            if !this.got_bytes {
                                // The shorter limit starts: the timer still waits for the first.
                                this.got_bytes = true;
                                let deadline = this.last_read + this.silence.between;
                                this.stall_timer.as_mut().reset(deadline);
                            }
                            match this.absorb(bytes, started) {
                                Some(done) => End::Complete(Some(done)),
                                None => continue,
                            }
                        }
                        Poll::Ready(Some(Err(e))) => {
                            tracing::warn!(error = %e, "upstream stream broke");
                            End::UpstreamBroken
                        }
                        Poll::Ready(None) if this.meter.completed() => End::Complete(None),
                        Poll::Ready(None) => this.end_of_body(),
                    };
                    this.finish(end);
                }
            }
        }
    }
}

impl<B: EngineBody> Drop for MeteredStream<B> {
    fn drop(&mut self) {
        // The client went away (or the response was never sent): the accounting still runs.
        if matches!(self.state, State::Reading { .. }) {
            self.finish(End::ClientGone);
        }
        if let State::Settling { record, .. } = std::mem::replace(&mut self.state, State::Finished)
        {
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => {
                    self.tracker.spawn_on(record, &handle);
                }
                Err(_) => tracing::error!("usage event dropped: no runtime to record it on"),
            }
        }
    }
}
