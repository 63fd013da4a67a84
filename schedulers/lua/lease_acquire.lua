-- needs: gcra, budget
-- KEYS: lease, fence, rate scope (5), budget (3)
-- ARGV: owner, ttl_ms, rate args (11), holder, estimate_usd, cap_usd (<0: no budget), budget_ttl_ms
-- -> {1, token, wait_ms} granted | {0, pttl} held by another | {2, pack} answered (done marker) | {3} over budget
local cur = redis.call('GET', KEYS[1])
if cur then
  if string.sub(cur, 1, 1) == '=' then return {2, string.sub(cur, 2)} end
  return {0, redis.call('PTTL', KEYS[1])}
end
local cap = tonumber(ARGV[16])
if cap >= 0 and budget_reserve(7, ARGV[14], tonumber(ARGV[15]), cap, tonumber(ARGV[17])) == 0 then return {3} end
local wait = rl_reserve(2, 2)
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', tonumber(ARGV[2]) + wait)
return {1, token, wait}
