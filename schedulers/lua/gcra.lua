-- A library (function definitions only), put before a script's body: GCRA rate-limit cells.
-- KEYS[k0+1..k0+5] = provider req, provider tok, provider state, model req, model tok.
-- ARGV[a0+1..a0+11] = provider rpm, provider tpm, model rpm, model tpm, requests, tokens, burst_requests,
--                     burst_s_tokens, increase_step, recover_window_ms, idle_ttl_ms.
-- rl_reserve(k0, a0) returns the wait in ms (0 when nothing is limited) and the factor.
-- rl_refund(k0, a0, unused) gives back unused tokens.
-- rl_reserve_group(k0, a0, reqs, toks, ahead_ms) reserves for a group of calls in order (reqs[i] requests and
-- toks[i] tokens each; ARGV's own requests and tokens are not used): each call's wait is what rl_reserve would
-- answer called once per call at this instant, and the group stops before the first call (not the first) whose
-- wait is more than ahead_ms after the first's. Returns the waits of the calls it reserved (a prefix).
local function rl_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
local function rl_factor(state, now, step, window, idle)
  local factor = tonumber(redis.call('HGET', state, 'f') or '1')
  local changed = tonumber(redis.call('HGET', state, 'c') or '0')
  local cap = tonumber(redis.call('HGET', state, 'cap') or '1')
  if factor < cap and now - changed >= window then
    local steps = math.floor((now - changed) / window)
    factor = math.min(cap, factor + steps * step)
    redis.call('HSET', state, 'f', tostring(factor), 'c', tostring(changed + steps * window))
    redis.call('PEXPIRE', state, idle)
  end
  return factor
end
local function rl_cell(key, per_min, cost, burst, factor, now, idle)
  local interval = 60000 / (per_min * factor)
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat < now then tat = now end
  local new_tat = tat + interval * cost
  redis.call('SET', key, tostring(new_tat), 'PX', math.ceil(new_tat - now) + idle)
  return new_tat - burst * interval - now
end
local function rl_reserve(k0, a0)
  local p_rpm, p_tpm = tonumber(ARGV[a0 + 1]), tonumber(ARGV[a0 + 2])
  local m_rpm, m_tpm = tonumber(ARGV[a0 + 3]), tonumber(ARGV[a0 + 4])
  if p_rpm <= 0 and p_tpm <= 0 and m_rpm <= 0 and m_tpm <= 0 then return 0, 1 end
  local requests, tokens = tonumber(ARGV[a0 + 5]), tonumber(ARGV[a0 + 6])
  local burst_r, burst_s = tonumber(ARGV[a0 + 7]), tonumber(ARGV[a0 + 8])
  local idle = tonumber(ARGV[a0 + 11])
  local now = rl_now()
  local factor = rl_factor(KEYS[k0 + 3], now, tonumber(ARGV[a0 + 9]), tonumber(ARGV[a0 + 10]), idle)
  local wait = 0
  local function take(key, per_min, cost, burst)
    if per_min > 0 and cost > 0 then
      local w = rl_cell(key, per_min, cost, burst, factor, now, idle)
      if w > wait then wait = w end
    end
  end
  take(KEYS[k0 + 1], p_rpm, requests, burst_r)
  take(KEYS[k0 + 2], p_tpm, tokens, p_tpm / 60 * burst_s)
  take(KEYS[k0 + 4], m_rpm, requests, burst_r)
  take(KEYS[k0 + 5], m_tpm, tokens, m_tpm / 60 * burst_s)
  return math.ceil(wait), factor
end
local function rl_refund(k0, a0, unused)
  if unused <= 0 then return end
  local now = rl_now()
  local factor = tonumber(redis.call('HGET', KEYS[k0 + 3], 'f') or '1')
  for i, cell in ipairs({{k0 + 2, a0 + 2}, {k0 + 5, a0 + 4}}) do
    local per_min = tonumber(ARGV[cell[2]])
    if per_min > 0 then
      local tat = tonumber(redis.call('GET', KEYS[cell[1]]) or '0')
      if tat > now then
        local back = math.max(now, tat - unused * 60000 / (per_min * factor))
        redis.call('SET', KEYS[cell[1]], tostring(back), 'PX', math.ceil(back - now) + tonumber(ARGV[a0 + 11]))
      end
    end
  end
end
local function rl_reserve_group(k0, a0, reqs, toks, ahead)
  local waits = {}
  local p_rpm, p_tpm = tonumber(ARGV[a0 + 1]), tonumber(ARGV[a0 + 2])
  local m_rpm, m_tpm = tonumber(ARGV[a0 + 3]), tonumber(ARGV[a0 + 4])
  if p_rpm <= 0 and p_tpm <= 0 and m_rpm <= 0 and m_tpm <= 0 then
    for i = 1, #reqs do waits[i] = 0 end
    return waits
  end
  local burst_r, burst_s = tonumber(ARGV[a0 + 7]), tonumber(ARGV[a0 + 8])
  local idle = tonumber(ARGV[a0 + 11])
  local now = rl_now()
  local factor = rl_factor(KEYS[k0 + 3], now, tonumber(ARGV[a0 + 9]), tonumber(ARGV[a0 + 10]), idle)
  local cells = {}
  local function cell(key, per_min, costs, burst)
    if per_min > 0 then
      local interval = 60000 / (per_min * factor)
      local tat = tonumber(redis.call('GET', key) or '0')
      if tat < now then tat = now end
      cells[#cells + 1] = {key = key, interval = interval, costs = costs, burst = burst, tat = tat, used = 0}
    end
  end
  cell(KEYS[k0 + 1], p_rpm, reqs, burst_r)
  cell(KEYS[k0 + 2], p_tpm, toks, p_tpm / 60 * burst_s)
  cell(KEYS[k0 + 4], m_rpm, reqs, burst_r)
  cell(KEYS[k0 + 5], m_tpm, toks, m_tpm / 60 * burst_s)
  local first = 0
  for i = 1, #reqs do
    local wait = 0
    for _, c in ipairs(cells) do
      local cost = c.costs[i]
      if cost > 0 then
        local w = c.tat + c.interval * (c.used + cost) - c.burst * c.interval - now
        if w > wait then wait = w end
      end
    end
    if i == 1 then first = wait elseif wait > first + ahead then break end
    for _, c in ipairs(cells) do c.used = c.used + c.costs[i] end
    waits[i] = math.ceil(wait)
  end
  for _, c in ipairs(cells) do
    if c.used > 0 then
      local new_tat = c.tat + c.interval * c.used
      redis.call('SET', c.key, tostring(new_tat), 'PX', math.ceil(new_tat - now) + idle)
    end
  end
  return waits
end
