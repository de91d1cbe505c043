//! When each graph and each adapter was last used, as this replica saw it (issue 18: idle graphs
//! scale to zero, idle adapters are unloaded). Every graph and every adapter has one [`UseMark`]
//! (two atomics) that the resolution table puts in its routes, so a request marks its graph (and
//! adapter) used through the route it already resolved: no lock, no map probe, no allocation on
//! the request path. A background task reads the marks every [`FLUSH_EVERY`] and writes the ones
//! that were used, or still have requests in flight, to `graphs.last_active_at` and
//! `adapter_use.last_active_at`, so a long stream keeps its graph awake and its adapter loaded,
//! and no request waits on PostgreSQL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use crate::metering::in_use::{InUse, UseMark};

/// How often used graphs are written (the controller's sleep grace is longer than this).
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Every graph's and adapter's use mark on this replica. The maps are read by route rebuilds
/// (to hand out the marks) and by the flusher, never by a request.
#[derive(Debug, Default)]
pub struct Activity {
    graphs: Marks<String>,
    adapters: Marks<Uuid>,
}

/// Use marks by key.
#[derive(Debug)]
struct Marks<K>(Mutex<HashMap<K, Arc<UseMark>>>);

impl<K> Default for Marks<K> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<K: std::hash::Hash + Eq + Clone> Marks<K> {
    fn mark<Q>(&self, key: &Q) -> Arc<UseMark>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let Ok(mut marks) = self.0.lock() else {
            // A poisoned map only loses this replica's activity reports; never the request.
            return Arc::default();
        };
        if let Some(u) = marks.get(key) {
            return u.clone();
        }
        let u = Arc::<UseMark>::default();
        marks.insert(key.to_owned(), u.clone());
        u
    }

    fn take(&self) -> Vec<K> {
        let Ok(mut marks) = self.0.lock() else {
            return Vec::new();
        };
        let used = marks
            .iter()
            .filter(|(_, u)| u.take_used())
            .map(|(k, _)| k.clone())
            .collect();
        marks.retain(|_, u| Arc::strong_count(u) > 1);
        used
    }
}

impl Activity {
    /// The mark of `graph` (the same one for every route of it, across rebuilds).
    pub fn graph(&self, graph: &str) -> Arc<UseMark> {
        self.graphs.mark(graph)
    }

    /// The mark of an adapter (the same one for its route across rebuilds).
    pub fn adapter(&self, id: Uuid) -> Arc<UseMark> {
        self.adapters.mark(&id)
    }

    /// The graphs to mark used now (their marks cleared); forgets the marks no route or
    /// request holds any more.
    pub fn take(&self) -> Vec<String> {
        self.graphs.take()
    }

    /// Requests in flight per graph on this replica, by name (for `tf_requests_in_flight`).
    pub fn in_flight(&self) -> Vec<(String, u32)> {
        let Ok(marks) = self.graphs.0.lock() else {
            return Vec::new();
        };
        let mut out: Vec<_> = marks
            .iter()
            .map(|(g, u)| (g.clone(), u.in_flight()))
            .collect();
        out.sort();
        out
    }

    /// The adapters to mark used now, as [`Self::take`] does for graphs.
    pub fn take_adapters(&self) -> Vec<Uuid> {
        self.adapters.take()
    }
}

/// Writes used graphs and adapters every [`FLUSH_EVERY`] until `cancel` (then once more).
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
        let used = activity.take_adapters();
        if !used.is_empty() {
            if let Err(e) = tf_core::db::sleep::touch_adapters(&pool, &used).await {
                tracing::warn!(error = %e, "could not record adapter activity");
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
        let guard = route_mark.begin(None);
        assert_eq!(a.take(), vec!["g".to_owned()]);
        // Still in flight: still used.
        assert_eq!(a.take(), vec!["g".to_owned()]);
        drop(guard);
        assert_eq!(a.take(), vec!["g".to_owned()]);
        assert!(a.take().is_empty());
    }

    #[test]
    fn an_adapters_marks_are_its_own_and_kept_across_rebuilds() {
        let a = Activity::default();
        let (id, other) = (Uuid::now_v7(), Uuid::now_v7());
        let mark = a.adapter(id);
        assert!(Arc::ptr_eq(&mark, &a.adapter(id)));
        let graph = a.graph("g");
        drop(graph.begin(Some(&mark)));
        let _other = a.adapter(other);
        assert_eq!(a.take_adapters(), vec![id]);
        assert_eq!(a.take(), vec!["g".to_owned()]);
        assert!(a.take_adapters().is_empty());
    }

    #[test]
    fn a_mark_no_route_holds_is_forgotten() {
        let a = Activity::default();
        let mark = a.graph("g");
        drop(mark.begin(None));
        drop(mark);
        assert_eq!(
            a.take(),
            vec!["g".to_owned()],
            "its last use is still reported"
        );
        assert!(a.graphs.0.lock().unwrap().is_empty());
    }
}
