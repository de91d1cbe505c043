//! A simulated graph's frontend: one loopback URL per graph, like a Dynamo frontend, spreading
//! requests round-robin over the graph's replicas and streaming answers back as they come. The
//! gateway keeps one upstream per base; replicas come and go behind this address. `/metrics` is
//! the sum of the replicas' counters (a Dynamo frontend aggregates its workers' too).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;

/// The replicas behind a frontend; the backend edits the list as it scales.
#[derive(Debug, Default)]
pub struct Replicas {
    addrs: RwLock<Vec<SocketAddr>>,
    next: AtomicUsize,
}

impl Replicas {
    pub fn set(&self, addrs: Vec<SocketAddr>) {
        if let Ok(mut a) = self.addrs.write() {
            *a = addrs;
        }
    }

    fn all(&self) -> Vec<SocketAddr> {
        self.addrs.read().map(|a| a.clone()).unwrap_or_default()
    }

    fn pick(&self) -> Option<SocketAddr> {
        let addrs = self.addrs.read().ok()?;
        if addrs.is_empty() {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % addrs.len();
        Some(addrs[i])
    }
}

#[derive(Clone)]
struct Front {
    replicas: Arc<Replicas>,
    http: reqwest::Client,
}

/// Hop-by-hop headers a proxy must not forward.
const HOP: [&str; 4] = ["connection", "transfer-encoding", "keep-alive", "host"];

pub fn router(replicas: Arc<Replicas>, http: reqwest::Client) -> axum::Router {
    axum::Router::new()
        .route("/metrics", axum::routing::get(metrics))
        .fallback(forward)
        .with_state(Front { replicas, http })
}

async fn forward(State(front): State<Front>, req: Request) -> Response {
    let Some(addr) = front.replicas.pick() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "no replica").into_response();
    };
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", axum::http::uri::PathAndQuery::as_str);
    let mut out = front
        .http
        .request(parts.method, format!("http://{addr}{path}"))
        .body(reqwest::Body::wrap_stream(body.into_data_stream()));
    for (name, value) in &parts.headers {
        if !HOP.contains(&name.as_str()) {
            out = out.header(name, value);
        }
    }
    let answer = match out.send().await {
        Ok(a) => a,
        Err(_) => return (StatusCode::BAD_GATEWAY, "replica unreachable").into_response(),
    };
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !HOP.contains(&name.as_str()) && name != HeaderName::from_static("content-length") {
            response = response.header(name, value);
        }
    }
    response
        .body(Body::from_stream(
            answer.bytes_stream().map_err(std::io::Error::other),
        ))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

/// Every replica's counters, summed per series (`name{labels}`), in the order first seen.
async fn metrics(State(front): State<Front>) -> Response {
    let mut sums: Vec<(String, u64)> = Vec::new();
    for addr in front.replicas.all() {
        let Ok(r) = front
            .http
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
        else {
            continue;
        };
        let Ok(text) = r.text().await else { continue };
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.trim().parse::<u64>() else {
                continue;
            };
            match sums.iter_mut().find(|(s, _)| s == series) {
                Some((_, sum)) => *sum += value,
                None => sums.push((series.to_owned(), value)),
            }
        }
    }
    let body: String = sums
        .iter()
        .map(|(series, sum)| format!("{series} {sum}\n"))
        .collect();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        body,
    )
        .into_response()
}
