-- KEYS: todo, leased, holders, meta, fence ; ARGV: owner, ttl_ms
-- -> {1, shard, token} | {0, ms until a lease expires} | {-1} nothing left | {-2} stage unknown (Redis wiped)
if redis.call('EXISTS', KEYS[4]) == 0 then return {-2} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local shard
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1)
if #expired > 0 then
  shard = expired[1]
else
  local popped = redis.call('ZPOPMIN', KEYS[1])
  if #popped == 0 then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    if #first == 0 then return {-1} end
    return {0, math.max(1, tonumber(first[2]) - now)}
  end
  shard = popped[1]
end
local token = redis.call('INCR', KEYS[5])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), shard)
redis.call('HSET', KEYS[3], shard, ARGV[1] .. '|' .. token)
return {1, tonumber(shard), token}
