-- KEYS: leases..., fence ; ARGV: owner, ttl_ms, adopt ("" or an owner prefix whose leases become ours)
-- -> per key 1 (now ours) | 0 (someone else's)
local out = {}
local prefix = ARGV[1] .. '|'
local adopt = ARGV[3]
for i = 1, #KEYS - 1 do
  local v = redis.call('GET', KEYS[i])
  if v and string.sub(v, 1, #prefix) == prefix then
    redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[2]))
    out[i] = 1
  elseif (not v) or (adopt ~= '' and string.sub(v, 1, #adopt) == adopt) then
    redis.call('SET', KEYS[i], prefix .. redis.call('INCR', KEYS[#KEYS]), 'PX', tonumber(ARGV[2]))
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
