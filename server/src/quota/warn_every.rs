//! A warning that can repeat on every request (a store is down, each request notices) is logged
//! at most once per interval, with how many times it happened since the last line, so an outage
//! is a few lines a minute instead of thousands.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How often the repeated warnings of this module's users are logged at most.
pub const EVERY: Duration = Duration::from_secs(10);

/// The state of one repeated warning.
#[derive(Debug)]
pub struct WarnEvery {
    every: Duration,
    /// When the last line was logged (`None`: never) and the occurrences since then.
    state: Mutex<(Option<Instant>, u64)>,
}

impl WarnEvery {
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// Counts one occurrence; `Some(n)` when a line is due now, `n` being the occurrences it
    /// stands for (this one included).
    pub fn hit(&self) -> Option<u64> {
        self.hit_at(Instant::now())
    }

    /// [`Self::hit`] at `now` (tests pass the time in).
    fn hit_at(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.1 += 1;
        let due =
            s.0.is_none_or(|last| now.duration_since(last) >= self.every);
        if !due {
            return None;
        }
        let n = s.1;
        *s = (Some(now), 0);
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_the_first_then_once_per_interval_with_the_count() {
        let w = WarnEvery::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(w.hit_at(t0), Some(1));
        for _ in 0..199 {
            assert_eq!(w.hit_at(t0 + Duration::from_secs(9)), None);
        }
        assert_eq!(w.hit_at(t0 + Duration::from_secs(10)), Some(200));
        assert_eq!(w.hit_at(t0 + Duration::from_secs(11)), None);
    }
}
