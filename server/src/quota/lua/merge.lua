-- tokenfactory quota merge v2
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
