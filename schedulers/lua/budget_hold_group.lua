-- needs: budget
-- The cost holds of a group of units, alone (on a Redis Cluster: see rate_reserve_group), each as if it had asked
-- alone, in order: a unit that does not fit the cap holds nothing (a later, cheaper one may still fit).
-- KEYS: budget (3) ; ARGV: holder, cap_usd, ttl_ms, then per unit: estimate_usd
-- -> per unit 1 (held) | 0 (over the cap)
local now = budget_now()
local used = budget_used(0, now)
local cap = tonumber(ARGV[2])
local held, out = 0, {}
for i = 4, #ARGV do
  local est = tonumber(ARGV[i])
  if used + est > cap + 1e-9 then
    out[i - 3] = 0
  else
    used, held = used + est, held + est
    out[i - 3] = 1
  end
end
if held > 0 then budget_hold(0, ARGV[1], held, now, tonumber(ARGV[3])) end
return out
