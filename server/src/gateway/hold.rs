//! Requests for a model whose graph is asleep, or whose adapter was unloaded for idleness (issue
//! 18), are held, not refused: the request asks for a wake of the graph and a reload of the
//! adapter (each one conditional UPDATE, so one wake per graph and one reload per adapter however
//! many requests and replicas ask) and waits for the resolution table to show the model
//! serving. Route reloads are the only signal, so holding costs no polling. The hold ends with
//! the route awake (forward), the wake failed or the hold limit passed (503 with `retry-after`),
//! or the model gone (404).

use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use super::error::GatewayError;
use super::resolve::{Route, RouteTable};

/// Holds until `asleep`'s graph serves `name` for `tenant` again; returns the awake route.
pub async fn until_awake(
    routes: &RouteTable,
    tenant: Uuid,
    name: &str,
    asleep: &Route,
    limit: Duration,
) -> Result<Arc<Route>, GatewayError> {
    let mut reloaded = routes.subscribe();
    match tf_core::db::sleep::request_wake(routes.pool(), &asleep.graph).await {
        Ok(true) => tracing::info!(graph = %asleep.graph, "asked to wake an idle graph"),
        Ok(false) => {}
        // The hold limit answers if the wake never comes.
        Err(e) => tracing::warn!(graph = %asleep.graph, error = %e, "could not ask for a wake"),
    }
    if let Some((adapter, _)) = asleep.adapter {
        match tf_core::db::sleep::request_reload(routes.pool(), adapter).await {
            Ok(true) => {
                tracing::info!(model = %asleep.served_name, "asked to reload an idle adapter")
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(%adapter, error = %e, "could not ask for a reload"),
        }
    }
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(deadline);
    loop {
        reloaded.borrow_and_update();
        match routes.snapshot().get(tenant, name) {
            None => return Err(GatewayError::model_not_found(name)),
            Some(r) if r.wake_failures > asleep.wake_failures => {
                return Err(GatewayError::WakeFailed(r.served_name.clone()))
            }
            Some(r) if !r.asleep => return Ok(r.clone()),
            Some(_) => {}
        }
        tokio::select! {
            changed = reloaded.changed() => {
                if changed.is_err() {
                    return Err(GatewayError::ServiceUnavailable);
                }
            }
            () = &mut deadline => return Err(GatewayError::ModelWaking(asleep.served_name.clone())),
        }
    }
}
