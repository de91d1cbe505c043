-- tokenfactory quota acquire v3
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
