//! The metrics listener's `/metrics`: every subsystem's series in one scrape. An assembly piece
//! (it names the gateway, the fleet, the journal and body capture), so `telemetry` itself stays
//! below the gateway that feeds it.

use std::sync::Arc;

use axum::Router;

/// Everything `/metrics` renders, each part owned by its subsystem.
#[derive(Clone)]
pub struct MetricsSources {
    pub requests: Arc<crate::telemetry::requests::RequestMetrics>,
    pub http: Arc<crate::http_server::ServerMetrics>,
    pub fleet: Arc<crate::lifecycle::FleetMetrics>,
    pub bodies: Arc<crate::bodies::capture::BodyCapture>,
    pub journal: Option<Arc<crate::journal::JournalMetrics>>,
    pub activity: Arc<crate::gateway::activity::Activity>,
    /// Read from PostgreSQL when scraped (bounded; see `billing::lag`).
    pub rating: Arc<crate::billing::lag::RatingLag>,
}

impl MetricsSources {
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        self.requests.render(&mut out);
        // Both gauges for every graph this replica routes to (0 included), so a query never
        // finds the series missing.
        use std::fmt::Write;
        let graphs = self.activity.in_flight();
        crate::telemetry::requests::family(
            &mut out,
            "tf_requests_in_flight",
            "gauge",
            "Requests forwarded and not finished, per graph.",
        );
        for (graph, n) in &graphs {
            let g = graph.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(out, "tf_requests_in_flight{{graph=\"{g}\"}} {n}");
        }
        crate::telemetry::requests::family(
            &mut out,
            "tf_requests_held",
            "gauge",
            "Requests held while their graph wakes, per graph.",
        );
        for (graph, _) in &graphs {
            let g = graph.replace('\\', "\\\\").replace('"', "\\\"");
            let held = self.requests.held_now(graph);
            let _ = writeln!(out, "tf_requests_held{{graph=\"{g}\"}} {held}");
        }
        self.http.render(&mut out);
        self.fleet.render(&mut out);
        self.bodies.render(&mut out);
        if let Some(j) = &self.journal {
            j.render(&mut out);
        }
        self.rating.render(&mut out, std::time::SystemTime::now());
        out
    }
}

/// The metrics listener's router: `GET /metrics` only.
pub fn router(sources: MetricsSources) -> Router {
    Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let sources = sources.clone();
            async move {
                sources.rating.refresh().await;
                let body = sources.render();
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4",
                    )],
                    body,
                )
            }
        }),
    )
}
