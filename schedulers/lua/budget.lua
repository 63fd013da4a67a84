-- A library (function definitions only), put before a script's body: a run's cost budget.
-- KEYS[k0+1..k0+3] = spent, reserved (hash holder -> usd), alive (zset holder -> expiry ms).
-- budget_reserve(k0, holder, estimate, cap, ttl_ms) -> 1 if it fits (and is held), 0 if it would break the cap.
-- budget_used(k0, now) -> spent + every live holder's reservations (dropping the holders that expired);
-- budget_hold(k0, holder, amount, now, ttl_ms) adds to a holder's reservation: the two halves of budget_reserve,
-- for a script that decides what fits itself (a group of units).
-- budget_settle(k0, holder, reserved, actual, ttl_ms) replaces a reservation by the actual cost.
local function budget_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function budget_used(k0, now)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[k0 + 3], '-inf', now)
  for _, h in ipairs(dead) do
    redis.call('HDEL', KEYS[k0 + 2], h)
    redis.call('ZREM', KEYS[k0 + 3], h)
  end
  local reserved = 0
  for _, v in ipairs(redis.call('HVALS', KEYS[k0 + 2])) do reserved = reserved + tonumber(v) end
  return tonumber(redis.call('GET', KEYS[k0 + 1]) or '0') + reserved
end
local function budget_hold(k0, holder, amount, now, ttl)
  redis.call('HINCRBYFLOAT', KEYS[k0 + 2], holder, amount)
  redis.call('ZADD', KEYS[k0 + 3], now + ttl, holder)
end
local function budget_reserve(k0, holder, est, cap, ttl)
  local now = budget_now()
  local used = budget_used(k0, now)
  if cap >= 0 and used + est > cap + 1e-9 then return 0 end
  budget_hold(k0, holder, est, now, ttl)
  return 1
end
local function budget_settle(k0, holder, reserved, actual, ttl)
  local now = budget_now()
  if reserved ~= 0 and redis.call('HEXISTS', KEYS[k0 + 2], holder) == 1 then
    local left = tonumber(redis.call('HINCRBYFLOAT', KEYS[k0 + 2], holder, -reserved))
    if left <= 1e-9 then redis.call('HDEL', KEYS[k0 + 2], holder) end
  end
  if redis.call('HEXISTS', KEYS[k0 + 2], holder) == 1 then
    redis.call('ZADD', KEYS[k0 + 3], now + ttl, holder)
  else
    redis.call('ZREM', KEYS[k0 + 3], holder)
  end
  if actual ~= 0 then redis.call('INCRBYFLOAT', KEYS[k0 + 1], actual) end
end
