-- KEYS: state, provider request cell ; ARGV: decrease_factor, min_factor, cooldown_ms, idle_ttl_ms,
-- retry_after_ms (0: none), quoted factor (the provider's quoted limit / the configured one; <= 0: none).
-- Returns the factor (x1e6).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local factor = tonumber(redis.call('HGET', KEYS[1], 'f') or '1')
local last = tonumber(redis.call('HGET', KEYS[1], 'd') or '0')
local quoted = tonumber(ARGV[6])
if quoted > 0 and quoted < factor then
  factor = math.max(tonumber(ARGV[2]), quoted)
  redis.call('HSET', KEYS[1], 'f', tostring(factor), 'cap', tostring(factor), 'c', tostring(now), 'd', tostring(now))
elseif quoted <= 0 and now - last >= tonumber(ARGV[3]) then
  factor = math.max(tonumber(ARGV[2]), factor * tonumber(ARGV[1]))
  redis.call('HSET', KEYS[1], 'f', tostring(factor), 'c', tostring(now), 'd', tostring(now))
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
local pause = tonumber(ARGV[5])
if pause > 0 then
  local tat = tonumber(redis.call('GET', KEYS[2]) or '0')
  if tat < now + pause then
    redis.call('SET', KEYS[2], tostring(now + pause), 'PX', math.ceil(pause) + tonumber(ARGV[4]))
  end
end
return math.floor(factor * 1000000)
