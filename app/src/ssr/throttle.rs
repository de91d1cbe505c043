//! Login throttling without account lockout. Failures are counted three ways, and each count
//! slows down only what it describes:
//!
//! - per (client address, account): after [`PAIR_FREE`] failures every further attempt waits for
//!   an exponentially growing delay since the last failure ([`PAIR_BASE`] doubling, at most
//!   [`PAIR_MAX`]). This is what stops one attacker hammering one account, and it never touches
//!   the account's owner on another address.
//! - per account, over all addresses: the same backoff, far looser ([`ACCOUNT_FREE`] failures
//!   before it starts, at most [`ACCOUNT_MAX`] between attempts), so guessing spread over many
//!   addresses is bounded too. It holds back only addresses that have themselves failed on the
//!   account [`ACCOUNT_EXEMPT`] times or more: an attacker polling from many addresses fills the
//!   account's slot but cannot keep its owner out, who signs in from an address that has not
//!   been guessing (the right password is always checked there). The price is that a distributed
//!   guesser gets [`ACCOUNT_EXEMPT`] guesses per address per [`PAIR_KEEP`] past the account's
//!   bound; a device cookie would close that, at the cost of a store of devices, and the owner on
//!   a new device would still be kept out.
//! - per client address, over all accounts: [`IP_LIMIT`] failures per [`IP_WINDOW`] (password
//!   spraying; offices share addresses, hence the generous limit). The address is the socket's
//!   peer, or the client a trusted proxy forwarded (`client_addr`); an IPv6 client counts per
//!   /64.
//!
//! Counters live in Redis (one Lua script per operation on Redis's clock, so replicas never race
//! between reading and incrementing and agree on time). When Redis is not configured or fails, a
//! per-process limiter with the same rules takes over: throttling degrades to per-replica, never
//! to none. The local limiter is bounded ([`LOCAL_MAX_ENTRIES`]); when full, the entries closest to
//! expiry are dropped first.
//!
//! An attempt is reserved (counted as a failure) before the password is checked, so concurrent
//! guesses cannot overshoot, and handed back on success: the pair's failures are forgotten, the
//! account's and the address's counts lose that one attempt. Refused attempts are not guesses and
//! count for nothing.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

/// Failures per (address, account) before attempts are delayed.
pub const PAIR_FREE: u32 = 5;
/// The first delay per (address, account); it doubles with every further failure.
pub const PAIR_BASE: Duration = Duration::from_secs(30);
/// The longest delay per (address, account).
pub const PAIR_MAX: Duration = Duration::from_secs(15 * 60);
/// How long a (address, account)'s failures are remembered after the last one.
pub const PAIR_KEEP: Duration = Duration::from_secs(60 * 60);
/// Failures per account, over all addresses, before attempts are delayed.
pub const ACCOUNT_FREE: u32 = 20;
/// An address with fewer failures than this on an account is not held back by the account's
/// bound (the owner may mistype twice); see the module doc.
pub const ACCOUNT_EXEMPT: u32 = 3;
/// The first per-account delay; it doubles with every further failure.
pub const ACCOUNT_BASE: Duration = Duration::from_secs(1);
/// The longest per-account delay: what an attacker can impose on the account's owner at worst.
pub const ACCOUNT_MAX: Duration = Duration::from_secs(60);
/// How long an account's failures are remembered after the last one.
pub const ACCOUNT_KEEP: Duration = Duration::from_secs(15 * 60);
/// Failed attempts allowed per client address within [`IP_WINDOW`] (offices share addresses).
pub const IP_LIMIT: u32 = 50;
/// The per-address window, counted from its first failure.
pub const IP_WINDOW: Duration = Duration::from_secs(15 * 60);
/// A Redis call slower than this counts as failed; the local limiter decides instead.
const REDIS_TIMEOUT: Duration = Duration::from_millis(500);
/// Most entries the local limiter keeps (about 100 bytes each).
pub const LOCAL_MAX_ENTRIES: usize = 50_000;

/// v3. KEYS: pair hash, account hash, address counter. ARGV: pair free, base ms, max ms, keep ms,
/// account free, base ms, max ms, keep ms, address limit, address window ms, account exempt
/// (pair failures below which the account's bound does not apply). Hashes hold `f`
/// (failures) and `t` (last failure, Redis ms). Returns 0 when the attempt is allowed (and
/// counted), else the ms to wait.
static RESERVE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local function wait(key, free, base, max)
  local f = tonumber(redis.call('HGET', key, 'f') or '0')
  if f < free then return 0 end
  local d = base * 2 ^ math.min(f - free, 40)
  if d > max then d = max end
  local left = tonumber(redis.call('HGET', key, 't') or '0') + d - now
  if left > 0 then return left end
  return 0
end
local w = wait(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))
if tonumber(redis.call('HGET', KEYS[1], 'f') or '0') >= tonumber(ARGV[11]) then
  w = math.max(w, wait(KEYS[2], tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])))
end
if tonumber(redis.call('GET', KEYS[3]) or '0') >= tonumber(ARGV[9]) then
  local ttl = redis.call('PTTL', KEYS[3])
  if ttl < 0 then
    redis.call('PEXPIRE', KEYS[3], ARGV[10])
    ttl = tonumber(ARGV[10])
  end
  w = math.max(w, ttl)
end
if w > 0 then return math.ceil(w) end
for i, keep in ipairs({ ARGV[4], ARGV[8] }) do
  redis.call('HINCRBY', KEYS[i], 'f', 1)
  redis.call('HSET', KEYS[i], 't', now)
  redis.call('PEXPIRE', KEYS[i], keep)
end
if redis.call('INCR', KEYS[3]) == 1 then redis.call('PEXPIRE', KEYS[3], ARGV[10]) end
return 0
",
    )
});

/// v2. KEYS: pair hash, account hash, address counter. Forgets the pair's failures and hands the
/// reserved attempt back to the account and the address.
static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
redis.call('DEL', KEYS[1])
if tonumber(redis.call('HGET', KEYS[2], 'f') or '0') > 0 then redis.call('HINCRBY', KEYS[2], 'f', -1) end
if tonumber(redis.call('GET', KEYS[3]) or '0') > 0 then redis.call('DECR', KEYS[3]) end
return 0
",
    )
});

/// The throttle's answer to a login attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Go on and check the password.
    Allowed,
    /// Refuse without checking; the next attempt may come after this long.
    Throttled { retry_after: Duration },
}

/// Shared by every request of one router (clones share the local fallback).
#[derive(Clone)]
pub struct LoginThrottle {
    redis: tf_core::redis_slot::RedisSlot,
    prefix: String,
    local: Arc<Mutex<LocalLimiter>>,
}

/// The Redis keys of one attempt: pair, account, address.
type Keys = [String; 3];

impl LoginThrottle {
    /// Counts in Redis under `prefix` once the slot holds a connection, in process until then.
    pub fn new(redis: tf_core::redis_slot::RedisSlot, prefix: String) -> Self {
        Self {
            redis,
            prefix,
            local: Arc::new(Mutex::new(LocalLimiter::default())),
        }
    }

    fn keys(&self, email: &str, ip: &str) -> Keys {
        // IPv6 clients count per /64. The pair key's first '/' after the prefix ends the address
        // part only for IPv4; an IPv6 key holds "/64/" and an email never contains '/', so keys
        // stay unambiguous.
        let ip = match ip.parse::<std::net::IpAddr>() {
            Ok(addr) => super::client_addr::throttle_key(addr),
            Err(_) => ip.to_owned(),
        };
        [
            format!("{}login:pair:{ip}/{email}", self.prefix),
            format!("{}login:account:{email}", self.prefix),
            format!("{}login:ip:{ip}", self.prefix),
        ]
    }

    /// Reserves one attempt for this email from this address, or says how long to wait.
    pub async fn begin(&self, email: &str, ip: &str) -> Verdict {
        let keys = self.keys(email, ip);
        if let Some(mut conn) = self.redis.get() {
            let mut call = RESERVE.prepare_invoke();
            for k in &keys {
                call.key(k);
            }
            call.arg(PAIR_FREE)
                .arg(millis(PAIR_BASE))
                .arg(millis(PAIR_MAX))
                .arg(millis(PAIR_KEEP))
                .arg(ACCOUNT_FREE)
                .arg(millis(ACCOUNT_BASE))
                .arg(millis(ACCOUNT_MAX))
                .arg(millis(ACCOUNT_KEEP))
                .arg(IP_LIMIT)
                .arg(millis(IP_WINDOW))
                .arg(ACCOUNT_EXEMPT);
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

    /// A correct password: forgets this address's failures for the account and hands the
    /// reserved attempt back to the account's and the address's counts.
    pub async fn succeeded(&self, email: &str, ip: &str) {
        let keys = self.keys(email, ip);
        if let Some(mut conn) = self.redis.get() {
            let mut call = RELEASE.prepare_invoke();
            for k in &keys {
                call.key(k);
            }
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

/// How long after the last of `failures` the next attempt may come (zero: at once).
fn backoff(failures: u32, free: u32, base: Duration, max: Duration) -> Duration {
    match failures.checked_sub(free) {
        None => Duration::ZERO,
        Some(n) => base.saturating_mul(1u32 << n.min(20)).min(max),
    }
}

/// One local entry: failures (or the address's attempts), the last failure, when it is dropped.
#[derive(Debug, Clone, Copy)]
struct Entry {
    count: u32,
    last: Instant,
    until: Instant,
}

/// The in-process fallback: the same rules as the Lua scripts, on this process's clock.
#[derive(Default)]
struct LocalLimiter {
    entries: HashMap<String, Entry>,
}

impl LocalLimiter {
    fn live(&self, key: &str, now: Instant) -> Option<Entry> {
        self.entries.get(key).copied().filter(|e| e.until > now)
    }

    fn wait(&self, key: &str, now: Instant, free: u32, base: Duration, max: Duration) -> Duration {
        self.live(key, now).map_or(Duration::ZERO, |e| {
            (e.last + backoff(e.count, free, base, max)).saturating_duration_since(now)
        })
    }

    fn begin(&mut self, keys: &Keys, now: Instant) -> Verdict {
        let mut wait = self.wait(&keys[0], now, PAIR_FREE, PAIR_BASE, PAIR_MAX);
        let pair_failures = self.live(&keys[0], now).map_or(0, |e| e.count);
        if pair_failures >= ACCOUNT_EXEMPT {
            wait = wait.max(self.wait(&keys[1], now, ACCOUNT_FREE, ACCOUNT_BASE, ACCOUNT_MAX));
        }
        if let Some(ip) = self.live(&keys[2], now).filter(|e| e.count >= IP_LIMIT) {
            wait = wait.max(ip.until.saturating_duration_since(now));
        }
        if !wait.is_zero() {
            return Verdict::Throttled { retry_after: wait };
        }
        self.make_room(now);
        for (key, keep) in keys[..2].iter().zip([PAIR_KEEP, ACCOUNT_KEEP]) {
            let count = self.live(key, now).map_or(0, |e| e.count);
            self.entries.insert(
                key.clone(),
                Entry {
                    count: count.saturating_add(1),
                    last: now,
                    until: now + keep,
                },
            );
        }
        let ip = self.live(&keys[2], now).unwrap_or(Entry {
            count: 0,
            last: now,
            until: now + IP_WINDOW,
        });
        self.entries.insert(
            keys[2].clone(),
            Entry {
                count: ip.count.saturating_add(1),
                ..ip
            },
        );
        Verdict::Allowed
    }

    fn release(&mut self, keys: &Keys, now: Instant) {
        self.entries.remove(&keys[0]);
        for key in &keys[1..] {
            if let Some(e) = self.live(key, now) {
                let count = e.count.saturating_sub(1);
                self.entries.insert(key.clone(), Entry { count, ..e });
            }
        }
    }

    /// Keeps the map bounded: expired entries go first, then those closest to expiry (the least
    /// recently failed), down to three quarters of the bound so this runs rarely.
    // INVARIANT: never more than LOCAL_MAX_ENTRIES + 3 entries (test:
    // tests::the_local_limiter_stays_bounded).
    fn make_room(&mut self, now: Instant) {
        if self.entries.len() + 3 <= LOCAL_MAX_ENTRIES {
            return;
        }
        self.entries.retain(|_, e| e.until > now);
        let target = LOCAL_MAX_ENTRIES * 3 / 4;
        if self.entries.len() > target {
            let mut untils: Vec<Instant> = self.entries.values().map(|e| e.until).collect();
            let cut = self.entries.len() - target;
            untils.select_nth_unstable(cut - 1);
            let threshold = untils[cut - 1];
            self.entries.retain(|_, e| e.until > threshold);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(email: &str, ip: &str) -> Keys {
        [
            format!("p:{ip}/{email}"),
            format!("a:{email}"),
            format!("i:{ip}"),
        ]
    }

    #[test]
    fn backoff_grows_exponentially_and_is_capped() {
        let b = |f| backoff(f, PAIR_FREE, PAIR_BASE, PAIR_MAX);
        assert_eq!(b(PAIR_FREE - 1), Duration::ZERO);
        assert_eq!(b(PAIR_FREE), PAIR_BASE);
        assert_eq!(b(PAIR_FREE + 1), PAIR_BASE * 2);
        assert_eq!(b(PAIR_FREE + 3), PAIR_BASE * 8);
        assert_eq!(b(PAIR_FREE + 30), PAIR_MAX);
        assert_eq!(b(u32::MAX), PAIR_MAX);
    }

    #[test]
    fn a_pair_is_delayed_more_after_each_failure() {
        let mut l = LocalLimiter::default();
        let t0 = Instant::now();
        let k = keys("a@x", "1.2.3.4");
        for _ in 0..PAIR_FREE {
            assert_eq!(l.begin(&k, t0), Verdict::Allowed);
        }
        let later = t0 + Duration::from_secs(10);
        assert_eq!(
            l.begin(&k, later),
            Verdict::Throttled {
                retry_after: PAIR_BASE - Duration::from_secs(10)
            }
        );
        let t1 = t0 + PAIR_BASE;
        assert_eq!(l.begin(&k, t1), Verdict::Allowed);
        assert_eq!(
            l.begin(&k, t1),
            Verdict::Throttled {
                retry_after: PAIR_BASE * 2
            }
        );
    }

    #[test]
    fn another_address_is_not_delayed_by_a_hammered_pair() {
        let mut l = LocalLimiter::default();
        let now = Instant::now();
        let attacker = keys("victim@x", "6.6.6.6");
        for _ in 0..100 {
            l.begin(&attacker, now);
        }
        assert!(matches!(l.begin(&attacker, now), Verdict::Throttled { .. }));
        assert_eq!(
            l.begin(&keys("victim@x", "10.0.0.1"), now),
            Verdict::Allowed
        );
    }

    #[test]
    fn the_account_bound_delays_spread_guessing_but_never_for_long() {
        let mut l = LocalLimiter::default();
        let now = Instant::now();
        for i in 0..ACCOUNT_FREE {
            assert_eq!(
                l.begin(&keys("v@x", &format!("10.0.0.{}", i % 7)), now),
                Verdict::Allowed
            );
        }
        // An address that has been guessing on the account waits for the account's bound...
        let Verdict::Throttled { retry_after } = l.begin(&keys("v@x", "10.0.0.1"), now) else {
            panic!("the account bound must apply")
        };
        assert!(retry_after <= ACCOUNT_MAX);
        assert_eq!(
            l.begin(&keys("v@x", "10.0.0.1"), now + ACCOUNT_MAX),
            Verdict::Allowed
        );
        // ...the owner's address, which has not, does not.
        assert_eq!(l.begin(&keys("v@x", "10.9.9.9"), now), Verdict::Allowed);
    }

    #[test]
    fn an_address_is_exempt_from_the_account_bound_only_for_its_first_failures() {
        let mut l = LocalLimiter::default();
        let now = Instant::now();
        for i in 0..ACCOUNT_FREE {
            l.begin(&keys("v@x", &format!("10.0.1.{i}")), now);
        }
        let fresh = keys("v@x", "10.9.9.9");
        for _ in 0..ACCOUNT_EXEMPT {
            assert_eq!(l.begin(&fresh, now), Verdict::Allowed);
        }
        assert!(matches!(l.begin(&fresh, now), Verdict::Throttled { .. }));
    }

    #[test]
    fn success_clears_the_pair_and_returns_the_attempt() {
        let mut l = LocalLimiter::default();
        let now = Instant::now();
        let k = keys("a@x", "ip");
        for _ in 0..PAIR_FREE {
            l.begin(&k, now);
        }
        l.release(&k, now);
        assert!(l.live(&k[0], now).is_none());
        assert_eq!(l.live(&k[1], now).map(|e| e.count), Some(PAIR_FREE - 1));
        assert_eq!(l.live(&k[2], now).map(|e| e.count), Some(PAIR_FREE - 1));
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

    #[test]
    fn the_local_limiter_stays_bounded() {
        let mut l = LocalLimiter::default();
        let now = Instant::now();
        for i in 0..LOCAL_MAX_ENTRIES {
            l.begin(&keys(&format!("u{i}@x"), &format!("ip{}", i % 7_000)), now);
            assert!(l.entries.len() <= LOCAL_MAX_ENTRIES + 3);
        }
    }
}
