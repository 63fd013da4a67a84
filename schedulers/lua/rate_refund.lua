-- needs: gcra
-- KEYS: rate scope (5) ; ARGV: rate args (11), unused tokens to give back -> 1
rl_refund(0, 0, tonumber(ARGV[12]))
return 1
