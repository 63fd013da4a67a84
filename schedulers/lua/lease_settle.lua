-- needs: gcra, budget
-- The commits of a group of request leases (the answers of one group commit, or one unit's), in one call.
-- Each lease is committed only if its value is still its holder's (owner|token: fenced); with a pack it becomes
-- a done marker naming it, one SET ... IFEQ (a server without IFEQ: GET, then SET); without, it is removed. The
-- group's unused rate tokens go back and its cost holds are settled (sums: both are additive).
-- KEYS: rate scope (5), budget (3), then one lease per unit
-- ARGV: rate args (11), unused_tokens, holder, reserved_usd, actual_usd, cap_usd (<0: no budget),
--       budget_ttl_ms, marker_ms, then per lease: owner|token, pack ('': no marker)
-- -> one value per lease: 1 committed | 0 the lease was no longer ours (lapsed or taken over)
local n = #KEYS - 8
local marker_ms = tonumber(ARGV[18])
local ifeq = true
local out = {}
for i = 1, n do
  local key, holder, pack = KEYS[8 + i], ARGV[17 + 2 * i], ARGV[18 + 2 * i]
  local done = nil
  if pack ~= '' and ifeq then
    local r = redis.pcall('SET', key, '=' .. pack, 'IFEQ', holder, 'PX', marker_ms)
    if type(r) == 'table' and r.err then ifeq = false else done = r and 1 or 0 end
  end
  if done == nil then
    done = 0
    if redis.call('GET', key) == holder then
      if pack ~= '' then
        redis.call('SET', key, '=' .. pack, 'PX', marker_ms)
      else
        redis.call('PEXPIRE', key, 0)
      end
      done = 1
    end
  end
  out[i] = done
end
rl_refund(0, 0, tonumber(ARGV[12]))
if tonumber(ARGV[16]) >= 0 then
  budget_settle(5, ARGV[13], tonumber(ARGV[14]), tonumber(ARGV[15]), tonumber(ARGV[17]))
end
return out
