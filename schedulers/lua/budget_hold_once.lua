-- needs: budget
-- A batch's hold (its holder is the batch): once per holder, so a resumed driver holding
-- the same batch again does not reserve it twice; force (a batch created already: paid whatever the cap)
-- reserves past the cap.
-- KEYS: budget (3) ; ARGV: holder, estimate_usd, max_usd (negative = no cap), ttl_ms, force (0/1)
-- -> 1 held | 0 over the cap
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  redis.call('ZADD', KEYS[3], budget_now() + tonumber(ARGV[4]), ARGV[1])
  return 1
end
local cap = tonumber(ARGV[3])
if ARGV[5] == '1' then cap = -1 end
return budget_reserve(0, ARGV[1], tonumber(ARGV[2]), cap, tonumber(ARGV[4]))
