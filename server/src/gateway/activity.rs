//! When each graph was last used, as this replica saw it (issue 18: idle graphs scale to zero).
//! The request path only bumps an in-memory counter; a background task writes the graphs that
//! were used, or still have requests in flight, to `graphs.last_active_at` every
//! [`FLUSH_EVERY`], so a long stream keeps its graph awake and no request waits on PostgreSQL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// How often used graphs are written (the controller's sleep grace is longer than this).
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct Use {
    in_flight: u32,
    /// A request started or ended since the last flush.
    touched: bool,
}

/// Per-graph use on this replica.
#[derive(Debug, Default)]
pub struct Activity {
    graphs: Mutex<HashMap<String, Use>>,
}

impl Activity {
    /// A request on `graph` starts; it ends when the guard drops (with the request's
    /// accounting, so a stream counts until its last byte).
    pub fn begin(self: &Arc<Self>, graph: &str) -> ActivityGuard {
        if let Ok(mut graphs) = self.graphs.lock() {
            let u = graphs.entry(graph.to_owned()).or_default();
            u.in_flight += 1;
            u.touched = true;
        }
        ActivityGuard {
            activity: self.clone(),
            graph: graph.to_owned(),
        }
    }

    /// The graphs to mark used now; forgets the ones that are quiet.
    pub fn take(&self) -> Vec<String> {
        let Ok(mut graphs) = self.graphs.lock() else {
            return Vec::new();
        };
        let used = graphs
            .iter()
            .filter(|(_, u)| u.touched || u.in_flight > 0)
            .map(|(g, _)| g.clone())
            .collect();
        graphs.retain(|_, u| u.in_flight > 0);
        for u in graphs.values_mut() {
            u.touched = false;
        }
        used
    }
}

/// Holds a graph in use while a request runs.
#[derive(Debug)]
pub struct ActivityGuard {
    activity: Arc<Activity>,
    graph: String,
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        if let Ok(mut graphs) = self.activity.graphs.lock() {
            let u = graphs.entry(std::mem::take(&mut self.graph)).or_default();
            u.in_flight = u.in_flight.saturating_sub(1);
            u.touched = true;
        }
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
        let guard = a.begin("g");
        assert_eq!(a.take(), vec!["g".to_owned()]);
        // Still in flight: still used.
        assert_eq!(a.take(), vec!["g".to_owned()]);
        drop(guard);
        assert_eq!(a.take(), vec!["g".to_owned()]);
        assert!(a.take().is_empty());
    }
}
