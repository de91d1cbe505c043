//! One pool of HTTP/1.1 keep-alive connections per upstream graph (see [`super::upstream_conn`]),
//! with connect, first-byte and inter-chunk timeouts (no total timeout: a stream may
//! legitimately run for minutes).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Uri};
use uuid::Uuid;

use super::upstream_conn::{ConnPool, UpstreamFailure, UpstreamResponse};
use crate::endpoint::Endpoint;

/// Timeouts and pool sizes shared by every upstream client.
#[derive(Debug, Clone)]
pub struct UpstreamOptions {
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    /// Longest silence between two reads of a response body (a stalled stream is cut).
    pub chunk_timeout: Duration,
    pub pool_idle_per_host: usize,
}

/// An upstream's base URL (ending in `/v1`) and its connections.
pub struct Upstream {
    pub base_url: String,
    pub first_byte_timeout: Duration,
    /// See [`UpstreamOptions::chunk_timeout`].
    pub chunk_timeout: Duration,
    pool: Arc<ConnPool>,
    /// Request targets by endpoint (in [`Endpoint::ALL`]'s order), checked once (as URIs) when
    /// the upstream is configured.
    paths: [String; 5],
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl Upstream {
    pub fn new(base_url: &str, options: &UpstreamOptions) -> anyhow::Result<Self> {
        let base_url = base_url.trim_end_matches('/').to_owned();
        let invalid = |why: &str| anyhow::anyhow!("upstream URL {base_url:?} is invalid: {why}");
        let uri: Uri = base_url.parse().map_err(|e| invalid(&format!("{e}")))?;
        if uri.scheme_str() != Some("http") {
            return Err(invalid(
                "only http:// is supported (engines are reached inside the cluster network)",
            ));
        }
        let authority = uri.authority().ok_or_else(|| invalid("no host"))?;
        let addr = format!(
            "{}:{}",
            authority.host(),
            authority.port_u16().unwrap_or(80)
        );
        let host =
            HeaderValue::from_str(authority.as_str()).map_err(|e| invalid(&e.to_string()))?;
        let path = |endpoint: Endpoint| -> anyhow::Result<String> {
            let path = format!("{}{}", uri.path().trim_end_matches('/'), endpoint.path());
            path.parse::<Uri>().map_err(|e| invalid(&format!("{e}")))?;
            Ok(path)
        };
        Ok(Self {
            paths: [
                path(Endpoint::ALL[0])?,
                path(Endpoint::ALL[1])?,
                path(Endpoint::ALL[2])?,
                path(Endpoint::ALL[3])?,
                path(Endpoint::ALL[4])?,
            ],
            pool: Arc::new(ConnPool::new(
                addr,
                host,
                options.pool_idle_per_host,
                options.connect_timeout,
            )),
            base_url,
            first_byte_timeout: options.first_byte_timeout,
            chunk_timeout: options.chunk_timeout,
        })
    }

    /// Sends a JSON body to the endpoint and waits for the answer's head.
    pub async fn send(
        &self,
        endpoint: Endpoint,
        request_id: Uuid,
        body: Bytes,
    ) -> Result<UpstreamResponse, UpstreamFailure> {
        self.send_traced(endpoint, request_id, None, body).await
    }

    /// [`Self::send`] with a W3C `traceparent` header (the request's trace, when traces are on).
    pub async fn send_traced(
        &self,
        endpoint: Endpoint,
        request_id: Uuid,
        traceparent: Option<&HeaderValue>,
        body: Bytes,
    ) -> Result<UpstreamResponse, UpstreamFailure> {
        let path = &self.paths[endpoint.index()];
        self.pool.send(path, request_id, traceparent, body).await
    }
}
