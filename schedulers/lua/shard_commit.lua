-- KEYS: leased, holders, counters, usage ; ARGV: shard, holder, n_counters, then counter (name, value)
-- pairs, then usage (field, value) pairs. Counters and usage are added even when the lease was lost: the
-- calls were made either way. -> 1 committed | 0 lost
local ok = 0
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('HINCRBY', KEYS[3], 'shards_done', 1)
  ok = 1
end
local n = tonumber(ARGV[3])
for i = 4, 3 + 2 * n, 2 do
  if ARGV[i] == 'cost_usd' then redis.call('HINCRBYFLOAT', KEYS[3], ARGV[i], ARGV[i + 1])
  else redis.call('HINCRBY', KEYS[3], ARGV[i], ARGV[i + 1]) end
end
for i = 4 + 2 * n, #ARGV, 2 do
  if string.sub(ARGV[i], -3) == 'usd' then redis.call('HINCRBYFLOAT', KEYS[4], ARGV[i], ARGV[i + 1])
  else redis.call('HINCRBY', KEYS[4], ARGV[i], ARGV[i + 1]) end
end
local t = redis.call('TIME')
redis.call('HSET', KEYS[3], 'updated_at', t[1] .. '.' .. string.format('%06d', t[2]))
return ok
