//! A request refused at admission still appears in the tenant's request log: as a usage event
//! with status `rejected` and zero tokens. A sink failure is logged; the refusal stands either way.

use crate::usage::{UsageEvent, UsageSink, UsageStatus};

/// Records a refused request (the event as built for it, with no tokens counted).
pub async fn record_refusal(
    sink: &dyn UsageSink,
    mut event: UsageEvent,
    started: std::time::Instant,
) {
    event.status = UsageStatus::Rejected;
    event.duration_ms = i32::try_from(started.elapsed().as_millis()).unwrap_or(i32::MAX);
    if let Err(e) = sink.record(&event).await {
        tracing::warn!(request_id = %event.request_id, error = %e, "refused request not recorded");
    }
}
