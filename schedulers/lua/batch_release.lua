-- KEYS: leases... ; ARGV: owner, marker_ms, then per key the pack holding its answer ('' = none)
-- -> number released. A released lease whose answer is in a pack becomes the same done marker an online
-- commit leaves, so an online worker that takes the lease next reads that pack instead of trusting an index
-- older than the answer.
local n = 0
local prefix = ARGV[1] .. '|'
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v and string.sub(v, 1, #prefix) == prefix then
    local pack = ARGV[2 + i] or ''
    if pack ~= '' then
      redis.call('SET', KEYS[i], '=' .. pack, 'PX', tonumber(ARGV[2]))
    else
      redis.call('PEXPIRE', KEYS[i], 0)
    end
    n = n + 1
  end
end
return n
