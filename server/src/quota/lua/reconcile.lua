-- tokenfactory quota reconcile v2
local raised = 0
for i, key in ipairs(KEYS) do
  local billed = tonumber(ARGV[i + 1])
  if billed > tonumber(redis.call('GET', key) or '0') then
    redis.call('SET', key, billed, 'EX', ARGV[1])
    raised = raised + 1
  end
end
return raised
