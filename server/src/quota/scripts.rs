//! The Redis side of admission: one versioned Lua script per operation (acquire, sync,
//! reconcile, merge), loaded at start-up and called with EVALSHA (re-loaded by the client if Redis
//! lost them). Each script is atomic, so replicas never race each other; nothing is ever read in
//! Rust and written back. Every key written gets a TTL. A failed call changes nothing the caller
//! relies on: admission then falls back to the local limiter.

use redis::{Script, ScriptInvocation};

use super::plan::{Check, Key};

/// TTL of a settled-spend counter, in seconds (longer than any month).
pub const SETTLED_TTL_S: i64 = 40 * 86_400;

/// Checks every step of a plan, then applies all of them or none. Each check takes its cost
/// (`need`) plus up to `want` more as this replica's credit, but never more than a sixteenth of
/// the room left, so a limit near exhaustion is shared out one request at a time.
/// Window costs are charged to the current second's bucket; spend and slots are added to this
/// replica's holding (a hash member named by the replica, with a lease it renews).
/// Returns `{failed_index (0: admitted), retry_ms, used_1, reset_ms_1, extra_1, used_2, ...}`.
const ACQUIRE: &str = r"-- tokenfactory quota acquire v3
local now, rid, expiry, kttl, sttl = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local sec = math.floor(now / 1000)
local checks, out = {}, {0, 0}
local fail = 0
local k, a = 1, 6
local function purge(lkey, akey)
  local gone = redis.call('ZRANGEBYSCORE', lkey, '-inf', now)
  for _, m in ipairs(gone) do
    local amt = tonumber(redis.call('HGET', akey, m) or '0')
    redis.call('HDEL', akey, m)
    redis.call('HINCRBY', akey, '~total', -amt)
  end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', lkey, '-inf', now) end
  return tonumber(redis.call('HGET', akey, '~total') or '0')
end
while ARGV[a] do
  local kind, limit, need, want = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
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
    if fail == 0 and used + need > limit then
      fail = n; out[2] = 60000
      local h = redis.call('HGETALL', key)
      local live = {}
      for i = 1, #h, 2 do
        local s = tonumber(h[i])
        if s and s >= lo then live[#live + 1] = {s, tonumber(h[i + 1])} end
      end
      table.sort(live, function(x, y) return x[1] < y[1] end)
      local short, freed = used + need - limit, 0
      for _, b in ipairs(live) do
        freed = freed + b[2]
        if freed >= short then out[2] = (b[1] + 60) * 1000 - now; break end
      end
    end
    checks[n] = {kind, key, o}
  elseif kind == 'S' then
    local skey, lkey, akey = KEYS[k], KEYS[k + 1], KEYS[k + 2]; k = k + 3
    local held = purge(lkey, akey)
    local settled = redis.call('GET', skey)
    used = tonumber(settled or '0') + held
    if fail == 0 and used + need > limit then fail = n end
    checks[n] = {kind, lkey, akey, skey, settled == false}
  else
    local lkey, akey = KEYS[k], KEYS[k + 1]; k = k + 2
    used = purge(lkey, akey)
    if fail == 0 and used + need > limit then fail = n; out[2] = 1000 end
    checks[n] = {kind, lkey, akey}
  end
  local extra = 0
  if want > 0 then extra = math.max(0, math.min(want, math.floor((limit - used - need) / 16))) end
  checks[n].grant = need + extra
  out[#out + 1] = used
  out[#out + 1] = reset
  out[#out + 1] = extra
  a = a + 4
end
out[1] = fail
if fail == 0 then
  for _, c in ipairs(checks) do
    if c[1] == 'W' then
      redis.call('HINCRBY', c[2], sec, c.grant)
      redis.call('HINCRBY', c[2], 't', c.grant)
      -- A replica whose clock lags may write behind the oldest-bucket mark: move the mark back.
      if sec < c[3] then redis.call('HSET', c[2], 'o', sec) end
    else
      if c[1] == 'S' and c[5] then redis.call('SET', c[4], 0, 'NX', 'EX', sttl) end
      redis.call('ZADD', c[2], expiry, rid)
      redis.call('HINCRBY', c[3], rid, c.grant)
      redis.call('HINCRBY', c[3], '~total', c.grant)
      redis.call('PEXPIRE', c[2], kttl)
      redis.call('PEXPIRE', c[3], kttl)
    end
  end
end
return out
";

/// What this replica owes Redis, in one call: window corrections and unused credit given back
/// (`W`: add `delta` to a live bucket), settled spend (`S`: add micros), and the absolute size
/// of each holding (`H`: set this replica's member, renew its lease; 0 removes it). Holdings are
/// absolute so a lost or repeated call heals on the next one.
const SYNC: &str = r"-- tokenfactory quota sync v3
local now, rid, expiry, kttl, sttl = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local sec = math.floor(now / 1000)
local k, a = 1, 6
while ARGV[a] do
  local op = ARGV[a]
  if op == 'W' then
    local key = KEYS[k]; k = k + 1
    local b, d = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    if d ~= 0 and b > sec - 60 and redis.call('HEXISTS', key, ARGV[a + 1]) == 1 then
      redis.call('HINCRBY', key, ARGV[a + 1], d)
      redis.call('HINCRBY', key, 't', d)
    end
  elseif op == 'S' then
    local skey = KEYS[k]; k = k + 1
    if tonumber(ARGV[a + 1]) > 0 then
      redis.call('INCRBY', skey, ARGV[a + 1])
      redis.call('EXPIRE', skey, sttl)
    end
  else
    local lkey, akey = KEYS[k], KEYS[k + 1]; k = k + 2
    local amt = tonumber(ARGV[a + 1])
    local old = tonumber(redis.call('HGET', akey, rid) or '0')
    if amt ~= old then redis.call('HINCRBY', akey, '~total', amt - old) end
    if amt > 0 then
      redis.call('HSET', akey, rid, amt)
      redis.call('ZADD', lkey, expiry, rid)
      redis.call('PEXPIRE', lkey, kttl)
      redis.call('PEXPIRE', akey, kttl)
    elseif old ~= 0 then
      redis.call('HDEL', akey, rid)
      redis.call('ZREM', lkey, rid)
    end
  end
  a = a + 3
end
return 1
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
    pub acquire: Script,
    pub sync: Script,
    pub reconcile: Script,
    pub merge: Script,
}

impl Default for Scripts {
    fn default() -> Self {
        Self {
            acquire: Script::new(ACQUIRE),
            sync: Script::new(SYNC),
            reconcile: Script::new(RECONCILE),
            merge: Script::new(MERGE),
        }
    }
}

impl Scripts {
    /// Loads every script into Redis's script cache (SCRIPT LOAD).
    pub async fn load(&self, con: &mut redis::aio::ConnectionManager) -> redis::RedisResult<()> {
        for s in [&self.acquire, &self.sync, &self.reconcile, &self.merge] {
            s.load_async(con).await?;
        }
        Ok(())
    }
}

/// Adds a plan's keys and arguments to an ACQUIRE invocation: each check takes its cost plus up
/// to `wants[i]` of credit for this replica (`rid`).
pub fn acquire_args(
    inv: &mut ScriptInvocation<'_>,
    checks: &[Check],
    wants: &[i64],
    now_ms: i64,
    rid: &str,
    expiry_ms: i64,
    key_ttl_ms: i64,
) {
    inv.arg(now_ms)
        .arg(rid)
        .arg(expiry_ms)
        .arg(key_ttl_ms)
        .arg(SETTLED_TTL_S);
    for (c, want) in checks.iter().zip(wants.iter().chain(std::iter::repeat(&0))) {
        match c {
            Check::Window {
                key, limit, cost, ..
            } => {
                inv.key(&**key).arg("W").arg(*limit).arg(*cost).arg(*want);
            }
            Check::Spend {
                settled,
                leases,
                amounts,
                limit,
                cost,
            } => {
                inv.key(&**settled)
                    .key(&**leases)
                    .key(&**amounts)
                    .arg("S")
                    .arg(*limit)
                    .arg(*cost)
                    .arg(*want);
            }
            Check::Cap {
                leases,
                amounts,
                limit,
                ..
            } => {
                inv.key(&**leases)
                    .key(&**amounts)
                    .arg("C")
                    .arg(*limit)
                    .arg(1)
                    .arg(*want);
            }
        }
    }
}

/// One step of a SYNC call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncOp {
    /// Add `delta` to a window's bucket of second `bucket` (if still live).
    Window { key: Key, bucket: i64, delta: i64 },
    /// Add `micros` to a settled-spend counter.
    Spend { settled: Key, micros: i64 },
    /// This replica now holds `amount` (spend micros or slots) under a lease.
    Hold {
        leases: Key,
        amounts: Key,
        amount: i64,
    },
}

/// Adds the SYNC header and `ops` to an invocation; returns whether there is anything to do.
pub fn sync_args(
    inv: &mut ScriptInvocation<'_>,
    ops: &[SyncOp],
    now_ms: i64,
    rid: &str,
    expiry_ms: i64,
    key_ttl_ms: i64,
) -> bool {
    inv.arg(now_ms)
        .arg(rid)
        .arg(expiry_ms)
        .arg(key_ttl_ms)
        .arg(SETTLED_TTL_S);
    for op in ops {
        match op {
            SyncOp::Window { key, bucket, delta } => {
                inv.key(&**key).arg("W").arg(*bucket).arg(*delta);
            }
            SyncOp::Spend { settled, micros } => {
                inv.key(&**settled).arg("S").arg(*micros).arg(0);
            }
            SyncOp::Hold {
                leases,
                amounts,
                amount,
            } => {
                inv.key(&**leases)
                    .key(&**amounts)
                    .arg("H")
                    .arg(*amount)
                    .arg(0);
            }
        }
    }
    !ops.is_empty()
}
