//! The request path's shared state, built once by `app::build` and cloned into every handler.

use std::sync::Arc;

use tokio_util::task::TaskTracker;

use super::auth::KeyCache;
use super::body::BodyTiming;
use super::resolve::RouteTable;
use crate::usage::UsageSink;

/// Shared state of the request path, cheap to clone.
#[derive(Clone)]
pub struct Gateway(Arc<GatewayInner>);

pub struct GatewayInner {
    /// API key -> tenant, cached.
    pub keys: Arc<KeyCache>,
    /// Served name -> upstream, as an atomically swapped snapshot.
    pub routes: Arc<RouteTable>,
    /// Where finished usage events go.
    pub sink: Arc<dyn UsageSink>,
    /// Metering tasks run here so shutdown can wait for them.
    pub tracker: TaskTracker,
    /// Cancelled at the shutdown deadline to cut streams still running.
    pub cut: tokio_util::sync::CancellationToken,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Largest whole JSON answer relayed (`metering::whole`'s large-answer rule).
    pub max_answer_bytes: usize,
    /// How long a request body may take to arrive.
    pub body_timing: BodyTiming,
    /// Admission: rate limits, spend and concurrency caps, shared through Redis.
    pub quota: crate::quota::Quota,
    /// Longest a request for an asleep model is held while it wakes.
    pub hold_limit: std::time::Duration,
    /// Where the cold time-to-first-byte of held requests is observed.
    pub fleet_metrics: Arc<crate::lifecycle::FleetMetrics>,
    /// Request-path series for `/metrics` (answers, latencies, tokens, holds).
    pub metrics: Arc<crate::telemetry::requests::RequestMetrics>,
    /// Opted-in tenants' bodies go here (bounded queue; never waits).
    pub bodies: Arc<crate::bodies::capture::BodyCapture>,
    /// The journal's in-flight log (`None` without a journal): every forwarded request is
    /// written there, so a crash bills what was in flight.
    pub inflight: Option<Arc<crate::journal::inflight::InflightLog>>,
    /// Peers whose `traceparent` is adopted (`telemetry::traces`).
    pub trust_traceparent_from: tf_app::ssr::client_addr::TrustedProxies,
}

impl Gateway {
    pub fn new(inner: GatewayInner) -> Self {
        Self(Arc::new(inner))
    }
}

impl std::ops::Deref for Gateway {
    type Target = GatewayInner;
    fn deref(&self) -> &GatewayInner {
        &self.0
    }
}
