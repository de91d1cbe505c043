//! Login throttling. Failed attempts are counted per lowercased email and per client IP in fixed
//! windows; once a limit is reached, further attempts are refused without checking the password
//! until the window ends. Counters live in Redis (one Lua script per operation, so replicas never
//! race between reading and incrementing). When Redis is not configured or fails, a per-process
//! limiter with the same rules takes over: throttling degrades to per-replica, never to none.
//!
//! An attempt is reserved before the password is checked (so concurrent guesses cannot overshoot
//! the limit) and handed back on success, which makes the counters count failures.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

/// Failed attempts allowed per email within [`WINDOW`].
pub const EMAIL_LIMIT: u32 = 5;
/// Failed attempts allowed per client IP within [`WINDOW`] (offices share addresses).
pub const IP_LIMIT: u32 = 50;
/// How long failures are remembered, counted from the first one.
pub const WINDOW: Duration = Duration::from_secs(15 * 60);
/// A Redis call slower than this counts as failed; the local limiter decides instead.
const REDIS_TIMEOUT: Duration = Duration::from_millis(500);
/// Above this many local entries, expired ones are swept on the next attempt.
const LOCAL_SWEEP_AT: usize = 10_000;

/// v1. KEYS: email counter, IP counter. ARGV: email limit, IP limit, window in ms.
/// Returns 0 when the attempt is allowed (and counted), else the ms until the full window ends.
static RESERVE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local limits = { tonumber(ARGV[1]), tonumber(ARGV[2]) }
for i = 1, 2 do
  if tonumber(redis.call('GET', KEYS[i]) or '0') >= limits[i] then
    local ttl = redis.call('PTTL', KEYS[i])
    if ttl < 0 then
      redis.call('PEXPIRE', KEYS[i], ARGV[3])
      ttl = tonumber(ARGV[3])
    end
    return ttl
  end
end
for i = 1, 2 do
  if redis.call('INCR', KEYS[i]) == 1 then redis.call('PEXPIRE', KEYS[i], ARGV[3]) end
end
return 0
",
    )
});

/// v1. KEYS: email counter, IP counter. Clears the email's failures and hands back the IP's
/// reserved attempt.
static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
redis.call('DEL', KEYS[1])
if tonumber(redis.call('GET', KEYS[2]) or '0') > 0 then redis.call('DECR', KEYS[2]) end
return 0
",
    )
});

/// The throttle's answer to a login attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Go on and check the password.
    Allowed,
    /// Refuse without checking; the window ends after this long.
    Throttled { retry_after: Duration },
}

/// Shared by every request of one router (clones share the local fallback).
#[derive(Clone)]
pub struct LoginThrottle {
    redis: Option<ConnectionManager>,
    prefix: String,
    local: Arc<Mutex<LocalLimiter>>,
}

impl LoginThrottle {
    /// Counts in Redis under `prefix` when given a connection, in process otherwise.
    pub fn new(redis: Option<ConnectionManager>, prefix: String) -> Self {
        Self {
            redis,
            prefix,
            local: Arc::new(Mutex::new(LocalLimiter::default())),
        }
    }

    fn keys(&self, email: &str, ip: &str) -> [String; 2] {
        [
            format!("{}login:email:{email}", self.prefix),
            format!("{}login:ip:{ip}", self.prefix),
        ]
    }

    /// Reserves one attempt for this email and IP, or refuses if either is over its limit.
    pub async fn begin(&self, email: &str, ip: &str) -> Verdict {
        let keys = self.keys(email, ip);
        if let Some(mut conn) = self.redis.clone() {
            let mut call = RESERVE.prepare_invoke();
            call.key(&keys[0])
                .key(&keys[1])
                .arg(EMAIL_LIMIT)
                .arg(IP_LIMIT)
                .arg(millis(WINDOW));
            match tokio::time::timeout(REDIS_TIMEOUT, call.invoke_async::<u64>(&mut conn)).await {
                Ok(Ok(0)) => return Verdict::Allowed,
                Ok(Ok(ms)) => {
                    return Verdict::Throttled {
                        retry_after: Duration::from_millis(ms),
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "login throttle: Redis failed, counting locally")
                }
                Err(_) => tracing::warn!("login throttle: Redis timed out, counting locally"),
            }
        }
        self.with_local(|l| l.begin(&keys, Instant::now()))
    }

    /// A correct password: forgets the email's failures and returns the IP's reserved attempt.
    pub async fn succeeded(&self, email: &str, ip: &str) {
        let keys = self.keys(email, ip);
        if let Some(mut conn) = self.redis.clone() {
            let mut call = RELEASE.prepare_invoke();
            call.key(&keys[0]).key(&keys[1]);
            match tokio::time::timeout(REDIS_TIMEOUT, call.invoke_async::<u64>(&mut conn)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "login throttle: Redis release failed"),
                Err(_) => tracing::warn!("login throttle: Redis release timed out"),
            }
        }
        // The attempt may have been counted locally during a Redis outage.
        self.with_local(|l| l.release(&keys, Instant::now()));
    }

    fn with_local<T>(&self, f: impl FnOnce(&mut LocalLimiter) -> T) -> T {
        // A poisoned lock only means another request panicked mid-update; the counts stay usable.
        let mut guard = self.local.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The in-process fallback: counters with a fixed expiry, same rules as the Lua scripts.
#[derive(Default)]
struct LocalLimiter {
    counters: HashMap<String, (u32, Instant)>,
}

impl LocalLimiter {
    fn live(&self, key: &str, now: Instant) -> Option<(u32, Instant)> {
        self.counters
            .get(key)
            .copied()
            .filter(|&(_, until)| until > now)
    }

    fn begin(&mut self, keys: &[String; 2], now: Instant) -> Verdict {
        if self.counters.len() > LOCAL_SWEEP_AT {
            self.counters.retain(|_, &mut (_, until)| until > now);
        }
        for (key, limit) in keys.iter().zip([EMAIL_LIMIT, IP_LIMIT]) {
            if let Some((count, until)) = self.live(key, now) {
                if count >= limit {
                    return Verdict::Throttled {
                        retry_after: until.saturating_duration_since(now),
                    };
                }
            }
        }
        for key in keys {
            let (count, until) = self.live(key, now).unwrap_or((0, now + WINDOW));
            self.counters.insert(key.clone(), (count + 1, until));
        }
        Verdict::Allowed
    }

    fn release(&mut self, keys: &[String; 2], now: Instant) {
        self.counters.remove(&keys[0]);
        if let Some((count, until)) = self.live(&keys[1], now) {
            self.counters
                .insert(keys[1].clone(), (count.saturating_sub(1), until));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(email: &str, ip: &str) -> [String; 2] {
        [format!("e:{email}"), format!("i:{ip}")]
    }

    #[test]
    fn email_limit_blocks_until_the_window_ends() {
        let mut l = LocalLimiter::default();
        let t0 = Instant::now();
        let k = keys("a@x", "1.2.3.4");
        for _ in 0..EMAIL_LIMIT {
            assert_eq!(l.begin(&k, t0), Verdict::Allowed);
        }
        let later = t0 + Duration::from_secs(60);
        assert_eq!(
            l.begin(&k, later),
            Verdict::Throttled {
                retry_after: WINDOW - Duration::from_secs(60)
            }
        );
        assert_eq!(l.begin(&k, t0 + WINDOW), Verdict::Allowed);
    }

    #[test]
    fn success_clears_the_email_and_returns_the_ip_attempt() {
        let mut l = LocalLimiter::default();
        let now = Instant::now();
        let k = keys("a@x", "ip");
        for _ in 0..EMAIL_LIMIT - 1 {
            l.begin(&k, now);
        }
        assert_eq!(l.begin(&k, now), Verdict::Allowed);
        l.release(&k, now);
        assert!(l.live(&k[0], now).is_none());
        assert_eq!(l.live(&k[1], now).map(|c| c.0), Some(EMAIL_LIMIT - 1));
    }

    #[test]
    fn ip_limit_blocks_other_emails() {
        let mut l = LocalLimiter::default();
        let now = Instant::now();
        for i in 0..IP_LIMIT {
            assert_eq!(
                l.begin(&keys(&format!("u{i}@x"), "ip"), now),
                Verdict::Allowed
            );
        }
        assert!(matches!(
            l.begin(&keys("fresh@x", "ip"), now),
            Verdict::Throttled { .. }
        ));
        assert_eq!(l.begin(&keys("fresh@x", "other-ip"), now), Verdict::Allowed);
    }
}
