-- KEYS: the scopes' sorted sets ; ARGV: ttl_ms, tokens -> how many tokens were still held (in the first key)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local held = 0
for i, key in ipairs(KEYS) do
  for j = 2, #ARGV do
    local n = redis.call('ZADD', key, 'XX', 'CH', now + ttl, ARGV[j])
    if i == 1 then held = held + n end
  end
  redis.call('PEXPIRE', key, ttl)
end
return held
