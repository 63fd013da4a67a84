-- needs: budget
-- KEYS: budget (3) ; ARGV: holder, reserved_usd, actual_usd, ttl_ms -> 1
budget_settle(0, ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))
return 1
