//! Reading a request body after the key was checked: bounded in size (413 as soon as the declared
//! or received length passes the limit) and in time, by a minimum rate, so a client that stalls
//! mid-body holds neither memory nor a connection for long.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::error::GatewayError;

/// How long a body may take: `base`, plus the time its bytes take at `min_bytes_per_sec`
/// (defaults: `GatewayOptions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyTiming {
    pub base: Duration,
    pub min_bytes_per_sec: u64,
}

impl BodyTiming {
    /// The time allowed for the first `received` bytes.
    pub fn allowed(&self, received: u64) -> Duration {
        let rate = self.min_bytes_per_sec.max(1);
        self.base + Duration::from_millis(received.saturating_mul(1000) / rate)
    }
}

/// Reads the whole body, or fails with 413 (too large), 408 (too slow) or 400 (broken).
pub async fn read(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timing: BodyTiming,
) -> Result<Bytes, GatewayError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(GatewayError::PayloadTooLarge(limit));
    }
    let started = Instant::now();
    let mut body = body;
    // Most bodies arrive as one frame: one exact-sized copy.
    let mut first: Option<Bytes> = None;
    let mut rest = BytesMut::new();
    let mut received = 0usize;
    loop {
        let deadline = started + timing.allowed(received as u64);
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(GatewayError::BodyTimeout),
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                tracing::debug!(error = %e, "request body read failed");
                return Err(GatewayError::bad_request(
                    "The request body could not be read.",
                    None,
                ));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        received += data.len();
        if received > limit {
            return Err(GatewayError::PayloadTooLarge(limit));
        }
        match &first {
            // Copied out: a frame is a slice of the connection's read buffer, and the body is
            // kept for the whole response (the prompt estimate), which would keep that buffer
            // from being reused and make hyper allocate a second one for the connection.
            None if rest.is_empty() => first = Some(Bytes::copy_from_slice(&data)),
            _ => {
                if let Some(f) = first.take() {
                    rest.reserve(declared.map_or(0, |n| n as usize).max(received));
                    rest.extend_from_slice(&f);
                }
                rest.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| rest.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_base_plus_the_bytes_at_the_minimum_rate() {
        let t = BodyTiming {
            base: Duration::from_secs(2),
            min_bytes_per_sec: 1000,
        };
        assert_eq!(t.allowed(0), Duration::from_secs(2));
        assert_eq!(t.allowed(1500), Duration::from_millis(3500));
    }
}
