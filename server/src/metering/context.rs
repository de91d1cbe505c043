//! The accounting of one request: [`MeterContext`] finishes its usage event (counts, outcome,
//! the quota's settlement, the sink), and [`Pending`] holds it while the upstream exchange runs,
//! so a client that hangs up (hyper drops the handler) is still recorded, on the tracker. The
//! accounting never depends on the client staying.

use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;

use crate::usage::{Provenance, Usage, UsageEvent, UsageSink, UsageStatus};

/// Everything needed to finish the usage event of one request.
pub struct MeterContext {
    /// The event with identity fields filled and zero tokens.
    pub event: UsageEvent,
    pub started: Instant,
    /// Prompt tokens counted by the gateway (the base's tokenizer, else the prompt's words: a
    /// count no BPE tokenizer goes below), computed only if the engine never reported usage.
    pub estimate_prompt: Box<dyn FnOnce() -> u64 + Send>,
    /// Counts completion tokens from the output when the engine reports none (the base's
    /// tokenizer, else words): the one count of [`super::count`].
    pub counter: super::count::OutputCounter,
    pub sink: Arc<dyn UsageSink>,
    /// Fires at the shutdown deadline: the stream is cut, billed and ended with an error event.
    pub cut: tokio_util::sync::CancellationToken,
    /// The request's hold on its limits: settled from the final event below; dropped unsettled
    /// (error path, panic) it frees its slots by itself.
    pub admitted: Option<crate::quota::Admitted>,
    /// Where a hung-up stream's accounting runs (shutdown waits for it).
    pub tracker: tokio_util::task::TaskTracker,
    /// The mark that keeps the request's graph awake (`in_use`): never read, dropped with the
    /// accounting.
    #[allow(dead_code, reason = "held for its Drop")]
    pub holds: Option<super::in_use::InUse>,
    /// Called once with the time since `started` when the first generated token reaches the
    /// meter (a streamed answer's first content chunk); `None` for almost every request (the
    /// gateway sets it on requests held for a wake: the cold time to first token).
    pub first_token: Option<Box<dyn FnOnce(std::time::Duration) + Send>>,
    /// The request's in-flight record (the journal's `inflight` log): progress is written while
    /// it streams; dropped after the event is recorded, it writes the request's end.
    pub inflight: Option<crate::journal::inflight::Ticket>,
    /// The in-flight log and the prompt estimate, until the engine answers: the record starts
    /// then, never before (a crash before the engine had the request bills nothing for it).
    pub inflight_start: Option<(std::sync::Arc<crate::journal::inflight::InflightLog>, u64)>,
    /// The request's span, where the outcome's trace attributes go (token usage); a disabled
    /// span when traces are off.
    pub span: tracing::Span,
}

impl MeterContext {
    /// Fills in counts and outcome and hands the event to the sink. `usage_final`: `usage` is the
    /// engine's final count (else its last running one); `generated`: completion tokens counted
    /// by the gateway, billed when the engine reported no usage.
    pub async fn settle(
        self,
        usage: Option<Usage>,
        usage_final: bool,
        generated: u64,
        status: UsageStatus,
        ttft_ms: Option<i32>,
    ) -> UsageEvent {
        let admitted = self.admitted;
        let inflight = self.inflight;
        let mut event = self.event;
        let (prompt, cached, completion, reasoning, provenance) = match usage {
            Some(u) => (
                u.prompt_tokens,
                u.cached_tokens(),
                u.completion_tokens,
                u.reasoning_tokens(),
                if usage_final {
                    Provenance::Engine
                } else {
                    Provenance::Partial
                },
            ),
            None => (
                (self.estimate_prompt)(),
                0,
                generated,
                0,
                Provenance::Estimated,
            ),
        };
        event.prompt_tokens = clamp_i64(prompt);
        event.cached_tokens = clamp_i64(cached);
        event.completion_tokens = clamp_i64(completion);
        event.reasoning_tokens = clamp_i64(reasoning);
        event.provenance = provenance;
        event.status = status;
        event.ttft_ms = ttft_ms;
        event.duration_ms = i32::try_from(self.started.elapsed().as_millis()).unwrap_or(i32::MAX);
        crate::telemetry::traces::record_usage(&self.span, &event);
        // Quota first: the spend is queued for Redis before the event exists, and every writer
        // to PostgreSQL waits until Redis has it (`Quota::spend_flushed`), so Redis never counts
        // less than PostgreSQL has billed and the reconciler only ever raises counters.
        if let Some(admitted) = admitted {
            admitted
                .settle(tf_core::money::Quantities {
                    fresh: event.prompt_tokens - event.cached_tokens,
                    cached: event.cached_tokens,
                    output: event.completion_tokens,
                })
                .await;
        }
        match self.sink.record(&event).await {
            // The end is written once the event is in the journal.
            Ok(()) => drop(inflight),
            Err(e) => {
                tracing::error!(request_id = %event.request_id, error = %e, "usage event not recorded");
                // Left in flight: the next start bills it from its last progress.
                if let Some(ticket) = inflight {
                    ticket.keep_open();
                }
            }
        }
        event
    }
}

fn clamp_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A request's accounting while the exchange runs. Dropped with it still inside (the client hung
/// up), it records a client abort on the tracker.
pub struct Pending {
    ctx: Option<MeterContext>,
    /// The engine answered: a later abort bills the estimated prompt (the engine had it).
    answered: bool,
}

impl Pending {
    pub fn new(ctx: MeterContext) -> Self {
        Self {
            ctx: Some(ctx),
            answered: false,
        }
    }

    /// The shutdown deadline's token (cancelled when streams and bodies still reading are cut).
    pub fn cut(&self) -> tokio_util::sync::CancellationToken {
        self.ctx.as_ref().map(|c| c.cut.clone()).unwrap_or_default()
    }

    /// Hands the context on (to a metered stream, or to [`settle`]).
    pub fn take(&mut self) -> Option<MeterContext> {
        self.ctx.take()
    }

    /// The engine answered: from now on a hang-up bills the estimated prompt.
    pub fn mark_answered(&mut self) {
        self.answered = true;
        if let Some(ctx) = &mut self.ctx {
            if let Some((log, prompt)) = ctx.inflight_start.take() {
                ctx.inflight = Some(log.start(&ctx.event, prompt));
            }
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(mut ctx) = self.ctx.take() else {
            return;
        };
        if !self.answered {
            // INVARIANT: never bill more than the engine produced. Hung up before the engine
            // answered, the gateway cannot prove the engine ever had the request (it may still
            // be in flight), so the event records the abort with zero tokens: under-billing is
            // the safe side. Test: reconciliation::every_event_matches_the_engine_ledger.
            ctx.estimate_prompt = Box::new(|| 0);
        }
        let tracker = ctx.tracker.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                tracker.spawn_on(
                    ctx.settle(None, false, 0, UsageStatus::ClientAbort, None)
                        .map(drop),
                    &handle,
                );
            }
            Err(_) => tracing::error!("usage event dropped: no runtime to record it on"),
        }
    }
}

/// Records the event without letting a hang-up cancel it: inline when recording completes at
/// once (the usual case: the journal appends on the caller's task), else on the tracker, awaited.
pub async fn settle(
    ctx: MeterContext,
    usage: Option<Usage>,
    usage_final: bool,
    generated: u64,
    status: UsageStatus,
) {
    let request_id = ctx.event.request_id;
    let tracker = ctx.tracker.clone();
    let mut record = ctx
        .settle(usage, usage_final, generated, status, None)
        .map(drop)
        .boxed();
    if (&mut record).now_or_never().is_some() {
        return;
    }
    if let Err(e) = tracker.spawn(record).await {
        tracing::error!(%request_id, error = %e, "recording a usage event failed");
    }
}
