-- needs: gcra, budget
-- KEYS: lease, rate scope (5), budget (3)
-- ARGV: owner|token, rate args (11), unused_tokens, holder, reserved_usd, actual_usd, cap_usd, budget_ttl_ms,
--       done marker (the pack holding the answer, or ''), marker_ms
-- -> 1 committed | 0 the lease was no longer ours (lapsed or taken over)
local ok = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if ARGV[19] ~= '' then
    redis.call('SET', KEYS[1], '=' .. ARGV[19], 'PX', tonumber(ARGV[20]))
  else
    redis.call('PEXPIRE', KEYS[1], 0)
  end
  ok = 1
end
rl_refund(1, 1, tonumber(ARGV[13]))
if tonumber(ARGV[17]) >= 0 then
  budget_settle(6, ARGV[14], tonumber(ARGV[15]), tonumber(ARGV[16]), tonumber(ARGV[18]))
end
return ok
