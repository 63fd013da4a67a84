-- KEYS: todo, leased, holders ; ARGV: shard, holder -> 1 back in todo | 0 not ours
if redis.call('HGET', KEYS[3], ARGV[1]) == ARGV[2] then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  redis.call('ZADD', KEYS[1], tonumber(ARGV[1]), ARGV[1])
  return 1
end
return 0
