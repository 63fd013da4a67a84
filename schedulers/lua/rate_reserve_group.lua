-- needs: gcra
-- The rate-limit slots of a group of calls, alone: on a Redis Cluster a group's leases, its provider's rate cells
-- and its run's budget are in three slots, so schedulers/leases.py takes them one call each (leases, then this,
-- then budget_hold_group), where a single Redis takes them in one (lease_take).
-- KEYS: rate scope (5) ; ARGV: rate args (11; their requests and tokens unused), ahead_ms, then per call:
--       requests, tokens
-- -> per call its wait in ms (reserved) | -1 (not yet: nothing reserved for it; the calls due within ahead_ms of
--    the first's are reserved, as lease_take does)
local n = (#ARGV - 12) / 2
local reqs, toks = {}, {}
for i = 1, n do
  reqs[i], toks[i] = tonumber(ARGV[11 + 2 * i]), tonumber(ARGV[12 + 2 * i])
end
local waits = rl_reserve_group(0, 0, reqs, toks, tonumber(ARGV[12]))
local out = {}
for i = 1, n do out[i] = waits[i] or -1 end
return out
