-- tokenfactory quota sync v4
-- What one replica owes Redis, in one atomic call. Ops, three arguments each:
--   Q seq 0      (first, optional): this batch's number; a batch this replica already had
--                applied is skipped whole, so a SYNC retried after a timeout never counts twice
--   W bucket d   add d to a live bucket of a window (corrections, unspent credit given back)
--   S micros 0   add settled spend
--   H d amount   change this replica's holding by d and renew its lease; if the holding is
--                gone (its lease expired and was purged), set it to amount (the replica's own
--                figure) instead; a holding at 0 is removed
local now, rid, expiry, kttl, sttl = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local sec = math.floor(now / 1000)
local k, a = 1, 6
while ARGV[a] do
  local op = ARGV[a]
  if op == 'Q' then
    -- Batch numbers applied in the last 10 minutes (a failed batch is kept for 5).
    local qkey = KEYS[k]; k = k + 1
    if redis.call('ZSCORE', qkey, ARGV[a + 1]) then return 0 end
    redis.call('ZADD', qkey, now, ARGV[a + 1])
    redis.call('ZREMRANGEBYSCORE', qkey, '-inf', now - 600000)
    redis.call('PEXPIRE', qkey, 600000)
  elseif op == 'W' then
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
    local d, amt = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local cur = redis.call('HGET', akey, rid)
    local old = tonumber(cur or '0')
    local new = amt
    if cur then new = old + d end
    if new < 0 then new = 0 end
    if new ~= old then redis.call('HINCRBY', akey, '~total', new - old) end
    if new > 0 then
      redis.call('HSET', akey, rid, new)
      redis.call('ZADD', lkey, expiry, rid)
      redis.call('PEXPIRE', lkey, kttl)
      redis.call('PEXPIRE', akey, kttl)
    elseif cur then
      redis.call('HDEL', akey, rid)
      redis.call('ZREM', lkey, rid)
    end
  end
  a = a + 3
end
return 1
