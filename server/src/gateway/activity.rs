//! When each graph was last used, as this replica saw it (issue 18: idle graphs scale to zero).
//! Every graph has one [`GraphUse`] (two atomics) that the resolution table puts in each of the
//! graph's routes, so a request marks its graph used through the route it already resolved: no
//! lock, no map probe, no allocation on the request path. A background task reads the marks every
//! [`FLUSH_EVERY`] and writes the graphs that were used, or still have requests in flight, to
//! `graphs.last_active_at`, so a long stream keeps its graph awake and no request waits on
//! PostgreSQL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

pub use crate::metering::in_use::{GraphUse, InUse};

/// How often used graphs are written (the controller's sleep grace is longer than this).
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Every graph's use mark on this replica. The map is read by route rebuilds (to hand out the
/// marks) and by the flusher, never by a request.
#[derive(Debug, Default)]
pub struct Activity {
    graphs: Mutex<HashMap<String, Arc<GraphUse>>>,
}

impl Activity {
    /// The mark of `graph` (the same one for every route of it, across rebuilds).
    pub fn graph(&self, graph: &str) -> Arc<GraphUse> {
        let Ok(mut graphs) = self.graphs.lock() else {
            // A poisoned map only loses this replica's activity reports; never the request.
            return Arc::default();
        };
        if let Some(u) = graphs.get(graph) {
            return u.clone();
        }
        let u = Arc::<GraphUse>::default();
        graphs.insert(graph.to_owned(), u.clone());
        u
    }

    /// The graphs to mark used now (their marks cleared); forgets the marks no route or
    /// request holds any more.
    pub fn take(&self) -> Vec<String> {
        let Ok(mut graphs) = self.graphs.lock() else {
            return Vec::new();
        };
        let used = graphs
            .iter()
            .filter(|(_, u)| u.take_used())
            .map(|(g, _)| g.clone())
            .collect();
        graphs.retain(|_, u| Arc::strong_count(u) > 1);
        used
    }
}

/// Writes used graphs every [`FLUSH_EVERY`] until `cancel` (then once more).
pub async fn flush(activity: Arc<Activity>, pool: PgPool, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stop = tokio::select! {
            () = cancel.cancelled() => true,
            _ = tick.tick() => false,
        };
        let used = activity.take();
        if !used.is_empty() {
            if let Err(e) = tf_core::db::sleep::touch_graphs(&pool, &used).await {
                tracing::warn!(error = %e, "could not record graph activity");
            }
        }
        if stop {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_in_flight_stays_used_until_its_request_ends() {
        let a = Arc::new(Activity::default());
        let route_mark = a.graph("g");
        assert!(
            Arc::ptr_eq(&route_mark, &a.graph("g")),
            "one mark per graph"
        );
        assert!(a.take().is_empty());
        let guard = route_mark.begin();
        assert_eq!(a.take(), vec!["g".to_owned()]);
        // Still in flight: still used.
        assert_eq!(a.take(), vec!["g".to_owned()]);
        drop(guard);
        assert_eq!(a.take(), vec!["g".to_owned()]);
        assert!(a.take().is_empty());
    }

    #[test]
    fn a_mark_no_route_holds_is_forgotten() {
        let a = Activity::default();
        let mark = a.graph("g");
        drop(mark.begin());
        drop(mark);
        assert_eq!(
            a.take(),
            vec!["g".to_owned()],
            "its last use is still reported"
        );
        assert!(a.graphs.lock().unwrap().is_empty());
    }
}
