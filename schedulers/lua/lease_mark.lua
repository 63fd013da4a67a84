-- The commits of a group of request leases of one slot, alone (on a Redis Cluster, whose server may not know
-- SET ... IFEQ: the rate refund and the budget's settling are calls of their own there, schedulers/leases.py).
-- Each lease is committed only if its value is still its holder's (owner|token: fenced): with a pack it becomes
-- a done marker naming it, without it is removed.
-- KEYS: leases (one slot) ; ARGV: marker_ms, then per lease: owner|token, pack ('': no marker)
-- -> one value per lease: 1 committed | 0 the lease was no longer ours
local out = {}
for i, key in ipairs(KEYS) do
  local holder, pack = ARGV[2 * i], ARGV[2 * i + 1]
  if redis.call('GET', key) == holder then
    if pack ~= '' then
      redis.call('SET', key, '=' .. pack, 'PX', tonumber(ARGV[1]))
    else
      redis.call('PEXPIRE', key, 0)
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
