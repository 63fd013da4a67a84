-- Renew a driver's claim on its run id; take it again when it lapsed (the driver was paused past the
-- TTL, or the ledger restarted without it): its workers stop while it is missing and start again once it
-- is back. KEYS: claim ; ARGV: value, ttl_ms -> 1 renewed | 2 taken again | 0 someone else's
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if not held then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
