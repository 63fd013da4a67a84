-- KEYS: the scopes' sorted sets ; ARGV: ttl_ms, tokens -> how many tokens were still held (in the first key)
-- (held is counted by ZSCORE, not by ZADD's CH: a renewal in the millisecond of the take changes no score)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local held = 0
for i, key in ipairs(KEYS) do
  for j = 2, #ARGV do
    if redis.call('ZSCORE', key, ARGV[j]) then
      redis.call('ZADD', key, 'XX', now + ttl, ARGV[j])
      if i == 1 then held = held + 1 end
    end
  end
  redis.call('PEXPIRE', key, ttl)
end
return held
