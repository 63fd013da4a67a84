-- needs: gcra, budget
-- The request leases of a group of units (one, or a worker's next few) under a rate limit or a cost cap, with
-- their rate-limit slots and cost holds, in one call (without either, a worker takes its leases with plain SETs:
-- schedulers/leases.py). Each unit's lease is one SET NX, its token the caller's (first_token + i - 1, from a
-- block it took from the fence: never handed out twice); then the units granted get their holds, in order, each
-- as if it had asked alone: a unit that does not fit the cap is over budget (a later, cheaper one may still fit),
-- and the rate limit grants the calls due within ahead_ms of the first's (the rest are "not yet"). The leases of
-- the units that get no slot or no hold are removed in the same call, so nothing is held for them.
-- KEYS: rate scope (5), budget (3), then one lease per unit
-- ARGV: owner, ttl_ms, rate args (11; their requests and tokens unused), holder, cap_usd (<0: no budget),
--       budget_ttl_ms, ahead_ms, first_token, then per unit: requests, tokens, estimate_usd
-- -> three values per unit: 1, token, wait_ms (granted) | 0, pttl, 0 (held by another) | 2, pack, 0 (answered:
--    a done marker) | 3, 0, 0 (over budget) | 4, ahead_ms, 0 (not yet: ask again in about that long)
local n = #KEYS - 8
local owner, ttl = ARGV[1], tonumber(ARGV[2])
local base = tonumber(ARGV[18]) - 1
-- under a rate limit a lease is taken for ahead_ms more than ttl_ms: the wait for its slot, up to ahead_ms, needs
-- no PEXPIRE of its own (a lease a little longer is never less safe; the holder's heartbeat renews it to ttl_ms)
local pad = 0
for a = 3, 6 do if tonumber(ARGV[a]) > 0 then pad = tonumber(ARGV[17]) end end
local out = {}
local granted = {}
for i = 1, n do
  local key = KEYS[8 + i]
  local old = redis.call('SET', key, owner .. '|' .. string.format('%d', base + i), 'NX', 'PX', ttl + pad, 'GET')
  if not old then
    granted[#granted + 1] = i
    out[3 * i - 2], out[3 * i - 1], out[3 * i] = 1, base + i, 0
  elseif string.sub(old, 1, 1) == '=' then
    out[3 * i - 2], out[3 * i - 1], out[3 * i] = 2, string.sub(old, 2), 0
  else
    out[3 * i - 2], out[3 * i - 1], out[3 * i] = 0, redis.call('PTTL', key), 0
  end
end
if #granted == 0 then return out end
local function drop(i, code, value)
  redis.call('PEXPIRE', KEYS[8 + i], 0)
  out[3 * i - 2], out[3 * i - 1], out[3 * i] = code, value, 0
end
-- the budget: each granted unit in order, as budget_reserve would answer it
local cap = tonumber(ARGV[15])
local fit = granted
local now, used = 0, 0
if cap >= 0 then
  fit = {}
  now = budget_now()
  used = budget_used(5, now)
  for _, i in ipairs(granted) do
    local est = tonumber(ARGV[18 + 3 * i])
    if used + est > cap + 1e-9 then
      drop(i, 3, 0)
    else
      used = used + est
      fit[#fit + 1] = i
    end
  end
  if #fit == 0 then return out end
end
-- the rate limit: the calls due soon, in order
local reqs, toks = {}, {}
for j, i in ipairs(fit) do
  reqs[j], toks[j] = tonumber(ARGV[16 + 3 * i]), tonumber(ARGV[17 + 3 * i])
end
local waits = rl_reserve_group(0, 2, reqs, toks, tonumber(ARGV[17]))
local held = 0
for j, i in ipairs(fit) do
  local wait = waits[j]
  if wait == nil then
    drop(i, 4, tonumber(ARGV[17]))
  else
    held = held + tonumber(ARGV[18 + 3 * i])
    if wait > pad then redis.call('PEXPIRE', KEYS[8 + i], ttl + wait) end
    if wait > 0 then out[3 * i] = wait end
  end
end
if cap >= 0 and held > 0 then budget_hold(5, ARGV[14], held, now, tonumber(ARGV[16])) end
return out
