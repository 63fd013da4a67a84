-- KEYS: claim ; ARGV: value -> 1 released | 0 not ours
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], 0)
end
return 0
