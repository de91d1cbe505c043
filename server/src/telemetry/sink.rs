//! A usage sink that observes every finished request's event for the metrics, then hands it to
//! the real sink. The metering code is unchanged: every request that reaches admission ends in
//! exactly one event, so counting here counts each once.

use std::sync::Arc;

use super::requests::RequestMetrics;
use crate::usage::{SinkFuture, UsageEvent, UsageSink};

pub struct ObservedSink {
    pub inner: Arc<dyn UsageSink>,
    pub metrics: Arc<RequestMetrics>,
}

impl UsageSink for ObservedSink {
    fn record<'a>(&'a self, event: &'a UsageEvent) -> SinkFuture<'a> {
        self.metrics.finished(event);
        self.inner.record(event)
    }
}
