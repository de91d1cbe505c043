//! The mark that keeps a graph awake, and an adapter loaded, while a request on it runs (issue
//! 18). One [`UseMark`] per graph (and one per adapter) lives as long as any route to it (the
//! resolution table hands the same one to every route of a graph, across rebuilds:
//! `gateway::activity`); a request bumps its atomics and holds an [`InUse`] with its accounting,
//! so the request path takes no lock and allocates nothing for it. The activity flusher reads
//! and clears `touched` once a second.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// One graph's (or one adapter's) use on this replica.
#[derive(Debug, Default)]
pub struct UseMark {
    /// Requests on it still running (their accounting not yet finished).
    in_flight: AtomicU32,
    /// A request started or ended since the flusher last looked.
    touched: AtomicBool,
}

impl UseMark {
    /// A request on this graph starts (and on `adapter`'s own mark too, for a tenant's model);
    /// it ends when the mark drops (with the request's accounting, so a stream counts until its
    /// last byte).
    pub fn begin(self: &Arc<Self>, adapter: Option<&Arc<Self>>) -> InUse {
        self.start();
        if let Some(a) = adapter {
            a.start();
        }
        InUse(self.clone(), adapter.cloned())
    }

    fn start(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.touch();
    }

    fn end(&self) {
        // INVARIANT: touched before the count falls, so the flusher that sees zero in flight
        // still sees the request's end as use.
        self.touch();
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    fn touch(&self) {
        // Read first: a busy graph's flag is already set, and a load does not contend.
        if !self.touched.load(Ordering::Relaxed) {
            self.touched.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the graph was used since the last call (a request started or ended, or one is
    /// still running); clears the mark. Called by the flusher only.
    pub fn take_used(&self) -> bool {
        let touched = self.touched.swap(false, Ordering::Relaxed);
        touched || self.in_flight.load(Ordering::Relaxed) > 0
    }

    /// Requests running on the graph now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// Holds a graph (and the adapter served on it, if any) in use while a request runs.
#[derive(Debug)]
pub struct InUse(Arc<UseMark>, Option<Arc<UseMark>>);

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.end();
        if let Some(a) = &self.1 {
            a.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_is_used_while_a_request_runs_and_once_after() {
        let g = Arc::new(UseMark::default());
        assert!(!g.take_used());
        let mark = g.begin(None);
        assert!(g.take_used());
        assert!(g.take_used(), "still in flight: still used");
        drop(mark);
        assert_eq!(g.in_flight(), 0);
        assert!(g.take_used(), "the end is use");
        assert!(!g.take_used());
    }

    #[test]
    fn an_adapters_request_marks_its_adapter_and_its_graph() {
        let (g, a) = (Arc::new(UseMark::default()), Arc::new(UseMark::default()));
        let mark = g.begin(Some(&a));
        assert_eq!((g.in_flight(), a.in_flight()), (1, 1));
        drop(mark);
        assert_eq!((g.in_flight(), a.in_flight()), (0, 0));
        assert!(g.take_used() && a.take_used());
        assert!(!a.take_used());
    }
}
