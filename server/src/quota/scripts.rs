//! The Redis side of admission: one versioned Lua script per operation (admit, settle, renew,
//! reconcile, merge), loaded at start-up and called with EVALSHA (re-loaded by the client if Redis
//! lost them). Each script is atomic, so replicas never race each other; nothing is ever read in
//! Rust and written back. Every key written gets a TTL. A failed call changes nothing the caller
//! relies on: admission then falls back to the local limiter.

use redis::{Script, ScriptInvocation};

use super::plan::{Check, Dim};

/// TTL of a settled-spend counter, in seconds (longer than any month).
pub const SETTLED_TTL_S: i64 = 40 * 86_400;

/// Checks every step of a plan, then applies all of them or none.
/// Returns `{failed_index (0: admitted), retry_ms, used_1, reset_ms_1, used_2, ...}`.
const ADMIT: &str = r"-- tokenfactory quota admit v2
local now, member, expiry, kttl, sttl = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local sec = math.floor(now / 1000)
local checks, out = {}, {0, 0}
local fail = 0
local k, a = 1, 6
while ARGV[a] do
  local kind, limit, cost = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local n = #checks + 1
  local used, reset = 0, 0
  if kind == 'W' then
    local key = KEYS[k]; k = k + 1
    local lo = sec - 59
    local ot = redis.call('HMGET', key, 'o', 't')
    local o, t = tonumber(ot[1]), tonumber(ot[2]) or 0
    if o == nil or lo - o > 120 then
      -- First use or a long idle: rebuild the total from the buckets.
      local h = redis.call('HGETALL', key)
      t, o = 0, sec
      for i = 1, #h, 2 do
        local s = tonumber(h[i])
        if s then
          if s < lo then redis.call('HDEL', key, h[i]) else t = t + tonumber(h[i + 1]); if s < o then o = s end end
        end
      end
      redis.call('HSET', key, 'o', o, 't', t)
      redis.call('PEXPIRE', key, 122000)
    elseif o < lo then
      -- Buckets left the window (at most once a second): drop them, move the mark to the oldest
      -- live bucket, refresh the TTL (a key is created by the rebuild above, with its TTL).
      while o < lo do
        local c = redis.call('HGET', key, o)
        if c then t = t - tonumber(c); redis.call('HDEL', key, o) end
        o = o + 1
      end
      while o < sec and redis.call('HEXISTS', key, o) == 0 do o = o + 1 end
      redis.call('HSET', key, 'o', o, 't', t)
      redis.call('PEXPIRE', key, 122000)
    end
    used = t
    reset = 60000
    if t > 0 then reset = (o + 60) * 1000 - now end
    if fail == 0 and used + cost > limit then
      fail = n; out[2] = 60000
      local h = redis.call('HGETALL', key)
      local live = {}
      for i = 1, #h, 2 do
        local s = tonumber(h[i])
        if s and s >= lo then live[#live + 1] = {s, tonumber(h[i + 1])} end
      end
      table.sort(live, function(x, y) return x[1] < y[1] end)
      local need, freed = used + cost - limit, 0
      for _, b in ipairs(live) do
        freed = freed + b[2]
        if freed >= need then out[2] = (b[1] + 60) * 1000 - now; break end
      end
    end
    checks[n] = {kind, cost, key, o}
  elseif kind == 'S' then
    local skey, lkey, akey = KEYS[k], KEYS[k + 1], KEYS[k + 2]; k = k + 3
    local gone = redis.call('ZRANGEBYSCORE', lkey, '-inf', now)
    for _, m in ipairs(gone) do
      local amt = tonumber(redis.call('HGET', akey, m) or '0')
      redis.call('HDEL', akey, m)
      redis.call('HINCRBY', akey, '~total', -amt)
    end
    if #gone > 0 then redis.call('ZREMRANGEBYSCORE', lkey, '-inf', now) end
    local settled = redis.call('GET', skey)
    used = tonumber(settled or '0') + tonumber(redis.call('HGET', akey, '~total') or '0')
    if fail == 0 and used + cost > limit then fail = n end
    checks[n] = {kind, cost, skey, lkey, akey, settled == false}
  else
    local key = KEYS[k]; k = k + 1
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    used = redis.call('ZCARD', key)
    if fail == 0 and used + cost > limit then fail = n; out[2] = 1000 end
    checks[n] = {kind, cost, key}
  end
  out[#out + 1] = used
  out[#out + 1] = reset
  a = a + 3
end
out[1] = fail
if fail == 0 then
  for _, c in ipairs(checks) do
    if c[1] == 'W' then
      redis.call('HINCRBY', c[3], sec, c[2])
      redis.call('HINCRBY', c[3], 't', c[2])
      -- A replica whose clock lags may write behind the oldest-bucket mark: move the mark back.
      if sec < c[4] then redis.call('HSET', c[3], 'o', sec) end
    elseif c[1] == 'S' then
      if c[6] then redis.call('SET', c[3], 0, 'NX', 'EX', sttl) end
      redis.call('ZADD', c[4], expiry, member)
      redis.call('HSET', c[5], member, c[2])
      redis.call('HINCRBY', c[5], '~total', c[2])
      redis.call('PEXPIRE', c[4], kttl)
      redis.call('PEXPIRE', c[5], kttl)
    else
      redis.call('ZADD', c[3], expiry, member)
      redis.call('PEXPIRE', c[3], kttl)
    end
  end
end
return out
";

/// Ends a request: corrects token windows by `actual - estimate`, turns its spend reservation
/// into settled spend, frees its cap slots. Idempotent per request for reservations and slots.
const SETTLE: &str = r"-- tokenfactory quota settle v2
local now, member, sttl = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local sec = math.floor(now / 1000)
local k, a = 1, 4
while ARGV[a] do
  local kind = ARGV[a]
  if kind == 'W' then
    local key = KEYS[k]; k = k + 1
    local b, d = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    if d ~= 0 and b > sec - 60 and redis.call('HEXISTS', key, ARGV[a + 1]) == 1 then
      redis.call('HINCRBY', key, ARGV[a + 1], d)
      redis.call('HINCRBY', key, 't', d)
    end
  elseif kind == 'S' then
    local skey, lkey, akey = KEYS[k], KEYS[k + 1], KEYS[k + 2]; k = k + 3
    local amt = redis.call('HGET', akey, member)
    if amt then
      redis.call('HDEL', akey, member)
      redis.call('HINCRBY', akey, '~total', -tonumber(amt))
      redis.call('ZREM', lkey, member)
    end
    if tonumber(ARGV[a + 1]) > 0 then
      redis.call('INCRBY', skey, ARGV[a + 1])
      redis.call('EXPIRE', skey, sttl)
    end
  else
    redis.call('ZREM', KEYS[k], member); k = k + 1
  end
  a = a + 3
end
return 1
";

/// Pushes the expiry of live leases forward (only members still present: `ZADD XX`).
const RENEW: &str = r"-- tokenfactory quota renew v1
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'XX', ARGV[1], ARGV[i + 2])
  redis.call('PEXPIRE', key, ARGV[2])
end
return #KEYS
";

/// Raises settled spend counters to the billed sums from PostgreSQL (never lowers them: every
/// settle reaches Redis before PostgreSQL, so a lower billed sum only means events in transit).
const RECONCILE: &str = r"-- tokenfactory quota reconcile v2
local raised = 0
for i, key in ipairs(KEYS) do
  local billed = tonumber(ARGV[i + 1])
  if billed > tonumber(redis.call('GET', key) or '0') then
    redis.call('SET', key, billed, 'EX', ARGV[1])
    raised = raised + 1
  end
end
return raised
";

/// Adds window buckets counted locally (while Redis was unreachable) into the shared windows.
const MERGE: &str = r"-- tokenfactory quota merge v2
local sec = math.floor(tonumber(ARGV[1]) / 1000)
for i, key in ipairs(KEYS) do
  local b, c = ARGV[2 * i], ARGV[2 * i + 1]
  if tonumber(b) > sec - 60 then
    redis.call('HINCRBY', key, b, c)
    redis.call('HINCRBY', key, 't', c)
    local o = tonumber(redis.call('HGET', key, 'o'))
    if o and tonumber(b) < o then redis.call('HSET', key, 'o', b) end
    redis.call('PEXPIRE', key, 122000)
  end
end
return #KEYS
";

/// The loaded scripts.
pub struct Scripts {
    pub admit: Script,
    pub settle: Script,
    pub renew: Script,
    pub reconcile: Script,
    pub merge: Script,
}

impl Default for Scripts {
    fn default() -> Self {
        Self {
            admit: Script::new(ADMIT),
            settle: Script::new(SETTLE),
            renew: Script::new(RENEW),
            reconcile: Script::new(RECONCILE),
            merge: Script::new(MERGE),
        }
    }
}

impl Scripts {
    /// Loads every script into Redis's script cache (SCRIPT LOAD).
    pub async fn load(&self, con: &mut redis::aio::ConnectionManager) -> redis::RedisResult<()> {
        for s in [
            &self.admit,
            &self.settle,
            &self.renew,
            &self.reconcile,
            &self.merge,
        ] {
            s.load_async(con).await?;
        }
        Ok(())
    }
}

/// Adds a plan's keys and arguments to an ADMIT invocation.
pub fn admit_args(
    inv: &mut ScriptInvocation<'_>,
    checks: &[Check],
    now_ms: i64,
    member: &str,
    expiry_ms: i64,
    key_ttl_ms: i64,
) {
    inv.arg(now_ms)
        .arg(member)
        .arg(expiry_ms)
        .arg(key_ttl_ms)
        .arg(SETTLED_TTL_S);
    for c in checks {
        match c {
            Check::Window {
                key, limit, cost, ..
            } => {
                inv.key(key).arg("W").arg(*limit).arg(*cost);
            }
            Check::Spend {
                settled,
                leases,
                amounts,
                limit,
                cost,
            } => {
                inv.key(settled)
                    .key(leases)
                    .key(amounts)
                    .arg("S")
                    .arg(*limit)
                    .arg(*cost);
            }
            Check::Cap { key, limit, .. } => {
                inv.key(key).arg("C").arg(*limit).arg(1);
            }
        }
    }
}

/// How one check is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleOp {
    /// Add `delta` to the bucket of second `bucket` (token windows only).
    Window { bucket: i64, delta: i64 },
    /// Drop the reservation, add `actual` micros to the settled spend.
    Spend { actual: i64 },
    /// Free the slot.
    Release,
    /// Nothing to do (request windows).
    Skip,
}

/// Adds settle operations to a SETTLE invocation; returns whether there is anything to do.
pub fn settle_args(
    inv: &mut ScriptInvocation<'_>,
    checks: &[Check],
    ops: &[SettleOp],
    now_ms: i64,
    member: &str,
) -> bool {
    inv.arg(now_ms).arg(member).arg(SETTLED_TTL_S);
    let mut any = false;
    for (c, op) in checks.iter().zip(ops) {
        match (c, *op) {
            (
                Check::Window {
                    key,
                    dim: Dim::Tokens,
                    ..
                },
                SettleOp::Window { bucket, delta },
            ) if delta != 0 => {
                inv.key(key).arg("W").arg(bucket).arg(delta);
            }
            (
                Check::Spend {
                    settled,
                    leases,
                    amounts,
                    ..
                },
                SettleOp::Spend { actual },
            ) => {
                inv.key(settled)
                    .key(leases)
                    .key(amounts)
                    .arg("S")
                    .arg(actual)
                    .arg(0);
            }
            (Check::Cap { key, .. }, SettleOp::Release) => {
                inv.key(key).arg("C").arg(0).arg(0);
            }
            _ => continue,
        }
        any = true;
    }
    any
}
