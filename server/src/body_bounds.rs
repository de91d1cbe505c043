//! Request bodies of every route outside `/v1` (portal forms, server functions under `/api`,
//! login, `/api/v1`), bounded like `/v1`'s (`gateway::body`): in size (413 when the declared or
//! received length passes the bound) and in time, so a client trickling a body holds neither
//! memory nor a connection for long, signed in or not. The request head has its own deadline
//! (`http_server`).
//!
//! Forms and server-function calls are small: they are read whole here, before any handler,
//! within the body deadline (`base` plus the bytes at the minimum rate). Adapter uploads
//! (`POST /api/v1/adapters`, `POST /models/upload`) are large and streamed to storage, so they get
//! no fixed deadline but a minimum rate: the average since the start must stay above it and no
//! pause may last longer than `base`. A slow multi-gigabyte upload is cut; a fast one is not.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::gateway::body::BodyTiming;
use crate::gateway::error::GatewayError;

/// The bounds of one kind of body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// Largest body, in bytes.
    pub max_bytes: u64,
    /// Time allowed: `base`, plus the bytes at the minimum rate.
    pub timing: BodyTiming,
}

/// Bounds on the bodies of forms and of adapter uploads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyBounds {
    /// Portal forms, server functions, `/api/v1` calls other than uploads: read whole.
    pub form: Bound,
    /// Adapter uploads: streamed, a minimum rate and no pause longer than `timing.base`.
    pub upload: Bound,
}

/// Applies `bounds` to every route of `router` (not `/v1`, which bounds its own bodies after
/// the key is checked).
pub fn bound(router: Router, bounds: BodyBounds) -> Router {
    router.layer(axum::middleware::from_fn_with_state(
        Arc::new(bounds),
        bound_body,
    ))
}

/// The routes that upload adapter files.
fn is_upload(method: &Method, path: &str) -> bool {
    method == Method::POST && matches!(path, "/api/v1/adapters" | "/models/upload")
}

async fn bound_body(State(bounds): State<Arc<BodyBounds>>, req: Request, next: Next) -> Response {
    let upload = is_upload(req.method(), req.uri().path());
    let bound = if upload { bounds.upload } else { bounds.form };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > bound.max_bytes) {
        return too_large(bound.max_bytes);
    }
    let (parts, body) = req.into_parts();
    let body = if upload {
        Body::new(RateBounded::new(body, bound))
    } else {
        let limit = usize::try_from(bound.max_bytes).unwrap_or(usize::MAX);
        match crate::gateway::body::read(&parts.headers, body, limit, bound.timing).await {
            Ok(bytes) => Body::from(bytes),
            Err(e) => return refused(e),
        }
    };
    next.run(Request::from_parts(parts, body)).await
}

fn too_large(max: u64) -> Response {
    refused(GatewayError::PayloadTooLarge(
        usize::try_from(max).unwrap_or(usize::MAX),
    ))
}

/// A refused body; the connection is closed (the rest of the body is never read).
fn refused(e: GatewayError) -> Response {
    let mut r = e.into_response();
    r.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

/// Why a streamed body was cut.
#[derive(Debug, thiserror::Error)]
enum Cut {
    #[error("the upload was slower than the minimum rate")]
    TooSlow,
    #[error("the upload is larger than {0} bytes")]
    TooLarge(u64),
}

/// A body stream that fails once it falls behind its minimum rate, pauses longer than the
/// base time, or passes the size bound.
struct RateBounded {
    inner: Body,
    bound: Bound,
    started: Instant,
    received: u64,
    deadline: Pin<Box<Sleep>>,
}

impl RateBounded {
    fn new(inner: Body, bound: Bound) -> Self {
        let started = Instant::now();
        Self {
            inner,
            bound,
            started,
            received: 0,
            deadline: Box::pin(tokio::time::sleep_until(started + bound.timing.base)),
        }
    }

    /// The next byte must come before the earlier of: the time the bytes so far may take at the
    /// minimum rate, and one `base` from now (no long pause, whatever the credit).
    fn next_deadline(&self, now: Instant) -> Instant {
        (self.started + self.bound.timing.allowed(self.received)).min(now + self.bound.timing.base)
    }
}

impl HttpBody for RateBounded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received = this.received.saturating_add(data.len() as u64);
                    if this.received > this.bound.max_bytes {
                        return Poll::Ready(Some(Err(axum::Error::new(Cut::TooLarge(
                            this.bound.max_bytes,
                        )))));
                    }
                    let next = this.next_deadline(Instant::now());
                    this.deadline.as_mut().reset(next);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(Cut::TooSlow)))),
                Poll::Pending => Poll::Pending,
            },
            done => done,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn bound() -> Bound {
        Bound {
            max_bytes: 10_000,
            timing: BodyTiming {
                base: Duration::from_secs(2),
                min_bytes_per_sec: 1000,
            },
        }
    }

    #[test]
    fn uploads_are_the_two_upload_routes_only() {
        assert!(is_upload(&Method::POST, "/api/v1/adapters"));
        assert!(is_upload(&Method::POST, "/models/upload"));
        assert!(!is_upload(&Method::GET, "/api/v1/adapters"));
        assert!(!is_upload(&Method::POST, "/api/login"));
    }

    #[tokio::test]
    async fn a_long_pause_is_cut_even_with_credit_from_a_fast_start() {
        let mut b = RateBounded::new(Body::empty(), bound());
        let now = Instant::now();
        b.received = 8_000; // 8 s of credit at the minimum rate
        assert_eq!(b.next_deadline(now), now + Duration::from_secs(2));
        b.received = 100; // behind the rate: the average decides
        assert_eq!(
            b.next_deadline(now + Duration::from_secs(1)),
            b.started + Duration::from_millis(2100)
        );
    }
}
