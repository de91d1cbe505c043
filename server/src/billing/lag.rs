//! Rating lag as `/metrics` shows it: the age of the oldest usage event waiting in the live run's
//! work list (`rating_queue`) and how many wait. Every replica measures it when Prometheus
//! scrapes (one query through the queue's primary key, at most once per [`MIN_INTERVAL`], bounded
//! by [`QUERY_TIMEOUT`]), so it is true whichever replica leads the rater, and a stuck or dead
//! rater shows as a growing age rather than a missing series.
//!
//! When PostgreSQL does not answer, the last answer is kept and the age is computed from the
//! oldest event's start at render time: it keeps growing through an outage instead of freezing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sqlx::PgPool;
use uuid::Uuid;

/// Scrapes closer together than this reuse the last reading.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Longest a scrape waits for the reading (then it renders the last one).
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// Events counted at most (the depth saturates there; the age does not).
pub const DEPTH_CAP: i64 = 1_000_000;

#[derive(Debug, Default, Clone, Copy)]
struct Reading {
    at: Option<Instant>,
    depth: u64,
    /// When the oldest waiting event's request started (Unix ms), if any waits.
    oldest_ms: Option<u64>,
}

/// The rating-lag gauges of this replica.
pub struct RatingLag {
    pool: PgPool,
    reading: Mutex<Reading>,
    /// One reading at a time: concurrent scrapes render the last one.
    turn: tokio::sync::Mutex<()>,
    failures: AtomicU64,
}

impl RatingLag {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            reading: Mutex::default(),
            turn: tokio::sync::Mutex::new(()),
            failures: AtomicU64::new(0),
        }
    }

    /// Reads the queue again unless it was read within [`MIN_INTERVAL`] or a reading is running.
    pub async fn refresh(&self) {
        let Ok(_turn) = self.turn.try_lock() else {
            return;
        };
        let last = self.reading().at;
        if last.is_some_and(|at| at.elapsed() < MIN_INTERVAL) {
            return;
        }
        let read = tokio::time::timeout(
            QUERY_TIMEOUT,
            tf_core::db::billing::queue_status(&self.pool, DEPTH_CAP),
        )
        .await;
        let mut reading = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        reading.at = Some(Instant::now());
        match read {
            Ok(Ok((depth, oldest))) => {
                reading.depth = u64::try_from(depth).unwrap_or(0);
                reading.oldest_ms = oldest.and_then(started_ms);
            }
            // The last answer stands; its age keeps growing at render.
            _ => {
                self.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn reading(&self) -> Reading {
        *self.reading.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The gauges in Prometheus text format, the age as of `now`.
    pub fn render(&self, out: &mut String, now: SystemTime) {
        use std::fmt::Write;
        let reading = self.reading();
        let now_ms = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let age_ms = reading
            .oldest_ms
            .map_or(0, |oldest| now_ms.saturating_sub(oldest));
        let family = crate::telemetry::requests::family;
        family(
            out,
            "tf_rating_lag_seconds",
            "gauge",
            "Age of the oldest usage event waiting to be rated (0: none waits).",
        );
        let _ = writeln!(out, "tf_rating_lag_seconds {}", age_ms as f64 / 1000.0);
        family(
            out,
            "tf_rating_queue_events",
            "gauge",
            "Usage events waiting to be rated (counted up to 1000000).",
        );
        let _ = writeln!(out, "tf_rating_queue_events {}", reading.depth);
        family(
            out,
            "tf_rating_lag_read_failures_total",
            "counter",
            "Scrapes whose reading of the rating queue failed (the last reading was shown).",
        );
        let _ = writeln!(
            out,
            "tf_rating_lag_read_failures_total {}",
            self.failures.load(Ordering::Relaxed)
        );
    }
}

/// When a request started, from its UUIDv7 id (Unix ms).
fn started_ms(id: Uuid) -> Option<u64> {
    let (secs, nanos) = id.get_timestamp()?.to_unix();
    secs.checked_mul(1000)?
        .checked_add(u64::from(nanos / 1_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreachable_pool() -> PgPool {
        sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(Duration::from_millis(50))
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .unwrap()
    }

    #[test]
    fn a_request_id_gives_its_start() {
        let id = Uuid::now_v7();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let started = started_ms(id).unwrap();
        assert!(started <= now && now - started < 1000, "{started} {now}");
        assert_eq!(started_ms(Uuid::new_v4()), None);
    }

    #[tokio::test]
    async fn the_age_keeps_growing_when_the_database_does_not_answer() {
        let lag = RatingLag::new(unreachable_pool());
        let oldest = SystemTime::now() - Duration::from_secs(30);
        let oldest_ms = oldest.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        *lag.reading.lock().unwrap() = Reading {
            at: None,
            depth: 3,
            oldest_ms: Some(oldest_ms),
        };
        lag.refresh().await;
        let mut out = String::new();
        lag.render(&mut out, oldest + Duration::from_secs(90));
        assert!(out.contains("\ntf_rating_lag_seconds 90\n"), "{out}");
        assert!(out.contains("\ntf_rating_queue_events 3\n"), "{out}");
        assert!(
            out.contains("\ntf_rating_lag_read_failures_total 1\n"),
            "{out}"
        );
    }
}
