-- KEYS: the scopes' sorted sets ; ARGV: ttl_ms, count wanted, then one limit per key, then `count` tokens
-- -> how many of the tokens were added (to every key), in order
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local room = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  local lapsed = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'LIMIT', 0, 1000)
  if #lapsed > 0 then redis.call('ZREM', key, unpack(lapsed)) end
  local free = tonumber(ARGV[2 + i]) - redis.call('ZCARD', key)
  if free < room then room = free end
end
if room <= 0 then return 0 end
local first = 2 + #KEYS
for _, key in ipairs(KEYS) do
  for j = 1, room do redis.call('ZADD', key, now + ttl, ARGV[first + j]) end
  redis.call('PEXPIRE', key, ttl)
end
return room
