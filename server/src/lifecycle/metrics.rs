//! The controller's counters: `tf_fleet_errors_total{kind}` (one series per `FleetError` kind,
//! plus `database`), reconcile passes, and whether this replica leads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Error kinds, in the order they are rendered.
const KINDS: [&str; 4] = ["unavailable", "rejected", "conflict", "database"];

#[derive(Debug, Default)]
pub struct FleetMetrics {
    errors: [AtomicU64; 4],
    passes: AtomicU64,
    leader: AtomicBool,
}

impl FleetMetrics {
    pub fn error(&self, kind: &str) {
        if let Some(i) = KINDS.iter().position(|k| *k == kind) {
            self.errors[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn errors(&self, kind: &str) -> u64 {
        KINDS
            .iter()
            .position(|k| *k == kind)
            .map_or(0, |i| self.errors[i].load(Ordering::Relaxed))
    }

    pub fn pass(&self) {
        self.passes.fetch_add(1, Ordering::Relaxed);
    }

    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.store(leader, Ordering::Relaxed);
    }

    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Relaxed)
    }

    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(out, "# TYPE tf_fleet_errors_total counter");
        for (i, kind) in KINDS.iter().enumerate() {
            let _ = writeln!(
                out,
                "tf_fleet_errors_total{{kind=\"{kind}\"}} {}",
                self.errors[i].load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# TYPE tf_fleet_reconcile_passes_total counter\ntf_fleet_reconcile_passes_total {}",
            self.passes()
        );
        let _ = writeln!(
            out,
            "# TYPE tf_fleet_leader gauge\ntf_fleet_leader {}",
            u8::from(self.is_leader())
        );
    }
}
