//! The group committer's idle wait, and the nudge that ends it. The committer used to wake every
//! group-commit interval (5 ms) whatever happened: 200 wake-ups a second on an idle replica, a
//! quarter of its idle CPU (issue 35). Now it sleeps until something needs it (a write to fsync)
//! and whoever gives it work nudges it, paying a wake-up only when it is asleep.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

#[derive(Default)]
pub struct Nudge {
    /// The committer is in (or entering) its idle wait.
    idle: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

impl Nudge {
    /// Wakes the committer if it is idle (one atomic load when it is not).
    pub fn nudge(&self) {
        if self.idle.load(Ordering::SeqCst) {
            self.wake_now();
        }
    }

    /// Wakes the committer whatever it is doing.
    pub fn wake_now(&self) {
        let _guard = self.lock.lock();
        self.wake.notify_one();
    }

    /// Waits up to `limit` unless `has_work` (checked after the idle mark, under the lock a nudge
    /// takes) says there is work already.
    // INVARIANT: no nudge is lost. A giver publishes its work, then reads `idle` (both SeqCst);
    // the committer sets `idle`, then checks for work. Either the giver sees `idle` and notifies
    // under the lock (the committer waits on it, or has not yet checked and will see the work),
    // or the committer's check sees the work. Test: journal::nudge::tests.
    pub fn wait_idle(&self, limit: Duration, has_work: impl Fn() -> bool) {
        let Ok(guard) = self.lock.lock() else { return };
        self.idle.store(true, Ordering::SeqCst);
        if !has_work() {
            let _ = self.wake.wait_timeout(guard, limit);
        }
        self.idle.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    use std::time::Instant;

    /// A giver racing the committer's wait: every piece of work is seen long before the wait's
    /// one-minute limit, so a lost nudge would hang the test.
    #[test]
    fn no_nudge_is_lost() {
        let nudge = Arc::new(Nudge::default());
        let work = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(AtomicU64::new(0));
        let committer = {
            let (nudge, work, seen) = (nudge.clone(), work.clone(), seen.clone());
            std::thread::spawn(move || {
                while seen.load(Ordering::SeqCst) < 2_000 {
                    nudge.wait_idle(Duration::from_secs(60), || {
                        work.load(Ordering::SeqCst) > seen.load(Ordering::SeqCst)
                    });
                    seen.store(work.load(Ordering::SeqCst), Ordering::SeqCst);
                }
            })
        };
        let started = Instant::now();
        for _ in 0..2_000 {
            let want = work.fetch_add(1, Ordering::SeqCst) + 1;
            nudge.nudge();
            while seen.load(Ordering::SeqCst) < want {
                std::thread::yield_now();
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "a nudge was lost"
                );
            }
        }
        committer.join().unwrap();
    }

    #[test]
    fn an_idle_wait_ends_at_its_limit_and_a_busy_one_does_not_start() {
        let nudge = Nudge::default();
        let t = Instant::now();
        nudge.wait_idle(Duration::from_millis(30), || false);
        assert!(t.elapsed() >= Duration::from_millis(30));
        let t = Instant::now();
        nudge.wait_idle(Duration::from_secs(60), || true);
        assert!(t.elapsed() < Duration::from_secs(10));
        assert!(!nudge.idle.load(Ordering::SeqCst));
    }
}
