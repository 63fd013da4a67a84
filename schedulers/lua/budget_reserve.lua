-- needs: budget
-- KEYS: budget (3) ; ARGV: holder, estimate_usd, max_usd (negative = no cap), ttl_ms
-- -> 1 reserved | 0 over the cap
return budget_reserve(0, ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))
